use super::*;
use crate::abi::UnwindInfo;
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
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
    let kinds: Vec<_> = plan.ops.iter().map(MapOp::name).collect();
    assert_eq!(kinds, ["put unwind infos", "put delta table", "put pages"]);
    assert_eq!(plan.ops[0].len(), 3);
    assert_eq!(plan.ops[2].len(), 3);
    let refs = book.commit_load(plan);
    assert_eq!(refs.len(), 1, "a batch of one");
    assert_eq!(refs[0].1.num_pages, 3);
    assert_eq!(book.pages_in_use(), 3);
    assert_eq!(book.tables_in_class(8), 1);
    assert_eq!(book.slots().users(0), 1);
}

#[test]
fn unload_goes_top_down_and_releases_accounting() {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
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
            let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
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
                let elsewhere = other.plan_load(FileId(1), &three_pages(), None).unwrap();
                assert_ne!(elsewhere.ops[0], plan.ops[0]);
                let mut tiny = KernelBook::with_slot_grace(
                    Capacities {
                        unwind_slots: 3,
                        ..Capacities::default()
                    },
                    DEFAULT_SLOT_GRACE,
                );
                let first = tiny.plan_load(FileId(1), &three_pages(), None).unwrap();
                let rollback = tiny.abort_load(&first, stop(at, done));
                assert!(tiny.finish_rollback(rollback, Ok(())));
                assert_eq!(
                    tiny.plan_load(FileId(1), &three_pages(), None).err(),
                    Some(PlanError::MapFull {
                        map: MapKind::UnwindInfo,
                        capacity: 3
                    }),
                    "no reuse inside the grace period at op {at}/{done}"
                );
                tiny.advance_to(Timestamp::default().after(DEFAULT_SLOT_GRACE));
                let again = tiny.plan_load(FileId(1), &three_pages(), None).unwrap();
                assert_eq!(again.ops[0], first.ops[0]);
            } else {
                // Never reachable: free at once, the next plan gets them.
                assert_eq!(book.slots().cooling().count(), 0);
                let again = book.plan_load(FileId(1), &three_pages(), None).unwrap();
                assert_eq!(again.ops[0], plan.ops[0]);
            }
        }
    }
}

#[test]
fn a_failed_rollback_leaves_an_exact_leftover_and_blocks_a_reload() {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
    let rollback = book.abort_load(&plan, stop(2, 2));
    // The page delete removed one of two pages, then stopped.
    assert!(!book.finish_rollback(rollback, Err(stop(0, 1))));
    let queue: Vec<_> = book.leftovers()[&FileId(1)].iter().cloned().collect();
    assert_eq!(queue.len(), 2);
    assert!(matches!(&queue[0], MapOp::DeletePages(k) if k.len() == 1 && k[0].page == 0x2_0000));
    assert!(matches!(
        queue[1],
        MapOp::DeleteDeltaTable { map_id: 8, .. }
    ));
    // Slots were never zeroed: they keep their rules and stay reusable.
    assert_eq!(book.slots().in_use(), 3);
    assert_eq!(
        book.plan_load(FileId(1), &three_pages(), None).err(),
        Some(PlanError::CleanupPending)
    );
    // Retrying: the page delete now works, the table delete fails, then works.
    assert!(book.leftover_result(FileId(1), Ok(())));
    assert!(!book.leftover_result(FileId(1), Err(OpFailure::new(Errno::EBUSY, 0))));
    assert_eq!(book.leftover_ops(), 1);
    assert!(book.leftover_result(FileId(1), Ok(())));
    assert!(book.leftovers().is_empty());
    let again = book.plan_load(FileId(1), &three_pages(), None).unwrap();
    assert_eq!(
        again.ops.len(),
        2,
        "the slots are still there: no slot write"
    );
}

#[test]
fn a_partial_unload_keeps_the_rest_as_leftovers() {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
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
        small.plan_load(FileId(2), &three_pages(), None),
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
        book.plan_load(FileId(1), &three_pages(), None).err(),
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
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
    book.commit_load(plan);
    assert_eq!(
        book.plan_load(FileId(2), &three_pages(), None).err(),
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
    let rollback = book.abort_load(&plan, stop(1, 1));
    let kinds: Vec<_> = rollback.ops.iter().map(MapOp::name).collect();
    assert_eq!(kinds, ["delete delta table", "put unwind infos"]);
    assert!(book.finish_rollback(rollback, Ok(())));
    assert_eq!(book.slots().in_use(), 0);
    let (plan, _) = book.plan_load_many(&files[..2]);
    let refs = book.commit_load(plan);
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
    let plan = book.plan_load(FileId(id), deltas, None).unwrap();
    book.commit_load(plan);
}

fn unload(book: &mut KernelBook, id: u64) {
    let plan = book.plan_unload(FileId(id)).unwrap();
    assert_eq!(book.finish_unload(plan, Ok(())), 0);
}

fn slot_writes(plan: &LoadManyPlan) -> usize {
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
    let plan = book.plan_load(FileId(2), &three_pages(), None).unwrap();
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
        book.plan_load(FileId(2), &three_other_pages(), None).err(),
        Some(PlanError::MapFull {
            map: MapKind::UnwindInfo,
            capacity: 3
        })
    );
    assert_eq!(book.slots().cooling().count(), 3, "nothing was taken");
    book.advance_to(at(15));
    let plan = book
        .plan_load(FileId(2), &three_other_pages(), None)
        .unwrap();
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
    let plan = book
        .plan_load(FileId(2), &three_other_pages(), None)
        .unwrap();
    let class = plan.files[0].map_ref.map_id;
    let rollback = book.abort_load(&plan, stop(2, 0));
    assert!(
        !book.finish_rollback(rollback, Err(stop(0, 0))),
        "the table stays"
    );
    assert_eq!(
        book.plan_load(FileId(3), &three_pages(), None).err(),
        Some(PlanError::MapFull {
            map: MapKind::DeltaTables(class),
            capacity: 2
        })
    );
    assert!(book.leftover_result(FileId(2), Ok(())));
    assert!(book.plan_load(FileId(3), &three_pages(), None).is_ok());
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
        book.plan_load(FileId(2), &three_other_pages(), None)
            .is_err(),
        "still cooling"
    );
    book.advance_to(at(15));
    assert!(
        book.plan_load(FileId(2), &three_other_pages(), None)
            .is_ok(),
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
    assert!(book
        .plan_load(FileId(2), &three_other_pages(), None)
        .is_err());
    assert!(book.leftover_result(FileId(1), Ok(())));
    assert!(book.leftover_slots().is_empty());
    assert_eq!(book.slots().cooling().next(), Some((0, at(105))));
    assert!(book
        .plan_load(FileId(2), &three_other_pages(), None)
        .is_err());
    book.advance_to(at(105));
    assert!(book
        .plan_load(FileId(2), &three_other_pages(), None)
        .is_ok());
}

#[test]
fn a_rollback_pins_the_slots_of_a_table_it_could_not_remove() {
    let mut book = three_slots();
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
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
    let plan = book
        .plan_load(FileId(2), &three_other_pages(), None)
        .unwrap();
    // The slot write itself fails after one element: that slot is
    // zeroed (free: no table ever led to it), the others come back.
    let rollback = book.abort_load(&plan, stop(0, 1));
    assert!(book.finish_rollback(rollback, Ok(())));
    assert_eq!(book.slots().free().collect::<Vec<_>>(), vec![0]);
    assert_eq!(book.slots().cooling().collect::<Vec<_>>(), before[1..]);
    assert_eq!(book.slots().slot_of(&sp(16)), Some(1));
    assert_eq!(book.slots().slot_of(&sp(8)), None);
    // Stopped before any write: everything as it was.
    let plan = book
        .plan_load(FileId(2), &three_other_pages(), None)
        .unwrap();
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
        .plan_load(FileId(1), &three_pages(), Some(offsets()))
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
            .plan_load(FileId(2), &three_pages(), Some(offsets()))
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
        .plan_load(FileId(1), &IntervalData::new(), Some(offsets()))
        .unwrap();
    assert_eq!(plan.ops.len(), 1);
    book.commit_load(plan);
    assert!(book.is_loaded(FileId(1)));
    assert_eq!(
        book.plan_load(FileId(2), &three_pages(), Some(offsets()))
            .err(),
        Some(PlanError::MapFull {
            map: MapKind::InterpreterOffsets,
            capacity: 1
        })
    );
    assert_eq!(book.slots().in_use(), 0, "nothing reserved");
    assert!(book.plan_load(FileId(2), &three_pages(), None).is_ok());
    let unload = book.plan_unload(FileId(1)).unwrap();
    assert_eq!(
        unload.ops,
        [MapOp::DeleteInterpreterOffsets { file_id: FileId(1) }]
    );
    // A failed delete is a leftover that still counts against the map.
    assert_eq!(book.finish_unload(unload, Err(stop(0, 0))), 1);
    assert!(matches!(
        book.plan_load(FileId(3), &IntervalData::new(), Some(offsets())),
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
        let rollback = book.abort_load(&plan, stop(at, 0));
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
    let plan = book
        .plan_load(FileId(1), &IntervalData::new(), None)
        .unwrap();
    assert!(plan.ops.is_empty());
    assert_eq!(book.commit_load(plan)[0].1.map_id, 0);
    assert!(book.loaded().is_empty());
    assert!(book.plan_unload(FileId(1)).is_none());
}

/// A table for `file_id` that no plan wrote: the corruption the
/// assertions below must catch.
fn forged_table() -> LoadedTable {
    LoadedTable {
        map_ref: MapRef {
            map_id: 8,
            num_pages: 1,
            page_entries: 1,
            ..MapRef::default()
        },
        slots: Box::new([]),
        dead_pages: Box::new([]),
    }
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "plan: the book holds more than the maps can")]
fn a_plan_on_a_book_past_its_capacity_is_caught() {
    let mut book = KernelBook::new(Capacities::default());
    book.pages_in_use = u64::from(book.caps.pages) + 1;
    let _ = book.plan_load(FileId(1), &three_pages(), None);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "commit: the book's accounting")]
fn a_commit_over_a_table_the_book_already_has_is_caught() {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
    book.loaded.insert(FileId(1), forged_table());
    book.commit_load(plan);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "is still loaded")]
fn a_rollback_that_leaves_its_file_loaded_is_caught() {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(1), &three_pages(), None).unwrap();
    let rollback = book.abort_load(&plan, stop(2, 1));
    book.loaded.insert(FileId(1), forged_table());
    book.finish_rollback(rollback, Ok(()));
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "the book's gauges")]
fn gauges_that_disagree_with_the_tables_are_caught() {
    let mut book = KernelBook::new(Capacities::default());
    load(&mut book, 1, &three_pages());
    book.pages_in_use += 1;
    load(&mut book, 2, &three_other_pages());
}

#[test]
fn a_table_delete_that_took_effect_before_failing_owes_nothing_in_any_batch() {
    // The fault a crash after the write makes: the kernel removed the
    // table, the caller saw an error after its one element. A batch of
    // several files used to keep that delete as a leftover whose retry
    // found nothing (a needless retry, the slots pinned until it ran).
    for many in [false, true] {
        let mut book = KernelBook::new(Capacities::default());
        let plan = if many {
            let (plan, refused) = book.plan_load_many(&[(FileId(1), &three_pages())]);
            assert!(refused.is_empty());
            plan
        } else {
            book.plan_load(FileId(1), &three_pages(), None).unwrap()
        };
        let pages = plan
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::PutPages(_)))
            .unwrap();
        let rollback = book.abort_load(&plan, stop(pages, 0));
        let table = rollback
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::DeleteDeltaTable { .. }))
            .unwrap();
        let after_write = Stopped {
            at: table,
            failure: OpFailure::new(Errno::EBADF, 1),
        };
        assert!(
            book.finish_rollback(rollback, Err(after_write)),
            "batch of several: {many}"
        );
        assert!(book.leftovers().is_empty(), "batch of several: {many}");
        assert_eq!(book.leftover_ops(), 0);
    }
}
