//! Why the kernel refused to let eim stop a process's threads: the real
//! reason, read from what `/proc` says of the process and of eim, so that
//! root is never told it needs CAP_SYS_PTRACE, which it has.
//!
//! [`Refusal::of`] is a pure function of those facts (tested on
//! stand-ins); [`Facts::read`] gathers them, and a fact that cannot be read
//! is simply unknown.

use std::fmt;

/// `PF_KTHREAD`, field 9 of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;
/// Names of the capability bits, in bit order.
const CAP_NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];
const CAP_SYS_PTRACE: u64 = 1 << 19;

/// What `/proc` says of the process to stop and of eim itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The `State:` letter of the process (`Z` for a zombie).
    pub state: Option<char>,
    /// The flags of `/proc/PID/stat`.
    pub flags: Option<u64>,
    /// `TracerPid:` (0: not traced).
    pub tracer: Option<i32>,
    /// The process's permitted capabilities.
    pub target_permitted: Option<u64>,
    /// The process's real uid.
    pub target_uid: Option<u32>,
    /// eim's effective capabilities and effective uid.
    pub our_effective: Option<u64>,
    pub our_uid: Option<u32>,
    /// `kernel.yama.ptrace_scope`, where Yama is built in.
    pub yama_scope: Option<u8>,
}

/// The reason, in a user's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Zombie,
    KernelThread,
    Traced {
        by: i32,
    },
    YamaNoAttach,
    YamaAdminOnly,
    /// The process holds capabilities eim lacks, in a user namespace
    /// where eim's CAP_SYS_PTRACE does not count (a container's parent
    /// namespace, typically pid 1 of a sandbox).
    MoreCapable {
        missing: Vec<&'static str>,
    },
    NoPtraceCapability,
    /// Nothing above explains it: the kernel's general rule.
    Unexplained,
}

impl Refusal {
    /// The first fact that explains a refused `PTRACE_SEIZE`.
    pub fn of(facts: &Facts) -> Self {
        if facts.state == Some('Z') || facts.state == Some('X') {
            return Self::Zombie;
        }
        if facts.flags.is_some_and(|f| f & PF_KTHREAD != 0) {
            return Self::KernelThread;
        }
        if let Some(by) = facts.tracer.filter(|&t| t != 0) {
            return Self::Traced { by };
        }
        if facts.yama_scope == Some(3) {
            return Self::YamaNoAttach;
        }
        let ours = facts.our_effective.unwrap_or(0);
        let has_ptrace = ours & CAP_SYS_PTRACE != 0;
        if facts.yama_scope == Some(2) && !has_ptrace {
            return Self::YamaAdminOnly;
        }
        if let Some(theirs) = facts.target_permitted {
            let missing = theirs & !ours;
            if missing != 0 && has_ptrace {
                return Self::MoreCapable {
                    missing: (0..64)
                        .filter(|bit| missing & (1 << bit) != 0)
                        .map(|bit| CAP_NAMES.get(bit).copied().unwrap_or("a capability"))
                        .collect(),
                };
            }
        }
        if !has_ptrace && facts.our_uid.is_some() && facts.our_uid != facts.target_uid {
            return Self::NoPtraceCapability;
        }
        Self::Unexplained
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zombie => f.write_str("it is a zombie: it has exited, and has no stack left"),
            Self::KernelThread => f.write_str("it is a kernel thread: it has no user stack"),
            Self::Traced { by } => write!(
                f,
                "it is already traced by pid {by} (a debugger or tracer), and a thread has one tracer at a time"
            ),
            Self::YamaNoAttach => {
                f.write_str("kernel.yama.ptrace_scope is 3: no process may attach to another")
            }
            Self::YamaAdminOnly => f.write_str(
                "kernel.yama.ptrace_scope is 2: only a process with CAP_SYS_PTRACE may attach",
            ),
            Self::MoreCapable { missing } => write!(
                f,
                "it holds capabilities eim lacks ({}), and lives in a user namespace where eim's CAP_SYS_PTRACE does not count (a container's host or sandbox manager)",
                missing.join(", ")
            ),
            Self::NoPtraceCapability => f.write_str(
                "it belongs to another user: attaching needs CAP_SYS_PTRACE",
            ),
            Self::Unexplained => f.write_str(
                "it needs CAP_SYS_PTRACE, or the same user and a ptrace_scope that allows it",
            ),
        }
    }
}

impl Facts {
    /// Reads the facts of process `pid` and of eim; unreadable ones stay
    /// unknown.
    pub fn read(pid: i32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let ours = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        Self {
            state: field(&status, "State").and_then(|s| s.chars().next()),
            flags: stat_flags(&stat),
            tracer: field(&status, "TracerPid").and_then(|s| s.parse().ok()),
            target_permitted: field(&status, "CapPrm").and_then(hex),
            target_uid: field(&status, "Uid").and_then(first_number),
            our_effective: field(&ours, "CapEff").and_then(hex),
            our_uid: field(&ours, "Uid").and_then(|s| s.split_whitespace().nth(1)?.parse().ok()),
            yama_scope: std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        }
    }
}

fn field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

fn first_number(s: &str) -> Option<u32> {
    s.split_whitespace().next()?.parse().ok()
}

/// Field 9 of `/proc/PID/stat`, counted after the command name's closing
/// parenthesis (the name may hold spaces and parentheses).
fn stat_flags(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(6)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Facts {
        Facts {
            state: Some('S'),
            flags: Some(0x40_0100),
            tracer: Some(0),
            target_permitted: Some(0x1ff_ffff_ffff),
            target_uid: Some(0),
            our_effective: Some(0x1ff_ffff_ffff),
            our_uid: Some(0),
            yama_scope: None,
        }
    }

    #[test]
    fn each_fact_names_its_reason() {
        let zombie = Facts {
            state: Some('Z'),
            ..root()
        };
        assert_eq!(Refusal::of(&zombie), Refusal::Zombie);
        let kthread = Facts {
            flags: Some(0x20_8040),
            ..root()
        };
        assert_eq!(Refusal::of(&kthread), Refusal::KernelThread);
        let traced = Facts {
            tracer: Some(77),
            ..root()
        };
        assert_eq!(Refusal::of(&traced), Refusal::Traced { by: 77 });
        let yama3 = Facts {
            yama_scope: Some(3),
            ..root()
        };
        assert_eq!(Refusal::of(&yama3), Refusal::YamaNoAttach);
        // pid 1 of this project's sandbox: it holds CAP_SYS_RESOURCE, which
        // root here lacks.
        let stronger = Facts {
            our_effective: Some(0x1ff_feff_ffff),
            ..root()
        };
        assert_eq!(
            Refusal::of(&stronger),
            Refusal::MoreCapable {
                missing: vec!["CAP_SYS_RESOURCE"]
            }
        );
        let other_user = Facts {
            our_effective: Some(0),
            our_uid: Some(1000),
            target_permitted: Some(0),
            ..root()
        };
        assert_eq!(Refusal::of(&other_user), Refusal::NoPtraceCapability);
        let admin_only = Facts {
            yama_scope: Some(2),
            ..other_user.clone()
        };
        assert_eq!(Refusal::of(&admin_only), Refusal::YamaAdminOnly);
        // Root is never told it lacks CAP_SYS_PTRACE.
        assert_eq!(Refusal::of(&root()), Refusal::Unexplained);
        assert_eq!(Refusal::of(&Facts::default()), Refusal::Unexplained);
    }

    #[test]
    fn stat_flags_are_read_after_the_name() {
        let stat = "2 (kthr) (x) y) S 0 0 0 0 -1 2129984 0 0";
        assert_eq!(stat_flags(stat), Some(2_129_984));
        assert_eq!(stat_flags("garbage"), None);
        assert_eq!(stat_flags("1 (a) S"), None);
    }

    #[test]
    fn a_kernel_thread_and_a_zombie_are_told_as_such() {
        // kthreadd is pid 2 wherever the kernel's threads are visible.
        let kthreadd = Facts::read(2);
        if kthreadd.flags.is_some() {
            assert_eq!(Refusal::of(&kthreadd), Refusal::KernelThread);
        }
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id() as i32;
        // Not reaped yet: a zombie once it has exited.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while Facts::read(pid).state != Some('Z') {
            assert!(std::time::Instant::now() < until, "true never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(Refusal::of(&Facts::read(pid)), Refusal::Zombie);
        child.wait().expect("reaped");
    }
}
