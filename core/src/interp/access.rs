//! Reading what loaders need from an ELF file: symbols by name, bytes and
//! strings at virtual addresses, and pointers as the dynamic loader would
//! relocate them. Everything is bounded by the file: a hostile file gives
//! `None` or a [`LoaderError`], never a panic or an unbounded read.

use std::collections::HashMap;
use std::ops::Range;

use object::read::elf::{FileHeader, SectionHeader};
use object::{LittleEndian, Object, ObjectSymbol};

use super::LoaderError;
use crate::elf::{Arch, Elf};

/// A symbol's address and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub address: u64,
    pub size: u64,
    /// A thread-local symbol: `address` is an offset in the TLS block.
    pub tls: bool,
}

impl Symbol {
    /// Upstream's `GetSymbolAsRanges`: `[address, address + size)`.
    pub fn range(&self) -> Range<u64> {
        self.address..self.address.saturating_add(self.size)
    }
}

/// The defined symbols of a file by name: the dynamic table first (what
/// upstream's `LookupSymbol` reads), then `.symtab` for names it lacks.
#[derive(Default)]
pub struct Symbols<'d> {
    by_name: HashMap<&'d [u8], Symbol>,
}

impl<'d> Symbols<'d> {
    pub fn of(elf: &Elf<'d>) -> Self {
        let mut by_name = HashMap::new();
        let tables = [elf.file.dynamic_symbols(), elf.file.symbols()];
        for table in tables {
            // Each table is bounded by its section, so this loop is too.
            for sym in table {
                if sym.is_undefined() {
                    continue;
                }
                let Ok(name) = sym.name_bytes() else {
                    continue;
                };
                // `name@@VERSION` in .dynsym is looked up without its version.
                let name = match name.iter().position(|&b| b == b'@') {
                    Some(at) => &name[..at],
                    None => name,
                };
                by_name.entry(name).or_insert(Symbol {
                    address: sym.address(),
                    size: sym.size(),
                    tls: sym.kind() == object::SymbolKind::Tls,
                });
            }
        }
        Self { by_name }
    }

    pub fn get(&self, name: &str) -> Option<Symbol> {
        self.by_name.get(name.as_bytes()).copied()
    }

    /// The symbol, or the loader error that names it.
    pub fn require(&self, name: &str) -> Result<Symbol, LoaderError> {
        self.get(name)
            .ok_or_else(|| LoaderError::MissingSymbol(name.into()))
    }

    /// Number of symbols whose name starts with `prefix`.
    pub fn count_prefix(&self, prefix: &str) -> usize {
        self.by_name
            .keys()
            .filter(|k| k.starts_with(prefix.as_bytes()))
            .count()
    }
}

/// `N` bytes at `addr`.
pub fn read<const N: usize>(elf: &Elf<'_>, addr: u64, what: &str) -> Result<[u8; N], LoaderError> {
    elf.virtual_memory(addr, N)
        .and_then(|b| <[u8; N]>::try_from(&b[..]).ok())
        .ok_or_else(|| LoaderError::Unreadable {
            what: what.into(),
            addr,
        })
}

pub fn read_u8(elf: &Elf<'_>, addr: u64, what: &str) -> Result<u8, LoaderError> {
    Ok(read::<1>(elf, addr, what)?[0])
}

pub fn read_u32(elf: &Elf<'_>, addr: u64, what: &str) -> Result<u32, LoaderError> {
    read::<4>(elf, addr, what).map(u32::from_le_bytes)
}

pub fn read_u64(elf: &Elf<'_>, addr: u64, what: &str) -> Result<u64, LoaderError> {
    read::<8>(elf, addr, what).map(u64::from_le_bytes)
}

/// The NUL-terminated string at `addr` (at most `max` bytes before the NUL).
pub fn read_cstr(elf: &Elf<'_>, addr: u64, max: usize, what: &str) -> Result<Vec<u8>, LoaderError> {
    let unreadable = || LoaderError::Unreadable {
        what: what.into(),
        addr,
    };
    let bytes = elf
        .virtual_memory_upto(addr, max.saturating_add(1))
        .ok_or_else(unreadable)?;
    let end = bytes.iter().position(|&b| b == 0).ok_or_else(unreadable)?;
    Ok(bytes[..end].to_vec())
}

/// The targets of the file's `RELATIVE` relocations by place: where the
/// dynamic loader puts `base + addend` (the pointers of a position-independent
/// file). Built once per file, bounded by `.rela.dyn`.
#[derive(Default)]
pub struct Relocations {
    relative: HashMap<u64, u64>,
}

impl Relocations {
    pub fn of(elf: &Elf<'_>) -> Self {
        const R_X86_64_RELATIVE: u32 = 8;
        const R_AARCH64_RELATIVE: u32 = 1027;
        const MAX_RELA_BYTES: u64 = 256 << 20;
        let kind = match elf.arch {
            Arch::X86_64 => R_X86_64_RELATIVE,
            Arch::Aarch64 => R_AARCH64_RELATIVE,
        };
        let e = LittleEndian;
        let mut relative = HashMap::new();
        let Ok(sections) = elf.file.elf_header().sections(e, elf.data) else {
            return Self { relative };
        };
        for s in sections.iter() {
            if s.sh_type(e) != object::elf::SHT_RELA
                || s.sh_flags(e) & u64::from(object::elf::SHF_ALLOC) == 0
                || s.sh_size(e) > MAX_RELA_BYTES
            {
                continue;
            }
            let Some(bytes) = usize::try_from(s.sh_offset(e))
                .ok()
                .zip(usize::try_from(s.sh_size(e)).ok())
                .and_then(|(at, len)| elf.data.get(at..at.checked_add(len)?))
            else {
                continue;
            };
            for entry in bytes.chunks_exact(24) {
                let word = |at: usize| {
                    entry
                        .get(at..at + 8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_le_bytes)
                };
                if word(8) as u32 == kind {
                    relative.insert(word(0), word(16));
                }
            }
        }
        Self { relative }
    }

    /// The pointer stored at `addr` once relocated: the target of a
    /// `RELATIVE` relocation of that place, else the stored value (a
    /// position-dependent file).
    pub fn pointer(&self, elf: &Elf<'_>, addr: u64, what: &str) -> Result<u64, LoaderError> {
        match self.relative.get(&addr) {
            Some(&target) => Ok(target),
            None => read_u64(elf, addr, what),
        }
    }
}

/// The file's name without its directories.
pub fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}
