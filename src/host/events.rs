//! Where `eim watch` gets host events from ([`EventSource`]: the kernel's
//! ring buffer, or a test's script), and what it counts of them
//! ([`EventStats`]).

use std::collections::BTreeMap;
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

/// How many event latencies [`EventStats`] keeps for its quantiles.
pub const LATENCIES_KEPT: usize = 8192;

/// What the event path saw since the watch started.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EventStats {
    /// Events by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Events the kernel could not deliver (a full ring).
    pub lost: u64,
    /// Full walks of `/proc` after the first: periodic, or after a loss.
    pub resyncs: u64,
    /// Resyncs forced by a loss.
    pub resyncs_after_loss: u64,
    /// What the resyncs corrected (processes events had not reported as
    /// new, exited or with new executable mappings): 0 when nothing is lost.
    pub corrections: u64,
    /// Batches of events followed.
    pub batches: u64,
    /// Processes read because events named them.
    pub processes_read: u64,
    /// From each followed event to the end of the pass that read its
    /// process (its tables published), the last [`LATENCIES_KEPT`].
    #[serde(skip)]
    pub latencies: Vec<Duration>,
    #[serde(skip)]
    latency_next: usize,
}

impl EventStats {
    pub fn note_latency(&mut self, d: Duration) {
        if self.latencies.len() < LATENCIES_KEPT {
            self.latencies.push(d);
        } else {
            self.latencies[self.latency_next] = d;
            self.latency_next = (self.latency_next + 1) % LATENCIES_KEPT;
        }
    }

    /// The `q` quantile (0..=1) of the kept latencies.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let last = sorted.len().checked_sub(1)?;
        let at = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
        sorted.get(at).copied()
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
    fn latency_quantiles_come_from_the_kept_window() {
        let mut s = EventStats::default();
        assert_eq!(s.latency_quantile(0.5), None);
        for ms in 1..=100 {
            s.note_latency(Duration::from_millis(ms));
        }
        assert_eq!(s.latency_quantile(0.0), Some(Duration::from_millis(1)));
        assert_eq!(s.latency_quantile(0.5), Some(Duration::from_millis(51)));
        assert_eq!(s.latency_quantile(1.0), Some(Duration::from_millis(100)));
        // The window keeps the newest.
        for _ in 0..LATENCIES_KEPT {
            s.note_latency(Duration::from_secs(1));
        }
        assert_eq!(s.latencies.len(), LATENCIES_KEPT);
        assert_eq!(s.latency_quantile(0.0), Some(Duration::from_secs(1)));
    }

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
