//! The one place that chooses between `std::sync` and loom's model of it,
//! so that the facade's locking can be checked exhaustively under
//! `RUSTFLAGS="--cfg loom"`.

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Locks, recovering the data of a poisoned lock: every critical section of
/// the facade leaves its state consistent before anything that can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
