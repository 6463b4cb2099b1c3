//! `eim scan`: one [`eim::host::scan::Host`] step over every process (or
//! the ones named), then the summary.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use eim::daemon;
use eim::host::scan::Host;
use eim::map_view::Inspect;
use eim::report::summary::Summary;

use crate::backend::{
    host_config, kernel_host, maps_kind, print_summary, sim_maps, BackendArgs, BackendKind, Bar,
    PINS_ONLY_IN_KERNEL,
};
use crate::out::note;
use crate::stop;

/// Options of `eim scan`.
#[derive(Clone, Debug, clap::Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Only these processes (repeatable; default: every process).
    #[arg(long = "pid")]
    pub pids: Vec<i32>,
    /// Print the summary as one JSON document (which always lists every
    /// loaded file and every file not loaded).
    #[arg(long)]
    pub json: bool,
    /// In the text summary, list every loaded file and every path of the
    /// files not loaded (without it: a few example paths per reason).
    #[arg(long)]
    pub files: bool,
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
            daemon::sleep_unless_stopped(wait, stop);
            if !stop.load(std::sync::atomic::Ordering::Relaxed) {
                host.step(stop, &mut Bar::new())?;
            }
        }
    }
    let summary = Summary::of(&mut host)?;
    print_summary(&summary, args.json, args.files)
}

pub fn run(args: &ScanArgs) -> anyhow::Result<ExitCode> {
    args.backend
        .refuse_unused_pin_options(args.backend.pins(), PINS_ONLY_IN_KERNEL)?;
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
