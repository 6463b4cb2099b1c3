//! Where a file's loadable segments sit: what turns a process mapping of
//! the file into its load bias (`pc - bias` is the ELF virtual address the
//! unwinder looks up).
//!
//! The one program-header reader of eim outside `object`'s parse: the host
//! reads it for every new file, the symbolizer for every file it names.
//! Only the ELF header and the program header table are read, through a
//! reader the caller supplies (the edge's `pread`, or a slice), bounded by
//! [`MAX_SEGMENTS`]. 64-bit little-endian files only: the unwinder's
//! targets (x86-64 and arm64); anything else has no segments and its
//! mappings no bias.

/// Program headers read at most (a real file has about ten).
pub const MAX_SEGMENTS: usize = 256;

const PT_LOAD: u32 = 1;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;

/// One `PT_LOAD` program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
}

/// The `PT_LOAD` segments of a file read through `read`, which fills as
/// much of its buffer as the file has at an offset and says how many bytes
/// that was (fewer only at the end of the file). Empty if the file is not
/// a 64-bit little-endian ELF file; errors are `read`'s.
pub fn read_load_segments<E>(
    mut read: impl FnMut(u64, &mut [u8]) -> Result<usize, E>,
) -> Result<Vec<LoadSegment>, E> {
    let mut ehdr = [0u8; EHDR_SIZE];
    if read(0, &mut ehdr)? < EHDR_SIZE
        || &ehdr[..4] != b"\x7fELF"
        || ehdr[4] != 2 // ELFCLASS64
        || ehdr[5] != 1
    // ELFDATA2LSB
    {
        return Ok(Vec::new());
    }
    let phoff = u64::from_le_bytes(field(&ehdr, 32));
    let phentsize = usize::from(u16::from_le_bytes(field(&ehdr, 54)));
    let phnum = usize::from(u16::from_le_bytes(field(&ehdr, 56)));
    if phentsize != PHDR_SIZE || phnum == 0 {
        return Ok(Vec::new());
    }
    let mut table = vec![0u8; phnum.min(MAX_SEGMENTS) * PHDR_SIZE];
    let got = read(phoff, &mut table)?.min(table.len());
    Ok(table[..got - got % PHDR_SIZE]
        .chunks_exact(PHDR_SIZE)
        .filter(|ph| u32::from_le_bytes(field(ph, 0)) == PT_LOAD)
        .map(|ph| LoadSegment {
            offset: u64::from_le_bytes(field(ph, 8)),
            vaddr: u64::from_le_bytes(field(ph, 16)),
            file_size: u64::from_le_bytes(field(ph, 32)),
        })
        .collect())
}

/// [`read_load_segments`] of a file held in memory.
pub fn load_segments_of(data: &[u8]) -> Vec<LoadSegment> {
    let read = |at: u64, buf: &mut [u8]| -> Result<usize, std::convert::Infallible> {
        let rest = usize::try_from(at)
            .ok()
            .and_then(|at| data.get(at..))
            .unwrap_or(&[]);
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    };
    match read_load_segments(read) {
        Ok(segments) => segments,
        Err(never) => match never {},
    }
}

/// The load bias of a mapping of the file at `start` from file offset
/// `offset`: the segment holding that offset was loaded at `start` for its
/// address `vaddr + (offset - segment offset)`. `None` when no segment
/// holds the offset (not a mapping the loader made).
pub fn bias(segments: &[LoadSegment], start: u64, offset: u64) -> Option<u64> {
    // The loader maps each segment from the page holding its first byte,
    // so the segment whose first page the mapping starts at is the one it
    // was made for, even where the page also holds the end of the segment
    // before (a linker that packs a read-only segment and the text into
    // one page, with a different vaddr - offset). The kernel's page is
    // 4 KiB, or up to 64 KiB. A mapping split later (mprotect) starts
    // inside its segment.
    let starts_at = |page: u64| move |s: &&LoadSegment| s.offset & !(page - 1) == offset;
    let inside =
        |s: &&LoadSegment| s.offset <= offset && offset < s.offset.saturating_add(s.file_size);
    let seg = [0x1000, 0x4000, 0x10000]
        .into_iter()
        .find_map(|page| segments.iter().find(starts_at(page)))
        .or_else(|| segments.iter().find(inside))?;
    Some(
        start
            .wrapping_sub(offset)
            .wrapping_sub(seg.vaddr.wrapping_sub(seg.offset)),
    )
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = bytes.get(at..at + N) {
        out.copy_from_slice(src);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bias_puts_the_mapping_start_at_its_segment_address() {
        // A PIE's text: offset 0x1000 at 0x1000; a non-PIE's: 0x401000.
        let pie = [
            LoadSegment {
                offset: 0,
                vaddr: 0,
                file_size: 0x800,
            },
            LoadSegment {
                offset: 0x1000,
                vaddr: 0x1000,
                file_size: 0x3000,
            },
            LoadSegment {
                offset: 0x4db0,
                vaddr: 0x5db0,
                file_size: 0x300,
            },
        ];
        let bias_at = bias(&pie, 0x7f00_0000_1000, 0x1000).expect("text");
        assert_eq!(bias_at, 0x7f00_0000_0000);
        // The data segment: its page starts below its offset; vaddr - offset
        // is 0x1000 there.
        assert_eq!(bias(&pie, 0x7f00_0000_5000, 0x4000), Some(0x7f00_0000_0000));
        // Read-only data and text sharing a page, the text one page
        // further in memory (rustc's default link): the text mapping is
        // the text segment's.
        let packed = [
            LoadSegment {
                offset: 0,
                vaddr: 0,
                file_size: 0x3e320,
            },
            LoadSegment {
                offset: 0x3e320,
                vaddr: 0x3f320,
                file_size: 0x50000,
            },
        ];
        assert_eq!(
            bias(&packed, 0x5555_0003_f000, 0x3e000),
            Some(0x5555_0000_0000)
        );
        assert_eq!(bias(&packed, 0x5555_0000_0000, 0), Some(0x5555_0000_0000));
        let exec = [LoadSegment {
            offset: 0x1000,
            vaddr: 0x401000,
            file_size: 0x2000,
        }];
        assert_eq!(bias(&exec, 0x401000, 0x1000), Some(0));
        assert_eq!(bias(&exec, 0x401000, 0x9000), None, "past every segment");
    }

    /// An ELF header and `phnum` program headers: PT_LOADs at offsets
    /// 0x1000 * i, the others PT_NOTE.
    fn with_headers(phnum: u16, load: impl Fn(usize) -> bool) -> Vec<u8> {
        let mut out = vec![0u8; EHDR_SIZE];
        out[..6].copy_from_slice(b"\x7fELF\x02\x01");
        out[32..40].copy_from_slice(&(EHDR_SIZE as u64).to_le_bytes());
        out[54..56].copy_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        out[56..58].copy_from_slice(&phnum.to_le_bytes());
        for i in 0..usize::from(phnum) {
            let mut ph = [0u8; PHDR_SIZE];
            let kind: u32 = if load(i) { PT_LOAD } else { 4 };
            ph[..4].copy_from_slice(&kind.to_le_bytes());
            ph[8..16].copy_from_slice(&(0x1000 * i as u64).to_le_bytes());
            ph[16..24].copy_from_slice(&(0x40_0000 + 0x1000 * i as u64).to_le_bytes());
            ph[32..40].copy_from_slice(&0x800u64.to_le_bytes());
            out.extend_from_slice(&ph);
        }
        out
    }

    #[test]
    fn only_the_load_headers_of_a_64_bit_little_endian_file_count() {
        let file = with_headers(4, |i| i % 2 == 1);
        let got = load_segments_of(&file);
        assert_eq!(
            got,
            [1u64, 3]
                .map(|i| LoadSegment {
                    offset: 0x1000 * i,
                    vaddr: 0x40_0000 + 0x1000 * i,
                    file_size: 0x800,
                })
                .to_vec()
        );
        // A table cut by the end of the file: its whole entries.
        assert_eq!(load_segments_of(&file[..file.len() - 1]), got[..1].to_vec());
        // Another class, another byte order, a short header: none.
        for (at, byte) in [(4, 1u8), (5, 2)] {
            let mut other = file.clone();
            other[at] = byte;
            assert_eq!(load_segments_of(&other), Vec::new());
        }
        assert_eq!(load_segments_of(&file[..EHDR_SIZE - 1]), Vec::new());
        assert_eq!(load_segments_of(b"\x7fELF\x01\x01 short"), Vec::new());
        // However many headers the file claims, at most MAX_SEGMENTS read.
        let many = with_headers(MAX_SEGMENTS as u16 + 10, |_| true);
        assert_eq!(load_segments_of(&many).len(), MAX_SEGMENTS);
    }

    #[test]
    fn read_errors_are_the_readers() {
        let e = read_load_segments(|_, _| Err::<usize, _>("gone"));
        assert_eq!(e, Err("gone"));
    }
}
