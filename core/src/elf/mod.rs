//! ELF analysis: from the bytes of an executable to its stack deltas,
//! exactly as upstream's SEED revision extracts them.
//!
//! Everything here works on a byte slice the caller provides (a memory map,
//! usually): no file is opened here. The file handle, debug-link lookup and
//! file reading live in the `eim` package.
//!
//! * [`extract`]: the stage order, the FDE filter, the final sort.
//! * [`ehframe`]: `.eh_frame` / `.eh_frame_hdr` / `.debug_frame` CFI.
//! * [`gopclntab`]: Go's pc/line tables.
//! * [`entry`]: entry-stub matchers.
//! * [`vdso`]: synthetic deltas for the arm64 vDSO.
//! * [`fileid`]: the 128-bit file id and the 64-bit host file id.

pub mod ehframe;
pub mod entry;
pub mod extract;
pub mod fileid;
pub mod gopclntab;
pub mod vdso;

use object::read::elf::{ElfFile64, FileHeader};
use object::{LittleEndian, Object, ObjectSection};

/// The architectures eim extracts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64,
    Aarch64,
}

/// Why a file cannot be analysed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error("not a 64-bit little-endian ELF file")]
    WrongClass,
    #[error("unsupported machine {0:#x}")]
    UnsupportedMachine(u16),
    #[error("malformed ELF: {0}")]
    Malformed(String),
}

/// A parsed 64-bit little-endian ELF file over borrowed bytes.
pub struct Elf<'d> {
    pub data: &'d [u8],
    pub file: ElfFile64<'d, LittleEndian>,
    pub arch: Arch,
}

/// A section's address and contents (empty for `SHT_NOBITS`).
#[derive(Clone, Copy, Debug)]
pub struct Section<'d> {
    pub address: u64,
    pub data: &'d [u8],
    pub nobits: bool,
}

impl<'d> Elf<'d> {
    pub fn parse(data: &'d [u8]) -> Result<Self, ElfError> {
        if data.get(..4) != Some(b"\x7fELF") {
            return Err(ElfError::NotElf);
        }
        // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian.
        if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
            return Err(ElfError::WrongClass);
        }
        let file = ElfFile64::<LittleEndian>::parse(data)
            .map_err(|e| ElfError::Malformed(e.to_string()))?;
        let machine = file.elf_header().e_machine(LittleEndian);
        let arch = match machine {
            object::elf::EM_X86_64 => Arch::X86_64,
            object::elf::EM_AARCH64 => Arch::Aarch64,
            other => return Err(ElfError::UnsupportedMachine(other)),
        };
        Ok(Self { data, file, arch })
    }

    /// The section called `name`, if present.
    pub fn section(&self, name: &str) -> Option<Section<'d>> {
        let s = self.file.section_by_name(name)?;
        let nobits = s.kind() == object::SectionKind::UninitializedData;
        let data = if nobits { &[][..] } else { s.data().ok()? };
        Some(Section {
            address: s.address(),
            data,
            nobits,
        })
    }

    pub fn entry(&self) -> u64 {
        self.file.entry()
    }
}
