//! Fault injection, seen through [`SimMaps`].

use std::sync::Arc;

use eim_machine::abi::{
    OffsetRange, StackDelta, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo,
};
use eim_machine::ops::{Backend, OpFailure};
use eim_machine::FileId;

use super::*;
use crate::kernel::{SimConfig, SimMaps};

fn sim() -> SimMaps {
    SimMaps::new(SimConfig {
        unwind_info: 8,
        interpreter_offsets: 4,
        pages: 8,
        outer: 4,
    })
    .expect("valid config")
}

fn page(p: u64) -> (StackDeltaPageKey, StackDeltaPageInfo) {
    (
        StackDeltaPageKey {
            file_id: 1,
            page: p << 16,
        },
        StackDeltaPageInfo {
            first_delta: p as u32,
            num_deltas: 1,
            map_id: 8,
        },
    )
}

fn info(param: i32) -> UnwindInfo {
    UnwindInfo {
        opcode: 2,
        param,
        ..UnwindInfo::default()
    }
}

/// A state with something to delete, and one op of every kind.
fn setup() -> (SimMaps, Vec<MapOp>) {
    let mut s = sim();
    let seed = [
        MapOp::PutPages((10..14).map(page).collect()),
        MapOp::PutDeltaTable {
            file_id: FileId(2),
            map_id: 8,
            deltas: Arc::from(vec![StackDelta::default(); 3]),
        },
        MapOp::PutInterpreterOffsets {
            file_id: FileId(2),
            range: OffsetRange::default(),
        },
    ];
    for op in &seed {
        assert_eq!(s.apply(op), Ok(()));
    }
    let ops = vec![
        MapOp::PutUnwindInfos((0..5).map(|i| (i, info(8 * i32::from(i)))).collect()),
        MapOp::PutDeltaTable {
            file_id: FileId(1),
            map_id: 9,
            deltas: (0..300u16)
                .map(|i| StackDelta {
                    addr_low: i,
                    unwind_info: 1,
                })
                .collect(),
        },
        MapOp::PutPages((0..3).map(page).collect()),
        MapOp::DeletePages((10..14).map(|p| page(p).0).collect()),
        MapOp::DeleteDeltaTable {
            file_id: FileId(2),
            map_id: 8,
        },
        MapOp::PutInterpreterOffsets {
            file_id: FileId(1),
            range: OffsetRange {
                upper_offset1: 9,
                ..OffsetRange::default()
            },
        },
        MapOp::DeleteInterpreterOffsets { file_id: FileId(2) },
    ];
    (s, ops)
}

/// What the maps look like when exactly the first `done` elements of
/// `op` took effect.
fn after_prefix(base: &SimMaps, op: &MapOp, done: usize) -> SimMaps {
    let mut want = base.clone();
    if let Some(head) = op.head(done) {
        assert_eq!(want.apply_now(&head), Ok(()));
    }
    want
}

#[test]
fn a_failed_op_has_no_effect_and_only_its_op_fails() {
    let (base, ops) = setup();
    for op in &ops {
        let mut s = base.clone();
        s.fail_op(1, Errno::ENOMEM);
        assert_eq!(s.pending_faults(), 1);
        let mut twin = base.clone();
        assert_eq!(twin.apply(&MapOp::PutUnwindInfos(vec![])), Ok(()));
        assert_eq!(
            s.apply(&MapOp::PutUnwindInfos(vec![])),
            Ok(()),
            "op 0 is not faulty"
        );
        assert_eq!(s.apply(op), Err(OpFailure::new(Errno::ENOMEM, 0)), "{op:?}");
        assert_eq!(s, twin, "{op:?} left an effect");
        assert_eq!(s.live_inner_maps(), base.live_inner_maps());
        assert_eq!(s.pending_faults(), 0);
        assert_eq!(s.apply(op), Ok(()), "{op:?} works once the fault is spent");
    }
}

#[test]
fn a_stopped_batch_leaves_exactly_done_elements() {
    let (base, ops) = setup();
    for op in &ops {
        for after in 0..op.len() + 3 {
            let mut s = base.clone();
            s.stop_batch(0, after, Errno::EFAULT);
            let err = s.apply(op).expect_err("the op must fail");
            let want_done = match op {
                MapOp::PutDeltaTable { .. } => 0,
                _ => after.min(op.len() - 1),
            };
            assert_eq!(
                err,
                OpFailure::new(Errno::EFAULT, want_done),
                "{op:?} after {after}"
            );
            assert_eq!(s, after_prefix(&base, op, err.done), "{op:?} after {after}");
            assert_eq!(s.live_inner_maps(), base.live_inner_maps());
        }
    }
}

#[test]
fn a_natural_failure_inside_the_kept_prefix_wins() {
    let mut s = sim();
    // Slot 8 is past the capacity: the kernel stops there first.
    let op = MapOp::PutUnwindInfos((5..12).map(|i| (i, info(1))).collect());
    s.stop_batch(0, 5, Errno::EFAULT);
    assert_eq!(s.apply(&op), Err(OpFailure::new(Errno::E2BIG, 3)));
    let base = sim();
    assert_eq!(s, after_prefix(&base, &op, 3));
}

#[test]
fn an_empty_batch_can_still_be_made_to_fail() {
    let mut s = sim();
    s.stop_batch(0, 4, Errno::EBUSY);
    assert_eq!(
        s.apply(&MapOp::PutPages(vec![])),
        Err(OpFailure::new(Errno::EBUSY, 0))
    );
    assert!(s.is_pristine());
}

#[test]
fn the_counter_counts_every_apply_and_clear_drops_pending_faults() {
    let (mut s, ops) = setup();
    let start = s.ops_applied();
    assert_eq!(start, 3);
    s.fail_op(0, Errno::EPERM);
    s.fail_op(2, Errno::EPERM);
    s.stop_batch(2, 1, Errno::EBUSY);
    assert_eq!(
        s.pending_faults(),
        2,
        "the later schedule replaced the earlier"
    );
    assert!(s.apply(&ops[0]).is_err());
    s.clear_faults();
    assert_eq!(s.pending_faults(), 0);
    for op in &ops {
        assert_eq!(s.apply(op), Ok(()));
    }
    assert_eq!(s.ops_applied(), start + 1 + ops.len() as u64);
}

#[test]
fn head_cuts_batches_and_keeps_or_drops_single_ops() {
    let (_, ops) = setup();
    assert_eq!(ops[0].head(2).map(|op| op.len()), Some(2));
    assert_eq!(ops[0].head(99).as_ref(), Some(&ops[0]));
    assert_eq!(ops[2].head(0).map(|op| op.len()), Some(0));
    assert_eq!(ops[4].head(0), None);
    assert_eq!(ops[4].head(1).as_ref(), Some(&ops[4]));
}
