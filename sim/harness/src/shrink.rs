//! Shrinking a failing trace to a small reproduction.
//!
//! Delta debugging over the steps: the trace is first cut after the failing
//! step, then chunks of steps (halves, quarters, ... single steps) are
//! dropped while a replay still breaks the same invariant, and finally the
//! files of each remaining process start are dropped one by one. Every
//! candidate is replayed from scratch, so the result is a trace that fails
//! on its own. Each step keeps its fault seed, so the faults of the steps
//! that stay are drawn as before (what they hit may differ, which is why a
//! candidate is only kept if it still fails). Bounded by a time budget and a
//! number of replays; the best trace found so far is kept when either runs
//! out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pool::PoolFile;
use crate::profile::Setup;
use crate::run::{run_steps, Failure, Invariant, SetupError};
use crate::workload::{Action, Step};

/// Limits of one shrink.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub time: Duration,
    pub replays: u64,
}

/// What shrinking produced.
#[derive(Clone, Debug)]
pub struct Shrunk {
    pub steps: Vec<Step>,
    /// The failure of the shrunk trace.
    pub failure: Failure,
    pub replays: u64,
    pub elapsed: Duration,
    /// Whether the budget ran out before no smaller candidate was left.
    pub exhausted: bool,
}

struct Shrinker<'a> {
    setup: &'a Setup,
    pool: Arc<Vec<PoolFile>>,
    target: Invariant,
    budget: Budget,
    start: Instant,
    replays: u64,
}

impl Shrinker<'_> {
    fn out_of_budget(&self) -> bool {
        self.replays >= self.budget.replays || self.start.elapsed() >= self.budget.time
    }

    /// The failure of `steps`, if it is the target invariant.
    fn fails(&mut self, steps: &[Step]) -> Result<Option<Failure>, SetupError> {
        self.replays += 1;
        let outcome = run_steps(self.setup, self.pool.clone(), steps, true)?;
        Ok(outcome.failure.filter(|f| f.invariant == self.target))
    }
}

/// Shrinks `steps`, whose replay fails with `failure`.
pub fn shrink(
    setup: &Setup,
    pool: Arc<Vec<PoolFile>>,
    steps: &[Step],
    failure: &Failure,
    budget: Budget,
) -> Result<Shrunk, SetupError> {
    let mut s = Shrinker {
        setup,
        pool,
        target: failure.invariant,
        budget,
        start: Instant::now(),
        replays: 0,
    };
    let mut best: Vec<Step> = steps[..(failure.step + 1).min(steps.len())].to_vec();
    let mut best_failure = failure.clone();
    let mut exhausted = false;

    // Drop chunks of steps, halving the chunk size.
    let mut chunk = best.len().div_ceil(2).max(1);
    'chunks: loop {
        let mut i = 0;
        let mut changed = false;
        while i < best.len() {
            if s.out_of_budget() {
                exhausted = true;
                break 'chunks;
            }
            let end = (i + chunk).min(best.len());
            let candidate: Vec<Step> = best[..i].iter().chain(&best[end..]).cloned().collect();
            match s.fails(&candidate)? {
                Some(f) => {
                    best = candidate;
                    best.truncate(f.step + 1);
                    best_failure = f;
                    changed = true;
                }
                None => i += chunk,
            }
        }
        if chunk == 1 && !changed {
            break;
        }
        chunk = (chunk / 2).max(1);
    }

    // Drop single files from the process starts that remain.
    if !exhausted {
        'files: for at in 0..best.len() {
            let mut k = 0;
            while let Action::Start { files, .. } = &best[at].action {
                if k >= files.len() {
                    break;
                }
                if s.out_of_budget() {
                    exhausted = true;
                    break 'files;
                }
                let mut candidate = best.clone();
                if let Action::Start { files, .. } = &mut candidate[at].action {
                    files.remove(k);
                }
                match s.fails(&candidate)? {
                    Some(f) => {
                        best = candidate;
                        best.truncate(f.step + 1);
                        best_failure = f;
                        if at >= best.len() {
                            break 'files;
                        }
                    }
                    _ => k += 1,
                }
            }
        }
    }

    Ok(Shrunk {
        steps: best,
        failure: best_failure,
        replays: s.replays,
        elapsed: s.start.elapsed(),
        exhausted,
    })
}
