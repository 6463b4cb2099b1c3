//! Warm restart: adopt what the maps of an earlier run already hold right,
//! remove the rest top-down, load what is missing (`docs/ARCHITECTURE.md`,
//! "Warm restart: reconcile").
//!
//! Pure: the caller dumps the maps ([`Observed`]), walks the host and
//! extracts the files mapped now ([`Wanted`]), and gets a rebuilt
//! [`KernelBook`] whose leftovers are the removals, plus the files still to
//! load. Running the leftovers (the ordinary retry) and then loading those
//! files with `plan_load_many_with` leaves the maps exactly as the book
//! says, and no op ever touches an adopted file's entries.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::abi::{
    self, OffsetRange, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo, DELTA_COMMAND_FLAG,
};
use crate::deltas::IntervalData;
use crate::encode::{self, Rule};
use crate::machine::book::{Capacities, KernelBook, LoadedTable, MapRef};
use crate::machine::slots::UnwindSlots;
use crate::machine::Timestamp;
use crate::ops::{MapKind, MapOp};
use crate::FileId;

/// What eim's maps hold, as a backend dumps them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub pages: BTreeMap<StackDeltaPageKey, StackDeltaPageInfo>,
    /// Published delta arrays by (class, file id): their entries up to the
    /// last non-zero one (the rest of the array reads as zero). A backend
    /// may leave out the entries at or past the furthest one the file's
    /// page entries reach (`first_delta + num_deltas`): no reader reads
    /// them, so they cannot matter to what is adopted or kept live.
    pub delta_tables: BTreeMap<(u16, FileId), Vec<abi::StackDelta>>,
    /// `unwind_info_array` from slot 0 (zero slots may be left out at the end).
    pub unwind_infos: Vec<UnwindInfo>,
    pub interpreter_offsets: BTreeMap<FileId, OffsetRange>,
    /// `eim_process_mappings`, by pid. The manager adopts none of it (the
    /// host writes these, whole, for the processes it follows); a warm
    /// restart's first pass replaces them and deletes the rest.
    pub process_mappings: BTreeMap<u32, abi::ProcessMappings>,
    /// How long before the dump a zero was last written into an unwind
    /// slot, as the backend recorded it (`Some(Duration::MAX)`: never).
    /// Only a rollback zeroes slots, right after it unpublished the table
    /// that referenced them, so a zero slot may be under a reader for a
    /// grace after that write and no longer. `None`: not recorded, so any
    /// zero slot may have been zeroed just now.
    pub zeroed_ago: Option<Duration>,
}

impl Observed {
    /// Whether the maps hold nothing at all (no rule in any slot either):
    /// nothing to reconcile, a fresh manager may use them as they are.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
            && self.delta_tables.is_empty()
            && self.interpreter_offsets.is_empty()
            && self
                .unwind_infos
                .iter()
                .all(|u| *u == UnwindInfo::default())
    }
}

/// A file mapped now, with what a fresh load of it would be built from.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub file_id: FileId,
    pub deltas: &'a IntervalData,
    pub offsets: Option<OffsetRange>,
}

/// A shape of the maps the reconcile does not trust; the caller cleans
/// instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReconcileError {
    #[error("unwind_info_array slot {slot} holds a rule but the array has {capacity} slots")]
    SlotOutOfRange { slot: usize, capacity: u32 },
    #[error(
        "unwind_info_array slots {first} and {second} hold the same rule (eim never writes that)"
    )]
    DuplicateRule { first: u16, second: u16 },
    #[error("{map} holds {len} entries, more than its {capacity}")]
    OverCapacity {
        map: MapKind,
        len: usize,
        capacity: u32,
    },
    #[error("file {0} has delta tables in two size classes")]
    TwoTables(FileId),
    #[error(
        "delta table of file {file_id} in class {map_id} holds {len} entries, more than its array"
    )]
    TableTooLong {
        file_id: FileId,
        map_id: u16,
        len: usize,
    },
    #[error("file {0} is wanted twice")]
    RepeatedFile(FileId),
}

/// The outcome of [`reconcile`].
#[derive(Clone, Debug)]
pub struct Reconciled {
    /// Adopted files and the removals as leftovers.
    pub book: KernelBook,
    /// Wanted files whose kernel entries are exactly a fresh load's, in
    /// file id order; nothing of theirs is written or removed.
    pub adopted: Vec<FileId>,
    /// Wanted files to load once the leftovers of their ids are gone, in
    /// file id order.
    pub to_load: Vec<FileId>,
}

impl Reconciled {
    /// Every removal, per file in file id order, each file's top-down.
    pub fn removals(&self) -> impl Iterator<Item = (FileId, &MapOp)> {
        self.book
            .leftovers()
            .iter()
            .flat_map(|(id, ops)| ops.iter().map(move |op| (*id, op)))
    }
}

/// The slot index a kernel delta stores, if it names a slot (not a command).
fn slot_value(delta: abi::StackDelta) -> Option<u16> {
    (delta.unwind_info & DELTA_COMMAND_FLAG == 0).then_some(delta.unwind_info)
}

/// The observed array's slots, checked: `content[s]` is `None` for a zero
/// slot; each rule is in one slot at most.
struct ObservedSlots {
    capacity: u32,
    content: Vec<Option<UnwindInfo>>,
}

impl ObservedSlots {
    fn new(infos: &[UnwindInfo], capacity: u32) -> Result<Self, ReconcileError> {
        let zero = UnwindInfo::default();
        // Bounded by the dump, which is bounded by the array's size.
        let extent = infos.iter().rposition(|i| *i != zero).map_or(0, |i| i + 1);
        if extent > capacity as usize {
            return Err(ReconcileError::SlotOutOfRange {
                slot: extent - 1,
                capacity,
            });
        }
        let mut seen: BTreeMap<UnwindInfo, u16> = BTreeMap::new();
        let mut content = Vec::with_capacity(extent);
        for (slot, info) in infos[..extent].iter().enumerate() {
            if *info == zero {
                content.push(None);
                continue;
            }
            let slot = slot as u16;
            if let Some(first) = seen.insert(*info, slot) {
                return Err(ReconcileError::DuplicateRule {
                    first,
                    second: slot,
                });
            }
            content.push(Some(*info));
        }
        Ok(Self { capacity, content })
    }

    fn get(&self, slot: u16) -> Option<UnwindInfo> {
        self.content.get(usize::from(slot)).copied().flatten()
    }
}

/// Whether the kernel holds exactly what a fresh load of `want` writes,
/// compared through the observed slots; `Some` with the table to record.
fn adoptable(
    want: &Wanted<'_>,
    observed: &Observed,
    slots: &ObservedSlots,
    tables: &BTreeMap<FileId, (u16, &[abi::StackDelta])>,
    pages: &[(StackDeltaPageKey, StackDeltaPageInfo)],
    max_pages: u64,
) -> Option<Option<LoadedTable>> {
    if observed.interpreter_offsets.get(&want.file_id) != want.offsets.as_ref() {
        return None;
    }
    let table = tables.get(&want.file_id);
    let Ok(draft) = encode::draft(want.deltas, max_pages) else {
        // Refused again at its load: nothing of it may stay.
        return None;
    };
    let Some(draft) = draft else {
        // No deltas: a fresh load writes no table and no page.
        return (table.is_none() && pages.is_empty()).then_some(None);
    };
    let &(map_id, seen) = table?;
    if map_id != draft.map_id || seen.len() > draft.entry_count {
        return None;
    }
    // The slot each rule has in the observed table; one slot per rule.
    let mut slot_of: BTreeMap<UnwindInfo, u16> = BTreeMap::new();
    for (i, (_, rule)) in draft.entries().enumerate() {
        let Rule::Slot(info) = rule else { continue };
        let stored = seen.get(i).copied().unwrap_or_default();
        let slot = slot_value(stored)?;
        if u32::from(slot) >= slots.capacity || slots.get(slot) != Some(info) {
            return None;
        }
        if *slot_of.entry(info).or_insert(slot) != slot {
            return None;
        }
    }
    let resolved = draft.resolve(want.file_id.0, |info| slot_of.get(info).copied())?;
    // The dump cannot see trailing zero deltas: compare up to the last
    // non-zero one, the rest of the array being zero in both.
    let zero = abi::StackDelta::default();
    let end = resolved
        .deltas
        .iter()
        .rposition(|d| *d != zero)
        .map_or(0, |i| i + 1);
    if resolved.deltas[..end] != *seen || resolved.pages.as_slice() != pages {
        return None;
    }
    Some(Some(LoadedTable {
        map_ref: MapRef {
            start_page: draft.first_page,
            // `draft` bounds the span by the page capacity (a u32).
            num_pages: draft.per_page.len() as u32,
            page_entries: draft.page_entries() as u32,
            map_id: draft.map_id,
            // At most the largest class's 2^23 entries.
            deltas: draft.entry_count as u32,
        },
        // In first-use order, as a fresh plan records them.
        slots: draft
            .slot_rules()
            .iter()
            .filter_map(|info| slot_of.get(info).copied())
            .collect(),
        dead_pages: draft.dead_pages.into_boxed_slice(),
    }))
}

/// Rebuilds the book from what the maps hold and the files mapped now.
/// See the module notes; errors are shapes to clean instead.
pub fn reconcile(
    observed: &Observed,
    wanted: &[Wanted<'_>],
    caps: Capacities,
    grace: Duration,
    now: Timestamp,
) -> Result<Reconciled, ReconcileError> {
    let over = |map, len: usize, capacity: u32| {
        (len > capacity as usize).then_some(ReconcileError::OverCapacity { map, len, capacity })
    };
    if let Some(e) = over(MapKind::Pages, observed.pages.len(), caps.pages) {
        return Err(e);
    }
    if let Some(e) = over(
        MapKind::InterpreterOffsets,
        observed.interpreter_offsets.len(),
        caps.interpreter_offsets,
    ) {
        return Err(e);
    }
    let slots = ObservedSlots::new(
        &observed.unwind_infos,
        UnwindSlots::new(caps.unwind_slots).capacity(),
    )?;
    // One table per file, bounded by its class's array.
    let mut tables: BTreeMap<FileId, (u16, &[abi::StackDelta])> = BTreeMap::new();
    let mut per_class: BTreeMap<u16, usize> = BTreeMap::new();
    for (&(map_id, file_id), deltas) in &observed.delta_tables {
        let count = per_class.entry(map_id).or_default();
        *count += 1;
        if let Some(e) = over(MapKind::DeltaTables(map_id), *count, caps.outer_entries) {
            return Err(e);
        }
        let fits = (abi::SIZE_CLASS_MIN..=abi::SIZE_CLASS_MAX).contains(&map_id)
            && deltas.len() <= 1usize << map_id;
        if !fits {
            return Err(ReconcileError::TableTooLong {
                file_id,
                map_id,
                len: deltas.len(),
            });
        }
        if tables.insert(file_id, (map_id, deltas)).is_some() {
            return Err(ReconcileError::TwoTables(file_id));
        }
    }
    let mut pages: BTreeMap<FileId, Vec<(StackDeltaPageKey, StackDeltaPageInfo)>> = BTreeMap::new();
    for (key, info) in &observed.pages {
        pages
            .entry(FileId(key.file_id))
            .or_default()
            .push((*key, *info));
    }
    let mut wanted: Vec<&Wanted<'_>> = wanted.iter().collect();
    wanted.sort_by_key(|w| w.file_id);
    if let Some(w) = wanted.windows(2).find(|w| w[0].file_id == w[1].file_id) {
        return Err(ReconcileError::RepeatedFile(w[0].file_id));
    }

    let mut loaded = BTreeMap::new();
    let mut offsets = BTreeMap::new();
    let mut adopted = BTreeSet::new();
    let mut to_load = Vec::new();
    for want in &wanted {
        let file_pages = pages.get(&want.file_id).map_or(&[][..], Vec::as_slice);
        match adoptable(
            want,
            observed,
            &slots,
            &tables,
            file_pages,
            u64::from(caps.pages),
        ) {
            Some(table) => {
                adopted.insert(want.file_id);
                if let Some(range) = want.offsets {
                    offsets.insert(want.file_id, range);
                }
                if let Some(table) = table {
                    loaded.insert(want.file_id, table);
                }
            }
            None => to_load.push(want.file_id),
        }
    }

    // Everything else goes, per file top-down as an unload does.
    let stale: BTreeSet<FileId> = pages
        .keys()
        .chain(tables.keys())
        .chain(observed.interpreter_offsets.keys())
        .filter(|id| !adopted.contains(id))
        .copied()
        .collect();
    let mut leftovers = BTreeMap::new();
    let mut leftover_slots = BTreeMap::new();
    for file_id in stale {
        let mut ops = VecDeque::new();
        if let Some(file_pages) = pages.get(&file_id) {
            ops.push_back(MapOp::DeletePages(
                file_pages.iter().map(|(k, _)| *k).collect(),
            ));
        }
        if observed.interpreter_offsets.contains_key(&file_id) {
            ops.push_back(MapOp::DeleteInterpreterOffsets { file_id });
        }
        if let Some(&(map_id, deltas)) = tables.get(&file_id) {
            ops.push_back(MapOp::DeleteDeltaTable { file_id, map_id });
            // A reader may hold the stale table until it is gone: the slots
            // it can lead to (those with a rule) stay live until then.
            let referenced: BTreeSet<u16> = deltas
                .iter()
                .filter_map(|d| slot_value(*d))
                .filter(|s| slots.get(*s).is_some())
                .collect();
            leftover_slots.insert(file_id, referenced.into_iter().collect::<Box<[u16]>>());
        }
        leftovers.insert(file_id, ops);
    }

    // Users per slot. The high-water mark is the whole array: the maps do
    // not say which zero slot a reader may still reach (a rollback zeroes
    // the slots of a table it just unpublished, and the crash may follow
    // at once). So every slot with a rule that no kept table uses cools
    // for a grace from now (it may have lost its last table just now), and
    // every unused zero slot until a grace after the last zeroing the
    // backend recorded: from now if it recorded none, not at all if that
    // grace is over (invariant 6 over restarts).
    let high_water = slots.capacity as usize;
    let zeroed_for = observed.zeroed_ago.unwrap_or(Duration::ZERO);
    let zero_cool_until = (zeroed_for < grace).then(|| now.after(grace - zeroed_for));
    let mut users = vec![0u32; high_water];
    let kept = loaded
        .values()
        .map(|t: &LoadedTable| &t.slots)
        .chain(leftover_slots.values());
    for table_slots in kept {
        for slot in table_slots.iter() {
            users[usize::from(*slot)] += 1;
        }
    }
    let mut content = slots.content.clone();
    content.resize(high_water, None);
    let unwind = UnwindSlots::rebuilt(
        caps.unwind_slots,
        content,
        users,
        now.after(grace),
        zero_cool_until,
    );
    let book = KernelBook::rebuilt(
        caps,
        grace,
        now,
        unwind,
        loaded,
        offsets,
        leftovers,
        leftover_slots,
    );
    Ok(Reconciled {
        book,
        adopted: adopted.into_iter().collect(),
        to_load,
    })
}

#[cfg(test)]
mod tests;
