//! The interpreter loaders over real files: the glue between an opened ELF
//! file and `eim_analysis::interp` (which does the work and no I/O), and
//! [`inspect`] for `eim inspect` / `eim loaders`.

use std::path::Path;

use eim_core::provider::{ExtractError, Provider};
use eim_core::tracers::LoaderMatch;
use eim_core::Tracers;

// Asking the loaders is part of extraction; this module re-offers it.
pub use crate::files::elf_provider::detect;
use crate::{ElfFileRef, ElfProvider};

pub use eim_analysis::interp::{InterpreterOffsets, Loaded, LoaderError};

/// Every tracer: what [`inspect`] asks.
pub const ALL_TRACERS: Tracers = Tracers(u32::MAX);

/// What every loader says about the file at `path`: its stack deltas are
/// extracted first (V8 needs their gaps), then every loader is asked.
pub fn inspect(path: impl AsRef<Path>) -> Result<Vec<LoaderMatch>, ExtractError> {
    let file = ElfFileRef::new(path.as_ref());
    let file_id = file.file_id()?.host();
    let extraction = ElfProvider::new().extract_for(file_id, &file, ALL_TRACERS)?;
    Ok(extraction.interpreters)
}
