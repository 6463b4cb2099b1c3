//! Symbolization of frames: (file, ELF address) to the function, as gdb
//! names it, and its source line.
//!
//! Names come from the file's `.symtab` and `.dynsym`, its PLT stubs
//! (`symbol@plt`, [`plt`]), the `.symtab` of its separate debug file (the
//! local functions a stripped library keeps there, [`debug_file`]), and
//! its DWARF or the debug file's ([`dwarf`]: the function at an address,
//! the functions inlined there, source lines). They are demangled as gdb
//! prints them ([`mod@demangle`]); the raw (mangled) name is kept beside.
//!
//! A file is read once, opened the way every file of a process is
//! ([`crate::host::open::open_mapping`]: `/proc/PID/map_files/START-END`,
//! the very file the process maps, else its path inside the process's
//! root; a regular file only, checked to be the file mapped before it is
//! opened), read into memory (never mapped) up to [`MAX_FILE_BYTES`],
//! its debug file likewise, and cached by (device, inode) for every later
//! frame and thread.

pub mod debug_file;
pub mod demangle;
pub mod dwarf;
pub mod plt;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Arc;

use object::read::elf::ElfFile64;
use object::{LittleEndian, Object as _, ObjectSymbol as _, SymbolKind};

use crate::host::open::{open_mapping, OpenStrategy};
use crate::host::procs::ExecMapping;
use eim_analysis::elf::segments::{self, Segment};
use serde::Serialize;

use demangle::{demangle, Form};
use dwarf::{Dwarf, DwarfFrame};

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
    /// As the symbol table spells it.
    name: String,
    /// A PLT stub calling `name`.
    plt: bool,
}

impl Symbol {
    /// The name as gdb prints a symbol table's: in full.
    fn function(&self) -> FunctionName {
        let suffix = if self.plt { "@plt" } else { "" };
        FunctionName {
            name: format!("{}{suffix}", demangle(&self.name, Form::Full)),
            system_name: format!("{}{suffix}", self.name),
            file: None,
            line: None,
        }
    }
}

/// A function as a frame shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionName {
    /// As gdb prints it: demangled, without parameters where gdb has the
    /// function from debug information.
    pub name: String,
    /// As the file spells it (mangled): pprof's system name.
    pub system_name: String,
    /// The source file of the address in this function (for a function
    /// others are inlined into, of the call to the inlined one).
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// What an address is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbolized {
    /// The function whose code holds the address.
    pub function: FunctionName,
    /// From the start of the symbol table's function holding it (`None`
    /// where only the DWARF names the function).
    pub offset: Option<u64>,
    /// The functions inlined at the address, innermost first (gdb's inline
    /// frames, above the function's own).
    pub inlined: Vec<FunctionName>,
}

/// What a file says about its addresses.
#[derive(Debug, Default)]
pub struct FileSymbols {
    /// Sorted by start.
    symbols: Vec<Symbol>,
    segments: Vec<Segment>,
    dwarf: Option<Dwarf>,
}

impl FileSymbols {
    /// Parses an ELF image alone.
    pub fn parse(path: &str, data: &[u8]) -> Result<Self, SymbolsError> {
        Self::parse_with_debug(path, data, None)
    }

    /// Parses an ELF image and its separate debug file (whose symbols and
    /// DWARF are used when it has them).
    pub fn parse_with_debug(
        path: &str,
        data: &[u8],
        debug: Option<&[u8]>,
    ) -> Result<Self, SymbolsError> {
        let not_elf = |e: object::Error| SymbolsError::NotElf {
            path: path.into(),
            message: e.to_string(),
        };
        let elf = ElfFile64::<LittleEndian>::parse(data).map_err(not_elf)?;
        let debug = match debug.map(ElfFile64::<LittleEndian>::parse) {
            Some(Ok(d)) => Some(d),
            Some(Err(e)) => {
                tracing::debug!(path, "debug file not used: {e}");
                None
            }
            None => None,
        };
        // The host's segment reader: the same bias for the same mapping.
        let segments = segments::load_segments_of(data);
        let stubs = plt::stubs(&elf, MAX_SYMBOLS).into_iter().map(|s| Symbol {
            start: s.start,
            size: s.size,
            name: s.name,
            plt: true,
        });
        let tables = [Some(&elf), debug.as_ref()];
        let mut symbols: Vec<Symbol> = stubs
            .chain(tables.into_iter().flatten().flat_map(|f| {
                f.symbols()
                    .chain(f.dynamic_symbols())
                    .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
                    .filter_map(|s| {
                        Some(Symbol {
                            start: s.address(),
                            size: s.size(),
                            name: s.name().ok()?.to_owned(),
                            plt: false,
                        })
                    })
            }))
            .take(MAX_SYMBOLS)
            .collect();
        // The same function in several tables: keep one (the sized one first).
        symbols.sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
        symbols.dedup_by(|b, a| a.start == b.start);
        // The debug file's DWARF, else the file's own.
        let dwarf = [debug.as_ref(), Some(&elf)]
            .into_iter()
            .flatten()
            .find_map(|f| match Dwarf::load(f) {
                Ok(d) => d,
                Err(e) => {
                    tracing::debug!(path, "DWARF not used: {e}");
                    None
                }
            });
        Ok(Self {
            symbols,
            segments,
            dwarf,
        })
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

    /// The symbol table's function containing ELF address `address`, and
    /// the offset in it.
    fn symbol_at(&self, address: u64) -> Option<(&Symbol, u64)> {
        let i = self.symbols.partition_point(|s| s.start <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        let offset = address - s.start;
        (s.size == 0 || offset < s.size).then_some((s, offset))
    }

    /// The function at ELF address `address` (of a return address: the
    /// address before it), named from the DWARF where it describes the
    /// address, else from the symbol tables.
    pub fn symbolize(&self, address: u64) -> Option<Symbolized> {
        let symbol = self.symbol_at(address);
        let frames = match (&self.dwarf, symbol) {
            (_, Some((s, _))) if s.plt => Vec::new(),
            (Some(dwarf), _) => dwarf.frames(address),
            (None, _) => Vec::new(),
        };
        let offset = symbol.map(|(_, offset)| offset);
        if let Some((outer, inner)) = frames.split_last() {
            if let Some(function) = dwarf_function(outer, Form::Function) {
                return Some(Symbolized {
                    function,
                    offset,
                    inlined: inner
                        .iter()
                        .map(|f| {
                            dwarf_function(f, Form::Inlined).unwrap_or_else(|| FunctionName {
                                name: "??".into(),
                                system_name: String::new(),
                                file: f.file.clone(),
                                line: f.line,
                            })
                        })
                        .collect(),
                });
            }
        }
        let (symbol, offset) = symbol?;
        Some(Symbolized {
            function: symbol.function(),
            offset: Some(offset),
            inlined: Vec::new(),
        })
    }
}

fn dwarf_function(frame: &DwarfFrame, form: Form) -> Option<FunctionName> {
    let raw = frame.raw_name.as_deref()?;
    Some(FunctionName {
        name: demangle(raw, form),
        system_name: raw.to_owned(),
        file: frame.file.clone(),
        line: frame.line,
    })
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
    let owner = opened
        .file
        .metadata()
        .map_err(|e| SymbolsError::Read {
            path: path.clone(),
            message: e.to_string(),
        })?
        .uid();
    let root = format!("/proc/{pid}/root");
    let debug = debug_file::find(
        Path::new(&root),
        &mapping.path,
        owner,
        &data,
        MAX_FILE_BYTES,
    );
    FileSymbols::parse_with_debug(&path, &data, debug.as_deref())
}
