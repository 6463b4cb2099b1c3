//! Simulation profiles: map sizes, the file pool, the workload's shape, the
//! fault rate and how much is checked when.
//!
//! A profile names a family of runs; the seed picks one member (map sizes
//! are drawn from the profile's ranges), so two seeds of one profile also
//! differ in their kernel.

use std::fmt;
use std::str::FromStr;

use eim_machine::machine::Capacities;

use crate::pool::PoolSpec;
use crate::rng::{SimRng, Stream};
use crate::sampled::Sampling;
use crate::workload::{Shape, Weights};
use eim_sim::kernel::SimConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Profile {
    /// Short-lived processes: loads and unloads all the time.
    Churn,
    /// Tiny maps: every capacity limit is reached, and sometimes the kernel
    /// is smaller than the book believes.
    Capacity,
    /// A high fault rate: rollbacks, failed rollbacks, leftovers.
    Faults,
    /// Everything, with the real files of the corpus, big ones included.
    Mixed,
    /// Faults, and the daemon dying at any op (also inside a rollback) and
    /// starting again over the same maps (a warm restart: reconcile).
    Restart,
}

impl Profile {
    pub const ALL: [Profile; 5] = [
        Profile::Churn,
        Profile::Capacity,
        Profile::Faults,
        Profile::Mixed,
        Profile::Restart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Profile::Churn => "churn",
            Profile::Capacity => "capacity",
            Profile::Faults => "faults",
            Profile::Mixed => "mixed",
            Profile::Restart => "restart",
        }
    }

    /// The fault rate of the ops that follow a fault in the same action
    /// (its rollback, a batch's isolation, the leftover retries): high
    /// where faults are the point, so that double and triple faults (a
    /// rollback failing, then its retry) are common, not one run in a
    /// hundred.
    pub fn recovery_fault_rate(self) -> f64 {
        match self {
            Profile::Churn => 0.05,
            Profile::Capacity => 0.1,
            Profile::Faults => 0.4,
            Profile::Mixed => 0.2,
            Profile::Restart => 0.3,
        }
    }

    /// The profile's fault rate (per backend op) unless overridden.
    pub fn fault_rate(self) -> f64 {
        match self {
            Profile::Churn => 0.002,
            Profile::Capacity => 0.01,
            Profile::Faults => 0.12,
            Profile::Mixed => 0.02,
            Profile::Restart => 0.05,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown profile {0:?} (churn, capacity, faults, mixed, restart)")]
pub struct UnknownProfile(pub String);

impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, UnknownProfile> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownProfile(s.to_string()))
    }
}

/// How much is checked when (see `docs/SIMULATOR.md`).
#[derive(Clone, Copy, Debug)]
pub struct CheckPlan {
    /// After every op: the pages it could have changed, this much of each.
    pub per_op: Sampling,
    /// After every step: the pages of the files the step wrote.
    pub per_step: Sampling,
    /// After every step: this many more pages of loaded files, in turn.
    pub sweep_pages: usize,
    /// Every this many steps (and at the end): every invariant, every
    /// delta of every page.
    pub full_every: u64,
}

impl Default for CheckPlan {
    fn default() -> Self {
        Self {
            per_op: Sampling {
                deltas: 3,
                spread: 1,
                offset: 0,
            },
            per_step: Sampling {
                deltas: 4,
                spread: 2,
                offset: 0,
            },
            sweep_pages: 1,
            full_every: 5000,
        }
    }
}

/// Everything a run of one seed is made of, besides its steps.
#[derive(Clone, Debug)]
pub struct Setup {
    pub profile: Profile,
    pub seed: u64,
    pub fault_rate: f64,
    /// The rate after a fault in the same action
    /// ([`Profile::recovery_fault_rate`]); the simulator uses the larger of
    /// this and `fault_rate`.
    pub recovery_fault_rate: f64,
    pub kernel: SimConfig,
    /// What the book believes the maps hold (at least the kernel's sizes).
    pub capacities: Capacities,
    pub pool: PoolSpec,
    pub shape: Shape,
    pub checks: CheckPlan,
    /// Self-test: the backend loses every op of this name (see
    /// [`crate::faulty::FaultyBackend::sabotage`]).
    pub sabotage: Option<&'static str>,
}

fn caps(kernel: SimConfig) -> Capacities {
    Capacities {
        unwind_slots: kernel.unwind_info,
        pages: kernel.pages,
        outer_entries: kernel.outer,
        interpreter_offsets: kernel.interpreter_offsets,
    }
}

impl Setup {
    /// The setup of `profile` for `seed`; `fault_rate` overrides the
    /// profile's.
    pub fn new(profile: Profile, seed: u64, fault_rate: Option<f64>) -> Self {
        let mut rng = SimRng::new(seed, Stream::Config);
        let shapes_small = [2, 4, 10, 2, 2, 1, 2, 1, 0];
        let shapes_all = [2, 3, 8, 3, 3, 2, 2, 2, 1];
        let (kernel, pool, shape) = match profile {
            Profile::Churn => (
                SimConfig {
                    unwind_info: 2048,
                    interpreter_offsets: 64,
                    pages: 2048,
                    outer: 64,
                },
                PoolSpec {
                    synthetic: 40,
                    shapes: shapes_small,
                    real_max_deltas: 1000,
                    real_weight: 300,
                },
                Shape {
                    weights: Weights {
                        start: 40,
                        exit: 40,
                        advance: 6,
                        cleanup: 4,
                        retry: 2,
                        file: 3,
                        crash: 0,
                    },
                    max_live: 6,
                    min_live: 0,
                    files: (1, 4),
                    batch: 0.3,
                    synth: 0.03,
                    defer: 0.3,
                },
            ),
            Profile::Capacity => (
                SimConfig {
                    unwind_info: rng.range(24, 96) as u32,
                    interpreter_offsets: 8,
                    pages: rng.range(12, 64) as u32,
                    outer: rng.range(1, 4) as u32,
                },
                PoolSpec {
                    synthetic: 30,
                    shapes: [2, 2, 8, 4, 4, 2, 2, 4, 1],
                    real_max_deltas: usize::MAX,
                    real_weight: 100,
                },
                Shape {
                    weights: Weights {
                        start: 30,
                        exit: 25,
                        advance: 8,
                        cleanup: 6,
                        retry: 3,
                        file: 3,
                        crash: 0,
                    },
                    max_live: 12,
                    min_live: 2,
                    files: (1, 6),
                    batch: 0.4,
                    synth: 0.05,
                    defer: 0.5,
                },
            ),
            Profile::Faults => (
                SimConfig {
                    unwind_info: 1024,
                    interpreter_offsets: 64,
                    pages: 1024,
                    outer: 32,
                },
                PoolSpec {
                    synthetic: 30,
                    shapes: shapes_small,
                    real_max_deltas: 1000,
                    real_weight: 200,
                },
                Shape {
                    weights: Weights {
                        start: 30,
                        exit: 28,
                        advance: 6,
                        cleanup: 6,
                        retry: 6,
                        file: 3,
                        crash: 0,
                    },
                    max_live: 8,
                    min_live: 0,
                    files: (1, 5),
                    batch: 0.4,
                    synth: 0.05,
                    defer: 0.4,
                },
            ),
            Profile::Mixed => (
                SimConfig {
                    unwind_info: rng.range(64, 4096) as u32,
                    interpreter_offsets: 64,
                    pages: rng.range(48, 4096) as u32,
                    outer: rng.range(2, 64) as u32,
                },
                PoolSpec {
                    synthetic: 40,
                    shapes: shapes_all,
                    real_max_deltas: usize::MAX,
                    real_weight: 60,
                },
                Shape {
                    weights: Weights {
                        start: 30,
                        exit: 28,
                        advance: 8,
                        cleanup: 5,
                        retry: 3,
                        file: 4,
                        crash: 0,
                    },
                    max_live: 10,
                    min_live: 1,
                    files: (0, 6),
                    batch: 0.3,
                    synth: 0.05,
                    defer: 0.4,
                },
            ),
            Profile::Restart => (
                SimConfig {
                    unwind_info: rng.range(64, 1024) as u32,
                    interpreter_offsets: 64,
                    pages: rng.range(256, 1024) as u32,
                    outer: 32,
                },
                PoolSpec {
                    synthetic: 30,
                    shapes: shapes_small,
                    real_max_deltas: 1000,
                    real_weight: 200,
                },
                Shape {
                    weights: Weights {
                        start: 30,
                        exit: 26,
                        advance: 6,
                        cleanup: 5,
                        retry: 4,
                        file: 3,
                        crash: 4,
                    },
                    max_live: 8,
                    min_live: 0,
                    files: (1, 5),
                    batch: 0.4,
                    synth: 0.05,
                    defer: 0.4,
                },
            ),
        };
        let mut capacities = caps(kernel);
        // Sometimes the kernel's maps are smaller than the book believes
        // (created by someone else): the kernel then stops a batch part
        // way with E2BIG, a failure no fault injection planned.
        if profile == Profile::Capacity && rng.chance(0.33) {
            capacities.pages += rng.range(1, 4) as u32;
            capacities.unwind_slots += rng.range(1, 4) as u32;
        }
        Self {
            profile,
            seed,
            fault_rate: fault_rate.unwrap_or(profile.fault_rate()),
            // No faults asked for: none in recoveries either (a recovery
            // needs a first fault, but poisoned files count as one).
            recovery_fault_rate: match fault_rate {
                Some(rate) if rate <= 0.0 => 0.0,
                _ => profile.recovery_fault_rate(),
            },
            kernel,
            capacities,
            pool,
            shape,
            checks: CheckPlan::default(),
            sabotage: None,
        }
    }
}
