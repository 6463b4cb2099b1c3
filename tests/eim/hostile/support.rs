//! What the hostile cases share: the built binary, skips, RSS readings.

#![allow(dead_code)]

use std::path::PathBuf;

/// The `eim` binary cargo built for these tests, or `$EIM_HOSTILE_BIN`:
/// another build to run the cases against (an older one, to see them
/// reproduce the failures they guard against).
pub fn eim_bin() -> PathBuf {
    std::env::var_os("EIM_HOSTILE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_eim")))
}

/// Whether the test runs as root; otherwise says `SKIPPED` loudly, or
/// fails under `EIM_REQUIRE_BPF=1`, where a skip would hide a failure.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var("EIM_REQUIRE_BPF").as_deref() != Ok("1"),
        "EIM_REQUIRE_BPF=1 but {test} needs root"
    );
    eprintln!("SKIPPED: {test}: needs root");
    false
}

/// The resident set size of process `pid` in bytes (`VmRSS`), if readable.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
