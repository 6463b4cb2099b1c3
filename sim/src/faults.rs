//! Deterministic fault injection for [`SimMaps`].
//!
//! The machine's recovery code only runs when the kernel fails, and a real
//! kernel fails rarely and never on demand. So the simulator counts every
//! [`Backend::apply`](eim_core::ops::Backend::apply) call and lets a test
//! schedule a failure at the k-th call from now: either the whole op fails
//! with no effect, or a batch stops after a given number of elements. An
//! injected failure obeys the backend contract exactly: the first `done`
//! elements are in effect and nothing else changed. There is no randomness
//! here; a seeded workload decides what to inject.
//!
//! Choose the errno with care. Some errnos say something about the maps'
//! contents, and the machine believes them. eim-core's driver reads `ENOENT`
//! from a delete as "element `done` is already gone" and skips it. An
//! injected `ENOENT` on a delete therefore makes a kernel that lies: the
//! element stays, and the machine forgets it. The same goes for `EEXIST` on
//! a put. Errnos that say nothing about contents (`ENOMEM`, `EFAULT`,
//! `EBUSY`, `EPERM`, `E2BIG`) model a real kernel failing part way.

use std::collections::BTreeMap;

use eim_core::ops::{Errno, MapOp, OpFailure};
use eim_core::FileId;

use crate::kernel::SimMaps;

/// A scheduled failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The op fails with this errno, `done = 0`, no effect.
    Fail(Errno),
    /// The op processes `after` elements (at most its length − 1, so it
    /// still fails) and then fails with `errno`. A delta table is all or
    /// nothing, so for it this is the same as [`Fault::Fail`].
    StopAfter { after: usize, errno: Errno },
}

/// The op counter and the faults waiting for their op.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    applied: u64,
    /// Keyed by the absolute op number (`applied` when that op comes).
    pending: BTreeMap<u64, Fault>,
    /// Files every write of fails, at the element that is theirs, for as
    /// long as they stay here: a resource error tied to one element of a
    /// big batch (its table too big for what is left, the descriptor or
    /// memory its array needs), met again on every attempt.
    poisoned: BTreeMap<FileId, Errno>,
    /// Writes a poisoned file made fail so far.
    poison_hits: u64,
}

/// The file element `i` of a write `op` belongs to (tables, pages,
/// interpreter offsets). Deletes and slot writes belong to no file here (a
/// rollback must be able to remove what went in).
pub(crate) fn element_file(op: &MapOp, i: usize) -> Option<FileId> {
    match op {
        MapOp::PutDeltaTable { file_id, .. } | MapOp::PutInterpreterOffsets { file_id, .. } => {
            (i == 0).then_some(*file_id)
        }
        MapOp::PutDeltaTables { tables, .. } => tables.get(i).map(|(file, _)| *file),
        MapOp::PutPages(pages) => pages.get(i).map(|(key, _)| FileId(key.file_id)),
        _ => None,
    }
}

/// The first element of a write `op` that belongs to a file of `poisoned`,
/// with that file's errno.
fn poisoned_element(op: &MapOp, poisoned: &BTreeMap<FileId, Errno>) -> Option<(usize, Errno)> {
    if poisoned.is_empty() {
        return None;
    }
    (0..op.len()).find_map(|i| {
        let errno = poisoned.get(&element_file(op, i)?)?;
        Some((i, *errno))
    })
}

impl FaultPlan {
    /// Counts one op and returns the fault scheduled for it, if any.
    pub(crate) fn next_op(&mut self) -> Option<Fault> {
        let now = self.applied;
        self.applied = self.applied.saturating_add(1);
        self.pending.remove(&now)
    }

    /// Schedules `fault` for the k-th op from now (0 = the next); a fault
    /// already scheduled for that op is replaced.
    fn schedule(&mut self, k: u64, fault: Fault) {
        self.pending.insert(self.applied.saturating_add(k), fault);
    }
}

impl SimMaps {
    /// The k-th apply from now (0 = the next) fails with `errno`, `done = 0`
    /// and no effect.
    pub fn fail_op(&mut self, k: u64, errno: Errno) {
        self.faults.schedule(k, Fault::Fail(errno));
    }

    /// The k-th apply from now processes `after` elements, capped at the
    /// op's length − 1 so that it still fails, then fails with `errno`. If
    /// the kernel itself fails earlier inside those elements, that failure
    /// is reported instead (it happens first).
    pub fn stop_batch(&mut self, k: u64, after: usize, errno: Errno) {
        self.faults.schedule(k, Fault::StopAfter { after, errno });
    }

    /// Every write of `file_id`'s entries fails with `errno` at its own
    /// element (the elements before it take effect), until
    /// [`SimMaps::clear_faults`].
    pub fn poison_file(&mut self, file_id: FileId, errno: Errno) {
        self.faults.poisoned.insert(file_id, errno);
    }

    /// Drops every scheduled fault and poisoned file (the op counter keeps
    /// counting).
    pub fn clear_faults(&mut self) {
        self.faults.pending.clear();
        self.faults.poisoned.clear();
    }

    /// Poisons no file any more (scheduled faults stay).
    pub fn clear_poison(&mut self) {
        self.faults.poisoned.clear();
    }

    /// A poisoned file's element in `op`, as [`Fault::StopAfter`] there.
    pub(crate) fn poison_fault(&mut self, op: &MapOp) -> Option<Fault> {
        let (after, errno) = poisoned_element(op, &self.faults.poisoned)?;
        self.faults.poison_hits += 1;
        Some(Fault::StopAfter { after, errno })
    }

    /// Writes that failed because they wrote a poisoned file's entries.
    pub fn poison_hits(&self) -> u64 {
        self.faults.poison_hits
    }

    /// Number of `apply` calls so far, faulty or not.
    pub fn ops_applied(&self) -> u64 {
        self.faults.applied
    }

    /// Faults scheduled and not yet reached.
    pub fn pending_faults(&self) -> usize {
        self.faults.pending.len()
    }

    /// Applies `op` under `fault`.
    pub(crate) fn apply_faulty(&mut self, op: &MapOp, fault: Fault) -> Result<(), OpFailure> {
        match fault {
            Fault::Fail(errno) => Err(OpFailure::new(errno, 0)),
            Fault::StopAfter { after, errno } => {
                let done = after.min(op.len().saturating_sub(1));
                if let Some(head) = op.head(done) {
                    self.apply_now(&head)?;
                }
                Err(OpFailure::new(errno, done))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use eim_core::abi::{
        OffsetRange, StackDelta, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo,
    };
    use eim_core::ops::Backend;
    use eim_core::FileId;

    use super::*;
    use crate::kernel::SimConfig;

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
}
