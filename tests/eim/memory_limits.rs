//! Memory that fails cleanly (issue 28, item 3): under an address-space
//! limit (`ulimit -v`, set with `setrlimit(RLIMIT_AS)` in the child), the
//! built `eim` either works or exits 1 with one line saying what it could
//! not allocate: never an abort (SIGABRT, "memory allocation of N bytes
//! failed" and a backtrace, as before). Under the usual limit (`ulimit -v
//! 250000`) every shape of the worst input is extracted, encoded and
//! loaded: it works.
//!
//! The input is the worst one eim's caps allow a CFI walk
//! (`eim_test_support::worst_eh_frame`: 64 MiB of minimal FDEs), mapped
//! executable by this test process, so that `eim scan --pid` and
//! `eim watch --pid` of this process load it. The kernel backend's cases
//! need root and BPF (a loud SKIPPED otherwise, a failure under
//! `EIM_REQUIRE_BPF=1`).

use std::ffi::OsStr;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
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

/// The deltas of the worst input of `shape`: two per FDE (the function's
/// rule and its end marker) when the functions are apart; back to back,
/// they fold into the first rule and the last end marker.
fn worst_deltas(shape: Shape) -> u64 {
    if shape.apart {
        2 * fdes_in(MAX_SECTION_BYTES) as u64
    } else {
        2
    }
}

fn scan_and_watch_work_or_fail_cleanly(backend: &[&str]) {
    let mapped = Mapped::new(Shape::WORST);
    let path = mapped.path.display().to_string();
    let want = worst_deltas(Shape::WORST);
    // The usual limit: eim works, and loads the worst file whole (before
    // its deltas were packed, it was refused for want of memory).
    for (what, out) in scan_and_watch(backend, USUAL_LIMIT) {
        let lines = no_abort(&what, &out);
        assert!(out.status.success(), "{what}: {}: {lines:#?}", out.status);
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("a JSON summary");
        let problems = summary["problems"].as_array().expect("problems");
        assert!(
            !problems.iter().any(|p| p["path"] == path.as_str()),
            "{what}: {path} refused: {problems:#?}"
        );
        let loaded = summary["loaded_files"].as_array().expect("loaded files");
        let worst = loaded
            .iter()
            .find(|f| {
                f["paths"]
                    .as_array()
                    .is_some_and(|paths| paths.iter().any(|p| p == path.as_str()))
            })
            .unwrap_or_else(|| panic!("{what}: {path} not loaded"));
        assert_eq!(worst["deltas"].as_u64(), Some(want), "{what}: {worst:#}");
        assert_eq!(
            worst["table"]["kernel_deltas"].as_u64(),
            Some(want),
            "{what}: {worst:#}"
        );
        eprintln!("{what}: worked; {path}: {want} deltas loaded");
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
/// the worst file loaded whole; under a limit too tight for eim itself,
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

/// Every shape of the worst input (a search table or not, functions
/// apart or back to back) is extracted and its table encoded under `ulimit
/// -v 250000`: it must work, not only fail cleanly. With functions apart
/// its 6.7 million deltas stay; before they were packed (8 bytes a delta,
/// not 24) that shape was refused under this limit ("no memory for more
/// than 4194300 stack deltas").
#[test]
fn every_shape_of_the_worst_eh_frame_extracts_and_encodes_under_the_usual_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("worst.so");
    for search_table in [true, false] {
        for apart in [true, false] {
            let shape = Shape {
                search_table,
                apart,
            };
            std::fs::write(&path, minimal_fde_elf(fdes_in(MAX_SECTION_BYTES), shape))
                .expect("write");
            let want = worst_deltas(shape);
            for (command, count) in [("deltas", "# deltas: "), ("tables", "# deltas_in: ")] {
                let out = eim_limited(USUAL_LIMIT, &[os(command), path.as_os_str()]);
                let what = format!("eim {command} of the worst file ({shape:?})");
                assert!(
                    !deltas_work_or_fail_in_one_line(&what, &out),
                    "{what} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let printed = String::from_utf8_lossy(&out.stdout);
                assert!(
                    printed.lines().any(|l| l == format!("{count}{want}")),
                    "{what}: no line {count}{want} in {}",
                    printed.lines().take(4).collect::<Vec<_>>().join("\n")
                );
            }
            eprintln!("{shape:?}: {want} deltas extracted and encoded");
        }
    }
}
