//! The daemon's loop (`eim watch`): a [`Host`] kept in step with the host, one step every
//! interval, until stopped. A process that exits between two steps is
//! released at the next one; with a delayed unload its files stay loaded
//! for the delay, so processes that come and go (a storm of short-lived
//! `true`s) take references on loaded files instead of extracting them
//! again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eim_machine::tracking::{coalesce, HostEvent, Stamped};

use crate::findings::EventStats;
use crate::host::events::{cpu_time, monotonic_now, EventSource};
use crate::host::procs::ListError;
use crate::host::scan::{Host, Missed, Progress};
use crate::map_view::{Inspect, InspectError};
use crate::metrics_http::Metrics;
use crate::report::summary::Summary;

/// How long and how often to watch.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    pub interval: Duration,
    /// Stop after this many steps (`None`: until stopped).
    pub steps: Option<u64>,
}

/// Why watching stopped early.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    List(#[from] ListError),
    #[error(transparent)]
    Inspect(#[from] InspectError),
    #[error("stopped before the first step")]
    NoStep,
}

/// Sleeps `d`, waking early when `stop` is set.
pub fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// One step and its summary.
fn step_once<B: Inspect>(
    host: &mut Host<B>,
    stop: &AtomicBool,
    progress: &mut dyn Progress,
) -> Result<(crate::host::scan::StepReport, Summary), WatchError> {
    let report = host.step(stop, progress)?.clone();
    Ok((report, Summary::of(host)?))
}

/// Steps `host` every `config.interval` until `stop` is set (or the step
/// count is reached); updates `metrics` and calls `on_step` after each
/// step. Returns the summary of the last step that succeeded.
///
/// A step that fails (`/proc` cannot be listed, the maps cannot be read:
/// out of descriptors, for a moment) does not end the watch: it is logged
/// and the next interval tries again, as a daemon must. Only when no step
/// ever succeeded is the last error returned.
pub fn watch<B: Inspect>(
    host: &mut Host<B>,
    config: &WatchConfig,
    stop: &AtomicBool,
    metrics: Option<&Metrics>,
    progress: &mut dyn Progress,
    on_step: &mut dyn FnMut(&Summary),
) -> Result<Summary, WatchError> {
    let mut steps = 0u64;
    let mut failed_in_a_row = 0u64;
    let mut last: Result<Summary, WatchError> = Err(WatchError::NoStep);
    loop {
        let started = Instant::now();
        steps += 1;
        match step_once(host, stop, progress) {
            Ok((report, summary)) => {
                failed_in_a_row = 0;
                if let Some(m) = metrics {
                    m.update(&summary);
                }
                tracing::info!(
                    step = steps,
                    processes = report.processes,
                    new = report.new_processes,
                    exited = report.exited,
                    taken = report.taken,
                    released = report.released,
                    loaded = summary.files.loaded,
                    extractions = summary.extraction.extractions,
                    ms = report.elapsed.as_secs_f64() * 1e3,
                    "step"
                );
                on_step(&summary);
                last = Ok(summary);
            }
            Err(e) => {
                failed_in_a_row += 1;
                tracing::warn!(
                    step = steps,
                    failed_in_a_row,
                    "step failed: {e}; trying again at the next interval"
                );
                if last.is_err() {
                    last = Err(e);
                }
            }
        }
        if stop.load(Ordering::Relaxed) || config.steps.is_some_and(|n| steps >= n) {
            return last;
        }
        sleep_unless_stopped(config.interval.saturating_sub(started.elapsed()), stop);
        if stop.load(Ordering::Relaxed) {
            return last;
        }
    }
}

/// How the event-driven watch runs.
#[derive(Clone, Debug)]
pub struct EventsConfig {
    /// A full walk of `/proc` this often, as a safety net.
    pub resync_every: Duration,
    /// The most events followed in one pass (the rest wait for the next).
    pub max_batch: usize,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            resync_every: Duration::from_secs(60),
            max_batch: 65_536,
        }
    }
}

/// The most corrections a resync logs one by one (all are counted).
const LOGGED_CORRECTIONS: usize = 64;

/// How soon a resync that failed is tried again.
pub const RESYNC_RETRY: Duration = Duration::from_secs(1);

/// The event-driven watch, one turn at a time (what [`watch_events`]
/// runs; tests drive it turn by turn).
pub struct EventLoop<'a, B: Inspect> {
    pub host: &'a mut Host<B>,
    source: &'a mut dyn EventSource,
    events: EventsConfig,
    metrics: Option<&'a Metrics>,
    pub stats: EventStats,
    next_resync: Instant,
    lost_seen: u64,
    /// Something was followed since the last summary.
    pub dirty: bool,
    batch: Vec<Stamped>,
}

impl<'a, B: Inspect> EventLoop<'a, B> {
    pub fn new(
        host: &'a mut Host<B>,
        source: &'a mut dyn EventSource,
        events: EventsConfig,
        metrics: Option<&'a Metrics>,
    ) -> Self {
        let lost_seen = source.lost().unwrap_or(0);
        Self {
            host,
            source,
            next_resync: Instant::now() + events.resync_every,
            events,
            metrics,
            stats: EventStats::default(),
            lost_seen,
            dirty: false,
            batch: Vec::new(),
        }
    }

    /// The first full step: every process of the host.
    pub fn start(
        &mut self,
        stop: &AtomicBool,
        progress: &mut dyn Progress,
    ) -> Result<(), WatchError> {
        let cpu = cpu_time();
        let first = self.host.step(stop, progress)?.clone();
        observe_cpu(self.metrics, cpu);
        tracing::info!(
            processes = first.processes,
            loaded = first.taken,
            ms = first.elapsed.as_secs_f64() * 1e3,
            "first step; following host events"
        );
        self.next_resync = Instant::now() + self.events.resync_every;
        self.dirty = true;
        Ok(())
    }

    /// Waits up to `wait` for events, follows what came, resyncs after a
    /// loss or when one is due.
    pub fn turn(&mut self, wait: Duration, stop: &AtomicBool, progress: &mut dyn Progress) {
        let timeout = wait.min(self.next_resync.saturating_duration_since(Instant::now()));
        if let Err(e) = self.source.wait(timeout) {
            tracing::warn!("waiting for host events: {e}");
            sleep_unless_stopped(timeout, stop);
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        self.source.drain(self.events.max_batch, &mut batch);
        if !batch.is_empty() {
            self.follow(&batch, stop, progress);
        }
        self.batch = batch;
        let lost = match self.source.lost() {
            Ok(lost) => lost,
            Err(e) => {
                tracing::warn!("reading the lost-event counter: {e}");
                self.lost_seen
            }
        };
        let after_loss = lost > self.lost_seen;
        if after_loss {
            tracing::warn!(
                lost = lost - self.lost_seen,
                "host events were lost (the ring was full): resyncing from /proc now"
            );
            self.stats.lost = lost;
            self.lost_seen = lost;
            self.stats.resyncs_after_loss += 1;
        }
        if after_loss || Instant::now() >= self.next_resync {
            match self.resync(stop, progress) {
                Ok(()) => self.next_resync = Instant::now() + self.events.resync_every,
                // As a polling step that fails: said, and tried again soon
                // (`/proc` unreadable for a moment, out of descriptors).
                Err(e) => {
                    tracing::warn!("step failed: {e}; trying again at the next interval");
                    self.next_resync = Instant::now() + RESYNC_RETRY;
                }
            }
        }
    }

    /// One pass over the processes `batch` names.
    fn follow(&mut self, batch: &[Stamped], stop: &AtomicBool, progress: &mut dyn Progress) {
        let cpu = cpu_time();
        let events: Vec<HostEvent> = batch.iter().map(|s| s.event).collect();
        for e in &events {
            *self.stats.events.entry(e.kind_name()).or_default() += 1;
        }
        let work = coalesce(&events);
        let report = self.host.follow(&work, stop, progress);
        self.stats.batches += 1;
        self.stats.processes_read += report.processes as u64;
        // The pass is over: the tables of what its events caused are
        // published (or failed).
        let done = monotonic_now();
        for s in batch {
            let latency = done.saturating_sub(s.at);
            self.stats.note_latency(latency);
            if let Some(m) = self.metrics {
                m.observe_event_latency(latency);
            }
        }
        observe_cpu(self.metrics, cpu);
        self.dirty = true;
    }

    /// Follows whatever is in flight, then walks all of `/proc`. What the
    /// walk changes, the events had missed, unless an event about that
    /// process was still in flight when the walk ended: a process that
    /// forked or exec'd during the walk was found by it before its events
    /// could be followed, which is not a miss (a storm of short processes
    /// made hundreds of those per resync).
    pub fn resync(
        &mut self,
        stop: &AtomicBool,
        progress: &mut dyn Progress,
    ) -> Result<(), WatchError> {
        self.follow_in_flight(stop, progress);
        let cpu = cpu_time();
        let missed = self.host.step(stop, progress)?.missed.clone();
        observe_cpu(self.metrics, cpu);
        self.stats.resyncs += 1;
        self.dirty = true;
        let in_flight = self.follow_in_flight(stop, progress);
        let corrections: Vec<Missed> = missed
            .into_iter()
            .filter(|m| !in_flight.contains(&m.pid()))
            .collect();
        if !corrections.is_empty() {
            self.stats.corrections += corrections.len() as u64;
            tracing::warn!(
                corrections = corrections.len(),
                "the resync found what host events had not reported"
            );
            for m in corrections.iter().take(LOGGED_CORRECTIONS) {
                tracing::warn!("resync: {m}");
            }
        }
        Ok(())
    }

    /// Follows the events in the ring now (a bounded number of batches:
    /// what is in flight, not what keeps coming); the pids they named.
    fn follow_in_flight(
        &mut self,
        stop: &AtomicBool,
        progress: &mut dyn Progress,
    ) -> BTreeSet<i32> {
        let mut named = BTreeSet::new();
        let mut batch = Vec::new();
        for _ in 0..16 {
            batch.clear();
            if self.source.drain(self.events.max_batch, &mut batch) == 0 {
                break;
            }
            named.extend(batch.iter().map(|s| s.event.pid()));
            self.follow(&batch, stop, progress);
        }
        named
    }

    /// The summary, recomputed and stored in `summary` if something was
    /// followed since it was; on an error it stays as it was (and due).
    fn refresh(&mut self, summary: &mut Summary) -> Result<(), WatchError> {
        if self.dirty {
            *summary = Summary::of(self.host)?;
            self.dirty = false;
        }
        Ok(())
    }

    /// Metrics, and the log line a polling step writes (`step=N`).
    fn publish(&self, summary: &Summary, step: u64) {
        if let Some(m) = self.metrics {
            m.update(summary);
            m.update_events(&self.stats);
        }
        tracing::info!(
            step,
            processes = self.host.processes().len(),
            loaded = summary.files.loaded,
            extractions = summary.extraction.extractions,
            batches = self.stats.batches,
            resyncs = self.stats.resyncs,
            "step"
        );
    }
}

/// Follows the events `source` reports (see [`crate::host::events`]): a
/// first full step, then only the processes events name, a resync every
/// `events.resync_every` and at once after a loss; the summary (metrics,
/// `on_step`) is refreshed at most every `config.interval`, and only when
/// something was followed. `config.steps` counts summaries. Returns the
/// last summary and what the events did.
#[allow(clippy::too_many_arguments)]
pub fn watch_events<B: Inspect>(
    host: &mut Host<B>,
    source: &mut dyn EventSource,
    config: &WatchConfig,
    events: &EventsConfig,
    stop: &AtomicBool,
    metrics: Option<&Metrics>,
    progress: &mut dyn Progress,
    on_step: &mut dyn FnMut(&Summary),
) -> Result<(Summary, EventStats), WatchError> {
    let mut lp = EventLoop::new(host, source, events.clone(), metrics);
    // As the polling watch: a first step that fails is tried again every
    // interval until one succeeds or the watch is stopped.
    loop {
        match lp.start(stop, progress) {
            Ok(()) => break,
            Err(e) if stop.load(Ordering::Relaxed) => return Err(e),
            Err(e) => {
                tracing::warn!("step failed: {e}; trying again at the next interval");
                sleep_unless_stopped(config.interval, stop);
            }
        }
    }
    let mut summary = Summary::of(lp.host)?;
    lp.dirty = false;
    lp.publish(&summary, 1);
    on_step(&summary);
    let mut summaries = 1u64;
    let mut next_summary = Instant::now() + config.interval;
    while !stop.load(Ordering::Relaxed) && config.steps.is_none_or(|n| summaries < n) {
        // Short waits, so a stop is seen soon.
        let wait = next_summary
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        lp.turn(wait, stop, progress);
        if Instant::now() >= next_summary {
            next_summary = Instant::now() + config.interval;
            if let Err(e) = lp.refresh(&mut summary) {
                tracing::warn!("summary failed: {e}; trying again at the next interval");
            }
            summaries += 1;
            lp.publish(&summary, summaries);
            on_step(&summary);
        }
    }
    if let Err(e) = lp.refresh(&mut summary) {
        tracing::warn!("the last summary failed: {e}; the one before it stands");
    }
    if let Some(m) = lp.metrics {
        m.update(&summary);
        m.update_events(&lp.stats);
    }
    Ok((summary, lp.stats))
}

fn observe_cpu(metrics: Option<&Metrics>, before: Duration) {
    if let Some(m) = metrics {
        m.observe_step_cpu(cpu_time().saturating_sub(before));
    }
}
