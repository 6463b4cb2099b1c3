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

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::info::ExecutableInfo;
use crate::metrics::{self, Summary};
use crate::provider::{ExtractError, Extraction, Provider};
use crate::sync::{lock, Arc, Condvar, Mutex};
use crate::tracers::{self, Tracers};
use eim_machine::abi::OffsetRange;
use eim_machine::deltas::IntervalData;
use eim_machine::driver::execute;
use eim_machine::machine::{
    deferred, reconcile, Capacities, Deferred, FileEntry, FileTable, KernelBook, MapRef, Observed,
    PlanError, ReconcileError, Release, ReleaseError, Timestamp, Wanted,
};
use eim_machine::ops::{Backend, Errno, MapKind, MapOp, OpFailure};
use eim_machine::FileId;

/// The source of "now" for deferral and delayed unloading.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// Monotonic time since the clock was made.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.elapsed())
    }
}

/// A clock that moves only when told to (tests, simulation).
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicU64);

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(Duration::from_nanos(self.0.load(Ordering::SeqCst)))
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// Tunables, with upstream's defaults.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub capacities: Capacities,
    pub deferred_capacity: usize,
    pub deferred_ttl: Duration,
    /// Shards of the file table (rounded up to a power of two).
    pub shards: usize,
    /// How long an `unwind_info_array` slot no table references any more
    /// keeps its rule before another rule may be written to it (see
    /// [`eim_machine::machine::slots::DEFAULT_SLOT_GRACE`] for why this is safe).
    pub slot_grace: Duration,
    /// How many bytes of extracted stack deltas a [`ExecutableInfoManager::load_many`]
    /// holds before it publishes them: the batch is written to the kernel
    /// in parts that end with the file whose deltas reach this size, so
    /// its peak memory follows this bound (plus one file), not the
    /// batch's file count.
    pub batch_bytes: usize,
}

/// The default [`Config::batch_bytes`]: a host's first step holds at most
/// three parts of this many bytes of deltas (one extracted, one queued,
/// one published), and each part costs one outer-map publication (an RCU
/// wait) per size class it uses; measured on a 2,657-file host
/// (docs/BENCHMARKS.md), 64 MiB kept the peak under 256 MB and the scan
/// under 3 s, where 32 MiB cost 1 s more in RCU waits and 128 MiB went
/// over the peak. Those were 64 MiB of 24-byte deltas; packed
/// ([`IntervalData`] holds 8 bytes a delta) the same 2.8 million deltas a
/// part take a third of that.
pub const DEFAULT_BATCH_BYTES: usize = (64 << 20) / 3;

/// The stack of the extractor thread of [`ExecutableInfoManager::load_many`]:
/// twice std's default, for the file provider's code (loaders included),
/// which otherwise runs on the caller's thread; sized here rather than by
/// `RUST_MIN_STACK`, so that an address-space limit sees a known figure.
const EXTRACTOR_STACK_BYTES: usize = 4 << 20;

impl Default for Config {
    fn default() -> Self {
        Self {
            capacities: Capacities::default(),
            deferred_capacity: deferred::DEFAULT_CAPACITY,
            deferred_ttl: deferred::DEFAULT_TTL,
            shards: 64,
            slot_grace: eim_machine::machine::slots::DEFAULT_SLOT_GRACE,
            batch_bytes: DEFAULT_BATCH_BYTES,
        }
    }
}

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

/// What a warm restart ([`ExecutableInfoManager::restart`]) did.
#[derive(Debug, Default)]
pub struct RestartReport {
    /// Files whose kernel entries were kept as they were.
    pub adopted: Vec<FileId>,
    /// Files loaded again (their entries were missing or not trusted).
    pub loaded: Vec<FileId>,
    /// Files held by the caller that are not known after the restart (their
    /// extraction or their load failed): their references are gone.
    pub failed: Vec<(FileId, Error)>,
    /// Removal ops the reconcile planned (entries of files not mapped any
    /// more, or not right).
    pub removals: usize,
    /// Leftover ops still pending when the restart returns (removals that
    /// failed, and what failed loads could not undo); retried like any
    /// leftover.
    pub removals_pending: usize,
}

/// A warm restart the reconcile refused ([`ExecutableInfoManager::restart`]):
/// why, and the parts it was given, so that the caller can clean the maps
/// and start a manager afresh.
pub struct RestartRefused<P, B> {
    pub error: ReconcileError,
    pub provider: P,
    pub backend: B,
}

impl<P, B> std::fmt::Debug for RestartRefused<P, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestartRefused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// One extraction in progress; callers for the same file wait on it.
struct Flight {
    result: Mutex<Option<Result<ExecutableInfo, Error>>>,
    ready: Condvar,
}

impl Flight {
    fn new() -> Self {
        Self {
            result: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    fn publish(&self, result: Result<ExecutableInfo, Error>) {
        *lock(&self.result) = Some(result);
        self.ready.notify_all();
    }

    fn wait(&self) -> Result<ExecutableInfo, Error> {
        let mut slot = lock(&self.result);
        loop {
            if let Some(result) = slot.as_ref() {
                return result.clone();
            }
            slot = self.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A shard on cache lines of its own: two threads working on files of
/// different shards must not invalidate each other's lines.
#[repr(align(128))]
struct Padded<T>(T);

#[derive(Default)]
struct Shard {
    files: FileTable<ExecutableInfo>,
    /// Extractions in flight, with the number of callers waiting on each.
    flights: HashMap<FileId, (Arc<Flight>, u64)>,
}

/// The kernel side: the book and the backend it describes.
struct KernelSide<B> {
    book: KernelBook,
    backend: B,
}

impl<B: Backend> KernelSide<B> {
    /// Runs `f`, whose ops a reader of the maps must see whole or not at
    /// all (a plan, and its rollback when it failed half-way), between
    /// the backend's [`Backend::begin_writes`] and [`Backend::end_writes`].
    fn writing<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.backend.begin_writes();
        let result = f(self);
        self.backend.end_writes();
        result
    }

    /// Tells the book the time. Called before planning and again after the
    /// backend is done, so that a slot whose last table was just unpublished
    /// starts cooling no earlier than the unpublication.
    fn tick(&mut self, clock: &dyn Clock) {
        self.book.advance_to(clock.now());
    }

    /// Retries the removal of leftover entries, oldest file first.
    fn retry_leftovers(&mut self, clock: &dyn Clock) {
        self.tick(clock);
        for (file_id, op) in self.book.leftover_fronts() {
            let mut op = Some(op);
            // Each completed op pops one from the file's queue, so this ends.
            while let Some(current) = op.take() {
                let result =
                    self.writing(|k| eim_machine::driver::apply_one(&mut k.backend, &current));
                self.tick(clock);
                if self.book.leftover_result(file_id, result) {
                    op = self
                        .book
                        .leftovers()
                        .get(&file_id)
                        .and_then(|q| q.front().cloned());
                }
            }
        }
    }

    /// Loads a file's table and, if its loaders need them, its
    /// `interpreter_offsets` entry, all or nothing.
    fn load_with(
        &mut self,
        clock: &dyn Clock,
        file_id: FileId,
        deltas: &IntervalData,
        offsets: Option<OffsetRange>,
    ) -> Result<MapRef, Error> {
        self.retry_leftovers(clock);
        let plan = self
            .book
            .plan_load(file_id, deltas, offsets)
            .map_err(|e| plan_error(file_id, e))?;
        self.backend.begin_writes();
        let Err(stopped) = execute(&mut self.backend, &plan.ops) else {
            self.backend.end_writes();
            // A batch of one: one outcome.
            let committed = self.book.commit_load(plan).into_iter().next();
            return Ok(committed.map(|(_, map_ref)| map_ref).unwrap_or_default());
        };
        let failed = &plan.ops[stopped.at];
        let (map, op, len) = (failed.map(), failed.name(), failed.len());
        let rollback = self.book.abort_load(&plan, stopped);
        let result = execute(&mut self.backend, &rollback.ops);
        self.backend.end_writes();
        self.tick(clock);
        let rolled_back = self.book.finish_rollback(rollback, result);
        Err(Error::Kernel {
            file_id,
            map,
            op,
            errno: stopped.failure.errno,
            done: stopped.failure.done,
            len,
            rolled_back,
        })
    }

    /// Loads several files with one batch plan (one outer-map publication
    /// per size class). One outcome per distinct file id. Files refused at
    /// planning get their own error and do not block the others. On a
    /// kernel failure every file of the batch is rolled back; if the errno
    /// may concern only part of it ([`Errno::may_pass_in_part`]: one
    /// element too big for a full map, memory or descriptors the whole
    /// batch needed at once), the halves are tried on their own, down to
    /// single files: everything that fits loads, and only what does not
    /// gets the error, each file its own. At most `2n - 1` attempts for `n`
    /// files.
    fn load_many(
        &mut self,
        clock: &dyn Clock,
        files: &[(FileId, &IntervalData, Option<OffsetRange>)],
    ) -> BTreeMap<FileId, Result<MapRef, Error>> {
        self.retry_leftovers(clock);
        let mut out = BTreeMap::new();
        let mut pending = vec![files.to_vec()];
        while let Some(batch) = pending.pop() {
            let retry = self.load_batch(clock, &batch, &mut out);
            // Each part is smaller than the batch it came from, and a
            // single file is never split: this ends.
            match retry.len() {
                0 => {}
                1 => pending.push(retry),
                n => {
                    let (first, second) = retry.split_at(n / 2);
                    pending.push(second.to_vec());
                    pending.push(first.to_vec());
                }
            }
        }
        out
    }

    /// One attempt of [`Self::load_many`]: the outcome of every file in
    /// `out`, or, when the batch failed in a way a smaller one may not,
    /// the files to try again in smaller batches (those fully rolled back).
    fn load_batch<'d>(
        &mut self,
        clock: &dyn Clock,
        files: &[(FileId, &'d IntervalData, Option<OffsetRange>)],
        out: &mut BTreeMap<FileId, Result<MapRef, Error>>,
    ) -> Vec<(FileId, &'d IntervalData, Option<OffsetRange>)> {
        let (plan, refused) = self.book.plan_load_many_with(files);
        for (file_id, e) in refused {
            out.insert(file_id, Err(plan_error(file_id, e)));
        }
        self.backend.begin_writes();
        let Some(stopped) = execute(&mut self.backend, &plan.ops).err() else {
            self.backend.end_writes();
            for (file_id, map_ref) in self.book.commit_load(plan) {
                out.insert(file_id, Ok(map_ref));
            }
            return Vec::new();
        };
        let failed = &plan.ops[stopped.at];
        let (map, op, len) = (failed.map(), failed.name(), failed.len());
        let rollback = self.book.abort_load(&plan, stopped);
        let result = execute(&mut self.backend, &rollback.ops);
        self.backend.end_writes();
        self.tick(clock);
        self.book.finish_rollback(rollback, result);
        let errno = stopped.failure.errno;
        let split = plan.files.len() > 1 && errno.may_pass_in_part();
        let by_id: BTreeMap<FileId, usize> =
            files.iter().enumerate().map(|(i, f)| (f.0, i)).collect();
        let mut retry = Vec::new();
        for file in &plan.files {
            let file_id = file.file_id;
            let rolled_back = !self.book.leftovers().contains_key(&file_id);
            // A file whose entries could not all be removed cannot be
            // planned again until they are: it keeps this error.
            if split && rolled_back {
                if let Some(&i) = by_id.get(&file_id) {
                    retry.push(files[i]);
                    continue;
                }
            }
            out.insert(
                file_id,
                Err(Error::Kernel {
                    file_id,
                    map,
                    op,
                    errno,
                    done: stopped.failure.done,
                    len,
                    rolled_back,
                }),
            );
        }
        retry
    }

    fn unload(&mut self, clock: &dyn Clock, file_id: FileId) -> Result<(), Error> {
        self.retry_leftovers(clock);
        let Some(plan) = self.book.plan_unload(file_id) else {
            return Ok(());
        };
        let result = self.writing(|k| execute(&mut k.backend, &plan.ops));
        self.tick(clock);
        let failed = result
            .err()
            .map(|s| (plan.ops[s.at].map(), s.failure.errno));
        let entries = self.book.finish_unload(plan, result);
        match failed {
            None => Ok(()),
            Some((map, errno)) => Err(Error::UnloadIncomplete {
                file_id,
                map,
                errno,
                entries,
            }),
        }
    }
}

fn plan_error(file_id: FileId, e: PlanError) -> Error {
    match e {
        PlanError::Encode(cause) => Error::Encode { file_id, cause },
        PlanError::MapFull { map, capacity } => Error::MapFull {
            file_id,
            map,
            capacity,
        },
        PlanError::CleanupPending => Error::CleanupPending { file_id },
        PlanError::AlreadyLoaded => Error::AlreadyLoaded { file_id },
    }
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

/// Files of a [`ExecutableInfoManager::load_many`] extracted together:
/// each one's index in the call's own files, and its extraction.
type Part = Vec<(usize, Result<Extraction, ExtractError>)>;

/// Spreads file ids over shards (ids in tests are often small integers).
fn shard_index(id: FileId, shards: usize) -> usize {
    let mixed = id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 32) as usize & (shards - 1)
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

    /// A manager started over maps an earlier run left (a warm restart):
    /// `observed` is what they hold, `held` every file mapped now with its
    /// reference count. Each held file is extracted, the book is rebuilt by
    /// [`reconcile`](fn@reconcile) (what is right is adopted untouched, the rest removed
    /// top-down), and the files whose entries were not adopted are loaded.
    /// A shape the reconcile does not trust is an error that hands the
    /// provider and the backend back, untouched: the caller cleans the maps
    /// and starts afresh instead.
    ///
    /// `held` is consumed one file at a time and each file is dropped once
    /// extracted, so a caller may open files as they are asked for and hold
    /// one descriptor at a time, however many files the host maps.
    pub fn restart<E: Borrow<P::Elf>>(
        provider: P,
        backend: B,
        tracers: Tracers,
        config: Config,
        clock: Box<dyn Clock>,
        observed: &Observed,
        held: impl IntoIterator<Item = (FileId, E, u64)>,
    ) -> Result<(Self, RestartReport), RestartRefused<P, B>> {
        let manager = Self::with_config(provider, backend, tracers, config, clock);
        let mut report = RestartReport::default();
        let mut extracted = BTreeMap::new();
        // Each file once (a repeated id keeps its first count); a file
        // nobody holds is not mapped, so the reconcile removes it.
        for (file_id, elf, rc) in held {
            if rc == 0 || extracted.contains_key(&file_id) {
                continue;
            }
            match manager
                .provider
                .extract_for(file_id, elf.borrow(), manager.tracers)
            {
                Ok(extraction) => {
                    manager.extracted.fetch_add(1, Ordering::Relaxed);
                    extracted.insert(file_id, (extraction, rc));
                }
                Err(source) => {
                    if !source.is_not_found() {
                        if !source.is_changed() {
                            manager.extraction_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        manager.defer(file_id);
                    }
                    report.failed.push((
                        file_id,
                        Error::Extraction {
                            file_id,
                            cause: source,
                        },
                    ));
                }
            }
        }
        let offsets: BTreeMap<FileId, Option<OffsetRange>> = extracted
            .iter()
            .map(|(id, (e, _))| (*id, tracers::offsets_of(&e.interpreters)))
            .collect();
        let wanted: Vec<Wanted<'_>> = extracted
            .iter()
            .map(|(id, (e, _))| Wanted {
                file_id: *id,
                deltas: &e.data,
                offsets: offsets[id],
            })
            .collect();
        let now = manager.clock.now();
        let reconciled =
            match reconcile(observed, &wanted, config.capacities, config.slot_grace, now) {
                Ok(reconciled) => reconciled,
                Err(error) => {
                    drop(wanted);
                    drop(extracted);
                    let (provider, backend) = manager.into_parts();
                    return Err(RestartRefused {
                        error,
                        provider,
                        backend,
                    });
                }
            };
        report.removals = reconciled.removals().count();
        report.adopted = reconciled.adopted.clone();
        let mut kernel = lock(&manager.kernel);
        kernel.book = reconciled.book;
        kernel.retry_leftovers(&*manager.clock);
        let batch: Vec<(FileId, &IntervalData, Option<OffsetRange>)> = reconciled
            .to_load
            .iter()
            .filter_map(|id| {
                let (e, _) = extracted.get(id)?;
                Some((*id, &e.data, offsets[id]))
            })
            .collect();
        let mut outcomes = if batch.is_empty() {
            BTreeMap::new()
        } else {
            kernel.load_many(&*manager.clock, &batch)
        };
        report.removals_pending = kernel.book.leftover_ops();
        drop(kernel);
        let adopted: std::collections::BTreeSet<FileId> = report.adopted.iter().copied().collect();
        for (file_id, (extraction, rc)) in extracted {
            if !adopted.contains(&file_id) {
                match outcomes.remove(&file_id) {
                    Some(Ok(_)) => report.loaded.push(file_id),
                    Some(Err(e)) => {
                        manager.defer_load_failure(&e);
                        report.failed.push((file_id, e));
                        continue;
                    }
                    None => {
                        report
                            .failed
                            .push((file_id, Error::ExtractionAborted { file_id }));
                        continue;
                    }
                }
            }
            let info = ExecutableInfo {
                interpreters: std::sync::Arc::from(extraction.interpreters),
                libc: extraction.libc,
            };
            lock(manager.shard(file_id)).files.insert(file_id, info, rc);
        }
        Ok((manager, report))
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
            manager: self,
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

    /// Takes a reference on each file, like [`Self::add_or_inc_ref`] on each
    /// in turn, but loads all the new ones with ONE batch plan: their tables
    /// are published with one outer-map batch update per size class, so a
    /// batch pays one map-in-map RCU wait per class used instead of one per
    /// file. Known files take a reference on the fast path; deferred files
    /// are refused; a file being loaded by another caller is waited for
    /// (after this batch has landed). Extraction runs with no lock held; the
    /// new files are then planned, written and recorded in one kernel-lock
    /// session. If the kernel fails part way, every file of the batch is
    /// rolled back and gets the error (and is deferred); a file refused at
    /// planning gets its own error and does not block the others. Results
    /// are in the order of `files`; a file given twice gets two references.
    pub fn load_many(&self, files: &[(FileId, &P::Elf)]) -> Vec<Result<ExecutableInfo, Error>> {
        let mut results: Vec<Option<Result<ExecutableInfo, Error>>> = vec![None; files.len()];
        let mut mine: Vec<(usize, FlightGuard<'_, P, B>)> = Vec::new();
        let mut waits: Vec<(usize, Arc<Flight>)> = Vec::new();
        for (i, &(file_id, _)) in files.iter().enumerate() {
            let mut shard = lock(self.shard(file_id));
            if let Some(info) = shard.files.inc_ref(file_id) {
                results[i] = Some(Ok(info));
                continue;
            }
            if let Some((flight, waiters)) = shard.flights.get_mut(&file_id) {
                *waiters += 1;
                waits.push((i, flight.clone()));
                continue;
            }
            if lock(&self.deferred).contains(file_id, self.clock.now()) {
                results[i] = Some(Err(Error::Deferred { file_id }));
                continue;
            }
            let flight = Arc::new(Flight::new());
            shard.flights.insert(file_id, (flight.clone(), 0));
            drop(shard);
            mine.push((
                i,
                FlightGuard {
                    manager: self,
                    file_id,
                    flight,
                    landed: false,
                },
            ));
        }
        // Extraction, no lock held, in parts of at most `batch_bytes` of
        // deltas; each part is published (and its deltas dropped) while the
        // next one is extracted on a thread of its own, so extraction
        // overlaps the kernel's writes and RCU waits.
        let mut outcomes: Vec<Option<Result<ExecutableInfo, Error>>> = vec![None; mine.len()];
        let jobs: Vec<(FileId, &P::Elf)> = mine
            .iter()
            .map(|(i, guard)| (guard.file_id, files[*i].1))
            .collect();
        let mut publish = |part: Part| {
            let mut extracted = Vec::with_capacity(part.len());
            for (n, result) in part {
                match result {
                    Ok(extraction) => extracted.push((n, extraction)),
                    Err(source) => {
                        let file_id = mine[n].1.file_id;
                        if !source.is_not_found() {
                            if !source.is_changed() {
                                self.extraction_errors.fetch_add(1, Ordering::Relaxed);
                            }
                            self.defer(file_id);
                        }
                        outcomes[n] = Some(Err(Error::Extraction {
                            file_id,
                            cause: source,
                        }));
                    }
                }
            }
            self.publish_part(&mine, extracted, &mut outcomes);
        };
        if cfg!(loom) || jobs.len() < 2 {
            self.extract_parts(&jobs, |part| {
                publish(part);
                true
            });
        } else {
            std::thread::scope(|scope| {
                // One part queued while one is extracted and one published:
                // at most three parts of deltas in memory.
                let (ready, parts) = std::sync::mpsc::sync_channel::<Part>(1);
                let jobs = &jobs;
                let extractor = std::thread::Builder::new()
                    .name("eim-extract".into())
                    .stack_size(EXTRACTOR_STACK_BYTES)
                    .spawn_scoped(scope, move || {
                        self.extract_parts(jobs, |part| ready.send(part).is_ok())
                    });
                match extractor {
                    Ok(_) => {
                        for part in parts {
                            publish(part);
                        }
                    }
                    // No thread to be had (the host out of processes):
                    // the same parts, one after the other.
                    Err(e) => {
                        tracing::warn!("extracting on this thread: no thread for it: {e}");
                        self.extract_parts(jobs, |part| {
                            publish(part);
                            true
                        });
                    }
                }
            });
        }
        // Land every flight of the batch, then wait for the others' (never
        // before: two batches waiting on each other's flights would hang).
        for ((i, mut guard), outcome) in mine.into_iter().zip(outcomes) {
            let file_id = guard.file_id;
            let outcome = outcome.unwrap_or(Err(Error::ExtractionAborted { file_id }));
            results[i] = Some(guard.land(outcome));
        }
        for (i, flight) in waits {
            results[i] = Some(flight.wait());
        }
        results
            .into_iter()
            .zip(files)
            .map(|(r, (file_id, _))| {
                r.unwrap_or(Err(Error::ExtractionAborted { file_id: *file_id }))
            })
            .collect()
    }

    /// Extracts `jobs` in order, handing `part` each run of them whose
    /// deltas reach `batch_bytes` (and the rest at the end), with each
    /// job's index; stops when `part` returns false.
    fn extract_parts(&self, jobs: &[(FileId, &P::Elf)], mut part: impl FnMut(Part) -> bool) {
        let mut current: Part = Vec::new();
        let mut held = 0usize;
        for (n, &(file_id, elf)) in jobs.iter().enumerate() {
            let result = self.provider.extract_for(file_id, elf, self.tracers);
            if let Ok(extraction) = &result {
                self.extracted.fetch_add(1, Ordering::Relaxed);
                held = held.saturating_add(extraction.data.bytes());
            }
            current.push((n, result));
            if held >= self.batch_bytes {
                held = 0;
                if !part(std::mem::take(&mut current)) {
                    return;
                }
            }
        }
        if !current.is_empty() {
            part(current);
        }
    }

    /// One part of a [`Self::load_many`]: the extracted files `extracted`
    /// (by their index in `mine`) published with one kernel-lock session;
    /// their outcomes go to `outcomes`, and their deltas are dropped.
    fn publish_part(
        &self,
        mine: &[(usize, FlightGuard<'_, P, B>)],
        extracted: Vec<(usize, Extraction)>,
        outcomes: &mut [Option<Result<ExecutableInfo, Error>>],
    ) {
        if extracted.is_empty() {
            return;
        }
        let batch: Vec<(FileId, &IntervalData, Option<OffsetRange>)> = extracted
            .iter()
            .map(|(n, e)| {
                let offsets = tracers::offsets_of(&e.interpreters);
                (mine[*n].1.file_id, &e.data, offsets)
            })
            .collect();
        let mut loaded = lock(&self.kernel).load_many(&*self.clock, &batch);
        drop(batch);
        for (n, extraction) in extracted {
            let file_id = mine[n].1.file_id;
            let outcome = match loaded.remove(&file_id) {
                Some(Ok(_)) => Ok(ExecutableInfo {
                    interpreters: std::sync::Arc::from(extraction.interpreters),
                    libc: extraction.libc,
                }),
                Some(Err(e)) => {
                    self.defer_load_failure(&e);
                    Err(e)
                }
                None => Err(Error::ExtractionAborted { file_id }),
            };
            outcomes[n] = Some(outcome);
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

    /// The interpreter loaders the tracer set enables (the APM integration
    /// is always on, as upstream's). They run in the provider's
    /// [`Provider::extract_for`]; a provider without loaders runs none.
    pub fn num_interpreter_loaders(&self) -> usize {
        tracers::enabled(self.tracers).count()
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

/// Lands an extraction: records the file (with a reference for every caller
/// that waited) and wakes the waiters. If the extracting thread unwinds
/// instead, the waiters are woken with an error rather than left hanging.
struct FlightGuard<'a, P: Provider, B: Backend> {
    manager: &'a ExecutableInfoManager<P, B>,
    file_id: FileId,
    flight: Arc<Flight>,
    landed: bool,
}

impl<P: Provider, B: Backend> FlightGuard<'_, P, B> {
    fn land(&mut self, result: Result<ExecutableInfo, Error>) -> Result<ExecutableInfo, Error> {
        self.landed = true;
        let mut shard = lock(self.manager.shard(self.file_id));
        let waiters = shard
            .flights
            .remove(&self.file_id)
            .map_or(0, |(_, waiters)| waiters);
        if let Ok(info) = &result {
            shard.files.insert(self.file_id, info.clone(), 1 + waiters);
        }
        drop(shard);
        self.flight.publish(result.clone());
        result
    }
}

impl<P: Provider, B: Backend> Drop for FlightGuard<'_, P, B> {
    fn drop(&mut self) {
        if !self.landed {
            lock(self.manager.shard(self.file_id))
                .flights
                .remove(&self.file_id);
            self.flight.publish(Err(Error::ExtractionAborted {
                file_id: self.file_id,
            }));
        }
    }
}
