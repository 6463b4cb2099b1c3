//! Every way the load of a 3-page file can fail part way: each op of its
//! plan failing outright, and each batch stopping after every possible
//! element count. The maps must end exactly as before the call, the manager
//! state unchanged, and the next attempt (after the deferral) must succeed.

use eim_machine::deltas::info::sp;
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::ManualClock;
use eim_core::Error;
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::Errno;
use eim_machine::FileId;
use eim_sim_harness::fixtures::three_pages;
use eim_sim_harness::world::{CheckedManager, CheckedWorld, WorldSpec};
use eim_sim_harness::{check_all, Sources};

const FILE: FileId = FileId(0xf11e);
const OTHER: FileId = FileId(0x07e7);

fn other() -> IntervalData {
    let mut d = IntervalData::new();
    d.add(StackDelta::new(0x1000, hint::KEEP, sp(8)));
    d.add(StackDelta::new(0x1100, hint::GAP, info::INVALID));
    d
}

type Manager = CheckedManager;

fn setup() -> (Manager, Arc<ManualClock>, Arc<Sources>) {
    let (m, clock, sources) = manager_over([(FILE, three_pages()), (OTHER, other())]);
    // Another file is loaded already, so the failing load shares a slot
    // with it and must not disturb it.
    m.add_or_inc_ref(OTHER, &OTHER)
        .expect("load the other file");
    (m, clock, sources)
}

/// A manager over checked sim maps that knows `files`, none loaded.
fn manager_over(
    files: impl IntoIterator<Item = (FileId, IntervalData)>,
) -> (Manager, Arc<ManualClock>, Arc<Sources>) {
    let spec = WorldSpec {
        watch_slots: Some(eim_machine::machine::slots::DEFAULT_SLOT_GRACE),
        ..WorldSpec::default()
    };
    let w = CheckedWorld::new(files, &spec);
    (w.manager, w.clock, w.sources)
}

/// How a failure is injected: (op number in the plan, elements done).
fn injections() -> Vec<(u64, Option<usize>)> {
    // The plan: put 3 new unwind infos, put the table, put 3 pages.
    let mut out = Vec::new();
    for k in 0..3u64 {
        out.push((k, None));
    }
    for after in 1..3 {
        out.push((0, Some(after)));
        out.push((2, Some(after)));
    }
    out
}

#[test]
fn the_plan_is_three_ops_over_three_pages() {
    let (m, _, _) = setup();
    let before = m.with_backend(|b| b.maps.ops_applied());
    m.add_or_inc_ref(FILE, &FILE).unwrap();
    let ops = m.with_backend(|b| b.maps.ops_applied()) - before;
    assert_eq!(ops, 3, "slots, table, pages");
    let pages = m.with_backend(|b| b.maps.pages().len());
    assert_eq!(pages, 3 + 1);
}

#[test]
fn failing_any_op_of_a_load_leaves_maps_and_state_as_before() {
    for (k, stop_after) in injections() {
        for errno in [Errno::ENOMEM, Errno::E2BIG, Errno::EBUSY, Errno::EFAULT] {
            let (m, clock, sources) = setup();
            let maps_before = m.with_backend(|b| b.maps.clone());
            let state_before = m.state();
            m.with_backend(|b| match stop_after {
                None => b.maps.fail_op(k, errno),
                Some(after) => b.maps.stop_batch(k, after, errno),
            });
            let what = format!("op {k}, stopped after {stop_after:?}, {errno}");

            let err = m.add_or_inc_ref(FILE, &FILE).unwrap_err();
            assert!(
                matches!(err, Error::Kernel { rolled_back: true, errno: e, .. } if e == errno),
                "{what}: {err}"
            );
            m.with_backend(|b| {
                assert!(b.maps == maps_before, "{what}: maps changed");
                assert_eq!(b.violation, None, "{what}");
            });
            let state = m.state();
            assert_eq!(state.files.len(), state_before.files.len(), "{what}");
            assert_eq!(state.book.loaded(), state_before.book.loaded(), "{what}");
            assert_eq!(
                state.book.slots().in_use(),
                state_before.book.slots().in_use(),
                "{what}"
            );
            assert_eq!(
                state.book.pages_in_use(),
                state_before.book.pages_in_use(),
                "{what}"
            );
            assert_eq!(state.book.leftover_ops(), 0, "{what}");
            m.with_backend(|b| check_all(&state, &b.maps, &sources))
                .unwrap();

            // Deferred now; after the deferral the same load succeeds.
            assert_eq!(
                m.add_or_inc_ref(FILE, &FILE).unwrap_err(),
                Error::Deferred { file_id: FILE }
            );
            clock.advance(Duration::from_secs(91));
            m.add_or_inc_ref(FILE, &FILE)
                .unwrap_or_else(|e| panic!("{what}: retry: {e}"));
            let state = m.state();
            m.with_backend(|b| {
                check_all(&state, &b.maps, &sources).unwrap();
                assert_eq!(b.violation, None);
            });
        }
    }
}

#[test]
fn a_failing_rollback_is_finished_by_a_later_call() {
    // The page batch stops after 2 pages; the rollback's page delete then
    // stops after 1: one page and the table stay, recorded as leftovers.
    let (m, clock, sources) = setup();
    m.with_backend(|b| {
        b.maps.stop_batch(2, 2, Errno::ENOMEM);
        b.maps.stop_batch(3, 1, Errno::EBUSY);
    });
    let err = m.add_or_inc_ref(FILE, &FILE).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Kernel {
                rolled_back: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("will be retried"), "{err}");
    let state = m.state();
    assert_eq!(
        state.book.leftover_ops(),
        2,
        "the rest of the page delete, then the table"
    );
    m.with_backend(|b| {
        check_all(&state, &b.maps, &sources).unwrap();
        assert_eq!(b.violation, None);
    });
    // The next call of any kind retries the removal first.
    clock.advance(Duration::from_secs(91));
    m.add_or_inc_ref(FILE, &FILE).unwrap();
    let state = m.state();
    assert_eq!(state.book.leftover_ops(), 0);
    m.with_backend(|b| check_all(&state, &b.maps, &sources))
        .unwrap();
}

#[test]
fn every_unload_failure_is_cleaned_up_later() {
    for (k, stop_after) in [(0u64, None), (0, Some(1)), (0, Some(2)), (1, None)] {
        let (m, _, sources) = setup();
        m.add_or_inc_ref(FILE, &FILE).unwrap();
        m.with_backend(|b| match stop_after {
            None => b.maps.fail_op(k, Errno::EBUSY),
            Some(after) => b.maps.stop_batch(k, after, Errno::EBUSY),
        });
        let err = m.remove_or_dec_ref(FILE).unwrap_err();
        assert!(matches!(err, Error::UnloadIncomplete { .. }), "{err}");
        let state = m.state();
        assert!(
            !state.files.contains_key(&FILE),
            "the reference is released regardless"
        );
        m.with_backend(|b| {
            check_all(&state, &b.maps, &sources).unwrap();
            assert_eq!(b.violation, None);
        });
        assert_eq!(m.retry_leftovers(), 0);
        let state = m.state();
        m.with_backend(|b| check_all(&state, &b.maps, &sources))
            .unwrap();
        m.remove_or_dec_ref(OTHER).unwrap();
        m.with_backend(|b| assert!(b.maps.holds_no_file_data(), "back to the baseline"));
    }
}

/// Rules no other file uses (for `a_batch_rollback_stopped_before_its_slot_zeroing_keeps_the_rules_the_book_believes`).
fn lone_rules() -> IntervalData {
    let mut d = IntervalData::new();
    d.add(StackDelta::new(0x2_0100, hint::KEEP, sp(48)));
    d.add(StackDelta::new(0x2_0180, hint::KEEP, sp(56)));
    d.add(StackDelta::new(0x2_0200, hint::GAP, info::INVALID));
    d
}

#[test]
fn a_batch_rollback_stopped_before_its_slot_zeroing_keeps_the_rules_the_book_believes() {
    // A double fault (issue 15): a batch of FILE and LONE fails at its
    // page write; its rollback deletes FILE's table, then fails to delete
    // LONE's, and never reaches the op that zeroes the new slots. LONE's
    // table stays (a leftover, its slots kept); FILE's table is gone, and
    // its new slots still hold their rules in the kernel: the book must
    // say so too (a book believing them zeroed would hand a slot "holding
    // zeros" to the next file without writing it).
    const LONE: FileId = FileId(0x1011e);
    let (m, clock, sources) = manager_over([
        (FILE, three_pages()),
        (OTHER, other()),
        (LONE, lone_rules()),
    ]);
    // Plan: new slots, one table op (both files are class 8), the pages.
    // The rollback: delete FILE's table, delete LONE's, zero the slots.
    m.with_backend(|b| {
        b.maps.fail_op(2, Errno::EBUSY);
        b.maps.fail_op(4, Errno::EBUSY);
    });
    let results = m.load_many(&[(FILE, &FILE), (LONE, &LONE)]);
    assert!(results.iter().all(Result::is_err), "{results:?}");
    let state = m.state();
    assert!(
        state.book.leftovers().contains_key(&LONE),
        "LONE's table stays"
    );
    assert!(
        !state.book.leftovers().contains_key(&FILE),
        "FILE's table went"
    );
    m.with_backend(|b| {
        check_all(&state, &b.maps, &sources).unwrap_or_else(|v| panic!("{v}"));
        assert_eq!(b.violation, None);
    });
    // Later calls finish the removal and load both again.
    clock.advance(Duration::from_secs(91));
    m.add_or_inc_ref(FILE, &FILE).expect("FILE");
    m.add_or_inc_ref(LONE, &LONE).expect("LONE");
    let state = m.state();
    assert_eq!(state.book.leftover_ops(), 0);
    m.with_backend(|b| check_all(&state, &b.maps, &sources))
        .unwrap_or_else(|v| panic!("{v}"));
}
