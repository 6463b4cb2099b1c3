//! The host's executables in the unwind tables: [`Host`] walks `/proc`,
//! opens every file that a process maps executable, and keeps the manager's
//! references equal to what the processes map. `eim scan` is one
//! [`Host::step`]; `eim watch` is a step every interval. A profiler embeds
//! eim through the same type.
//!
//! One step:
//!
//! 1. every process is read (`/proc/PID/stat`, `/proc/PID/maps`); a process
//!    that exits meanwhile is counted and skipped;
//! 2. each executable file mapping not seen before in that process is
//!    opened as the mapped file ([`crate::host::open`]) and its file id
//!    computed (cached by device, inode, size and mtime);
//! 3. the files a process maps now and does not hold yet are loaded with
//!    [`ExecutableInfoManager::load_many`], in batches of at most
//!    [`HostConfig::batch_files`] distinct files: each distinct file is
//!    extracted once per batch however many processes map it (and not at
//!    all if the manager knows it), and the new tables of a batch are
//!    published with one outer-map update per size class;
//! 4. references of files a process no longer maps, and of processes that
//!    exited, are released (`remove_or_dec_ref`, or `dec_ref` with a
//!    delayed unload, followed by `cleanup_unused`).
//!
//! See [`crate::host::mappings`] for why a process holds one reference per
//! distinct file. A step stopped part way (Ctrl-C) has loaded or released
//! whole files only: the manager applies each batch under its kernel lock,
//! and releases nothing of the processes it did not get to.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eim_analysis::elf::fileid::FileId128;
use eim_core::manager::Config;
use eim_core::manager::MonotonicClock;
use eim_core::metrics::{self, MetricId};
use eim_core::provider::ExtractErrorKind;
use eim_core::{Error, ExecutableInfo, ExecutableInfoManager, Tracers};
use eim_machine::abi::ProcessMapping;
use eim_machine::ops::{Backend, MapOp};
use eim_machine::process_maps::ProcessMapTable;
use eim_machine::tracking::Work;
use eim_machine::FileId;

use crate::backends::inspect::{Inspect, InspectError, Usage};
use crate::files::counting::{CountingProvider, ExtractionStats, HostFile, Timed};
use crate::host::claims::{Admit, Candidate, Claims, FileKey, State, Verdict};
use crate::host::collide;
use crate::host::fileids::FileIdCache;
use crate::host::mappings::{MappingKey, ProcessEntry, ProcessTable, Resolution};
use crate::host::open::{self, Identity, OpenError, OpenStrategy};
use crate::host::procs::{self, ExecMapping, ListError, ProcessError};
use crate::host::segments::{self, LoadSegment};
use crate::{ElfFileRef, ElfProvider};

mod restart;

pub use restart::{NotRestarted, Reconciled, RestartFailed};

/// The manager as the host runs it.
pub type HostManager<B> = ExecutableInfoManager<CountingProvider, Timed<B>>;

/// How a [`Host`] works.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub strategy: OpenStrategy,
    /// `None`: a file is unloaded when its last process lets go. `Some(d)`:
    /// it stays loaded until unused for `d` (newer upstream's delayed
    /// unload), so processes that come and go do not reload it.
    pub unload_delay: Option<Duration>,
    /// Distinct new files per `load_many` batch. Each is held open until
    /// its batch is loaded, so this bounds the files open at once: `eim`
    /// sizes it from the descriptor limit
    /// ([`crate::host::descriptors::files_per_batch`]).
    pub batch_files: usize,
    /// Only these processes (`eim lookup --pid`); all when `None`.
    pub only: Option<BTreeSet<i32>>,
    /// The interpreter loaders asked about every new file (all by
    /// default, so a scan reports every interpreter it finds).
    pub tracers: Tracers,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            strategy: OpenStrategy::MapFilesThenRoot,
            unload_delay: None,
            batch_files: 256,
            only: None,
            tracers: Tracers(u32::MAX),
        }
    }
}

/// Whether a file is waiting out upstream's deferral or failed outright.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// It failed recently and is not tried again before the deferral
    /// timeout (90 s): upstream's `ErrDeferredFileID`.
    Deferred,
    /// It could not be loaded (not ELF, malformed unwind data, too large,
    /// the kernel refused, ...).
    Failed,
    /// It could not be opened as the file the process maps.
    Unopenable,
    /// It is of a kind eim does not extract (not ELF, 32-bit or big-endian
    /// ELF, another machine: [`crate::files::elf_file::HeaderError`]
    /// decides): not a failure, but not loaded either.
    Unsupported,
    /// It presents the id of another file with other bytes where that
    /// file's tables were read from (`host::claims`): not loaded, so that
    /// neither can be served the other's tables.
    Collision,
}

impl ProblemKind {
    /// What a load's error makes of the file; `None` for a file that has
    /// gone (not a problem: the process let go of it).
    pub fn of(e: &Error) -> Option<Self> {
        match e {
            Error::Deferred { .. } => Some(Self::Deferred),
            Error::Extraction { cause, .. } => match cause.kind {
                ExtractErrorKind::NotFound => None,
                ExtractErrorKind::Unsupported => Some(Self::Unsupported),
                _ => Some(Self::Failed),
            },
            _ => Some(Self::Failed),
        }
    }
}

/// A file that is not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub path: PathBuf,
    /// The 128-bit file id, when the file could be read.
    pub file_id: Option<String>,
    pub kind: ProblemKind,
    /// The whole error, naming the file.
    pub reason: String,
    /// The reason without what names the file (its id and path), the same
    /// for every file that failed the same way: the summary groups by it.
    pub cause: String,
}

/// `e`'s message without the file id and path it starts with.
pub fn cause_of(e: &Error) -> String {
    match e {
        Error::Extraction { cause, .. } => cause.message.clone(),
        other => {
            let text = other.to_string();
            let prefix = format!("file {}: ", other.file_id());
            text.strip_prefix(&prefix)
                .map_or_else(|| text.clone(), str::to_string)
        }
    }
}

/// The most paths a file's record keeps: one file can be seen under a
/// path per container root, and a report needs only a few.
pub const MAX_PATHS: usize = 32;

/// What the host knows of one distinct file.
#[derive(Clone, Debug)]
pub struct FileRecord {
    pub id: FileId128,
    /// The path of its first mapping seen (as that process sees it).
    pub path: PathBuf,
    /// Every path it was seen under (as each process sees it), first seen
    /// first, at most [`MAX_PATHS`].
    pub paths: Vec<PathBuf>,
    /// Paths seen beyond [`MAX_PATHS`] (not kept).
    pub more_paths: usize,
    pub size: u64,
    /// Its loadable segments, which give each mapping of it its bias.
    pub segments: Vec<LoadSegment>,
    /// What the manager reported when it was last loaded.
    pub info: Option<ExecutableInfo>,
}

impl FileRecord {
    /// Notes that a process maps it under `path`.
    fn saw(&mut self, path: &std::path::Path) {
        if self.paths.iter().any(|p| p == path) {
            return;
        }
        if self.paths.len() < MAX_PATHS {
            self.paths.push(path.to_path_buf());
        } else {
            self.more_paths += 1;
        }
    }
}

/// Counts since the host was made (steps add up).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub steps: u64,
    /// Processes read (with or without executable files; every step).
    pub processes_read: u64,
    /// Processes that exited while being read, or whose files vanished.
    pub vanished: u64,
    /// Processes whose mappings could not be read for lack of privilege.
    pub permission_denied: u64,
    /// Processes or files that could not be read for another reason.
    pub unreadable: u64,
    /// Mappings whose file had gone by the time it was opened.
    pub files_vanished: u64,
    /// References taken and released.
    pub references_taken: u64,
    pub references_released: u64,
    /// Releases the manager refused (a bug if ever non-zero) or whose
    /// kernel entries are still being removed.
    pub release_errors: u64,
    /// Processes seen exit (or replaced by another with the same pid).
    pub exited: u64,
    /// Files unloaded by the delayed-unload cleanup.
    pub unloaded_after_delay: u64,
    /// `eim_process_mappings` entries written (put or deleted), and the
    /// writes the kernel refused (retried at the process's next read).
    pub process_mappings_written: u64,
    pub process_mapping_errors: u64,
    /// Files found presenting the id of another file with other bytes
    /// (each file once per id), and of them, loaded owners a trusted file
    /// replaced after comparing their bytes.
    pub collisions: u64,
    pub owners_replaced: u64,
}

/// What the last step saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StepReport {
    /// Processes listed in `/proc` (kernel threads included).
    pub processes: usize,
    /// Processes with at least one executable file mapping.
    pub with_files: usize,
    /// Executable file mappings, all processes together.
    pub file_mappings: usize,
    /// Executable mappings without a file (the vDSO, JIT code).
    pub anonymous_mappings: usize,
    pub new_processes: usize,
    pub exited: usize,
    pub taken: usize,
    pub released: usize,
    /// Stopped part way by the stop flag.
    pub interrupted: bool,
    pub elapsed: Duration,
    /// Where `elapsed` went.
    pub phases: Phases,
    /// Processes whose table entry the pass changed in a way host events
    /// report (new, exited, or with new executable mappings): after events
    /// were followed, what a resync may have to correct. Each at most once
    /// per process the pass read, so bounded by the host.
    pub missed: Vec<Missed>,
}

/// A change of a process's table entry that host events report; an unmap
/// is not one (no event reports it: it is found when the process is read
/// again for another reason, or at a resync).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Missed {
    NewProcess { pid: i32 },
    Exited { pid: i32 },
    NewMappings { pid: i32, mappings: usize },
}

impl std::fmt::Display for Missed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NewProcess { pid } => write!(f, "process {pid} was not in the table"),
            Self::Exited { pid } => write!(f, "process {pid} had exited"),
            Self::NewMappings { pid, mappings } => {
                write!(f, "process {pid} had {mappings} new executable mappings")
            }
        }
    }
}

impl StepReport {
    fn note_missed(&mut self, missed: Missed) {
        self.missed.push(missed);
    }
}

impl Missed {
    pub fn pid(&self) -> i32 {
        match *self {
            Self::NewProcess { pid } | Self::Exited { pid } | Self::NewMappings { pid, .. } => pid,
        }
    }
}

/// Which processes a pass releases when it does not find them.
enum Scope {
    /// Every process of the table (a walk of the whole host).
    Host,
    /// The processes the pass reads; `exited` are those whose exit an
    /// event reported.
    Named { exited: BTreeSet<i32> },
}

impl Scope {
    fn exit_reported(&self, pid: i32) -> bool {
        match self {
            Scope::Host => false,
            Scope::Named { exited } => exited.contains(&pid),
        }
    }
}

/// Where a step's time went. `walk`, `open`, `file_ids` and `loading` add
/// up to the step's time; extraction and the loaders run on a thread of
/// their own beside `loading` (the next part of a batch is extracted while
/// the last one is written), so they are that thread's time, not a share.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Phases {
    /// Listing `/proc`, reading each process's mappings, and the step's
    /// own bookkeeping.
    pub walk: Duration,
    /// Opening mapped files (`/proc/PID/map_files` or the path).
    pub open: Duration,
    /// Computing file ids (hashing the head and tail of new files).
    pub file_ids: Duration,
    /// Loading batches and releasing references: waiting for extraction,
    /// the manager's planning and encoding, the maps, giving freed memory
    /// back.
    pub loading: Duration,
    /// Of `loading`, applying map ops to the backend (kernel or simulated
    /// maps).
    pub maps: Duration,
    /// Extracting stack deltas (and reading what they need), beside
    /// `loading`.
    pub extraction: Duration,
    /// The interpreter loaders, beside `loading`.
    pub loaders: Duration,
}

/// Told how far a step is.
pub trait Progress {
    /// A step over `processes` processes begins.
    fn start(&mut self, processes: u64);
    /// One more process done.
    fn advance(&mut self);
    /// Loading a batch of `files` new files.
    fn loading(&mut self, files: usize);
    fn finish(&mut self);
}

/// No progress shown.
#[derive(Debug, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn start(&mut self, _: u64) {}
    fn advance(&mut self) {}
    fn loading(&mut self, _: usize) {}
    fn finish(&mut self) {}
}

/// A mapping's file, opened and identified.
enum Identified {
    File(FileId128, std::fs::File, Identity),
    Unusable,
}

/// What a new mapping resolved to.
enum Resolved {
    Mapping(Resolution),
    /// Gone (unmapped, or the process is exiting).
    Gone,
    /// Its id's owner is not loaded yet: judged when it is (the process is
    /// read again at the end of the pass).
    Wait,
}

/// The most collisions listed (all are counted).
const MAX_COLLISIONS_LISTED: usize = 1024;

/// Rounds of reading again, at the end of a pass, the processes whose
/// files waited for an owner or lost one (two suffice: a replaced owner's
/// processes, then their files judged against the new one).
const REVISIT_ROUNDS: usize = 3;

/// The references one step still has to take, the files they need, and
/// the references to release once the loads are done.
#[derive(Default)]
struct Batch {
    refs: Vec<(i32, FileId)>,
    files: HashMap<FileId, HostFile>,
    releases: Vec<FileId>,
}

/// Processes not readable that the summary names, at most.
pub const NOT_READABLE_KEPT: usize = 32;

/// The host's executables, kept loaded through an [`ExecutableInfoManager`].
pub struct Host<B: Inspect> {
    manager: HostManager<B>,
    stats: Arc<ExtractionStats>,
    config: HostConfig,
    processes: ProcessTable,
    ids: FileIdCache,
    files: BTreeMap<FileId, FileRecord>,
    problems: BTreeMap<FileId, Problem>,
    /// Mappings that could not be opened, by path (no file id to key them).
    unopenable: BTreeMap<PathBuf, Problem>,
    /// Processes whose mappings eim may not read, with their names (the
    /// first [`NOT_READABLE_KEPT`] seen): the summary names them.
    not_readable: BTreeMap<i32, String>,
    /// Which file owns each id, and who may share its tables.
    claims: Claims,
    /// Files that collided with an id's owner, by id and file.
    collisions: BTreeMap<(FileId, FileKey), Problem>,
    /// The collision count last handed to the backend's readers.
    collisions_told: u64,
    /// Processes to read again at the end of the pass (see [`Resolved::Wait`]).
    revisit: BTreeSet<i32>,
    counters: Counters,
    last: StepReport,
    /// Upstream's counters are reset by every read; these are their totals.
    metric_totals: BTreeMap<MetricId, u64>,
    /// What the warm restart that started this host did.
    restarted: Option<Reconciled>,
    /// What `eim_process_mappings` holds for each process.
    process_maps: ProcessMapTable,
    /// Where the current step's time went so far.
    clock: StepClock,
}

/// See [`Phases`]: `busy` is the time spent loading batches and releasing
/// references (extraction, loaders, maps and the manager's own share).
#[derive(Clone, Copy, Debug, Default)]
struct StepClock {
    open: Duration,
    file_ids: Duration,
    busy: Duration,
}

impl<B: Inspect> Host<B> {
    /// A host over `backend` with eim's extraction.
    pub fn new(backend: B, config: HostConfig) -> Self {
        crate::host::heap::configure();
        let provider = CountingProvider::new(ElfProvider::new());
        let stats = provider.stats();
        let manager = ExecutableInfoManager::with_config(
            provider,
            Timed::new(backend),
            config.tracers,
            Config::default(),
            Box::new(MonotonicClock::default()),
        );
        Self {
            manager,
            stats,
            config,
            processes: ProcessTable::new(),
            ids: FileIdCache::new(),
            files: BTreeMap::new(),
            problems: BTreeMap::new(),
            unopenable: BTreeMap::new(),
            not_readable: BTreeMap::new(),
            claims: Claims::new(),
            collisions: BTreeMap::new(),
            collisions_told: 0,
            revisit: BTreeSet::new(),
            counters: Counters::default(),
            last: StepReport::default(),
            metric_totals: BTreeMap::new(),
            clock: StepClock::default(),
            restarted: None,
            process_maps: ProcessMapTable::new(),
        }
    }

    pub fn manager(&self) -> &HostManager<B> {
        &self.manager
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Processes seen whose mappings eim may not read, by pid, with their
    /// names (at most [`NOT_READABLE_KEPT`]).
    pub fn not_readable(&self) -> &BTreeMap<i32, String> {
        &self.not_readable
    }

    /// Counts a process eim may not read and keeps its name for the
    /// summary (`/proc/PID/comm` is readable without privileges).
    pub(crate) fn note_not_readable(&mut self, pid: i32) {
        self.counters.permission_denied += 1;
        if self.not_readable.len() < NOT_READABLE_KEPT {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default();
            self.not_readable.insert(pid, name);
        }
    }

    pub fn last_step(&self) -> &StepReport {
        &self.last
    }

    pub fn extraction(&self) -> &ExtractionStats {
        &self.stats
    }

    /// Every distinct file seen, by host file id.
    pub fn files(&self) -> &BTreeMap<FileId, FileRecord> {
        &self.files
    }

    /// Files (and mappings) that are not loaded, and why.
    pub fn problems(&self) -> Vec<Problem> {
        self.problems
            .values()
            .chain(self.unopenable.values())
            .chain(self.collisions.values())
            .cloned()
            .collect()
    }

    pub fn processes(&self) -> &ProcessTable {
        &self.processes
    }

    /// The files process `pid` holds a reference on.
    pub fn held_by(&self, pid: i32) -> Option<&BTreeSet<FileId>> {
        self.processes.get(pid).map(|e| &e.held)
    }

    /// Time spent in the backend's ops so far.
    pub fn kernel_time(&self) -> Duration {
        self.manager.with_backend(|b| b.spent())
    }

    /// Map ops applied to the backend so far.
    pub fn kernel_ops(&self) -> u64 {
        self.manager.with_backend(|b| b.ops())
    }

    /// What the maps hold, read from the backend.
    pub fn usage(&self) -> Result<Usage, InspectError> {
        self.manager.with_backend(|b| b.inner.usage())
    }

    /// Runs `f` on the backend (for lookups).
    pub fn with_backend<R>(&self, f: impl FnOnce(&B) -> R) -> R {
        self.manager.with_backend(|b| f(&b.inner))
    }

    /// Upstream's five metrics: gauges as they are now, counters as totals
    /// since the host was made.
    pub fn metrics(&mut self) -> BTreeMap<MetricId, u64> {
        let mut now = metrics::Summary::new();
        self.manager.update_metric_summary(&mut now);
        for counter in [
            metrics::STACK_DELTA_PROVIDER_SUCCESS,
            metrics::STACK_DELTA_PROVIDER_EXTRACTION_ERROR,
        ] {
            let total = self.metric_totals.entry(counter).or_insert(0);
            *total += now.get(&counter).copied().unwrap_or(0);
            now.insert(counter, *total);
        }
        now
    }

    /// One pass over the host (see the module documentation). Stops
    /// between two processes when `stop` is set.
    pub fn step(
        &mut self,
        stop: &AtomicBool,
        progress: &mut dyn Progress,
    ) -> Result<&StepReport, ListError> {
        let started = Instant::now();
        let pids = self.followed_pids()?;
        Ok(self.pass(started, pids, Scope::Host, stop, progress))
    }

    /// A pass over the processes host events named ([`Work`]), and no
    /// other: each is read again (what it maps now is taken, what it no
    /// longer maps released), and one that is gone releases what it held.
    /// Processes this host does not follow (`only`) are left out.
    pub fn follow(
        &mut self,
        work: &Work,
        stop: &AtomicBool,
        progress: &mut dyn Progress,
    ) -> &StepReport {
        let started = Instant::now();
        let pids: Vec<i32> = work
            .refresh
            .iter()
            .chain(&work.exited)
            .copied()
            .filter(|pid| {
                self.config
                    .only
                    .as_ref()
                    .is_none_or(|only| only.contains(pid))
            })
            .collect();
        let exited = work.exited.clone();
        self.pass(started, pids, Scope::Named { exited }, stop, progress)
    }

    /// Reads `pids` and releases what the processes of `scope` that were
    /// not found alive held.
    fn pass(
        &mut self,
        started: Instant,
        pids: Vec<i32>,
        scope: Scope,
        stop: &AtomicBool,
        progress: &mut dyn Progress,
    ) -> &StepReport {
        let (extraction_before, loaders_before) = (self.stats.time(), self.stats.loaders_time());
        let maps_before = self.kernel_time();
        self.clock = StepClock::default();
        let mut report = StepReport {
            processes: pids.len(),
            ..StepReport::default()
        };
        self.counters.steps += 1;
        progress.start(pids.len() as u64);
        let mut alive = HashSet::with_capacity(pids.len());
        let mut batch = Batch::default();
        let mut pids = pids;
        for &pid in &pids {
            if stop.load(Ordering::Relaxed) {
                report.interrupted = true;
                break;
            }
            self.counters.processes_read += 1;
            // A process whose exit was reported and that is exiting with
            // no other thread is gone, whatever /proc still shows of it:
            // the exit tracepoint can fire before the kernel drops its
            // mappings, and a zombie stays until its parent reaps it, with
            // no event to say when (kept, each would stay in the table
            // until a resync: a correction for every short process of a
            // storm).
            if scope.exit_reported(pid) && procs::exiting_alone(pid) {
                progress.advance();
                continue;
            }
            let visited = self.visit(pid, &mut batch, &mut report, progress, false);
            self.visited(pid, visited, &mut alive);
            if batch.files.len() >= self.batch_limit() {
                self.flush(&mut batch, progress, &mut report);
            }
            progress.advance();
        }
        self.flush(&mut batch, progress, &mut report);
        if !report.interrupted {
            self.revisit_waiting(&mut pids, &mut alive, &mut batch, &mut report, progress);
        }
        // What this pass did not load has no tables to defend: the next
        // file to present the id owns it.
        for id in self.claims.pending() {
            if !self.manager.knows(id) {
                self.claims.forget(id);
            }
        }
        let mut releases = std::mem::take(&mut batch.releases);
        let releasing = Instant::now();
        if !report.interrupted {
            let gone = match scope {
                Scope::Host => self.processes.gone(&alive),
                Scope::Named { .. } => pids.into_iter().filter(|p| !alive.contains(p)).collect(),
            };
            for pid in gone {
                self.forget_process_mappings(pid);
                if let Some(entry) = self.processes.remove(pid) {
                    report.exited += 1;
                    self.counters.exited += 1;
                    // A process that held nothing (a zombie a resync found
                    // after its exit was followed, a kernel thread) changes
                    // nothing in the maps: not something events missed.
                    if !entry.held.is_empty() {
                        report.note_missed(Missed::Exited { pid });
                    }
                    releases.extend(entry.held);
                }
            }
        }
        if matches!(scope, Scope::Host) && !report.interrupted {
            // Entries found at start (or left unknown by a failure) that
            // this full pass did not write belong to no followed process.
            for op in self.process_maps.sweep() {
                self.apply_process_op(op);
            }
        }
        // After the loads, so a file passing from one process to another
        // in the same step is not unloaded and loaded again.
        for id in releases {
            self.release(id);
            report.released += 1;
        }
        if let Some(delay) = self.config.unload_delay {
            let cleanup = self.manager.cleanup_unused(delay);
            self.counters.unloaded_after_delay += cleanup.unloaded as u64;
            if cleanup.unloaded > 0 {
                self.sweep_claims();
            }
            for e in cleanup.errors {
                tracing::warn!("{e}");
                self.counters.release_errors += 1;
            }
        }
        if report.taken > 0 || report.released > 0 {
            crate::host::heap::give_back();
        }
        self.clock.busy += releasing.elapsed();
        if self.counters.collisions != self.collisions_told {
            self.tell_collisions();
        }
        progress.finish();
        report.elapsed = started.elapsed();
        report.phases = self.phases(
            report.elapsed,
            self.stats.time().saturating_sub(extraction_before),
            self.stats.loaders_time().saturating_sub(loaders_before),
            self.kernel_time().saturating_sub(maps_before),
        );
        self.last = report;
        &self.last
    }

    /// Hands the collisions seen so far to the backend, for the readers of
    /// its maps (`eim status`).
    fn tell_collisions(&mut self) {
        let total = self.counters.collisions;
        let listed: Vec<String> = self.collisions.values().map(|p| p.reason.clone()).collect();
        self.manager
            .with_backend(|b| b.inner.record_collisions(total, &listed));
        self.collisions_told = total;
    }

    /// Counts a visit's outcome; `alive` gets the processes still there.
    fn visited(&mut self, pid: i32, result: Result<(), ProcessError>, alive: &mut HashSet<i32>) {
        match result {
            Ok(()) => {
                alive.insert(pid);
            }
            Err(ProcessError::Vanished { .. }) => self.counters.vanished += 1,
            Err(e @ ProcessError::PermissionDenied { .. }) => {
                tracing::debug!("{e}");
                self.note_not_readable(pid);
                // Known before (privileges do not come and go): keep it.
                alive.insert(pid);
            }
            Err(e @ ProcessError::Io { .. }) => {
                tracing::warn!("{e}");
                self.counters.unreadable += 1;
                alive.insert(pid);
            }
        }
    }

    /// Reads again the processes whose files waited for their id's owner
    /// to be loaded, or lost theirs to a trusted file, now that the pass's
    /// loads are done, and loads what they take. A few rounds: what is
    /// still waiting after them is read again at the end of the next pass.
    fn revisit_waiting(
        &mut self,
        pids: &mut Vec<i32>,
        alive: &mut HashSet<i32>,
        batch: &mut Batch,
        report: &mut StepReport,
        progress: &mut dyn Progress,
    ) {
        for _ in 0..REVISIT_ROUNDS {
            let mut round: Vec<i32> = std::mem::take(&mut self.revisit).into_iter().collect();
            if let Some(only) = &self.config.only {
                round.retain(|pid| only.contains(pid));
            }
            if round.is_empty() {
                return;
            }
            for pid in round {
                let visited = self.visit(pid, batch, report, progress, true);
                if !pids.contains(&pid) {
                    // So that a pass over named processes releases it if
                    // it has gone meanwhile.
                    pids.push(pid);
                }
                self.visited(pid, visited, alive);
            }
            self.flush(batch, progress, report);
        }
    }

    /// The step's phases from its time and what extraction (`extracted`,
    /// the loaders included), the loaders and the maps took.
    fn phases(
        &self,
        elapsed: Duration,
        extracted: Duration,
        loaders: Duration,
        maps: Duration,
    ) -> Phases {
        let StepClock {
            open,
            file_ids,
            busy,
        } = self.clock;
        Phases {
            walk: elapsed.saturating_sub(busy + open + file_ids),
            open,
            file_ids,
            loading: busy,
            maps,
            extraction: extracted.saturating_sub(loaders),
            loaders,
        }
    }

    /// The processes of `/proc` this host follows (all, or `only`).
    fn followed_pids(&self) -> Result<Vec<i32>, ListError> {
        let mut pids = procs::list()?;
        if let Some(only) = &self.config.only {
            pids.retain(|pid| only.contains(pid));
        }
        Ok(pids)
    }

    /// The most files a batch holds open.
    fn batch_limit(&self) -> usize {
        self.config.batch_files.max(1)
    }

    /// Reads process `pid` and queues the references it needs, loading
    /// the batch whenever it is full: a process mapping more files than a
    /// batch holds never has more of them open at once. `again`: a read
    /// of the end of a pass ([`Self::revisit_waiting`]), whose changes are
    /// eim's own, not something host events missed.
    fn visit(
        &mut self,
        pid: i32,
        batch: &mut Batch,
        report: &mut StepReport,
        progress: &mut dyn Progress,
        again: bool,
    ) -> Result<(), ProcessError> {
        let start_time = procs::start_time(pid)?;
        let mappings = procs::exec_mappings(pid)?;
        let known = self
            .processes
            .get(pid)
            .is_some_and(|e| e.start_time == start_time);
        let (mut entry, replaced) = self.processes.take(pid, start_time);
        if let Some(old) = replaced {
            self.counters.exited += 1;
            report.exited += 1;
            batch.releases.extend(old.held);
        }
        if !known {
            report.new_processes += 1;
            // Only a process that maps files needs the table (see above).
            if !mappings.files.is_empty() && !again {
                report.note_missed(Missed::NewProcess { pid });
            }
        }
        if !again {
            report.file_mappings += mappings.files.len();
            report.anonymous_mappings += mappings.anonymous;
            if !mappings.files.is_empty() {
                report.with_files += 1;
            }
        }
        let mut current = HashSet::with_capacity(mappings.files.len());
        // Mappings not seen before in this process: an mmap event names each.
        let mut new_mappings = 0;
        for m in &mappings.files {
            let key = MappingKey::of(m);
            current.insert(key);
            let cached = entry.mappings.get(&key).copied().filter(|r| match r {
                // A file this process does not hold (its load failed) is
                // judged again before it is taken: its id may have another
                // owner since.
                Resolution::File(id) => entry.held.contains(id) || self.manager.is_deferred(*id),
                _ => true,
            });
            let resolved = match cached {
                Some(r) => Resolved::Mapping(r),
                None => {
                    if !entry.mappings.contains_key(&key) {
                        new_mappings += 1;
                    }
                    self.resolve(pid, m, batch, Some(&mut entry))
                }
            };
            match resolved {
                Resolved::Mapping(r) => {
                    entry.mappings.insert(key, r);
                }
                // Not cached, so a later read tries again if it is still
                // there.
                Resolved::Gone => {
                    entry.mappings.remove(&key);
                    self.counters.files_vanished += 1;
                }
                Resolved::Wait => {
                    entry.mappings.remove(&key);
                    self.revisit.insert(pid);
                }
            }
        }
        if known && new_mappings > 0 && !again {
            report.note_missed(Missed::NewMappings {
                pid,
                mappings: new_mappings,
            });
        }
        entry.keep_mappings(&current);
        // From the resolutions as they stand after the loop: an owner
        // evicted during it took its earlier mappings' resolutions along.
        let mut mapped = BTreeSet::new();
        let mut first_mapping: HashMap<FileId, &ExecMapping> = HashMap::new();
        for m in &mappings.files {
            if let Some(Resolution::File(id)) = entry.mappings.get(&MappingKey::of(m)) {
                mapped.insert(*id);
                first_mapping.entry(*id).or_insert(m);
            }
        }
        let list = self.process_mapping_list(&entry, &mappings.files);
        if let Some(op) = self.process_maps.set(pid as u32, list) {
            self.apply_process_op(op);
        }
        let changes = entry.changes(&mapped);
        for id in changes.release {
            entry.held.remove(&id);
            batch.releases.push(id);
        }
        // Back in the table before any load: a batch loaded below records
        // what this process took in its entry.
        self.processes.put(pid, entry);
        for id in changes.take {
            if self.manager.is_deferred(id) {
                continue;
            }
            if !batch.files.contains_key(&id) && batch.files.len() >= self.batch_limit() {
                self.flush(batch, progress, report);
            }
            // A file the batch cannot open (gone meanwhile) is skipped;
            // the next step tries again.
            if batch.files.contains_key(&id)
                || self.open_for_batch(pid, id, first_mapping[&id], batch)
            {
                batch.refs.push((pid, id));
            }
        }
        Ok(())
    }

    /// Opens a mapping's file, computes its id and judges it against the
    /// id's owner ([`Self::admit`]). The opened file goes into the batch
    /// if it may be loaded, the batch has none of its id and has room;
    /// otherwise it is closed here, and opened again if it is to be loaded
    /// (the batch's size bounds the descriptors it holds). `current`: the
    /// entry of the process being read, out of the table meanwhile.
    fn resolve(
        &mut self,
        pid: i32,
        m: &ExecMapping,
        batch: &mut Batch,
        current: Option<&mut ProcessEntry>,
    ) -> Resolved {
        let (id128, file, identity) = match self.identify(pid, m) {
            None => return Resolved::Gone,
            Some(Identified::Unusable) => return Resolved::Mapping(Resolution::Unusable),
            Some(Identified::File(id128, file, identity)) => (id128, file, identity),
        };
        let id = id128.host();
        match self.admit(pid, m, id, &file, identity, batch, current) {
            Resolved::Mapping(Resolution::File(_)) => {}
            other => return other,
        }
        if batch.files.len() < self.batch_limit() {
            batch
                .files
                .entry(id)
                .or_insert_with(|| HostFile::new(id128, host_elf_ref(pid, m).with_file(file)));
        }
        Resolved::Mapping(Resolution::File(id))
    }

    /// Judges a file presenting `id` against the id's owner
    /// ([`crate::host::claims`]): the owner, or a file with its bytes, may
    /// be loaded; another file collides, unless it is trusted and the
    /// owner is not, in which case the owner is evicted first.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &mut self,
        pid: i32,
        m: &ExecMapping,
        id: FileId,
        file: &std::fs::File,
        identity: Identity,
        batch: &mut Batch,
        current: Option<&mut ProcessEntry>,
    ) -> Resolved {
        let key = FileKey {
            dev: identity.dev,
            inode: identity.inode,
        };
        if let Some(claim) = self.claims.get(id) {
            if claim.owner == key {
                return Resolved::Mapping(Resolution::File(id));
            }
            // Tables gone, or a failure no longer deferred: nothing to
            // defend, the next file owns the id.
            let stale = match claim.state {
                State::Loaded(_) => !self.manager.knows(id) && !batch.files.contains_key(&id),
                State::Failed => !self.manager.is_deferred(id),
                State::Pending => false,
            };
            if stale {
                self.claims.forget(id);
            }
        }
        // Only for a new id, or another file than its owner: a stat and
        // the directories up to the process's root.
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(e) => {
                let e = OpenError::Io {
                    pid,
                    path: m.path.clone(),
                    cause: e,
                };
                self.note_unopenable(m, &e);
                return Resolved::Mapping(Resolution::Unusable);
            }
        };
        let candidate = Candidate {
            stamp: collide::stamp_of(&meta),
            trusted: collide::trusted(pid, &m.path, &meta),
            path: m.path.clone(),
        };
        // A take-over compared nothing: the evicted owner's files are judged
        // against the new owner when their processes are read again, and
        // listed then if they differ.
        let mut compared = true;
        let verdict = match self.claims.admit(id, &candidate) {
            Admit::Owner | Admit::Same | Admit::Deferred => Verdict::Share,
            Admit::Collides => Verdict::Collision,
            Admit::Wait => return Resolved::Wait,
            Admit::TakeOver => {
                compared = false;
                Verdict::Replace
            }
            Admit::Check(digest) => {
                let same = match collide::same_bytes(file, meta.len(), &digest) {
                    Ok(same) => same,
                    Err(e) => {
                        tracing::debug!(pid, path = %m.path.display(), "cannot compare with the owner of {id}: {e}");
                        false
                    }
                };
                self.claims.judge(id, &candidate, same)
            }
        };
        match verdict {
            Verdict::Share => Resolved::Mapping(Resolution::File(id)),
            Verdict::Collision => {
                self.note_collision(id, &candidate, false);
                Resolved::Mapping(Resolution::Collision(id))
            }
            Verdict::Replace => {
                // Before the eviction, which may forget it with the tables.
                let old = self.claims.get(id).cloned();
                if !self.evict(id, batch, current) {
                    // Something else still holds the owner's tables: they
                    // cannot be replaced now, so this file is not loaded.
                    self.note_collision(id, &candidate, false);
                    return Resolved::Mapping(Resolution::Collision(id));
                }
                self.claims.take_over(id, &candidate);
                if let Some(old) = old.filter(|_| compared) {
                    let loser = Candidate {
                        stamp: crate::host::claims::Stamp {
                            key: old.owner,
                            size: meta.len(),
                            mtime_ns: 0,
                            ctime_ns: 0,
                        },
                        trusted: old.trusted,
                        path: old.path,
                    };
                    self.note_collision(id, &loser, true);
                    self.counters.owners_replaced += 1;
                }
                Resolved::Mapping(Resolution::File(id))
            }
        }
    }

    /// Evicts `id`'s owner: every process's resolutions naming it are
    /// forgotten (each is read again at the end of the pass and judged
    /// against the new owner), their references released, the batch's
    /// references and file of it dropped, and its tables unloaded (the
    /// usual unload plan: pages first, then the table). False if the
    /// tables are still loaded afterwards (a reference the host does not
    /// track), so that nothing may be loaded under the id.
    fn evict(&mut self, id: FileId, batch: &mut Batch, current: Option<&mut ProcessEntry>) -> bool {
        let mut release = 0;
        let pids: Vec<i32> = self.processes.pids_naming(id);
        for pid in pids {
            if let Some(entry) = self.processes.get_mut(pid) {
                let (forgot, held) = entry.forget_file(id);
                release += usize::from(held);
                if forgot || held {
                    self.revisit.insert(pid);
                    self.drop_process_mapping_of(pid, id);
                }
            }
        }
        if let Some(entry) = current {
            // The process being read: its later resolutions are its own.
            let (_, held) = entry.forget_file(id);
            release += usize::from(held);
        }
        batch.refs.retain(|(pid, i)| {
            if *i == id {
                self.revisit.insert(*pid);
            }
            *i != id
        });
        batch.files.remove(&id);
        let before = batch.releases.len();
        batch.releases.retain(|i| *i != id);
        release += before - batch.releases.len();
        for _ in 0..release {
            self.release(id);
        }
        if let Err(e) = self.manager.unload_if_unused(id) {
            tracing::warn!("{e}");
        }
        self.manager.forgive(id);
        self.problems.remove(&id);
        !self.manager.knows(id)
    }

    /// Removes `id`'s mappings from process `pid`'s `eim_process_mappings`
    /// entry at once (not at its next read): no mapping of a file that
    /// lost its id may point at the id's next tables.
    fn drop_process_mapping_of(&mut self, pid: i32, id: FileId) {
        let Some(now) = self.process_maps.get(pid as u32) else {
            return;
        };
        if !now.mappings.iter().any(|m| m.file_id == id.0) {
            return;
        }
        let kept: Vec<ProcessMapping> = now
            .mappings
            .iter()
            .filter(|m| m.file_id != id.0)
            .copied()
            .collect();
        if let Some(op) = self.process_maps.set(pid as u32, kept) {
            self.apply_process_op(op);
        }
    }

    /// Lists and counts a collision at `id`, once per file; logged once.
    fn note_collision(&mut self, id: FileId, loser: &Candidate, replaced: bool) {
        let key = (id, loser.stamp.key);
        if self.collisions.contains_key(&key) {
            return;
        }
        self.counters.collisions += 1;
        let owner = self.claims.get(id);
        let owner_path = owner.map_or_else(PathBuf::new, |c| c.path.clone());
        let who = |trusted: bool| if trusted { "trusted" } else { "untrusted" };
        let cause = if replaced {
            format!(
                "it lost the file id (and any tables loaded from it) to {} ({}), which presents the same id with other bytes",
                owner_path.display(),
                who(owner.is_some_and(|c| c.trusted))
            )
        } else {
            format!(
                "it presents the file id of {} ({}) with other bytes: not loaded",
                owner_path.display(),
                who(owner.is_some_and(|c| c.trusted))
            )
        };
        let file_id = self.files.get(&id).map(|r| r.id.to_string());
        let reason = format!(
            "file {id}: {} ({}, device {} inode {}): {cause}",
            loser.path.display(),
            who(loser.trusted),
            loser.stamp.key.dev,
            loser.stamp.key.inode
        );
        tracing::warn!("file id collision: {reason}");
        if self.collisions.len() < MAX_COLLISIONS_LISTED {
            self.collisions.insert(
                key,
                Problem {
                    path: loser.path.clone(),
                    file_id,
                    kind: ProblemKind::Collision,
                    reason,
                    cause: "presents another file's id with other bytes (file id collision)".into(),
                },
            );
        }
    }

    /// Opens a mapping's file, computes its id and records the file. `None`
    /// if it has gone.
    fn identify(&mut self, pid: i32, m: &ExecMapping) -> Option<Identified> {
        let opening = Instant::now();
        let opened = open::open_mapping(pid, m, self.config.strategy);
        self.clock.open += opening.elapsed();
        let opened = match opened {
            Ok(opened) => opened,
            Err(e) if e.is_vanished() => return None,
            Err(e) => {
                self.note_unopenable(m, &e);
                return Some(Identified::Unusable);
            }
        };
        let identifying = Instant::now();
        let id128 = self.ids.get(&opened.file, opened.identity);
        self.clock.file_ids += identifying.elapsed();
        let id128 = match id128 {
            Ok(id) => id,
            Err(e) => {
                let e = OpenError::Io {
                    pid,
                    path: m.path.clone(),
                    cause: e,
                };
                self.note_unopenable(m, &e);
                return Some(Identified::Unusable);
            }
        };
        let id = id128.host();
        let record = self.files.entry(id).or_insert_with(|| {
            tracing::debug!(pid, path = %m.path.display(), file_id = %id128, via = ?opened.via, "new file");
            FileRecord {
                id: id128,
                path: m.path.clone(),
                paths: Vec::new(),
                more_paths: 0,
                size: opened.identity.size,
                // A file whose headers cannot be read has no bias: its
                // mappings are left out of the unwinder's table.
                segments: segments::load_segments(&opened.file).unwrap_or_default(),
                info: None,
            }
        });
        record.saw(&m.path);
        Some(Identified::File(id128, opened.file, opened.identity))
    }

    /// Opens the file of `m` again for a batch that has room for it (its
    /// mapping was resolved earlier, in this step or an earlier one).
    /// False if it cannot be opened now, or is no longer the file `id`.
    fn open_for_batch(&mut self, pid: i32, id: FileId, m: &ExecMapping, batch: &mut Batch) -> bool {
        match self.resolve(pid, m, batch, None) {
            Resolved::Mapping(Resolution::File(now))
                if now == id && batch.files.contains_key(&id) =>
            {
                true
            }
            Resolved::Mapping(Resolution::File(now)) => {
                tracing::debug!(pid, path = %m.path.display(), was = %id, now = %now, "file changed since it was identified");
                false
            }
            Resolved::Mapping(_) | Resolved::Wait => false,
            Resolved::Gone => {
                self.counters.files_vanished += 1;
                false
            }
        }
    }

    fn note_unopenable(&mut self, m: &ExecMapping, e: &OpenError) {
        if matches!(e, OpenError::PermissionDenied { .. }) {
            self.counters.permission_denied += 1;
        } else {
            self.counters.unreadable += 1;
        }
        tracing::debug!("{e}");
        self.unopenable
            .entry(m.path.clone())
            .or_insert_with(|| Problem {
                path: m.path.clone(),
                file_id: None,
                kind: ProblemKind::Unopenable,
                reason: e.to_string(),
                cause: e.cause(),
            });
    }

    /// Loads a batch: one `load_many` call for all its references.
    fn flush(&mut self, batch: &mut Batch, progress: &mut dyn Progress, report: &mut StepReport) {
        if batch.refs.is_empty() {
            batch.files.clear();
            return;
        }
        let refs = std::mem::take(&mut batch.refs);
        let files = std::mem::take(&mut batch.files);
        progress.loading(files.len());
        let list: Vec<(FileId, &HostFile)> = refs.iter().map(|(_, id)| (*id, &files[id])).collect();
        let loading = Instant::now();
        let results = self.manager.load_many(&list);
        self.clock.busy += loading.elapsed();
        // One log line per file, however many processes map it (a user
        // with many processes must not flood the log): the first failure's
        // line and the count. Bounded by the batch.
        let mut failures: BTreeMap<FileId, (FailureLine, u64)> = BTreeMap::new();
        for ((pid, id), result) in refs.into_iter().zip(results) {
            match &result {
                // The first result of an id that was extracted now gives
                // its owner's digest; later ones (references on a known
                // file) leave it.
                Ok(_) => self.claims.loaded(id, files[&id].source()),
                Err(e) if ProblemKind::of(e).is_none() => {
                    self.claims.forget(id);
                }
                Err(_) => self.claims.failed(id),
            }
            match result {
                Ok(info) => {
                    if let Some(entry) = self.processes.get_mut(pid) {
                        entry.held.insert(id);
                    }
                    if let Some(record) = self.files.get_mut(&id) {
                        record.info = Some(info);
                    }
                    self.problems.remove(&id);
                    self.counters.references_taken += 1;
                    report.taken += 1;
                }
                Err(e) => {
                    if let Some(line) = self.note_failure(id, &files[&id], e) {
                        failures.entry(id).or_insert((line, 0)).1 += 1;
                    }
                }
            }
        }
        for (line, times) in failures.into_values() {
            line.log(times);
        }
    }

    /// Records a failed reference to file `id`; the line to log for it,
    /// unless the failure only marks the file deferred.
    fn note_failure(&mut self, id: FileId, file: &HostFile, e: Error) -> Option<FailureLine> {
        let Some(kind) = ProblemKind::of(&e) else {
            self.counters.files_vanished += 1;
            return None;
        };
        let path = self
            .files
            .get(&id)
            .map_or_else(|| file.elf.path().to_path_buf(), |r| r.path.clone());
        match self.problems.get_mut(&id) {
            // An unsupported file stays unsupported while it is deferred.
            Some(p) if p.kind == ProblemKind::Unsupported && kind == ProblemKind::Deferred => None,
            // A deferral keeps the reason of the failure that caused it.
            Some(p) if kind == ProblemKind::Deferred => {
                p.kind = kind;
                None
            }
            existing => {
                let reason = e.to_string();
                // Said before, in an earlier step: not said again.
                let known = existing.is_some_and(|p| p.kind == kind && p.reason == reason);
                let line = FailureLine {
                    path: path.clone(),
                    reason: reason.clone(),
                    warn: kind != ProblemKind::Unsupported && !known,
                };
                self.problems.insert(
                    id,
                    Problem {
                        path,
                        file_id: Some(file.id.to_string()),
                        kind,
                        cause: cause_of(&e),
                        reason,
                    },
                );
                Some(line)
            }
        }
    }

    fn release(&mut self, id: FileId) {
        let result = match self.config.unload_delay {
            Some(_) => self.manager.dec_ref(id),
            None => self.manager.remove_or_dec_ref(id),
        };
        self.counters.references_released += 1;
        if let Err(e) = result {
            tracing::warn!("{e}");
            self.counters.release_errors += 1;
        }
        // Its tables gone, the id has nothing to defend (a delayed unload
        // is swept after `cleanup_unused`).
        if !self.manager.knows(id) {
            self.claims.forget(id);
        }
    }

    /// Forgets the claims of ids whose tables are gone and that are not
    /// deferred: the claims stay as many as the files loaded or failing.
    fn sweep_claims(&mut self) {
        let gone: Vec<FileId> = self
            .claims
            .ids()
            .filter(|&id| !self.manager.knows(id) && !self.manager.is_deferred(id))
            .collect();
        for id in gone {
            self.claims.forget(id);
        }
    }

    /// Process `pid`'s executable file mappings as the unwinder needs them:
    /// those resolved to a file whose segments give their bias.
    fn process_mapping_list(
        &self,
        entry: &ProcessEntry,
        files: &[ExecMapping],
    ) -> Vec<ProcessMapping> {
        files
            .iter()
            .filter_map(|m| {
                let Resolution::File(id) = entry.mappings.get(&MappingKey::of(m))? else {
                    return None;
                };
                let record = self.files.get(id)?;
                Some(ProcessMapping {
                    start: m.start,
                    end: m.end,
                    file_offset: m.offset,
                    bias: segments::bias(&record.segments, m.start, m.offset)?,
                    file_id: id.0,
                })
            })
            .collect()
    }

    /// Deletes process `pid`'s `eim_process_mappings` entry, if it has one.
    fn forget_process_mappings(&mut self, pid: i32) {
        if let Some(op) = self.process_maps.remove(pid as u32) {
            self.apply_process_op(op);
        }
    }

    /// Applies an op of [`ProcessMapTable`]. A refused write is logged and
    /// counted, and the entry marked unknown: the process's next read
    /// writes it again, a full pass deletes it if the process is gone. A
    /// delete of an absent entry is no failure.
    fn apply_process_op(&mut self, op: MapOp) {
        let pid = match &op {
            MapOp::PutProcessMappings { pid, .. } | MapOp::DeleteProcessMappings { pid } => *pid,
            _ => return,
        };
        self.counters.process_mappings_written += 1;
        match self.manager.with_backend(|b| b.apply(&op)) {
            Ok(()) => {}
            Err(f) if op.is_delete() && f.errno.0 == libc::ENOENT => {}
            Err(f) => {
                tracing::warn!(pid, map = %op.map(), errno = %f.errno, "{} failed", op.name());
                self.counters.process_mapping_errors += 1;
                self.process_maps.failed(pid);
            }
        }
    }

    /// The `eim_process_mappings` entries written, by pid.
    pub fn process_maps(&self) -> &ProcessMapTable {
        &self.process_maps
    }

    /// Releases every reference of every process (the maps then hold only
    /// files waiting out a delayed unload, or nothing).
    pub fn release_all(&mut self) {
        let pids: Vec<i32> = self.processes.gone(&HashSet::new());
        for pid in pids {
            self.forget_process_mappings(pid);
            if let Some(entry) = self.processes.remove(pid) {
                for id in entry.held {
                    self.release(id);
                }
            }
        }
    }

    /// The process's current executable mapping containing `address`, with
    /// its file id if the process holds one for it.
    pub fn mapping_at(
        &self,
        pid: i32,
        address: u64,
    ) -> Result<Option<(ExecMapping, Option<FileId>)>, ProcessError> {
        let mappings = procs::exec_mappings(pid)?;
        let Some(m) = mappings.files.into_iter().find(|m| m.contains(address)) else {
            return Ok(None);
        };
        let id = self
            .processes
            .get(pid)
            .and_then(|e: &ProcessEntry| e.mappings.get(&MappingKey::of(&m)))
            .and_then(|r| match r {
                Resolution::File(id) => Some(*id),
                Resolution::Unusable | Resolution::Collision(_) => None,
            });
        Ok(Some((m, id)))
    }
}

/// The log line of a file's failure in one batch.
struct FailureLine {
    path: PathBuf,
    reason: String,
    /// A warning the first time; debug once said, or for an unsupported file.
    warn: bool,
}

impl FailureLine {
    /// Logs the line once, with how many references (processes) failed.
    fn log(self, references: u64) {
        if self.warn {
            tracing::warn!(path = %self.path.display(), references, "{}", self.reason);
        } else {
            tracing::debug!(path = %self.path.display(), references, "{}", self.reason);
        }
    }
}

/// The reference through which a process's file is extracted: named by its
/// path inside the process's root, so the debug-file search looks there.
fn host_elf_ref(pid: i32, m: &ExecMapping) -> ElfFileRef {
    ElfFileRef::new(&m.path).with_root(open::root_of(pid))
}
