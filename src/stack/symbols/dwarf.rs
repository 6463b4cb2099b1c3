//! Source lines and inlined functions from a file's DWARF, by `addr2line`
//! over sections eim read itself (the file's own, or its debug file's):
//! no file is mapped or opened here.
//!
//! Sections are copied (a compressed one decompressed) into memory eim
//! owns, at most [`MAX_DWARF_BYTES`] in all, its declared size checked
//! before any decompression; `addr2line` parses units on demand.

use std::sync::{Arc, Mutex};

use gimli::{EndianArcSlice, RunTimeEndian, SectionId};
use object::read::elf::ElfFile64;
use object::{LittleEndian, Object as _, ObjectSection as _};

/// The DWARF kept per file, decompressed, all sections together.
pub const MAX_DWARF_BYTES: u64 = 256 << 20;
/// Frames reported for one address (inlined ones and the function).
const MAX_FRAMES: usize = 64;

type Reader = EndianArcSlice<RunTimeEndian>;

/// One function at an address, innermost first: the inlined ones, then
/// the function whose code it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DwarfFrame {
    /// The linkage name if the DWARF has one, else its name.
    pub raw_name: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// Why a file's DWARF is not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DwarfError {
    #[error("{section}: {size} bytes decompressed, more than the {MAX_DWARF_BYTES} kept")]
    TooLarge { section: &'static str, size: u64 },
    #[error("{section}: {message}")]
    Section {
        section: &'static str,
        message: String,
    },
    #[error("DWARF: {0}")]
    Parse(String),
}

/// A file's DWARF, ready for lookups (behind a lock: `addr2line` caches
/// what it parses in cells that are not `Sync`).
pub struct Dwarf {
    context: Mutex<addr2line::Context<Reader>>,
}

impl std::fmt::Debug for Dwarf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dwarf")
    }
}

impl Dwarf {
    /// The DWARF of `elf`; `Ok(None)` if it has no `.debug_info`.
    pub fn load(elf: &ElfFile64<'_, LittleEndian>) -> Result<Option<Self>, DwarfError> {
        if elf.section_by_name(".debug_info").is_none() {
            return Ok(None);
        }
        let mut kept = 0u64;
        let dwarf = gimli::Dwarf::load(|id| section(elf, id, &mut kept))?;
        let context =
            addr2line::Context::from_dwarf(dwarf).map_err(|e| DwarfError::Parse(e.to_string()))?;
        Ok(Some(Self {
            context: Mutex::new(context),
        }))
    }

    /// The functions at ELF address `probe`, innermost first; empty where
    /// the DWARF describes no function there.
    pub fn frames(&self, probe: u64) -> Vec<DwarfFrame> {
        let context = self.context.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let Ok(mut frames) = context.find_frames(probe).skip_all_loads() else {
            return out;
        };
        while out.len() < MAX_FRAMES {
            let Ok(Some(frame)) = frames.next() else {
                break;
            };
            let raw_name = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok())
                .map(|n| n.into_owned());
            let (file, line) = frame
                .location
                .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
            out.push(DwarfFrame {
                raw_name,
                file,
                line,
            });
        }
        // A unit that covers the address but names no function there
        // (assembly with line info only): no function to name.
        if out.iter().all(|f| f.raw_name.is_none()) {
            out.clear();
        }
        out
    }
}

/// Section `id` of `elf`, decompressed into memory of its own; empty if
/// the file has no such section.
fn section(
    elf: &ElfFile64<'_, LittleEndian>,
    id: SectionId,
    kept: &mut u64,
) -> Result<Reader, DwarfError> {
    let endian = RunTimeEndian::Little;
    let Some(section) = elf.section_by_name(id.name()) else {
        return Ok(EndianArcSlice::new(Arc::from(&[][..]), endian));
    };
    let name = id.name();
    let compressed = section.compressed_data().map_err(|e| DwarfError::Section {
        section: name,
        message: e.to_string(),
    })?;
    *kept = kept.saturating_add(compressed.uncompressed_size);
    if *kept > MAX_DWARF_BYTES {
        return Err(DwarfError::TooLarge {
            section: name,
            size: *kept,
        });
    }
    let data = compressed.decompress().map_err(|e| DwarfError::Section {
        section: name,
        message: e.to_string(),
    })?;
    Ok(EndianArcSlice::new(Arc::from(&*data), endian))
}
