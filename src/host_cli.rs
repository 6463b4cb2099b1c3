//! `eim scan`, `eim watch` and `eim lookup`: the command-line side of
//! [`eim::scan::Host`] (arguments, the backend, the progress bar, the stop
//! signals, printing). The work is done in the library.

use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use eim::backend::Inspect;
use eim::bpf::{KernelConfig, KernelMaps};
use eim::host::open::OpenStrategy;
use eim::lookup;
use eim::metrics_http::{Metrics, MetricsServer};
use eim::scan::{Host, HostConfig, NotRestarted, Progress, Quiet, RestartFailed};
use eim::sim::{SimConfig, SimMaps};
use eim::summary::Summary;
use eim::watch::{self, WatchConfig};

use crate::out::{self, note};
use crate::stop::{self, Maps};

/// Which maps to load into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The in-memory simulated kernel (no privileges needed).
    Sim,
    /// Real BPF maps (root, or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN).
    Kernel,
}

/// Options shared by the host commands.
#[derive(Clone, Debug, clap::Args)]
pub struct BackendArgs {
    /// Where to load the tables: the simulated kernel or real BPF maps.
    #[arg(long, value_enum, default_value_t = BackendKind::Sim)]
    pub backend: BackendKind,
    /// With `--backend kernel`: pin the maps here, so they outlive eim and
    /// the next run reuses them. One eim at a time owns a pin directory. It
    /// must be on a bpffs: eim mounts one itself only under /sys/fs/bpf, or
    /// with --mount-bpffs.
    #[arg(long, default_value = "/sys/fs/bpf/eim")]
    pub pin_dir: PathBuf,
    /// With `--backend kernel`: mount a bpffs on the pin directory if it is
    /// not on one (an empty directory only, created if missing).
    #[arg(long)]
    pub mount_bpffs: bool,
    /// With `--backend kernel`: replace pinned maps whose type, key size,
    /// value size or capacity differ from eim's (without it, eim refuses to
    /// start and names them).
    #[arg(long)]
    pub recreate_mismatched: bool,
    /// With `--backend kernel`: do not pin; the maps go when eim exits.
    #[arg(long)]
    pub no_pin: bool,
    /// Open files by their path inside the process's root only (what an
    /// unprivileged eim does), not through /proc/PID/map_files.
    #[arg(long)]
    pub no_map_files: bool,
}

/// Options of `eim scan`.
#[derive(Clone, Debug, clap::Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Only these processes (repeatable; default: every process).
    #[arg(long = "pid")]
    pub pids: Vec<i32>,
    /// Print the summary as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Options of `eim watch`.
#[derive(Clone, Debug, clap::Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Time between two steps (at least 10ms).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Keep a file loaded this long after its last process exits (`0s`:
    /// unload at once). Processes that come and go within the delay reuse
    /// the loaded tables instead of extracting the file again.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub unload_delay: Duration,
    /// Serve metrics in the Prometheus text format at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Only these processes (repeatable; default: every process).
    #[arg(long = "pid")]
    pub pids: Vec<i32>,
    /// Stop after this many steps (default: until Ctrl-C).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Print the final summary as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The shortest `--interval`: below it, watch is a busy loop re-reading
/// `/proc` (`0s` took 80% of a core).
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

fn parse_interval(s: &str) -> Result<Duration, String> {
    let interval = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if interval < MIN_INTERVAL {
        return Err(format!(
            "{s} is shorter than the minimum of {}",
            humantime::format_duration(MIN_INTERVAL)
        ));
    }
    Ok(interval)
}

/// Options of `eim lookup`.
#[derive(Clone, Debug, clap::Args)]
pub struct LookupArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Look up addresses of this process (otherwise the first argument is
    /// an ELF file and the addresses are its virtual addresses).
    #[arg(long)]
    pub pid: Option<i32>,
    /// `ADDR...` with `--pid`, else `FILE ADDR...`; addresses in hex (0x...) or decimal.
    /// (A file name need not be UTF-8.)
    #[arg(required = true)]
    pub args: Vec<OsString>,
    /// Print the answers as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The files a host batch holds open, and the inner arrays a publish
/// holds, from what the soft limit of open files leaves now (after
/// `main` raised it; [`eim::descriptors`]).
fn files_per_batch() -> usize {
    match eim::descriptors::files_per_batch_now() {
        Ok(n) => {
            tracing::debug!(
                files_per_batch = n,
                "sized from the soft limit of open files"
            );
            n
        }
        Err(e) => {
            let n = eim::descriptors::MAX_FILES_PER_BATCH;
            tracing::warn!("{e}; batches of {n} files");
            n
        }
    }
}

fn host_config(args: &BackendArgs, pids: &[i32]) -> HostConfig {
    HostConfig {
        batch_files: files_per_batch(),
        only: (!pids.is_empty()).then(|| pids.iter().copied().collect()),
        strategy: if args.no_map_files {
            OpenStrategy::RootOnly
        } else {
            OpenStrategy::MapFilesThenRoot
        },
        ..HostConfig::default()
    }
}

/// The simulated maps, with the kernel's default capacities.
fn sim_maps() -> anyhow::Result<SimMaps> {
    SimMaps::new(SimConfig::default()).context("creating the simulated maps")
}

/// What to tell a user who lacks the privileges for real maps.
fn privileges_message(what_failed: &str) -> String {
    let missing = eim::bpf::probe::missing_capabilities();
    let mut msg = format!("--backend kernel: {what_failed}.\n");
    if missing.is_empty() {
        msg.push_str(
            "  The capabilities are there; BPF may be disabled for unprivileged users \
             (kernel.unprivileged_bpf_disabled) or blocked by a security module.\n",
        );
    }
    for (cap, why) in missing {
        msg.push_str(&format!("  missing {cap}: needed for {why}\n"));
    }
    msg.push_str(
        "  Run as root (sudo eim ... --backend kernel), or give the binary the \
         capabilities: sudo setcap cap_bpf,cap_perfmon,cap_sys_admin+ep \"$(command -v eim)\".\n  \
         Without them, the default --backend sim runs the same scan on the simulated kernel.",
    );
    msg
}

/// Real maps, after checking that the kernel will let us make them. With
/// `adopt`, re-opened pins keep their entries for [`kernel_host`]'s
/// reconcile.
/// `arrays_in_flight`: the most inner arrays a publish holds open (the
/// host's batch size, so that a step publishes each size class at once).
fn kernel_maps(
    args: &BackendArgs,
    pin: bool,
    adopt: bool,
    arrays_in_flight: usize,
) -> anyhow::Result<KernelMaps> {
    match eim::bpf::probe::can_create_maps() {
        Ok(true) => {}
        Ok(false) => bail!(privileges_message(
            "the kernel refused to create a BPF map (EPERM)"
        )),
        Err(e) => bail!("--backend kernel: probing BPF: {e}"),
    }
    let config = KernelConfig {
        pin_dir: pin.then(|| args.pin_dir.clone()),
        mount_bpffs: args.mount_bpffs,
        recreate_mismatched: args.recreate_mismatched,
        adopt_pins: pin && adopt,
        arrays_in_flight,
        ..KernelConfig::default()
    };
    let maps = match KernelMaps::with_config(config) {
        Ok(maps) => maps,
        // Where unprivileged users may create maps, the refusal comes later
        // (the program, the pin directory).
        Err(e) if !eim::bpf::probe::missing_capabilities().is_empty() => {
            bail!(privileges_message(&format!(
                "creating the maps failed: {e}"
            )))
        }
        Err(e) if pin => {
            return Err(e).with_context(|| {
                format!(
                    "creating the kernel maps pinned in {}",
                    args.pin_dir.display()
                )
            })
        }
        Err(e) => return Err(e).context("creating the kernel maps"),
    };
    if let Some(report) = maps.pin_report() {
        // Both change what other processes see: said at the default level.
        if let Some(at) = &report.mounted {
            note!(
                "eim: mounted a bpffs on {} for the pinned maps (mount -t bpf bpf {0})",
                at.display()
            );
        }
        for (name, why) in report.replaced() {
            note!(
                "eim: replaced the pinned map {name} in {}: {why}",
                report.dir.display()
            );
        }
        tracing::info!(?report, "pinned maps");
    }
    Ok(maps)
}

/// The progress bar on stderr, hidden when stderr is not a terminal.
struct Bar(ProgressBar);

impl Bar {
    fn new() -> Self {
        let bar = if std::io::stderr().is_terminal() {
            ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} processes {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Self(bar)
    }
}

impl Progress for Bar {
    fn start(&mut self, processes: u64) {
        self.0.set_length(processes);
        self.0.set_position(0);
    }
    fn advance(&mut self) {
        self.0.inc(1);
    }
    fn loading(&mut self, files: usize) {
        self.0.set_message(format!("loading {files} files"));
    }
    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Prints the summary. A stopped run is a success: what it loaded is whole
/// and consistent, and the summary says if the walk was cut short.
fn print_summary(summary: &Summary, json: bool) -> anyhow::Result<ExitCode> {
    let text = if json {
        serde_json::to_string_pretty(summary).context("encoding the summary")? + "\n"
    } else {
        summary.render_text()
    };
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// What a second stop signal may cut short with these arguments.
fn maps_kind(args: &BackendArgs) -> Maps {
    if args.backend == BackendKind::Kernel && !args.no_pin {
        Maps::Pinned
    } else {
        Maps::Private
    }
}

/// The host over real maps. Over pins of an earlier run that hold
/// entries, a warm restart ([`Host::restart`]): what is right is kept,
/// the rest removed, what is missing loaded, so readers never lose a file
/// that stays mapped. If the reconcile does not trust the maps, they are
/// cleaned and the host starts cold. `None`: stopped before the maps were
/// touched.
fn kernel_host(
    args: &BackendArgs,
    config: HostConfig,
    stop: &AtomicBool,
) -> anyhow::Result<Option<Host<KernelMaps>>> {
    let pin = !args.no_pin;
    let maps = kernel_maps(args, pin, true, config.batch_files)?;
    if !maps.pin_report().is_some_and(|r| r.any_reopened()) {
        return Ok(Some(Host::new(maps, config)));
    }
    let observed = maps
        .observed()
        .with_context(|| format!("reading the maps pinned in {}", args.pin_dir.display()))?;
    if observed.is_empty() {
        return Ok(Some(Host::new(maps, config)));
    }
    match Host::restart(maps, config.clone(), &observed, stop) {
        Ok(host) => {
            if let Some(r) = host.restarted() {
                note!(
                    "eim: maps reconciled in {:.0} ms: {} of {} files kept as pinned, {} loaded, {} failed, {} waiting for unwind slots, {} stale entries removed{}",
                    r.seconds * 1e3,
                    r.adopted,
                    r.files,
                    r.loaded,
                    r.failed,
                    r.waiting_for_slots,
                    r.removals,
                    if r.removals_pending > 0 {
                        format!(" ({} removals pending)", r.removals_pending)
                    } else {
                        String::new()
                    }
                );
            }
            Ok(Some(host))
        }
        Err(RestartFailed {
            why: NotRestarted::Stopped,
            ..
        }) => {
            note!(
                "eim: stopped before the maps pinned in {} were reconciled; they are as they were",
                args.pin_dir.display()
            );
            Ok(None)
        }
        Err(RestartFailed {
            why: NotRestarted::List(e),
            ..
        }) => Err(e).context("walking the host to reconcile the pinned maps (left as they were)"),
        Err(RestartFailed {
            why: NotRestarted::Refused(e),
            mut backend,
        }) => {
            let cleaned = backend.clean_pins().with_context(|| {
                format!("cleaning the maps pinned in {}", args.pin_dir.display())
            })?;
            note!(
                "eim: the maps pinned in {} were not reconciled ({e}); cleaned them: {} page entries, {} tables, {} unwind infos",
                args.pin_dir.display(),
                cleaned.pages,
                cleaned.tables.values().sum::<usize>(),
                cleaned.unwind_slots
            );
            Ok(Some(Host::new(backend, config)))
        }
    }
}

fn scan_on<B: Inspect>(
    mut host: Host<B>,
    args: &ScanArgs,
    stop: &AtomicBool,
) -> anyhow::Result<ExitCode> {
    host.step(stop, &mut Bar::new())?;
    // After a warm restart every unwind slot no kept table uses cools for
    // one grace, and a file needing a rule no slot holds is refused until
    // then (`docs/ARCHITECTURE.md`, "Warm restart: reconcile"). A daemon
    // loads it at a later step; a scan waits that once (at most the grace).
    if host.restarted().is_some() && !host.problems().is_empty() {
        if let Some(wait) = host.manager().slots_cooling_for() {
            note!(
                "eim: waiting {:.1} s for the unwind slots to cool after the restart, then loading what was refused",
                wait.as_secs_f64()
            );
            watch::sleep_unless_stopped(wait, stop);
            if !stop.load(std::sync::atomic::Ordering::Relaxed) {
                host.step(stop, &mut Bar::new())?;
            }
        }
    }
    let summary = Summary::of(&mut host)?;
    print_summary(&summary, args.json)
}

pub fn scan(args: &ScanArgs) -> anyhow::Result<ExitCode> {
    // Before the maps are made: a signal while they are would kill eim.
    let stop = stop::on_signals(maps_kind(&args.backend));
    let config = host_config(&args.backend, &args.pids);
    match args.backend.backend {
        BackendKind::Sim => scan_on(Host::new(sim_maps()?, config), args, &stop),
        BackendKind::Kernel => match kernel_host(&args.backend, config, &stop)? {
            Some(host) => scan_on(host, args, &stop),
            None => Ok(ExitCode::SUCCESS),
        },
    }
}

fn watch_on<B: Inspect>(
    mut host: Host<B>,
    args: &WatchArgs,
    stop: &AtomicBool,
) -> anyhow::Result<ExitCode> {
    let metrics = Arc::new(Metrics::new());
    // Without its metrics a watch still does its work: a port taken by
    // someone else must not keep eim from loading tables.
    let _server = match args
        .metrics_addr
        .map(|a| MetricsServer::start(a, metrics.clone()))
    {
        Some(Ok(server)) => {
            note!("eim: metrics at http://{}/metrics", server.addr());
            Some(server)
        }
        Some(Err(e)) => {
            tracing::error!("{e}; watching without metrics");
            None
        }
        None => None,
    };
    let summary = watch::watch(
        &mut host,
        &WatchConfig {
            interval: args.interval,
            steps: args.steps,
        },
        stop,
        Some(&metrics),
        &mut Quiet,
        &mut |_| {},
    )?;
    // A stop signal is how a watch ends: its last step may stop between two
    // processes, but what it loaded is whole, and pinned maps stay for the
    // next run.
    print_summary(
        &Summary {
            interrupted: false,
            ..summary
        },
        args.json,
    )
}

pub fn watch(args: &WatchArgs) -> anyhow::Result<ExitCode> {
    let stop = stop::on_signals(maps_kind(&args.backend));
    let mut config = host_config(&args.backend, &args.pids);
    config.unload_delay = (!args.unload_delay.is_zero()).then_some(args.unload_delay);
    match args.backend.backend {
        BackendKind::Sim => watch_on(Host::new(sim_maps()?, config), args, &stop),
        BackendKind::Kernel => match kernel_host(&args.backend, config, &stop)? {
            Some(host) => watch_on(host, args, &stop),
            None => Ok(ExitCode::SUCCESS),
        },
    }
}

fn parse_address(arg: &OsStr) -> anyhow::Result<u64> {
    let s = arg
        .to_str()
        .with_context(|| format!("not an address: {arg:?}"))?;
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.with_context(|| format!("not an address: {s:?}"))
}

fn lookup_on<B: Inspect>(backend: B, args: &LookupArgs) -> anyhow::Result<ExitCode> {
    let mut config = host_config(&args.backend, &[]);
    let answers = match args.pid {
        Some(pid) => {
            let addresses: Vec<u64> = args
                .args
                .iter()
                .map(|a| parse_address(a))
                .collect::<anyhow::Result<_>>()?;
            config.only = Some([pid].into());
            let mut host = Host::new(backend, config);
            lookup::lookup_pid(&mut host, pid, &addresses)?
        }
        None => {
            let (file, rest) = args.args.split_first().context("FILE ADDR... expected")?;
            if rest.is_empty() {
                bail!("no address given for {}", file.to_string_lossy());
            }
            let addresses: Vec<u64> = rest
                .iter()
                .map(|a| parse_address(a))
                .collect::<anyhow::Result<_>>()?;
            let host = Host::new(backend, config);
            lookup::lookup_file(&host, std::path::Path::new(file), &addresses)?
        }
    };
    let text = if args.json {
        serde_json::to_string_pretty(&answers).context("encoding the answers")? + "\n"
    } else {
        answers
            .iter()
            .map(|a| lookup::render_line(a) + "\n")
            .collect()
    };
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

pub fn lookup(args: &LookupArgs) -> anyhow::Result<ExitCode> {
    match args.backend.backend {
        BackendKind::Sim => lookup_on(sim_maps()?, args),
        // Private maps: a lookup must not clean the maps a running scan or
        // watch has pinned.
        BackendKind::Kernel => lookup_on(
            kernel_maps(&args.backend, false, false, files_per_batch())?,
            args,
        ),
    }
}
