//! The invariant checker: design invariants 1-4, checked against what the
//! simulated kernel really holds (invariant 6, slot reuse under a reader in
//! flight, is checked op by op by [`crate::slot_watch`]).
//!
//! * **Projection**: the maps hold exactly what the machine's state implies:
//!   every loaded file's pages, table and `interpreter_offsets` entry, the
//!   leftovers the book records,
//!   the unwind slots the book mirrors, nothing else (no leaked inner map).
//! * **Reader safety**: at any moment, a lookup of any address of any file
//!   that has a page entry either finds nothing (no page) or the answer the
//!   file's own deltas give. It never reaches a missing table, an array
//!   index out of range or an unwritten slot.
//! * **Lookup equivalence**: for every loaded file, the reader answers
//!   exactly what a direct search of its deltas answers, at every delta,
//!   one byte on either side, and at spread-out addresses, except in the
//!   dead pages of a long gap after an INVALID marker, where it must find
//!   no page ([`eim_sim::reader::in_dead_page`]).
//! * **Accounting**: the book's counters equal a recount of its contents.
//!
//! The expected answers come from the source deltas (what the provider gave
//! the manager), never from the encoded tables, so a wrong encoding cannot
//! check itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use eim_core::manager::StateView;
use eim_machine::abi::{StackDeltaPageKey, UnwindInfo, PAGE_BITS, PAGE_SIZE};
use eim_machine::deltas::IntervalData;
use eim_machine::machine::slots::SlotState;
use eim_machine::machine::{KernelBook, Timestamp};
use eim_machine::ops::MapOp;
use eim_machine::FileId;

use eim_sim::kernel::SimMaps;
use eim_sim::reader::{
    answer_of, expected, in_dead_page, Answer, LookupError, Resolved, SimReader,
};

/// The source deltas of every file the manager may have loaded.
pub type Sources = HashMap<FileId, IntervalData>;

/// A broken invariant, with enough detail to reproduce it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    Projection(String),
    ReaderSafety {
        file_id: FileId,
        address: u64,
        got: String,
        want: Option<Answer>,
    },
    LookupEquivalence {
        file_id: FileId,
        address: u64,
        got: String,
        want: Option<Answer>,
    },
    Accounting(String),
    /// A slot got a different rule while a reader may still follow an
    /// unpublished table to it (see [`crate::slot_watch`]).
    SlotReuse {
        slot: u32,
        from: UnwindInfo,
        to: UnwindInfo,
        since_reference: Duration,
        grace: Duration,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Projection(m) => write!(f, "projection: {m}"),
            Self::ReaderSafety {
                file_id,
                address,
                got,
                want,
            } => write!(
                f,
                "reader safety: file {file_id} address {address:#x}: reader {got}, deltas say {want:?}"
            ),
            Self::LookupEquivalence {
                file_id,
                address,
                got,
                want,
            } => write!(
                f,
                "lookup equivalence: file {file_id} address {address:#x}: reader {got}, deltas say {want:?}"
            ),
            Self::Accounting(m) => write!(f, "accounting: {m}"),
            Self::SlotReuse {
                slot,
                from,
                to,
                since_reference,
                grace,
            } => write!(
                f,
                "slot reuse: unwind_info_array[{slot}] changed from {from:?} to {to:?} {since_reference:?} after a published table last referenced it (grace {grace:?})"
            ),
        }
    }
}

impl std::error::Error for Violation {}

fn projection(msg: impl Into<String>) -> Violation {
    Violation::Projection(msg.into())
}

/// Invariant 1 (and 4 for the book): the maps are the projection of the
/// state. Call it when no call is in flight.
pub fn check_projection(state: &StateView, maps: &SimMaps) -> Result<(), Violation> {
    let book = &state.book;
    if state.in_flight != 0 {
        return Err(projection(format!(
            "{} extractions in flight at a quiescent point",
            state.in_flight
        )));
    }
    // Pages: those of loaded files plus the recorded leftovers, exactly.
    let mut want_pages: BTreeMap<StackDeltaPageKey, (FileId, u16)> = BTreeMap::new();
    for (file_id, table) in book.loaded() {
        for key in table.page_keys(*file_id) {
            want_pages.insert(key, (*file_id, table.map_ref.map_id));
        }
    }
    let mut leftover_pages = BTreeSet::new();
    let mut leftover_tables = BTreeSet::new();
    for (file_id, ops) in book.leftovers() {
        for op in ops {
            match op {
                MapOp::DeletePages(keys) => leftover_pages.extend(keys.iter().copied()),
                MapOp::DeleteDeltaTable { map_id, .. } => {
                    leftover_tables.insert((*map_id, *file_id));
                }
                MapOp::DeleteInterpreterOffsets { .. } => {}
                other => {
                    return Err(projection(format!(
                        "file {file_id}: leftover {other:?} is not a removal"
                    )))
                }
            }
        }
    }
    let pages = maps.pages();
    for (key, info) in &pages {
        let file_id = FileId(key.file_id);
        match want_pages.get(key) {
            Some((_, map_id)) if *map_id == info.map_id => {}
            Some((_, map_id)) => {
                return Err(projection(format!(
                "file {file_id} page {:#x} names class {} but the file's table is class {map_id}",
                key.page, info.map_id
            )))
            }
            None if leftover_pages.contains(key) => {}
            None => {
                return Err(projection(format!(
                    "orphan page entry: file {file_id} page {:#x}",
                    key.page
                )))
            }
        }
    }
    for key in want_pages.keys().chain(leftover_pages.iter()) {
        if !pages.contains_key(key) {
            return Err(projection(format!(
                "file {} page {:#x} is missing from the kernel",
                FileId(key.file_id),
                key.page
            )));
        }
    }
    // Tables: one per loaded file with a table, plus leftovers, exactly.
    let want_tables: BTreeSet<(u16, FileId)> = book
        .loaded()
        .iter()
        .map(|(id, t)| (t.map_ref.map_id, *id))
        .chain(leftover_tables.iter().copied())
        .collect();
    let tables = maps.delta_tables();
    let have_tables: BTreeSet<(u16, FileId)> = tables.keys().copied().collect();
    if have_tables != want_tables {
        let orphan: Vec<_> = have_tables.difference(&want_tables).collect();
        let missing: Vec<_> = want_tables.difference(&have_tables).collect();
        return Err(projection(format!(
            "delta tables differ: orphans {orphan:?}, missing {missing:?}"
        )));
    }
    if maps.live_inner_maps() != have_tables.len() {
        return Err(projection(format!(
            "{} inner maps alive for {} published tables (leaked inner maps)",
            maps.live_inner_maps(),
            have_tables.len()
        )));
    }
    // Page entries of a loaded file cover its whole table, in order.
    for (file_id, t) in book.loaded() {
        let mut next = 0u32;
        for key in t.page_keys(*file_id) {
            let info = pages[&key];
            if info.first_delta != next {
                return Err(projection(format!(
                    "file {file_id} page {:#x} starts at delta {} instead of {next}",
                    key.page, info.first_delta
                )));
            }
            next += u32::from(info.num_deltas);
        }
        let cap = 1u64 << t.map_ref.map_id;
        if u64::from(next) >= cap {
            return Err(projection(format!(
                "file {file_id}: {next} deltas do not fit class {}",
                t.map_ref.map_id
            )));
        }
    }
    // Unwind slots: the kernel array equals the book's mirror.
    let slots = book.slots();
    // Past both extents every slot is zero on both sides.
    let book_extent = slots
        .occupied()
        .last()
        .map_or(0, |(s, _)| usize::from(s) + 1);
    let extent = maps.unwind_info_extent().max(book_extent);
    for slot in 0..extent {
        let info = maps.unwind_info(slot as u32).unwrap_or_default();
        let want = slots.content(slot as u16).unwrap_or_default();
        if info != want {
            return Err(projection(format!(
                "unwind_info_array[{slot}] holds {info:?}, the book says {want:?}"
            )));
        }
    }
    // interpreter_offsets: every loaded file's entry, exactly; other entries
    // only where a leftover delete still owes their removal.
    let in_kernel = maps.interpreter_offsets();
    for (file_id, want) in book.interpreter_offsets() {
        match in_kernel.get(file_id) {
            Some(have) if have == want => {}
            other => {
                return Err(projection(format!(
                    "interpreter_offsets[{file_id}] holds {other:?}, the book says {want:?}"
                )))
            }
        }
    }
    for file_id in in_kernel.keys() {
        let owed = book.leftovers().get(file_id).is_some_and(|q| {
            q.iter()
                .any(|op| matches!(op, MapOp::DeleteInterpreterOffsets { .. }))
        });
        if !book.interpreter_offsets().contains_key(file_id) && !owed {
            return Err(projection(format!(
                "interpreter_offsets holds an entry of file {file_id} that no loaded file owns and no leftover removes"
            )));
        }
    }
    // Every table and offsets entry belongs to a file the manager knows.
    for file_id in book
        .loaded()
        .keys()
        .chain(book.interpreter_offsets().keys())
    {
        if !state.files.contains_key(file_id) {
            return Err(projection(format!(
                "file {file_id} has a table but no entry (a zombie table)"
            )));
        }
    }
    check_accounting(book)
}

/// What "rolled back" promises about a failed load's call: the maps hold
/// what they held `before` it, but for `unwind_info_array` slots no table
/// references (a rollback zeroes the slots it wrote, and one whose zeroing
/// failed leaves an unreferenced rule the book keeps as cooling; neither
/// is in use). Call it right after the call, with the book after it.
pub fn check_rolled_back(
    before: &SimMaps,
    after: &SimMaps,
    book: &KernelBook,
) -> Result<(), Violation> {
    let rolled = |what: &str| {
        projection(format!(
            "a rolled-back load changed {what} (only unreferenced slots may change)"
        ))
    };
    if after.pages() != before.pages() {
        return Err(rolled("the page map"));
    }
    if after.delta_tables() != before.delta_tables() {
        return Err(rolled("the delta tables"));
    }
    if after.interpreter_offsets() != before.interpreter_offsets() {
        return Err(rolled("interpreter_offsets"));
    }
    let (now, then) = (after.unwind_infos(), before.unwind_infos());
    for slot in 0..now.len().max(then.len()) {
        let (n, t) = (now.get(slot), then.get(slot));
        if n == t {
            continue;
        }
        let users = u16::try_from(slot).map_or(0, |s| book.slots().users(s));
        if users > 0 {
            return Err(rolled(&format!(
                "unwind_info_array[{slot}] ({t:?} -> {n:?}), which {users} tables use"
            )));
        }
    }
    Ok(())
}

/// Invariant 4 for the book: counters equal a recount.
pub fn check_accounting(book: &KernelBook) -> Result<(), Violation> {
    // Recounted from the keys each file's load wrote (dead pages have none).
    let mut pages = 0u64;
    for (file_id, t) in book.loaded() {
        let written = t.page_keys(*file_id).count() as u64;
        if written != u64::from(t.map_ref.page_entries) {
            return Err(Violation::Accounting(format!(
                "file {file_id}: {} page entries recorded but its page keys are {written}",
                t.map_ref.page_entries
            )));
        }
        pages += written;
    }
    if pages != book.pages_in_use() {
        return Err(Violation::Accounting(format!(
            "page gauge {} but loaded files own {pages} pages",
            book.pages_in_use()
        )));
    }
    for class in eim_machine::abi::SIZE_CLASS_MIN..=eim_machine::abi::SIZE_CLASS_MAX {
        let count = book
            .loaded()
            .values()
            .filter(|t| t.map_ref.map_id == class)
            .count() as u32;
        if count != book.tables_in_class(class) {
            return Err(Violation::Accounting(format!(
                "class {class}: counter {} but {count} loaded tables",
                book.tables_in_class(class)
            )));
        }
    }
    check_slot_accounting(book)
}

/// Invariant 4 for `unwind_info_array`: users per slot equal a recount of
/// the tables that may be published (loaded files and leftover tables),
/// and every slot below the high-water mark is in exactly one state: free
/// (zero), live (users, holds a rule), or cooling (no users); none is left
/// reserved between two calls.
fn check_slot_accounting(book: &KernelBook) -> Result<(), Violation> {
    let accounting = |m: String| Err(Violation::Accounting(m));
    let mut users: HashMap<u16, u32> = HashMap::new();
    let tables = book
        .loaded()
        .values()
        .map(|t| &t.slots)
        .chain(book.leftover_slots().values());
    for slots in tables {
        for slot in slots.iter() {
            *users.entry(*slot).or_default() += 1;
        }
    }
    // A leftover table's slots are recorded iff its removal is pending.
    for (file_id, ops) in book.leftovers() {
        let has_table = ops
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }));
        if has_table != book.leftover_slots().contains_key(file_id) {
            return accounting(format!(
                "file {file_id}: leftover table pending {has_table}, its slots recorded {}",
                !has_table
            ));
        }
    }
    if let Some(file_id) = book
        .leftover_slots()
        .keys()
        .find(|f| !book.leftovers().contains_key(f))
    {
        return accounting(format!(
            "file {file_id}: slots recorded for a leftover table that is not pending"
        ));
    }
    let slots = book.slots();
    let cooling: BTreeMap<u16, _> = slots.cooling().collect();
    let free: BTreeSet<u16> = slots.free().collect();
    if cooling.len() != slots.cooling().count() {
        return accounting("a slot is cooling twice".into());
    }
    for slot in 0..slots.high_water() {
        let slot = slot as u16;
        let want = users.get(&slot).copied().unwrap_or(0);
        let content = slots.content(slot);
        let state = slots.state(slot);
        let seen = SlotRecord {
            tables: want,
            content,
            cooling_until: cooling.get(&slot).copied(),
            listed_free: free.contains(&slot),
        };
        if !seen.agrees_with(state) {
            return accounting(format!(
                "slot {slot}: state {state:?}, holds {content:?}, {want} tables reference it"
            ));
        }
        if let Some(info) = content {
            if slots.slot_of(&info) != Some(slot) {
                return accounting(format!("slot {slot} holds {info:?} but is not indexed"));
            }
        }
    }
    if let Some(slot) = users
        .keys()
        .find(|s| usize::from(**s) >= slots.high_water())
    {
        return accounting(format!(
            "a table uses slot {slot}, above the high-water mark"
        ));
    }
    if let Some(slot) = free
        .iter()
        .chain(cooling.keys())
        .find(|s| usize::from(**s) >= slots.high_water())
    {
        return accounting(format!(
            "slot {slot} is free or cooling above the high-water mark"
        ));
    }
    if slots.occupied().count() != slots.in_use() {
        return accounting(format!(
            "{} occupied slots but the index has {}",
            slots.occupied().count(),
            slots.in_use()
        ));
    }
    Ok(())
}

/// What the book records of one slot, besides its state: the tables that
/// use it, its content, its place in the cooling queue and the free list.
#[derive(Clone, Copy, Debug)]
struct SlotRecord {
    tables: u32,
    content: Option<UnwindInfo>,
    cooling_until: Option<Timestamp>,
    listed_free: bool,
}

impl SlotRecord {
    /// Whether `state` is the one these records allow. The book keeps them
    /// consistent by construction, so no misuse of its API can break most
    /// of these; they are tested here, one record at a time.
    fn agrees_with(&self, state: SlotState) -> bool {
        match state {
            SlotState::Free => self.tables == 0 && self.content.is_none() && self.listed_free,
            SlotState::Live { users } => {
                users == self.tables && self.content.is_some() && self.cooling_until.is_none()
            }
            // A rollback may have zeroed a cooling slot: its content is
            // not part of its state.
            SlotState::Cooling { reusable_at } => {
                self.tables == 0 && self.cooling_until == Some(reusable_at) && !self.listed_free
            }
            // A plan's reservation outlived the plan.
            SlotState::Reserved => false,
        }
    }
}

/// The page-aligned addresses of every page from the first delta's page to
/// the last delta's, from the source deltas alone.
pub(crate) fn span_pages(data: &IntervalData) -> impl Iterator<Item = u64> {
    let first = data.first().map(|d| d.address >> PAGE_BITS);
    let last = data.last().map(|d| d.address >> PAGE_BITS);
    // No deltas: no pages.
    first
        .zip(last)
        .into_iter()
        .flat_map(|(first, last)| first..=last)
        .map(|p| p << PAGE_BITS)
}

/// Addresses worth looking up in one page of a file: every delta address in
/// it and one byte on either side, the page bounds, and `spread` evenly
/// spaced points.
fn page_samples(data: &IntervalData, page: u64, spread: u64) -> Vec<u64> {
    let end = page + PAGE_SIZE;
    let from = data.partition_point(|d| d.address < page);
    let mut out: Vec<u64> = vec![page, end - 1];
    for d in data.iter_from(from).take_while(|d| d.address < end) {
        out.extend([d.address.saturating_sub(1), d.address, d.address + 1]);
    }
    let step = (PAGE_SIZE / spread.max(1)).max(1);
    out.extend((0..spread).map(|i| page + (i * step + 7) % PAGE_SIZE));
    out.retain(|a| a >> PAGE_BITS == page >> PAGE_BITS);
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether one lookup result of a loaded file is what invariant 3 asks:
/// exactly "no page" in a dead page (eim writes no entry there), the answer
/// of the file's deltas everywhere else.
pub(crate) fn equivalent(
    result: &Result<Resolved, LookupError>,
    data: &IntervalData,
    address: u64,
) -> bool {
    if in_dead_page(data, address) {
        return matches!(result, Err(LookupError::TextSection { .. }));
    }
    answer_of(result) == expected(data, address)
}

/// Whether one lookup result is safe (invariant 2): no page, or the answer
/// of the file's deltas; never a missing table, an index out of range or
/// an unwritten slot.
fn reader_safe(result: &Result<Resolved, LookupError>, want: &Option<Answer>) -> bool {
    match result {
        // No page (another page of the file may be gone already).
        Err(LookupError::TextSection { .. }) => true,
        // These mean a page led somewhere it must not.
        Err(
            LookupError::OuterMap { .. }
            | LookupError::InnerMap { .. }
            | LookupError::Range { .. }
            | LookupError::BadUnwindInfoIndex { .. },
        ) => false,
        _ => answer_of(result) == *want,
    }
}

/// Invariant 2, for any moment (also between two ops of a plan): every
/// page entry leads to the right answer or to none.
pub fn check_reader_safety(
    maps: &SimMaps,
    sources: &Sources,
    spread: u64,
) -> Result<(), Violation> {
    let reader = SimReader::new(maps);
    for key in maps.pages().keys() {
        let file_id = FileId(key.file_id);
        let Some(data) = sources.get(&file_id) else {
            return Err(projection(format!(
                "page entry for file {file_id}, which no source ever produced"
            )));
        };
        check_addresses_safe(&reader, file_id, data, page_samples(data, key.page, spread))?;
    }
    Ok(())
}

/// Invariant 2 at `addresses` of `file_id`, whose source deltas are `data`.
pub(crate) fn check_addresses_safe(
    reader: &SimReader<'_>,
    file_id: FileId,
    data: &IntervalData,
    addresses: impl IntoIterator<Item = u64>,
) -> Result<(), Violation> {
    for address in addresses {
        let result = reader.lookup(file_id, address);
        let want = expected(data, address);
        if !reader_safe(&result, &want) {
            return Err(Violation::ReaderSafety {
                file_id,
                address,
                got: format!("{result:?}"),
                want,
            });
        }
    }
    Ok(())
}

/// Invariant 3, at a quiescent point: every loaded file answers like its
/// deltas, everywhere in its range.
pub fn check_lookup_equivalence(
    state: &StateView,
    maps: &SimMaps,
    sources: &Sources,
    spread: u64,
) -> Result<(), Violation> {
    let reader = SimReader::new(maps);
    for file_id in state.book.loaded().keys() {
        let Some(data) = sources.get(file_id) else {
            return Err(projection(format!("loaded file {file_id} has no source")));
        };
        // Every page of the span the source deltas give, dead ones too: a
        // dead page must have no entry, every other page the right answers.
        for page in span_pages(data) {
            for address in page_samples(data, page, spread) {
                let result = reader.lookup(*file_id, address);
                let want = expected(data, address);
                if !equivalent(&result, data, address) {
                    return Err(Violation::LookupEquivalence {
                        file_id: *file_id,
                        address,
                        got: format!("{result:?}"),
                        want,
                    });
                }
            }
        }
    }
    // A file known with deltas must be loaded; one without must not be.
    for file_id in state.files.keys() {
        let has_deltas = sources.get(file_id).is_some_and(|d| !d.is_empty());
        if has_deltas != state.book.loaded().contains_key(file_id) {
            return Err(projection(format!(
                "file {file_id} is known, has deltas: {has_deltas}, has a table: {}",
                !has_deltas
            )));
        }
    }
    Ok(())
}

/// All four invariants at a quiescent point.
pub fn check_all(state: &StateView, maps: &SimMaps, sources: &Sources) -> Result<(), Violation> {
    check_projection(state, maps)?;
    check_reader_safety(maps, sources, 16)?;
    check_lookup_equivalence(state, maps, sources, 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_machine::deltas::info::sp;

    const LATER: Timestamp = Timestamp(Duration::from_nanos(5));

    fn record(tables: u32, content: bool, cooling: bool, free: bool) -> SlotRecord {
        SlotRecord {
            tables,
            content: content.then(|| sp(8)),
            cooling_until: cooling.then_some(LATER),
            listed_free: free,
        }
    }

    /// Every combination of the four records against `state`: exactly the
    /// combinations `allowed` passes (tables, content, cooling, listed free).
    fn only(state: SlotState, allowed: impl Fn(u32, bool, bool, bool) -> bool) {
        for t in [0, 1, 2] {
            for c in [false, true] {
                for q in [false, true] {
                    for f in [false, true] {
                        assert_eq!(
                            record(t, c, q, f).agrees_with(state),
                            allowed(t, c, q, f),
                            "{state:?}: {t} tables, content {c}, cooling {q}, listed free {f}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_free_slot_has_no_table_no_content_and_is_listed_free() {
        only(SlotState::Free, |t, c, _, f| t == 0 && !c && f);
    }

    #[test]
    fn a_live_slot_has_as_many_tables_as_users_a_rule_and_no_cooling_time() {
        for users in [1, 2] {
            only(SlotState::Live { users }, |t, c, q, _| {
                t == users && c && !q
            });
        }
    }

    #[test]
    fn a_cooling_slot_serves_no_table_and_waits_for_its_time_off_the_free_list() {
        only(SlotState::Cooling { reusable_at: LATER }, |t, _, q, f| {
            t == 0 && q && !f
        });
        let early = SlotRecord {
            cooling_until: Some(Timestamp(Duration::from_nanos(4))),
            ..record(0, true, true, false)
        };
        assert!(!early.agrees_with(SlotState::Cooling { reusable_at: LATER }));
    }

    #[test]
    fn page_samples_are_each_delta_and_its_neighbours_the_bounds_and_the_spread() {
        use eim_machine::deltas::{hint, StackDelta};
        let page = 3 << PAGE_BITS;
        let at = |address| StackDelta::new(address, hint::NONE, sp(8));
        let data = IntervalData::from_deltas(vec![
            at(page - 0x10),
            at(page),
            at(page + 0x100),
            at(page + 0x200),
            at(page + PAGE_SIZE),
        ]);
        let got = page_samples(&data, page, 2);
        let mut want = vec![
            page,
            page + 1,
            page + 0xff,
            page + 0x100,
            page + 0x101,
            page + 0x1ff,
            page + 0x200,
            page + 0x201,
            page + PAGE_SIZE - 1,
            // The spread: two points half a page apart, 7 bytes in.
            page + 7,
            page + PAGE_SIZE / 2 + 7,
        ];
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn a_reserved_slot_never_agrees() {
        for t in [0, 1] {
            assert!(!record(t, true, false, false).agrees_with(SlotState::Reserved));
        }
    }
}
