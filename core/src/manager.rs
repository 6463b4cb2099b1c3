//! [`ExecutableInfoManager`]: the thread-safe facade over the machine.
//!
//! Locks, in the only order they are ever taken:
//! 1. one shard of the file table (files whose id hashes to it, and the
//!    extractions in flight for them);
//! 2. the kernel side (the book and the backend);
//! 3. the deferred set (a leaf: nothing is locked while holding it).
//!
//! The per-process fast path (a reference on a known file, or its release
//! while others remain) takes one shard lock and nothing else, so threads
//! working on different files do not contend. Extraction runs with no lock
//! held, and only one thread extracts a given file at a time: the others
//! wait for its result and share it.

mod batch;
mod clock;
mod config;
mod kernel;
mod restart;
mod shard;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::Config;
pub use restart::{RestartRefused, RestartReport};

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::Error;
use crate::info::ExecutableInfo;
use crate::metrics::{self, Summary};
use crate::provider::Provider;
use crate::sync::{lock, Arc, AtomicU64, Mutex};
use crate::tracers::{self, Tracers};
use eim_machine::deltas::IntervalData;
use eim_machine::machine::{Deferred, FileEntry, KernelBook, Release, ReleaseError, Timestamp};
use eim_machine::ops::{Backend, Errno, MapKind, MapOp, OpFailure};
use eim_machine::FileId;
use kernel::KernelSide;
use shard::{shard_index, Flight, FlightGuard, Padded, Shard};

/// The outcome of one [`ExecutableInfoManager::cleanup_unused`] pass.
#[derive(Debug, Default)]
pub struct CleanupReport {
    pub unloaded: usize,
    /// Files whose kernel entries could not all be removed yet (they are
    /// retried later; the files are gone from the manager regardless).
    pub errors: Vec<Error>,
}

/// A consistent copy of the whole state, for checkers and tests.
#[derive(Clone, Debug)]
pub struct StateView {
    pub files: BTreeMap<FileId, FileEntry<ExecutableInfo>>,
    pub book: KernelBook,
    pub in_flight: usize,
}

/// Per-executable unwind data shared by every process that maps the file.
pub struct ExecutableInfoManager<P: Provider, B: Backend> {
    provider: P,
    shards: Box<[Padded<Mutex<Shard>>]>,
    kernel: Mutex<KernelSide<B>>,
    deferred: Mutex<Deferred>,
    clock: Box<dyn Clock>,
    tracers: Tracers,
    batch_bytes: usize,
    extracted: AtomicU64,
    extraction_errors: AtomicU64,
}

impl<P: Provider, B: Backend> ExecutableInfoManager<P, B> {
    /// A manager with upstream's defaults and a monotonic clock.
    pub fn new(provider: P, backend: B, tracers: Tracers) -> Self {
        Self::with_config(
            provider,
            backend,
            tracers,
            Config::default(),
            Box::new(MonotonicClock::default()),
        )
    }

    pub fn with_config(
        provider: P,
        backend: B,
        tracers: Tracers,
        config: Config,
        clock: Box<dyn Clock>,
    ) -> Self {
        let shards = config.shards.max(1).next_power_of_two();
        Self {
            provider,
            shards: (0..shards)
                .map(|_| Padded(Mutex::new(Shard::default())))
                .collect(),
            kernel: Mutex::new(KernelSide {
                book: KernelBook::with_slot_grace(config.capacities, config.slot_grace),
                backend,
            }),
            deferred: Mutex::new(Deferred::new(config.deferred_capacity, config.deferred_ttl)),
            clock,
            tracers,
            batch_bytes: config.batch_bytes.max(1),
            extracted: AtomicU64::new(0),
            extraction_errors: AtomicU64::new(0),
        }
    }

    /// How long until every cooling `unwind_info_array` slot may take a new
    /// rule (`None` when none is cooling). After a warm restart every slot
    /// no kept table uses cools for one grace; a one-shot caller waits this
    /// long before loading files that need new rules.
    pub fn slots_cooling_for(&self) -> Option<Duration> {
        let now = self.clock.now();
        let last = lock(&self.kernel)
            .book
            .slots()
            .cooling()
            .map(|(_, at)| at)
            .max()?;
        (last > now).then(|| last.0.saturating_sub(now.0))
    }

    /// The provider and the backend, for a caller that ends this manager
    /// and starts another over the same maps ([`Self::restart`]).
    pub fn into_parts(self) -> (P, B) {
        let kernel = self.kernel.into_inner().unwrap_or_else(|e| e.into_inner());
        (self.provider, kernel.backend)
    }

    /// The backend, for a caller that ends this manager (the simulator's
    /// restarts hand the maps to the next one).
    pub fn into_backend(self) -> B {
        let kernel = self.kernel.into_inner().unwrap_or_else(|e| e.into_inner());
        kernel.backend
    }

    fn shard(&self, id: FileId) -> &Mutex<Shard> {
        &self.shards[self.shard_of(id)].0
    }

    /// The shard that holds `id` (files in different shards never contend).
    pub fn shard_of(&self, id: FileId) -> usize {
        shard_index(id, self.shards.len())
    }

    fn defer(&self, file_id: FileId) {
        let now = self.clock.now();
        lock(&self.deferred).insert(file_id, now);
    }

    /// Defers a file whose load failed with `e`. A pending cleanup is not
    /// deferred (the next attempt after the retry may succeed). A full
    /// `unwind_info_array` whose slots are cooling is deferred only until
    /// the first of them may take a rule again: after a warm restart every
    /// slot cools for one grace (`docs/ARCHITECTURE.md`, "Warm restart:
    /// reconcile"), and a file needing a new rule then must not wait the
    /// whole deferral timeout.
    fn defer_load_failure(&self, e: &Error) {
        match e {
            Error::CleanupPending { .. } => {}
            Error::MapFull {
                file_id,
                map: MapKind::UnwindInfo,
                ..
            } => {
                let now = self.clock.now();
                let reusable = lock(&self.kernel)
                    .book
                    .slots()
                    .cooling()
                    .next()
                    .map(|(_, at)| at);
                let mut deferred = lock(&self.deferred);
                match reusable {
                    Some(at) if at > now => deferred.insert_until(*file_id, now, at),
                    _ => deferred.insert(*file_id, now),
                }
            }
            e => self.defer(e.file_id()),
        }
    }

    /// Takes a reference on `file_id`, loading its unwind data into the
    /// kernel maps first if it is new. Returns a copy of its info.
    pub fn add_or_inc_ref(&self, file_id: FileId, elf: &P::Elf) -> Result<ExecutableInfo, Error> {
        let flight = {
            let mut shard = lock(self.shard(file_id));
            if let Some(info) = shard.files.inc_ref(file_id) {
                return Ok(info);
            }
            if let Some((flight, waiters)) = shard.flights.get_mut(&file_id) {
                *waiters += 1;
                let flight = flight.clone();
                drop(shard);
                return flight.wait();
            }
            if lock(&self.deferred).contains(file_id, self.clock.now()) {
                return Err(Error::Deferred { file_id });
            }
            let flight = Arc::new(Flight::new());
            shard.flights.insert(file_id, (flight.clone(), 0));
            flight
        };
        let mut guard = FlightGuard {
            shard: self.shard(file_id),
            file_id,
            flight,
            landed: false,
        };
        let result = self.extract_and_load(file_id, elf);
        guard.land(result)
    }

    fn extract_and_load(&self, file_id: FileId, elf: &P::Elf) -> Result<ExecutableInfo, Error> {
        let extraction = match self.provider.extract_for(file_id, elf, self.tracers) {
            Ok(extraction) => {
                self.extracted.fetch_add(1, Ordering::Relaxed);
                extraction
            }
            Err(source) => {
                // A file that vanished is not deferred: its next mapping is a new chance.
                if !source.is_not_found() {
                    if !source.is_changed() {
                        self.extraction_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    self.defer(file_id);
                }
                return Err(Error::Extraction {
                    file_id,
                    cause: source,
                });
            }
        };
        let offsets = tracers::offsets_of(&extraction.interpreters);
        let loaded = lock(&self.kernel).load_with(&*self.clock, file_id, &extraction.data, offsets);
        match loaded {
            Ok(_) => Ok(ExecutableInfo {
                interpreters: std::sync::Arc::from(extraction.interpreters),
                libc: extraction.libc,
            }),
            Err(e) => {
                self.defer_load_failure(&e);
                Err(e)
            }
        }
    }

    /// Loads unwind data that was not extracted from a file (the arm64 vDSO).
    /// Fails if the file is known or being loaded.
    pub fn add_synth_interval_data(
        &self,
        file_id: FileId,
        data: &IntervalData,
    ) -> Result<(), Error> {
        let mut shard = lock(self.shard(file_id));
        if shard.files.get(file_id).is_some() || shard.flights.contains_key(&file_id) {
            return Err(Error::AlreadyLoaded { file_id });
        }
        lock(&self.kernel).load_with(&*self.clock, file_id, data, None)?;
        shard.files.insert(file_id, ExecutableInfo::default(), 1);
        Ok(())
    }

    /// Releases a reference; the last one unloads the file's tables. An
    /// `UnloadIncomplete` error still releases the reference: the entries
    /// left in the kernel are recorded and removed by a later retry.
    pub fn remove_or_dec_ref(&self, file_id: FileId) -> Result<(), Error> {
        let mut shard = lock(self.shard(file_id));
        match shard.files.release(file_id, None) {
            Ok(Release::Held { .. }) | Ok(Release::Unused) => Ok(()),
            Ok(Release::Last(_entry)) => lock(&self.kernel).unload(&*self.clock, file_id),
            Err(e) => Err(release_error(file_id, e)),
        }
    }

    /// Releases a reference without unloading: a file whose count reaches
    /// zero stays loaded until [`Self::cleanup_unused`] finds it old enough
    /// (newer upstream's `DecRef`).
    pub fn dec_ref(&self, file_id: FileId) -> Result<(), Error> {
        let now = self.clock.now();
        let mut shard = lock(self.shard(file_id));
        match shard.files.release(file_id, Some(now)) {
            Ok(_) => Ok(()),
            Err(e) => Err(release_error(file_id, e)),
        }
    }

    /// Unloads every file unused for at least `age`. One file's failure does
    /// not stop the others.
    pub fn cleanup_unused(&self, age: Duration) -> CleanupReport {
        let mut report = CleanupReport::default();
        // Before `age` has passed since the epoch nothing can be old enough.
        let Some(cutoff) = self.clock.now().0.checked_sub(age).map(Timestamp) else {
            return report;
        };
        for shard in self.shards.iter() {
            let mut shard = lock(&shard.0);
            let unused = shard.files.take_unused(cutoff);
            if unused.is_empty() {
                continue;
            }
            let mut kernel = lock(&self.kernel);
            for (file_id, _entry) in unused {
                report.unloaded += 1;
                if let Err(e) = kernel.unload(&*self.clock, file_id) {
                    report.errors.push(e);
                }
            }
        }
        report
    }

    /// Retries the removal of entries earlier unloads could not remove.
    /// Returns the number of ops still pending.
    pub fn retry_leftovers(&self) -> usize {
        let mut kernel = lock(&self.kernel);
        kernel.retry_leftovers(&*self.clock);
        kernel.book.leftover_ops()
    }

    /// Sets upstream's five metrics. The provider counters are reset by the read.
    pub fn update_metric_summary(&self, summary: &mut Summary) {
        {
            let kernel = lock(&self.kernel);
            let book = &kernel.book;
            summary.insert(
                metrics::NUM_EXE_ID_LOADED_TO_EBPF,
                book.loaded().len() as u64,
            );
            // Slots some kernel table references; cooling slots are a
            // cache of old rules, reusable, so not counted.
            summary.insert(metrics::UNWIND_INFO_ARRAY_SIZE, book.slots().live() as u64);
            summary.insert(metrics::HASHMAP_NUM_STACK_DELTA_PAGES, book.pages_in_use());
        }
        summary.insert(
            metrics::STACK_DELTA_PROVIDER_SUCCESS,
            self.extracted.swap(0, Ordering::Relaxed),
        );
        summary.insert(
            metrics::STACK_DELTA_PROVIDER_EXTRACTION_ERROR,
            self.extraction_errors.swap(0, Ordering::Relaxed),
        );
    }

    /// A consistent copy of the state (all locks taken in order).
    pub fn state(&self) -> StateView {
        let shards: Vec<_> = self.shards.iter().map(|s| lock(&s.0)).collect();
        let kernel = lock(&self.kernel);
        let mut files = BTreeMap::new();
        let mut in_flight = 0;
        for shard in &shards {
            files.extend(shard.files.iter().map(|(id, e)| (*id, e.clone())));
            in_flight += shard.flights.len();
        }
        StateView {
            files,
            book: kernel.book.clone(),
            in_flight,
        }
    }

    /// Runs `f` on the backend, with the kernel side locked.
    pub fn with_backend<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        f(&mut lock(&self.kernel).backend)
    }

    /// Whether `file_id` is deferred now.
    pub fn is_deferred(&self, file_id: FileId) -> bool {
        let now = self.clock.now();
        lock(&self.deferred).contains(file_id, now)
    }

    /// Forgets `file_id`'s deferral: its failure was another file's (one
    /// that presented the same id and lost it), so it is tried again.
    pub fn forgive(&self, file_id: FileId) {
        lock(&self.deferred).remove(file_id);
    }

    /// Whether the manager holds `file_id` (loaded, whether referenced or
    /// waiting out a delayed unload).
    pub fn knows(&self, file_id: FileId) -> bool {
        lock(self.shard(file_id)).files.get(file_id).is_some()
    }

    /// Unloads `file_id` now if no reference holds it (a delayed unload
    /// not yet due): its tables must go before another file's are loaded
    /// under its id. True if it was unloaded. The unload is the usual plan
    /// (pages first, then the table), so readers never see half of it.
    pub fn unload_if_unused(&self, file_id: FileId) -> Result<bool, Error> {
        let mut shard = lock(self.shard(file_id));
        if shard.files.take_if_unused(file_id).is_none() {
            return Ok(false);
        }
        lock(&self.kernel).unload(&*self.clock, file_id)?;
        Ok(true)
    }

    /// Writes one `eim_process_mappings` op (the host's) through the
    /// driver, under the kernel lock, so that the driver's rule holds for
    /// it too: a delete that finds its entry gone is no failure. Any other
    /// op is refused with `EINVAL` before the backend sees it: those maps
    /// belong to the book, which must plan every write to them.
    pub fn apply_process_op(&self, op: &MapOp) -> Result<(), OpFailure> {
        if !matches!(
            op,
            MapOp::PutProcessMappings { .. } | MapOp::DeleteProcessMappings { .. }
        ) {
            return Err(OpFailure::new(Errno::EINVAL, 0));
        }
        eim_machine::driver::apply_one(&mut lock(&self.kernel).backend, op)
    }
}

fn release_error(file_id: FileId, e: ReleaseError) -> Error {
    match e {
        ReleaseError::Unknown => Error::Unknown { file_id },
        ReleaseError::NoReference => Error::NoReference { file_id },
    }
}
