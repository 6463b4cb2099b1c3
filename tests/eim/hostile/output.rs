//! stdout and stderr that fail: a full disk (`/dev/full`: ENOSPC), a
//! reader that went away (EPIPE), a pipe closed before eim writes. No
//! write error panics (exit 101). Logs that cannot be written are dropped
//! and the run goes on; a reader that goes away ends a command quietly
//! (exit 0, or death by SIGPIPE); a full stdout is a short error and exit 1.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

use serde_json::Value;

use crate::signals::{assert_same_maps, eim, reference_summary, sleeper, Running};

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// The commands whose output is large enough to meet a failing stdout.
fn big_outputs() -> [Vec<&'static str>; 4] {
    [
        vec!["deltas", LIBC],
        vec!["tables", LIBC],
        vec!["inspect", LIBC],
        vec!["scan", "--json"],
    ]
}

fn dev_full() -> File {
    OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full")
}

/// The write end of a pipe whose read end is already closed: every write
/// to it fails with EPIPE.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    writer
}

/// A reader that went away: exit 0, or death by SIGPIPE, and no panic.
fn assert_quiet_end(status: ExitStatus, what: &str, stderr: &str) {
    assert!(
        status.code() == Some(0) || status.signal() == Some(libc::SIGPIPE),
        "{what}: {status} when its reader went away:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}:\n{stderr}");
}

/// `eim -vv watch --interval 100ms --pid <sleeper>` logging to `stderr`:
/// it runs a few steps (each writes debug lines), then stops on SIGINT
/// with exit 0 and its summary.
fn watch_logging_to(stderr: Stdio) {
    let sleeper = sleeper();
    let want = reference_summary(sleeper.pid());
    let pid = sleeper.pid().to_string();
    // stderr cannot be read here to see the steps happen: the metrics
    // say when the first step has loaded the sleeper's files.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = eim(&[
        "-vv",
        "watch",
        "--interval",
        "100ms",
        "--json",
        "--metrics-addr",
        &addr,
        "--pid",
        &pid,
    ]);
    let mut watch = Running::spawn(cmd.stderr(stderr));
    let out = watch.take_stdout();
    watch.wait_for_handler(libc::SIGINT);
    let loaded = want["files"]["loaded"].as_u64().unwrap_or(0);
    let stepped = wait_for_metric(&addr, |body| {
        body.contains("eim_processes_tracked 1\n")
            && body.contains(&format!("eim_num_exe_id_loaded_to_ebpf {loaded}\n"))
    });
    assert!(
        stepped,
        "the watch's first step never loaded {loaded} files"
    );
    // A few steps more, each logging.
    std::thread::sleep(std::time::Duration::from_millis(300));
    watch.signal(libc::SIGINT);
    let status = watch.wait();
    let out = out.text();
    assert_eq!(status.code(), Some(0), "{status}");
    let got: Value = serde_json::from_str(&out).expect("JSON summary");
    assert_same_maps(&got, &want);
}

/// Polls `GET /metrics` at `addr` until `done` holds for the body (at most
/// 60 s, however loaded the machine).
fn wait_for_metric(addr: &str, done: impl Fn(&str) -> bool) -> bool {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            if done(&body) {
                return true;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

#[test]
fn watch_logging_to_a_full_disk_runs_and_stops_on_sigint() {
    watch_logging_to(dev_full().into());
}

#[test]
fn watch_logging_to_a_closed_pipe_runs_and_stops_on_sigint() {
    watch_logging_to(closed_pipe().into());
}

#[test]
fn a_reader_that_goes_away_after_one_line_ends_deltas_quietly() {
    // `eim deltas libc.so.6 | head -1`: the text is ~450 kB, far more than
    // a pipe holds, so eim is still writing when the reader goes.
    let mut deltas = Running::spawn(&mut eim(&["deltas", LIBC]));
    let err = deltas.take_stderr();
    let mut first = String::new();
    BufReader::new(deltas.take_raw_stdout())
        .read_line(&mut first)
        .expect("one line");
    assert!(first.starts_with("# file: "), "{first:?}");
    let status = deltas.wait();
    let err = err.text();
    assert_quiet_end(status, "deltas | head -1", &err);
    assert_eq!(err, "", "a reader that goes away is no error");
}

#[test]
fn a_stdout_closed_before_the_first_write_ends_each_command_quietly() {
    for args in big_outputs() {
        let mut cmd = eim(&args);
        let mut run = Running::spawn(cmd.stdout(closed_pipe()));
        let err = run.take_stderr();
        let status = run.wait();
        let err = err.text();
        let what = args.join(" ");
        assert_quiet_end(status, &what, &err);
        assert!(!err.contains("stdout"), "{what}: {err}");
    }
}

#[test]
fn a_full_stdout_is_a_short_error_and_exit_1() {
    for args in big_outputs() {
        let mut cmd = eim(&args);
        let mut run = Running::spawn(cmd.stdout(dev_full()));
        let err = run.take_stderr();
        let status = run.wait();
        let err = err.text();
        let what = args.join(" ");
        assert_eq!(status.code(), Some(1), "{what}: {status}\n{err}");
        assert!(
            err.contains("eim: stdout: No space left on device"),
            "{what}: {err}"
        );
        assert!(err.len() < 200, "{what}: a long error: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
fn a_full_stdout_and_stderr_exit_1_without_a_panic() {
    for args in big_outputs() {
        let mut cmd = eim(&args);
        let mut run = Running::spawn(cmd.stdout(dev_full()).stderr(dev_full()));
        let status = run.wait();
        assert_eq!(status.code(), Some(1), "{}: {status}", args.join(" "));
    }
}

#[test]
fn a_failing_file_reported_to_a_full_stderr_is_no_panic() {
    // `eim deltas` reports a bad file on stderr and goes on with the next.
    let mut cmd = eim(&["deltas", "/nonexistent/eim-hostile", LIBC]);
    let mut run = Running::spawn(cmd.stderr(dev_full()));
    let out = run.take_stdout();
    let status = run.wait();
    let out = out.text();
    assert_eq!(status.code(), Some(1), "{status}");
    assert!(
        out.contains(&format!("# file: {LIBC}")),
        "the next file is still printed"
    );
}
