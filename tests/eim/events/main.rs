//! `eim watch` following host events from the kernel (issue 18), on the
//! real kernel: root, a loud SKIPPED otherwise, a failure under
//! `EIM_REQUIRE_BPF=1`.
//!
//! * a process that lives 5 ms (longer ones after it on a loaded machine) is seen (its file, unique to the test, in
//!   the pinned maps while the unload delay lasts) and released after;
//! * events and polling end in the same maps after the same churn of
//!   execs, dlopens and exits, compared at quiet points on the files the
//!   churn maps (unique copies, so the rest of the host cannot interfere);
//! * lost events (a ring made too small, filled) force a resync, which
//!   corrects what they missed;
//! * processes reaped right after their exit event leave the table at once,
//!   not at the next resync;
//! * without events (`--no-events`, or without the privileges) eim polls,
//!   and says so once.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::*;

mod churn;
mod lost;
mod reaped;

/// How long the short processes live, in order: 5 ms first; on a loaded
/// machine eim may wake too late for those (a process gone before eim
/// reads it costs only its events), so longer ones follow, until one is
/// seen. Each attempt is a file of its own.
const SHORT_LIVES: [&str; 7] = ["0.005", "0.005", "0.005", "0.02", "0.08", "0.32", "1.28"];

#[test]
fn a_short_process_is_seen_and_released() {
    let _one = serial();
    if !kernel_ready("a_short_process_is_seen_and_released") {
        return;
    }
    let scratch = tempfile::tempdir().expect("temporary directory");
    let pins = Pins::new("short");
    // The wait for a file to show (SEEN_WITHIN) is shorter than the unload
    // delay: a file loaded at any moment of that wait is still there when
    // the wait looks.
    const SEEN_WITHIN: Duration = Duration::from_secs(3);
    let watch = Watch::start(&pins, &["--interval", "100ms", "--unload-delay", "4s"]);
    let mut misses = Vec::new();
    let seen = SHORT_LIVES.iter().enumerate().find_map(|(attempt, life)| {
        let short = unique_copy(
            "/usr/bin/sleep",
            scratch.path(),
            &format!("short-{attempt}"),
        );
        let id = host_id_of(&short);
        let started = Instant::now();
        let status = Command::new(&short)
            .arg(life)
            .status()
            .expect("run the short process");
        assert!(status.success());
        let lived = started.elapsed();
        // Seen: its file is in the pinned maps, kept by the unload delay.
        if wait_for(SEEN_WITHIN, || pins.file_ids().contains(&id)) {
            eprintln!("a process of {lived:?} was seen (missed: {misses:?})");
            Some(id)
        } else {
            misses.push(lived);
            None
        }
    });
    let Some(id) = seen else {
        panic!(
            "processes of {misses:?} were not seen: {:?}",
            pins.file_ids()
        );
    };
    // And released once the delay is over.
    let released = wait_for(Duration::from_secs(20), || !pins.file_ids().contains(&id));
    assert!(released, "the short process's file stayed loaded");
    let summary = watch.stop();
    let events = &summary["events"];
    assert!(events["events"]["exec"].as_u64() > Some(0), "{events}");
    assert_eq!(events["lost"], 0, "{events}");
    assert_eq!(events["corrections"], 0, "{events}");
}

#[test]
fn without_events_eim_polls_and_says_so_once() {
    let _one = serial();
    if !kernel_ready("without_events_eim_polls_and_says_so_once") {
        return;
    }
    let run = |extra: &[&str], as_nobody: bool| {
        let mut cmd = if as_nobody {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                eim_bin(),
            ]);
            c
        } else {
            Command::new(eim_bin())
        };
        cmd.env_remove("RUST_LOG")
            .args(["watch", "--interval", "50ms", "--steps", "3", "--json"])
            .args(extra);
        let out = cmd.output().expect("run eim watch");
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (out, err) = run(&["--no-events"], false);
    assert_eq!(
        err.matches("eim: polling /proc every 50ms (--no-events)")
            .count(),
        1,
        "{err}"
    );
    let summary: Value = serde_json::from_str(&out).expect("JSON");
    assert!(summary.get("events").is_none(), "{summary}");
    if !tools_present(&["setpriv"]) {
        return;
    }
    let (out, err) = run(&[], true);
    assert_eq!(
        err.matches("eim: host events unavailable (").count(),
        1,
        "{err}"
    );
    assert!(err.contains("polling /proc every 50ms"), "{err}");
    let summary: Value = serde_json::from_str(&out).expect("JSON");
    assert!(
        summary["processes"]["listed"].as_u64() > Some(0),
        "{summary}"
    );
}
