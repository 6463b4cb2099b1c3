//! Symbolization of frames: (file, ELF address) to `symbol+offset` from
//! the file's own `.symtab` and `.dynsym` (no debug files, no DWARF), and
//! the file's `PT_LOAD` segments (file offset to ELF address).
//!
//! A file is read once, opened the way every file of a process is
//! ([`crate::host::open::open_mapping`]: `/proc/PID/map_files/START-END`,
//! the very file the process maps, else its path inside the process's
//! root; a regular file only, checked to be the file mapped before it is
//! opened), read into memory (never mapped) up to [`MAX_FILE_BYTES`],
//! and cached by (device, inode) for every later frame and thread.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

use object::read::elf::ElfFile64;
use object::{LittleEndian, Object as _, ObjectSymbol as _, SymbolKind};

use crate::host::open::{open_mapping, OpenStrategy};
use crate::host::procs::ExecMapping;
use eim_analysis::elf::segments::{self, Segment};

/// Largest file read for its symbols.
pub const MAX_FILE_BYTES: u64 = 512 << 20;
/// Symbols kept per file.
const MAX_SYMBOLS: usize = 4 << 20;

/// Why a file gives no symbols.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SymbolsError {
    #[error("{path}: cannot open it for process {pid}: {message}")]
    Open {
        pid: i32,
        path: String,
        message: String,
    },
    #[error("{path}: {size} bytes, more than the {MAX_FILE_BYTES} read for symbols")]
    TooLarge { path: String, size: u64 },
    #[error("{path}: reading failed: {message}")]
    Read { path: String, message: String },
    #[error("{path}: not a 64-bit little-endian ELF file: {message}")]
    NotElf { path: String, message: String },
}

/// A function symbol: `[start, start + size)` (size 0: unknown, up to the
/// next symbol).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Symbol {
    start: u64,
    size: u64,
    name: String,
}

/// What a file says about its addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileSymbols {
    /// Sorted by start.
    symbols: Vec<Symbol>,
    segments: Vec<Segment>,
}

impl FileSymbols {
    /// Parses an ELF image.
    pub fn parse(path: &str, data: &[u8]) -> Result<Self, SymbolsError> {
        let elf = ElfFile64::<LittleEndian>::parse(data).map_err(|e| SymbolsError::NotElf {
            path: path.into(),
            message: e.to_string(),
        })?;
        // The host's segment reader: the same bias for the same mapping.
        let segments = segments::load_segments_of(data);
        let mut symbols: Vec<Symbol> = elf
            .symbols()
            .chain(elf.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .filter_map(|s| {
                Some(Symbol {
                    start: s.address(),
                    size: s.size(),
                    name: s.name().ok()?.to_owned(),
                })
            })
            .take(MAX_SYMBOLS)
            .collect();
        // The same function in both tables: keep one (the sized one first).
        symbols.sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
        symbols.dedup_by(|b, a| a.start == b.start);
        Ok(Self { symbols, segments })
    }

    /// The ELF address of `pc` in `mapping` of this file (the bias the
    /// host gives the unwinder's table, [`segments::bias`]).
    pub fn elf_address(&self, mapping: &ExecMapping, pc: u64) -> Option<u64> {
        Some(pc.wrapping_sub(segments::bias(
            &self.segments,
            mapping.start,
            mapping.offset,
        )?))
    }

    /// The function containing ELF address `address`, and the offset in it.
    pub fn symbol_at(&self, address: u64) -> Option<(&str, u64)> {
        let i = self.symbols.partition_point(|s| s.start <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        let offset = address - s.start;
        (s.size == 0 || offset < s.size).then_some((s.name.as_str(), offset))
    }
}

/// Reads a whole file (`files::regular::read_bounded`), refusing one
/// larger than the limit by its size first.
fn read_bounded(file: &File, path: &str) -> Result<Vec<u8>, SymbolsError> {
    let read_error = |e: std::io::Error| SymbolsError::Read {
        path: path.into(),
        message: e.to_string(),
    };
    let size = file.metadata().map_err(read_error)?.len();
    if size > MAX_FILE_BYTES {
        return Err(SymbolsError::TooLarge {
            path: path.into(),
            size,
        });
    }
    crate::files::regular::read_bounded(file, MAX_FILE_BYTES, path).map_err(read_error)
}

/// A file as the kernel identifies it: device (major, minor) and inode.
type FileKey = ((u32, u32), u64);

/// Symbols per file, read on first use (a failure too, so it is not retried).
#[derive(Debug, Default)]
pub struct Symbolizer {
    files: HashMap<FileKey, Result<Arc<FileSymbols>, SymbolsError>>,
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The symbols of the file process `pid` maps at `mapping`.
    pub fn file(
        &mut self,
        pid: i32,
        mapping: &ExecMapping,
    ) -> Result<Arc<FileSymbols>, SymbolsError> {
        self.files
            .entry((mapping.dev, mapping.inode))
            .or_insert_with(|| load(pid, mapping).map(Arc::new))
            .clone()
    }
}

fn load(pid: i32, mapping: &ExecMapping) -> Result<FileSymbols, SymbolsError> {
    let path = mapping.path.to_string_lossy().into_owned();
    let opened = open_mapping(pid, mapping, OpenStrategy::MapFilesThenRoot).map_err(|e| {
        SymbolsError::Open {
            pid,
            path: path.clone(),
            message: e.cause(),
        }
    })?;
    let data = read_bounded(&opened.file, &path)?;
    FileSymbols::parse(&path, &data)
}
