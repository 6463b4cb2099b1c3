//! The run loop: the real [`ExecutableInfoManager`] over a [`FaultyBackend`]ed
//! [`SimMaps`], driven one step at a time, with the invariants checked
//! after every op and every step.
//!
//! Besides the four invariants of `docs/INVARIANTS.md`, the runner keeps a
//! small model of what the public API promises and fails a run that breaks
//! it ([`Invariant::Api`]): the reference count of every known file equals
//! the references its live processes hold (plus entries waiting for
//! cleanup), a known file always gets its reference, and a kernel error or
//! an incomplete unload only happens in a call where a fault was injected.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::{ManualClock, StateView};
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::machine::Timestamp;
use eim_machine::FileId;

use crate::checker::{check_all, check_projection, Sources, Violation};
use crate::corpus::RealFile;
use crate::faulty::{FaultyBackend, FaultyStats};
use crate::pool::{self, file_id, PoolFile, SimProvider};
use crate::profile::Setup;
use crate::rng::{SimRng, Stream};
use crate::sampled::{check_files_equivalent, check_page_equivalent};
use crate::workload::{Action, ExitStyle, Generator, LoadStyle, Step};
use eim_sim::kernel::{SimError, SimMaps};
use eim_sim::SimReader;

/// Which promise a failing run broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    Projection,
    ReaderSafety,
    LookupEquivalence,
    Accounting,
    /// No slot changes its rule while a reader may still reach it.
    SlotReuse,
    /// The public API's promises (reference counts, which errors may occur).
    Api,
}

impl Invariant {
    fn of(v: &Violation) -> Self {
        match v {
            Violation::Projection(_) => Invariant::Projection,
            Violation::ReaderSafety { .. } => Invariant::ReaderSafety,
            Violation::LookupEquivalence { .. } => Invariant::LookupEquivalence,
            Violation::Accounting(_) => Invariant::Accounting,
            Violation::SlotReuse { .. } => Invariant::SlotReuse,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Invariant::Projection => "projection",
            Invariant::ReaderSafety => "reader safety",
            Invariant::LookupEquivalence => "lookup equivalence",
            Invariant::Accounting => "accounting",
            Invariant::SlotReuse => "slot reuse",
            Invariant::Api => "api",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A broken invariant: at which step (0-based), which, and the details.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub step: usize,
    pub invariant: Invariant,
    pub detail: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {}: {} violated: {}",
            self.step, self.invariant, self.detail
        )
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("simulated maps: {0}")]
    Maps(SimError),
}

// By hand, not `#[from]`: the message prints the cause, so it is not also
// the `source()` (`eim_core::error`'s convention).
impl From<SimError> for SetupError {
    fn from(e: SimError) -> Self {
        Self::Maps(e)
    }
}

/// A process of the model: how it exits and the references it holds.
#[derive(Debug)]
struct Process {
    exit: ExitStyle,
    held: Vec<FileId>,
    /// Every file it maps, loaded or not: what a restarted daemon finds
    /// when it walks the host.
    mapped: Vec<FileId>,
}

/// What the model knows of a file the manager knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    rc: u64,
    unused_since: Option<Duration>,
}

/// One simulation: the manager, its backend, and the model.
pub struct Sim {
    setup: Setup,
    pool: Arc<Vec<PoolFile>>,
    sources: Arc<Sources>,
    provider: Arc<SimProvider>,
    clock: Arc<ManualClock>,
    config: Config,
    manager: ExecutableInfoManager<Arc<SimProvider>, FaultyBackend>,
    now: Duration,
    processes: BTreeMap<u32, Process>,
    known: BTreeMap<FileId, Known>,
    /// Steps taken.
    steps: usize,
    /// Where the sweep over loaded pages continues.
    sweep: (FileId, u64),
    api: Option<String>,
    /// The state the projection was last checked in.
    checked: Option<Fingerprint>,
    /// Outcomes of the public calls, by kind.
    tally: BTreeMap<&'static str, u64>,
}

/// Outcome of one run.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub steps: usize,
    pub tally: BTreeMap<&'static str, u64>,
    pub failure: Option<Failure>,
    pub stats: FaultyStats,
    pub digest: String,
}

/// The pool of a setup (deterministic in its seed).
pub fn build_pool(setup: &Setup, corpus: &[RealFile]) -> Vec<PoolFile> {
    pool::build(
        &setup.pool,
        corpus,
        &mut SimRng::new(setup.seed, Stream::Pool),
    )
}

/// The steps of a seed: as many as asked, always the same ones.
pub fn generate(setup: &Setup, pool: &[PoolFile], steps: usize) -> Vec<Step> {
    let mut g = generator(setup, pool);
    (0..steps).map(|_| g.next_step()).collect()
}

/// The generator of a setup's steps.
pub fn generator(setup: &Setup, pool: &[PoolFile]) -> Generator {
    Generator::new(
        SimRng::new(setup.seed, Stream::Workload),
        setup.shape,
        pool.iter().map(|f| f.weight).collect(),
    )
}

impl Sim {
    pub fn new(setup: Setup, pool: Arc<Vec<PoolFile>>) -> Result<Self, SetupError> {
        let sources = Arc::new(pool::sources(&pool));
        let provider = Arc::new(SimProvider::new(&pool));
        let clock = Arc::new(ManualClock::new());
        let maps = SimMaps::new(setup.kernel)?;
        let mut watch =
            FaultyBackend::new(maps, sources.clone(), setup.fault_rate, setup.checks.per_op);
        watch.recovery_rate = setup.recovery_fault_rate;
        watch.sabotage = setup.sabotage;
        let config = Config {
            capacities: setup.capacities,
            shards: 8,
            ..Config::default()
        };
        watch.watch_slots(clock.clone(), config.slot_grace);
        let manager = ExecutableInfoManager::with_config(
            provider.clone(),
            watch,
            Tracers::none(),
            config,
            Box::new(clock.clone()),
        );
        Ok(Self {
            setup,
            pool,
            sources,
            provider,
            clock,
            config,
            manager,
            now: Duration::ZERO,
            processes: BTreeMap::new(),
            known: BTreeMap::new(),
            steps: 0,
            sweep: (FileId(0), 0),
            api: None,
            checked: None,
            tally: BTreeMap::new(),
        })
    }

    pub fn setup(&self) -> &Setup {
        &self.setup
    }

    pub fn stats(&self) -> FaultyStats {
        self.manager.with_backend(|w| w.stats)
    }

    pub fn digest(&self) -> String {
        self.manager.with_backend(|w| w.digest())
    }

    fn kernel_smaller(&self) -> bool {
        let (k, c) = (self.setup.kernel, self.setup.capacities);
        k.pages < c.pages || k.unwind_info < c.unwind_slots || k.outer < c.outer_entries
    }

    fn api_violation(&mut self, what: String) {
        self.api.get_or_insert(what);
    }

    fn faults_now(&self) -> u64 {
        self.manager.with_backend(|w| w.faults_now())
    }

    fn record(&self, what: String) {
        self.manager.with_backend(|w| w.record(&what));
    }

    /// Counts the outcome of a public call by kind.
    fn count<T>(&mut self, result: &Result<T, Error>) {
        let kind = match result {
            Ok(_) => "ok",
            Err(Error::Deferred { .. }) => "deferred",
            Err(Error::Extraction { cause, .. }) if cause.is_not_found() => "vanished",
            Err(Error::Extraction { .. }) => "extraction failed",
            Err(Error::Encode { .. }) => "encode",
            Err(Error::MapFull { .. }) => "map full",
            Err(Error::Kernel {
                rolled_back: true, ..
            }) => "kernel, rolled back",
            Err(Error::Kernel { .. }) => "kernel, leftovers",
            Err(Error::UnloadIncomplete { .. }) => "unload incomplete",
            Err(Error::AlreadyLoaded { .. }) => "already loaded",
            Err(Error::CleanupPending { .. }) => "cleanup pending",
            Err(_) => "other",
        };
        *self.tally.entry(kind).or_default() += 1;
    }

    /// Outcomes of the public calls so far, by kind.
    pub fn tally(&self) -> &BTreeMap<&'static str, u64> {
        &self.tally
    }

    /// A new reference on `id` was granted.
    fn granted(&mut self, id: FileId) {
        let k = self.known.entry(id).or_insert(Known {
            rc: 0,
            unused_since: None,
        });
        k.rc += 1;
        k.unused_since = None;
    }

    /// The outcome of a load attempt of a file the model did not know.
    fn judge_new_load(&mut self, id: FileId, result: &Result<(), Error>, faulted: bool) -> bool {
        match result {
            Ok(()) => true,
            Err(
                Error::Deferred { .. }
                | Error::Extraction { .. }
                | Error::MapFull { .. }
                | Error::Encode { .. }
                | Error::CleanupPending { .. },
            ) => false,
            // A kernel smaller than the book believes refuses writes itself.
            Err(Error::Kernel { .. }) if faulted || self.kernel_smaller() => false,
            Err(e) => {
                self.api_violation(format!("loading new file {id}: unexpected error: {e}"));
                false
            }
        }
    }

    fn load_one(&mut self, index: usize, synth: bool) -> Option<FileId> {
        let id = file_id(index);
        let data = self.pool.get(index)?.data.clone();
        let known = self.known.contains_key(&id);
        let before = self.faults_now();
        let result = if synth {
            self.manager.add_synth_interval_data(id, &data)
        } else {
            self.manager.add_or_inc_ref(id, &index).map(|_| ())
        };
        let faulted = self.faults_now() > before;
        self.count(&result);
        self.record(format!("load {index} synth {synth}: {result:?}"));
        let ok = match (known, synth) {
            (true, false) => {
                if let Err(e) = &result {
                    self.api_violation(format!("known file {id} refused a reference: {e}"));
                }
                result.is_ok()
            }
            (true, true) => {
                if !matches!(result, Err(Error::AlreadyLoaded { .. })) {
                    self.api_violation(format!(
                        "synthetic data for known file {id}: {result:?}, not AlreadyLoaded"
                    ));
                }
                false
            }
            (false, _) => self.judge_new_load(id, &result, faulted),
        };
        ok.then(|| {
            self.granted(id);
            id
        })
    }

    fn load_batch(&mut self, indices: &[usize]) -> Vec<FileId> {
        let files: Vec<(FileId, &usize)> = indices
            .iter()
            .filter(|i| **i < self.pool.len())
            .map(|i| (file_id(*i), i))
            .collect();
        let before = self.faults_now();
        let results = self.manager.load_many(&files);
        let faulted = self.faults_now() > before;
        let mut held = Vec::new();
        for ((id, _), result) in files.iter().zip(results) {
            let result = result.map(|_| ());
            self.count(&result);
            self.record(format!("batch {id}: {result:?}"));
            let ok = if self.known.contains_key(id) {
                if let Err(e) = &result {
                    self.api_violation(format!("known file {id} refused a reference: {e}"));
                }
                result.is_ok()
            } else {
                self.judge_new_load(*id, &result, faulted)
            };
            if ok {
                self.granted(*id);
                held.push(*id);
            }
        }
        held
    }

    fn exit(&mut self, pid: u32) {
        let Some(process) = self.processes.remove(&pid) else {
            return;
        };
        for id in process.held {
            let before = self.faults_now();
            let result = match process.exit {
                ExitStyle::Release => self.manager.remove_or_dec_ref(id),
                ExitStyle::Defer => self.manager.dec_ref(id),
            };
            let faulted = self.faults_now() > before;
            self.count(&result);
            self.record(format!("release {id}: {result:?}"));
            match &result {
                Ok(()) => {}
                Err(Error::UnloadIncomplete { .. }) if faulted => {}
                Err(e) => self.api_violation(format!("releasing {id}: {e}")),
            }
            let Some(k) = self.known.get_mut(&id) else {
                self.api_violation(format!("released {id}, which the model does not know"));
                continue;
            };
            k.rc = k.rc.saturating_sub(1);
            if k.rc == 0 {
                match process.exit {
                    ExitStyle::Release => {
                        self.known.remove(&id);
                    }
                    ExitStyle::Defer => k.unused_since = Some(self.now),
                }
            }
        }
    }

    fn cleanup(&mut self, age: Duration) {
        let before = self.faults_now();
        let report = self.manager.cleanup_unused(age);
        let faulted = self.faults_now() > before;
        self.record(format!(
            "cleanup: {} unloaded, {:?}",
            report.unloaded, report.errors
        ));
        let due: Vec<FileId> = match self.now.checked_sub(age) {
            None => Vec::new(),
            Some(cutoff) => self
                .known
                .iter()
                .filter(|(_, k)| k.rc == 0 && k.unused_since.is_some_and(|s| s <= cutoff))
                .map(|(id, _)| *id)
                .collect(),
        };
        if report.unloaded != due.len() {
            self.api_violation(format!(
                "cleanup unloaded {} files, {} were unused for {age:?}",
                report.unloaded,
                due.len()
            ));
        }
        if !faulted && !report.errors.is_empty() {
            self.api_violation(format!("fault-free cleanup failed: {:?}", report.errors));
        }
        for id in due {
            self.known.remove(&id);
        }
    }

    /// Applies one step and checks every invariant; `Err` on the first
    /// broken one.
    pub fn step(&mut self, step: &Step) -> Result<(), Failure> {
        let at = self.steps;
        self.steps += 1;
        self.manager.with_backend(|w| w.begin(step.faults));
        self.record(step.to_string());
        match &step.action {
            Action::Start {
                pid,
                exit,
                load,
                files,
            } => {
                let mut held = Vec::new();
                let mut batch = Vec::new();
                for m in files {
                    if m.synth || *load == LoadStyle::Each {
                        held.extend(self.load_one(m.file, m.synth));
                    } else {
                        batch.push(m.file);
                    }
                }
                if !batch.is_empty() {
                    held.extend(self.load_batch(&batch));
                }
                // A pid started twice (a hand-edited trace) keeps both sets.
                let pool = self.pool.len();
                let process = self.processes.entry(*pid).or_insert(Process {
                    exit: *exit,
                    held: Vec::new(),
                    mapped: Vec::new(),
                });
                process.held.extend(held);
                process.mapped.extend(
                    files
                        .iter()
                        .filter(|m| m.file < pool)
                        .map(|m| file_id(m.file)),
                );
            }
            Action::Exit { pid } => self.exit(*pid),
            Action::Advance { secs } => {
                let by = Duration::from_secs(*secs);
                self.clock.advance(by);
                self.now += by;
            }
            Action::Cleanup { age } => self.cleanup(Duration::from_secs(*age)),
            Action::Retry => {
                let before = self.faults_now();
                let pending = self.manager.retry_leftovers();
                self.record(format!("retry: {pending} pending"));
                if pending != 0 && self.faults_now() == before {
                    self.api_violation(format!("{pending} leftover ops after a fault-free retry"));
                }
            }
            Action::File { file, mode } => self.provider.set_mode(*file, *mode),
            Action::Crash { ops } => self.manager.with_backend(|w| w.arm_crash(*ops)),
        }
        if self.manager.with_backend(|w| w.crashed()) {
            self.restart(at)?;
        }
        self.check(at)
    }

    /// The daemon died during this step: a new manager starts over the same
    /// maps with the files the live processes hold (a warm restart), and
    /// every invariant is checked in full right after it.
    fn restart(&mut self, at: usize) -> Result<(), Failure> {
        let api = |detail: String| Failure {
            step: at,
            invariant: Invariant::Api,
            detail,
        };
        // Something to hold the place of the dead manager while its maps
        // move to the next one.
        let maps = SimMaps::new(self.setup.kernel).map_err(|e| api(e.to_string()))?;
        let placeholder = ExecutableInfoManager::with_config(
            self.provider.clone(),
            FaultyBackend::new(maps, self.sources.clone(), 0.0, self.setup.checks.per_op),
            Tracers::none(),
            self.config,
            Box::new(self.clock.clone()),
        );
        let mut watch = std::mem::replace(&mut self.manager, placeholder).into_backend();
        watch.revive();
        let mut observed = watch.maps.observed();
        observed.zeroed_ago = watch.zeroed_ago();
        // The new daemon walks the host: every file a live process maps is
        // held, one reference per mapping, also those the dead daemon never
        // loaded (or was loading when it died). Files nobody maps (unused,
        // waiting for cleanup) are not: the new daemon removes them.
        let mut rcs: BTreeMap<FileId, u64> = BTreeMap::new();
        for process in self.processes.values_mut() {
            process.held = process.mapped.clone();
            for id in &process.mapped {
                *rcs.entry(*id).or_default() += 1;
            }
        }
        let held: Vec<(FileId, usize, u64)> = rcs
            .iter()
            .filter_map(|(id, rc)| {
                let index = (0..self.pool.len()).find(|i| file_id(*i) == *id)?;
                Some((*id, index, *rc))
            })
            .collect();
        self.known = rcs
            .into_iter()
            .map(|(id, rc)| {
                (
                    id,
                    Known {
                        rc,
                        unused_since: None,
                    },
                )
            })
            .collect();
        let held: Vec<(FileId, &usize, u64)> = held
            .iter()
            .map(|(id, index, rc)| (*id, index, *rc))
            .collect();
        let (manager, report) = ExecutableInfoManager::restart(
            self.provider.clone(),
            watch,
            Tracers::none(),
            self.config,
            Box::new(self.clock.clone()),
            &observed,
            held,
        )
        .map_err(|e| api(format!("the restart did not trust the maps: {}", e.error)))?;
        self.manager = manager;
        self.record(format!(
            "restart: adopted {:?}, loaded {:?}, failed {:?}, {} removals ({} pending)",
            report.adopted, report.loaded, report.failed, report.removals, report.removals_pending
        ));
        *self.tally.entry("restarts").or_default() += 1;
        *self.tally.entry("restart: adopted").or_default() += report.adopted.len() as u64;
        *self.tally.entry("restart: loaded").or_default() += report.loaded.len() as u64;
        *self.tally.entry("restart: failed").or_default() += report.failed.len() as u64;
        // A file the new daemon could not load is held by nobody any more.
        for (id, _) in &report.failed {
            self.known.remove(id);
            for process in self.processes.values_mut() {
                process.held.retain(|h| h != id);
            }
        }
        self.checked = None;
        let state = self.manager.state();
        self.check_references(&state).map_err(api)?;
        let sources = self.sources.clone();
        self.manager
            .with_backend(|w| check_all(&state, &w.maps, &sources))
            .map_err(|v| self.fail(at, v))
    }

    fn fail(&self, step: usize, v: Violation) -> Failure {
        Failure {
            step,
            invariant: Invariant::of(&v),
            detail: v.to_string(),
        }
    }

    fn check(&mut self, at: usize) -> Result<(), Failure> {
        if let Some((op, v)) = self.manager.with_backend(|w| w.violation().cloned()) {
            return Err(Failure {
                step: at,
                invariant: Invariant::of(&v),
                detail: format!("after op {op}: {v}"),
            });
        }
        if let Some(detail) = self.api.take() {
            return Err(Failure {
                step: at,
                invariant: Invariant::Api,
                detail,
            });
        }
        let state = self.manager.state();
        self.check_references(&state).map_err(|detail| Failure {
            step: at,
            invariant: Invariant::Api,
            detail,
        })?;
        let full = (at as u64 + 1).is_multiple_of(self.setup.checks.full_every.max(1));
        let sources = self.sources.clone();
        let plan = self.setup.checks;
        let sweep = self.sweep;
        let print = self
            .manager
            .with_backend(|w| Fingerprint::of(&state, w.stats.ops));
        let unchanged = self.checked == Some(print);
        self.checked = Some(print);
        let result = self.manager.with_backend(|w| {
            if full {
                return check_all(&state, &w.maps, &sources).map(|()| sweep);
            }
            if unchanged {
                // No op since the last check, so neither the maps nor the
                // book changed; only the file table can have.
                check_no_zombie(&state)?;
            } else {
                check_projection(&state, &w.maps)?;
            }
            let touched: Vec<FileId> = w.touched().iter().copied().collect();
            check_files_equivalent(
                &state,
                &w.maps,
                &sources,
                touched,
                plan.per_step.rotated(at as u64),
            )?;
            sweep_loaded(&state, &w.maps, &sources, sweep, plan, at as u64)
        });
        match result {
            Ok(next) => {
                self.sweep = next;
                Ok(())
            }
            Err(v) => Err(self.fail(at, v)),
        }
    }

    /// Every invariant, every delta: the check at the end of a run.
    pub fn check_everything(&self) -> Result<(), Failure> {
        let at = self.steps.saturating_sub(1);
        let state = self.manager.state();
        self.check_references(&state).map_err(|detail| Failure {
            step: at,
            invariant: Invariant::Api,
            detail,
        })?;
        self.manager
            .with_backend(|w| check_all(&state, &w.maps, &self.sources))
            .map_err(|v| self.fail(at, v))
    }

    /// The manager's reference counts equal the model's.
    fn check_references(&self, state: &StateView) -> Result<(), String> {
        if state.files.len() != self.known.len() {
            let extra: Vec<_> = state
                .files
                .keys()
                .filter(|id| !self.known.contains_key(id))
                .collect();
            let missing: Vec<_> = self
                .known
                .keys()
                .filter(|id| !state.files.contains_key(id))
                .collect();
            return Err(format!(
                "known files differ from the references held: extra {extra:?}, missing {missing:?}"
            ));
        }
        for (id, entry) in &state.files {
            let Some(k) = self.known.get(id) else {
                return Err(format!("file {id} is known but nobody holds it"));
            };
            let since = entry.unused_since.map(|Timestamp(t)| t);
            if entry.rc != k.rc || since != k.unused_since {
                return Err(format!(
                    "file {id}: {} references, unused since {since:?}; processes hold {}, unused since {:?}",
                    entry.rc, k.rc, k.unused_since
                ));
            }
        }
        Ok(())
    }
}

/// What decides whether the projection can have changed since it was last
/// checked: the backend's op count, and counts of the book and the file
/// table (a book that changed without an op would be a bug of its own, so
/// its counts are compared too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    ops: u64,
    loaded: usize,
    pages: u64,
    slots: usize,
    leftovers: usize,
    files: usize,
}

impl Fingerprint {
    fn of(state: &StateView, ops: u64) -> Self {
        Self {
            ops,
            loaded: state.book.loaded().len(),
            pages: state.book.pages_in_use(),
            slots: state.book.slots().in_use(),
            leftovers: state.book.leftover_ops(),
            files: state.files.len(),
        }
    }
}

/// The part of the projection that depends on the file table alone: every
/// table belongs to a known file.
fn check_no_zombie(state: &StateView) -> Result<(), Violation> {
    match state
        .book
        .loaded()
        .keys()
        .find(|id| !state.files.contains_key(id))
    {
        Some(id) => Err(Violation::Projection(format!(
            "file {id} has a table but no entry (a zombie table)"
        ))),
        None => Ok(()),
    }
}

/// Checks the next `plan.sweep_pages` pages of loaded files (in file and
/// page order, wrapping around); returns where to continue.
fn sweep_loaded(
    state: &StateView,
    maps: &SimMaps,
    sources: &Sources,
    from: (FileId, u64),
    plan: crate::profile::CheckPlan,
    offset: u64,
) -> Result<(FileId, u64), Violation> {
    let loaded = state.book.loaded();
    if loaded.is_empty() {
        return Ok(from);
    }
    let reader = SimReader::new(maps);
    let mut at = from;
    for _ in 0..plan.sweep_pages {
        // The first loaded page at or after `at`, wrapping around.
        let next = loaded
            .range(at.0..)
            .flat_map(|(id, t)| t.page_keys(*id).map(move |k| (*id, k.page)))
            .find(|p| *p >= at)
            .or_else(|| {
                loaded
                    .iter()
                    .next()
                    .map(|(id, t)| (*id, t.map_ref.start_page))
            });
        let Some((file_id, page)) = next else {
            break;
        };
        if let Some(data) = sources.get(&file_id) {
            check_page_equivalent(&reader, file_id, data, page, plan.per_step.rotated(offset))?;
        }
        at = (file_id, page + 1);
    }
    Ok(at)
}

/// Runs `steps` from a fresh simulation; stops at the first failure. The
/// final full check runs when all steps pass and `final_check` is set.
pub fn run_steps(
    setup: &Setup,
    pool: Arc<Vec<PoolFile>>,
    steps: &[Step],
    final_check: bool,
) -> Result<Outcome, SetupError> {
    let mut sim = Sim::new(setup.clone(), pool)?;
    let mut failure = None;
    for step in steps {
        if let Err(f) = sim.step(step) {
            failure = Some(f);
            break;
        }
    }
    if failure.is_none() && final_check {
        failure = sim.check_everything().err();
    }
    Ok(Outcome {
        steps: sim.steps,
        tally: sim.tally.clone(),
        failure,
        stats: sim.stats(),
        digest: sim.digest(),
    })
}
