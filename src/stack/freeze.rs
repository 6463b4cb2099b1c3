//! Stopping every thread of a process with ptrace, for as long as its
//! stacks are read: `PTRACE_SEIZE` + `PTRACE_INTERRUPT` per thread (no
//! SIGSTOP, so the process sees no signal and no job-control stop), and a
//! detach of each thread when the [`Frozen`] value is dropped.
//!
//! A thread may start while the others are being stopped, so
//! `/proc/PID/task` is listed again until a listing shows no new thread
//! (a bounded number of times: a process that keeps spawning threads
//! faster than they can be stopped is an error, not a hang).

use std::collections::BTreeSet;

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::refusal::{Facts, Refusal};

/// Listings of `/proc/PID/task` before giving up on a stable thread set.
const MAX_ROUNDS: usize = 16;
/// Threads one process may have (the kernel's default `threads-max` is far
/// higher, but a stack per thread beyond this is not a useful report).
pub const MAX_THREADS: usize = 16_384;

/// Why a process's threads could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    #[error("process {pid}: cannot list /proc/{pid}/task: {cause}")]
    ListTasks { pid: i32, cause: std::io::Error },
    #[error("process {pid} has no thread left (it exited)")]
    Gone { pid: i32 },
    #[error("thread {tid} of process {pid}: PTRACE_SEIZE failed: {errno}: {why}")]
    Seize {
        pid: i32,
        tid: i32,
        errno: Errno,
        why: Refusal,
    },
    #[error("thread {tid} of process {pid}: {what} failed: {errno}")]
    Stop {
        pid: i32,
        tid: i32,
        what: &'static str,
        errno: Errno,
    },
    #[error(
        "process {pid}: its threads kept changing over {MAX_ROUNDS} listings of /proc/{pid}/task"
    )]
    Unstable { pid: i32 },
    #[error("process {pid} has more than {MAX_THREADS} threads")]
    TooManyThreads { pid: i32 },
}

/// A thread held in a ptrace stop, and the signal it was about to receive
/// when it stopped (given back at detach).
#[derive(Debug)]
struct Held {
    tid: i32,
    pending: Option<Signal>,
}

/// The stopped threads of one process; they run again when this is dropped.
#[derive(Debug)]
pub struct Frozen {
    pid: i32,
    held: Vec<Held>,
}

impl Frozen {
    /// Stops every thread of process `pid`.
    pub fn process(pid: i32) -> Result<Self, FreezeError> {
        let mut frozen = Self {
            pid,
            held: Vec::new(),
        };
        let mut seen = BTreeSet::new();
        for _ in 0..MAX_ROUNDS {
            let tids = list_tasks(pid)?;
            let fresh: Vec<i32> = tids.difference(&seen).copied().collect();
            if fresh.is_empty() {
                if frozen.held.is_empty() {
                    return Err(FreezeError::Gone { pid });
                }
                frozen.held.sort_by_key(|h| h.tid);
                return Ok(frozen);
            }
            if seen.len() + fresh.len() > MAX_THREADS {
                return Err(FreezeError::TooManyThreads { pid });
            }
            for tid in fresh {
                seen.insert(tid);
                if let Some(held) = stop_thread(pid, tid)? {
                    frozen.held.push(held);
                }
            }
        }
        Err(FreezeError::Unstable { pid })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The stopped threads, in ascending order.
    pub fn tids(&self) -> impl Iterator<Item = i32> + '_ {
        self.held.iter().map(|h| h.tid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for held in &self.held {
            // A thread that exited meanwhile cannot be detached: nothing to do.
            let _ = ptrace::detach(Pid::from_raw(held.tid), held.pending);
        }
    }
}

fn list_tasks(pid: i32) -> Result<BTreeSet<i32>, FreezeError> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).map_err(|cause| match cause.kind() {
        std::io::ErrorKind::NotFound => FreezeError::Gone { pid },
        _ => FreezeError::ListTasks { pid, cause },
    })?;
    let mut tids = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(|cause| FreezeError::ListTasks { pid, cause })?;
        if let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.insert(tid);
            if tids.len() > MAX_THREADS {
                return Err(FreezeError::TooManyThreads { pid });
            }
        }
    }
    Ok(tids)
}

/// Seizes and interrupts thread `tid`, then waits for its stop. `None`: the
/// thread exited before it could be stopped.
fn stop_thread(pid: i32, tid: i32) -> Result<Option<Held>, FreezeError> {
    let t = Pid::from_raw(tid);
    match ptrace::seize(t, ptrace::Options::empty()) {
        Ok(()) => {}
        Err(Errno::ESRCH) => return Ok(None),
        Err(errno) => {
            return Err(FreezeError::Seize {
                pid,
                tid,
                errno,
                why: Refusal::of(&Facts::read(pid)),
            })
        }
    }
    // From here the thread is ours: a failure below must detach it.
    let detach_on_error = |errno, what| {
        let _ = ptrace::detach(t, None);
        FreezeError::Stop {
            pid,
            tid,
            what,
            errno,
        }
    };
    match ptrace::interrupt(t) {
        Ok(()) => {}
        Err(Errno::ESRCH) => return Ok(None),
        Err(errno) => return Err(detach_on_error(errno, "PTRACE_INTERRUPT")),
    }
    // The interrupt stop, or a signal-delivery stop that came first (its
    // signal is given back at detach), or the thread's end.
    match waitpid(t, Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::PtraceEvent(..)) => Ok(Some(Held { tid, pending: None })),
        Ok(WaitStatus::Stopped(_, signal)) => Ok(Some(Held {
            tid,
            pending: (signal != Signal::SIGSTOP && signal != Signal::SIGTRAP).then_some(signal),
        })),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(Errno::ECHILD) => Ok(None),
        Ok(other) => {
            let _ = ptrace::detach(t, None);
            tracing::debug!(
                tid,
                ?other,
                "unexpected wait status while stopping a thread"
            );
            Ok(None)
        }
        Err(errno) => Err(detach_on_error(errno, "waitpid")),
    }
}
