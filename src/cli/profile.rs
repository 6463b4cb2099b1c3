//! `eim profile`: samples user stacks with the BPF unwinder over eim's
//! maps. The files of the profiled processes are loaded first (a host step
//! into private kernel maps), and kept loaded as processes start, map new
//! code or exit, through `watch`'s event loop (host events; polling
//! `/proc` every second where they are unavailable). With `--kernel`, each
//! sample's kernel stack goes above its user stack, named from
//! `/proc/kallsyms`. The stacks are written as folded stacks, and with
//! `--pprof` as a pprof profile.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context as _};

use eim::bpf::events::HostEvents;
use eim::bpf::sampler::{ProfileTarget, Profiler, Sampling};
use eim::daemon::{EventLoop, EventsConfig};
use eim::host::events::EventSource;
use eim::host::scan::{Host, Quiet};
use eim::profile::{folded, kallsyms, pprof, Aggregate, Kallsyms, Names};

use crate::backend::{files_per_batch, host_config, kernel_maps, BackendArgs, BackendKind};
use crate::out::{self, note};
use crate::stop::{self, Maps};

/// Options of `eim profile`.
#[derive(Clone, Debug, clap::Args)]
pub struct ProfileArgs {
    /// The processes to sample (every thread of each); repeat for more.
    #[arg(long, required_unless_present = "all", conflicts_with = "all")]
    pub pid: Vec<i32>,
    /// Sample every process of the host.
    #[arg(long)]
    pub all: bool,
    /// How long to sample.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Samples per second on each CPU.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,
    /// Write the folded stacks here instead of standard output.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also write a pprof profile (profile.proto, uncompressed) here.
    #[arg(long)]
    pub pprof: Option<PathBuf>,
    /// Also sample the kernel stack of each sample that interrupted the
    /// kernel (a syscall, a fault), above the user stack, named from
    /// /proc/kallsyms.
    #[arg(long)]
    pub kernel: bool,
    /// Open files by their path inside the process's root only, not
    /// through /proc/PID/map_files.
    #[arg(long)]
    pub no_map_files: bool,
}

/// How often `/proc` is walked when the kernel gives no host events.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// Stacks taken from the ring per poll at most.
const POLL_BATCH: usize = 4096;

pub fn run(args: &ProfileArgs) -> anyhow::Result<ExitCode> {
    let backend = BackendArgs {
        backend: BackendKind::Kernel,
        pin_dir: None,
        mount_bpffs: false,
        recreate_mismatched: false,
        no_pin: true,
        no_map_files: args.no_map_files,
    };
    let stop = stop::on_signals(Maps::Private);
    // Private maps: never the pinned ones a running watch owns.
    let maps = kernel_maps(&backend, false, false, files_per_batch())?;
    let mut host = Host::new(maps, host_config(&backend, &args.pid));
    let target = if args.all {
        ProfileTarget::All
    } else {
        ProfileTarget::Pids(args.pid.iter().map(|p| *p as u32).collect())
    };
    // With host events, the loop's usual safety-net resync; without them,
    // the resync is the only way new processes are found: every second.
    let (mut events, config): (Box<dyn EventSource>, _) = match HostEvents::attach() {
        Ok(events) => (Box::new(events), EventsConfig::default()),
        Err(e) => {
            tracing::warn!("host events unavailable ({e}): polling /proc every second");
            let polling = EventsConfig {
                resync_every: POLL_EVERY,
                ..EventsConfig::default()
            };
            (Box::new(Polling), polling)
        }
    };
    let mut lp = EventLoop::new(&mut host, events.as_mut(), config, None);
    lp.start(&stop, &mut Quiet)
        .context("loading the files of the processes to profile")?;
    let mut names = Names::new();
    if args.kernel {
        names.set_kernel(kernel_symbols());
    }
    let sampling = Sampling {
        hz: args.frequency,
        kernel: args.kernel,
    };
    let mut profiler = lp
        .host
        .manager()
        .with_backend(|timed| Profiler::start(&mut timed.inner, &target, sampling))
        .context("attaching the sampling program")?;
    let mut aggregate = Aggregate::default();
    let started = Instant::now();
    let began = SystemTime::now();
    while started.elapsed() < args.duration && !stop.load(Ordering::Relaxed) {
        // New processes and mappings are followed between polls.
        lp.turn(Duration::from_millis(10), &stop, &mut Quiet);
        names.next_batch();
        for sample in profiler
            .poll(Duration::from_millis(40), POLL_BATCH)
            .context("reading sampled stacks")?
        {
            aggregate.add(&sample.stack, &sample.kernel, &mut names);
        }
    }
    // What is still in the ring was sampled within the duration.
    let pending = profiler
        .poll(Duration::ZERO, usize::MAX / 2)
        .unwrap_or_default();
    names.next_batch();
    for sample in pending {
        aggregate.add(&sample.stack, &sample.kernel, &mut names);
    }
    let lost = profiler.lost().unwrap_or(0);
    let (kernel_failed, kernel_errno) = profiler.kernel_failed();
    let elapsed = started.elapsed();
    drop(profiler);
    tracing::info!(
        samples = aggregate.samples,
        lost,
        stacks = aggregate.stacks.len(),
        stops = ?aggregate.stops,
        "profile done"
    );
    let text = folded::render(&aggregate);
    match &args.output {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("writing the folded stacks to {}", path.display()))?,
        None => out::print(&text)?,
    }
    if let Some(path) = &args.pprof {
        let run = pprof::Run {
            hz: args.frequency,
            time_nanos: unix_nanos(began),
            duration_nanos: i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX),
        };
        let profile = pprof::profile(&aggregate, run);
        std::fs::write(path, pprof::encode(&profile))
            .with_context(|| format!("writing the pprof profile to {}", path.display()))?;
    }
    note!(
        "eim: {} samples in {:.1} s ({} stacks; lost {lost}; stops {:?})",
        aggregate.samples,
        elapsed.as_secs_f64(),
        aggregate.stacks.len(),
        aggregate.stops
    );
    if kernel_failed > 0 {
        note!(
            "eim: the kernel stack of {kernel_failed} samples could not be read: {}",
            std::io::Error::from_raw_os_error(kernel_errno as i32)
        );
    }
    if aggregate.samples == 0 && !args.all && args.pid.iter().all(|p| !alive(*p)) {
        bail!("no process to profile: {:?} not running", args.pid);
    }
    Ok(ExitCode::SUCCESS)
}

/// The kernel's function symbols, or an empty table (its frames then print
/// `[kernel]`) when they cannot be read or the kernel hides their
/// addresses: said once, on standard error.
fn kernel_symbols() -> Kallsyms {
    match Kallsyms::read() {
        Ok(symbols) if symbols.restricted() => {
            note!(
                "eim: {} hides the kernel's addresses (kernel.kptr_restrict, or no \
                 CAP_SYSLOG): kernel frames print as [kernel]",
                kallsyms::PATH
            );
            symbols
        }
        Ok(symbols) => symbols,
        Err(e) => {
            note!("eim: {e}: kernel frames print as [kernel]");
            Kallsyms::default()
        }
    }
}

/// `at` in nanoseconds since the Unix epoch (0 for a clock set before it).
fn unix_nanos(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// No events: the loop's resync (every second) walks `/proc` instead.
struct Polling;

impl EventSource for Polling {
    fn wait(&mut self, timeout: Duration) -> std::io::Result<bool> {
        std::thread::sleep(timeout);
        Ok(false)
    }
    fn drain(&mut self, _max: usize, _out: &mut Vec<eim::tracking::Stamped>) -> usize {
        0
    }
    fn lost(&self) -> Result<u64, String> {
        Ok(0)
    }
}
