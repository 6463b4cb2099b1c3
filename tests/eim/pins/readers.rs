//! Readers of live pins never disturb the owner (issue 28, item 4), on
//! the real kernel (root; a loud SKIPPED otherwise, a failure under
//! `EIM_REQUIRE_BPF=1`):
//!
//! * 100 `eim status` runs on a pin directory while its owner (a driver
//!   through the library, in this process) loads and unloads 1,500 files
//!   over and over, back to back: every one exits 0 with a consistent
//!   report taken as a snapshot (within one generation of the owner's
//!   writes);
//! * an owner starting while an `eim status` is blocked on a full pipe
//!   (stdout a pipe nobody reads) starts while that status is still
//!   blocked: the status let go of the pin directory before it printed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use eim::bpf::KernelMaps;
use eim::deltas::{hint, info, IntervalData, StackDelta};
use eim::provider::MemoryProvider;
use eim::{ExecutableInfoManager, FileId, Tracers};

use super::*;

/// Files the owner loads and unloads.
const FILES: u64 = 1500;
/// Statuses run meanwhile.
const STATUSES: usize = 100;
/// Files per load batch, and per run of unloads.
const BATCH: usize = 100;

/// File `n`'s synthetic table: 24 functions over four 64 KiB pages, their
/// frame sizes varying with `n` so that files share some slots and not
/// others.
fn deltas(n: u64) -> IntervalData {
    let mut d = IntervalData::new();
    for k in 0..24u64 {
        let frame = 8 * (1 + ((n + k) % 6) as i32);
        d.add(StackDelta::new(
            0x1000 + k * 0x2000,
            hint::KEEP,
            info::sp(frame),
        ));
    }
    d.add(StackDelta::new(
        0x1000 + 24 * 0x2000,
        hint::GAP,
        info::INVALID,
    ));
    d
}

fn file_id(n: u64) -> FileId {
    FileId(0x5eed_0000_0000 + n)
}

/// An owner of `dir` in a thread: loads every file in batches, then
/// unloads every one, until told to stop.
struct Owner {
    stop: Arc<AtomicBool>,
    /// Whole load-and-unload rounds done.
    rounds: Arc<AtomicUsize>,
    /// Files loaded so far, over all rounds.
    loads: Arc<AtomicUsize>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

fn manager_of(dir: &Path) -> Result<ExecutableInfoManager<MemoryProvider, KernelMaps>, String> {
    let maps = KernelMaps::with_config(KernelConfig {
        pin_dir: Some(dir.to_path_buf()),
        mount_bpffs: true,
        ..KernelConfig::default()
    })
    .map_err(|e| format!("opening the maps pinned in {}: {e}", dir.display()))?;
    let provider = MemoryProvider::new();
    for n in 0..FILES {
        provider.insert(file_id(n), deltas(n));
    }
    Ok(ExecutableInfoManager::new(provider, maps, Tracers::none()))
}

fn load_all(
    manager: &ExecutableInfoManager<MemoryProvider, KernelMaps>,
    loads: &AtomicUsize,
) -> Result<(), String> {
    let ids: Vec<FileId> = (0..FILES).map(file_id).collect();
    for chunk in ids.chunks(BATCH) {
        let files: Vec<(FileId, &FileId)> = chunk.iter().map(|id| (*id, id)).collect();
        for (id, r) in chunk.iter().zip(manager.load_many(&files)) {
            r.map_err(|e| format!("loading {id:?}: {e}"))?;
        }
        loads.fetch_add(chunk.len(), Ordering::Relaxed);
    }
    Ok(())
}

impl Owner {
    fn start(dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let loads = Arc::new(AtomicUsize::new(0));
        let (dir, s, r, l) = (
            dir.to_path_buf(),
            stop.clone(),
            rounds.clone(),
            loads.clone(),
        );
        let thread = std::thread::spawn(move || {
            let manager = manager_of(&dir)?;
            while !s.load(Ordering::Relaxed) {
                load_all(&manager, &l)?;
                for n in 0..FILES {
                    manager
                        .remove_or_dec_ref(file_id(n))
                        .map_err(|e| format!("unloading file {n}: {e}"))?;
                }
                r.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        Self {
            stop,
            rounds,
            loads,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("a thread");
        thread
            .join()
            .expect("the owner panicked")
            .expect("the owner failed");
        self.rounds.load(Ordering::Relaxed)
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn a_hundred_statuses_while_the_owner_loads_and_unloads_1500_files_all_read_consistent_maps() {
    if !kernel_ready("a_hundred_statuses_while_the_owner_loads_and_unloads") {
        return;
    }
    let mut scratch = Scratch::new();
    let dir = scratch.mount_point("busy");
    let owner = Owner::start(&dir);
    // Once it has loaded a first batch, the owner writes all along.
    assert!(
        eim_test_support::wait_for(LIMIT, || owner.loads.load(Ordering::Relaxed) >= BATCH),
        "the owner never loaded a batch"
    );
    let d = dir.to_str().expect("UTF-8");
    let mut failures = Vec::new();
    let mut files_seen = BTreeMap::new();
    for i in 0..STATUSES {
        let done = run(&["status", "--json", "--pin-dir", d]);
        if !done.status.success() {
            failures.push(format!(
                "status {i}: {}\n{}\n{}",
                done.status,
                done.stderr,
                done.stdout.chars().take(2000).collect::<String>()
            ));
            continue;
        }
        let s = done.json();
        assert_eq!(s["owned"], true, "{s}");
        assert_eq!(s["snapshot"], "consistent", "status {i}");
        assert_eq!(s["violations"], serde_json::json!([]), "status {i}");
        *files_seen
            .entry(s["files"].as_array().expect("files").len())
            .or_insert(0) += 1;
    }
    let rounds = owner.finish();
    assert!(
        failures.is_empty(),
        "{} of 100 statuses failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The statuses saw the maps at many fill levels: they ran while the
    // owner wrote, not between rounds only.
    assert!(files_seen.len() > 1, "{files_seen:?}");
    eprintln!("{STATUSES} statuses over {rounds} rounds of 1,500 loads and unloads: files seen {files_seen:?}");
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two fresh descriptors nothing else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Bytes waiting in a pipe.
fn queued(read_end: &OwnedFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes an int.
    unsafe { libc::ioctl(read_end.as_raw_fd(), libc::FIONREAD, &mut n) };
    usize::try_from(n).unwrap_or(0)
}

#[test]
fn an_owner_starts_while_a_status_is_blocked_on_a_full_pipe() {
    if !kernel_ready("an_owner_starts_while_a_status_is_blocked_on_a_full_pipe") {
        return;
    }
    let mut scratch = Scratch::new();
    let dir = scratch.mount_point("piped");
    // 1,500 files left in the pins: a status of them is far more text than
    // a pipe holds.
    {
        let manager = manager_of(&dir).expect("the first owner");
        load_all(&manager, &AtomicUsize::new(0)).expect("loading");
    }
    let (read_end, write_end) = pipe();
    // SAFETY: F_GETPIPE_SZ on our own pipe.
    let capacity = unsafe { libc::fcntl(write_end.as_raw_fd(), libc::F_GETPIPE_SZ) };
    let capacity = usize::try_from(capacity).expect("a pipe size");
    let mut status = Command::new(env!("CARGO_BIN_EXE_eim"))
        .env_remove("RUST_LOG")
        .args(["status", "--pin-dir", dir.to_str().expect("UTF-8")])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::null())
        .spawn()
        .expect("starting eim status");
    let status_pid = status.id();
    let mut running = || matches!(status.try_wait(), Ok(None));
    assert!(
        eim_test_support::wait_for(LIMIT, || queued(&read_end) >= capacity || !running()),
        "the status never filled the pipe"
    );
    assert!(running(), "the status ended: its output fit the pipe");
    // Blocked on the pipe, with its report taken: an owner starts.
    let owner = KernelMaps::with_config(KernelConfig {
        pin_dir: Some(dir.clone()),
        adopt_pins: true,
        ..KernelConfig::default()
    });
    let still_blocked = running() && queued(&read_end) >= capacity;
    let owner = owner.unwrap_or_else(|e| panic!("the owner was refused: {e}"));
    assert!(
        still_blocked,
        "the status ended before the owner started: not shown"
    );
    drop(owner);
    // SAFETY: kill(2) of our own child, not yet reaped.
    unsafe { libc::kill(status_pid as i32, libc::SIGKILL) };
    let _ = status.wait();
    drop(read_end);
}

#[test]
fn a_refused_pin_directory_leaves_no_lock_file() {
    if !kernel_ready("a_refused_pin_directory_leaves_no_lock_file") {
        return;
    }
    // Not a bpffs, not empty, and not asked to mount one: refused after
    // the lock was taken.
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("a file"), b"x").expect("write");
    let lock_file = lock::lock_file_of(dir.path()).expect("lock file name");
    let _ = std::fs::remove_file(&lock_file);
    let d = dir.path().to_str().expect("UTF-8");
    run(&["scan", "--backend", "kernel", "--pin-dir", d, "--pid", "1"]).refused();
    assert!(
        !lock_file.exists(),
        "{} left behind for a refused directory",
        lock_file.display()
    );
}
