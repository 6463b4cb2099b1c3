//! The checker's own tests: the simulator, the model test and the fault
//! tests all pass when the checker says nothing, so a checker that cannot
//! fail would make every one of them pass. Each test here breaks one thing
//! of a healthy state (the kernel maps written behind the manager's back,
//! or the state view the checker is given) and requires the violation that
//! names it, and the healthy state first passes.

use std::sync::Arc;

use eim_analysis::LibcInfo;
use eim_core::manager::{ManualClock, StateView};
use eim_core::provider::{Extraction, MemoryProvider};
use eim_core::{Config, ExecutableInfoManager, Tracers};
use eim_machine::abi::{OffsetRange, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo};
use eim_machine::deltas::hint;
use eim_machine::deltas::info::sp;
use eim_machine::machine::audit::{audit, MapViolation};
use eim_machine::ops::{Backend, MapOp};
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};
use eim_sim_harness::fixtures::{deltas, python, three_pages};
use eim_sim_harness::{
    check_accounting, check_all, check_lookup_equivalence, check_projection, check_reader_safety,
    check_rolled_back, Sources, Violation,
};

/// Three pages, an interpreter entry.
const FILE: FileId = FileId(0xf11e);
/// One page before a gap whose middle pages are dead, then one more.
const GAPPY: FileId = FileId(0x6a9);
/// Known to the sources, never loaded.
const STRANGER: FileId = FileId(0x5e7);

struct Healthy {
    state: StateView,
    maps: SimMaps,
    sources: Sources,
}

/// FILE and GAPPY loaded by the manager over plain sim maps.
fn healthy() -> Healthy {
    let files = [
        (FILE, three_pages()),
        (
            GAPPY,
            deltas(&[
                (0x10_0000, hint::KEEP, 8),
                (0x10_0100, hint::GAP, 0),
                (0x30_0000, hint::KEEP, 56),
                (0x30_0100, hint::GAP, 0),
            ]),
        ),
        (
            STRANGER,
            deltas(&[(0x1000, hint::KEEP, 8), (0x1100, hint::GAP, 0)]),
        ),
    ];
    let sources: Sources = files.iter().cloned().collect();
    let provider = Arc::new(MemoryProvider::new());
    for (id, data) in files {
        let interpreters = match id {
            FILE => python(),
            _ => Vec::new(),
        };
        provider.set(
            id,
            Ok(Extraction {
                data,
                libc: LibcInfo::default(),
                interpreters,
            }),
        );
    }
    let m = ExecutableInfoManager::with_config(
        provider,
        SimMaps::new(SimConfig::default()).expect("sim maps"),
        Tracers::none(),
        Config::default(),
        Box::new(Arc::new(ManualClock::new())),
    );
    m.add_or_inc_ref(FILE, &FILE).expect("FILE");
    m.add_or_inc_ref(GAPPY, &GAPPY).expect("GAPPY");
    let state = m.state();
    let maps = m.with_backend(|b| b.clone());
    check_all(&state, &maps, &sources).expect("the healthy state passes");
    Healthy {
        state,
        maps,
        sources,
    }
}

impl Healthy {
    /// The maps with `op` applied behind the manager's back.
    fn written(&self, op: MapOp) -> SimMaps {
        let mut maps = self.maps.clone();
        maps.apply(&op).expect("the corruption applies");
        maps
    }

    /// The maps with FILE's page `n` replaced by `info`.
    fn page_replaced(&self, n: usize, info: StackDeltaPageInfo) -> SimMaps {
        let (key, _) = self.page_of(FILE, n);
        let mut maps = self.written(MapOp::DeletePages(vec![key]));
        maps.apply(&MapOp::PutPages(vec![(key, info)]))
            .expect("the corruption applies");
        maps
    }

    fn page_of(&self, file_id: FileId, n: usize) -> (StackDeltaPageKey, StackDeltaPageInfo) {
        let key = self.state.book.loaded()[&file_id]
            .page_keys(file_id)
            .nth(n)
            .expect("the page");
        (key, self.maps.page(&key).expect("in the kernel"))
    }

    /// A slot FILE's table uses and GAPPY's does not.
    fn file_slot(&self) -> u16 {
        let gappy = &self.state.book.loaded()[&GAPPY].slots;
        let file = &self.state.book.loaded()[&FILE].slots;
        let slot = file.iter().find(|s| !gappy.contains(s));
        *slot.expect("FILE has a rule of its own")
    }
}

fn projection_says(result: Result<(), Violation>, words: &str) {
    match result {
        Err(v @ Violation::Projection(_)) => {
            let shown = v.to_string();
            assert!(
                shown.starts_with("projection: ") && shown.contains(words),
                "{shown}"
            );
        }
        other => panic!("wanted a projection violation with {words:?}, got {other:?}"),
    }
}

fn reader_unsafe(result: Result<(), Violation>) {
    match result {
        Err(v @ Violation::ReaderSafety { address, .. }) => {
            // The report names the check and the address to reproduce it.
            let shown = v.to_string();
            assert!(shown.starts_with("reader safety: file "), "{shown}");
            assert!(shown.contains(&format!("address {address:#x}")), "{shown}");
        }
        other => panic!("wanted a reader-safety violation, got {other:?}"),
    }
}

#[test]
fn an_orphan_page_entry_is_caught() {
    let h = healthy();
    let (_, info) = h.page_of(FILE, 0);
    let stray = StackDeltaPageKey {
        file_id: STRANGER.0,
        page: 0,
    };
    let maps = h.written(MapOp::PutPages(vec![(stray, info)]));
    projection_says(check_projection(&h.state, &maps), "orphan page entry");
}

#[test]
fn a_missing_page_entry_is_caught() {
    let h = healthy();
    let (key, _) = h.page_of(FILE, 1);
    let maps = h.written(MapOp::DeletePages(vec![key]));
    projection_says(check_projection(&h.state, &maps), "missing from the kernel");
}

#[test]
fn a_page_naming_another_class_is_caught() {
    let h = healthy();
    let (_, info) = h.page_of(FILE, 0);
    let wrong = StackDeltaPageInfo {
        map_id: info.map_id + 1,
        ..info
    };
    let maps = h.page_replaced(0, wrong);
    projection_says(check_projection(&h.state, &maps), "names class");
    reader_unsafe(check_reader_safety(&maps, &h.sources, 4));
}

#[test]
fn a_page_starting_at_the_wrong_delta_is_caught() {
    let h = healthy();
    let (_, info) = h.page_of(FILE, 1);
    let shifted = StackDeltaPageInfo {
        first_delta: info.first_delta + 1,
        ..info
    };
    let maps = h.page_replaced(1, shifted);
    projection_says(check_projection(&h.state, &maps), "starts at delta");
}

#[test]
fn pages_claiming_more_deltas_than_the_class_holds_are_caught() {
    let h = healthy();
    let (_, info) = h.page_of(FILE, 2);
    let long = StackDeltaPageInfo {
        num_deltas: u16::MAX,
        ..info
    };
    let maps = h.page_replaced(2, long);
    projection_says(check_projection(&h.state, &maps), "do not fit class");
}

#[test]
fn a_missing_or_orphan_table_is_caught() {
    let h = healthy();
    let class = h.state.book.loaded()[&FILE].map_ref.map_id;
    let maps = h.written(MapOp::DeleteDeltaTable {
        file_id: FILE,
        map_id: class,
    });
    projection_says(check_projection(&h.state, &maps), "missing [(");
    // Pages that lead to no table: a reader would fail there.
    reader_unsafe(check_reader_safety(&maps, &h.sources, 4));

    let maps = h.written(MapOp::PutDeltaTable {
        file_id: STRANGER,
        map_id: class,
        deltas: Arc::from(vec![eim_machine::abi::StackDelta::default(); 2]),
    });
    projection_says(check_projection(&h.state, &maps), "orphans [(");
}

#[test]
fn a_slot_holding_another_rule_is_caught() {
    let h = healthy();
    let slot = h.file_slot();
    let other = UnwindInfo {
        opcode: 2,
        param: 1_000,
        ..UnwindInfo::default()
    };
    let maps = h.written(MapOp::PutUnwindInfos(vec![(slot, other)]));
    projection_says(
        check_projection(&h.state, &maps),
        &format!("unwind_info_array[{slot}] holds"),
    );
    // The simulator's quiescent check reports it too.
    projection_says(
        check_all(&h.state, &maps, &h.sources),
        &format!("unwind_info_array[{slot}] holds"),
    );
    reader_unsafe(check_reader_safety(&maps, &h.sources, 4));
}

#[test]
fn the_books_last_slot_zeroed_in_the_kernel_is_caught() {
    // The kernel's array then ends before the book's: the check must
    // reach the book's last slot too.
    let h = healthy();
    let (last, _) = h
        .state
        .book
        .slots()
        .occupied()
        .last()
        .expect("slots in use");
    let maps = h.written(MapOp::PutUnwindInfos(vec![(last, UnwindInfo::default())]));
    assert!(maps.unwind_info_extent() <= usize::from(last));
    projection_says(
        check_projection(&h.state, &maps),
        &format!("unwind_info_array[{last}] holds"),
    );
}

#[test]
fn a_rule_in_a_slot_the_book_thinks_free_is_caught() {
    // Past the book's extent: the check must look beyond it.
    let h = healthy();
    let far = 40;
    assert!(h.state.book.slots().content(far).is_none());
    let maps = h.written(MapOp::PutUnwindInfos(vec![(far, sp(8))]));
    projection_says(
        check_projection(&h.state, &maps),
        &format!("unwind_info_array[{far}] holds"),
    );
}

#[test]
fn a_wrong_missing_or_orphan_offsets_entry_is_caught() {
    let h = healthy();
    let maps = h.written(MapOp::PutInterpreterOffsets {
        file_id: FILE,
        range: OffsetRange {
            lower_offset1: 1,
            ..OffsetRange::default()
        },
    });
    projection_says(check_projection(&h.state, &maps), "interpreter_offsets[");
    let maps = h.written(MapOp::DeleteInterpreterOffsets { file_id: FILE });
    projection_says(check_projection(&h.state, &maps), "holds None");
    let maps = h.written(MapOp::PutInterpreterOffsets {
        file_id: STRANGER,
        range: OffsetRange::default(),
    });
    projection_says(check_projection(&h.state, &maps), "no loaded file owns");
}

#[test]
fn a_table_of_a_file_the_manager_forgot_is_caught() {
    let mut h = healthy();
    h.state.files.remove(&GAPPY);
    projection_says(check_projection(&h.state, &h.maps), "zombie table");
    h.state.files.remove(&FILE);
    projection_says(check_projection(&h.state, &h.maps), "zombie table");
}

#[test]
fn an_extraction_in_flight_at_a_quiescent_point_is_caught() {
    let mut h = healthy();
    h.state.in_flight = 1;
    projection_says(check_projection(&h.state, &h.maps), "in flight");
}

#[test]
fn a_page_entry_in_a_dead_page_is_caught() {
    let h = healthy();
    let dead = h.state.book.loaded()[&GAPPY].dead_pages.first().cloned();
    let dead = dead.expect("GAPPY's gap has dead pages");
    let (_, info) = h.page_of(GAPPY, 0);
    let key = StackDeltaPageKey {
        file_id: GAPPY.0,
        page: dead.start,
    };
    let maps = h.written(MapOp::PutPages(vec![(key, info)]));
    let result = check_lookup_equivalence(&h.state, &maps, &h.sources, 4);
    assert!(
        matches!(result, Err(Violation::LookupEquivalence { file_id, .. }) if file_id == GAPPY),
        "{result:?}"
    );
}

#[test]
fn a_wrong_answer_is_caught_by_lookup_equivalence() {
    let h = healthy();
    let slot = h.file_slot();
    let maps = h.written(MapOp::PutUnwindInfos(vec![(slot, sp(1_000))]));
    let result = check_lookup_equivalence(&h.state, &maps, &h.sources, 4);
    assert!(
        matches!(result, Err(Violation::LookupEquivalence { file_id, .. }) if file_id == FILE),
        "{result:?}"
    );
    let shown = result.unwrap_err().to_string();
    assert!(
        shown.starts_with(&format!("lookup equivalence: file {FILE} address 0x")),
        "{shown}"
    );
}

#[test]
fn a_known_file_without_its_table_is_caught() {
    let mut h = healthy();
    // STRANGER has deltas and an entry, but no table.
    let entry = h.state.files[&FILE].clone();
    h.state.files.insert(STRANGER, entry);
    projection_says(
        check_lookup_equivalence(&h.state, &h.maps, &h.sources, 4),
        "has deltas: true, has a table: false",
    );
}

#[test]
fn a_page_of_a_file_no_source_produced_is_caught() {
    let mut h = healthy();
    h.sources.remove(&GAPPY);
    projection_says(
        check_reader_safety(&h.maps, &h.sources, 4),
        "which no source ever produced",
    );
    projection_says(
        check_lookup_equivalence(&h.state, &h.maps, &h.sources, 4),
        "has no source",
    );
}

#[test]
fn rolled_back_allows_only_unused_slots_to_change() {
    let h = healthy();
    let book = &h.state.book;
    assert_eq!(check_rolled_back(&h.maps, &h.maps, book), Ok(()));
    let far = 40;
    let unused = h.written(MapOp::PutUnwindInfos(vec![(far, sp(8))]));
    assert_eq!(
        check_rolled_back(&h.maps, &unused, book),
        Ok(()),
        "a slot no table uses"
    );
    let slot = h.file_slot();
    let used = h.written(MapOp::PutUnwindInfos(vec![(slot, sp(1_000))]));
    projection_says(
        check_rolled_back(&h.maps, &used, book),
        &format!("unwind_info_array[{slot}]"),
    );
    let (key, _) = h.page_of(FILE, 0);
    let page = h.written(MapOp::DeletePages(vec![key]));
    projection_says(check_rolled_back(&h.maps, &page, book), "the page map");
    let class = book.loaded()[&GAPPY].map_ref.map_id;
    let table = h.written(MapOp::DeleteDeltaTable {
        file_id: GAPPY,
        map_id: class,
    });
    projection_says(check_rolled_back(&h.maps, &table, book), "the delta tables");
    let offsets = h.written(MapOp::DeleteInterpreterOffsets { file_id: FILE });
    projection_says(
        check_rolled_back(&h.maps, &offsets, book),
        "interpreter_offsets",
    );
}

/// A book and a plan for FILE's deltas, for the accounting tests: the book
/// can only be made inconsistent by a caller misusing it, which is what
/// the accounting check is there to notice (a manager bug).
fn book_and_plan() -> (
    eim_machine::machine::KernelBook,
    eim_machine::machine::LoadManyPlan,
) {
    let mut book = eim_machine::machine::KernelBook::new(Default::default());
    let data = deltas(&[
        (0x7_0100, hint::KEEP, 8),
        (0x8_0200, hint::KEEP, 24),
        (0x8_0240, hint::GAP, 0),
    ]);
    let plan = book.plan_load(FILE, &data, None).expect("a plan");
    (book, plan)
}

fn accounting_says(result: Result<(), Violation>, words: &str) {
    match result {
        Err(v @ Violation::Accounting(_)) => {
            let shown = v.to_string();
            assert!(
                shown.starts_with("accounting: ") && shown.contains(words),
                "{shown}"
            );
        }
        other => panic!("wanted an accounting violation with {words:?}, got {other:?}"),
    }
}

#[test]
fn a_plan_neither_committed_nor_aborted_is_caught() {
    let (mut book, plan) = book_and_plan();
    accounting_says(check_accounting(&book), "Reserved");
    book.commit_load(plan);
    assert_eq!(check_accounting(&book), Ok(()));
}

// The two misuses below break an assertion of the machine itself in a
// debug build (the first to see them); the checker is shown to catch them
// in a release build.
#[test]
#[cfg_attr(
    debug_assertions,
    should_panic(expected = "commit: the book's accounting")
)]
fn a_plan_committed_twice_is_caught() {
    let (mut book, plan) = book_and_plan();
    book.commit_load(plan.clone());
    assert_eq!(check_accounting(&book), Ok(()));
    book.commit_load(plan);
    accounting_says(check_accounting(&book), "page gauge");
}

#[test]
fn a_plan_committed_to_another_book_is_caught() {
    // Its slots were reserved in the first book: the second never handed
    // them out, yet a table of it uses them.
    let (_, plan) = book_and_plan();
    let mut other = eim_machine::machine::KernelBook::new(Default::default());
    other.commit_load(plan);
    accounting_says(check_accounting(&other), "above the high-water mark");
}

#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "free, yet"))]
fn a_plan_committed_after_it_was_rolled_back_is_caught() {
    // The rollback freed the plan's slots; committing it anyway leaves a
    // table that uses free slots.
    let (mut book, plan) = book_and_plan();
    let stopped = eim_machine::machine::Stopped {
        at: 0,
        failure: eim_machine::ops::OpFailure::new(eim_machine::ops::Errno::ENOMEM, 0),
    };
    let rollback = book.abort_load(&plan, stopped);
    assert!(book.finish_rollback(rollback, Ok(())));
    assert_eq!(check_accounting(&book), Ok(()));
    book.commit_load(plan);
    accounting_says(check_accounting(&book), "state Free");
}

// The maps-alone audit (`eim status`), which has no book: what each
// corruption above breaks that the maps themselves can show, it reports;
// the healthy maps it passes.

fn audited(maps: &SimMaps) -> Vec<MapViolation> {
    audit(&maps.observed(), maps.config().unwind_info).violations
}

fn audit_says(maps: &SimMaps, kind: &str, file: Option<FileId>) {
    let found = audited(maps);
    assert!(
        found
            .iter()
            .any(|v| v.kind() == kind && v.file_id() == file),
        "wanted {kind} of {file:?}, got {found:?}"
    );
}

#[test]
fn the_audit_passes_the_healthy_maps_and_says_what_each_file_holds() {
    let h = healthy();
    let a = audit(&h.maps.observed(), h.maps.config().unwind_info);
    assert_eq!(a.violations, []);
    let loaded = h.state.book.loaded();
    let ids: Vec<FileId> = a.files.iter().map(|f| f.file_id).collect();
    assert_eq!(ids, loaded.keys().copied().collect::<Vec<_>>());
    for f in &a.files {
        let table = &loaded[&f.file_id];
        assert_eq!(f.classes, [table.map_ref.map_id]);
        assert_eq!(f.pages, table.page_keys(f.file_id).count());
        let book_slots: std::collections::BTreeSet<u16> = table.slots.iter().copied().collect();
        assert_eq!(f.slots, book_slots, "file {}", f.file_id);
    }
    assert_eq!(
        a.files
            .iter()
            .find(|f| f.file_id == FILE)
            .and_then(|f| f.interpreter_offsets)
            .is_some(),
        h.maps.interpreter_offsets().contains_key(&FILE)
    );
}

#[test]
fn the_audit_reports_a_corrupted_page_entry() {
    let h = healthy();
    let (_, info) = h.page_of(FILE, 0);
    let maps = h.page_replaced(
        0,
        StackDeltaPageInfo {
            map_id: info.map_id + 1,
            ..info
        },
    );
    audit_says(&maps, "page_without_table", Some(FILE));
    let maps = h.page_replaced(
        2,
        StackDeltaPageInfo {
            num_deltas: u16::MAX,
            ..h.page_of(FILE, 2).1
        },
    );
    audit_says(&maps, "slice_out_of_bounds", Some(FILE));
}

#[test]
fn the_audit_reports_a_corrupted_table() {
    let h = healthy();
    let class = h.state.book.loaded()[&FILE].map_ref.map_id;
    let mut deltas = h
        .maps
        .delta_table(class, FILE)
        .expect("FILE's table")
        .entries();
    // The first delta naming a slot now names one past the array.
    let named = deltas
        .iter_mut()
        .find(|d| d.unwind_info & eim_machine::abi::DELTA_COMMAND_FLAG == 0)
        .expect("a delta naming a slot");
    named.unwind_info = 0x7fff;
    let mut maps = h.written(MapOp::DeleteDeltaTable {
        file_id: FILE,
        map_id: class,
    });
    audit_says(&maps, "page_without_table", Some(FILE));
    maps.apply(&MapOp::PutDeltaTable {
        file_id: FILE,
        map_id: class,
        deltas: Arc::from(deltas),
    })
    .expect("the corruption applies");
    audit_says(&maps, "slot_out_of_range", Some(FILE));
    // A table without pages.
    let maps = h.written(MapOp::PutDeltaTable {
        file_id: STRANGER,
        map_id: class,
        deltas: Arc::from(vec![eim_machine::abi::StackDelta::default(); 2]),
    });
    audit_says(&maps, "orphan_table", Some(STRANGER));
}

#[test]
fn the_audit_reports_a_corrupted_slot() {
    let h = healthy();
    let slot = h.file_slot();
    let maps = h.written(MapOp::PutUnwindInfos(vec![(slot, UnwindInfo::default())]));
    audit_says(&maps, "zero_slot", Some(FILE));
    // Another slot given FILE's rule: one rule in two slots.
    let rule = h.maps.unwind_info(u32::from(slot)).expect("the slot");
    let maps = h.written(MapOp::PutUnwindInfos(vec![(40, rule)]));
    audit_says(&maps, "duplicate_rule", None);
}

/// The checker sees the maps and the state view from outside; the book's
/// own recount (every commit and rollback) is the inside check the
/// simulator's debug runs add to it.
#[test]
fn the_simulator_runs_with_the_books_recount() {
    assert_eq!(eim_machine::RECOUNTS_BOOK, cfg!(debug_assertions));
}
