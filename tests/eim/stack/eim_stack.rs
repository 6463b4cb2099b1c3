//! `eim stack --pid PID --backend B --json`, run as a user would, and its
//! JSON.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use crate::gdb::run_with_timeout;

const EIM_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sim,
    Kernel,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sim => "sim",
            Self::Kernel => "kernel",
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct EimStacks {
    pub pid: u32,
    pub backend: String,
    pub threads: Vec<EimThread>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EimThread {
    pub tid: u32,
    pub comm: String,
    pub stop: String,
    pub stop_detail: Option<String>,
    pub frames: Vec<EimFrame>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EimFrame {
    pub pc: u64,
    pub file: Option<String>,
    // Read only to hold the output to its documented shape.
    #[allow(dead_code)]
    pub file_id: Option<String>,
    pub address: Option<u64>,
    pub symbol: Option<String>,
    // Read only to hold the output to its documented shape.
    #[allow(dead_code)]
    pub system_name: Option<String>,
    pub symbol_offset: Option<u64>,
    #[allow(dead_code)]
    pub source_file: Option<String>,
    #[allow(dead_code)]
    pub source_line: Option<u32>,
    /// Innermost first.
    pub inlined: Vec<EimInlined>,
}

/// A function inlined at a frame's PC (all its fields held to the
/// documented shape; the names are compared).
#[allow(dead_code)]
#[derive(Clone, Debug, Deserialize)]
pub struct EimInlined {
    pub name: String,
    pub system_name: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// The `eim` binary cargo built for these tests, or `$EIM_STACK_BIN`: a
/// build from a branch where `eim stack` is, checked with this one's gdb
/// truth.
fn eim_bin() -> PathBuf {
    std::env::var_os("EIM_STACK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_eim")))
}

/// Every thread's stack of `pid` as `eim stack` unwinds it with `backend`.
pub fn stacks(pid: u32, backend: Backend) -> EimStacks {
    let mut eim = Command::new(eim_bin());
    eim.args(["stack", "--pid", &pid.to_string()])
        .args(["--backend", backend.name(), "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what = format!("eim stack --pid {pid} --backend {}", backend.name());
    let (status, stdout, stderr) = run_with_timeout(eim, EIM_TIMEOUT, &what);
    assert!(status.success(), "{what}: {status}\n{stderr}");
    let stacks: EimStacks = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{what}: not the stack JSON: {e}\n{stdout}"));
    assert_eq!(stacks.pid, pid, "{what}: the pid of its output");
    assert_eq!(stacks.backend, backend.name(), "{what}: the backend named");
    stacks
}
