//! Small ELF files made by tests: the 64-byte header with the fields a test
//! sets ([`Header`]), a program header ([`ProgramHeader`]), a file of
//! program headers ([`with_segments`]) and a file of named sections
//! ([`with_sections`]).
//! Tests that need a file eim must judge (a 32-bit or big-endian header,
//! another machine, a debug link and nothing else) build it here instead of
//! writing the header's bytes by hand.

/// The first four bytes of every ELF file.
pub const MAGIC: &[u8; 4] = b"\x7fELF";
/// `EI_CLASS`: 32-bit and 64-bit.
pub const CLASS32: u8 = 1;
pub const CLASS64: u8 = 2;
/// `EI_DATA`: little-endian and big-endian.
pub const LSB: u8 = 1;
pub const MSB: u8 = 2;
/// `e_type` of a shared library (and a position-independent executable).
pub const ET_DYN: u16 = 3;
/// `e_machine` values.
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;
/// `sh_type` values.
pub const SHT_PROGBITS: u32 = 1;
pub const SHT_STRTAB: u32 = 3;
pub const SHT_NOTE: u32 = 7;
/// `p_type` values.
pub const PT_LOAD: u32 = 1;
pub const PT_NOTE: u32 = 4;
/// Sizes of the ELF64 header, a program header and a section header.
pub const EHDR_SIZE: usize = 64;
pub const PHDR_SIZE: usize = 56;
pub const SHDR_SIZE: usize = 64;

/// An ELF header: a 64-bit little-endian x86-64 shared library with no
/// segments and no sections unless a test says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub class: u8,
    pub data: u8,
    pub kind: u16,
    pub machine: u16,
    pub entry: u64,
    pub phoff: u64,
    pub shoff: u64,
    pub phnum: u16,
    pub shnum: u16,
    pub shstrndx: u16,
}

impl Default for Header {
    fn default() -> Self {
        Self {
            class: CLASS64,
            data: LSB,
            kind: ET_DYN,
            machine: EM_X86_64,
            entry: 0,
            phoff: 0,
            shoff: 0,
            phnum: 0,
            shnum: 0,
            shstrndx: 0,
        }
    }
}

impl Header {
    /// The header's 64 bytes. The multi-byte fields are little-endian
    /// whatever `data` says: a big-endian header here is one eim must
    /// refuse by its `EI_DATA` byte alone.
    pub fn bytes(&self) -> [u8; EHDR_SIZE] {
        let mut h = [0u8; EHDR_SIZE];
        h[..4].copy_from_slice(MAGIC);
        h[4] = self.class;
        h[5] = self.data;
        h[6] = 1; // EV_CURRENT
        h[16..18].copy_from_slice(&self.kind.to_le_bytes());
        h[18..20].copy_from_slice(&self.machine.to_le_bytes());
        h[20..24].copy_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
        h[24..32].copy_from_slice(&self.entry.to_le_bytes());
        h[32..40].copy_from_slice(&self.phoff.to_le_bytes());
        h[40..48].copy_from_slice(&self.shoff.to_le_bytes());
        h[52..54].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        h[54..56].copy_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        h[56..58].copy_from_slice(&self.phnum.to_le_bytes());
        h[58..60].copy_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
        h[60..62].copy_from_slice(&self.shnum.to_le_bytes());
        h[62..64].copy_from_slice(&self.shstrndx.to_le_bytes());
        h
    }
}

/// A program header: the fields a test sets (a readable segment aligned
/// to 4 KiB, its physical address its virtual one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramHeader {
    pub kind: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
}

impl ProgramHeader {
    /// The header's 56 bytes.
    pub fn bytes(&self) -> [u8; PHDR_SIZE] {
        let mut p = [0u8; PHDR_SIZE];
        p[..4].copy_from_slice(&self.kind.to_le_bytes());
        p[4..8].copy_from_slice(&4u32.to_le_bytes()); // PF_R
        p[8..16].copy_from_slice(&self.offset.to_le_bytes());
        p[16..24].copy_from_slice(&self.vaddr.to_le_bytes());
        p[24..32].copy_from_slice(&self.vaddr.to_le_bytes());
        p[32..40].copy_from_slice(&self.filesz.to_le_bytes());
        p[40..48].copy_from_slice(&self.memsz.to_le_bytes());
        p[48..56].copy_from_slice(&0x1000u64.to_le_bytes());
        p
    }
}

/// A 64-bit little-endian x86-64 shared library of the header and then
/// the table of `segments` (no sections). What the segments place is the
/// test's business: the file holds only the headers.
pub fn with_segments(segments: &[ProgramHeader]) -> Vec<u8> {
    let header = Header {
        phoff: EHDR_SIZE as u64,
        phnum: u16::try_from(segments.len()).expect("at most 65534 program headers"),
        ..Header::default()
    };
    let mut out = header.bytes().to_vec();
    for segment in segments {
        out.extend_from_slice(&segment.bytes());
    }
    out
}

/// A 64-bit little-endian shared library for `machine` holding `sections`
/// (name, `sh_type`, contents), each at an 8-aligned offset, then a
/// `.shstrtab` and the section headers (the null section first). No
/// segments, no code.
pub fn with_sections(machine: u16, sections: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; EHDR_SIZE];
    let mut names = vec![0u8];
    // (name offset, type, offset, size) of each section header.
    let mut headers = Vec::with_capacity(sections.len() + 1);
    let mut place = |out: &mut Vec<u8>, name: &str, kind: u32, data: &[u8], names: &mut Vec<u8>| {
        let name_at = names.len() as u32;
        names.extend_from_slice(name.as_bytes());
        names.push(0);
        out.resize(out.len().next_multiple_of(8), 0);
        headers.push((name_at, kind, out.len() as u64, data.len() as u64));
        out.extend_from_slice(data);
    };
    for (name, kind, data) in sections {
        place(&mut out, name, *kind, data, &mut names);
    }
    // The name table names itself, so its own name goes in before it is
    // placed.
    let name_at = names.len() as u32;
    names.extend_from_slice(b".shstrtab\0");
    out.resize(out.len().next_multiple_of(8), 0);
    headers.push((name_at, SHT_STRTAB, out.len() as u64, names.len() as u64));
    out.extend_from_slice(&names);
    out.resize(out.len().next_multiple_of(8), 0);
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; SHDR_SIZE]); // the null section
    for (name, kind, offset, size) in &headers {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // flags
        out.extend_from_slice(&0u64.to_le_bytes()); // address
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]); // link, info
        out.extend_from_slice(&1u64.to_le_bytes()); // alignment
        out.extend_from_slice(&0u64.to_le_bytes()); // entry size
    }
    let shnum = headers.len() as u16 + 1;
    let header = Header {
        machine,
        shoff,
        shnum,
        shstrndx: shnum - 1,
        ..Header::default()
    };
    out[..EHDR_SIZE].copy_from_slice(&header.bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], at: usize) -> usize {
        usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
    }

    fn u64_at(b: &[u8], at: usize) -> usize {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(v) as usize
    }

    /// Every section is found again through the header: its name through
    /// `e_shstrndx`, its contents through its header's offset and size.
    #[test]
    fn sections_read_back_through_the_headers() {
        let sections: [(&str, u32, &[u8]); 2] = [
            (
                ".gnu_debuglink",
                SHT_PROGBITS,
                b"target\0\0\x01\x02\x03\x04",
            ),
            (".note.x", SHT_NOTE, b"abc"),
        ];
        let file = with_sections(EM_AARCH64, &sections);
        assert_eq!(&file[..4], MAGIC);
        assert_eq!(u16_at(&file, 18), usize::from(EM_AARCH64));
        let (shoff, shnum, shstrndx) = (u64_at(&file, 40), u16_at(&file, 60), u16_at(&file, 62));
        assert_eq!(shnum, sections.len() + 2);
        let header = |i: usize| &file[shoff + i * SHDR_SIZE..shoff + (i + 1) * SHDR_SIZE];
        let names = header(shstrndx);
        let names = &file[u64_at(names, 24)..u64_at(names, 24) + u64_at(names, 32)];
        let name_of = |h: &[u8]| {
            let at = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let end = names[at..].iter().position(|&b| b == 0).expect("NUL") + at;
            std::str::from_utf8(&names[at..end])
                .expect("UTF-8")
                .to_string()
        };
        assert_eq!(name_of(header(shstrndx)), ".shstrtab");
        for (i, (name, kind, data)) in sections.iter().enumerate() {
            let h = header(i + 1);
            assert_eq!(name_of(h), *name);
            assert_eq!(u32::from_le_bytes([h[4], h[5], h[6], h[7]]), *kind);
            let at = u64_at(h, 24);
            assert_eq!(at % 8, 0, "{name} is 8-aligned");
            assert_eq!(&file[at..at + u64_at(h, 32)], *data);
        }
    }

    /// binutils, which shares no code with this builder, reads the same
    /// sections from it.
    #[test]
    fn readelf_reads_the_sections() {
        if !crate::skip::tools_present(&["readelf"]) {
            return;
        }
        let dir = std::env::temp_dir().join(format!("eim-support-elf-{}", std::process::id()));
        let file = with_sections(
            EM_X86_64,
            &[(".gnu_debuglink", SHT_PROGBITS, b"t\0\0\0abcd")],
        );
        std::fs::write(&dir, file).expect("written");
        let text = crate::tools::run("readelf", &["-W", "-h", "-S", &dir.display().to_string()]);
        let _ = std::fs::remove_file(&dir);
        for want in ["ELF64", "DYN", "X86-64", ".gnu_debuglink", ".shstrtab"] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
        assert!(
            !text.contains("Warning") && !text.contains("Error"),
            "{text}"
        );
    }

    /// binutils reads the program headers as written.
    #[test]
    fn readelf_reads_the_segments() {
        if !crate::skip::tools_present(&["readelf"]) {
            return;
        }
        let path = std::env::temp_dir().join(format!("eim-support-phdr-{}", std::process::id()));
        let load = |offset: u64, size: u64| ProgramHeader {
            kind: PT_LOAD,
            offset,
            vaddr: 0x40_0000 + offset,
            filesz: size,
            memsz: size + 0x10,
        };
        // The segments lie in the file: the header and table, 176 bytes.
        let file = with_segments(&[load(0, 0x80), load(0x80, 0x30)]);
        assert_eq!(file.len(), EHDR_SIZE + 2 * PHDR_SIZE);
        std::fs::write(&path, file).expect("written");
        let text = crate::tools::run("readelf", &["-W", "-l", &path.display().to_string()]);
        let _ = std::fs::remove_file(&path);
        for want in [
            "There are 2 program headers, starting at offset 64",
            "LOAD           0x000000 0x0000000000400000 0x0000000000400000 0x000080 0x000090 R   0x1000",
            "LOAD           0x000080 0x0000000000400080 0x0000000000400080 0x000030 0x000040 R   0x1000",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
        assert!(
            !text.contains("Warning") && !text.contains("Error"),
            "{text}"
        );
    }

    #[test]
    fn a_header_says_what_it_was_given() {
        let h = Header {
            class: CLASS32,
            data: MSB,
            machine: 0xf3,
            shoff: 0x1234,
            shnum: 5,
            ..Header::default()
        }
        .bytes();
        assert_eq!((h[4], h[5], h[6]), (CLASS32, MSB, 1));
        assert_eq!(
            (u16_at(&h, 18), u64_at(&h, 40), u16_at(&h, 60)),
            (0xf3, 0x1234, 5)
        );
        assert_eq!(
            (u16_at(&h, 52), u16_at(&h, 54), u16_at(&h, 58)),
            (64, 56, 64)
        );
    }
}
