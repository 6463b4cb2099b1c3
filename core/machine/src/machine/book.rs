//! The kernel book: everything eim has written to the kernel maps, and the
//! plans that change it.
//!
//! The book is the machine's model of the kernel. It hands out
//! `unwind_info_array` slots, checks capacities before anything is written,
//! turns a file's deltas into a load plan, turns a partial failure into the
//! exact compensating ops, and remembers every entry it could not remove
//! (`leftovers`) until a later retry removes it. It never touches a map: the
//! caller applies the ops and reports how far the backend got.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::abi::{self, OffsetRange, StackDeltaPageKey, UnwindInfo, PAGE_BITS};
use crate::deltas::IntervalData;
use crate::encode::{self, EncodeError, KernelTable};
use crate::machine::slots::{Reclaimed, UnwindSlots, DEFAULT_SLOT_GRACE};
use crate::machine::Timestamp;
use crate::ops::{MapKind, MapOp, OpFailure};
use crate::FileId;

/// Map capacities the book enforces before writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    pub unwind_slots: u32,
    pub pages: u32,
    /// Entries of each `exe_id_to_N_stack_deltas` outer map.
    pub outer_entries: u32,
    pub interpreter_offsets: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            unwind_slots: abi::capacity::UNWIND_INFO,
            pages: abi::capacity::PAGES,
            outer_entries: abi::capacity::OUTER,
            interpreter_offsets: abi::capacity::INTERPRETER_OFFSETS,
        }
    }
}

/// Where a loaded file's table lives. `map_id == 0`: nothing was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapRef {
    /// Page-aligned address of the first page.
    pub start_page: u64,
    /// Pages from the first to the last delta (upstream's `NumPages`).
    pub num_pages: u32,
    /// Page entries written: `num_pages` minus the dead pages (see
    /// [`encode::Draft::dead_pages`]). The page gauge counts these.
    pub page_entries: u32,
    pub map_id: u16,
    /// Entries of its delta table (the kernel deltas, after merging; the
    /// rest of the `2^map_id` array is zero), for reports.
    pub deltas: u32,
}

/// A file whose table is in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedTable {
    pub map_ref: MapRef,
    /// The distinct `unwind_info_array` slots its table uses.
    pub slots: Box<[u16]>,
    /// The dead pages of its span, which have no entry (page-aligned
    /// ranges in address order).
    pub dead_pages: Box<[Range<u64>]>,
}

impl LoadedTable {
    /// The keys of exactly the page entries its load wrote, in address
    /// order: every page of the span except the dead ones.
    pub fn page_keys(&self, file_id: FileId) -> impl Iterator<Item = StackDeltaPageKey> + '_ {
        let start = self.map_ref.start_page;
        (0..u64::from(self.map_ref.num_pages))
            .map(move |p| start + (p << PAGE_BITS))
            .filter(|page| !encode::is_dead_page(&self.dead_pages, *page))
            .map(move |page| StackDeltaPageKey {
                file_id: file_id.0,
                page,
            })
    }
}

/// Why a plan was refused before anything was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("{map} is full ({capacity} entries)")]
    MapFull { map: MapKind, capacity: u32 },
    #[error("kernel entries of an earlier unload of this file are still being removed")]
    CleanupPending,
    #[error("the file's table is already in the kernel")]
    AlreadyLoaded,
}

/// The ops that load one file, and what the book reserved for them.
#[derive(Clone, Debug)]
pub struct LoadPlan {
    pub file_id: FileId,
    /// In publication order: slots, table, interpreter offsets, pages.
    pub ops: Vec<MapOp>,
    pub map_ref: MapRef,
    /// Gaps of at least 512 KiB, for interpreter loaders.
    pub gaps: Vec<Range<u64>>,
    /// Pages of the span that get no entry (see [`encode::Draft::dead_pages`]).
    pub dead_pages: Vec<Range<u64>>,
    reserved: Reservation,
}

/// The slots a plan took: every slot its table references, the cooling
/// slots it revived (with when they would have been reusable), and the
/// slots it writes (with what a reassigned one held before).
#[derive(Clone, Debug, Default)]
struct Reservation {
    file_id: FileId,
    slots: Box<[u16]>,
    revived: Vec<(u16, Timestamp)>,
    fresh: Vec<(u16, Option<Reclaimed>)>,
    /// The file's `interpreter_offsets` entry, if its loaders need one.
    offsets: Option<OffsetRange>,
}

impl Reservation {
    /// What a file takes before any slot: nothing but its identity and its
    /// offsets entry. One constructor for the files with and without a
    /// table, so neither can lose the file it belongs to.
    fn new(file_id: FileId, offsets: Option<OffsetRange>) -> Self {
        Self {
            file_id,
            offsets,
            ..Self::default()
        }
    }
}

/// Ops that undo the applied part of a failed plan (top-down).
#[derive(Clone, Debug)]
pub struct Rollback {
    pub file_id: FileId,
    pub ops: Vec<MapOp>,
    reserved: Reservation,
    /// Slots of the plan whose write took effect.
    written: Vec<u16>,
    /// The plan's table was published (a reader may have followed it).
    published: bool,
}

/// The ops that unload one file (top-down: pages, interpreter offsets, then
/// the table).
#[derive(Clone, Debug)]
pub struct UnloadPlan {
    pub file_id: FileId,
    pub ops: Vec<MapOp>,
}

/// Where a sequence of ops stopped: op `at`, with `failure.done` of its
/// elements in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub at: usize,
    pub failure: OpFailure,
}

/// One table of a [`MapOp::PutDeltaTables`].
type ClassTable = (FileId, Arc<[abi::StackDelta]>);

/// What the earlier files of a batch reserved (not yet committed).
#[derive(Debug, Default)]
struct Pending {
    files: std::collections::BTreeSet<FileId>,
    pages: u64,
    tables: [u32; abi::SIZE_CLASS_COUNT],
    offsets: u32,
}

/// The ops that load several files at once, and the per-file plans they
/// were built from. The ops are, in publication order: every new slot (one
/// batch), one [`MapOp::PutDeltaTables`] per size class used (class order;
/// each publishes all its tables with one outer-map batch), every page of
/// every file (one batch). A page is therefore never published before the
/// table it names, nor a table before its slots, exactly as for one file.
#[derive(Clone, Debug)]
pub struct LoadManyPlan {
    pub ops: Vec<MapOp>,
    /// The planned files in batch order (an empty file has no ops).
    pub files: Vec<LoadPlan>,
}

/// Ops that undo the applied part of a failed batch (top-down: every page,
/// then every table, then the new slots back to zero), with the file each
/// op belongs to (for the leftovers if the undo fails in turn).
#[derive(Clone, Debug)]
pub struct ManyRollback {
    pub ops: Vec<MapOp>,
    /// The files of the batch (for a `DeletePages` the owner is read from
    /// each key; the slot op has no owner).
    pub files: Vec<FileId>,
    reserved: Vec<Reservation>,
    written: Vec<u16>,
    published: bool,
}

/// The book itself.
#[derive(Clone, Debug)]
pub struct KernelBook {
    caps: Capacities,
    slots: UnwindSlots,
    loaded: BTreeMap<FileId, LoadedTable>,
    pages_in_use: u64,
    tables: [u32; abi::SIZE_CLASS_COUNT],
    /// `interpreter_offsets` entries owned by loaded files (a file may have
    /// one without a table).
    offsets: BTreeMap<FileId, OffsetRange>,
    /// Entries that may still be in the kernel although no loaded file owns
    /// them, as the ops that remove them, in the order they must run.
    leftovers: BTreeMap<FileId, VecDeque<MapOp>>,
    /// The slots referenced by each leftover table (one per file at most:
    /// a file with leftovers cannot be loaded again). They count as users
    /// until the table's removal succeeds.
    leftover_slots: BTreeMap<FileId, Box<[u16]>>,
    /// How long an unreferenced slot cools before another rule may use it.
    grace: Duration,
    /// The latest time the caller has told the book (the book reads no clock).
    now: Timestamp,
}

fn class_index(map_id: u16) -> usize {
    usize::from(map_id.saturating_sub(abi::SIZE_CLASS_MIN)).min(abi::SIZE_CLASS_COUNT - 1)
}

/// The slots a rollback really set back to zero, as far as its ops got.
fn zeroed_slots(ops: &[MapOp], result: Result<(), Stopped>) -> BTreeSet<u16> {
    // The rollback builders put the one slot-zeroing op last, after every
    // table is gone: a rollback that stopped at an earlier op zeroed
    // nothing, one that stopped at that op zeroed the elements before the
    // stop. Looking only at the op the rollback ended with says exactly
    // that, with no guard that could be wrong without a test noticing.
    let (ended_at, in_effect) = match result {
        Ok(()) => (ops.last(), usize::MAX),
        Err(stopped) => (ops.get(stopped.at), stopped.failure.done),
    };
    match ended_at {
        Some(MapOp::PutUnwindInfos(zeros)) => zeros
            .iter()
            .take(in_effect)
            .map(|(slot, _)| *slot)
            .collect(),
        _ => BTreeSet::new(),
    }
}

impl KernelBook {
    /// A book with the default slot grace period ([`DEFAULT_SLOT_GRACE`]).
    pub fn new(caps: Capacities) -> Self {
        Self::with_slot_grace(caps, DEFAULT_SLOT_GRACE)
    }

    /// A book whose unreferenced slots may hold another rule `grace` after
    /// the last table that referenced them was unpublished.
    pub fn with_slot_grace(caps: Capacities, grace: Duration) -> Self {
        Self {
            caps,
            slots: UnwindSlots::new(caps.unwind_slots),
            loaded: BTreeMap::new(),
            pages_in_use: 0,
            tables: [0; abi::SIZE_CLASS_COUNT],
            offsets: BTreeMap::new(),
            leftovers: BTreeMap::new(),
            leftover_slots: BTreeMap::new(),
            grace,
            now: Timestamp::default(),
        }
    }

    /// A book rebuilt at a warm restart ([`crate::machine::reconcile`]):
    /// the adopted files' tables and offsets, the removals still to run as
    /// leftovers (with the slots each stale table references), and the
    /// slots. The gauges are counted from `loaded`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rebuilt(
        caps: Capacities,
        grace: Duration,
        now: Timestamp,
        slots: UnwindSlots,
        loaded: BTreeMap<FileId, LoadedTable>,
        offsets: BTreeMap<FileId, OffsetRange>,
        leftovers: BTreeMap<FileId, VecDeque<MapOp>>,
        leftover_slots: BTreeMap<FileId, Box<[u16]>>,
    ) -> Self {
        let mut tables = [0; abi::SIZE_CLASS_COUNT];
        let mut pages_in_use = 0;
        for table in loaded.values() {
            tables[class_index(table.map_ref.map_id)] += 1;
            pages_in_use += u64::from(table.map_ref.page_entries);
        }
        Self {
            caps,
            slots,
            loaded,
            pages_in_use,
            tables,
            offsets,
            leftovers,
            leftover_slots,
            grace,
            now,
        }
    }

    /// Tells the book the time (monotonic: an earlier time is ignored). The
    /// caller should do so before planning and again before recording an
    /// outcome, so that a slot's cooling starts no earlier than the moment
    /// its last table was really unpublished.
    pub fn advance_to(&mut self, now: Timestamp) {
        self.now = self.now.max(now);
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Slots referenced by each leftover table.
    pub fn leftover_slots(&self) -> &BTreeMap<FileId, Box<[u16]>> {
        &self.leftover_slots
    }

    fn reusable_after_grace(&self) -> Timestamp {
        self.now.after(self.grace)
    }

    pub fn slots(&self) -> &UnwindSlots {
        &self.slots
    }

    pub fn loaded(&self) -> &BTreeMap<FileId, LoadedTable> {
        &self.loaded
    }

    /// Page entries owned by loaded files.
    pub fn pages_in_use(&self) -> u64 {
        self.pages_in_use
    }

    /// Published tables of a size class owned by loaded files.
    pub fn tables_in_class(&self, map_id: u16) -> u32 {
        self.tables[class_index(map_id)]
    }

    /// The `interpreter_offsets` entries of loaded files.
    pub fn interpreter_offsets(&self) -> &BTreeMap<FileId, OffsetRange> {
        &self.offsets
    }

    /// Whether the book holds anything of `file_id` (a table or offsets).
    pub fn is_loaded(&self, file_id: FileId) -> bool {
        self.loaded.contains_key(&file_id) || self.offsets.contains_key(&file_id)
    }

    fn leftover_offsets(&self) -> u32 {
        self.leftover_ops_iter()
            .filter(|op| matches!(op, MapOp::DeleteInterpreterOffsets { .. }))
            .count() as u32
    }

    pub fn leftovers(&self) -> &BTreeMap<FileId, VecDeque<MapOp>> {
        &self.leftovers
    }

    /// Leftover ops still waiting to run.
    pub fn leftover_ops(&self) -> usize {
        self.leftovers.values().map(VecDeque::len).sum()
    }

    fn leftover_pages(&self) -> u64 {
        self.leftover_ops_iter()
            .map(|op| match op {
                MapOp::DeletePages(keys) => keys.len() as u64,
                _ => 0,
            })
            .sum()
    }

    fn leftover_tables(&self, map_id: u16) -> u32 {
        self.leftover_ops_iter()
            .filter(|op| matches!(op, MapOp::DeleteDeltaTable { map_id: m, .. } if *m == map_id))
            .count() as u32
    }

    fn leftover_ops_iter(&self) -> impl Iterator<Item = &MapOp> {
        self.leftovers.values().flatten()
    }

    /// Plans the load of a file. On error nothing was reserved.
    pub fn plan_load(
        &mut self,
        file_id: FileId,
        deltas: &IntervalData,
    ) -> Result<LoadPlan, PlanError> {
        self.plan_one(file_id, deltas, None, &Pending::default())
    }

    /// Plans the load of a file whose interpreter loaders need an
    /// `interpreter_offsets` entry: written after the table and before the
    /// pages, deleted after the pages on unload. A full map refuses the
    /// file before anything is written. On error nothing was reserved.
    pub fn plan_load_with(
        &mut self,
        file_id: FileId,
        deltas: &IntervalData,
        offsets: Option<OffsetRange>,
    ) -> Result<LoadPlan, PlanError> {
        self.plan_one(file_id, deltas, offsets, &Pending::default())
    }

    /// Plans one file, counting `pending` (earlier files of the same batch,
    /// planned but not committed) against the capacities.
    fn plan_one(
        &mut self,
        file_id: FileId,
        deltas: &IntervalData,
        offsets: Option<OffsetRange>,
        pending: &Pending,
    ) -> Result<LoadPlan, PlanError> {
        if self.is_loaded(file_id) || pending.files.contains(&file_id) {
            return Err(PlanError::AlreadyLoaded);
        }
        if self.leftovers.contains_key(&file_id) {
            return Err(PlanError::CleanupPending);
        }
        if offsets.is_some()
            && self.offsets.len() as u64
                + u64::from(self.leftover_offsets())
                + u64::from(pending.offsets)
                >= u64::from(self.caps.interpreter_offsets)
        {
            return Err(PlanError::MapFull {
                map: MapKind::InterpreterOffsets,
                capacity: self.caps.interpreter_offsets,
            });
        }
        let put_offsets = offsets.map(|range| MapOp::PutInterpreterOffsets { file_id, range });
        let Some(draft) = encode::draft(deltas, u64::from(self.caps.pages))? else {
            return Ok(LoadPlan {
                file_id,
                ops: put_offsets.into_iter().collect(),
                map_ref: MapRef::default(),
                gaps: Vec::new(),
                dead_pages: Vec::new(),
                reserved: Reservation::new(file_id, offsets),
            });
        };
        // Only the entries written count against the map's capacity.
        let page_entries = draft.page_entries();
        if self.pages_in_use + self.leftover_pages() + pending.pages + page_entries
            > u64::from(self.caps.pages)
        {
            return Err(PlanError::MapFull {
                map: MapKind::Pages,
                capacity: self.caps.pages,
            });
        }
        let class = draft.map_id;
        if self.tables_in_class(class)
            + self.leftover_tables(class)
            + pending.tables[class_index(class)]
            >= self.caps.outer_entries
        {
            return Err(PlanError::MapFull {
                map: MapKind::DeltaTables(class),
                capacity: self.caps.outer_entries,
            });
        }
        let rules = draft.slot_rules();
        let mut reserved = Reservation::new(file_id, offsets);
        // Rules already in a slot first, so that a cooling slot this file
        // revives is never reassigned to another of its rules.
        let mut missing = Vec::new();
        for rule in &rules {
            match self.slots.slot_of(rule) {
                Some(slot) => {
                    if let Some(at) = self.slots.revive(slot) {
                        reserved.revived.push((slot, at));
                    }
                }
                None => missing.push(*rule),
            }
        }
        for rule in missing {
            match self.slots.allocate(rule, self.now) {
                Some((slot, reclaimed)) => reserved.fresh.push((slot, reclaimed)),
                None => {
                    self.unreserve(&reserved);
                    return Err(PlanError::MapFull {
                        map: MapKind::UnwindInfo,
                        capacity: self.slots.capacity(),
                    });
                }
            }
        }
        let mut slots = Vec::with_capacity(rules.len());
        for rule in &rules {
            let Some(slot) = self.slots.slot_of(rule) else {
                unreachable!("every rule of the draft was given a slot above");
            };
            slots.push(slot);
        }
        reserved.slots = slots.into_boxed_slice();
        let slots_ref = &self.slots;
        let table: KernelTable = draft
            .resolve(file_id.0, |info| slots_ref.slot_of(info))
            .expect("every rule of the draft was given a slot above");
        let mut ops = Vec::with_capacity(4);
        if !reserved.fresh.is_empty() {
            ops.push(MapOp::PutUnwindInfos(
                reserved
                    .fresh
                    .iter()
                    .map(|&(s, _)| (s, self.slots.content(s).unwrap_or_default()))
                    .collect(),
            ));
        }
        ops.push(MapOp::PutDeltaTable {
            file_id,
            map_id: class,
            deltas: table.deltas,
        });
        // The unwinder looks the offsets up by file id once a process
        // mapping names the file; like the table, they exist before any page.
        ops.extend(put_offsets);
        ops.push(MapOp::PutPages(table.pages));
        Ok(LoadPlan {
            file_id,
            ops,
            map_ref: MapRef {
                start_page: draft.first_page,
                // Both fit: `draft` bounds the span by the page capacity (u32).
                num_pages: draft.per_page.len() as u32,
                page_entries: page_entries as u32,
                map_id: class,
                // At most the largest class's 2^23 entries.
                deltas: draft.entry_count as u32,
            },
            gaps: draft.gaps,
            dead_pages: draft.dead_pages,
            reserved,
        })
    }

    /// Gives back what a plan reserved and never wrote, exactly as it was
    /// (latest reservation first, so a rule moved twice lands where it was).
    fn unreserve(&mut self, reserved: &Reservation) {
        for &(slot, previous) in reserved.fresh.iter().rev() {
            match previous {
                Some(previous) => self.slots.restore(slot, previous),
                None => self.slots.release(slot),
            }
        }
        for &(slot, at) in reserved.revived.iter().rev() {
            self.slots.cool(slot, at);
        }
    }

    /// Settles the slots of rolled-back plans (in plan order). A plan whose
    /// table is still published as a leftover (`pinned`) keeps its slots in
    /// use until the table is gone. Otherwise: a slot never written goes back
    /// exactly as it was; a written slot that was zeroed again is free, or
    /// cooling if any table of the rollback was published (a reader may have
    /// followed it there); a written slot that could not be zeroed keeps its
    /// rule and cools; a revived slot cools again, at least a grace period
    /// from now if a table was published.
    fn settle(
        &mut self,
        reserved: &[Reservation],
        pinned: &BTreeSet<FileId>,
        written: &BTreeSet<u16>,
        zeroed: &BTreeSet<u16>,
        published: bool,
    ) {
        let until = self.reusable_after_grace();
        for r in reserved.iter().filter(|r| pinned.contains(&r.file_id)) {
            for &slot in r.slots.iter() {
                self.slots.add_user(slot);
            }
            self.leftover_slots.insert(r.file_id, r.slots.clone());
        }
        for r in reserved.iter().rev() {
            for &(slot, previous) in r.fresh.iter().rev() {
                if self.slots.users(slot) > 0 {
                    continue;
                }
                if !written.contains(&slot) {
                    match previous {
                        Some(previous) => self.slots.restore(slot, previous),
                        None => self.slots.release(slot),
                    }
                } else if zeroed.contains(&slot) {
                    if published {
                        self.slots.quarantine_zeroed(slot, until);
                    } else {
                        self.slots.release(slot);
                    }
                } else {
                    self.slots
                        .cool(slot, if published { until } else { self.now });
                }
            }
            for &(slot, at) in r.revived.iter().rev() {
                if self.slots.users(slot) == 0 {
                    self.slots
                        .cool(slot, if published { until.max(at) } else { at });
                }
            }
        }
    }

    /// Records a plan whose ops all took effect.
    pub fn commit_load(&mut self, plan: LoadPlan) -> MapRef {
        let map_ref = plan.map_ref;
        if let Some(range) = plan.reserved.offsets {
            self.offsets.insert(plan.file_id, range);
        }
        if map_ref.map_id == 0 {
            return map_ref;
        }
        for &slot in plan.reserved.slots.iter() {
            self.slots.add_user(slot);
        }
        self.pages_in_use += u64::from(map_ref.page_entries);
        self.tables[class_index(map_ref.map_id)] += 1;
        self.loaded.insert(
            plan.file_id,
            LoadedTable {
                map_ref,
                slots: plan.reserved.slots,
                dead_pages: plan.dead_pages.into_boxed_slice(),
            },
        );
        map_ref
    }

    /// A plan stopped part way: the ops that undo what took effect, deepest
    /// first (pages, table, then the written slots back to zero). What the
    /// plan reserved is settled by [`Self::finish_rollback`], once it is
    /// known whether the table is gone.
    pub fn abort_load(&mut self, plan: &LoadPlan, stopped: Stopped) -> Rollback {
        let mut undo = Vec::new();
        let mut written_slots: Vec<u16> = Vec::new();
        for (i, op) in plan.ops.iter().enumerate().take(stopped.at + 1) {
            let in_effect = if i < stopped.at {
                op.len()
            } else {
                stopped.failure.done.min(op.len())
            };
            if in_effect == 0 {
                continue;
            }
            match op {
                MapOp::PutUnwindInfos(v) => {
                    written_slots.extend(v[..in_effect].iter().map(|(s, _)| *s))
                }
                MapOp::PutDeltaTable {
                    file_id, map_id, ..
                } => undo.push(MapOp::DeleteDeltaTable {
                    file_id: *file_id,
                    map_id: *map_id,
                }),
                MapOp::PutDeltaTables { map_id, tables } => {
                    undo.extend(tables[..in_effect].iter().map(|(file_id, _)| {
                        MapOp::DeleteDeltaTable {
                            file_id: *file_id,
                            map_id: *map_id,
                        }
                    }))
                }
                MapOp::PutPages(v) => undo.push(MapOp::DeletePages(
                    v[..in_effect].iter().map(|(k, _)| *k).collect(),
                )),
                MapOp::PutInterpreterOffsets { file_id, .. } => {
                    undo.push(MapOp::DeleteInterpreterOffsets { file_id: *file_id })
                }
                // A load plan holds no process mappings (the host writes
                // them, not the manager); deletes need no undo.
                MapOp::DeletePages(_)
                | MapOp::DeleteDeltaTable { .. }
                | MapOp::DeleteInterpreterOffsets { .. }
                | MapOp::PutProcessMappings { .. }
                | MapOp::DeleteProcessMappings { .. } => {}
            }
        }
        undo.reverse();
        let published = undo
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }));
        if !written_slots.is_empty() {
            undo.push(MapOp::PutUnwindInfos(
                written_slots
                    .iter()
                    .map(|&s| (s, UnwindInfo::default()))
                    .collect(),
            ));
        }
        Rollback {
            file_id: plan.file_id,
            ops: undo,
            reserved: plan.reserved.clone(),
            written: written_slots,
            published,
        }
    }

    /// Records how far a rollback got. Returns true when nothing is owed:
    /// every page, table and offsets entry the plan wrote is gone (a slot it
    /// wrote whose zeroing failed keeps its rule, unreferenced, and the book
    /// knows it; that is not a debt). What could not be removed becomes a
    /// leftover; a table that stays published keeps its slots in use; the
    /// other slots the plan took are settled (see `settle`).
    pub fn finish_rollback(&mut self, rollback: Rollback, result: Result<(), Stopped>) -> bool {
        let zeroed = zeroed_slots(&rollback.ops, result);
        let mut remaining = VecDeque::new();
        if let Err(stopped) = result {
            for (i, op) in rollback.ops.iter().enumerate().skip(stopped.at) {
                let from = if i == stopped.at {
                    stopped.failure.done
                } else {
                    0
                };
                if !matches!(op, MapOp::PutUnwindInfos(_)) {
                    remaining.extend(op.tail(from));
                }
            }
        }
        let mut pinned = BTreeSet::new();
        if remaining
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }))
        {
            pinned.insert(rollback.file_id);
        }
        let written: BTreeSet<u16> = rollback.written.iter().copied().collect();
        self.settle(
            std::slice::from_ref(&rollback.reserved),
            &pinned,
            &written,
            &zeroed,
            rollback.published,
        );
        if remaining.is_empty() {
            return true;
        }
        self.leftovers.insert(rollback.file_id, remaining);
        false
    }

    /// Plans the load of several files as one batch. Files refused here
    /// (already loaded, cleanup pending, repeated in the batch, capacity,
    /// encoding) get their error and do not block the others; nothing is
    /// reserved for them.
    pub fn plan_load_many(
        &mut self,
        files: &[(FileId, &IntervalData)],
    ) -> (LoadManyPlan, Vec<(FileId, PlanError)>) {
        let files: Vec<_> = files.iter().map(|&(id, d)| (id, d, None)).collect();
        self.plan_load_many_with(&files)
    }

    /// [`Self::plan_load_many`] for files with `interpreter_offsets`
    /// entries: one put per file, after the tables and before the pages.
    pub fn plan_load_many_with(
        &mut self,
        files: &[(FileId, &IntervalData, Option<OffsetRange>)],
    ) -> (LoadManyPlan, Vec<(FileId, PlanError)>) {
        let mut pending = Pending::default();
        let mut plans = Vec::with_capacity(files.len());
        let mut refused = Vec::new();
        for &(file_id, deltas, offsets) in files {
            match self.plan_one(file_id, deltas, offsets, &pending) {
                Ok(plan) => {
                    pending.files.insert(file_id);
                    pending.offsets += u32::from(plan.reserved.offsets.is_some());
                    if plan.map_ref.map_id != 0 {
                        pending.pages += u64::from(plan.map_ref.page_entries);
                        pending.tables[class_index(plan.map_ref.map_id)] += 1;
                    }
                    plans.push(plan);
                }
                Err(e) => refused.push((file_id, e)),
            }
        }
        let mut slots = Vec::new();
        let mut tables: BTreeMap<u16, Vec<ClassTable>> = BTreeMap::new();
        let mut pages = Vec::new();
        let mut offsets = Vec::new();
        for plan in &plans {
            for op in &plan.ops {
                match op {
                    MapOp::PutUnwindInfos(v) => slots.extend(v.iter().copied()),
                    MapOp::PutDeltaTable {
                        file_id,
                        map_id,
                        deltas,
                    } => tables
                        .entry(*map_id)
                        .or_default()
                        .push((*file_id, deltas.clone())),
                    MapOp::PutPages(v) => pages.extend(v.iter().copied()),
                    put @ MapOp::PutInterpreterOffsets { .. } => offsets.push(put.clone()),
                    other => unreachable!("a load plan holds no {other:?}"),
                }
            }
        }
        let mut ops = Vec::with_capacity(2 + tables.len() + offsets.len());
        if !slots.is_empty() {
            ops.push(MapOp::PutUnwindInfos(slots));
        }
        ops.extend(
            tables
                .into_iter()
                .map(|(map_id, tables)| MapOp::PutDeltaTables { map_id, tables }),
        );
        ops.extend(offsets);
        if !pages.is_empty() {
            ops.push(MapOp::PutPages(pages));
        }
        (LoadManyPlan { ops, files: plans }, refused)
    }

    /// Records a batch whose ops all took effect.
    pub fn commit_load_many(&mut self, plan: LoadManyPlan) -> Vec<(FileId, MapRef)> {
        plan.files
            .into_iter()
            .map(|p| (p.file_id, self.commit_load(p)))
            .collect()
    }

    /// A batch stopped part way: the ops that undo what took effect for
    /// every file of the batch, deepest first (every page, every table, then
    /// the new slots back to zero). Slots that were reserved but never
    /// written are released at once. Every file of the batch is rolled back.
    pub fn abort_load_many(&mut self, plan: &LoadManyPlan, stopped: Stopped) -> ManyRollback {
        // Elements of each batch op in effect.
        let in_effect: Vec<usize> = plan
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| match i.cmp(&stopped.at) {
                std::cmp::Ordering::Less => op.len(),
                std::cmp::Ordering::Equal => stopped.failure.done.min(op.len()),
                std::cmp::Ordering::Greater => 0,
            })
            .collect();
        // Position of each file's elements inside the batch ops.
        let slot_op = plan
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::PutUnwindInfos(_)));
        let page_op = plan
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::PutPages(_)));
        let mut slot_base = 0;
        let mut page_base = 0;
        let mut table_base: BTreeMap<u16, usize> = BTreeMap::new();
        let mut pages = Vec::new();
        let mut tables = Vec::new();
        let mut zeros = Vec::new();
        let mut written = Vec::new();
        let mut published = false;
        let reserved: Vec<Reservation> = plan.files.iter().map(|p| p.reserved.clone()).collect();
        for file in &plan.files {
            // The file's own ops in effect, as a single-file stop point.
            let mut counts = Vec::with_capacity(file.ops.len());
            for op in &file.ops {
                // A file's offsets are an op of their own: no base to share.
                let mut own = 0;
                let (at, base) = match op {
                    MapOp::PutUnwindInfos(_) => (slot_op, &mut slot_base),
                    MapOp::PutDeltaTable { map_id, .. } => {
                        let at = plan.ops.iter().position(
                            |o| matches!(o, MapOp::PutDeltaTables { map_id: m, .. } if m == map_id),
                        );
                        (at, table_base.entry(*map_id).or_default())
                    }
                    MapOp::PutPages(_) => (page_op, &mut page_base),
                    put @ MapOp::PutInterpreterOffsets { .. } => {
                        (plan.ops.iter().position(|o| o == put), &mut own)
                    }
                    other => unreachable!("a load plan holds no {other:?}"),
                };
                let done = at.map_or(0, |at| in_effect[at]);
                counts.push(done.saturating_sub(*base).min(op.len()));
                *base += op.len();
            }
            let Some(at) = counts
                .iter()
                .zip(&file.ops)
                .position(|(n, op)| *n < op.len())
                .or(file.ops.len().checked_sub(1))
            else {
                continue;
            };
            let own = Stopped {
                at,
                failure: OpFailure::new(stopped.failure.errno, counts[at]),
            };
            let rollback = self.abort_load(file, own);
            published |= rollback.published;
            written.extend(rollback.written);
            for op in rollback.ops {
                match op {
                    MapOp::DeletePages(keys) => pages.extend(keys),
                    MapOp::PutUnwindInfos(v) => zeros.extend(v),
                    table => tables.push(table),
                }
            }
        }
        let mut ops = Vec::with_capacity(2 + tables.len());
        if !pages.is_empty() {
            ops.push(MapOp::DeletePages(pages));
        }
        ops.extend(tables);
        if !zeros.is_empty() {
            ops.push(MapOp::PutUnwindInfos(zeros));
        }
        ManyRollback {
            ops,
            files: plan.files.iter().map(|p| p.file_id).collect(),
            reserved,
            written,
            published,
        }
    }

    /// Records how far a batch rollback got, as [`Self::finish_rollback`]
    /// does for one file; what could not be removed becomes a leftover of
    /// the file it belongs to. Returns true when everything was undone.
    pub fn finish_rollback_many(
        &mut self,
        rollback: ManyRollback,
        result: Result<(), Stopped>,
    ) -> bool {
        let zeroed = zeroed_slots(&rollback.ops, result);
        let mut pinned = BTreeSet::new();
        if let Err(stopped) = result {
            for (i, op) in rollback.ops.iter().enumerate().skip(stopped.at) {
                let from = if i == stopped.at {
                    stopped.failure.done
                } else {
                    0
                };
                match op {
                    MapOp::PutUnwindInfos(_) => {}
                    MapOp::DeletePages(keys) => {
                        let mut by_file: BTreeMap<FileId, Vec<StackDeltaPageKey>> = BTreeMap::new();
                        for key in keys.iter().skip(from) {
                            by_file.entry(FileId(key.file_id)).or_default().push(*key);
                        }
                        for (file_id, keys) in by_file {
                            self.leftovers
                                .entry(file_id)
                                .or_default()
                                .push_back(MapOp::DeletePages(keys));
                        }
                    }
                    MapOp::DeleteDeltaTable { file_id, .. } => {
                        pinned.insert(*file_id);
                        self.leftovers
                            .entry(*file_id)
                            .or_default()
                            .push_back(op.clone());
                    }
                    MapOp::DeleteInterpreterOffsets { file_id } => {
                        self.leftovers
                            .entry(*file_id)
                            .or_default()
                            .push_back(op.clone());
                    }
                    other => unreachable!("a batch rollback holds no {other:?}"),
                }
            }
        }
        let written: BTreeSet<u16> = rollback.written.iter().copied().collect();
        self.settle(
            &rollback.reserved,
            &pinned,
            &written,
            &zeroed,
            rollback.published,
        );
        result.is_ok()
    }

    /// The ops that unload a file, the reverse of its load: pages,
    /// interpreter offsets (upstream never deletes them, weakness 7), the
    /// table. `None` when it has nothing in the kernel.
    pub fn plan_unload(&self, file_id: FileId) -> Option<UnloadPlan> {
        let table = self.loaded.get(&file_id);
        let offsets = self.offsets.contains_key(&file_id);
        if table.is_none() && !offsets {
            return None;
        }
        let mut ops = Vec::with_capacity(3);
        if let Some(table) = table {
            ops.push(MapOp::DeletePages(table.page_keys(file_id).collect()));
        }
        if offsets {
            ops.push(MapOp::DeleteInterpreterOffsets { file_id });
        }
        if let Some(table) = table {
            ops.push(MapOp::DeleteDeltaTable {
                file_id,
                map_id: table.map_ref.map_id,
            });
        }
        Some(UnloadPlan { file_id, ops })
    }

    /// Records an unload. The file is no longer loaded whatever happened;
    /// what the backend could not remove becomes a leftover. Returns the
    /// number of leftover entries.
    pub fn finish_unload(&mut self, plan: UnloadPlan, result: Result<(), Stopped>) -> usize {
        self.offsets.remove(&plan.file_id);
        let table = self.loaded.remove(&plan.file_id);
        if let Some(table) = &table {
            self.pages_in_use -= u64::from(table.map_ref.page_entries);
            self.tables[class_index(table.map_ref.map_id)] -= 1;
        }
        let Err(stopped) = result else {
            if let Some(table) = table {
                self.unreference(&table.slots);
            }
            return 0;
        };
        let remaining: VecDeque<MapOp> = plan
            .ops
            .iter()
            .enumerate()
            .skip(stopped.at)
            .filter_map(|(i, op)| {
                op.tail(if i == stopped.at {
                    stopped.failure.done
                } else {
                    0
                })
            })
            .collect();
        let entries = remaining.iter().map(MapOp::len).sum();
        let table_stays = remaining
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }));
        if let Some(table) = table {
            if table_stays {
                // Still published: a reader can reach its slots until the
                // leftover removal succeeds.
                self.leftover_slots.insert(plan.file_id, table.slots);
            } else {
                self.unreference(&table.slots);
            }
        }
        if !remaining.is_empty() {
            self.leftovers.insert(plan.file_id, remaining);
        }
        entries
    }

    /// A table that referenced `slots` was unpublished just now.
    fn unreference(&mut self, slots: &[u16]) {
        let until = self.reusable_after_grace();
        for &slot in slots {
            self.slots.remove_user(slot, until);
        }
    }

    /// The next leftover op to retry for each file, in file order.
    pub fn leftover_fronts(&self) -> Vec<(FileId, MapOp)> {
        self.leftovers
            .iter()
            .filter_map(|(id, q)| q.front().map(|op| (*id, op.clone())))
            .collect()
    }

    /// Records the result of retrying `file_id`'s front leftover op.
    /// Returns true if the op completed.
    pub fn leftover_result(&mut self, file_id: FileId, result: Result<(), OpFailure>) -> bool {
        let Some(queue) = self.leftovers.get_mut(&file_id) else {
            return false;
        };
        let Some(front) = queue.pop_front() else {
            return false;
        };
        let completed = match result {
            Ok(()) => true,
            Err(failure) => {
                if let Some(rest) = front.tail(failure.done) {
                    queue.push_front(rest);
                }
                false
            }
        };
        if queue.is_empty() {
            self.leftovers.remove(&file_id);
        }
        if completed && matches!(front, MapOp::DeleteDeltaTable { .. }) {
            if let Some(slots) = self.leftover_slots.remove(&file_id) {
                self.unreference(&slots);
            }
        }
        completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deltas::info::sp;
    use crate::deltas::{hint, StackDelta};
    use crate::machine::slots::DEFAULT_SLOT_GRACE;
    use crate::ops::Errno;

    /// Three pages, three distinct rules.
    fn three_pages() -> IntervalData {
        IntervalData::from_deltas(vec![
            StackDelta::new(0x1_0010, hint::KEEP, sp(8)),
            StackDelta::new(0x2_0010, hint::NONE, sp(16)),
            StackDelta::new(0x3_0010, hint::NONE, sp(24)),
            StackDelta::new(0x3_0020, hint::GAP, crate::deltas::info::INVALID),
        ])
    }

    fn stop(at: usize, done: usize) -> Stopped {
        Stopped {
            at,
            failure: OpFailure::new(Errno::ENOMEM, done),
        }
    }

    #[test]
    fn a_plan_writes_bottom_up() {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
        let kinds: Vec<_> = plan.ops.iter().map(MapOp::name).collect();
        assert_eq!(kinds, ["put unwind infos", "put delta table", "put pages"]);
        assert_eq!(plan.ops[0].len(), 3);
        assert_eq!(plan.ops[2].len(), 3);
        let map_ref = book.commit_load(plan);
        assert_eq!(map_ref.num_pages, 3);
        assert_eq!(book.pages_in_use(), 3);
        assert_eq!(book.tables_in_class(8), 1);
        assert_eq!(book.slots().users(0), 1);
    }

    #[test]
    fn unload_goes_top_down_and_releases_accounting() {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
        book.commit_load(plan);
        let unload = book.plan_unload(FileId(1)).unwrap();
        let kinds: Vec<_> = unload.ops.iter().map(MapOp::name).collect();
        assert_eq!(kinds, ["delete pages", "delete delta table"]);
        assert_eq!(book.finish_unload(unload, Ok(())), 0);
        assert_eq!(book.pages_in_use(), 0);
        assert_eq!(book.tables_in_class(8), 0);
        assert!(book.loaded().is_empty());
        assert_eq!(book.slots().users(0), 0);
    }

    #[test]
    fn every_stop_point_is_undone_exactly() {
        for at in 0..3 {
            for done in 0..=3 {
                let mut book = KernelBook::new(Capacities::default());
                let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
                if done > plan.ops[at].len() {
                    continue;
                }
                let rollback = book.abort_load(&plan, stop(at, done));
                let mut expect = Vec::new();
                if at == 2 && done > 0 {
                    expect.push("delete pages");
                }
                if at >= 2 || (at == 1 && done > 0) {
                    expect.push("delete delta table");
                }
                let slots_written = if at == 0 { done } else { 3 };
                if slots_written > 0 {
                    expect.push("put unwind infos");
                }
                let kinds: Vec<_> = rollback.ops.iter().map(MapOp::name).collect();
                assert_eq!(kinds, expect, "stopped at op {at} after {done}");
                if let Some(MapOp::DeletePages(keys)) = rollback.ops.first() {
                    assert_eq!(keys.len(), done);
                }
                if let Some(MapOp::PutUnwindInfos(v)) = rollback.ops.last() {
                    assert_eq!(v.len(), slots_written);
                    assert!(v.iter().all(|(_, info)| *info == UnwindInfo::default()));
                }
                assert!(book.finish_rollback(rollback, Ok(())));
                assert_eq!(book.slots().in_use(), 0, "slots zeroed at op {at}/{done}");
                assert!(book.leftovers().is_empty());
                let published = at >= 2 || (at == 1 && done > 0);
                if published {
                    // A reader may have followed the table to the slots:
                    // they wait a grace period, so the next plan takes
                    // others, and the same ones once it has passed.
                    assert_eq!(book.slots().cooling().count(), 3, "at op {at}/{done}");
                    let mut other = book.clone();
                    let elsewhere = other.plan_load(FileId(1), &three_pages()).unwrap();
                    assert_ne!(elsewhere.ops[0], plan.ops[0]);
                    let mut tiny = KernelBook::with_slot_grace(
                        Capacities {
                            unwind_slots: 3,
                            ..Capacities::default()
                        },
                        DEFAULT_SLOT_GRACE,
                    );
                    let first = tiny.plan_load(FileId(1), &three_pages()).unwrap();
                    let rollback = tiny.abort_load(&first, stop(at, done));
                    assert!(tiny.finish_rollback(rollback, Ok(())));
                    assert_eq!(
                        tiny.plan_load(FileId(1), &three_pages()).err(),
                        Some(PlanError::MapFull {
                            map: MapKind::UnwindInfo,
                            capacity: 3
                        }),
                        "no reuse inside the grace period at op {at}/{done}"
                    );
                    tiny.advance_to(Timestamp::default().after(DEFAULT_SLOT_GRACE));
                    let again = tiny.plan_load(FileId(1), &three_pages()).unwrap();
                    assert_eq!(again.ops[0], first.ops[0]);
                } else {
                    // Never reachable: free at once, the next plan gets them.
                    assert_eq!(book.slots().cooling().count(), 0);
                    let again = book.plan_load(FileId(1), &three_pages()).unwrap();
                    assert_eq!(again.ops[0], plan.ops[0]);
                }
            }
        }
    }

    #[test]
    fn a_failed_rollback_leaves_an_exact_leftover_and_blocks_a_reload() {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
        let rollback = book.abort_load(&plan, stop(2, 2));
        // The page delete removed one of two pages, then stopped.
        assert!(!book.finish_rollback(rollback, Err(stop(0, 1))));
        let queue: Vec<_> = book.leftovers()[&FileId(1)].iter().cloned().collect();
        assert_eq!(queue.len(), 2);
        assert!(
            matches!(&queue[0], MapOp::DeletePages(k) if k.len() == 1 && k[0].page == 0x2_0000)
        );
        assert!(matches!(
            queue[1],
            MapOp::DeleteDeltaTable { map_id: 8, .. }
        ));
        // Slots were never zeroed: they keep their rules and stay reusable.
        assert_eq!(book.slots().in_use(), 3);
        assert_eq!(
            book.plan_load(FileId(1), &three_pages()).err(),
            Some(PlanError::CleanupPending)
        );
        // Retrying: the page delete now works, the table delete fails, then works.
        assert!(book.leftover_result(FileId(1), Ok(())));
        assert!(!book.leftover_result(FileId(1), Err(OpFailure::new(Errno::EBUSY, 0))));
        assert_eq!(book.leftover_ops(), 1);
        assert!(book.leftover_result(FileId(1), Ok(())));
        assert!(book.leftovers().is_empty());
        let again = book.plan_load(FileId(1), &three_pages()).unwrap();
        assert_eq!(
            again.ops.len(),
            2,
            "the slots are still there: no slot write"
        );
    }

    #[test]
    fn a_partial_unload_keeps_the_rest_as_leftovers() {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
        book.commit_load(plan);
        let unload = book.plan_unload(FileId(1)).unwrap();
        assert_eq!(book.finish_unload(unload, Err(stop(0, 1))), 3);
        assert!(book.loaded().is_empty());
        assert_eq!(book.pages_in_use(), 0, "the gauge counts loaded files only");
        // Leftover pages still count against the capacity.
        let caps = Capacities {
            pages: 4,
            ..Capacities::default()
        };
        let mut small = book.clone();
        small.caps = caps;
        assert!(matches!(
            small.plan_load(FileId(2), &three_pages()),
            Err(PlanError::MapFull {
                map: MapKind::Pages,
                ..
            })
        ));
    }

    #[test]
    fn capacities_are_checked_before_anything_is_written() {
        let caps = Capacities {
            unwind_slots: 2,
            ..Capacities::default()
        };
        let mut book = KernelBook::new(caps);
        assert_eq!(
            book.plan_load(FileId(1), &three_pages()).err(),
            Some(PlanError::MapFull {
                map: MapKind::UnwindInfo,
                capacity: 2
            })
        );
        assert_eq!(
            book.slots().in_use(),
            0,
            "partial slot reservations are released"
        );

        let caps = Capacities {
            outer_entries: 1,
            ..Capacities::default()
        };
        let mut book = KernelBook::new(caps);
        let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
        book.commit_load(plan);
        assert_eq!(
            book.plan_load(FileId(2), &three_pages()).err(),
            Some(PlanError::MapFull {
                map: MapKind::DeltaTables(8),
                capacity: 1
            })
        );
    }

    #[test]
    fn a_batch_is_slots_one_op_per_class_then_pages_and_refuses_per_file() {
        let caps = Capacities {
            pages: 7,
            ..Capacities::default()
        };
        let mut book = KernelBook::new(caps);
        let big: IntervalData = (0..300u64)
            .map(|i| StackDelta::new(0x1_0000 + 4 * i, hint::NONE, sp(8)))
            .collect();
        let a = three_pages();
        let files: Vec<(FileId, &IntervalData)> = vec![
            (FileId(1), &a),
            (FileId(2), &big),
            (FileId(1), &a),
            (FileId(3), &a),
            (FileId(4), &a),
        ];
        let (plan, refused) = book.plan_load_many(&files);
        // 3 + 1 + 3 pages fit in 7; file 4's pages do not; file 1 twice.
        assert_eq!(
            refused,
            vec![
                (FileId(1), PlanError::AlreadyLoaded),
                (
                    FileId(4),
                    PlanError::MapFull {
                        map: MapKind::Pages,
                        capacity: 7
                    }
                )
            ]
        );
        let kinds: Vec<_> = plan.ops.iter().map(MapOp::name).collect();
        assert_eq!(
            kinds,
            [
                "put unwind infos",
                "put delta tables",
                "put delta tables",
                "put pages"
            ]
        );
        assert_eq!(plan.ops[0].len(), 3, "slots shared inside the batch once");
        assert_eq!(plan.ops[1].len(), 2, "class 8: files 1 and 3");
        assert_eq!(plan.ops[2].len(), 1, "class 9: file 2");
        assert_eq!(plan.ops[3].len(), 7);
        // Stopped after one table of class 8: the undo is exact.
        let rollback = book.abort_load_many(&plan, stop(1, 1));
        let kinds: Vec<_> = rollback.ops.iter().map(MapOp::name).collect();
        assert_eq!(kinds, ["delete delta table", "put unwind infos"]);
        assert!(book.finish_rollback_many(rollback, Ok(())));
        assert_eq!(book.slots().in_use(), 0);
        let (plan, _) = book.plan_load_many(&files[..2]);
        let refs = book.commit_load_many(plan);
        assert_eq!(refs.len(), 2);
        assert_eq!(book.pages_in_use(), 4);
        assert_eq!(book.tables_in_class(9), 1);
    }

    /// Three pages like [`three_pages`], with rules no other file uses.
    fn three_other_pages() -> IntervalData {
        IntervalData::from_deltas(vec![
            StackDelta::new(0x1_0010, hint::KEEP, sp(32)),
            StackDelta::new(0x2_0010, hint::NONE, sp(40)),
            StackDelta::new(0x3_0010, hint::NONE, sp(48)),
            StackDelta::new(0x3_0020, hint::GAP, crate::deltas::info::INVALID),
        ])
    }

    fn three_slots() -> KernelBook {
        KernelBook::with_slot_grace(
            Capacities {
                unwind_slots: 3,
                ..Capacities::default()
            },
            Duration::from_secs(5),
        )
    }

    fn at(secs: u64) -> Timestamp {
        Timestamp(Duration::from_secs(secs))
    }

    fn load(book: &mut KernelBook, id: u64, deltas: &IntervalData) {
        let plan = book.plan_load(FileId(id), deltas).unwrap();
        book.commit_load(plan);
    }

    fn unload(book: &mut KernelBook, id: u64) {
        let plan = book.plan_unload(FileId(id)).unwrap();
        assert_eq!(book.finish_unload(plan, Ok(())), 0);
    }

    fn slot_writes(plan: &LoadPlan) -> usize {
        plan.ops
            .iter()
            .filter(|op| matches!(op, MapOp::PutUnwindInfos(_)))
            .map(MapOp::len)
            .sum()
    }

    #[test]
    fn a_released_rule_is_revived_without_a_write() {
        let mut book = three_slots();
        load(&mut book, 1, &three_pages());
        book.advance_to(at(10));
        unload(&mut book, 1);
        assert_eq!(book.slots().live(), 0);
        assert_eq!(
            book.slots().cooling().collect::<Vec<_>>(),
            vec![(0, at(15)), (1, at(15)), (2, at(15))]
        );
        // Another file with the same rules, inside the grace: no slot write.
        let plan = book.plan_load(FileId(2), &three_pages()).unwrap();
        assert_eq!(slot_writes(&plan), 0);
        book.commit_load(plan);
        assert_eq!(book.slots().live(), 3);
        assert_eq!(book.slots().cooling().count(), 0);
    }

    #[test]
    fn a_different_rule_takes_a_slot_only_after_the_grace() {
        let mut book = three_slots();
        load(&mut book, 1, &three_pages());
        book.advance_to(at(10));
        unload(&mut book, 1);
        book.advance_to(Timestamp(Duration::from_secs(15) - Duration::from_nanos(1)));
        assert_eq!(
            book.plan_load(FileId(2), &three_other_pages()).err(),
            Some(PlanError::MapFull {
                map: MapKind::UnwindInfo,
                capacity: 3
            })
        );
        assert_eq!(book.slots().cooling().count(), 3, "nothing was taken");
        book.advance_to(at(15));
        let plan = book.plan_load(FileId(2), &three_other_pages()).unwrap();
        assert_eq!(slot_writes(&plan), 3);
        book.commit_load(plan);
        assert_eq!(book.slots().slot_of(&sp(8)), None, "the old rules are gone");
        assert_eq!(book.slots().live(), 3);
    }

    #[test]
    fn a_class_past_the_largest_is_counted_with_the_largest() {
        // Map ids come from the encoder and the fixed outer maps, so this
        // never happens; if it did, a counter is wrong but nothing panics.
        let last = abi::SIZE_CLASS_COUNT - 1;
        assert_eq!(class_index(abi::SIZE_CLASS_MIN), 0);
        assert_eq!(class_index(abi::SIZE_CLASS_MAX), last);
        assert_eq!(class_index(abi::SIZE_CLASS_MAX + 1), last);
        assert_eq!(class_index(u16::MAX), last);
        assert_eq!(class_index(0), 0);
    }

    #[test]
    fn a_leftover_table_counts_against_its_outer_map() {
        // Two entries per outer map: one loaded table and one a failed
        // rollback left behind fill it, until the leftover is removed.
        let mut book = KernelBook::new(Capacities {
            outer_entries: 2,
            ..Capacities::default()
        });
        load(&mut book, 1, &three_pages());
        let plan = book.plan_load(FileId(2), &three_other_pages()).unwrap();
        let class = plan.map_ref.map_id;
        let rollback = book.abort_load(&plan, stop(2, 0));
        assert!(
            !book.finish_rollback(rollback, Err(stop(0, 0))),
            "the table stays"
        );
        assert_eq!(
            book.plan_load(FileId(3), &three_pages()).err(),
            Some(PlanError::MapFull {
                map: MapKind::DeltaTables(class),
                capacity: 2
            })
        );
        assert!(book.leftover_result(FileId(2), Ok(())));
        assert!(book.plan_load(FileId(3), &three_pages()).is_ok());
    }

    #[test]
    fn the_books_clock_never_goes_back() {
        // A caller's clock may be read on two threads and arrive out of
        // order; an earlier time must not restart a slot's cooling.
        let mut book = three_slots();
        book.advance_to(at(10));
        book.advance_to(at(4));
        assert_eq!(book.now(), at(10));
        load(&mut book, 1, &three_pages());
        unload(&mut book, 1);
        book.advance_to(at(12));
        assert!(
            book.plan_load(FileId(2), &three_other_pages()).is_err(),
            "still cooling"
        );
        book.advance_to(at(15));
        assert!(
            book.plan_load(FileId(2), &three_other_pages()).is_ok(),
            "the grace counts from 10, not 4"
        );
    }

    #[test]
    fn a_leftover_table_keeps_its_slots_until_it_is_removed() {
        let mut book = three_slots();
        load(&mut book, 1, &three_pages());
        // The unload removes the pages, then fails to unpublish the table.
        let plan = book.plan_unload(FileId(1)).unwrap();
        assert_eq!(book.finish_unload(plan, Err(stop(1, 0))), 1);
        assert_eq!(book.leftover_slots()[&FileId(1)].len(), 3);
        assert_eq!(book.slots().live(), 3, "the table still references them");
        book.advance_to(at(100));
        assert!(book.plan_load(FileId(2), &three_other_pages()).is_err());
        assert!(book.leftover_result(FileId(1), Ok(())));
        assert!(book.leftover_slots().is_empty());
        assert_eq!(book.slots().cooling().next(), Some((0, at(105))));
        assert!(book.plan_load(FileId(2), &three_other_pages()).is_err());
        book.advance_to(at(105));
        assert!(book.plan_load(FileId(2), &three_other_pages()).is_ok());
    }

    #[test]
    fn a_rollback_pins_the_slots_of_a_table_it_could_not_remove() {
        let mut book = three_slots();
        let plan = book.plan_load(FileId(1), &three_pages()).unwrap();
        let rollback = book.abort_load(&plan, stop(2, 1));
        // The page is removed, the table is not.
        assert!(!book.finish_rollback(rollback, Err(stop(1, 0))));
        assert_eq!(book.leftover_slots()[&FileId(1)].len(), 3);
        assert_eq!(book.slots().live(), 3);
        assert!(book.leftover_result(FileId(1), Ok(())));
        assert_eq!(book.slots().live(), 0);
        assert_eq!(book.slots().cooling().count(), 3, "not zeroed: they cool");
        assert_eq!(book.slots().in_use(), 3);
    }

    #[test]
    fn a_reassigned_slot_never_written_is_put_back_exactly() {
        let mut book = three_slots();
        load(&mut book, 1, &three_pages());
        unload(&mut book, 1);
        book.advance_to(at(60));
        let before: Vec<_> = book.slots().cooling().collect();
        let plan = book.plan_load(FileId(2), &three_other_pages()).unwrap();
        // The slot write itself fails after one element: that slot is
        // zeroed (free: no table ever led to it), the others come back.
        let rollback = book.abort_load(&plan, stop(0, 1));
        assert!(book.finish_rollback(rollback, Ok(())));
        assert_eq!(book.slots().free().collect::<Vec<_>>(), vec![0]);
        assert_eq!(book.slots().cooling().collect::<Vec<_>>(), before[1..]);
        assert_eq!(book.slots().slot_of(&sp(16)), Some(1));
        assert_eq!(book.slots().slot_of(&sp(8)), None);
        // Stopped before any write: everything as it was.
        let plan = book.plan_load(FileId(2), &three_other_pages()).unwrap();
        let rollback = book.abort_load(&plan, stop(0, 0));
        assert!(book.finish_rollback(rollback, Ok(())));
        assert_eq!(book.slots().free().collect::<Vec<_>>(), vec![0]);
        assert_eq!(book.slots().cooling().collect::<Vec<_>>(), before[1..]);
    }

    fn offsets() -> OffsetRange {
        OffsetRange {
            lower_offset1: 0x10,
            upper_offset1: 0x20,
            program_index: abi::program::PYTHON,
            ..OffsetRange::default()
        }
    }

    #[test]
    fn interpreter_offsets_go_after_the_table_and_come_off_after_the_pages() {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book
            .plan_load_with(FileId(1), &three_pages(), Some(offsets()))
            .unwrap();
        let kinds: Vec<_> = plan.ops.iter().map(MapOp::name).collect();
        assert_eq!(
            kinds,
            [
                "put unwind infos",
                "put delta table",
                "put interpreter offsets",
                "put pages"
            ]
        );
        // Every stop point: the undo removes exactly what took effect.
        for at in 0..4 {
            let mut b = KernelBook::new(Capacities::default());
            let p = b
                .plan_load_with(FileId(2), &three_pages(), Some(offsets()))
                .unwrap();
            let rollback = b.abort_load(&p, stop(at, 0));
            let undone = rollback
                .ops
                .iter()
                .filter(|op| matches!(op, MapOp::DeleteInterpreterOffsets { .. }))
                .count();
            assert_eq!(undone, usize::from(at > 2), "stopped at op {at}");
        }
        book.commit_load(plan);
        assert_eq!(book.interpreter_offsets()[&FileId(1)], offsets());
        let unload = book.plan_unload(FileId(1)).unwrap();
        let kinds: Vec<_> = unload.ops.iter().map(MapOp::name).collect();
        assert_eq!(
            kinds,
            [
                "delete pages",
                "delete interpreter offsets",
                "delete delta table"
            ]
        );
        book.finish_unload(unload, Ok(()));
        assert!(book.interpreter_offsets().is_empty());
    }

    #[test]
    fn a_file_without_deltas_can_still_own_offsets_and_a_full_map_refuses() {
        let caps = Capacities {
            interpreter_offsets: 1,
            ..Capacities::default()
        };
        let mut book = KernelBook::new(caps);
        let plan = book
            .plan_load_with(FileId(1), &IntervalData::new(), Some(offsets()))
            .unwrap();
        assert_eq!(plan.ops.len(), 1);
        book.commit_load(plan);
        assert!(book.is_loaded(FileId(1)));
        assert_eq!(
            book.plan_load_with(FileId(2), &three_pages(), Some(offsets()))
                .err(),
            Some(PlanError::MapFull {
                map: MapKind::InterpreterOffsets,
                capacity: 1
            })
        );
        assert_eq!(book.slots().in_use(), 0, "nothing reserved");
        assert!(book.plan_load(FileId(2), &three_pages()).is_ok());
        let unload = book.plan_unload(FileId(1)).unwrap();
        assert_eq!(
            unload.ops,
            [MapOp::DeleteInterpreterOffsets { file_id: FileId(1) }]
        );
        // A failed delete is a leftover that still counts against the map.
        assert_eq!(book.finish_unload(unload, Err(stop(0, 0))), 1);
        assert!(matches!(
            book.plan_load_with(FileId(3), &IntervalData::new(), Some(offsets())),
            Err(PlanError::MapFull { .. })
        ));
    }

    #[test]
    fn a_batch_counts_its_own_offsets_entries_against_the_map() {
        let caps = Capacities {
            interpreter_offsets: 2,
            ..Capacities::default()
        };
        let mut book = KernelBook::new(caps);
        let none = &IntervalData::new();
        let files: Vec<_> = (1..=3)
            .map(|id| (FileId(id), none, Some(offsets())))
            .collect();
        let (plan, refused) = book.plan_load_many_with(&files);
        let planned: Vec<_> = plan.files.iter().map(|p| p.file_id).collect();
        assert_eq!(planned, [FileId(1), FileId(2)]);
        assert_eq!(
            refused,
            [(
                FileId(3),
                PlanError::MapFull {
                    map: MapKind::InterpreterOffsets,
                    capacity: 2
                }
            )]
        );
    }

    #[test]
    fn a_batch_counts_its_own_tables_against_the_outer_map() {
        let mut book = KernelBook::new(Capacities {
            outer_entries: 2,
            ..Capacities::default()
        });
        let data = three_pages();
        let files: Vec<_> = (1..=3).map(|id| (FileId(id), &data)).collect();
        let (plan, refused) = book.plan_load_many(&files);
        let planned: Vec<_> = plan.files.iter().map(|p| p.file_id).collect();
        assert_eq!(planned, [FileId(1), FileId(2)]);
        assert!(
            matches!(
                refused[..],
                [(
                    FileId(3),
                    PlanError::MapFull {
                        map: MapKind::DeltaTables(_),
                        capacity: 2
                    }
                )]
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_batch_undoes_an_offsets_entry_only_once_it_was_written() {
        let data = three_pages();
        let files = [(FileId(1), &data, Some(offsets()))];
        // Batch order: slots, tables, offsets, pages. Stopped at each op
        // with nothing of it done: the offsets entry is in the kernel only
        // when the stop came after its op.
        for (at, written) in [(1, false), (2, false), (3, true)] {
            let mut book = KernelBook::new(Capacities::default());
            let (plan, _) = book.plan_load_many_with(&files);
            assert_eq!(plan.ops[2].name(), "put interpreter offsets");
            let rollback = book.abort_load_many(&plan, stop(at, 0));
            let undone = rollback
                .ops
                .iter()
                .any(|op| matches!(op, MapOp::DeleteInterpreterOffsets { .. }));
            assert_eq!(undone, written, "stopped at op {at}");
        }
    }

    #[test]
    fn an_empty_file_writes_nothing() {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book.plan_load(FileId(1), &IntervalData::new()).unwrap();
        assert!(plan.ops.is_empty());
        assert_eq!(book.commit_load(plan).map_id, 0);
        assert!(book.loaded().is_empty());
        assert!(book.plan_unload(FileId(1)).is_none());
    }
}
