//! Where `eim watch` gets host events from ([`EventSource`]: the kernel's
//! ring buffer, or a test's script), and the clocks its costs are read
//! from; what it counts of them is [`crate::findings::EventStats`].

use std::time::Duration;

use eim_machine::tracking::Stamped;

/// A stream of host events.
pub trait EventSource {
    /// Waits up to `timeout` for events; `false` on timeout.
    fn wait(&mut self, timeout: Duration) -> std::io::Result<bool>;
    /// Appends at most `max` events to `out`; returns how many records were
    /// read (undecodable ones included).
    fn drain(&mut self, max: usize, out: &mut Vec<Stamped>) -> usize;
    /// Events the kernel side could not deliver since the start.
    fn lost(&self) -> Result<u64, String>;
}

impl EventSource for eim_bpf::events::HostEvents {
    fn wait(&mut self, timeout: Duration) -> std::io::Result<bool> {
        eim_bpf::events::HostEvents::wait(self, timeout)
    }

    fn drain(&mut self, max: usize, out: &mut Vec<Stamped>) -> usize {
        eim_bpf::events::HostEvents::drain(self, max, out)
    }

    fn lost(&self) -> Result<u64, String> {
        eim_bpf::events::HostEvents::lost(self).map_err(|e| e.to_string())
    }
}

/// `CLOCK_MONOTONIC` now: the events' clock.
pub fn monotonic_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// CPU time this process has used (user and system), for the cost of a
/// step.
pub fn cpu_time() -> Duration {
    // SAFETY: all-zero bytes are a valid rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the rusage it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_usec).unwrap_or(0).saturating_mul(1000),
        )
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let before = cpu_time();
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(cpu_time() > before);
        assert!(monotonic_now() > Duration::ZERO);
    }
}
