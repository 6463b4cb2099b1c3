//! What `eim scan`, `eim watch` and `eim lookup` share: the backend
//! arguments and choice (simulated or kernel maps, pins, privileges), the
//! host over them (a warm restart over pins that hold entries), the
//! progress bar and the printed summary. The work is done in the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use eim::bpf::{KernelConfig, KernelMaps};
use eim::host::open::OpenStrategy;
use eim::host::scan::{Host, HostConfig, NotRestarted, Progress, RestartFailed};
use eim::report::problems::Listing;
use eim::report::summary::Summary;
use eim::sim::{SimConfig, SimMaps};

use crate::out::{self, note};
use crate::stop::Maps;

/// Where the kernel maps are pinned unless `--pin-dir` says otherwise.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/eim";

/// Why scan and watch refuse the pin options without pins.
pub const PINS_ONLY_IN_KERNEL: &str =
    "the maps are pinned only with --backend kernel, and not with --no-pin";

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
    /// with --mount-bpffs. [default: /sys/fs/bpf/eim]
    #[arg(long)]
    pub pin_dir: Option<PathBuf>,
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

impl BackendArgs {
    /// The pin directory, given or default.
    pub fn pin_dir(&self) -> PathBuf {
        self.pin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PIN_DIR))
    }

    /// Whether these arguments pin the maps (`--backend kernel` without
    /// `--no-pin`).
    pub fn pins(&self) -> bool {
        self.backend == BackendKind::Kernel && !self.no_pin
    }

    /// Refuses the options of pinned maps where `uses_pins` is false (they
    /// would be ignored, and a user who gave them expects them to act):
    /// `why` says why the command does not use them.
    pub fn refuse_unused_pin_options(&self, uses_pins: bool, why: &str) -> anyhow::Result<()> {
        if uses_pins {
            return Ok(());
        }
        let given: Vec<&str> = [
            (self.pin_dir.is_some(), "--pin-dir"),
            (self.mount_bpffs, "--mount-bpffs"),
            (self.recreate_mismatched, "--recreate-mismatched"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect();
        if given.is_empty() {
            return Ok(());
        }
        bail!("{} would be ignored: {why}", given.join(", "))
    }
}

/// The files a host batch holds open, and the inner arrays a publish
/// holds, from what the soft limit of open files leaves now (after
/// `main` raised it; [`eim::host::descriptors`]).
pub(crate) fn files_per_batch() -> usize {
    match eim::host::descriptors::files_per_batch_now() {
        Ok(n) => {
            tracing::debug!(
                files_per_batch = n,
                "sized from the soft limit of open files"
            );
            n
        }
        Err(e) => {
            let n = eim::host::descriptors::MAX_FILES_PER_BATCH;
            tracing::warn!("{e}; batches of {n} files");
            n
        }
    }
}

pub(crate) fn host_config(args: &BackendArgs, pids: &[i32]) -> HostConfig {
    note_unprivileged(pids);
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

/// Says once, at the start, that eim runs without the privilege to read
/// other users' processes (they are then counted and named as not
/// readable, not silently missed). Quiet when only given pids are read.
fn note_unprivileged(pids: &[i32]) {
    let ptrace = caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_PTRACE,
    );
    if pids.is_empty() && !ptrace.unwrap_or(true) {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        note!(
            "eim: running unprivileged (uid {uid}, without CAP_SYS_PTRACE): only this user's \
             processes can be read; run as root to see the whole host"
        );
    }
}

/// The simulated maps, with the kernel's default capacities.
pub(crate) fn sim_maps() -> anyhow::Result<SimMaps> {
    SimMaps::new(SimConfig::default()).context("creating the simulated maps")
}

/// What to tell a user who lacks the privileges for real maps.
pub(crate) fn privileges_message(what_failed: &str) -> String {
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
pub(crate) fn kernel_maps(
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
        pin_dir: pin.then(|| args.pin_dir()),
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
                    args.pin_dir().display()
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
pub(crate) struct Bar(ProgressBar);

impl Bar {
    pub(crate) fn new() -> Self {
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
/// Prints the summary; a scan or watch exits 0 whatever files it could not
/// load (the summary says which and why), only eim's own errors fail it.
pub(crate) fn print_summary(
    summary: &Summary,
    json: bool,
    all_files: bool,
) -> anyhow::Result<ExitCode> {
    let text = if json {
        serde_json::to_string_pretty(summary).context("encoding the summary")? + "\n"
    } else if all_files {
        summary.render_text_listing(Listing::All)
    } else {
        summary.render_text_listing(Listing::Examples)
    };
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// What a second stop signal may cut short with these arguments.
pub(crate) fn maps_kind(args: &BackendArgs) -> Maps {
    if args.pins() {
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
pub(crate) fn kernel_host(
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
        .with_context(|| format!("reading the maps pinned in {}", args.pin_dir().display()))?;
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
                args.pin_dir().display()
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
                format!("cleaning the maps pinned in {}", args.pin_dir().display())
            })?;
            note!(
                "eim: the maps pinned in {} were not reconciled ({e}); cleaned them: {} page entries, {} tables, {} unwind infos",
                args.pin_dir().display(),
                cleaned.pages,
                cleaned.tables.values().sum::<usize>(),
                cleaned.unwind_slots
            );
            Ok(Some(Host::new(backend, config)))
        }
    }
}
