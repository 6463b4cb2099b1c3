//! Allocations whose failure the caller handles.
//!
//! The `eim` binary's global allocator ends the process with one line on
//! stderr when an allocation fails (std's own handler prints a backtrace
//! and aborts, and stable Rust cannot replace it). That would also end it
//! where a caller asked for memory fallibly (`Vec::try_reserve`) and has a
//! plan for a refusal. Such a request runs inside [`fallibly`], which
//! marks the thread; the allocator asks [`active`] before ending the
//! process, and inside it returns the failure to the caller as usual.
//! Any other global allocator (a library user's, the tests') never asks,
//! and the marking costs a thread-local counter.

use std::cell::Cell;

thread_local! {
    /// Nesting depth of [`fallibly`] on this thread. A `const` initialiser
    /// with no destructor: reading it from inside the allocator allocates
    /// nothing and never fails.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is inside [`fallibly`]: an allocation failing now
/// is handled by its caller.
pub fn active() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Runs `f`, whose allocation failures `f` handles itself (through
/// `try_reserve` and the like), with the thread marked.
pub fn fallibly<T>(f: impl FnOnce() -> T) -> T {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    let _ = DEPTH.try_with(|d| d.set(d.get().saturating_add(1)));
    let _unmark = Unmark;
    f()
}

/// Reserves room for `additional` more elements in `v`, or leaves it as it
/// was if the memory cannot be had.
pub(crate) fn try_reserve<T>(v: &mut Vec<T>, additional: usize) -> bool {
    fallibly(|| v.try_reserve(additional).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_nests_and_ends_with_the_call() {
        assert!(!active());
        fallibly(|| {
            assert!(active());
            fallibly(|| assert!(active()));
            assert!(active());
        });
        assert!(!active());
        let unwound = std::panic::catch_unwind(|| fallibly(|| panic!("inside")));
        assert!(unwound.is_err());
        assert!(!active(), "a panic inside unmarks the thread too");
    }

    #[test]
    fn an_impossible_reservation_is_refused_not_fatal() {
        let mut v: Vec<u64> = vec![1];
        assert!(!try_reserve(&mut v, usize::MAX / 4));
        assert_eq!(v, [1]);
        assert!(try_reserve(&mut v, 10));
        assert!(v.capacity() >= 11);
    }
}
