//! The manager's sources of "now": the monotonic one, and one moved by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eim_machine::machine::Timestamp;

/// The source of "now" for deferral and delayed unloading.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// Monotonic time since the clock was made.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.elapsed())
    }
}

/// A clock that moves only when told to (tests, simulation). Its atomic is
/// std's under loom too: a test's clock is not the manager's concurrency,
/// and modelling it would only multiply the interleavings to explore.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(Duration::from_nanos(self.0.load(Ordering::SeqCst)))
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
