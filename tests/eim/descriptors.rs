//! Descriptors of the built `eim` over a host of 1,000 libraries (root;
//! a loud SKIPPED otherwise, a failure under `EIM_REQUIRE_BPF=1`): this
//! test process maps at least 1,000 distinct ELF libraries of `/usr`, and
//!
//! * `eim scan --backend kernel --no-pin --pid <it>` under `ulimit -n 256`
//!   (soft and hard, so eim cannot raise it) loads every file that loads
//!   without the limit, and fails the same ones;
//! * `eim watch --backend kernel` over it, started with a soft limit of
//!   256 under a higher hard one, raises the soft limit to the hard one
//!   (and says so at `-v`), and once its first step has loaded the files
//!   holds fewer than 64 descriptors.
//!
//! Every child is killed and reaped when its guard drops, and every wait
//! has a deadline.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use eim_test_support::host::Libraries;

/// Distinct libraries the test process maps.
const LIBRARIES: usize = 1000;
const DEADLINE: Duration = Duration::from_secs(120);

fn kernel_ready(test: &str) -> bool {
    eim::bpf::probe::require_bpf(test)
}

/// This process, mapping the libraries (once for every test).
fn mapping_process() -> String {
    // Kept mapped for the life of the test process.
    static MAPPED: OnceLock<Libraries> = OnceLock::new();
    let mapped = MAPPED.get_or_init(|| Libraries::map(LIBRARIES)).len();
    assert!(
        mapped >= LIBRARIES,
        "only {mapped} distinct ELF libraries found under /usr to map"
    );
    std::process::id().to_string()
}

/// `eim` with `RLIMIT_NOFILE` set to `soft` and `hard` before its exec.
fn eim_limited(limit: Option<(u64, u64)>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eim"));
    cmd.stdin(Stdio::null());
    if let Some((soft, hard)) = limit {
        // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    cmd
}

/// A child killed (and reaped) when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `from` to its end on a thread of its own: a child writing a lot
/// to one pipe must not block while the test waits on the other.
fn read_in_background(mut from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = from.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    rx
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `eim scan --backend kernel --no-pin --pid <pid> --json` under `limit`:
/// its summary and its stderr.
fn scan(pid: &str, limit: Option<(u64, u64)>) -> (Value, String) {
    let mut child = Running(
        eim_limited(limit)
            .args([
                "scan",
                "--backend",
                "kernel",
                "--no-pin",
                "--json",
                "--pid",
                pid,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting eim scan"),
    );
    let out = read_in_background(child.0.stdout.take().expect("stdout"));
    let err = read_in_background(child.0.stderr.take().expect("stderr"));
    let deadline = Instant::now() + DEADLINE;
    let (out, err) = match (
        out.recv_timeout(deadline.saturating_duration_since(Instant::now())),
        err.recv_timeout(deadline.saturating_duration_since(Instant::now())),
    ) {
        (Ok(out), Ok(err)) => (out, err),
        _ => {
            // Killed, its pipes close and the readers say what it wrote.
            drop(child);
            let said = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
            panic!(
                "eim scan under {limit:?} did not finish in {DEADLINE:?}; it said:\n{}",
                tail(&said, 20)
            );
        }
    };
    let status = child.0.wait().expect("wait");
    assert!(
        status.success(),
        "eim scan under {limit:?}: {status}\n{}",
        tail(&err, 20)
    );
    let summary = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{e}: {}", out.chars().take(2000).collect::<String>()));
    (summary, err)
}

/// The (path, kind) of every problem, with its reason.
fn problems(summary: &Value) -> BTreeMap<(String, String), String> {
    summary["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .map(|p| {
            (
                (p["path"].to_string(), p["kind"].to_string()),
                p["reason"].to_string(),
            )
        })
        .collect()
}

/// Up to ten problems of `a` that `b` does not have, one a line.
fn only_in(
    a: &BTreeMap<(String, String), String>,
    b: &BTreeMap<(String, String), String>,
) -> String {
    a.iter()
        .filter(|(k, _)| !b.contains_key(*k))
        .take(10)
        .map(|((path, kind), reason)| format!("{kind} {path}: {reason}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn loaded(summary: &Value) -> u64 {
    summary["files"]["loaded"].as_u64().expect("files.loaded")
}

#[test]
fn a_thousand_libraries_load_under_ulimit_n_256_as_without_it() {
    if !kernel_ready("descriptors test") {
        return;
    }
    let pid = mapping_process();
    let (free, _) = scan(&pid, None);
    let (limited, err) = scan(&pid, Some((256, 256)));
    let (free_problems, limited_problems) = (problems(&free), problems(&limited));
    assert!(
        loaded(&free) >= LIBRARIES as u64 * 9 / 10,
        "most libraries load: {}\n{}",
        free["files"],
        only_in(&free_problems, &BTreeMap::new())
    );
    assert_eq!(
        loaded(&limited),
        loaded(&free),
        "{}; problems only under the limit:\n{}",
        limited["files"],
        only_in(&limited_problems, &free_problems)
    );
    assert!(
        limited_problems.keys().eq(free_problems.keys()),
        "under the limit:\n{}\nwithout it:\n{}",
        only_in(&limited_problems, &free_problems),
        only_in(&free_problems, &limited_problems)
    );
    assert!(
        !err.contains("errno 24") && !err.contains("Too many open files"),
        "{}",
        tail(&err, 20)
    );
}

/// The soft limit of process `pid`, and what its open descriptors are
/// (the target of each link in `/proc/PID/fd`, with how many point there).
fn limit_and_fds(pid: u32) -> (u64, BTreeMap<String, usize>) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|s| s.parse().ok())
        .expect("Max open files");
    let mut fds = BTreeMap::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd")
        .flatten()
    {
        // A descriptor closed between the listing and the read still counts.
        let to = std::fs::read_link(fd.path()).map_or_else(
            |_| "(closed meanwhile)".to_string(),
            |to| to.display().to_string(),
        );
        *fds.entry(to).or_insert(0) += 1;
    }
    (soft, fds)
}

#[test]
fn a_watch_over_a_thousand_libraries_holds_fewer_than_64_descriptors() {
    if !kernel_ready("descriptors test") {
        return;
    }
    let pid = mapping_process();
    let mut watch = Running(
        eim_limited(Some((256, 4096)))
            .args(["-v", "watch", "--backend", "kernel", "--no-pin"])
            .args(["--interval", "60s", "--pid", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting eim watch"),
    );
    let stderr = BufReader::new(watch.0.stderr.take().expect("stderr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut said = Vec::new();
    let step = loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| {
            panic!(
                "no step logged in {DEADLINE:?}:\n{}",
                tail(&said.join("\n"), 20)
            )
        });
        if line.contains(" step step=1 ") {
            break line;
        }
        said.push(line);
    };
    // Between the first step and the second, a minute later: what the
    // loaded host costs.
    let (soft, fds) = limit_and_fds(watch.0.id());
    let loaded: u64 = step
        .split_whitespace()
        .find_map(|f| f.strip_prefix("loaded="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{step}"));
    assert!(
        loaded >= LIBRARIES as u64 * 9 / 10,
        "{step}\n{}",
        tail(&said.join("\n"), 20)
    );
    let open: usize = fds.values().sum();
    assert!(
        open < 64,
        "{open} descriptors open with {loaded} files loaded: {fds:#?}"
    );
    assert_eq!(soft, 4096, "the soft limit raised to the hard one");
    assert!(
        said.iter().any(|l| l.contains(
            "raised the soft limit of open files (RLIMIT_NOFILE) from 256 to the hard limit 4096"
        )),
        "{:#?}",
        &said[..said.len().min(10)]
    );
}
