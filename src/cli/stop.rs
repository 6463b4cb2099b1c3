//! How `scan` and `watch` are stopped: SIGINT (Ctrl-C), SIGTERM (kill,
//! systemd, Kubernetes) and SIGHUP (the terminal went away) all set one
//! stop flag. The host walk checks it between two processes and the watch
//! loop between two steps, so the run ends with whole tables in the maps
//! and prints its summary.
//!
//! The signals are received by `signal-hook` on a thread of their own, so
//! the notes below are ordinary code, not a signal handler.
//!
//! A second signal while stopping cuts the current file batch short only
//! when nothing can outlive eim half-written: the simulated maps and
//! unpinned kernel maps go with the process, so eim then dies by that
//! signal at once. Pinned maps are read by the profiler after eim exits and
//! reused by the next run, so with them the batch is always finished.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use signal_hook::low_level::{emulate_default_handler, signal_name};

use crate::out::note;

/// The signals that stop a run.
const STOP_SIGNALS: [libc::c_int; 3] = [SIGINT, SIGTERM, SIGHUP];

/// Whether a batch may be cut short by a second signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Maps {
    /// The maps die with eim (simulated, or kernel maps not pinned).
    Private,
    /// The maps are pinned: they outlive eim and must stay whole.
    Pinned,
}

/// The stop flag, set by the first of SIGINT, SIGTERM or SIGHUP. If the
/// signals cannot be taken over, they keep their default action (eim dies
/// without its summary) and a warning says so.
pub fn on_signals(maps: Maps) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let signals = match Signals::new(STOP_SIGNALS) {
        Ok(signals) => signals,
        Err(e) => {
            tracing::warn!("cannot handle SIGINT, SIGTERM and SIGHUP: {e}");
            return stop;
        }
    };
    let flag = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("eim-signals".into())
        // It waits for signals and writes a note: a small stack.
        .stack_size(256 << 10)
        .spawn(move || {
            // Listening needs no privilege, and a thread's capabilities
            // are its own (eim::sandbox).
            eim::sandbox::drop_all_in_this_thread();
            listen(signals, &flag, maps)
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the signal thread: {e}");
    }
    tracing::debug!("SIGINT, SIGTERM and SIGHUP stop the run");
    stop
}

fn listen(mut signals: Signals, stop: &AtomicBool, maps: Maps) {
    for signal in signals.forever() {
        let name = signal_name(signal).unwrap_or("a signal");
        if !stop.load(Ordering::SeqCst) {
            // The note first: once the flag is up the run may end and exit,
            // and the note must be out by then. Only this thread sets it.
            note!("eim: {name}: stopping after the current file batch");
            stop.store(true, Ordering::SeqCst);
            continue;
        }
        match maps {
            Maps::Pinned => note!(
                "eim: {name} again: still finishing the current file batch, \
                 so that the pinned maps stay whole"
            ),
            Maps::Private => {
                note!("eim: {name} again: quitting now (the maps go with eim)");
                // Dying by the signal itself tells the parent (a shell, a
                // supervisor) what ended eim.
                let _ = emulate_default_handler(signal);
                std::process::exit(128 + signal);
            }
        }
    }
}
