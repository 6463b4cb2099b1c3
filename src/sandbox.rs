//! Less power once started: what a long-running eim gives up after its
//! maps are open, its metrics socket is bound and its kernel programs are
//! attached.
//!
//! Three layers, each of which the kernel enforces on its own:
//!
//! * **No new privileges** (`PR_SET_NO_NEW_PRIVS`): nothing eim could be
//!   made to run gains privileges through a set-id file or file
//!   capabilities.
//! * **Capabilities cut to the steady state**: the bounding, permitted,
//!   effective and inheritable sets keep only what a step still needs
//!   ([`steady_capabilities`]); the ambient set is cleared. Capabilities are
//!   a property of each *thread*: the threads eim starts before it confines
//!   itself (the signal listener, the metrics server) drop all of theirs
//!   when they start ([`drop_all_in_this_thread`]), and threads started
//!   later inherit the cut set.
//! * **A seccomp filter** on every thread (`SECCOMP_FILTER_FLAG_TSYNC`)
//!   that refuses with `EPERM` what a step never does: running a program,
//!   opening a file for writing or creating one, changing the file system
//!   (links, renames, modes, owners, nodes, mounts), changing ids or
//!   namespaces, tracing, writing another process's memory, kernel modules,
//!   keys, and `open_by_handle_at` (which `CAP_DAC_READ_SEARCH` would
//!   otherwise turn into a way around every path check). `openat2`, whose
//!   flags a filter cannot read, answers `ENOSYS`, so that the opener
//!   falls back to `openat`, whose flags it can.
//!
//! Landlock would have been the natural way to make the file system read
//! only, but a Landlock domain may not ptrace-access (and so may not read
//! `/proc/PID/maps`, `/proc/PID/root` or `map_files` of) any process
//! outside it, which is every process eim serves: measured on this
//! project's machines, `/proc/1/maps` answers `EACCES` to a root process
//! with every capability once it is in a domain (`docs/THREAT_MODEL.md`).

use std::collections::BTreeMap;
use std::io;

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Why eim could not confine itself.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("setting no_new_privs: {0}")]
    NoNewPrivs(io::Error),
    #[error("dropping capability {cap} from the {set} set: {cause}")]
    Capability {
        cap: Capability,
        set: &'static str,
        cause: caps::errors::CapsError,
    },
    #[error("building the seccomp filter: {0}")]
    Filter(String),
    #[error("installing the seccomp filter on every thread: {0}")]
    Install(String),
}

/// What [`confine`] did, for the log and the tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    /// The capabilities still effective.
    pub kept: Vec<Capability>,
    /// How many capabilities left the bounding set.
    pub dropped_from_bounding: usize,
    /// The system calls the filter refuses (by name).
    pub refused_syscalls: usize,
}

/// What a step of `watch` still needs once started.
///
/// CAP_SYS_ADMIN stays: `/proc/PID/map_files` needs it (or, from Linux
/// 5.9, CAP_CHECKPOINT_RESTORE), and so does opening the kernel backend's
/// inner arrays by id (`BPF_MAP_GET_FD_BY_ID`), which the summary's table
/// dump does. The filter below takes from it what a step never uses
/// (mounts, namespaces, modules, handles).
pub fn steady_capabilities(kernel_maps: bool) -> Vec<Capability> {
    let mut keep = vec![
        // /proc/PID/maps, map_files and root of other users' processes.
        Capability::CAP_SYS_PTRACE,
        // Executables their owners left unreadable to others.
        Capability::CAP_DAC_READ_SEARCH,
        Capability::CAP_SYS_ADMIN,
    ];
    if kernel_maps {
        // A new inner array for each file loaded.
        keep.push(Capability::CAP_BPF);
    }
    keep
}

/// Drops every capability of the calling thread (its bounding set too,
/// when it may), for threads that never need one: the signal listener and
/// the metrics server. Failures are logged, not fatal: a thread that keeps
/// a capability is no worse off than before.
pub fn drop_all_in_this_thread() {
    if let Err(e) = cut_capabilities(&[]) {
        tracing::debug!("thread keeps its capabilities: {e}");
    }
}

/// Confines the whole process (see the module documentation), keeping
/// `keep` where the process has them.
pub fn confine(keep: &[Capability]) -> Result<Confinement, SandboxError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(SandboxError::NoNewPrivs(io::Error::last_os_error()));
    }
    let dropped_from_bounding = cut_capabilities(keep)?;
    let kept = caps::read(None, CapSet::Effective)
        .map(|set| {
            let mut v: Vec<_> = set.into_iter().collect();
            v.sort_by_key(|c| c.index());
            v
        })
        .unwrap_or_default();
    let refused = refused_syscalls();
    let programs = filters(&refused)?;
    for program in &programs {
        seccompiler::apply_filter_all_threads(program)
            .map_err(|e| SandboxError::Install(e.to_string()))?;
    }
    Ok(Confinement {
        kept,
        dropped_from_bounding,
        refused_syscalls: refused.len() + 1,
    })
}

/// Cuts the calling thread's capability sets to `keep`; returns how many
/// left the bounding set.
fn cut_capabilities(keep: &[Capability]) -> Result<usize, SandboxError> {
    let fail = |cap, set, cause| SandboxError::Capability { cap, set, cause };
    // The bounding set first: dropping from it needs CAP_SETPCAP, which
    // the permitted set is about to lose. Without CAP_SETPCAP (an
    // unprivileged run) the bounding set stays, and the permitted set,
    // which is what counts, is empty anyway.
    let mut dropped = 0;
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        let bounding = caps::read(None, CapSet::Bounding).unwrap_or_default();
        for cap in bounding.into_iter().filter(|c| !keep.contains(c)) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| fail(cap, "bounding", e))?;
            dropped += 1;
        }
    }
    let permitted = caps::read(None, CapSet::Permitted).unwrap_or_default();
    let kept: CapsHashSet = keep
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();
    caps::clear(None, CapSet::Ambient).map_err(|e| fail(Capability::CAP_SETPCAP, "ambient", e))?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())
        .map_err(|e| fail(Capability::CAP_SETPCAP, "inheritable", e))?;
    // Effective before permitted: the effective set must stay a subset.
    caps::set(None, CapSet::Effective, &kept)
        .map_err(|e| fail(Capability::CAP_SETPCAP, "effective", e))?;
    caps::set(None, CapSet::Permitted, &kept)
        .map_err(|e| fail(Capability::CAP_SETPCAP, "permitted", e))?;
    Ok(dropped)
}

/// The system calls refused outright, by name and number.
fn refused_syscalls() -> Vec<(&'static str, i64)> {
    macro_rules! calls {
        ($($name:ident),* $(,)?) => {
            vec![$((stringify!($name), libc::$name)),*]
        };
    }
    let mut refused = calls![
        // Running a program.
        SYS_execve,
        SYS_execveat,
        // Changing the file system.
        SYS_unlinkat,
        SYS_renameat2,
        SYS_mkdirat,
        SYS_linkat,
        SYS_symlinkat,
        SYS_mknodat,
        SYS_fchmod,
        SYS_fchmodat,
        SYS_fchown,
        SYS_fchownat,
        SYS_truncate,
        SYS_mount,
        SYS_umount2,
        SYS_pivot_root,
        SYS_chroot,
        SYS_swapon,
        SYS_swapoff,
        // Around every path check.
        SYS_open_by_handle_at,
        SYS_name_to_handle_at,
        // Ids, namespaces, tracing, other processes' memory.
        SYS_setuid,
        SYS_setgid,
        SYS_setreuid,
        SYS_setregid,
        SYS_setresuid,
        SYS_setresgid,
        SYS_setfsuid,
        SYS_setfsgid,
        SYS_setgroups,
        SYS_unshare,
        SYS_setns,
        SYS_ptrace,
        SYS_process_vm_writev,
        // The kernel itself.
        SYS_init_module,
        SYS_finit_module,
        SYS_delete_module,
        SYS_kexec_load,
        SYS_kexec_file_load,
        SYS_reboot,
        SYS_keyctl,
        SYS_add_key,
        SYS_request_key,
        SYS_acct,
        SYS_userfaultfd,
    ];
    #[cfg(target_arch = "x86_64")]
    refused.extend(calls![
        SYS_unlink,
        SYS_rename,
        SYS_renameat,
        SYS_rmdir,
        SYS_mkdir,
        SYS_link,
        SYS_symlink,
        SYS_mknod,
        SYS_chmod,
        SYS_chown,
        SYS_lchown,
        SYS_creat,
    ]);
    refused
}

/// Open flags that write or create.
const WRITING_FLAGS: [i32; 4] = [libc::O_WRONLY, libc::O_RDWR, libc::O_CREAT, libc::O_TRUNC];

fn arch() -> Result<TargetArch, SandboxError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SandboxError::Filter(e.to_string()))
}

/// One rule per writing flag: the argument `arg` of an open call with that
/// flag set.
fn writing_open(arg: u8) -> Result<Vec<SeccompRule>, SandboxError> {
    WRITING_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            let condition = SeccompCondition::new(
                arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(|e| SandboxError::Filter(e.to_string()))?;
            SeccompRule::new(vec![condition]).map_err(|e| SandboxError::Filter(e.to_string()))
        })
        .collect()
}

/// The two filters: `EPERM` for the refused calls and for opens that
/// write, `ENOSYS` for `openat2`.
fn filters(refused: &[(&str, i64)]) -> Result<Vec<BpfProgram>, SandboxError> {
    let arch = arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        refused.iter().map(|&(_, nr)| (nr, Vec::new())).collect();
    rules.insert(libc::SYS_openat, writing_open(2)?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_open, writing_open(1)?);
    let compile = |rules, errno: i32| -> Result<BpfProgram, SandboxError> {
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )
        .map_err(|e| SandboxError::Filter(e.to_string()))?;
        filter
            .try_into()
            .map_err(|e: seccompiler::BackendError| SandboxError::Filter(e.to_string()))
    };
    let openat2: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_openat2, Vec::new())].into();
    Ok(vec![
        compile(rules, libc::EPERM)?,
        compile(openat2, libc::ENOSYS)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;

    /// Runs `body` confined in a child process (the filter and the
    /// capability cuts are the child's alone) and returns its exit code.
    /// The child is this test binary running only `test`; a fork of the
    /// multi-threaded harness could deadlock on a lock another thread held.
    fn in_child(test: &str, dir: &Path, body: impl FnOnce(&Path) -> i32) -> i32 {
        if let Some(dir) = std::env::var_os(CHILD) {
            std::process::exit(body(Path::new(&dir)));
        }
        let exe = std::env::current_exe().expect("test binary");
        let status = std::process::Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, dir)
            .status()
            .expect("run the child");
        status
            .code()
            .unwrap_or_else(|| panic!("child died: {status}"))
    }

    const CHILD: &str = "EIM_SANDBOX_TEST_CHILD";

    fn errno_of(r: io::Result<impl Sized>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    #[test]
    fn a_confined_process_reads_but_never_writes_nor_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let existing = dir.path().join("existing");
        let fresh = dir.path().join("fresh");
        if std::env::var_os(CHILD).is_none() {
            std::fs::write(&existing, b"before").expect("write");
        }
        let test = "sandbox::tests::a_confined_process_reads_but_never_writes_nor_runs";
        let code = in_child(test, dir.path(), |dir| {
            let existing = dir.join("existing");
            let fresh = dir.join("fresh");
            let Ok(done) = confine(&steady_capabilities(false)) else {
                return 2;
            };
            if done.refused_syscalls < 40 {
                return 3;
            }
            // Reading goes on: a file, /proc of another process.
            if std::fs::read(&existing).ok().as_deref() != Some(&b"before"[..]) {
                return 4;
            }
            if std::fs::read("/proc/1/stat").is_err() && std::fs::read("/proc/self/maps").is_err() {
                return 5;
            }
            // Writing, creating, removing, running: refused.
            if errno_of(std::fs::OpenOptions::new().append(true).open(&existing))
                != Some(libc::EPERM)
            {
                return 6;
            }
            if errno_of(std::fs::write(&fresh, b"x")) != Some(libc::EPERM) {
                return 7;
            }
            if errno_of(std::fs::remove_file(&existing)) != Some(libc::EPERM) {
                return 8;
            }
            if errno_of(std::process::Command::new("/bin/true").status()) != Some(libc::EPERM) {
                return 9;
            }
            // openat2 says ENOSYS, so callers fall back to openat.
            // SAFETY: a null `how` is never read: the filter answers first.
            let r =
                unsafe { libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, c"/".as_ptr(), 0, 0) };
            if r != -1 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
                return 10;
            }
            // A read-only open with other flags still works.
            if std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&existing)
                .is_err()
            {
                return 11;
            }
            0
        });
        assert_eq!(code, 0, "step {code} of the confined child failed");
        assert_eq!(std::fs::read(&existing).expect("intact"), b"before");
        assert!(!fresh.exists());
    }

    #[test]
    fn capabilities_are_cut_to_the_steady_set() {
        if !caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
            eim_test_support::skip::skip_unless_required(
                "EIM_REQUIRE_BPF",
                "cutting capabilities needs CAP_SETPCAP (run as root)",
            );
            return;
        }
        let test = "sandbox::tests::capabilities_are_cut_to_the_steady_set";
        let code = in_child(test, Path::new("/"), |_| {
            let keep = steady_capabilities(true);
            let Ok(done) = confine(&keep) else {
                return 2;
            };
            let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
            let permitted = caps::read(None, CapSet::Permitted).unwrap_or_default();
            let bounding = caps::read(None, CapSet::Bounding).unwrap_or_default();
            let all_kept = |set: &CapsHashSet| set.iter().all(|c| keep.contains(c));
            if !all_kept(&effective) || !all_kept(&permitted) || !all_kept(&bounding) {
                return 3;
            }
            if !effective.contains(&Capability::CAP_BPF) || done.dropped_from_bounding < 20 {
                return 4;
            }
            if effective.contains(&Capability::CAP_SETUID)
                || effective.contains(&Capability::CAP_DAC_OVERRIDE)
            {
                return 5;
            }
            0
        });
        assert_eq!(code, 0, "step {code} of the confined child failed");
    }
}
