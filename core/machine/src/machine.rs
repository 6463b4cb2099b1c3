//! The pure state machine.
//!
//! Three parts, each owning one kind of state:
//! * [`files::FileTable`]: known files, reference counts and infos (sharded
//!   by the facade, so that the per-process fast path scales);
//! * [`book::KernelBook`]: what is in the kernel maps: loaded tables,
//!   `unwind_info_array` slots, page and table accounting, leftovers; it
//!   plans every map change and turns partial failures into compensations;
//! * [`deferred::Deferred`]: files not to retry until a timeout.
//!
//! None of them performs I/O, reads a clock or locks: time is an argument
//! and kernel effects are [`crate::ops::MapOp`]s.

pub mod audit;
pub(crate) mod book;
pub mod deferred;
pub(crate) mod files;
pub mod reconcile;
pub mod slots;

use std::time::Duration;

pub use book::{
    Capacities, KernelBook, LoadManyPlan, LoadPlan, LoadedTable, MapRef, PlanError, Rollback,
    Stopped, UnloadPlan,
};
pub use deferred::Deferred;
pub use files::{FileEntry, FileTable, Release, ReleaseError};
pub use reconcile::{reconcile, Observed, ReconcileError, Reconciled, Wanted};
pub use slots::UnwindSlots;

/// A point in time, as a duration since an arbitrary epoch chosen by the
/// caller's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub Duration);

impl Timestamp {
    pub(crate) fn after(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(d))
    }
}
