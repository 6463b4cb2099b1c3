//! Where interval data comes from: the stack-delta provider trait, and an
//! in-memory provider for tests and demonstrations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::tracers::{LoaderMatch, Tracers};
use eim_analysis::tsd::LibcInfo;
use eim_machine::deltas::IntervalData;
use eim_machine::FileId;

// The kind belongs to extraction (the ELF side sets it); a provider's
// error carries it, so it is reachable from here too.
pub use eim_analysis::elf::extract::ExtractErrorKind;

/// What extraction yields for one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extraction {
    pub data: IntervalData,
    /// The C-library layouts, for a file named like a C library.
    pub libc: LibcInfo,
    /// What every enabled interpreter loader that recognised the file said.
    pub interpreters: Vec<LoaderMatch>,
}

/// An extraction failure, naming the file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ExtractError {
    pub kind: ExtractErrorKind,
    pub path: String,
    pub message: String,
}

impl ExtractError {
    pub fn new(
        kind: ExtractErrorKind,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ExtractErrorKind::NotFound
    }

    /// Whether the file changed while it was read: not a failed
    /// extraction (`StackDeltaProviderExtractionError` leaves it out).
    pub fn is_changed(&self) -> bool {
        self.kind == ExtractErrorKind::Changed
    }
}

/// Turns a file reference into its interval data. Called without any lock
/// of the manager held, at most once at a time per file id.
pub trait Provider: Send + Sync {
    /// The reference to the file that callers pass in (upstream's `elfRef`).
    type Elf: ?Sized + Sync;

    fn extract(&self, elf: &Self::Elf) -> Result<Extraction, ExtractError>;

    /// Extraction for the manager: also asks the interpreter loaders that
    /// `tracers` enables about the file (the manager passes its own set).
    /// A provider without loaders extracts as [`Provider::extract`] does.
    fn extract_for(
        &self,
        file_id: FileId,
        elf: &Self::Elf,
        tracers: Tracers,
    ) -> Result<Extraction, ExtractError> {
        let _ = (file_id, tracers);
        self.extract(elf)
    }
}

impl<T: Provider + ?Sized> Provider for std::sync::Arc<T> {
    type Elf = T::Elf;

    fn extract(&self, elf: &T::Elf) -> Result<Extraction, ExtractError> {
        (**self).extract(elf)
    }

    fn extract_for(
        &self,
        file_id: FileId,
        elf: &T::Elf,
        tracers: Tracers,
    ) -> Result<Extraction, ExtractError> {
        (**self).extract_for(file_id, elf, tracers)
    }
}

/// A provider serving prepared results by file id; counts its extractions.
#[derive(Debug, Default)]
pub struct MemoryProvider {
    files: Mutex<HashMap<FileId, Result<Extraction, ExtractError>>>,
    extractions: AtomicU64,
}

impl MemoryProvider {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&self, id: FileId, data: IntervalData) {
        self.set(
            id,
            Ok(Extraction {
                data,
                ..Extraction::default()
            }),
        );
    }

    pub fn set(&self, id: FileId, result: Result<Extraction, ExtractError>) {
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, result);
    }

    /// Extractions performed so far.
    pub fn extractions(&self) -> u64 {
        self.extractions.load(Ordering::Relaxed)
    }
}

impl Provider for MemoryProvider {
    type Elf = FileId;

    fn extract(&self, id: &FileId) -> Result<Extraction, ExtractError> {
        self.extractions.fetch_add(1, Ordering::Relaxed);
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .unwrap_or_else(|| {
                Err(ExtractError::new(
                    ExtractErrorKind::NotFound,
                    id.to_string(),
                    "no such file",
                ))
            })
    }
}
