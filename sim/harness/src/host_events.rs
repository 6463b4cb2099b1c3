//! The event path of host tracking as a workload (issue 18): a seeded
//! host whose processes fork, exec, map libraries and exit; the events
//! those changes cause, reordered, duplicated and dropped on their way; a
//! process table that follows them the way `eim watch` does
//! ([`eim_machine::tracking::coalesce`], then one read of each named process),
//! resyncing from the host's truth every so often and at once after a loss
//! it is told of; and the manager over simulated maps underneath.
//!
//! Every process maps the vDSO (issue 31): one file for all of them, as
//! the kernel maps one image into each, from its exec (or fork) to its
//! exit, so it is loaded with the first process and unloaded with the
//! last.
//!
//! What it checks: after every resync the table is the host's truth, each
//! file's reference count is the number of processes mapping it (the
//! vDSO's, every process), the maps hold exactly those files (the
//! checker's projection), and without silent drops no resync ever has
//! anything to correct.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use eim_core::manager::ManualClock;
use eim_core::provider::MemoryProvider;
use eim_core::{Config, ExecutableInfoManager, Tracers};
use eim_machine::deltas::hint;
use eim_machine::tracking::{coalesce, HostEvent};
use eim_machine::FileId;

use crate::check_projection;
use crate::fixtures::deltas;
use crate::rng::{SimRng, Stream};
use eim_sim::{SimConfig, SimMaps};

/// How hostile the event path is.
#[derive(Clone, Copy, Debug)]
pub struct EventPath {
    /// Chance an event is lost.
    pub drop: f64,
    /// Of the lost ones, the chance the loss is known (a full ring's
    /// counter), which makes the next batch resync at once.
    pub drop_detected: f64,
    /// Chance an event is delivered twice.
    pub duplicate: f64,
    /// Chance an event is held back to a later batch.
    pub delay: f64,
}

impl EventPath {
    /// Every event, once, in order.
    pub const PERFECT: Self = Self {
        drop: 0.0,
        drop_detected: 0.0,
        duplicate: 0.0,
        delay: 0.0,
    };
}

/// One run.
#[derive(Clone, Copy, Debug)]
pub struct HostEventsConfig {
    pub seed: u64,
    /// Host changes (each a batch of events delivered after it).
    pub steps: usize,
    /// Distinct files the host's programs map.
    pub files: u64,
    /// Pids are drawn from `1..=pids`, so that they are reused.
    pub pids: i32,
    pub path: EventPath,
    /// A full resync every this many batches.
    pub resync_every: usize,
}

/// What a run saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostEventsReport {
    pub events: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub resyncs: u64,
    /// Processes a resync found the table wrong about in a way events
    /// report: a process missing or extra, or a file mapped and not held.
    pub corrections: u64,
    /// Processes a resync found still holding files they no longer map: an
    /// unmap has no event (see `bpf/events.bpf.c`), so this is routine.
    pub unmapped: u64,
    /// Process reads (one per named process per batch).
    pub reads: u64,
    /// Processes gone before they could be read.
    pub vanished: u64,
    /// Resyncs that found the vDSO loaded, and that found it unloaded
    /// (the host empty): both happen in a run that empties the host.
    pub vdso_loaded: u64,
    pub vdso_unloaded: u64,
}

/// One process of the host: a start time (a reused pid is another
/// process) and the files it maps.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Process {
    start: u64,
    files: BTreeSet<FileId>,
}

/// What one read of a process changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    None,
    /// Only files released that the process no longer maps.
    Unmapped,
    /// A process or a mapped file the table had missed.
    Missed,
}

type Manager = ExecutableInfoManager<Arc<MemoryProvider>, SimMaps>;

struct Run {
    rng: SimRng,
    config: HostEventsConfig,
    host: BTreeMap<i32, Process>,
    clock: u64,
    /// Events emitted, not yet delivered.
    pending: VecDeque<HostEvent>,
    table: BTreeMap<i32, Process>,
    manager: Manager,
    report: HostEventsReport,
    loss_known: bool,
}

fn file(n: u64) -> FileId {
    FileId(0xf11e_0000 + n)
}

/// The vDSO's file id: the same image in every process.
const VDSO: FileId = FileId(0x7d50_0000);

impl Run {
    fn new(config: HostEventsConfig) -> Self {
        let provider = Arc::new(MemoryProvider::new());
        for n in 0..config.files {
            let base = 0x10_0000 + n * 0x1000;
            provider.insert(
                file(n),
                deltas(&[
                    (base, hint::KEEP, 8 * (n as i32 + 1)),
                    (base + 0x100, hint::GAP, 0),
                ]),
            );
        }
        provider.insert(
            VDSO,
            deltas(&[(0x1000, hint::KEEP, 16), (0x1800, hint::GAP, 0)]),
        );
        let maps = SimMaps::new(SimConfig::default()).unwrap_or_else(|e| panic!("sim maps: {e}"));
        Self {
            rng: SimRng::new(config.seed, Stream::Workload),
            config,
            host: BTreeMap::new(),
            clock: 0,
            pending: VecDeque::new(),
            table: BTreeMap::new(),
            manager: ExecutableInfoManager::with_config(
                provider,
                maps,
                Tracers::none(),
                Config::default(),
                Box::new(Arc::new(ManualClock::new())),
            ),
            report: HostEventsReport::default(),
            loss_known: false,
        }
    }

    fn emit(&mut self, event: HostEvent) {
        self.report.events += 1;
        self.pending.push_back(event);
    }

    /// What an exec maps: a few files, and the vDSO.
    fn some_files(&mut self) -> BTreeSet<FileId> {
        let n = self.rng.range(1, 4);
        (0..n)
            .map(|_| file(self.rng.below(self.config.files)))
            .chain([VDSO])
            .collect()
    }

    /// One change of the host and the events it causes.
    fn change(&mut self) {
        self.clock += 1;
        let pid = self.rng.range(1, self.config.pids as u64) as i32;
        let alive = self.host.contains_key(&pid);
        match (alive, self.rng.weighted(&[3, 3, 2, 3])) {
            (false, _) => {
                // A fork of a live process (its files), or of one outside.
                let parent = self.host.keys().next().copied();
                let files = match parent.and_then(|p| self.host.get(&p)) {
                    Some(p) => p.files.clone(),
                    None => BTreeSet::from([VDSO]),
                };
                self.host.insert(
                    pid,
                    Process {
                        start: self.clock,
                        files,
                    },
                );
                self.emit(HostEvent::Fork {
                    pid,
                    parent: parent.unwrap_or(0),
                });
            }
            (true, 0) => {
                let files = self.some_files();
                if let Some(p) = self.host.get_mut(&pid) {
                    p.files = files.clone();
                }
                self.emit(HostEvent::Exec { pid });
                for _ in &files {
                    self.emit(HostEvent::Map {
                        pid,
                        addr: 0x7f00_0000,
                        len: 0x1000,
                    });
                }
            }
            (true, 1) => {
                let f = file(self.rng.below(self.config.files));
                if let Some(p) = self.host.get_mut(&pid) {
                    p.files.insert(f);
                }
                self.emit(HostEvent::Map {
                    pid,
                    addr: 0x7f10_0000,
                    len: 0x1000,
                });
            }
            (true, 2) => {
                // An unmap has no event: it is found at the next read. The
                // vDSO stays mapped until the process exits.
                let victim = self
                    .host
                    .get(&pid)
                    .and_then(|p| p.files.iter().find(|f| **f != VDSO).copied());
                if let (Some(p), Some(f)) = (self.host.get_mut(&pid), victim) {
                    p.files.remove(&f);
                }
            }
            (true, _) => {
                self.host.remove(&pid);
                self.emit(HostEvent::Exit { pid });
            }
        }
    }

    /// The events delivered now, through the hostile path.
    fn deliver(&mut self) -> Vec<HostEvent> {
        let path = self.config.path;
        let mut batch = Vec::new();
        let mut held = VecDeque::new();
        while let Some(e) = self.pending.pop_front() {
            if self.rng.chance(path.drop) {
                self.report.dropped += 1;
                if self.rng.chance(path.drop_detected) {
                    self.loss_known = true;
                }
                continue;
            }
            if self.rng.chance(path.delay) {
                held.push_back(e);
                continue;
            }
            batch.push(e);
            if self.rng.chance(path.duplicate) {
                batch.push(e);
            }
        }
        self.pending = held;
        self.report.delivered += batch.len() as u64;
        batch
    }

    /// Reads process `pid` from the host as `/proc` would show it and
    /// makes the table and the references agree; says what it changed.
    fn read(&mut self, pid: i32) -> Result<Change, String> {
        self.report.reads += 1;
        let now = self.host.get(&pid).cloned();
        let before = self.table.get(&pid).cloned();
        if now.is_none() && before.is_none() {
            self.report.vanished += 1;
            return Ok(Change::None);
        }
        if now == before {
            return Ok(Change::None);
        }
        let same_process = matches!((&now, &before), (Some(n), Some(b)) if n.start == b.start);
        let held = before.map(|b| b.files).unwrap_or_default();
        let mapped = now.as_ref().map(|n| n.files.clone()).unwrap_or_default();
        let (take, release): (Vec<FileId>, Vec<FileId>) = if same_process {
            (
                mapped.difference(&held).copied().collect(),
                held.difference(&mapped).copied().collect(),
            )
        } else {
            (
                mapped.iter().copied().collect(),
                held.iter().copied().collect(),
            )
        };
        // Takes first: a file passing from the old process to the new one
        // is not unloaded and loaded again.
        for id in take {
            self.manager
                .add_or_inc_ref(id, &id)
                .map_err(|e| format!("taking {id} for pid {pid}: {e}"))?;
        }
        for id in release {
            self.manager
                .remove_or_dec_ref(id)
                .map_err(|e| format!("releasing {id} of pid {pid}: {e}"))?;
        }
        let change = if same_process && mapped.is_subset(&held) {
            Change::Unmapped
        } else {
            Change::Missed
        };
        match now {
            Some(p) => self.table.insert(pid, p),
            None => self.table.remove(&pid),
        };
        Ok(change)
    }

    /// Reads every process the events name.
    fn follow(&mut self, events: &[HostEvent]) -> Result<(), String> {
        let work = coalesce(events);
        for pid in work.refresh.iter().chain(&work.exited) {
            self.read(*pid)?;
        }
        Ok(())
    }

    /// A full read of the host, after what is still in flight was followed
    /// (as the host side drains its ring first): what it changes, events
    /// missed.
    fn resync(&mut self) -> Result<(), String> {
        let rest: Vec<HostEvent> = self.pending.drain(..).collect();
        self.report.delivered += rest.len() as u64;
        self.follow(&rest)?;
        self.report.resyncs += 1;
        let pids: BTreeSet<i32> = self.host.keys().chain(self.table.keys()).copied().collect();
        for pid in pids {
            match self.read(pid)? {
                Change::None => {}
                Change::Unmapped => self.report.unmapped += 1,
                Change::Missed => self.report.corrections += 1,
            }
        }
        self.check()?;
        if self.manager.state().files.contains_key(&VDSO) {
            self.report.vdso_loaded += 1;
        } else {
            self.report.vdso_unloaded += 1;
        }
        Ok(())
    }

    /// The table is the host, the references its mappings, the maps the
    /// references.
    fn check(&self) -> Result<(), String> {
        if self.table != self.host {
            return Err(format!(
                "seed {}: the table is not the host after a resync",
                self.config.seed
            ));
        }
        let mut want: BTreeMap<FileId, u64> = BTreeMap::new();
        for p in self.host.values() {
            for f in &p.files {
                *want.entry(*f).or_default() += 1;
            }
        }
        if want.get(&VDSO).copied().unwrap_or(0) != self.host.len() as u64 {
            return Err(format!(
                "seed {}: the host model has a process without the vDSO",
                self.config.seed
            ));
        }
        let state = self.manager.state();
        let have: BTreeMap<FileId, u64> = state.files.iter().map(|(id, e)| (*id, e.rc)).collect();
        if have != want {
            return Err(format!(
                "seed {}: reference counts {have:?}, the host maps {want:?}",
                self.config.seed
            ));
        }
        let maps = self.manager.with_backend(|b| b.clone());
        check_projection(&state, &maps).map_err(|v| format!("seed {}: {v}", self.config.seed))
    }
}

/// Runs the workload; an error names the seed and what diverged.
pub fn run(config: HostEventsConfig) -> Result<HostEventsReport, String> {
    let mut r = Run::new(config);
    for batch_no in 1..=config.steps {
        // A few changes, then what the path delivers of their events.
        for _ in 0..r.rng.range(1, 3) {
            r.change();
        }
        let batch = r.deliver();
        r.follow(&batch)?;
        if std::mem::take(&mut r.loss_known) || batch_no % config.resync_every.max(1) == 0 {
            r.resync()?;
        }
    }
    r.resync()?;
    Ok(r.report)
}
