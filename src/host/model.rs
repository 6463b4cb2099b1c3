//! The host model: [`Host`] (the manager, the process table, what it
//! knows of each file, its claims, counters and the last step), how it is
//! configured ([`HostConfig`]), what a step reports ([`StepReport`]) and
//! how it tells its progress ([`Progress`]). Its walks are
//! [`crate::host::scan`] (and a warm restart, `scan/restart.rs`); what it
//! finds is [`crate::findings`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::Config;
use eim_core::manager::MonotonicClock;
use eim_core::metrics::{self, MetricId};
use eim_core::{ExecutableInfoManager, Tracers};
use eim_machine::process_maps::ProcessMapTable;
use eim_machine::FileId;

use crate::files::counting::{CountingProvider, ExtractionStats, Timed};
use crate::findings::{Counters, FileRecord, Phases, Problem, Reconciled, NOT_READABLE_KEPT};
use crate::host::claims::{Claims, FileKey};
use crate::host::fileids::FileIdCache;
use crate::host::mappings::ProcessTable;
use crate::host::open::OpenStrategy;
use crate::host::vdso::VdsoImages;
use crate::map_view::{Inspect, InspectError, Usage};
use crate::ElfProvider;

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

/// What the last step saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StepReport {
    /// Processes listed in `/proc` (kernel threads included).
    pub processes: usize,
    /// Processes with at least one executable file mapping.
    pub with_files: usize,
    /// Executable file mappings, all processes together, the vDSO's
    /// among them (it is loaded as a file).
    pub file_mappings: usize,
    /// Executable mappings without a file, the vDSO aside (JIT code).
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
    pub(super) fn note_missed(&mut self, missed: Missed) {
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

/// The host's executables, kept loaded through an [`ExecutableInfoManager`].
pub struct Host<B: Inspect> {
    pub(super) manager: HostManager<B>,
    pub(super) stats: Arc<ExtractionStats>,
    pub(super) config: HostConfig,
    pub(super) processes: ProcessTable,
    pub(super) ids: FileIdCache,
    pub(super) files: BTreeMap<FileId, FileRecord>,
    pub(super) problems: BTreeMap<FileId, Problem>,
    /// Mappings that could not be opened, by path (no file id to key them).
    pub(super) unopenable: BTreeMap<PathBuf, Problem>,
    /// Processes whose mappings eim may not read, with their names (the
    /// first [`NOT_READABLE_KEPT`] seen): the summary names them.
    pub(super) not_readable: BTreeMap<i32, String>,
    /// Which file owns each id, and who may share its tables.
    pub(super) claims: Claims,
    /// Files that collided with an id's owner, by id and file.
    pub(super) collisions: BTreeMap<(FileId, FileKey), Problem>,
    /// The collision count last handed to the backend's readers.
    pub(super) collisions_told: u64,
    /// Processes to read again at the end of the pass (see [`Resolved::Wait`]).
    pub(super) revisit: BTreeSet<i32>,
    pub(super) counters: Counters,
    pub(super) last: StepReport,
    /// Upstream's counters are reset by every read; these are their totals.
    pub(super) metric_totals: BTreeMap<MetricId, u64>,
    /// What the warm restart that started this host did.
    pub(super) restarted: Option<Reconciled>,
    /// What `eim_process_mappings` holds for each process.
    pub(super) process_maps: ProcessMapTable,
    /// Where the current step's time went so far.
    pub(super) clock: StepClock,
    /// Mapped files opened so far ([`Host::mapped_file_opens`]).
    pub(super) mapped_file_opens: u64,
    /// The vDSO images seen, each one file for every process mapping it.
    pub(super) vdso: VdsoImages,
}

/// See [`Phases`]: `busy` is the time spent loading batches and releasing
/// references (extraction, loaders, maps and the manager's own share).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepClock {
    pub(super) open: Duration,
    pub(super) file_ids: Duration,
    pub(super) busy: Duration,
}

impl<B: Inspect> Host<B> {
    /// A host over `backend` with eim's extraction.
    pub fn new(backend: B, config: HostConfig) -> Self {
        crate::host::heap::configure();
        // The arm64 vDSO has no .eh_frame: it loads with synthetic records.
        let provider = CountingProvider::new(ElfProvider::with_extractor(
            crate::files::elf_provider::extract_or_synthesize,
        ));
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
            mapped_file_opens: 0,
            vdso: VdsoImages::new(),
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

    /// How many times a mapping's file was opened through the opener
    /// ([`crate::host::open::open_mapping`]) since the host was made,
    /// failed opens included: what the descriptors a batch holds cost in
    /// system calls. Files on disk only: the vDSO is read from a
    /// process's memory, not opened ([`Host::vdso_images`]).
    pub fn mapped_file_opens(&self) -> u64 {
        self.mapped_file_opens
    }

    /// Distinct vDSO images read and made into files since the host was
    /// made: one per kernel, however many processes map it.
    pub fn vdso_images(&self) -> u64 {
        self.vdso.made()
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
}
