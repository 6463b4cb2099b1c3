//! Reading what loaders need from an ELF file: symbols by name, bytes and
//! strings at virtual addresses, and pointers as the dynamic loader would
//! relocate them. Everything is bounded by the file: a hostile file gives
//! `None` or a [`LoaderError`], never a panic or an unbounded read.

use std::collections::HashMap;
use std::ops::Range;

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader, Sym, SymbolTable};
use object::LittleEndian;

use super::LoaderError;
use crate::elf::{Arch, Elf, FileView};

/// A symbol's address and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub address: u64,
    pub size: u64,
    /// A thread-local symbol: `address` is an offset in the TLS block.
    pub tls: bool,
}

impl Symbol {
    /// Its address (or TLS offset) and size, as loader facts write it.
    pub(crate) fn fact(&self) -> String {
        let tls = if self.tls { " (TLS offset)" } else { "" };
        format!("{:#x}{tls}, {} bytes", self.address, self.size)
    }

    /// Upstream's `GetSymbolAsRanges`: `[address, address + size)`.
    pub(crate) fn range(&self) -> Range<u64> {
        self.address..self.address.saturating_add(self.size)
    }
}

/// The defined symbols of a file by name: the dynamic table first (what
/// upstream's `LookupSymbol` reads), then `.symtab` for names it lacks.
/// Either all of them, or only those whose name starts with one of a few
/// prefixes ([`Symbols::with_prefixes`]).
#[derive(Default)]
pub struct Symbols<'d> {
    by_name: HashMap<&'d [u8], Symbol>,
    /// The prefixes every indexed name starts with; empty: every name.
    prefixes: &'static [&'static str],
}

impl<'d> Symbols<'d> {
    /// Every symbol.
    pub fn of(elf: &Elf<'d>) -> Self {
        Self::with_prefixes(elf, &[])
    }

    /// The symbols whose name starts with one of `prefixes` (none: every
    /// symbol), for a loader whose names all do. Only those are hashed
    /// and kept: on node's 185k symbols, V8's few hundred. A name that
    /// starts with none is [`Symbols::get`]'s `None`. The prefixes have no
    /// `@`, so a name starts with one exactly when its unversioned name
    /// does.
    pub fn with_prefixes(elf: &Elf<'d>, prefixes: &'static [&'static str]) -> Self {
        debug_assert!(prefixes.iter().all(|p| !p.is_empty() && !p.contains('@')));
        let endian = LittleEndian;
        let tables = [
            elf.file.elf_dynamic_symbol_table(),
            elf.file.elf_symbol_table(),
        ];
        let wanted = |name: &[u8]| {
            prefixes.is_empty() || prefixes.iter().any(|p| name.starts_with(p.as_bytes()))
        };
        // Each table is bounded by its section, so the reservation is too;
        // capped, as a table's size is the file's word.
        let count: usize = tables.iter().map(|t| t.len()).sum();
        let reserve = if prefixes.is_empty() { count } else { 0 };
        let mut by_name = HashMap::with_capacity(reserve.min(MAX_RESERVED_SYMBOLS));
        for table in tables {
            // The whole string table in one read: reading name after name
            // through the file's view cost a cache lookup each, and read
            // the table in overlapping windows (node's 185k names: 28.7 MB
            // read, 150 ms, against 12.9 MB and 53 ms). Where it cannot
            // be read whole, each name is read alone, as `object` reads
            // it, so what can be read still is.
            let whole = string_table(elf, table);
            for sym in table.symbols() {
                if sym.is_undefined(endian) {
                    continue;
                }
                let name = match whole {
                    Some(strings) => {
                        let at = usize::try_from(sym.st_name(endian)).unwrap_or(usize::MAX);
                        // The prefix before the NUL: most names are
                        // rejected without their end being looked for.
                        let head = strings.get(at..).unwrap_or_default();
                        if !wanted(head) {
                            continue;
                        }
                        name_in(head)
                    }
                    None => sym.name(endian, table.strings()).ok(),
                };
                let Some(name) = name.filter(|n| wanted(n)) else {
                    continue;
                };
                // `name@@VERSION` in .dynsym is looked up without its version.
                let name = match name.iter().position(|&b| b == b'@') {
                    Some(at) => &name[..at],
                    None => name,
                };
                by_name.entry(name).or_insert(Symbol {
                    address: sym.st_value(endian),
                    size: sym.st_size(endian),
                    tls: sym.st_type() == object::elf::STT_TLS,
                });
            }
        }
        Self { by_name, prefixes }
    }

    pub fn get(&self, name: &str) -> Option<Symbol> {
        debug_assert!(
            self.prefixes.is_empty() || self.prefixes.iter().any(|p| name.starts_with(p)),
            "{name} is not indexed: it starts with none of {:?}",
            self.prefixes
        );
        self.by_name.get(name.as_bytes()).copied()
    }

    /// The symbol, or the loader error that names it.
    pub(crate) fn require(&self, name: &str) -> Result<Symbol, LoaderError> {
        self.get(name)
            .ok_or_else(|| LoaderError::MissingSymbol(name.into()))
    }

    /// The symbols whose name starts with `prefix`, in no order.
    pub fn with_prefix<'s>(
        &'s self,
        prefix: &'s str,
    ) -> impl Iterator<Item = (&'d [u8], Symbol)> + 's {
        self.by_name
            .iter()
            .filter(move |(k, _)| k.starts_with(prefix.as_bytes()))
            .map(|(k, s)| (*k, *s))
    }
}

/// The most entries a symbol index reserves room for before it sees them.
const MAX_RESERVED_SYMBOLS: usize = 1 << 20;

/// The bytes of `table`'s string table, if it has one and they can be read.
fn string_table<'d>(
    elf: &Elf<'d>,
    table: &SymbolTable<'d, FileHeader64<LittleEndian>, FileView<'d>>,
) -> Option<&'d [u8]> {
    let endian = LittleEndian;
    let index = table.string_section();
    if index.0 == 0 {
        return None;
    }
    let section = elf.file.elf_section_table().section(index).ok()?;
    if section.sh_type(endian) != object::elf::SHT_STRTAB {
        return None;
    }
    elf.data
        .bytes_at(section.sh_offset(endian), section.sh_size(endian))
}

/// The NUL-terminated name at the start of `rest` (a string table from a
/// name's offset on), as `object`'s `StringTable::get` finds it: `None`
/// without a NUL.
fn name_in(rest: &[u8]) -> Option<&[u8]> {
    let end = memchr::memchr(0, rest)?;
    Some(&rest[..end])
}

/// `N` bytes at `addr`.
pub(crate) fn read<const N: usize>(
    elf: &Elf<'_>,
    addr: u64,
    what: &str,
) -> Result<[u8; N], LoaderError> {
    elf.virtual_memory(addr, N)
        .and_then(|b| <[u8; N]>::try_from(&b[..]).ok())
        .ok_or_else(|| LoaderError::Unreadable {
            what: what.into(),
            addr,
        })
}

pub(crate) fn read_u8(elf: &Elf<'_>, addr: u64, what: &str) -> Result<u8, LoaderError> {
    Ok(read::<1>(elf, addr, what)?[0])
}

pub(crate) fn read_u32(elf: &Elf<'_>, addr: u64, what: &str) -> Result<u32, LoaderError> {
    read::<4>(elf, addr, what).map(u32::from_le_bytes)
}

pub(crate) fn read_u64(elf: &Elf<'_>, addr: u64, what: &str) -> Result<u64, LoaderError> {
    read::<8>(elf, addr, what).map(u64::from_le_bytes)
}

/// The NUL-terminated string at `addr` (at most `max` bytes before the NUL).
pub(crate) fn read_cstr(
    elf: &Elf<'_>,
    addr: u64,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, LoaderError> {
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

/// The string a (relocated) pointer at `at` points to, `None` for NULL.
pub(crate) fn string_at(
    elf: &Elf<'_>,
    relocations: &Relocations,
    at: u64,
    max: usize,
    what: &str,
) -> Result<Option<String>, LoaderError> {
    let ptr = relocations.pointer(elf, at, what)?;
    if ptr == 0 {
        return Ok(None);
    }
    let bytes = read_cstr(elf, ptr, max, what)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Walks a C array of `entry_size`-byte entries whose first field points
/// to a name and which ends at the first NULL name (HotSpot's VM struct
/// and type tables, CPython's `tp_members`): `each(entry address, name)`
/// for every entry before the end. A table with no end within
/// `max_entries` entries is an error naming `table`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn named_entries(
    elf: &Elf<'_>,
    relocations: &Relocations,
    table: &str,
    base: u64,
    entry_size: u64,
    max_entries: u64,
    max_name: usize,
    mut each: impl FnMut(u64, String) -> Result<(), LoaderError>,
) -> Result<(), LoaderError> {
    for i in 0..max_entries {
        let entry = base.saturating_add(i * entry_size);
        let what = format!("{table}[{i}].name");
        let Some(name) = string_at(elf, relocations, entry, max_name, &what)? else {
            return Ok(());
        };
        each(entry, name)?;
    }
    Err(LoaderError::Invalid(format!(
        "{table} has no end within {max_entries} entries"
    )))
}

/// Where the dynamic loader points the relocated words of a file: the
/// targets of its `RELATIVE` relocations (`base + addend`, the pointers of a
/// position-independent file), and of its absolute and GOT relocations
/// against symbols (`symbol + addend`, e.g. a GOT slot of an exported
/// variable that the file's own code reaches through the GOT). Built once
/// per file, bounded by its `SHT_RELA` sections.
#[derive(Default)]
pub(crate) struct Relocations {
    /// By place, in file order among equal places: the last one of a place
    /// is what the dynamic loader leaves there. A sorted list, not a hash
    /// map: the tables come sorted by place, or in a few sorted runs, so a
    /// stable sort is about a copy (libjvm's 200k relocations: a map's
    /// inserts took most of the HotSpot loader's time).
    targets: Vec<(u64, Target)>,
}

/// What a relocated place holds once the dynamic loader is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Address(u64),
    /// A symbol the file does not define (or whose value is no address:
    /// thread-local, or an IFUNC's resolver), so the value is only known in
    /// a process.
    Unresolved,
}

/// The relocation types [`Relocations`] follows, per architecture.
struct Kinds {
    relative: u32,
    /// `S + A` against a symbol.
    absolute: u32,
    /// The GOT slot of a symbol: `S` on x86-64 (no addend in the psABI),
    /// `S + A` on arm64.
    glob_dat: u32,
    glob_dat_addend: bool,
}

impl Relocations {
    pub(crate) fn of(elf: &Elf<'_>) -> Self {
        const MAX_RELA_BYTES: u64 = 256 << 20;
        let kinds = match elf.arch {
            Arch::X86_64 => Kinds {
                relative: object::elf::R_X86_64_RELATIVE,
                absolute: object::elf::R_X86_64_64,
                glob_dat: object::elf::R_X86_64_GLOB_DAT,
                glob_dat_addend: false,
            },
            Arch::Aarch64 => Kinds {
                relative: object::elf::R_AARCH64_RELATIVE,
                absolute: object::elf::R_AARCH64_ABS64,
                glob_dat: object::elf::R_AARCH64_GLOB_DAT,
                glob_dat_addend: true,
            },
        };
        let e = LittleEndian;
        let mut targets = Vec::new();
        let Ok(sections) = elf.file.elf_header().sections(e, elf.data) else {
            return Self { targets };
        };
        for s in sections.iter() {
            if s.sh_type(e) != object::elf::SHT_RELA
                || s.sh_flags(e) & u64::from(object::elf::SHF_ALLOC) == 0
                || s.sh_size(e) > MAX_RELA_BYTES
            {
                continue;
            }
            let Some(bytes) = elf.bytes_at(s.sh_offset(e), s.sh_size(e)) else {
                continue;
            };
            // The symbols the section's relocations name (`sh_link`); a
            // section without a readable table still has its RELATIVE ones.
            let symbols = sections
                .symbol_table_by_index(e, elf.data, object::SectionIndex(s.sh_link(e) as usize))
                .ok();
            let symbol_value = |index: u32| -> Option<u64> {
                let sym = symbols
                    .as_ref()?
                    .symbol(object::SymbolIndex(index as usize))
                    .ok()?;
                let defined = sym.st_shndx(e) != object::elf::SHN_UNDEF;
                let plain = !matches!(
                    sym.st_type(),
                    object::elf::STT_TLS | object::elf::STT_GNU_IFUNC
                );
                (defined && plain).then(|| sym.st_value(e))
            };
            for entry in bytes.chunks_exact(24) {
                let word = |at: usize| {
                    entry
                        .get(at..at + 8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_le_bytes)
                };
                let (place, info, addend) = (word(0), word(8), word(16));
                let (kind, index) = (info as u32, (info >> 32) as u32);
                let target = if kind == kinds.relative {
                    Target::Address(addend)
                } else if kind == kinds.absolute || kind == kinds.glob_dat {
                    let addend = if kind == kinds.glob_dat && !kinds.glob_dat_addend {
                        0
                    } else {
                        addend
                    };
                    symbol_value(index).map_or(Target::Unresolved, |v| {
                        Target::Address(v.wrapping_add(addend))
                    })
                } else {
                    continue;
                };
                targets.push((place, target));
            }
        }
        targets.sort_by_key(|&(place, _)| place);
        Self { targets }
    }

    /// The pointer stored at `addr` once relocated: the target of the
    /// relocation of that place, else the stored value (a
    /// position-dependent file). A place relocated against a symbol the
    /// file does not define has no value here: an error.
    pub(crate) fn pointer(&self, elf: &Elf<'_>, addr: u64, what: &str) -> Result<u64, LoaderError> {
        // The last relocation of the place, as a map's last insert was.
        let end = self.targets.partition_point(|&(place, _)| place <= addr);
        let last = end
            .checked_sub(1)
            .and_then(|i| self.targets.get(i))
            .filter(|&&(place, _)| place == addr)
            .map(|(_, target)| target);
        match last {
            Some(&Target::Address(target)) => Ok(target),
            Some(Target::Unresolved) => Err(LoaderError::Invalid(format!(
                "{what} at {addr:#x} is relocated against a symbol this file does not define"
            ))),
            None => read_u64(elf, addr, what),
        }
    }
}
