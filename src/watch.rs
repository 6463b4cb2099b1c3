//! `eim watch`: a [`Host`] kept in step with the host, one step every
//! interval, until stopped. A process that exits between two steps is
//! released at the next one; with a delayed unload its files stay loaded
//! for the delay, so processes that come and go (a storm of short-lived
//! `true`s) take references on loaded files instead of extracting them
//! again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{Inspect, InspectError};
use crate::host::procs::ListError;
use crate::metrics_http::Metrics;
use crate::scan::{Host, Progress};
use crate::summary::Summary;

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
}

/// Sleeps `d`, waking early when `stop` is set.
fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// Steps `host` every `config.interval` until `stop` is set (or the step
/// count is reached); updates `metrics` and calls `on_step` after each
/// step. Returns the summary of the last step.
pub fn watch<B: Inspect>(
    host: &mut Host<B>,
    config: &WatchConfig,
    stop: &AtomicBool,
    metrics: Option<&Metrics>,
    progress: &mut dyn Progress,
    on_step: &mut dyn FnMut(&Summary),
) -> Result<Summary, WatchError> {
    let mut steps = 0u64;
    loop {
        let started = Instant::now();
        let report = host.step(stop, progress)?.clone();
        steps += 1;
        let summary = Summary::of(host)?;
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
        if stop.load(Ordering::Relaxed) || config.steps.is_some_and(|n| steps >= n) {
            return Ok(summary);
        }
        sleep_unless_stopped(config.interval.saturating_sub(started.elapsed()), stop);
        if stop.load(Ordering::Relaxed) {
            return Ok(summary);
        }
    }
}
