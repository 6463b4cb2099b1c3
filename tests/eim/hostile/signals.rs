//! SIGINT, SIGTERM and SIGHUP to `eim watch` and `eim scan`: what Ctrl-C,
//! `kill`, systemd, Kubernetes and a closed terminal send. Each stops the
//! run as Ctrl-C does: exit 0, the summary on stdout, the maps holding
//! whole tables (the same as a scan that was not stopped). A second signal
//! while stopping quits at once only when the maps go with eim.
//!
//! The process helpers here are shared with `output.rs`.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{eim_bin, root_or_skip};

/// How long any one eim run in these tests may take.
pub const LIMIT: Duration = Duration::from_secs(20);

/// A child process, killed and reaped on drop so that a failing test
/// leaves nothing running.
pub struct Running {
    child: Option<Child>,
    what: String,
}

impl Running {
    pub fn spawn(cmd: &mut Command) -> Self {
        let what = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Self {
            child: Some(child),
            what,
        }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("not yet reaped")
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("not yet reaped").id() as i32
    }

    pub fn take_stdout(&mut self) -> Collected {
        collect(self.take_raw_stdout())
    }

    /// The stdout pipe itself, to read part of and drop.
    pub fn take_raw_stdout(&mut self) -> ChildStdout {
        self.child().stdout.take().expect("stdout piped")
    }

    pub fn take_stderr(&mut self) -> Collected {
        collect(self.child().stderr.take().expect("stderr piped"))
    }

    pub fn take_stderr_lines(&mut self) -> Lines {
        Lines::of(self.child().stderr.take().expect("stderr piped"))
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill {signal} {}", self.what);
    }

    /// Waits for the exit, at most [`LIMIT`] (then kills and fails).
    pub fn wait(&mut self) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child().try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                started.elapsed() < LIMIT,
                "{} still running after {LIMIT:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the process has a handler for `signal` (its `SigCgt`),
    /// so that a signal sent now is eim's to handle, not a default death.
    pub fn wait_for_handler(&self, signal: libc::c_int) {
        let started = Instant::now();
        while !catches(self.pid(), signal) {
            assert!(
                started.elapsed() < LIMIT,
                "{} never handled signal {signal}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether `pid` catches `signal`, from the `SigCgt` mask of its status.
fn catches(pid: i32, signal: libc::c_int) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// Everything a pipe gives until it closes, read on a thread of its own
/// so that a full pipe never stalls the child.
pub struct Collected(JoinHandle<String>);

fn collect(mut pipe: impl Read + Send + 'static) -> Collected {
    Collected(std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }))
}

impl Collected {
    /// The text (call after the child exited: then the pipe is closed).
    pub fn text(self) -> String {
        self.0.join().expect("reader thread")
    }
}

/// Stderr line by line, with a timeout on each wait; every line seen is
/// kept for the failure messages and the final checks.
pub struct Lines {
    rx: Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(stderr: ChildStderr) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (at most [`LIMIT`]) for a line containing `needle`.
    pub fn wait_for(&mut self, needle: &str) {
        let until = Instant::now() + LIMIT;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => panic!(
                    "no {needle:?} on stderr ({e}); saw:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Every line, once the child has exited.
    pub fn rest(mut self) -> String {
        self.seen.extend(self.rx.iter());
        self.seen.join("\n")
    }
}

/// `sleep 60`: a process whose mappings (sleep, libc, ld.so) never change,
/// for `--pid`.
pub fn sleeper() -> Running {
    Running::spawn(
        Command::new("sleep")
            .arg("60")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// `eim` with `args`, stdout and stderr piped, stdin closed.
pub fn eim(args: &[&str]) -> Command {
    let mut cmd = Command::new(eim_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The JSON summary of a scan of `pid` that nothing stopped: what whole
/// tables for its files look like.
pub fn reference_summary(pid: i32) -> Value {
    let mut scan = Running::spawn(&mut eim(&["scan", "--json", "--pid", &pid.to_string()]));
    let out = scan.take_stdout();
    let err = scan.take_stderr();
    let status = scan.wait();
    let (out, err) = (out.text(), err.text());
    assert!(status.success(), "reference scan: {status}\n{err}");
    let summary: Value = serde_json::from_str(&out).expect("reference JSON summary");
    assert!(
        summary["files"]["loaded"].as_u64().unwrap_or(0) >= 2,
        "the sleeper maps at least sleep and libc: {summary}"
    );
    summary
}

/// Whether two summaries describe the same maps: the same files loaded and
/// the same tables, page entries and unwind infos.
pub fn assert_same_maps(got: &Value, want: &Value) {
    assert_eq!(got["files"], want["files"], "files");
    for key in ["page_entries", "unwind_infos", "size_classes"] {
        assert_eq!(got["kernel"][key], want["kernel"][key], "kernel {key}");
    }
}

fn signal_name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// Starts `eim -v watch --interval 200ms --json --pid <sleeper>` with
/// `backend`, waits for its first step, sends `signal`, and checks that it
/// exits 0 with a summary of whole tables.
fn watch_stops_on(signal: libc::c_int, backend: &[&str]) {
    let sleeper = sleeper();
    let want = reference_summary(sleeper.pid());
    let pid = sleeper.pid().to_string();
    let mut args = vec![
        "-v",
        "watch",
        "--interval",
        "200ms",
        "--json",
        "--pid",
        &pid,
    ];
    args.extend_from_slice(backend);
    let mut watch = Running::spawn(&mut eim(&args));
    let out = watch.take_stdout();
    let mut err = watch.take_stderr_lines();
    err.wait_for(" step=1 ");
    watch.signal(signal);
    let status = watch.wait();
    let got = stopped_cleanly(status, signal, &out.text(), &err.rest());
    assert_eq!(got["interrupted"], false, "a stopped watch ends normally");
    assert_same_maps(&got, &want);
}

/// What `signal` must end in: exit 0, the note on stderr, and the JSON
/// summary on stdout (returned).
fn stopped_cleanly(status: ExitStatus, signal: libc::c_int, out: &str, err: &str) -> Value {
    let name = signal_name(signal);
    assert_eq!(status.code(), Some(0), "{status} after {name}:\n{err}");
    assert!(
        err.contains(&format!("eim: {name}: stopping")),
        "no note of {name}:\n{err}"
    );
    serde_json::from_str(out)
        .unwrap_or_else(|e| panic!("no JSON summary after {name} ({e}):\n{out}\n{err}"))
}

#[test]
fn watch_stops_on_sigint_with_its_summary() {
    watch_stops_on(libc::SIGINT, &[]);
}

#[test]
fn watch_stops_on_sigterm_with_its_summary() {
    watch_stops_on(libc::SIGTERM, &[]);
}

#[test]
fn watch_stops_on_sighup_with_its_summary() {
    watch_stops_on(libc::SIGHUP, &[]);
}

#[test]
fn watch_on_kernel_maps_stops_on_sigterm_with_its_summary() {
    if !root_or_skip("watch_on_kernel_maps_stops_on_sigterm_with_its_summary") {
        return;
    }
    watch_stops_on(libc::SIGTERM, &["--backend", "kernel", "--no-pin"]);
}

/// A whole-host `eim scan --json` sent `signal` as soon as it handles it:
/// exit 0 and a summary, cut short (`interrupted`) or complete, whichever
/// the signal met.
fn scan_stops_on(signal: libc::c_int) {
    let mut scan = Running::spawn(&mut eim(&["scan", "--json"]));
    let out = scan.take_stdout();
    let err = scan.take_stderr();
    scan.wait_for_handler(signal);
    scan.signal(signal);
    let status = scan.wait();
    let got = stopped_cleanly(status, signal, &out.text(), &err.text());
    assert!(got["interrupted"].is_boolean(), "{got}");
    assert!(got["processes"]["listed"].is_u64(), "{got}");
}

#[test]
fn scan_stops_on_sigint_with_its_summary() {
    scan_stops_on(libc::SIGINT);
}

#[test]
fn scan_stops_on_sigterm_with_its_summary() {
    scan_stops_on(libc::SIGTERM);
}

#[test]
fn scan_stops_on_sighup_with_its_summary() {
    scan_stops_on(libc::SIGHUP);
}

/// A pin directory of a test's own, under the system's temporary directory:
/// eim mounts a bpffs on it (`--mount-bpffs`); dropping it unmounts that,
/// removes it and its lock file.
struct PinDir {
    dir: tempfile::TempDir,
}

impl PinDir {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("pins")
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        unmount(&self.path());
        if let Ok(lock) = eim::bpf::lock::lock_file_of(&self.path()) {
            let _ = std::fs::remove_file(lock);
        }
    }
}

fn unmount(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a NUL-terminated path; a failure (nothing mounted) is fine.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// Sends SIGTERM as soon as eim handles it, and again 30 ms later: eim is
/// still making its kernel maps then (that takes hundreds of ms), so the
/// second signal arrives while it is stopping.
fn terminate_twice(args: &[&str]) -> (ExitStatus, String, String) {
    let mut watch = Running::spawn(&mut eim(args));
    let out = watch.take_stdout();
    let err = watch.take_stderr();
    watch.wait_for_handler(libc::SIGTERM);
    watch.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(30));
    watch.signal(libc::SIGTERM);
    let status = watch.wait();
    (status, out.text(), err.text())
}

#[test]
fn a_second_signal_does_not_cut_pinned_maps_short() {
    if !root_or_skip("a_second_signal_does_not_cut_pinned_maps_short") {
        return;
    }
    let sleeper = sleeper();
    let pid = sleeper.pid().to_string();
    let pins = PinDir::new();
    let pin_dir = pins.path();
    let pin_dir = pin_dir.to_str().expect("a UTF-8 temporary directory");
    let kernel = ["--backend", "kernel", "--pin-dir", pin_dir, "--mount-bpffs"];
    let mut args = vec!["watch", "--interval", "200ms", "--json", "--pid", &pid];
    args.extend_from_slice(&kernel);
    let (status, out, err) = terminate_twice(&args);
    assert_eq!(status.code(), Some(0), "{status}:\n{err}");
    assert!(err.contains("eim: SIGTERM again: still finishing"), "{err}");
    let _: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("no JSON summary ({e}):\n{out}\n{err}"));
    // The next run over the same pins loads the sleeper's files whole.
    let mut args = vec!["scan", "--json", "--pid", &pid];
    args.extend_from_slice(&kernel);
    let mut scan = Running::spawn(&mut eim(&args));
    let out = scan.take_stdout();
    let err = scan.take_stderr();
    let status = scan.wait();
    let (out, err) = (out.text(), err.text());
    assert!(status.success(), "scan over the pins: {status}\n{err}");
    let got: Value = serde_json::from_str(&out).expect("JSON summary");
    assert_same_maps(&got, &reference_summary(sleeper.pid()));
}

#[test]
fn a_second_signal_quits_at_once_when_the_maps_go_with_eim() {
    if !root_or_skip("a_second_signal_quits_at_once_when_the_maps_go_with_eim") {
        return;
    }
    let sleeper = sleeper();
    let pid = sleeper.pid().to_string();
    let (status, _, err) = terminate_twice(&[
        "watch",
        "--interval",
        "200ms",
        "--pid",
        &pid,
        "--backend",
        "kernel",
        "--no-pin",
    ]);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}:\n{err}");
    assert!(err.contains("eim: SIGTERM again: quitting now"), "{err}");
}
