//! A stopped thread's registers as the unwinder's [`Regs`]
//! (`PTRACE_GETREGS`; x86-64 only for now).

use eim_machine::unwind::Regs;
use nix::errno::Errno;

/// Why a thread's registers could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("thread {tid}: PTRACE_GETREGS failed: {errno}")]
    GetRegs { tid: i32, errno: Errno },
    #[error("thread {tid}: reading registers is implemented for x86-64 only")]
    Unsupported { tid: i32 },
}

/// The registers of thread `tid`, which must be in a ptrace stop
/// ([`super::freeze::Frozen`]).
#[cfg(target_arch = "x86_64")]
pub fn thread_regs(tid: i32) -> Result<Regs, RegsError> {
    use eim_machine::unwind::Arch;
    use nix::sys::ptrace;
    use nix::unistd::Pid;

    let r =
        ptrace::getregs(Pid::from_raw(tid)).map_err(|errno| RegsError::GetRegs { tid, errno })?;
    Ok(Regs {
        pc: r.rip,
        sp: r.rsp,
        fp: r.rbp,
        rax: r.rax,
        r9: r.r9,
        r11: r.r11,
        r13: r.r13,
        r15: r.r15,
        // The kernel keeps the syscall number in orig_rax while the thread
        // is in a syscall (-1 otherwise): rip is then the instruction after
        // the `syscall`, a return address for the lookup's purpose.
        return_address: r.orig_rax as i64 != -1,
        ..Regs::zero(Arch::X86_64)
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub fn thread_regs(tid: i32) -> Result<Regs, RegsError> {
    Err(RegsError::Unsupported { tid })
}
