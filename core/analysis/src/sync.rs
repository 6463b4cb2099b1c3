//! The one place that chooses between `std` and loom's model of it, so
//! that the parallel `.eh_frame` walk's protocol (chunks claimed from both
//! ends, parts handed over through a mailbox, the cancel flag) is checked
//! exhaustively under `RUSTFLAGS="--cfg loom"` with the code that runs in
//! production; only these primitives, and where the helpers run, differ.

use std::time::Instant;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Locks, recovering the data of a poisoned lock: a helper that unwinds
/// leaves its chunk marked abandoned, nothing half-written.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for `ready` until `deadline`; None once the deadline has passed.
/// Under loom there is no time: it waits to be woken, which a waiter here
/// always is (a helper stores its part or marks it abandoned).
pub(crate) fn wait_until<'a, T>(
    ready: &Condvar,
    guard: MutexGuard<'a, T>,
    deadline: Instant,
) -> Option<MutexGuard<'a, T>> {
    #[cfg(not(loom))]
    {
        let left = deadline.checked_duration_since(Instant::now())?;
        Some(
            ready
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0,
        )
    }
    #[cfg(loom)]
    {
        let _ = deadline;
        Some(ready.wait(guard).unwrap_or_else(|e| e.into_inner()))
    }
}

/// A piece of work for a helper thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// Runs `jobs` on helper threads: the process's pool of them, or under
/// loom a thread each (a loom thread lives in one execution of a model, so
/// a pool kept across walks cannot be one).
#[cfg(loom)]
pub(crate) fn on_helpers(jobs: impl IntoIterator<Item = Job>) {
    for job in jobs {
        loom::thread::spawn(job);
    }
}

/// Runs `jobs` on helper threads: the process's pool of them, or under
/// loom a thread each (a loom thread lives in one execution of a model, so
/// a pool kept across walks cannot be one).
#[cfg(not(loom))]
pub(crate) fn on_helpers(jobs: impl IntoIterator<Item = Job>) {
    let helpers = helpers();
    lock(&helpers.jobs).extend(jobs);
    helpers.ready.notify_all();
}

/// The stack of a helper thread: the walk recurses nowhere, and its frames
/// are small.
#[cfg(not(loom))]
const HELPER_STACK_BYTES: usize = 512 << 10;

/// The helper threads (the machine's cores less one, at most three),
/// started at first use; they wait for jobs.
#[cfg(not(loom))]
struct Helpers {
    jobs: Mutex<std::collections::VecDeque<Job>>,
    ready: Condvar,
}

#[cfg(not(loom))]
fn helpers() -> &'static Helpers {
    static HELPERS: std::sync::OnceLock<Helpers> = std::sync::OnceLock::new();
    static STARTED: std::sync::Once = std::sync::Once::new();
    let helpers = HELPERS.get_or_init(|| Helpers {
        jobs: Mutex::new(std::collections::VecDeque::new()),
        ready: Condvar::new(),
    });
    STARTED.call_once(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(2, 4) - 1);
        for _ in 0..threads {
            // A helper that cannot be started only means less help.
            let _ = std::thread::Builder::new()
                .name("eim-eh-frame".into())
                .stack_size(HELPER_STACK_BYTES)
                .spawn(move || loop {
                    let job = {
                        let mut jobs = lock(&helpers.jobs);
                        loop {
                            match jobs.pop_front() {
                                Some(job) => break job,
                                None => {
                                    jobs =
                                        helpers.ready.wait(jobs).unwrap_or_else(|e| e.into_inner());
                                }
                            }
                        }
                    };
                    // A job that panicked has marked its chunk abandoned
                    // (`Promise`); the helper lives on.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                });
        }
    });
    helpers
}
