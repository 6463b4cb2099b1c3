//! The simulator's backend: [`SimMaps`] with seeded fault injection and a
//! reader-safety check after every op, proportionate to what the op did.
//!
//! Faults. Before each op a die is rolled at the fault rate (at the higher
//! recovery rate once the action has seen a fault, so that its rollback and
//! its leftover retries fail too, at any depth); on a hit the op
//! fails with one of the errnos the map syscalls return (ENOMEM, E2BIG,
//! EEXIST, ENOENT, EINVAL, EBUSY), either whole (`done = 0`) or, for a batch,
//! after a random number of elements. Every injected failure is one a real
//! kernel could give for the state the maps are in:
//! * ENOENT from a delete tells the driver "element `done` was already
//!   gone", and the driver believes it. So an injected ENOENT on a delete
//!   first removes that element (as if it had vanished just before): the
//!   report is then true. Anywhere else ENOENT says nothing about contents.
//! * EEXIST from a put names a present key; the machine does not take it as
//!   "already written" but rolls back what the op did, so an injected EEXIST
//!   is safe without making the key present.
//!
//! The die is reseeded by each action ([`FaultyBackend::begin`]), so a shrunk trace
//! keeps the faults of the actions it keeps.
//!
//! Checks after each op (successful or failed), on the pages the op could
//! have changed for a reader, with [`Sampling`]:
//! * page ops: the op's keys that are present;
//! * table ops: every page entry of the op's files;
//! * slot writes: for every slot whose non-zero rule changed, every page of
//!   every published table that references the slot, all deltas (a correct
//!   machine never has such a table, so this costs nothing unless broken).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::Clock;
use eim_machine::abi::{StackDeltaPageKey, UnwindInfo, DELTA_COMMAND_FLAG};
use eim_machine::ops::{Backend, Errno, MapOp, OpFailure};
use eim_machine::FileId;
use sha2::{Digest, Sha256};

use crate::checker::{Sources, Violation};
use crate::rng::SimRng;
use crate::sampled::{check_pages_safe, present_pages, Sampling};
use crate::slot_watch::SlotWatch;
use eim_sim::faults::element_file;
use eim_sim::kernel::SimMaps;

/// The errnos injected, in the order a fault draws them.
pub const ERRNOS: [Errno; 6] = [
    Errno::ENOMEM,
    Errno::E2BIG,
    Errno::EEXIST,
    Errno::ENOENT,
    Errno::EINVAL,
    Errno::EBUSY,
];

/// Counters of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultyStats {
    pub ops: u64,
    pub faults: u64,
    pub stopped_batches: u64,
    pub checked_pages: u64,
    /// Faults that made one file's writes fail for the rest of a step.
    pub poisoned: u64,
    /// Faults injected after an earlier fault of the same action: into a
    /// rollback, an isolation retry or a leftover retry.
    pub recovery_faults: u64,
    /// The most faults injected into one action.
    pub deepest: u64,
}

/// [`SimMaps`] plus faults and per-op checks.
#[derive(Debug)]
pub struct FaultyBackend {
    pub maps: SimMaps,
    sources: Arc<Sources>,
    rate: f64,
    /// The fault rate once an action has seen a fault (see
    /// [`crate::profile::Profile::recovery_fault_rate`]); 0: as `rate`.
    pub recovery_rate: f64,
    dice: SimRng,
    sampling: Sampling,
    pub stats: FaultyStats,
    /// Faults injected since [`FaultyBackend::begin`].
    faults_now: u64,
    /// The first violation, with the op after which it was seen.
    violation: Option<(String, Violation)>,
    /// Files whose entries were written since [`FaultyBackend::begin`].
    touched: BTreeSet<FileId>,
    /// Slots each published table references, by inner map id (a
    /// published table never changes, and ids are never reused).
    table_slots: HashMap<u32, Arc<BTreeSet<u16>>>,
    digest: Sha256,
    /// Self-test of the simulator: ops with this name report success and
    /// do nothing (a backend that loses writes), which the checks must
    /// notice.
    pub sabotage: Option<&'static str>,
    /// Invariant 6: no slot changes its rule while a reader may still
    /// reach it (on the manager's clock).
    slot_watch: Option<SlotWatch>,
    /// Ops left before the daemon dies ([`FaultyBackend::arm_crash`]).
    crash_in: Option<u64>,
    /// The daemon died: every op fails without effect until
    /// [`FaultyBackend::revive`].
    dead: bool,
    /// When (on the slot watch's clock, the manager's) an op last wrote a
    /// zero into a slot: the record a warm restart reads, as the kernel
    /// backend keeps it in the pin directory's lock file
    /// (`Observed::zeroed_ago`).
    zeroed_at: Option<eim_machine::machine::Timestamp>,
}

impl FaultyBackend {
    pub fn new(maps: SimMaps, sources: Arc<Sources>, rate: f64, sampling: Sampling) -> Self {
        Self {
            maps,
            sources,
            rate,
            recovery_rate: 0.0,
            dice: SimRng::from_parts(0, 0),
            sampling,
            stats: FaultyStats::default(),
            faults_now: 0,
            violation: None,
            touched: BTreeSet::new(),
            table_slots: HashMap::new(),
            digest: Sha256::new(),
            sabotage: None,
            slot_watch: None,
            crash_in: None,
            dead: false,
            zeroed_at: None,
        }
    }

    /// How long ago an op last wrote a zero into a slot (`Duration::MAX`:
    /// never); `None` without a clock, as for a backend that keeps no record.
    pub fn zeroed_ago(&self) -> Option<Duration> {
        let now = self.slot_watch.as_ref()?.now();
        Some(match self.zeroed_at {
            Some(at) => now.0.saturating_sub(at.0),
            None => Duration::MAX,
        })
    }

    /// The daemon dies at its `ops`-th next op: that op takes effect for a
    /// random prefix of its elements (all, none or part of a batch), and
    /// every later op fails without effect, as for a process that is gone.
    pub fn arm_crash(&mut self, ops: u64) {
        self.crash_in = Some(ops);
    }

    /// Whether the daemon died.
    pub fn crashed(&self) -> bool {
        self.dead
    }

    /// A new daemon owns the maps.
    pub fn revive(&mut self) {
        self.dead = false;
        self.crash_in = None;
    }

    /// The outcome of `op` if the daemon is dead or dies at it.
    fn crash_point(&mut self, op: &MapOp) -> Option<Result<(), OpFailure>> {
        // What the dead daemon's code still does reaches nothing; it counts
        // as a fault so that the API model expects the errors it returns.
        let fail = |done| Err(OpFailure::new(Errno::EBADF, done));
        if self.dead {
            self.faults_now += 1;
            return Some(fail(0));
        }
        match self.crash_in? {
            0 => {
                self.crash_in = None;
                self.dead = true;
                self.faults_now += 1;
                let done = self.dice.index(op.len() + 1);
                let result = match op.head(done) {
                    Some(head) if done > 0 => self.maps.apply(&head),
                    _ => Ok(()),
                };
                Some(result.and(fail(done)))
            }
            left => {
                self.crash_in = Some(left - 1);
                None
            }
        }
    }

    /// Also checks, after every op, that no `unwind_info_array` slot got a
    /// different rule less than `grace` (by `clock`, the manager's) after a
    /// published table last referenced it.
    pub fn watch_slots(&mut self, clock: Arc<dyn Clock>, grace: Duration) {
        self.slot_watch = Some(SlotWatch::new(clock, grace));
    }

    /// Starts an action: its own fault die, fresh counters, no file
    /// poisoned.
    pub fn begin(&mut self, fault_seed: u64) {
        self.maps.clear_poison();
        self.dice = SimRng::from_parts(fault_seed, 0xfa17);
        self.faults_now = 0;
        self.touched.clear();
    }

    /// Faults injected since [`FaultyBackend::begin`].
    pub fn faults_now(&self) -> u64 {
        self.faults_now
    }

    /// Files whose entries were written since [`FaultyBackend::begin`].
    pub fn touched(&self) -> &BTreeSet<FileId> {
        &self.touched
    }

    /// The first violation seen after an op, and the op.
    pub fn violation(&self) -> Option<&(String, Violation)> {
        self.violation.as_ref()
    }

    /// Adds what the caller saw to the run's digest.
    pub fn record(&mut self, what: &str) {
        self.digest.update(what.as_bytes());
        self.digest.update([0]);
    }

    /// The digest of every op, its outcome and everything recorded.
    pub fn digest(&self) -> String {
        self.digest
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Rolls the die for the next op, at the recovery rate once the action
    /// has seen a fault.
    fn fault_due(&mut self) -> bool {
        let rate = match self.faults_now {
            0 => self.rate,
            _ => self.rate.max(self.recovery_rate),
        };
        rate > 0.0 && self.dice.chance(rate)
    }

    fn inject(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        self.stats.faults += 1;
        if self.faults_now > 0 {
            self.stats.recovery_faults += 1;
        }
        self.faults_now += 1;
        self.stats.deepest = self.stats.deepest.max(self.faults_now);
        let errno = ERRNOS[self.dice.index(ERRNOS.len())];
        let len = op.len();
        // A resource error tied to one element of a big batch (its table
        // too big for what is left, the memory its array needs): that
        // file's writes fail for the rest of the step, however the manager
        // retries, and the rest of the batch must still load.
        if errno.may_pass_in_part() && len >= 2 && self.dice.chance(0.3) {
            if let Some(file) = element_file(op, self.dice.index(len)) {
                self.stats.poisoned += 1;
                self.maps.poison_file(file, errno);
                return self.maps.apply(op);
            }
        }
        let after = if len >= 2 && self.dice.chance(0.5) {
            self.stats.stopped_batches += 1;
            self.dice.range(1, len as u64 - 1) as usize
        } else {
            0
        };
        if errno == Errno::ENOENT && op.is_delete() && len > 0 {
            // True by construction: element `after` goes first.
            return match op.head(after + 1) {
                Some(head) => self
                    .maps
                    .apply(&head)
                    .and(Err(OpFailure::new(errno, after))),
                None => Err(OpFailure::new(errno, 0)),
            };
        }
        if after == 0 {
            self.maps.fail_op(0, errno);
        } else {
            self.maps.stop_batch(0, after, errno);
        }
        self.maps.apply(op)
    }

    /// The slots `op` writes and what they held before.
    fn slots_before(&self, op: &MapOp) -> Vec<(u16, UnwindInfo, UnwindInfo)> {
        match op {
            MapOp::PutUnwindInfos(v) => v
                .iter()
                .filter_map(|(slot, new)| {
                    let old = self.maps.unwind_info(u32::from(*slot))?;
                    (old != UnwindInfo::default() && old != *new).then_some((*slot, old, *new))
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Files with a published table that references one of `slots`.
    fn users_of(&mut self, slots: &BTreeSet<u16>) -> Vec<FileId> {
        let mut users = Vec::new();
        let mut alive = BTreeSet::new();
        let tables: Vec<(u16, FileId)> = self.maps.delta_tables().into_keys().collect();
        for (class, file_id) in tables {
            let Some(id) = self.inner_id(class, file_id) else {
                continue;
            };
            alive.insert(id);
            let used = match self.table_slots.get(&id) {
                Some(used) => used.clone(),
                None => {
                    let used: BTreeSet<u16> = self
                        .maps
                        .delta_table(class, file_id)
                        .map(|t| t.entries())
                        .unwrap_or_default()
                        .iter()
                        .filter(|d| d.unwind_info & DELTA_COMMAND_FLAG == 0)
                        .map(|d| d.unwind_info)
                        .collect();
                    let used = Arc::new(used);
                    self.table_slots.insert(id, used.clone());
                    used
                }
            };
            if !used.is_disjoint(slots) {
                users.push(file_id);
            }
        }
        // Forget the tables that are gone.
        self.table_slots.retain(|id, _| alive.contains(id));
        users
    }

    fn inner_id(&self, class: u16, file_id: FileId) -> Option<u32> {
        let outer = self.maps.outer(class)?;
        let value = self
            .maps
            .registry()
            .lookup(outer, &file_id.0.to_le_bytes())
            .ok()?;
        Some(u32::from_le_bytes(value.get(..4)?.try_into().ok()?))
    }

    fn check_after(&mut self, op: &MapOp, overwritten: &[(u16, UnwindInfo, UnwindInfo)]) {
        let mut keys: Vec<StackDeltaPageKey> = Vec::new();
        let mut full: Vec<StackDeltaPageKey> = Vec::new();
        match op {
            MapOp::PutPages(v) => keys.extend(v.iter().map(|(k, _)| *k)),
            MapOp::DeletePages(v) => keys.extend(v.iter().copied()),
            MapOp::PutDeltaTable { file_id, .. } | MapOp::DeleteDeltaTable { file_id, .. } => {
                keys = present_pages(&self.maps, &self.sources, *file_id);
                self.touched.insert(*file_id);
            }
            MapOp::PutDeltaTables { tables, .. } => {
                for (file_id, _) in tables {
                    keys.extend(present_pages(&self.maps, &self.sources, *file_id));
                    self.touched.insert(*file_id);
                }
            }
            MapOp::PutUnwindInfos(_) if !overwritten.is_empty() => {
                let slots = overwritten.iter().map(|(s, _, _)| *s).collect();
                for file_id in self.users_of(&slots) {
                    full.extend(present_pages(&self.maps, &self.sources, file_id));
                    self.touched.insert(file_id);
                }
            }
            _ => {}
        }
        self.touched.extend(keys.iter().map(|k| FileId(k.file_id)));
        self.stats.checked_pages += (keys.len() + full.len()) as u64;
        let sampling = self.sampling.rotated(self.stats.ops);
        let result = check_pages_safe(&self.maps, &self.sources, &keys, sampling)
            .and_then(|()| check_pages_safe(&self.maps, &self.sources, &full, Sampling::ALL));
        if let Err(v) = result {
            self.violation = Some((format!("{op:?}"), v));
        }
    }
}

impl Backend for FaultyBackend {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        self.stats.ops += 1;
        if let Some(watch) = &mut self.slot_watch {
            if SlotWatch::wants_observation(op) {
                watch.observe(&self.maps);
            }
        }
        let overwritten = self.slots_before(op);
        // Recorded before the write, as the kernel backend records it
        // before the syscall: a crash during the op leaves the record.
        if let (MapOp::PutUnwindInfos(v), Some(watch), false) = (op, &self.slot_watch, self.dead) {
            if v.iter().any(|(_, info)| *info == UnwindInfo::default()) {
                self.zeroed_at = Some(watch.now());
            }
        }
        let result = if self.sabotage == Some(op.name()) {
            Ok(())
        } else if let Some(result) = self.crash_point(op) {
            result
        } else if self.fault_due() {
            self.inject(op)
        } else {
            let poisoned_before = self.maps.poison_hits();
            let result = self.maps.apply(op);
            // A poisoned file's write failing again is the same injected
            // fault: the API model must expect its error.
            if self.maps.poison_hits() > poisoned_before {
                self.faults_now += 1;
            }
            result
        };
        self.digest.update(op.name().as_bytes());
        self.digest.update((op.len() as u64).to_le_bytes());
        match &result {
            Ok(()) => self.digest.update([0xff]),
            Err(f) => {
                self.digest.update(f.errno.0.to_le_bytes());
                self.digest.update((f.done as u64).to_le_bytes());
            }
        }
        if self.violation.is_none() {
            if let Some(Err(v)) = self
                .slot_watch
                .as_ref()
                .map(|w| w.check_write(&self.maps, op))
            {
                self.violation = Some((format!("{op:?}"), v));
            }
        }
        if self.violation.is_none() {
            self.check_after(op, &overwritten);
        }
        result
    }
}
