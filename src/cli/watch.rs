//! `eim watch`: a [`eim::host::scan::Host`] kept in step with the host,
//! one step every `--interval` until stopped, with metrics served if asked.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use eim::bpf::events::HostEvents;
use eim::daemon::{self, EventsConfig, WatchConfig};
use eim::host::scan::{Host, Quiet};
use eim::map_view::Inspect;
use eim::metrics_http::{Metrics, MetricsServer};
use eim::report::summary::Summary;

use crate::backend::{
    host_config, kernel_host, maps_kind, print_summary, sim_maps, BackendArgs, BackendKind,
    PINS_ONLY_IN_KERNEL,
};
use crate::out::note;
use crate::stop;

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
    /// Print the final summary as one JSON document (which always lists
    /// every loaded file and every file not loaded).
    #[arg(long)]
    pub json: bool,
    /// In the final text summary, list every loaded file and every path of
    /// the files not loaded (without it: a few example paths per reason).
    #[arg(long)]
    pub files: bool,
    /// Poll /proc every --interval instead of following host events from
    /// the kernel (exec, fork, exit, new executable mappings). Without the
    /// privileges for the events program, eim polls anyway and says so.
    #[arg(long)]
    pub no_events: bool,
    /// With host events: walk all of /proc this often as a safety net (and
    /// at once after lost events); what it corrects is counted
    /// (eim_resync_corrections_total).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub resync_every: Duration,
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
    let config = WatchConfig {
        interval: args.interval,
        steps: args.steps,
    };
    let events = host_events(args);
    // Everything that needed more than a step needs is done: the maps are
    // open, the socket bound, the events program attached.
    confine(args.backend.backend == BackendKind::Kernel);
    let summary = match events {
        Some(mut source) => {
            let (summary, stats) = daemon::watch_events(
                &mut host,
                &mut source,
                &config,
                &EventsConfig {
                    resync_every: args.resync_every,
                    ..EventsConfig::default()
                },
                stop,
                Some(&metrics),
                &mut Quiet,
                &mut |_| {},
            )?;
            Summary {
                events: Some(stats),
                ..summary
            }
        }
        None => daemon::watch(
            &mut host,
            &config,
            stop,
            Some(&metrics),
            &mut Quiet,
            &mut |_| {},
        )?,
    };
    // A stop signal is how a watch ends: its last step may stop between two
    // processes, but what it loaded is whole, and pinned maps stay for the
    // next run.
    print_summary(
        &Summary {
            interrupted: false,
            ..summary
        },
        args.json,
        args.files,
    )
}

/// Gives up what steady state does not need (eim::sandbox). A kernel that
/// refuses is said at the default level, and the watch goes on: it still
/// does its work, with the privileges it started with.
fn confine(kernel_maps: bool) {
    match eim::sandbox::confine(&eim::sandbox::steady_capabilities(kernel_maps)) {
        Ok(done) => tracing::info!(
            kept = ?done.kept,
            dropped_from_bounding = done.dropped_from_bounding,
            refused_syscalls = done.refused_syscalls,
            "confined: no new privileges, capabilities cut, seccomp filter on every thread"
        ),
        Err(e) => note!("eim: running unconfined: {e}"),
    }
}

/// The kernel's host events, unless `--no-events` or they cannot be had
/// (then polling, said once at the default level).
fn host_events(args: &WatchArgs) -> Option<HostEvents> {
    let every = humantime::format_duration(args.interval);
    if args.no_events {
        note!("eim: polling /proc every {every} (--no-events)");
        return None;
    }
    match HostEvents::attach() {
        Ok(events) => {
            if let Some(at) = &events.mounted_tracefs {
                note!(
                    "eim: mounted tracefs on {} for the host-event tracepoints",
                    at.display()
                );
            }
            tracing::info!("following host events from the kernel");
            Some(events)
        }
        Err(e) => {
            note!("eim: host events unavailable ({e}); polling /proc every {every}");
            None
        }
    }
}

pub fn run(args: &WatchArgs) -> anyhow::Result<ExitCode> {
    args.backend
        .refuse_unused_pin_options(args.backend.pins(), PINS_ONLY_IN_KERNEL)?;
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
