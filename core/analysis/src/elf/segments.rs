//! A file's program headers (its segments), and what turns a process
//! mapping of the file into its load bias (`pc - bias` is the ELF virtual
//! address the unwinder looks up).
//!
//! The one program-header reader of eim: [`Elf`](super::Elf) reads its
//! segments here for extraction (`PT_LOAD`, `PT_GNU_EH_FRAME`,
//! `PT_DYNAMIC`), the host the `PT_LOAD`s of every new file it sees,
//! `eim lookup` and the stack symbolizer the `PT_LOAD`s of the files they
//! name; and [`bias`] is the one rule that places a mapping. Only the ELF
//! header, the program header table (and, when the table's count does not
//! fit the header, section 0) are read, through a reader the caller
//! supplies (the edge's `pread`, or a slice). The count is bounded: by
//! [`MAX_SEGMENTS`] for the host's reads, by what the file can hold for
//! [`Elf`](super::Elf)'s (whose table `object` has found whole in the
//! file). 64-bit little-endian files only: the unwinder's targets (x86-64
//! and arm64); anything else has no segments and its mappings no bias.

use std::convert::Infallible;

use super::ident::{EHDR64_SIZE, ELFCLASS64, ELFDATA2LSB, MAGIC};
use super::source::FileView;

/// Program headers the host reads at most (a real file has about ten).
pub const MAX_SEGMENTS: usize = 256;

pub(crate) const PT_LOAD: u32 = 1;
const EHDR_SIZE: usize = EHDR64_SIZE as usize;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;
/// `e_phnum` when the count is too large for it: the count is then
/// section 0's `sh_info`.
const PN_XNUM: u16 = 0xffff;

/// One program header: its type and placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// `p_type`.
    pub(crate) kind: u32,
    /// `p_flags`: `PF_X`, `PF_W`, `PF_R`.
    pub(crate) flags: u32,
    pub(crate) offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub(crate) memsz: u64,
    pub(crate) align: u64,
}

/// The program headers of a file read through `read` (which fills as much
/// of its buffer as the file has at an offset and says how many bytes that
/// was: fewer only at the end of the file), in table order, at most `max`
/// of them; of a table cut by the end of the file, its whole entries.
/// Empty if the file is not a 64-bit little-endian ELF file or its header
/// places no table (`object`'s rules: a table offset of 0, a count of 0,
/// an entry size other than 56, a count past `e_phnum` without a section
/// 0 to hold it). Errors are `read`'s.
pub fn read_segments<E>(
    mut read: impl FnMut(u64, &mut [u8]) -> Result<usize, E>,
    max: usize,
) -> Result<Vec<Segment>, E> {
    let mut ehdr = [0u8; EHDR_SIZE];
    if read(0, &mut ehdr)? < EHDR_SIZE
        || ehdr[..4] != MAGIC[..]
        || ehdr[4] != ELFCLASS64
        || ehdr[5] != ELFDATA2LSB
    {
        return Ok(Vec::new());
    }
    let phoff = u64_at(&ehdr, 0x20);
    let phentsize = usize::from(u16_at(&ehdr, 0x36));
    if phoff == 0 || phentsize != PHDR_SIZE {
        return Ok(Vec::new());
    }
    let count = match u16_at(&ehdr, 0x38) {
        PN_XNUM => match section_0_info(&mut read, &ehdr)? {
            Some(count) => count,
            None => return Ok(Vec::new()),
        },
        n => usize::from(n),
    };
    let mut table = vec![0u8; count.min(max).saturating_mul(PHDR_SIZE)];
    let got = read(phoff, &mut table)?.min(table.len());
    Ok(table[..got - got % PHDR_SIZE]
        .chunks_exact(PHDR_SIZE)
        .map(|ph| Segment {
            kind: u32_at(ph, 0),
            flags: u32_at(ph, 4),
            offset: u64_at(ph, 8),
            vaddr: u64_at(ph, 16),
            filesz: u64_at(ph, 32),
            memsz: u64_at(ph, 40),
            align: u64_at(ph, 48),
        })
        .collect())
}

/// Section 0's `sh_info` (where a count too large for `e_phnum` is), if
/// the header places a section table of 64-byte entries and the file
/// holds its first entry.
fn section_0_info<E>(
    read: &mut impl FnMut(u64, &mut [u8]) -> Result<usize, E>,
    ehdr: &[u8],
) -> Result<Option<usize>, E> {
    let shoff = u64_at(ehdr, 0x28);
    if shoff == 0 || usize::from(u16_at(ehdr, 0x3a)) != SHDR_SIZE {
        return Ok(None);
    }
    let mut shdr = [0u8; SHDR_SIZE];
    if read(shoff, &mut shdr)? < SHDR_SIZE {
        return Ok(None);
    }
    Ok(usize::try_from(u32_at(&shdr, 44)).ok())
}

/// The `PT_LOAD` segments of a file read through `read`, among its first
/// [`MAX_SEGMENTS`] program headers ([`read_segments`]).
pub fn read_load_segments<E>(
    read: impl FnMut(u64, &mut [u8]) -> Result<usize, E>,
) -> Result<Vec<Segment>, E> {
    let mut segments = read_segments(read, MAX_SEGMENTS)?;
    segments.retain(|s| s.kind == PT_LOAD);
    Ok(segments)
}

/// [`read_load_segments`] of a file held in memory.
pub fn load_segments_of(data: &[u8]) -> Vec<Segment> {
    infallible(read_load_segments(view_reader(FileView::Slice(data))))
}

/// Every program header of `view`: as many as the file could hold, which
/// is every one of a table inside the file.
pub(crate) fn segments_of(view: FileView<'_>) -> Vec<Segment> {
    let max = usize::try_from(view.size() / PHDR_SIZE as u64).unwrap_or(usize::MAX);
    infallible(read_segments(view_reader(view), max))
}

/// A reader for [`read_segments`] over bytes already at hand (a lazy
/// file's read that fails reads nothing).
fn view_reader(view: FileView<'_>) -> impl FnMut(u64, &mut [u8]) -> Result<usize, Infallible> + '_ {
    move |at, buf| {
        let len = (buf.len() as u64).min(view.size().saturating_sub(at));
        let Some(bytes) = view.bytes_at(at, len) else {
            return Ok(0);
        };
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(bytes.len())
    }
}

fn infallible<T>(result: Result<T, Infallible>) -> T {
    match result {
        Ok(value) => value,
        Err(never) => match never {},
    }
}

/// The load bias of a mapping of the file at `start` from file offset
/// `offset`: the segment holding that offset was loaded at `start` for its
/// address `vaddr + (offset - segment offset)`. `None` when no segment
/// holds the offset (not a mapping the loader made).
pub fn bias(segments: &[Segment], start: u64, offset: u64) -> Option<u64> {
    // The loader maps each segment from the page holding its first byte,
    // so the segment whose first page the mapping starts at is the one it
    // was made for, even where the page also holds the end of the segment
    // before (a linker that packs a read-only segment and the text into
    // one page, with a different vaddr - offset). The kernel's page is
    // 4 KiB, or up to 64 KiB. A mapping split later (mprotect) starts
    // inside its segment.
    let starts_at = |page: u64| move |s: &&Segment| s.offset & !(page - 1) == offset;
    let inside = |s: &&Segment| s.offset <= offset && offset < s.offset.saturating_add(s.filesz);
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

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(field(bytes, at))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(field(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(field(bytes, at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_test_support::elf::{self as build, Header, ProgramHeader};

    fn load(offset: u64, vaddr: u64, filesz: u64) -> Segment {
        Segment {
            kind: PT_LOAD,
            flags: 0,
            offset,
            vaddr,
            filesz,
            memsz: filesz,
            align: 0x1000,
        }
    }

    #[test]
    fn the_bias_puts_the_mapping_start_at_its_segment_address() {
        // A PIE's text: offset 0x1000 at 0x1000; a non-PIE's: 0x401000.
        let pie = [
            load(0, 0, 0x800),
            load(0x1000, 0x1000, 0x3000),
            load(0x4db0, 0x5db0, 0x300),
        ];
        let bias_at = bias(&pie, 0x7f00_0000_1000, 0x1000).expect("text");
        assert_eq!(bias_at, 0x7f00_0000_0000);
        // The data segment: its page starts below its offset; vaddr - offset
        // is 0x1000 there.
        assert_eq!(bias(&pie, 0x7f00_0000_5000, 0x4000), Some(0x7f00_0000_0000));
        // Read-only data and text sharing a page, the text one page
        // further in memory (rustc's default link): the text mapping is
        // the text segment's.
        let packed = [load(0, 0, 0x3e320), load(0x3e320, 0x3f320, 0x50000)];
        assert_eq!(
            bias(&packed, 0x5555_0003_f000, 0x3e000),
            Some(0x5555_0000_0000)
        );
        assert_eq!(bias(&packed, 0x5555_0000_0000, 0), Some(0x5555_0000_0000));
        let exec = [load(0x1000, 0x401000, 0x2000)];
        assert_eq!(bias(&exec, 0x401000, 0x1000), Some(0));
        assert_eq!(bias(&exec, 0x401000, 0x9000), None, "past every segment");
    }

    /// The `i`th header of [`with_headers`].
    fn nth(i: usize, kind: u32) -> ProgramHeader {
        ProgramHeader {
            kind,
            offset: 0x1000 * i as u64,
            vaddr: 0x40_0000 + 0x1000 * i as u64,
            filesz: 0x800,
            memsz: 0x900 + i as u64,
        }
    }

    /// An ELF header and `phnum` program headers ([`nth`]): `PT_LOAD`s
    /// where `load` says, the others `PT_NOTE`.
    fn with_headers(phnum: usize, load: impl Fn(usize) -> bool) -> Vec<u8> {
        build::with_segments(
            &(0..phnum)
                .map(|i| nth(i, if load(i) { PT_LOAD } else { build::PT_NOTE }))
                .collect::<Vec<_>>(),
        )
    }

    /// What [`nth`] wrote, as the reader gives it back.
    fn read_back(i: usize, kind: u32) -> Segment {
        let p = nth(i, kind);
        Segment {
            kind,
            flags: 4, // PF_R, as the builder writes it
            offset: p.offset,
            vaddr: p.vaddr,
            filesz: p.filesz,
            memsz: p.memsz,
            align: 0x1000,
        }
    }

    #[test]
    fn only_the_load_headers_of_a_64_bit_little_endian_file_count() {
        let file = with_headers(4, |i| i % 2 == 1);
        let got = load_segments_of(&file);
        assert_eq!(got, [1, 3].map(|i| read_back(i, PT_LOAD)).to_vec());
        // A table cut by the end of the file: its whole entries.
        assert_eq!(load_segments_of(&file[..file.len() - 1]), got[..1].to_vec());
        // Another class, another byte order, a short header: none.
        for (at, byte) in [(4, build::CLASS32), (5, build::MSB)] {
            let mut other = file.clone();
            other[at] = byte;
            assert_eq!(load_segments_of(&other), Vec::new());
            assert_eq!(segments_of(FileView::Slice(&other)), Vec::new());
        }
        assert_eq!(load_segments_of(&file[..EHDR_SIZE - 1]), Vec::new());
        let elf32 = Header {
            class: build::CLASS32,
            ..Header::default()
        };
        assert_eq!(load_segments_of(&elf32.bytes()[..16]), Vec::new());
        // However many headers the file claims, the host reads at most
        // MAX_SEGMENTS.
        let many = with_headers(MAX_SEGMENTS + 10, |_| true);
        assert_eq!(load_segments_of(&many).len(), MAX_SEGMENTS);
        assert_eq!(segments_of(FileView::Slice(&many)).len(), MAX_SEGMENTS + 10);
    }

    #[test]
    fn every_header_comes_back_with_its_type_and_sizes() {
        let file = with_headers(5, |i| i != 2);
        let all = segments_of(FileView::Slice(&file));
        let want: Vec<Segment> = (0..5)
            .map(|i| read_back(i, if i != 2 { PT_LOAD } else { build::PT_NOTE }))
            .collect();
        assert_eq!(all, want);
        // The host's reader gives the same headers, less the others.
        let loads: Vec<Segment> = want.into_iter().filter(|s| s.kind == PT_LOAD).collect();
        assert_eq!(load_segments_of(&file), loads);
    }

    /// `file` with its header's 16-bit field at `at` set to `value`.
    fn with_u16(mut file: Vec<u8>, at: usize, value: u16) -> Vec<u8> {
        file[at..at + 2].copy_from_slice(&value.to_le_bytes());
        file
    }

    /// `file` with its header's 64-bit field at `at` set to `value`.
    fn with_u64(mut file: Vec<u8>, at: usize, value: u64) -> Vec<u8> {
        file[at..at + 8].copy_from_slice(&value.to_le_bytes());
        file
    }

    #[test]
    fn a_header_that_places_no_table_has_no_segments() {
        let file = with_headers(3, |_| true);
        let len = file.len() as u64;
        let cases = [
            // Offset 0 means no table: the ELF header is not read as one.
            ("offset 0", with_u64(file.clone(), 0x20, 0)),
            ("no entries", with_u16(file.clone(), 0x38, 0)),
            ("32-byte entries", with_u16(file.clone(), 0x36, 32)),
            ("64-byte entries", with_u16(file.clone(), 0x36, 64)),
            ("offset at the end", with_u64(file.clone(), 0x20, len)),
            ("offset past the end", with_u64(file.clone(), 0x20, len + 8)),
            (
                "offset near 2^64",
                with_u64(file.clone(), 0x20, u64::MAX - 8),
            ),
            ("offset 2^64 - 1", with_u64(file.clone(), 0x20, u64::MAX)),
        ];
        for (what, bytes) in cases {
            assert_eq!(load_segments_of(&bytes), Vec::new(), "{what}");
            assert_eq!(segments_of(FileView::Slice(&bytes)), Vec::new(), "{what}");
        }
        // A count past the table: the entries the file holds.
        let claims_more = with_u16(file.clone(), 0x38, 1000);
        assert_eq!(load_segments_of(&claims_more).len(), 3);
        assert_eq!(segments_of(FileView::Slice(&claims_more)).len(), 3);
        // A table starting inside the file and running past it: its whole
        // entries.
        let late = with_u64(file, 0x20, len - PHDR_SIZE as u64 - 1);
        assert_eq!(segments_of(FileView::Slice(&late)).len(), 1);
    }

    /// A file whose count does not fit `e_phnum` (`PN_XNUM`): the count is
    /// section 0's `sh_info`, `object`'s rule.
    fn with_count_in_section_0(headers: usize, count: u32) -> Vec<u8> {
        let mut file = with_headers(headers, |_| true);
        let shoff = file.len() as u64;
        let mut section_0 = [0u8; SHDR_SIZE];
        section_0[44..48].copy_from_slice(&count.to_le_bytes());
        file.extend_from_slice(&section_0);
        let file = with_u16(file, 0x38, PN_XNUM);
        let file = with_u64(file, 0x28, shoff);
        with_u16(file, 0x3c, 1) // one section
    }

    #[test]
    fn a_count_too_large_for_the_header_is_read_from_section_0() {
        let file = with_count_in_section_0(3, 2);
        let want: Vec<Segment> = (0..2).map(|i| read_back(i, PT_LOAD)).collect();
        assert_eq!(segments_of(FileView::Slice(&file)), want);
        assert_eq!(load_segments_of(&file), want);
        // `object` reads the same count from the same place.
        use object::read::elf::FileHeader as _;
        let header = object::elf::FileHeader64::<object::LittleEndian>::parse(&*file)
            .expect("object parses the header");
        let table = header.program_headers(object::LittleEndian, &*file);
        assert_eq!(table.expect("and the table").len(), 2);
        // A count of 2^32 - 1: the entries the file holds (the section
        // header after the table is read as one more, of type 0).
        let huge = with_count_in_section_0(3, u32::MAX);
        let all = segments_of(FileView::Slice(&huge));
        assert_eq!(all.len(), 4);
        assert_eq!(all[3].kind, 0);
        assert_eq!(load_segments_of(&huge).len(), 3);
        // No section table, another entry size, section 0 cut: no count.
        let shoff = file.len() as u64 - SHDR_SIZE as u64;
        let cases = [
            ("no section table", with_u64(file.clone(), 0x28, 0)),
            ("32-byte sections", with_u16(file.clone(), 0x3a, 32)),
            ("section 0 cut", file[..file.len() - 1].to_vec()),
            (
                "section 0 past the end",
                with_u64(file.clone(), 0x28, shoff + 8),
            ),
        ];
        for (what, bytes) in cases {
            assert_eq!(segments_of(FileView::Slice(&bytes)), Vec::new(), "{what}");
            assert_eq!(load_segments_of(&bytes), Vec::new(), "{what}");
        }
    }

    /// Every file of the test data: [`segments_of`] reads the program
    /// headers `object` reads (which extraction read before this reader
    /// was its own).
    #[test]
    fn the_reader_agrees_with_object_on_real_files() {
        let data = eim_test_support::testdata();
        let mut files = 0;
        for dir in [data.join("upstream"), data.join("oracle/bin")] {
            for entry in std::fs::read_dir(&dir).expect("test data") {
                let path = entry.expect("entry").path();
                let bytes = std::fs::read(&path).expect("read");
                let Ok(parsed) =
                    object::read::elf::ElfFile64::<object::LittleEndian>::parse(&*bytes)
                else {
                    continue;
                };
                use object::read::elf::ProgramHeader as _;
                let e = object::LittleEndian;
                let want: Vec<Segment> = parsed
                    .elf_program_headers()
                    .iter()
                    .map(|p| Segment {
                        kind: p.p_type(e),
                        flags: p.p_flags(e),
                        offset: p.p_offset(e),
                        vaddr: p.p_vaddr(e),
                        filesz: p.p_filesz(e),
                        memsz: p.p_memsz(e),
                        align: p.p_align(e),
                    })
                    .collect();
                assert!(!want.is_empty(), "{} has program headers", path.display());
                assert_eq!(
                    segments_of(FileView::Slice(&bytes)),
                    want,
                    "{}",
                    path.display()
                );
                files += 1;
            }
        }
        assert!(files >= 10, "only {files} ELF files in the test data");
    }

    #[test]
    fn read_errors_are_the_readers() {
        let e = read_load_segments(|_, _| Err::<usize, _>("gone"));
        assert_eq!(e, Err("gone"));
        // An error reading the table, after the header was read.
        let file = with_headers(2, |_| true);
        let mut reads = 0;
        let e = read_load_segments(|at, buf: &mut [u8]| {
            reads += 1;
            if at == 0 {
                buf.copy_from_slice(&file[..buf.len()]);
                Ok(buf.len())
            } else {
                Err("table gone")
            }
        });
        assert_eq!((e, reads), (Err("table gone"), 2));
    }
}
