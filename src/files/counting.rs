//! Instruments around the manager's provider and backend: how often each
//! file is extracted and how long extraction takes, and how long the
//! kernel (or the simulated kernel) takes to apply the map ops.
//!
//! The counts are what shows that a file is extracted once however many
//! processes map it, and however often short-lived processes come and go.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use eim_analysis::elf::digest::SourceDigest;
use eim_analysis::elf::fileid::FileId128;
use eim_core::provider::{ExtractError, Extraction, Provider};
use eim_core::Tracers;
use eim_machine::ops::{Backend, MapOp, OpFailure};
use eim_machine::FileId;

use crate::{ElfFileRef, ElfProvider};

/// A file of the host, as handed to the manager: its id and its reference,
/// and, once extracted, the digest of what the extraction read (the host
/// checks other files with the same id against it: `host::claims`).
#[derive(Debug)]
pub struct HostFile {
    pub id: FileId128,
    pub elf: ElfFileRef,
    /// Shared, so that whoever handed the reference to the manager can
    /// read the digest after the manager has consumed it (a warm restart).
    pub source: Arc<OnceLock<Option<Arc<SourceDigest>>>>,
}

impl HostFile {
    pub fn new(id: FileId128, elf: ElfFileRef) -> Self {
        Self {
            id,
            elf,
            source: Arc::default(),
        }
    }

    /// The digest of the successful extraction of this reference, if it
    /// ran and could have one.
    pub fn source(&self) -> Option<Arc<SourceDigest>> {
        self.source.get().cloned().flatten()
    }
}

/// Extraction counts and times, shared between the provider and its owner.
#[derive(Debug, Default)]
pub struct ExtractionStats {
    nanos: AtomicU64,
    /// Of `nanos`, the interpreter loaders' part.
    loaders_nanos: Arc<AtomicU64>,
    per_file: Mutex<HashMap<FileId, FileExtractions>>,
}

/// What extraction did for one file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileExtractions {
    /// Calls of the extraction (successful or not).
    pub attempts: u32,
    /// Deltas of the last successful extraction.
    pub deltas: Option<usize>,
}

impl ExtractionStats {
    /// Time spent extracting, all files together (the loaders included).
    pub fn time(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Of [`Self::time`], the time the interpreter loaders took.
    pub fn loaders_time(&self) -> Duration {
        Duration::from_nanos(self.loaders_nanos.load(Ordering::Relaxed))
    }

    /// The counts of one file.
    pub fn of(&self, id: FileId) -> FileExtractions {
        self.lock().get(&id).copied().unwrap_or_default()
    }

    /// Extraction calls, all files together.
    pub fn attempts(&self) -> u64 {
        self.lock().values().map(|f| u64::from(f.attempts)).sum()
    }

    /// Files extracted at least once.
    pub fn files(&self) -> usize {
        self.lock().len()
    }

    /// The most extractions of any one file.
    pub fn most_of_one_file(&self) -> u32 {
        self.lock().values().map(|f| f.attempts).max().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileId, FileExtractions>> {
        self.per_file.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// [`ElfProvider`] over [`HostFile`]s, counting every extraction.
#[derive(Debug)]
pub struct CountingProvider {
    inner: ElfProvider,
    stats: Arc<ExtractionStats>,
}

impl CountingProvider {
    pub fn new(inner: ElfProvider) -> Self {
        let stats = Arc::new(ExtractionStats {
            loaders_nanos: inner.loaders_nanos(),
            ..ExtractionStats::default()
        });
        Self { inner, stats }
    }

    pub fn stats(&self) -> Arc<ExtractionStats> {
        self.stats.clone()
    }
}

impl Provider for CountingProvider {
    type Elf = HostFile;

    fn extract(&self, file: &HostFile) -> Result<Extraction, ExtractError> {
        self.measured(file, || self.inner.extract(&file.elf))
    }

    fn extract_for(
        &self,
        file_id: FileId,
        file: &HostFile,
        tracers: Tracers,
    ) -> Result<Extraction, ExtractError> {
        self.measured(file, || {
            let digested = self.inner.extract_digested(file_id, &file.elf, tracers)?;
            // The first extraction of this reference is the one loaded.
            let _ = file.source.set(digested.source);
            Ok(digested.extraction)
        })
    }
}

impl CountingProvider {
    /// Runs one extraction of `file`, counting it and its time.
    fn measured(
        &self,
        file: &HostFile,
        extract: impl FnOnce() -> Result<Extraction, ExtractError>,
    ) -> Result<Extraction, ExtractError> {
        let started = Instant::now();
        let result = extract();
        // The bytes read are not needed once the deltas are out.
        file.elf.close();
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.nanos.fetch_add(nanos, Ordering::Relaxed);
        let mut per_file = self.stats.lock();
        let entry = per_file.entry(file.id.host()).or_default();
        entry.attempts = entry.attempts.saturating_add(1);
        if let Ok(extraction) = &result {
            entry.deltas = Some(extraction.data.len());
        }
        result
    }
}

/// A backend that measures the time its ops take.
#[derive(Debug)]
pub struct Timed<B> {
    pub inner: B,
    spent: Duration,
    ops: u64,
}

impl<B> Timed<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            spent: Duration::ZERO,
            ops: 0,
        }
    }

    /// Time spent in the backend's ops so far.
    pub fn spent(&self) -> Duration {
        self.spent
    }

    /// Ops applied (each is one or a few syscalls on the real kernel).
    pub fn ops(&self) -> u64 {
        self.ops
    }
}

impl<B: Backend> Backend for Timed<B> {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        let started = Instant::now();
        let result = self.inner.apply(op);
        self.spent += started.elapsed();
        self.ops += 1;
        result
    }
    fn begin_writes(&mut self) {
        self.inner.begin_writes()
    }
    fn end_writes(&mut self) {
        self.inner.end_writes()
    }
}
