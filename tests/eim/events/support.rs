//! What the event tests share: the built binary, pin directories that are
//! cleaned up, a watch run in the background, unique files.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub use eim_test_support::skip::tools_present;

/// One event test at a time: each runs watches over the whole host, and
/// on two cores they would slow each other past what a 5 ms process
/// allows.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn kernel_ready(test: &str) -> bool {
    eim::bpf::probe::require_bpf(test)
}

pub fn eim_bin() -> &'static str {
    env!("CARGO_BIN_EXE_eim")
}

pub use eim_test_support::wait_for;

/// A copy of `from` at `dir/name`, made unique by bytes appended after its
/// end (which no loader reads): its file id is its own.
pub fn unique_copy(from: &str, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {from}: {e}"));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&to)
        .expect("open the copy");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    writeln!(f, "eim-test {name} {} {nanos}", std::process::id()).expect("append");
    to
}

/// The 64-bit id the maps key `path` by, from `eim fileid`.
pub fn host_id_of(path: &Path) -> String {
    let out = Command::new(eim_bin())
        .arg("fileid")
        .arg(path)
        .output()
        .expect("eim fileid");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .expect("a host id")
        .to_string()
}

/// A pin directory on a bpffs eim mounts, unmounted and its lock file
/// removed at the end.
pub struct Pins {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Pins {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join(name);
        Self { _dir: dir, path }
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().expect("UTF-8")
    }

    /// The host ids `eim status` lists (empty before the pins exist).
    pub fn file_ids(&self) -> BTreeSet<String> {
        let out = Command::new(eim_bin())
            .args(["status", "--json", "--pin-dir", self.arg()])
            .output()
            .expect("eim status");
        let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else {
            return BTreeSet::new();
        };
        v["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["host_file_id"].as_str().map(String::from))
            .collect()
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.arg()).expect("no NUL");
        for _ in 0..8 {
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                break;
            }
        }
        if let Ok(lock) = eim::bpf::lock::lock_file_of(&self.path) {
            let _ = std::fs::remove_file(lock);
        }
    }
}

/// `eim watch --backend kernel` on `pins` in the background, with `extra`.
pub struct Watch {
    child: Option<Child>,
}

impl Watch {
    /// Started, and past its first step (its pins readable).
    pub fn start(pins: &Pins, extra: &[&str]) -> Self {
        let child = Command::new(eim_bin())
            .env_remove("RUST_LOG")
            .args([
                "watch",
                "--json",
                "--backend",
                "kernel",
                "--mount-bpffs",
                "--pin-dir",
                pins.arg(),
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start eim watch");
        let mut watch = Self { child: Some(child) };
        let ready = wait_for(Duration::from_secs(60), || {
            watch.running() && !pins.file_ids().is_empty()
        });
        assert!(
            ready,
            "the watch never pinned its maps: {}",
            watch.stderr_now()
        );
        watch
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn stderr_now(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return String::new();
        };
        let _ = child.kill();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = child.wait();
        err
    }

    /// SIGTERM, then its final JSON summary.
    pub fn stop(mut self) -> Value {
        let child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().expect("wait for eim watch");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "no JSON summary ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The event loop the in-process tests drive: over `host` and `source`,
/// its first step done, with no periodic resync (only a loss resyncs).
pub fn started_loop<'a>(
    host: &'a mut eim::host::scan::Host<eim::sim::SimMaps>,
    source: &'a mut eim::bpf::events::HostEvents,
    stop: &std::sync::atomic::AtomicBool,
) -> eim::daemon::EventLoop<'a, eim::sim::SimMaps> {
    let mut lp = eim::daemon::EventLoop::new(
        host,
        source,
        eim::daemon::EventsConfig {
            resync_every: Duration::from_secs(3600),
            ..eim::daemon::EventsConfig::default()
        },
        None,
    );
    lp.start(stop, &mut eim::host::scan::Quiet)
        .expect("first step");
    lp
}
