//! Memory that fails cleanly (issue 28, item 3): under an address-space
//! limit (`ulimit -v`, set with `setrlimit(RLIMIT_AS)` in the child), the
//! built `eim` either works or exits 1 with one line saying what it could
//! not allocate: never an abort (SIGABRT, "memory allocation of N bytes
//! failed" and a backtrace, as before).
//!
//! The input is the worst one eim's caps allow a CFI walk
//! (`eim_test_support::worst_eh_frame`: 64 MiB of minimal FDEs), mapped
//! executable by this test process, so that `eim scan --pid` and
//! `eim watch --pid` of this process load it. The kernel backend's cases
//! need root and BPF (a loud SKIPPED otherwise, a failure under
//! `EIM_REQUIRE_BPF=1`).

use std::ffi::OsStr;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use eim_test_support::worst_eh_frame::{fdes_in, minimal_fde_elf, Shape, MAX_SECTION_BYTES};

/// The limit the issue asks eim to live with: `ulimit -v 250000` (KiB).
const USUAL_LIMIT: u64 = 250_000 * 1024;

/// Limits tried, from the highest down, to find one too tight for `scan`
/// to work at all: the first that fails must fail in one line.
const TIGHT_LIMITS: [u64; 8] = [
    40_000_000, 36_000_000, 32_000_000, 28_000_000, 24_000_000, 20_000_000, 16_000_000, 12_000_000,
];

/// The `eim` binary cargo built for these tests, or `$EIM_MEMORY_BIN`:
/// another build to run the cases against (an older one, to see them
/// reproduce the aborts they guard against).
fn eim() -> PathBuf {
    std::env::var_os("EIM_MEMORY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_eim")))
}

/// A file of the worst input, mapped executable (private, read-only) by
/// this process while it lives.
struct Mapped {
    _dir: tempfile::TempDir,
    path: PathBuf,
    at: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    fn new(shape: Shape) -> Self {
        // Under the target directory: /tmp may be mounted noexec.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
        let path = dir.path().join("worst-eh-frame.so");
        let bytes = minimal_fde_elf(fdes_in(MAX_SECTION_BYTES), shape);
        std::fs::write(&path, &bytes).expect("write the worst file");
        let file = std::fs::File::open(&path).expect("open the worst file");
        let len = bytes.len();
        drop(bytes);
        // SAFETY: a new private read-only mapping of a file this test
        // owns; unmapped in Drop, never read through.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED, "mmap the worst file executable");
        Self {
            _dir: dir,
            path,
            at,
            len,
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.at, self.len) };
    }
}

/// `eim ARGS` with its address space limited to `limit` bytes.
fn eim_limited(limit: u64, args: &[&OsStr]) -> Output {
    let mut cmd = Command::new(eim());
    cmd.args(args).env_remove("RUST_LOG");
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run eim")
}

/// Checks that a run under `limit` was not killed and printed no abort;
/// returns its stderr lines but the notes a start prints whatever the
/// memory (tracefs mounted, or, unprivileged, host events unavailable).
fn no_abort(what: &str, out: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "{what}: killed by a signal: {}\n{stderr}",
        out.status
    );
    for abort in ["backtrace", "memory allocation of", "panicked"] {
        assert!(
            !stderr.contains(abort),
            "{what}: {abort:?} on stderr:\n{stderr}"
        );
    }
    stderr
        .lines()
        .filter(|l| {
            !l.starts_with("eim: mounted") && !l.starts_with("eim: host events unavailable")
        })
        .map(str::to_owned)
        .collect()
}

/// The run ended with exit 1 and one line saying what eim could not
/// allocate under `limit`.
fn out_of_memory_in_one_line(what: &str, limit: u64, out: &Output) {
    let lines = no_abort(what, out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: {}: {lines:?}",
        out.status
    );
    assert_eq!(lines.len(), 1, "{what}: not one line: {lines:#?}");
    let limits = format!("bytes (address-space limit {limit} bytes, cgroup memory limit ");
    assert!(
        lines[0].starts_with("eim: out of memory: could not allocate ")
            && lines[0].contains(&limits),
        "{what}: {}",
        lines[0]
    );
}

/// `deltas` of one file under a limit: it worked, or it exited 1 with one
/// line: the file's failure for want of memory, or eim's own.
fn deltas_work_or_fail_in_one_line(what: &str, out: &Output) -> bool {
    let lines = no_abort(what, out);
    if out.status.success() {
        return false;
    }
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: {}: {lines:?}",
        out.status
    );
    assert_eq!(lines.len(), 1, "{what}: not one line: {lines:#?}");
    assert!(
        lines[0].starts_with("eim: out of memory: could not allocate ")
            || lines[0].contains("failed to extract stack deltas")
                && (lines[0].contains("no memory") || lines[0].contains("stack deltas, more than")),
        "{what}: {}",
        lines[0]
    );
    true
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `scan` and `watch` of this process (JSON summaries), on `backend`'s
/// maps, under `limit`.
fn scan_and_watch(backend: &[&str], limit: u64) -> Vec<(String, Output)> {
    let pid = std::process::id().to_string();
    let mut runs = Vec::new();
    for command in [
        vec!["scan", "--json", "--pid", &pid],
        vec![
            "watch",
            "--json",
            "--pid",
            &pid,
            "--steps",
            "2",
            "--interval",
            "100ms",
        ],
    ] {
        let mut args: Vec<&OsStr> = command.iter().map(|a| os(a)).collect();
        args.extend(backend.iter().map(|a| os(a)));
        let what = format!(
            "eim {} {} under {limit} bytes",
            command[0],
            backend.join(" ")
        );
        runs.push((what, eim_limited(limit, &args)));
    }
    runs
}

fn scan_and_watch_work_or_fail_cleanly(backend: &[&str]) {
    let mapped = Mapped::new(Shape::WORST);
    let path = mapped.path.display().to_string();
    // The usual limit: eim works; the worst file alone is refused, for
    // want of memory, and listed as such.
    for (what, out) in scan_and_watch(backend, USUAL_LIMIT) {
        let lines = no_abort(&what, &out);
        assert!(out.status.success(), "{what}: {}: {lines:#?}", out.status);
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("a JSON summary");
        let problems = summary["problems"].as_array().expect("problems");
        let worst = problems
            .iter()
            .find(|p| p["path"] == path.as_str())
            .unwrap_or_else(|| panic!("{what}: {path} not among the problems: {problems:#?}"));
        let reason = worst["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("no memory"), "{what}: {reason}");
        eprintln!("{what}: worked; {path}: {reason}");
    }
    // Ever tighter limits: once eim cannot work at all, it says so in one
    // line.
    for limit in TIGHT_LIMITS {
        let runs = scan_and_watch(backend, limit);
        let failed = runs.iter().any(|(_, out)| !out.status.success());
        for (what, out) in &runs {
            if out.status.success() {
                no_abort(what, out);
            } else {
                out_of_memory_in_one_line(what, limit, out);
            }
        }
        if failed {
            eprintln!("{limit} bytes: eim exits 1 in one line");
            return;
        }
    }
    panic!(
        "eim worked under every limit down to {} bytes",
        TIGHT_LIMITS[7]
    );
}

/// Row "scan and watch under `ulimit -v 250000`" (sim backend): they work,
/// the worst file refused alone; under a limit too tight for eim itself,
/// exit 1 and exactly one line naming what could not be allocated; never
/// SIGABRT.
#[test]
fn scan_and_watch_of_the_worst_file_under_a_limit_work_or_fail_in_one_line() {
    scan_and_watch_work_or_fail_cleanly(&["--backend", "sim"]);
}

/// The same on real kernel maps (not pinned).
#[test]
fn on_kernel_maps_too() {
    if !eim::bpf::probe::require_bpf("scan and watch under an address-space limit") {
        return;
    }
    scan_and_watch_work_or_fail_cleanly(&["--backend", "kernel", "--no-pin"]);
}

/// The worst input whose deltas fold (functions back to back: what a
/// toolchain's minimal FDEs look like), with a search table or without
/// (the linear walk, whose deltas are folded as they come, not held for
/// the final sort), is extracted and its table encoded under `ulimit -v
/// 250000`: it must work, not only fail cleanly. (With functions apart,
/// its 6.7 million deltas alone take 161 MB: that shape is refused under
/// this limit, file by file.)
#[test]
fn the_worst_eh_frame_of_adjacent_functions_extracts_under_the_usual_limit() {
    for search_table in [true, false] {
        adjacent_functions_extract_under_the_usual_limit(search_table);
    }
}

fn adjacent_functions_extract_under_the_usual_limit(search_table: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("worst.so");
    let shape = Shape {
        search_table,
        apart: false,
    };
    std::fs::write(&path, minimal_fde_elf(fdes_in(MAX_SECTION_BYTES), shape)).expect("write");
    for command in ["deltas", "tables"] {
        let out = eim_limited(USUAL_LIMIT, &[os(command), path.as_os_str()]);
        let what = format!("eim {command} of the worst file ({shape:?})");
        assert!(
            !deltas_work_or_fail_in_one_line(&what, &out),
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stdout.is_empty(), "{what}: nothing printed");
    }
}

/// Every shape of the worst input, through `eim deltas`: works, or one
/// line.
#[test]
fn every_shape_of_the_worst_file_extracts_or_fails_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    for search_table in [true, false] {
        for apart in [true, false] {
            let shape = Shape {
                search_table,
                apart,
            };
            let path: &Path = &dir.path().join("worst.so");
            std::fs::write(path, minimal_fde_elf(fdes_in(MAX_SECTION_BYTES), shape))
                .expect("write");
            let out = eim_limited(USUAL_LIMIT, &[os("deltas"), path.as_os_str()]);
            let failed = deltas_work_or_fail_in_one_line(&format!("{shape:?}"), &out);
            eprintln!(
                "{shape:?}: {}",
                if failed { "exit 1, one line" } else { "worked" }
            );
        }
    }
}
