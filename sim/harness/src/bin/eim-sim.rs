//! `eim-sim`: the seeded simulator. See `docs/SIMULATOR.md`.
//!
//! ```text
//! eim-sim --seed S [--seed S2 ...] --steps N [--profile NAME] [--fault-rate P]
//! eim-sim --replay FILE
//! eim-sim --soak [--minutes M] [--steps N] [--seed FIRST]
//! eim-sim --host-events --seed S [--seed S2 ...] --steps N [--drop P] [--duplicate P] [--delay P]
//! ```
//!
//! Exit status: 0 when every run passed, 1 when an invariant broke (the
//! seed, the step, the invariant and a shrunk reproduction are printed, and
//! the reproduction is written to a trace file), 2 on a usage or setup
//! error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use eim_sim_harness::corpus::{self, RealFile};
use eim_sim_harness::profile::{Profile, Setup};
use eim_sim_harness::run::{build_pool, generator, run_steps, Failure, Sim};
use eim_sim_harness::shrink::{shrink, Budget};
use eim_sim_harness::trace::Trace;
use eim_sim_harness::workload::Step;

#[derive(Parser, Debug)]
#[command(
    name = "eim-sim",
    about = "Drives eim's ExecutableInfoManager over simulated kernel maps with a seeded workload and checks every invariant after every op and step"
)]
struct Args {
    /// Seeds to run, one after another (repeat the flag).
    #[arg(long = "seed")]
    seeds: Vec<u64>,
    /// Steps per seed.
    #[arg(long, default_value_t = 10_000)]
    steps: usize,
    /// churn, capacity, faults or mixed.
    #[arg(long, default_value = "mixed")]
    profile: Profile,
    /// Probability that a backend op fails (default: the profile's).
    #[arg(long)]
    fault_rate: Option<f64>,
    /// Replay a trace file written by a failing run.
    #[arg(long, conflicts_with_all = ["seeds", "soak"])]
    replay: Option<PathBuf>,
    /// Run seed after seed (all profiles in turn) until interrupted or
    /// until --minutes have passed.
    #[arg(long)]
    soak: bool,
    /// With --soak: stop after this many minutes.
    #[arg(long, requires = "soak")]
    minutes: Option<f64>,
    /// The test data (default: $EIM_TESTDATA, else the repository's
    /// tests/data).
    #[arg(long)]
    testdata: Option<PathBuf>,
    /// Time allowed for shrinking a failing trace.
    #[arg(long, default_value_t = 120)]
    shrink_secs: u64,
    /// Where a failing run writes its shrunk trace (default: the temporary
    /// directory).
    #[arg(long)]
    trace_out: Option<PathBuf>,
    /// Self-test: the simulated kernel loses every op of this kind (e.g.
    /// delete-delta-table); the run must then fail.
    #[arg(long)]
    sabotage: Option<String>,
    /// Run the event path of host tracking instead (`host_events`): a
    /// host's churn followed through events that are dropped, duplicated
    /// and delayed, with resyncs; every resync must find the table equal to
    /// the host (and find nothing to correct when nothing was dropped).
    #[arg(long, conflicts_with_all = ["replay", "soak", "sabotage"])]
    host_events: bool,
    /// With --host-events: the chance an event is lost (half of the losses
    /// are known, as a full ring's counter makes them).
    #[arg(long, default_value_t = 0.1, requires = "host_events")]
    drop: f64,
    /// With --host-events: the chance an event is delivered twice.
    #[arg(long, default_value_t = 0.1, requires = "host_events")]
    duplicate: f64,
    /// With --host-events: the chance an event is held back a batch.
    #[arg(long, default_value_t = 0.1, requires = "host_events")]
    delay: f64,
}

/// `--host-events`: each seed's run, and its report.
fn host_events(args: &Args) -> ExitCode {
    use eim_sim_harness::host_events::{run, EventPath, HostEventsConfig};
    for p in [args.drop, args.duplicate, args.delay] {
        if !(0.0..=1.0).contains(&p) {
            eprintln!("eim-sim: --drop, --duplicate and --delay must be within 0..=1, not {p}");
            return ExitCode::from(2);
        }
    }
    let mut total = 0;
    for &seed in &args.seeds {
        let config = HostEventsConfig {
            seed,
            steps: args.steps,
            files: 16,
            pids: 32,
            path: EventPath {
                drop: args.drop,
                drop_detected: 0.5,
                duplicate: args.duplicate,
                delay: args.delay,
            },
            resync_every: 50,
        };
        match run(config) {
            Ok(r) if r.dropped == 0 && r.corrections > 0 => {
                eprintln!(
                    "eim-sim: seed {seed}: {} corrections without a lost event: {r:?}",
                    r.corrections
                );
                return ExitCode::from(1);
            }
            Ok(r) => {
                println!(
                    "seed {seed}: host events: {} events, {} dropped, {} resyncs, {} corrections, {} reads, {} vanished, vDSO loaded at {} resyncs and unloaded at {}",
                    r.events, r.dropped, r.resyncs, r.corrections, r.reads, r.vanished, r.vdso_loaded, r.vdso_unloaded
                );
                total += args.steps;
            }
            Err(e) => {
                eprintln!("eim-sim: {e}");
                return ExitCode::from(1);
            }
        }
    }
    println!("total: {total} host-event steps");
    ExitCode::SUCCESS
}

/// The op names `--sabotage` accepts, as `MapOp::name` spells them.
const OP_NAMES: [&str; 8] = [
    "put unwind infos",
    "put delta table",
    "put delta tables",
    "put pages",
    "delete pages",
    "delete delta table",
    "put interpreter offsets",
    "delete interpreter offsets",
];

fn sabotage(args: &Args) -> Result<Option<&'static str>, String> {
    let Some(name) = &args.sabotage else {
        return Ok(None);
    };
    let spaced = name.replace('-', " ");
    OP_NAMES
        .iter()
        .find(|n| **n == spaced)
        .map(|n| Some(*n))
        .ok_or_else(|| format!("--sabotage: unknown op {name:?}"))
}

/// One seed's result line.
struct Ran {
    steps: usize,
    ops: u64,
    faults: u64,
    poisoned: u64,
    recovery_faults: u64,
    deepest: u64,
    secs: f64,
    /// The digest of every op offered to the maps and its outcome: equal
    /// digests of a seed before and after a change mean the same trace.
    digest: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.host_events {
        if args.seeds.is_empty() {
            eprintln!("eim-sim: give --seed S with --host-events");
            return ExitCode::from(2);
        }
        return host_events(&args);
    }
    if let Some(rate) = args.fault_rate {
        if !(0.0..=1.0).contains(&rate) {
            eprintln!("eim-sim: --fault-rate must be within 0..=1, not {rate}");
            return ExitCode::from(2);
        }
    }
    let testdata = args
        .testdata
        .clone()
        .unwrap_or_else(corpus::default_testdata);
    let started = Instant::now();
    let corpus = match corpus::load(&testdata) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("eim-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let corpus_secs = started.elapsed().as_secs_f64();
    let result = if let Some(path) = &args.replay {
        replay(&args, path, &corpus)
    } else if args.soak {
        soak(&args, &corpus)
    } else if args.seeds.is_empty() {
        eprintln!("eim-sim: give --seed S (or --replay FILE, or --soak)");
        return ExitCode::from(2);
    } else {
        seeds(&args, &corpus, corpus_secs)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("eim-sim: {e}");
            ExitCode::from(2)
        }
    }
}

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

/// Runs one seed; on failure reports, shrinks and saves, and returns None.
fn run_seed(args: &Args, corpus: &[RealFile], setup: Setup) -> Fallible<Option<Ran>> {
    let pool = Arc::new(build_pool(&setup, corpus));
    let mut sim = Sim::new(setup.clone(), pool.clone())?;
    let mut gen = generator(&setup, &pool);
    let mut steps: Vec<Step> = Vec::with_capacity(args.steps);
    let start = Instant::now();
    let mut failure = None;
    for _ in 0..args.steps {
        let step = gen.next_step();
        let result = sim.step(&step);
        steps.push(step);
        if let Err(f) = result {
            failure = Some(f);
            break;
        }
    }
    if failure.is_none() {
        failure = sim.check_everything().err();
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = sim.stats();
    match failure {
        None => Ok(Some(Ran {
            steps: steps.len(),
            ops: stats.ops,
            faults: stats.faults,
            poisoned: stats.poisoned,
            recovery_faults: stats.recovery_faults,
            deepest: stats.deepest,
            secs,
            digest: sim.digest(),
        })),
        Some(failure) => {
            report_failure(args, &setup, pool, &steps, &failure)?;
            Ok(None)
        }
    }
}

fn report_failure(
    args: &Args,
    setup: &Setup,
    pool: Arc<Vec<eim_sim_harness::pool::PoolFile>>,
    steps: &[Step],
    failure: &Failure,
) -> Fallible<()> {
    println!(
        "FAILED: seed {} profile {} fault-rate {}: {failure}",
        setup.seed, setup.profile, setup.fault_rate
    );
    println!("  step {}: {}", failure.step, steps[failure.step]);
    println!(
        "  reproduce: eim-sim --seed {} --profile {} --fault-rate {} --steps {}",
        setup.seed,
        setup.profile,
        setup.fault_rate,
        failure.step + 1
    );
    println!(
        "shrinking {} steps (at most {} s)...",
        failure.step + 1,
        args.shrink_secs
    );
    let budget = Budget {
        time: Duration::from_secs(args.shrink_secs),
        replays: 100_000,
    };
    let shrunk = shrink(setup, pool, steps, failure, budget)?;
    let trace = Trace {
        profile: setup.profile,
        seed: setup.seed,
        fault_rate: setup.fault_rate,
        notes: vec![
            format!("{}", shrunk.failure),
            format!(
                "shrunk from {} steps in {} replays, {:.1} s{}",
                failure.step + 1,
                shrunk.replays,
                shrunk.elapsed.as_secs_f64(),
                if shrunk.exhausted {
                    " (budget ran out: may shrink further)"
                } else {
                    ""
                }
            ),
        ],
        steps: shrunk.steps,
    };
    let path = args.trace_out.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("eim-sim-{}-{}.trace", setup.profile, setup.seed))
    });
    std::fs::write(&path, trace.to_string())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!(
        "minimal reproduction ({} steps), {}:",
        trace.steps.len(),
        shrunk.failure
    );
    print!("{trace}");
    println!("replay: eim-sim --replay {}", path.display());
    Ok(())
}

fn seeds(args: &Args, corpus: &[RealFile], corpus_secs: f64) -> Fallible<bool> {
    let (mut steps, mut secs) = (0usize, 0f64);
    println!(
        "eim-sim: {} real files extracted in {corpus_secs:.2} s",
        corpus.len()
    );
    for &seed in &args.seeds {
        let mut setup = Setup::new(args.profile, seed, args.fault_rate);
        setup.sabotage = sabotage(args)?;
        let Some(ran) = run_seed(args, corpus, setup)? else {
            return Ok(false);
        };
        println!(
            "seed {seed} profile {}: {} steps, {} ops, {} faults injected ({} poisoning one file, {} into recoveries, at most {} in one action), {:.2} s ({:.0} steps/s), op trace {}",
            args.profile,
            ran.steps,
            ran.ops,
            ran.faults,
            ran.poisoned,
            ran.recovery_faults,
            ran.deepest,
            ran.secs,
            ran.steps as f64 / ran.secs.max(1e-9),
            ran.digest
        );
        steps += ran.steps;
        secs += ran.secs;
    }
    println!(
        "total: {steps} steps in {secs:.2} s ({:.0} steps/s), {} seeds passed",
        steps as f64 / secs.max(1e-9),
        args.seeds.len()
    );
    Ok(true)
}

fn soak(args: &Args, corpus: &[RealFile]) -> Fallible<bool> {
    let start = Instant::now();
    let deadline = args
        .minutes
        .map(|m| Duration::from_secs_f64(m.max(0.0) * 60.0));
    let first = args.seeds.first().copied().unwrap_or(1);
    let (mut runs, mut steps) = (0u64, 0usize);
    for n in 0u64.. {
        if deadline.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        let profile = Profile::ALL[(n % Profile::ALL.len() as u64) as usize];
        let seed = first.wrapping_add(n / Profile::ALL.len() as u64);
        let setup = Setup::new(profile, seed, args.fault_rate);
        let Some(ran) = run_seed(args, corpus, setup)? else {
            return Ok(false);
        };
        runs += 1;
        steps += ran.steps;
        println!(
            "soak: seed {seed} profile {profile} passed ({} steps, {} faults); {runs} runs, {steps} steps in {:.0} s",
            ran.steps,
            ran.faults,
            start.elapsed().as_secs_f64()
        );
    }
    println!("soak: done, {runs} runs, {steps} steps, no failure");
    Ok(true)
}

fn replay(args: &Args, path: &std::path::Path, corpus: &[RealFile]) -> Fallible<bool> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let trace: Trace = text
        .parse()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut setup = Setup::new(trace.profile, trace.seed, Some(trace.fault_rate));
    setup.sabotage = sabotage(args)?;
    let pool = Arc::new(build_pool(&setup, corpus));
    let outcome = run_steps(&setup, pool, &trace.steps, true)?;
    match outcome.failure {
        None => {
            println!(
                "replay: {} steps, every invariant holds (digest {})",
                outcome.steps, outcome.digest
            );
            Ok(true)
        }
        Some(f) => {
            println!("replay FAILED: {f}");
            if let Some(step) = trace.steps.get(f.step) {
                println!("  step {}: {step}", f.step);
            }
            Ok(false)
        }
    }
}
