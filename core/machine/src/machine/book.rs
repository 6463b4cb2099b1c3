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

use crate::abi::{self, OffsetRange, StackDeltaPageKey, PAGE_BITS};
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

/// One file's part of a [`LoadManyPlan`]: the ops that would load it
/// alone, and what the book reserved for them.
#[derive(Clone, Debug)]
pub struct LoadPlan {
    pub file_id: FileId,
    /// In publication order: slots, table, interpreter offsets, pages.
    pub(crate) ops: Vec<MapOp>,
    pub map_ref: MapRef,
    /// Gaps of at least 512 KiB, for interpreter loaders.
    pub(crate) gaps: Vec<Range<u64>>,
    /// Pages of the span that get no entry (see [`encode::Draft::dead_pages`]).
    pub(crate) dead_pages: Vec<Range<u64>>,
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

/// The ops that unload one file (top-down: pages, interpreter offsets, then
/// the table).
#[derive(Clone, Debug)]
pub struct UnloadPlan {
    pub(crate) file_id: FileId,
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

/// The ops that load a batch of files, and the per-file plans they were
/// built from. The ops are, in publication order: every new slot (one
/// batch), one [`MapOp::PutDeltaTables`] per size class used (class order;
/// each publishes all its tables with one outer-map batch), the
/// interpreter offsets, every page of every file (one batch). A page is
/// therefore never published before the table it names, nor a table
/// before its slots. A batch of one ([`KernelBook::plan_load`]) has the
/// file's own ops, its table published by a [`MapOp::PutDeltaTable`].
#[derive(Clone, Debug)]
pub struct LoadManyPlan {
    pub ops: Vec<MapOp>,
    /// The planned files in batch order (an empty file has no ops).
    pub files: Vec<LoadPlan>,
}

/// Ops that undo the applied part of a failed load (top-down: every page,
/// then every offsets entry and table, then the new slots back to zero),
/// with the files they belong to (for the leftovers if the undo fails in
/// turn).
#[derive(Clone, Debug)]
pub struct Rollback {
    pub ops: Vec<MapOp>,
    /// The files of the batch (for a `DeletePages` the owner is read from
    /// each key; the slot op has no owner).
    pub(crate) files: Vec<FileId>,
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

    #[cfg(test)]
    pub(crate) fn now(&self) -> Timestamp {
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
    pub(crate) fn is_loaded(&self, file_id: FileId) -> bool {
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

    /// The gauges recounted from the loaded tables: O(files) per commit,
    /// so only in debug builds with the `recount` feature (the simulator
    /// and the fuzzers turn it on) and in this crate's tests.
    fn debug_check_gauges(&self) {
        #[cfg(all(debug_assertions, any(test, feature = "recount")))]
        {
            let mut tables = [0; abi::SIZE_CLASS_COUNT];
            let mut pages = 0;
            for table in self.loaded.values() {
                tables[class_index(table.map_ref.map_id)] += 1;
                pages += u64::from(table.map_ref.page_entries);
            }
            assert_eq!(
                (pages, tables),
                (self.pages_in_use, self.tables),
                "the book's gauges"
            );
        }
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
        debug_assert!(
            self.pages_in_use <= u64::from(self.caps.pages)
                && self.tables.iter().all(|&n| n <= self.caps.outer_entries),
            "plan: the book holds more than the maps can ({} pages of {}, tables {:?} of {} each)",
            self.pages_in_use,
            self.caps.pages,
            self.tables,
            self.caps.outer_entries
        );
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
        debug_assert!(
            page_entries <= draft.per_page.len() as u64
                && reserved
                    .slots
                    .iter()
                    .all(|&slot| u32::from(slot) < self.slots.capacity()),
            "plan: file {file_id} reserves past the capacities"
        );
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
}

mod load;
mod unload;

#[cfg(test)]
mod tests;
