//! Where a file's loadable segments sit: what turns a process mapping of
//! the file into its load bias (`pc - bias` is the ELF virtual address the
//! unwinder looks up).
//!
//! Only the ELF header and program headers are read, with `pread` (never
//! a mapping: see `docs/THREAT_MODEL.md`), bounded by [`MAX_SEGMENTS`].
//! 64-bit little-endian files only: the unwinder's targets (x86-64 and
//! arm64); anything else has no segments and its mappings no bias.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

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

/// The `PT_LOAD` segments of `file`; empty if it is not a 64-bit
/// little-endian ELF file. Errors are the reads'.
pub fn load_segments(file: &File) -> io::Result<Vec<LoadSegment>> {
    let mut ehdr = [0u8; EHDR_SIZE];
    if read_full(file, &mut ehdr, 0)? < EHDR_SIZE
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
    let got = read_full(file, &mut table, phoff)?;
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

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
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

    #[test]
    fn the_segments_of_a_real_file_give_its_own_addresses() {
        let exe = std::env::current_exe().expect("this test's executable");
        let file = File::open(&exe).expect("opened");
        let segments = load_segments(&file).expect("read");
        assert!(!segments.is_empty(), "{} has PT_LOADs", exe.display());
        // /proc/self/maps: this executable's text mapping, and the address
        // of a function in it.
        let here = the_bias_puts_the_mapping_start_at_its_segment_address as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let line = maps
            .lines()
            .find(|l| {
                let range = l.split_whitespace().next().unwrap_or("");
                let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
                let a = u64::from_str_radix(a, 16).unwrap_or(0);
                let b = u64::from_str_radix(b, 16).unwrap_or(0);
                a <= here && here < b
            })
            .expect("the mapping of this function");
        let fields: Vec<&str> = line.split_whitespace().collect();
        let start = u64::from_str_radix(fields[0].split('-').next().unwrap(), 16).unwrap();
        let offset = u64::from_str_radix(fields[2], 16).unwrap();
        let b = bias(&segments, start, offset).expect("a segment holds it");
        // The function's ELF address lies in an executable segment.
        let address = here - b;
        assert!(
            segments
                .iter()
                .any(|s| s.vaddr <= address && address < s.vaddr + s.file_size),
            "{address:#x} in {segments:x?}"
        );
    }

    #[test]
    fn files_that_are_not_64_bit_elf_have_no_segments() {
        let dir = std::env::temp_dir().join(format!("eim-segments-{}", std::process::id()));
        std::fs::write(&dir, b"\x7fELF\x01\x01 short").expect("written");
        let file = File::open(&dir).expect("opened");
        assert_eq!(load_segments(&file).expect("read"), Vec::new());
        let _ = std::fs::remove_file(&dir);
    }
}
