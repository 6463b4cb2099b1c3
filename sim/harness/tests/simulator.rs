//! The seeded simulator end to end: every profile runs thousands of steps
//! with every invariant checked, a seed is reproducible to the last op, a
//! trace replays like the run it came from, and a broken backend is caught
//! and shrunk to a few steps.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use eim_sim_harness::corpus::{self, RealFile};
use eim_sim_harness::pool::PoolFile;
use eim_sim_harness::profile::{Profile, Setup};
use eim_sim_harness::run::{build_pool, generate, run_steps, Invariant, Outcome};
use eim_sim_harness::shrink::{shrink, Budget};
use eim_sim_harness::trace::Trace;

fn corpus() -> &'static [RealFile] {
    static CORPUS: OnceLock<Vec<RealFile>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let files = corpus::load(&corpus::default_testdata())
            .unwrap_or_else(|e| panic!("the simulator needs the test data: {e}"));
        assert!(files.len() >= 16, "{} real files", files.len());
        files
    })
}

fn run(setup: &Setup, steps: usize) -> (Outcome, Arc<Vec<PoolFile>>) {
    let pool = Arc::new(build_pool(setup, corpus()));
    let trace = generate(setup, &pool, steps);
    let outcome = run_steps(setup, pool.clone(), &trace, true).expect("setup");
    (outcome, pool)
}

#[test]
fn every_profile_keeps_every_invariant() {
    let mut tally: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut faults, mut stopped, mut recovery, mut deepest) = (0, 0, 0, 0);
    for profile in Profile::ALL {
        for seed in [11, 12] {
            let setup = Setup::new(profile, seed, None);
            let (outcome, _) = run(&setup, 2500);
            assert_eq!(outcome.failure, None, "{profile} seed {seed}");
            assert_eq!(outcome.steps, 2500);
            for (k, n) in outcome.tally {
                *tally.entry(k).or_default() += n;
            }
            faults += outcome.stats.faults;
            stopped += outcome.stats.stopped_batches;
            recovery += outcome.stats.recovery_faults;
            deepest = deepest.max(outcome.stats.deepest);
        }
    }
    // The workload reaches every outcome the manager has.
    for kind in [
        "ok",
        "deferred",
        "vanished",
        "extraction failed",
        "encode",
        "map full",
        "kernel, rolled back",
        "unload incomplete",
        "already loaded",
    ] {
        assert!(
            tally.get(kind).copied().unwrap_or(0) > 0,
            "no {kind:?}: {tally:?}"
        );
    }
    assert!(
        faults > 100 && stopped > 10,
        "{faults} faults, {stopped} stopped batches"
    );
    // Rollbacks and leftover retries fail too, and not only once.
    assert!(
        recovery > faults / 10 && deepest >= 3,
        "{recovery} of {faults} faults in recoveries, at most {deepest} in one action"
    );
}

/// The daemon dies at any op (inside loads, unloads, rollbacks and the
/// previous restart's own removals and loads) and a new manager reconciles
/// over the same maps; every invariant holds after each restart, and the
/// restarts both adopt files as they are and load files again.
#[test]
fn warm_restarts_at_any_op_keep_every_invariant() {
    let mut tally: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in [1, 2, 3] {
        let setup = Setup::new(Profile::Restart, seed, None);
        let (outcome, _) = run(&setup, 3000);
        assert_eq!(outcome.failure, None, "restart seed {seed}");
        for (k, n) in outcome.tally {
            *tally.entry(k).or_default() += n;
        }
    }
    eprintln!("{tally:?}");
    for kind in [
        "restarts",
        "restart: adopted",
        "restart: loaded",
        "kernel, rolled back",
    ] {
        assert!(
            tally.get(kind).copied().unwrap_or(0) > 10,
            "few {kind:?}: {tally:?}"
        );
    }
}

/// Traces of failures the simulator found, replayed as they were saved:
/// each must now keep every invariant.
#[test]
fn saved_failures_replay_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../regressions");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("sim/regressions") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("a trace");
        let trace: Trace = text.parse().expect("a trace parses");
        let setup = Setup::new(trace.profile, trace.seed, Some(trace.fault_rate));
        let pool = Arc::new(build_pool(&setup, corpus()));
        let outcome = run_steps(&setup, pool, &trace.steps, true).expect("setup");
        assert_eq!(outcome.failure, None, "{}", path.display());
        replayed += 1;
    }
    assert!(replayed >= 1);
}

#[test]
fn a_seed_reproduces_its_run_exactly() {
    let setup = Setup::new(Profile::Faults, 5, None);
    let (a, _) = run(&setup, 1500);
    let (b, _) = run(&setup, 1500);
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.stats, b.stats);
    let (c, _) = run(&Setup::new(Profile::Faults, 6, None), 1500);
    assert_ne!(a.digest, c.digest, "another seed, another run");
}

#[test]
fn a_trace_replays_like_the_run_it_came_from() {
    let setup = Setup::new(Profile::Mixed, 3, None);
    let pool = Arc::new(build_pool(&setup, corpus()));
    let steps = generate(&setup, &pool, 800);
    let direct = run_steps(&setup, pool.clone(), &steps, true).expect("setup");
    let trace = Trace {
        profile: setup.profile,
        seed: setup.seed,
        fault_rate: setup.fault_rate,
        notes: vec![],
        steps,
    };
    let read: Trace = trace.to_string().parse().expect("a trace reads back");
    let again = Setup::new(read.profile, read.seed, Some(read.fault_rate));
    let replayed = run_steps(&again, pool, &read.steps, true).expect("setup");
    assert_eq!(direct.digest, replayed.digest);
}

#[test]
fn a_backend_that_loses_table_deletes_is_caught_and_shrunk() {
    let mut setup = Setup::new(Profile::Churn, 2, None);
    setup.sabotage = Some("delete delta table");
    let pool = Arc::new(build_pool(&setup, corpus()));
    let steps = generate(&setup, &pool, 2000);
    let outcome = run_steps(&setup, pool.clone(), &steps, true).expect("setup");
    let failure = outcome.failure.expect("a lost delete must be noticed");
    assert_eq!(failure.invariant, Invariant::Projection, "{failure}");
    let budget = Budget {
        time: std::time::Duration::from_secs(60),
        replays: 5000,
    };
    let shrunk = shrink(&setup, pool.clone(), &steps, &failure, budget).expect("setup");
    assert!(
        shrunk.steps.len() <= 3,
        "a load and an unload suffice, got {} steps",
        shrunk.steps.len()
    );
    let replay = run_steps(&setup, pool, &shrunk.steps, true).expect("setup");
    assert_eq!(
        replay.failure.map(|f| f.invariant),
        Some(Invariant::Projection)
    );
}
