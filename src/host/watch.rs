//! `eim watch`: a [`Host`] kept in step with the host, one step every
//! interval, until stopped. A process that exits between two steps is
//! released at the next one; with a delayed unload its files stay loaded
//! for the delay, so processes that come and go (a storm of short-lived
//! `true`s) take references on loaded files instead of extracting them
//! again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eim_core::tracking::{coalesce, HostEvent, Stamped};

use crate::backends::inspect::{Inspect, InspectError};
use crate::host::events::{cpu_time, monotonic_now, EventSource, EventStats};
use crate::host::procs::ListError;
use crate::host::scan::{Host, Progress};
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

/// Follows the events `source` reports (see the module documentation of
/// [`crate::host::events`]): a first full step, then only the processes
/// events name, a resync every `events.resync_every` and at once after a
/// loss; the summary (metrics, `on_step`) is refreshed at most every
/// `config.interval`, and only when something was followed. `config.steps`
/// counts summaries. Returns the last summary and what the events did.
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
    let mut stats = EventStats::default();
    let cpu = cpu_time();
    let first = host.step(stop, progress)?.clone();
    observe_cpu(metrics, cpu);
    tracing::info!(
        processes = first.processes,
        loaded = first.taken,
        ms = first.elapsed.as_secs_f64() * 1e3,
        "first step; following host events"
    );
    let mut summary = Summary::of(host)?;
    if let Some(m) = metrics {
        m.update(&summary);
        m.update_events(&stats);
    }
    on_step(&summary);
    let mut summaries = 1u64;
    let mut next_resync = Instant::now() + events.resync_every;
    let mut next_summary = Instant::now() + config.interval;
    let mut dirty = false;
    let mut lost_seen = source.lost().unwrap_or(0);
    let mut batch = Vec::new();
    while !stop.load(Ordering::Relaxed) && config.steps.is_none_or(|n| summaries < n) {
        let now = Instant::now();
        let wake = next_resync.min(next_summary);
        // Short waits, so a stop is seen soon.
        let timeout = wake
            .saturating_duration_since(now)
            .min(Duration::from_millis(100));
        if let Err(e) = source.wait(timeout) {
            tracing::warn!("waiting for host events: {e}");
            sleep_unless_stopped(Duration::from_millis(100), stop);
        }
        batch.clear();
        source.drain(events.max_batch, &mut batch);
        if !batch.is_empty() {
            follow(host, &batch, &mut stats, stop, progress, metrics);
            dirty = true;
        }
        let lost = match source.lost() {
            Ok(lost) => lost,
            Err(e) => {
                tracing::warn!("reading the lost-event counter: {e}");
                lost_seen
            }
        };
        let after_loss = lost > lost_seen;
        if after_loss {
            tracing::warn!(
                lost = lost - lost_seen,
                "host events were lost (the ring was full): resyncing from /proc now"
            );
            stats.lost = lost;
            lost_seen = lost;
            stats.resyncs_after_loss += 1;
        }
        if after_loss || Instant::now() >= next_resync {
            resync(host, source, events, &mut stats, stop, progress, metrics)?;
            next_resync = Instant::now() + events.resync_every;
            dirty = true;
        }
        if Instant::now() >= next_summary {
            next_summary = Instant::now() + config.interval;
            if dirty {
                summary = Summary::of(host)?;
                dirty = false;
            }
            if let Some(m) = metrics {
                m.update(&summary);
                m.update_events(&stats);
            }
            on_step(&summary);
            summaries += 1;
        }
    }
    if dirty {
        summary = Summary::of(host)?;
    }
    if let Some(m) = metrics {
        m.update(&summary);
        m.update_events(&stats);
    }
    Ok((summary, stats))
}

fn observe_cpu(metrics: Option<&Metrics>, before: Duration) {
    if let Some(m) = metrics {
        m.observe_step_cpu(cpu_time().saturating_sub(before));
    }
}

/// One pass over the processes `batch` names.
fn follow<B: Inspect>(
    host: &mut Host<B>,
    batch: &[Stamped],
    stats: &mut EventStats,
    stop: &AtomicBool,
    progress: &mut dyn Progress,
    metrics: Option<&Metrics>,
) {
    let cpu = cpu_time();
    let events: Vec<HostEvent> = batch.iter().map(|s| s.event).collect();
    for e in &events {
        *stats.events.entry(e.kind_name()).or_default() += 1;
    }
    let work = coalesce(&events);
    let report = host.follow(&work, stop, progress);
    stats.batches += 1;
    stats.processes_read += report.processes as u64;
    // The pass is over: the tables of what its events caused are
    // published (or failed).
    let done = monotonic_now();
    for s in batch {
        let latency = done.saturating_sub(s.at);
        stats.note_latency(latency);
        if let Some(m) = metrics {
            m.observe_event_latency(latency);
        }
    }
    observe_cpu(metrics, cpu);
}

/// Follows whatever is in flight, then walks all of `/proc`: whatever that
/// changes, the events had missed.
fn resync<B: Inspect>(
    host: &mut Host<B>,
    source: &mut dyn EventSource,
    events: &EventsConfig,
    stats: &mut EventStats,
    stop: &AtomicBool,
    progress: &mut dyn Progress,
    metrics: Option<&Metrics>,
) -> Result<(), WatchError> {
    let mut batch = Vec::new();
    // Bounded: what is in flight now, not what keeps coming.
    for _ in 0..16 {
        batch.clear();
        if source.drain(events.max_batch, &mut batch) == 0 {
            break;
        }
        follow(host, &batch, stats, stop, progress, metrics);
    }
    let cpu = cpu_time();
    let report = host.step(stop, progress)?;
    observe_cpu(metrics, cpu);
    stats.resyncs += 1;
    if report.missed > 0 {
        stats.corrections += report.missed as u64;
        tracing::warn!(
            corrections = report.missed,
            "the resync found what host events had not reported"
        );
        for m in &report.missed_kept {
            tracing::warn!("resync: {m}");
        }
    }
    Ok(())
}
