//! Deterministic fault injection for [`crate::SimMaps`] (whose
//! `fail_op`, `stop_batch` and `poison_file` schedule into a [`FaultPlan`]).
//!
//! The machine's recovery code only runs when the kernel fails, and a real
//! kernel fails rarely and never on demand. So the simulator counts every
//! [`Backend::apply`](eim_machine::ops::Backend::apply) call and lets a test
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

use eim_machine::ops::{Errno, MapOp};
use eim_machine::FileId;

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
pub fn element_file(op: &MapOp, i: usize) -> Option<FileId> {
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
    pub(crate) fn schedule(&mut self, k: u64, fault: Fault) {
        self.pending.insert(self.applied.saturating_add(k), fault);
    }

    /// Every write of `file_id`'s entries fails with `errno` at its own
    /// element, until cleared.
    pub(crate) fn poison(&mut self, file_id: FileId, errno: Errno) {
        self.poisoned.insert(file_id, errno);
    }

    /// Drops every scheduled fault and poisoned file (the op counter keeps
    /// counting).
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.poisoned.clear();
    }

    /// Poisons no file any more (scheduled faults stay).
    pub(crate) fn clear_poison(&mut self) {
        self.poisoned.clear();
    }

    /// A poisoned file's element in `op`, as [`Fault::StopAfter`] there.
    pub(crate) fn poison_fault(&mut self, op: &MapOp) -> Option<Fault> {
        let (after, errno) = poisoned_element(op, &self.poisoned)?;
        self.poison_hits += 1;
        Some(Fault::StopAfter { after, errno })
    }

    /// Writes that failed because they wrote a poisoned file's entries.
    pub(crate) fn poison_hits(&self) -> u64 {
        self.poison_hits
    }

    /// Number of ops counted so far, faulty or not.
    pub(crate) fn applied(&self) -> u64 {
        self.applied
    }

    /// Faults scheduled and not yet reached.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests;
