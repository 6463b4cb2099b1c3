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
//!    [`eim_core::ExecutableInfoManager::load_many`], in batches of at most
//!    [`HostConfig::batch_files`] distinct files, each kept open from its
//!    opening to its load (a full batch is loaded before another file is
//!    opened, part-way through a process if need be): each distinct file
//!    is extracted once per batch however many processes map it (and not
//!    at all if the manager knows it), and the new tables of a batch are
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
use std::time::{Duration, Instant};

use eim_analysis::elf::fileid::FileId128;
use eim_core::Error;
use eim_machine::abi::ProcessMapping;
use eim_machine::ops::MapOp;
use eim_machine::process_maps::ProcessMapTable;
use eim_machine::tracking::Work;
use eim_machine::FileId;

use crate::files::counting::HostFile;
use crate::files::segments;
use crate::findings::{cause_of, FileRecord, Phases, Problem, ProblemKind};
use crate::host::claims::{Admit, Candidate, Claims, FileKey, State, Verdict};
use crate::host::collide;
use crate::host::mappings::{MappingKey, ProcessEntry, Resolution};
use crate::host::open::{self, Identity, OpenError};
use crate::host::procs::{self, ExecMapping, ListError, ProcessError};
use crate::map_view::Inspect;
use crate::ElfFileRef;

mod identify;
mod restart;

pub use super::model::{Host, HostConfig, HostManager, Missed, Progress, Quiet, StepReport};
pub use restart::{NotRestarted, RestartFailed};

use super::model::StepClock;

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
/// the references to release once the loads are done. Every file has a
/// reference: a file goes in with the first one asked of it.
#[derive(Default)]
struct Batch {
    refs: Vec<(i32, FileId)>,
    files: HashMap<FileId, HostFile>,
    releases: Vec<FileId>,
}

/// The process a step is reading: its entry, out of the table meanwhile,
/// the files the read asked a reference on (queued in the batch, or
/// loaded by a batch that filled during the read), each asked once, and
/// the first mapping of each file (device, inode) the read resolved.
struct Reading {
    pid: i32,
    entry: ProcessEntry,
    asked: HashSet<FileId>,
    files: HashMap<((u32, u32), u64), MappingKey>,
}

impl Reading {
    /// What this read resolved another mapping of `m`'s file to, unless
    /// an eviction has forgotten it since.
    fn resolved_file(&self, m: &ExecMapping) -> Option<Resolution> {
        let first = self.files.get(&(m.dev, m.inode))?;
        self.entry.mappings.get(first).copied()
    }
}

impl<B: Inspect> Host<B> {
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
                self.flush(&mut batch, progress, &mut report, None);
            }
            progress.advance();
        }
        self.flush(&mut batch, progress, &mut report, None);
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
            self.flush(batch, progress, report, None);
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

    /// Reads process `pid` and queues the references it needs, each with
    /// its file open as it is identified, loading the batch whenever it is
    /// full (part-way through the process if need be): a process mapping
    /// more files than a batch holds never has more of them open at once,
    /// and no file is closed for want of room and opened again. `again`: a
    /// read of the end of a pass ([`Self::revisit_waiting`]), whose changes
    /// are eim's own, not something host events missed.
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
        // The vDSO is loaded as a file is (`host::vdso`).
        let loadable: Vec<ExecMapping> = mappings.loadable().cloned().collect();
        let known = self
            .processes
            .get(pid)
            .is_some_and(|e| e.start_time == start_time);
        // Room for every file this read may open, made before the read: a
        // process whose files fit in a batch is loaded in one.
        let opening = self.files_to_open(pid, start_time, &loadable);
        if opening > 0 && batch.files.len() + opening > self.batch_limit() {
            self.flush(batch, progress, report, None);
        }
        let (entry, replaced) = self.processes.take(pid, start_time);
        let mut reading = Reading {
            pid,
            entry,
            asked: HashSet::new(),
            files: HashMap::new(),
        };
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
            report.file_mappings += mappings.loadable().count();
            report.anonymous_mappings += mappings.anonymous;
            if !mappings.files.is_empty() {
                report.with_files += 1;
            }
        }
        let mut current = HashSet::with_capacity(loadable.len());
        // Mappings not seen before in this process: an mmap event names each.
        let mut new_mappings = 0;
        for m in &loadable {
            let key = MappingKey::of(m);
            current.insert(key);
            let cached = reading
                .entry
                .mappings
                .get(&key)
                .copied()
                .filter(|_| self.is_resolved(&reading.entry, &key));
            let resolved = match cached {
                Some(r) => Resolved::Mapping(r),
                None => {
                    if !reading.entry.mappings.contains_key(&key) {
                        new_mappings += 1;
                    }
                    // Another mapping of a file this read opened (a file
                    // with two executable segments) is not opened again.
                    match reading.resolved_file(m) {
                        Some(r) => Resolved::Mapping(r),
                        None => {
                            let resolved = self.resolve(m, batch, &mut reading, progress, report);
                            if matches!(resolved, Resolved::Mapping(_)) {
                                reading.files.insert((m.dev, m.inode), key);
                            }
                            resolved
                        }
                    }
                }
            };
            match resolved {
                Resolved::Mapping(r) => {
                    reading.entry.mappings.insert(key, r);
                }
                // Not cached, so a later read tries again if it is still
                // there.
                Resolved::Gone => {
                    reading.entry.mappings.remove(&key);
                    self.counters.files_vanished += 1;
                }
                Resolved::Wait => {
                    reading.entry.mappings.remove(&key);
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
        let Reading { mut entry, .. } = reading;
        entry.keep_mappings(&current);
        // From the resolutions as they stand after the loop: an owner
        // evicted during it took its earlier mappings' resolutions along.
        let mapped: BTreeSet<FileId> = loadable
            .iter()
            .filter_map(|m| match entry.mappings.get(&MappingKey::of(m)) {
                Some(Resolution::File(id)) => Some(*id),
                _ => None,
            })
            .collect();
        let list = self.process_mapping_list(&entry, &loadable);
        if let Some(op) = self.process_maps.set(pid as u32, list) {
            self.apply_process_op(op);
        }
        // What it takes was queued as each file was resolved (a file it
        // neither holds nor was asked now is deferred, or failed in a batch
        // loaded during this read: not asked again before the next read).
        for id in entry.changes(&mapped).release {
            entry.held.remove(&id);
            batch.releases.push(id);
        }
        // Back in the table before the loads of what it queued: they
        // record in its entry what it took.
        self.processes.put(pid, entry);
        Ok(())
    }

    /// Loads a batch: one `load_many` call for all its references.
    /// `reading`: the process being read, whose entry is out of the table
    /// meanwhile (what it takes is recorded there).
    fn flush(
        &mut self,
        batch: &mut Batch,
        progress: &mut dyn Progress,
        report: &mut StepReport,
        mut reading: Option<&mut Reading>,
    ) {
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
                    let entry = match reading.as_deref_mut() {
                        Some(r) if r.pid == pid => Some(&mut r.entry),
                        _ => self.processes.get_mut(pid),
                    };
                    if let Some(entry) = entry {
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
    /// writes it again, a full pass deletes it if the process is gone. The
    /// manager writes it through the driver (a delete of an absent entry
    /// is no failure there).
    fn apply_process_op(&mut self, op: MapOp) {
        let pid = match &op {
            MapOp::PutProcessMappings { pid, .. } | MapOp::DeleteProcessMappings { pid } => *pid,
            _ => return,
        };
        self.counters.process_mappings_written += 1;
        match self.manager.apply_process_op(&op) {
            Ok(()) => {}
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
        let Some(m) = mappings.loadable().find(|m| m.contains(address)).cloned() else {
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
