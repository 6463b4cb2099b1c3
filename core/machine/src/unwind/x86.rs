//! x86-64 rules (spec §4.5, SEED `unwind_one_frame`).
//!
//! Memory is read in this order, and the BPF side reads in the same order
//! so that both stop at the same point:
//!
//! * PLT: `*(cfa − 8)`.
//! * SIGNAL: the 18 words of `uc_mcontext` at `sp + 40`.
//! * FRAME_POINTER: the 2 words at `fp`.
//! * a rule: the CFA's DEREF read (if any), the frame-pointer address's
//!   DEREF read (if any), the saved fp at that address (if not 0), then
//!   `*(cfa − 8)`.

use crate::abi::{command, opcode};

use super::step::{common_base, frame_pointer, offset_from, read_words, Cursor, Unwound};
use super::{Memory, Rule, StopReason};

/// Words of `uc_mcontext` the SIGNAL rule reads, and where they start
/// relative to the signal frame's sp (past `uc_flags`, `uc_link` and
/// `uc_stack`).
const SIGCONTEXT_WORDS: usize = 18;
const SIGCONTEXT_OFFSET: u64 = 40;

/// `sigcontext` word indices (the kernel's `struct sigcontext_64` order:
/// r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip).
mod sigcontext {
    pub(super) const R9: usize = 1;
    pub(super) const R11: usize = 3;
    pub(super) const R13: usize = 5;
    pub(super) const R15: usize = 7;
    pub(super) const RBP: usize = 10;
    pub(super) const RAX: usize = 13;
    pub(super) const RSP: usize = 15;
    pub(super) const RIP: usize = 16;
}

/// `BASE_REG`: the low 4 bits of param number the register.
const REG_MASK: i32 = 15;

/// Applies `rule` (not STOP) to the registers of `cursor`.
pub(crate) fn step(
    cursor: &mut Cursor,
    rule: Rule,
    memory: &dyn Memory,
) -> Result<Unwound, StopReason> {
    let cfa = match rule {
        Rule::Stop => return Err(StopReason::End),
        Rule::Command(c) => match i32::from(c) {
            command::STOP => return Err(StopReason::End),
            command::PLT => plt_cfa(cursor.regs.pc, cursor.regs.sp),
            command::SIGNAL => return signal(cursor, memory),
            command::FRAME_POINTER => return frame_pointer(cursor, memory),
            _ => return Err(StopReason::Unsupported),
        },
        Rule::Info(info) => {
            let cfa = register_address(cursor, 0, info.opcode, info.param, memory);
            let fpa = register_address(cursor, cfa, info.fp_opcode, info.fp_param, memory);
            if fpa != 0 {
                cursor.regs.fp = memory.read_u64(fpa).ok_or(StopReason::ReadError)?;
            } else if info.opcode == opcode::BASE_FP {
                // The whole byte: BASE_FP|DEREF keeps fp (spec §11 O3).
                cursor.regs.fp = 0;
            }
            cfa
        }
    };
    if cfa == 0 {
        return Err(StopReason::ReadError);
    }
    cursor.regs.pc = memory
        .read_u64(cfa.wrapping_sub(8))
        .ok_or(StopReason::ReadError)?;
    cursor.regs.sp = cfa;
    Ok(Unwound::Caller)
}

/// The CFA of a PLT stub: the fixed expression toolchains emit for the
/// whole table (one push in the second half of each 16-byte entry).
fn plt_cfa(pc: u64, sp: u64) -> u64 {
    let pushed = if pc & 15 >= 11 { 8 } else { 0 };
    sp.wrapping_add(8).wrapping_add(pushed)
}

/// The registers the kernel saved in the signal frame at `sp`.
fn signal(cursor: &mut Cursor, memory: &dyn Memory) -> Result<Unwound, StopReason> {
    let at = cursor.regs.sp.wrapping_add(SIGCONTEXT_OFFSET);
    let r = read_words::<SIGCONTEXT_WORDS>(memory, at).ok_or(StopReason::ReadError)?;
    let regs = &mut cursor.regs;
    regs.rax = r[sigcontext::RAX];
    regs.r9 = r[sigcontext::R9];
    regs.r11 = r[sigcontext::R11];
    regs.r13 = r[sigcontext::R13];
    regs.r15 = r[sigcontext::R15];
    regs.fp = r[sigcontext::RBP];
    regs.sp = r[sigcontext::RSP];
    regs.pc = r[sigcontext::RIP];
    Ok(Unwound::Interrupted)
}

/// `unwind_register_address` on x86-64: CFA, FP and SP bases, and
/// `BASE_REG` (rax, r9, r11, r15 plus `(param & !15) >> 1`, never
/// dereferenced); any other base gives 0.
fn register_address(cursor: &Cursor, cfa: u64, op: u8, param: i32, memory: &dyn Memory) -> u64 {
    if let Some(base) = common_base(cfa, &cursor.regs, op) {
        return offset_from(base, op, param, memory);
    }
    if op & !opcode::FLAG_DEREF != opcode::BASE_REG {
        return 0;
    }
    let regs = &cursor.regs;
    let value = match param & REG_MASK {
        0 => regs.rax,
        9 => regs.r9,
        11 => regs.r11,
        15 => regs.r15,
        _ => return 0,
    };
    // An arithmetic shift of the signed param, sign-extended, as in C.
    value.wrapping_add(((param & !REG_MASK) >> 1) as i64 as u64)
}
