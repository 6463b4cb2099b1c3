//! `eim watch`: a [`Host`] kept in step with the host, one step every
//! interval, until stopped. A process that exits between two steps is
//! released at the next one; with a delayed unload its files stay loaded
//! for the delay, so processes that come and go (a storm of short-lived
//! `true`s) take references on loaded files instead of extracting them
//! again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backends::inspect::{Inspect, InspectError};
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
