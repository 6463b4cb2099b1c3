//! The processes of the host and their executable file mappings, read from
//! `/proc` with the `procfs` crate.
//!
//! A process can exit at any point between two reads; that is reported as
//! [`ProcessError::Vanished`], which callers count and skip, never as a
//! failure of the scan.

use std::path::PathBuf;

use procfs::process::{MMPermissions, MMapPath, Process};
use procfs::ProcError;

/// At most this many processes are looked at in one walk (Linux's largest
/// `pid_max`): the walk's work is bounded whatever `/proc` says.
pub const MAX_PROCESSES: usize = 1 << 22;

/// At most this many executable mappings are taken from one process (the
/// kernel's default `vm.max_map_count`, which bounds all mappings).
pub const MAX_EXEC_MAPPINGS: usize = 65_530;

/// Why a process could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process {pid} exited while it was being read")]
    Vanished { pid: i32 },
    /// The kernel lets a process read another's `maps` only with
    /// CAP_SYS_PTRACE, or as the same user (real, effective and saved ids)
    /// when the other is dumpable (ptrace's PTRACE_MODE_READ_FSCREDS
    /// check; Yama does not restrict reads).
    #[error("process {pid}: permission denied reading /proc/{pid}/{what}: it needs CAP_SYS_PTRACE (as root has), or running as the process's user{} while the process is dumpable", owner_text(*owner))]
    PermissionDenied {
        pid: i32,
        what: &'static str,
        /// The process's effective user id, if its status was readable.
        owner: Option<u32>,
    },
    #[error("process {pid}: cannot read {what}: {message}")]
    Io {
        pid: i32,
        what: &'static str,
        message: String,
    },
}

impl ProcessError {
    fn from_proc(pid: i32, what: &'static str, e: ProcError) -> Self {
        match e {
            ProcError::NotFound(_) => Self::Vanished { pid },
            ProcError::PermissionDenied(_) => Self::PermissionDenied {
                pid,
                what,
                owner: owner_of(pid),
            },
            // A process that exits while its file is read gives ESRCH or an
            // empty read; it is gone either way.
            ProcError::Io(ref io, _) if io.raw_os_error() == Some(libc::ESRCH) => {
                Self::Vanished { pid }
            }
            ProcError::Incomplete(_) => Self::Vanished { pid },
            other => Self::Io {
                pid,
                what,
                message: other.to_string(),
            },
        }
    }
}

/// The effective user id of process `pid` (`/proc/PID/status` is readable
/// by everyone).
fn owner_of(pid: i32) -> Option<u32> {
    Some(Process::new(pid).ok()?.status().ok()?.euid)
}

fn owner_text(owner: Option<u32>) -> String {
    owner.map(|uid| format!(" (uid {uid})")).unwrap_or_default()
}

/// Why `/proc` itself could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("cannot list the processes in /proc: {0}")]
pub struct ListError(String);

/// The ids of the processes running now (thread groups, not threads), in
/// ascending order.
pub fn list() -> Result<Vec<i32>, ListError> {
    let entries = std::fs::read_dir("/proc").map_err(|e| ListError(e.to_string()))?;
    let mut pids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .take(MAX_PROCESSES)
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// When the process started (clock ticks after boot): with the pid, it
/// names a process uniquely, so a reused pid is seen as a new process.
pub fn start_time(pid: i32) -> Result<u64, ProcessError> {
    let process = Process::new(pid).map_err(|e| ProcessError::from_proc(pid, "stat", e))?;
    let stat = process
        .stat()
        .map_err(|e| ProcessError::from_proc(pid, "stat", e))?;
    Ok(stat.starttime)
}

/// `PF_EXITING` in `/proc/PID/stat`'s flags: the task is in `do_exit`.
const PF_EXITING: u32 = 0x4;

/// Whether `pid` is exiting (or dead) with no other thread left, so that
/// the process is gone whatever its mappings still show. A leader that
/// exits before its other threads is not: the process lives on. A process
/// that cannot be read counts as gone.
pub fn exiting_alone(pid: i32) -> bool {
    let Ok(stat) = Process::new(pid).and_then(|p| p.stat()) else {
        return true;
    };
    let dying = stat.flags & PF_EXITING != 0 || matches!(stat.state, 'Z' | 'X' | 'x');
    dying && stat.num_threads <= 1
}

/// The name `/proc/PID/maps` gives the vDSO, and the path eim names it by.
pub const VDSO_PATH: &str = "[vdso]";

/// One executable mapping of a file, as `/proc/PID/maps` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// Offset of `start` in the file.
    pub offset: u64,
    /// The device (major, minor) and inode of the mapped file, as the
    /// kernel recorded them when the file was mapped.
    pub dev: (u32, u32),
    pub inode: u64,
    /// The path as the process sees it (inside its root). A file deleted
    /// since it was mapped ends in ` (deleted)`.
    pub path: PathBuf,
}

impl ExecMapping {
    /// `START-END`, the mapping's name under `/proc/PID/map_files/`.
    pub fn map_files_name(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }

    /// The `[vdso]` mapping `[start, end)`: no file on disk (device and
    /// inode 0), its image read from the process ([`crate::host::vdso`]).
    pub fn vdso(start: u64, end: u64) -> Self {
        Self {
            start,
            end,
            offset: 0,
            dev: (0, 0),
            inode: 0,
            path: PathBuf::from(VDSO_PATH),
        }
    }

    /// Whether this is the `[vdso]` mapping.
    pub fn is_vdso(&self) -> bool {
        self.inode == 0 && self.path.as_os_str() == VDSO_PATH
    }

    /// Whether `address` lies inside the mapping.
    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }
}

/// What one process maps: its executable file mappings, its vDSO, and how
/// many other executable mappings had no file (JIT code).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessMappings {
    pub files: Vec<ExecMapping>,
    /// The `[vdso]` mapping ([`ExecMapping::vdso`]), loaded like a file.
    pub vdso: Option<ExecMapping>,
    pub anonymous: usize,
}

impl ProcessMappings {
    /// The mappings the host loads: the files, then the vDSO.
    pub fn loadable(&self) -> impl Iterator<Item = &ExecMapping> {
        self.files.iter().chain(&self.vdso)
    }

    /// [`Self::loadable`], owned: what a frame's address is looked up in.
    pub fn into_loadable(self) -> Vec<ExecMapping> {
        self.files.into_iter().chain(self.vdso).collect()
    }
}

/// The executable mappings of process `pid`.
pub fn exec_mappings(pid: i32) -> Result<ProcessMappings, ProcessError> {
    let process = Process::new(pid).map_err(|e| ProcessError::from_proc(pid, "maps", e))?;
    let maps = process
        .maps()
        .map_err(|e| ProcessError::from_proc(pid, "maps", e))?;
    let mut out = ProcessMappings::default();
    for map in maps
        .into_iter()
        .filter(|m| m.perms.contains(MMPermissions::EXECUTE))
        .take(MAX_EXEC_MAPPINGS)
    {
        match map.pathname {
            MMapPath::Path(path) if map.inode != 0 => out.files.push(ExecMapping {
                start: map.address.0,
                end: map.address.1,
                offset: map.offset,
                dev: (map.dev.0 as u32, map.dev.1 as u32),
                inode: map.inode,
                path,
            }),
            // The first: a process has one vDSO.
            MMapPath::Vdso if out.vdso.is_none() => {
                out.vdso = Some(ExecMapping::vdso(map.address.0, map.address.1));
            }
            _ => out.anonymous += 1,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_process_exiting_alone_is_gone() {
        assert!(!exiting_alone(std::process::id() as i32));
        // A child that exited and is not reaped yet: a zombie, gone.
        let mut child = std::process::Command::new("/bin/true")
            .spawn()
            .expect("spawn /bin/true");
        let pid = child.id() as i32;
        let started = std::time::Instant::now();
        while !exiting_alone(pid) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "/bin/true never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().expect("reap");
        // Reaped: no such process, gone too.
        assert!(exiting_alone(pid));
    }

    #[test]
    fn this_process_maps_its_own_executable() {
        let me = std::process::id() as i32;
        let mappings = exec_mappings(me).expect("own maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        assert!(
            mappings.files.iter().any(|m| m.path == exe),
            "{exe:?} not among {:?}",
            mappings.files
        );
        assert!(list().expect("list").contains(&me));
        assert!(start_time(me).expect("start time") > 0);
    }

    #[test]
    fn a_process_that_does_not_exist_has_vanished() {
        // pid_max is at most 2^22, so this pid cannot exist.
        let pid = (1 << 22) + 1;
        assert!(matches!(
            exec_mappings(pid),
            Err(ProcessError::Vanished { pid: p }) if p == pid
        ));
        assert!(matches!(
            start_time(pid),
            Err(ProcessError::Vanished { .. })
        ));
    }
}
