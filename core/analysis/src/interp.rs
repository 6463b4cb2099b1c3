//! Interpreter loaders (upstream's `interpreter.Loader`s): which files run
//! an interpreter the BPF side can unwind, and the per-file facts it needs.
//!
//! A loader is a pure function of a [`LoaderInfo`] (file id, name, parsed
//! ELF, the gaps of at least 512 KiB between its stack deltas). It says
//! "not mine" (`Ok(None)`), or returns its per-file data and the
//! `interpreter_offsets` ranges it needs ([`Loaded`]), or fails. Loaders run
//! in the extraction phase, outside the manager's locks; the manager turns
//! the ranges into [`eim_machine::ops::MapOp::PutInterpreterOffsets`] in the load
//! plan and deletes them when the file is unloaded (upstream weakness 7).
//!
//! `eim_core::tracers::detect` asks every enabled loader and keeps every match, as newer upstream
//! does (weakness 11): one loader's error is reported in its own
//! `eim_core::tracers::LoaderMatch` and hides nothing.
//!
//! Every loader asks a file it does not claim no more than it must: the
//! loaders upstream keys on the file's name test the name before anything
//! else, and the Go loaders, which key on the contents, test the cheap
//! `evidence` first (section names, Go's note). What is costly to build
//! is built on first use and shared by all loaders: the symbol index, and
//! the gaps (a walk over every delta, which only V8 needs, on a file named
//! like node). On a file no loader claims neither is built, and nothing of
//! the file is read but its note segments (`tests/eim/loaders_evidence.rs`).
//!
//! One module per interpreter; [`access`] holds the ELF reading they share,
//! `evidence` what they test first, `names` the file-name patterns
//! of spec 8.2, and [`identity`] what interpreter a file is by its symbols
//! whatever its name (for `eim inspect`).

pub mod access;
pub mod apm;
pub mod dotnet;
pub(crate) mod evidence;
pub mod go;
pub mod hotspot;
pub mod identity;
pub(crate) mod names;
pub mod perl;
pub mod php;
pub mod php_code;
pub mod python;
pub mod ruby;
pub mod v8;

use std::cell::{Cell, OnceCell};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::elf::Elf;
use eim_machine::abi::OffsetRange;
use eim_machine::deltas::IntervalData;
use eim_machine::encode;
use eim_machine::FileId;

pub use access::Symbols;
pub(crate) use evidence::Evidence;

/// Per-file data of an interpreter loader. `Any` lets a caller that knows
/// the loader read its concrete data (`as &dyn Any`, then `downcast_ref`).
pub trait InterpreterData: std::any::Any + Send + Sync + fmt::Debug {
    /// The loader that produced it.
    fn loader(&self) -> &'static str;

    /// The interpreter's version, as the loader read it.
    fn version(&self) -> String {
        String::new()
    }

    /// What the loader found, for a person: (name, value) pairs, addresses
    /// in hex, large tables by their size. `eim inspect` prints these,
    /// never the `Debug` form.
    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![("version", self.version())]
    }
}

/// An address as every fact writes it.
pub(crate) fn hex(address: u64) -> String {
    format!("{address:#x}")
}

/// What a loader sees of a file.
pub struct LoaderInfo<'a, 'd> {
    pub file_id: FileId,
    /// The path the file was mapped from (upstream's `FileName()`).
    pub(crate) name: &'a str,
    pub(crate) elf: &'a Elf<'d>,
    /// `None` when the gaps were given.
    deltas: Option<&'a IntervalData>,
    gaps: OnceCell<Vec<Range<u64>>>,
    symbols: OnceCell<Symbols<'d>>,
    prefixed_symbols: Cell<bool>,
    evidence: Evidence<'a, 'd>,
}

impl<'a, 'd> LoaderInfo<'a, 'd> {
    /// A file whose stack deltas are `deltas` (the gaps come from them,
    /// when a loader asks).
    pub fn new(file_id: FileId, name: &'a str, elf: &'a Elf<'d>, deltas: &'a IntervalData) -> Self {
        Self::of(file_id, name, elf, Some(deltas))
    }

    fn of(
        file_id: FileId,
        name: &'a str,
        elf: &'a Elf<'d>,
        deltas: Option<&'a IntervalData>,
    ) -> Self {
        Self {
            file_id,
            name,
            elf,
            deltas,
            gaps: OnceCell::new(),
            symbols: OnceCell::new(),
            prefixed_symbols: Cell::new(false),
            evidence: Evidence::new(elf),
        }
    }

    /// A file whose gaps are already known.
    pub fn with_gaps(
        file_id: FileId,
        name: &'a str,
        elf: &'a Elf<'d>,
        gaps: Vec<Range<u64>>,
    ) -> Self {
        let info = Self::of(file_id, name, elf, None);
        info.gaps.get_or_init(|| gaps);
        info
    }

    /// Ranges after an end-of-function marker of at least 512 KiB
    /// (upstream's `Gaps()`, see [`encode::gaps`]): a walk over every
    /// delta, so only on first use (V8, on a file named like node).
    pub(crate) fn gaps(&self) -> &[Range<u64>] {
        self.gaps
            .get_or_init(|| self.deltas.map(encode::gaps).unwrap_or_default())
    }

    /// The file's symbols (dynamic first, then `.symtab`), indexed once.
    pub(crate) fn symbols(&self) -> &Symbols<'d> {
        self.symbols.get_or_init(|| Symbols::of(self.elf))
    }

    /// The file's symbols whose names start with one of `prefixes`,
    /// indexed now: for a loader whose names all do, on a file only it
    /// claims (V8 on node, Go labels on a Go binary), where the whole
    /// index would hash every name of tables of 100k symbols and more.
    pub(crate) fn symbols_with(&self, prefixes: &'static [&'static str]) -> Symbols<'d> {
        self.prefixed_symbols.set(true);
        Symbols::with_prefixes(self.elf, prefixes)
    }

    /// The cheap evidence of what the file is (section names, Go's note).
    pub(crate) fn evidence(&self) -> &Evidence<'a, 'd> {
        &self.evidence
    }

    /// What the loaders have built so far, the costly parts of asking them
    /// about a file: for tests that a file no loader claims costs nothing.
    pub fn built(&self) -> Built {
        Built {
            symbols: self.symbols.get().is_some() || self.prefixed_symbols.get(),
            gaps: self.gaps.get().is_some(),
        }
    }
}

/// Which of a [`LoaderInfo`]'s costly parts were built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Built {
    /// A symbol index (every dynamic and `.symtab` symbol, or those of
    /// some prefixes, hashed).
    pub symbols: bool,
    /// The gaps (a walk over every stack delta).
    pub gaps: bool,
}

/// Why a loader refused a file it recognised. Every message names what was
/// missing or wrong; the file is named by `eim_core::tracers::LoaderMatch`'s display.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoaderError {
    #[error("symbol {0} not found")]
    MissingSymbol(String),
    #[error("cannot read {what} at {addr:#x}")]
    Unreadable { what: String, addr: u64 },
    #[error("version {found} is not supported (supported: {supported})")]
    UnsupportedVersion { found: String, supported: String },
    #[error("{0}")]
    Invalid(String),
    #[error("interpreter_offsets of this file are already used by the {0} loader")]
    OffsetsTaken(&'static str),
}

/// The code ranges a loader asks the BPF side to hand to its program: one
/// or two half-open ranges of file virtual addresses (upstream's
/// `UpdateInterpreterOffsets`; the BPF side compares both bounds
/// inclusively, spec 3.8 and erratum I11).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterpreterOffsets {
    pub program: u16,
    pub first: Range<u64>,
    pub second: Option<Range<u64>>,
}

impl InterpreterOffsets {
    /// Each range as every report writes it
    /// ([`eim_machine::abi::interpreter_range`]).
    pub fn described(&self) -> Vec<String> {
        std::iter::once(&self.first)
            .chain(self.second.as_ref())
            .map(|r| eim_machine::abi::interpreter_range(r.start, r.end, self.program))
            .collect()
    }

    pub(crate) fn one(program: u16, range: Range<u64>) -> Self {
        Self {
            program,
            first: range,
            second: None,
        }
    }

    /// The map value: an absent second range is written as 0..0, as
    /// upstream does.
    pub fn value(&self) -> OffsetRange {
        let second = self.second.clone().unwrap_or(0..0);
        OffsetRange {
            lower_offset1: self.first.start,
            upper_offset1: self.first.end,
            lower_offset2: second.start,
            upper_offset2: second.end,
            program_index: self.program,
            pad: [0; 6],
        }
    }
}

/// A loader's "handle it": its per-file data, and the ranges it needs.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub data: Arc<dyn InterpreterData>,
    pub offsets: Option<InterpreterOffsets>,
}

impl Loaded {
    pub fn new(data: impl InterpreterData + 'static, offsets: Option<InterpreterOffsets>) -> Self {
        Self {
            data: Arc::new(data),
            offsets,
        }
    }
}

/// A loader: `Ok(None)` for "not mine".
pub type LoadFn = fn(&LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError>;

/// A dotted version with up to three parts, ordered numerically.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u32, pub u32, pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    /// Parses `major.minor[.patch]` at the start of `text` (what follows
    /// the last digit is ignored, e.g. `8.2.36-1` or `3.1.2p20`).
    pub(crate) fn parse_prefix(text: &[u8]) -> Option<Self> {
        let mut parts = [0u32; 3];
        let mut n = 0;
        let mut digits = 0;
        for &b in text.iter().take(64) {
            match b {
                b'0'..=b'9' => {
                    parts[n] = parts[n].checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
                    digits += 1;
                }
                b'.' if digits > 0 && n < 2 => {
                    n += 1;
                    digits = 0;
                }
                _ => break,
            }
        }
        if n == 0 || digits == 0 && n < 2 {
            return None;
        }
        Some(Self(parts[0], parts[1], parts[2]))
    }

    /// `Err` unless `lo <= self < hi`.
    pub(crate) fn check(
        self,
        lo: Version,
        hi: Version,
        supported: &str,
    ) -> Result<Self, LoaderError> {
        if self < lo || self >= hi {
            return Err(LoaderError::UnsupportedVersion {
                found: self.to_string(),
                supported: supported.into(),
            });
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse_prefix(b"8.2.36-1"), Some(Version(8, 2, 36)));
        assert_eq!(Version::parse_prefix(b"3.1.2\0"), Some(Version(3, 1, 2)));
        assert_eq!(Version::parse_prefix(b"3.11"), Some(Version(3, 11, 0)));
        assert_eq!(Version::parse_prefix(b"3."), None);
        assert_eq!(Version::parse_prefix(b"abc"), None);
        assert_eq!(Version::parse_prefix(b"99999999999.1"), None);
        assert!(Version(5, 40, 9) < Version(5, 41, 0));
        assert!(Version(3, 2, 0)
            .check(Version(2, 5, 0), Version(3, 3, 0), "")
            .is_ok());
        assert!(Version(3, 3, 0)
            .check(Version(2, 5, 0), Version(3, 3, 0), "")
            .is_err());
    }

    #[test]
    fn an_absent_second_range_is_zero() {
        let v = InterpreterOffsets::one(4, 0x10..0x20).value();
        assert_eq!(
            (
                v.lower_offset1,
                v.upper_offset1,
                v.lower_offset2,
                v.upper_offset2
            ),
            (0x10, 0x20, 0, 0)
        );
        assert_eq!(v.program_index, 4);
    }
}
