//! What a reader can check of eim's maps from the maps alone, without the
//! book of the process that wrote them (`eim status`): per file, what it
//! holds; over all of them, whether the unwinder's reads are safe and
//! whether anything is held that no reader can reach.
//!
//! Pure: the caller dumps the maps ([`Observed`]). The checks are the
//! reader-safety and projection invariants (`docs/INVARIANTS.md`) as far
//! as the maps can show them:
//!
//! * every page entry names a size class and a table of that class that is
//!   published for its file, its address is page-aligned, and its slice
//!   `first_delta..first_delta + num_deltas` lies inside that table;
//! * every delta in a page's slice that names an `unwind_info_array` slot
//!   (rather than a command) names a slot inside the array that holds a
//!   rule (a zero slot is the command INVALID to the unwinder);
//! * no rule is in two slots (eim never writes that);
//! * no table is published without a page entry of its file leading to it
//!   (an orphan: memory no reader reaches, and no owner's book may know).
//!
//! What the maps cannot show is not checked: a slot holding a rule that no
//! delta references may be cooling or free after an unload (slots are
//! zeroed only by a rollback), so it is counted, not reported.

use std::collections::{BTreeMap, BTreeSet};

use crate::abi::{self, OffsetRange, UnwindInfo, DELTA_COMMAND_FLAG, PAGE_MASK};
use crate::machine::Observed;
use crate::FileId;

/// What the maps hold for one file id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileHolding {
    pub file_id: FileId,
    /// The size classes of its published tables (one, for a file eim loaded).
    pub classes: Vec<u16>,
    /// Its page entries.
    pub pages: usize,
    /// The deltas its page entries reach: the furthest `first_delta +
    /// num_deltas` (the table's live part).
    pub deltas: u64,
    /// The distinct `unwind_info_array` slots its reached deltas name.
    pub slots: BTreeSet<u16>,
    pub interpreter_offsets: Option<OffsetRange>,
}

/// One way the maps break an invariant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum MapViolation {
    #[error("page {page:#x} of file {file_id} is not page-aligned")]
    UnalignedPage { file_id: FileId, page: u64 },
    #[error("page {page:#x} of file {file_id} names size class {map_id}, which does not exist")]
    NoSuchClass {
        file_id: FileId,
        page: u64,
        map_id: u16,
    },
    #[error(
        "page {page:#x} of file {file_id} leads to a table of class {map_id} that is not published"
    )]
    PageWithoutTable {
        file_id: FileId,
        page: u64,
        map_id: u16,
    },
    #[error("page {page:#x} of file {file_id} reaches deltas {first}..{end}, past its class {map_id} table of {capacity} entries")]
    SliceOutOfBounds {
        file_id: FileId,
        page: u64,
        map_id: u16,
        first: u32,
        end: u64,
        capacity: u64,
    },
    #[error("delta {index} of file {file_id}'s table names unwind_info_array slot {slot}, past the array's {capacity} slots")]
    SlotOutOfRange {
        file_id: FileId,
        index: u32,
        slot: u16,
        capacity: u32,
    },
    #[error("delta {index} of file {file_id}'s table names unwind_info_array slot {slot}, which holds no rule")]
    ZeroSlot {
        file_id: FileId,
        index: u32,
        slot: u16,
    },
    #[error("unwind_info_array slots {first} and {second} hold the same rule")]
    DuplicateRule { first: u16, second: u16 },
    #[error(
        "the class {map_id} table of file {file_id} is published but no page entry leads to it"
    )]
    OrphanTable { file_id: FileId, map_id: u16 },
    #[error("the eim_process_mappings entry of process {pid} is not sorted by start, has an empty range or overlapping ones: the unwinder's bisection can miss its mappings")]
    MalformedProcessMappings { pid: u32 },
}

/// What [`audit`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapsAudit {
    /// Every file id with a page, a table or interpreter offsets, in order.
    pub files: Vec<FileHolding>,
    /// `unwind_info_array` slots holding a rule.
    pub slots_holding_rules: usize,
    /// Of those, the ones a page's deltas name.
    pub slots_referenced: usize,
    /// In order, each once.
    pub violations: Vec<MapViolation>,
}

impl MapsAudit {
    #[cfg(test)]
    pub(crate) fn is_consistent(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The most violations of one kind kept per file, so that a table of a
/// million bad deltas yields a readable report of bounded size.
const PER_FILE_AND_KIND: usize = 8;

/// Checks `observed` (see the module notes); `unwind_slots` is the
/// capacity of `unwind_info_array`. The work is bounded by the dump: each
/// page's slice is walked once, clipped to its table.
pub fn audit(observed: &Observed, unwind_slots: u32) -> MapsAudit {
    let zero = UnwindInfo::default();
    let mut violations = BTreeSet::new();
    let mut slot_of_rule: BTreeMap<UnwindInfo, u16> = BTreeMap::new();
    let mut slots_holding_rules = 0;
    for (slot, info) in observed.unwind_infos.iter().enumerate() {
        if *info == zero {
            continue;
        }
        slots_holding_rules += 1;
        // Past u16::MAX no delta can name it: only the count matters.
        let Ok(slot) = u16::try_from(slot) else {
            continue;
        };
        if let Some(first) = slot_of_rule.insert(*info, slot) {
            violations.insert(MapViolation::DuplicateRule {
                first,
                second: slot,
            });
        }
    }
    let slot_holds_rule = |slot: u16| {
        observed
            .unwind_infos
            .get(usize::from(slot))
            .is_some_and(|i| *i != zero)
    };

    let mut files: BTreeMap<FileId, FileHolding> = BTreeMap::new();
    // The slices each table's pages reach, walked once per table below.
    let mut slices: BTreeMap<(u16, FileId), Vec<(u64, u64)>> = BTreeMap::new();
    for (map_id, file_id) in observed.delta_tables.keys() {
        entry(&mut files, *file_id).classes.push(*map_id);
    }
    for (file_id, range) in &observed.interpreter_offsets {
        entry(&mut files, *file_id).interpreter_offsets = Some(*range);
    }
    for (key, info) in &observed.pages {
        let file_id = FileId(key.file_id);
        let file = entry(&mut files, file_id);
        file.pages += 1;
        let end = u64::from(info.first_delta) + u64::from(info.num_deltas);
        file.deltas = file.deltas.max(end);
        if key.page & PAGE_MASK != 0 {
            violations.insert(MapViolation::UnalignedPage {
                file_id,
                page: key.page,
            });
        }
        let Some(capacity) = abi::class_entries(info.map_id) else {
            violations.insert(MapViolation::NoSuchClass {
                file_id,
                page: key.page,
                map_id: info.map_id,
            });
            continue;
        };
        if !observed.delta_tables.contains_key(&(info.map_id, file_id)) {
            violations.insert(MapViolation::PageWithoutTable {
                file_id,
                page: key.page,
                map_id: info.map_id,
            });
            continue;
        }
        if end > u64::from(capacity) {
            violations.insert(MapViolation::SliceOutOfBounds {
                file_id,
                page: key.page,
                map_id: info.map_id,
                first: info.first_delta,
                end,
                capacity: u64::from(capacity),
            });
        }
        slices
            .entry((info.map_id, file_id))
            .or_default()
            .push((u64::from(info.first_delta), end.min(u64::from(capacity))));
    }
    let mut referenced: BTreeSet<u16> = BTreeSet::new();
    for (&(map_id, file_id), table) in &observed.delta_tables {
        let Some(ranges) = slices.get_mut(&(map_id, file_id)) else {
            violations.insert(MapViolation::OrphanTable { file_id, map_id });
            continue;
        };
        let file = entry(&mut files, file_id);
        for index in reached_indices(ranges, table.len()) {
            // Past the dump's end the array reads as zero: slot 0.
            let delta = table.get(index as usize).copied().unwrap_or_default();
            if delta.unwind_info & DELTA_COMMAND_FLAG != 0 {
                continue;
            }
            let slot = delta.unwind_info;
            file.slots.insert(slot);
            referenced.insert(slot);
            if u32::from(slot) >= unwind_slots {
                violations.insert(MapViolation::SlotOutOfRange {
                    file_id,
                    index,
                    slot,
                    capacity: unwind_slots,
                });
            } else if !slot_holds_rule(slot) {
                violations.insert(MapViolation::ZeroSlot {
                    file_id,
                    index,
                    slot,
                });
            }
        }
    }
    for (pid, mappings) in &observed.process_mappings {
        if !mappings.is_well_formed() {
            violations.insert(MapViolation::MalformedProcessMappings { pid: *pid });
        }
    }
    MapsAudit {
        files: files.into_values().collect(),
        slots_holding_rules,
        slots_referenced: referenced.iter().filter(|s| slot_holds_rule(**s)).count(),
        violations: bounded(violations),
    }
}

fn entry(files: &mut BTreeMap<FileId, FileHolding>, id: FileId) -> &mut FileHolding {
    files.entry(id).or_insert_with(|| FileHolding {
        file_id: id,
        ..FileHolding::default()
    })
}

/// The indices the `ranges` (half-open, clipped to the class capacity)
/// cover, each once, of a table whose dump has `len` entries: every
/// covered index below `len`, and the first covered one at or past it
/// (the rest read as the same zero delta). So the walk is bounded by the
/// dump, however many pages overlap.
fn reached_indices(ranges: &mut [(u64, u64)], len: usize) -> Vec<u32> {
    ranges.sort_unstable();
    let len = len as u64;
    let mut out = Vec::new();
    let mut next = 0u64;
    let mut zero_seen = false;
    for &(first, end) in ranges.iter() {
        let start = first.max(next);
        if start >= end {
            continue;
        }
        next = end;
        // The clipped bounds fit in a u32 (a class has at most 2^23 entries).
        out.extend((start..end.min(len)).map(|i| i as u32));
        if end > len && !zero_seen {
            zero_seen = true;
            out.push(start.max(len) as u32);
        }
    }
    out
}

/// At most [`PER_FILE_AND_KIND`] violations of each kind per file.
fn bounded(all: BTreeSet<MapViolation>) -> Vec<MapViolation> {
    let mut seen: BTreeMap<(Option<FileId>, &'static str), usize> = BTreeMap::new();
    all.into_iter()
        .filter(|v| {
            let n = seen.entry((v.file_id(), v.kind())).or_default();
            *n += 1;
            *n <= PER_FILE_AND_KIND
        })
        .collect()
}

impl MapViolation {
    /// The kind's name, for counting and for JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnalignedPage { .. } => "unaligned_page",
            Self::NoSuchClass { .. } => "no_such_class",
            Self::PageWithoutTable { .. } => "page_without_table",
            Self::SliceOutOfBounds { .. } => "slice_out_of_bounds",
            Self::SlotOutOfRange { .. } => "slot_out_of_range",
            Self::ZeroSlot { .. } => "zero_slot",
            Self::DuplicateRule { .. } => "duplicate_rule",
            Self::OrphanTable { .. } => "orphan_table",
            Self::MalformedProcessMappings { .. } => "malformed_process_mappings",
        }
    }

    /// The file the violation is about, if one.
    pub fn file_id(&self) -> Option<FileId> {
        match self {
            Self::UnalignedPage { file_id, .. }
            | Self::NoSuchClass { file_id, .. }
            | Self::PageWithoutTable { file_id, .. }
            | Self::SliceOutOfBounds { file_id, .. }
            | Self::SlotOutOfRange { file_id, .. }
            | Self::ZeroSlot { file_id, .. }
            | Self::OrphanTable { file_id, .. } => Some(*file_id),
            Self::DuplicateRule { .. } | Self::MalformedProcessMappings { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests;
