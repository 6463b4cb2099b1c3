//! arm64 rules (spec §4.5, SEED `unwind_one_frame`).
//!
//! The rule's second half locates the return address (`ra`) rather than
//! the saved frame pointer. Memory is read in this order, and the BPF side
//! reads in the same order:
//!
//! * SIGNAL: the 34 words at `sp + 312` (`uc_mcontext`'s x0..x30, sp, pc,
//!   pstate).
//! * FRAME_POINTER: the 2 words at `fp`.
//! * a rule: the CFA's DEREF read (if any), `ra`'s DEREF read (if any), the
//!   return address at `ra` (unless `ra` is LR itself), then the saved fp at
//!   `ra − 8` when `fp_param == 8`.
//!
//! PLT has no rule here ([`StopReason::Unsupported`]).

use crate::abi::{command, opcode};

use super::step::{common_base, frame_pointer, offset_from, read_words, Cursor, Unwound};
use super::{Memory, Rule, StopReason};

/// Words of the signal frame the SIGNAL rule reads, and where they start
/// relative to its sp: the `rt_sigframe` begins with `siginfo` (128 bytes)
/// and the `ucontext` up to `uc_mcontext` (176 bytes with its alignment),
/// then `sigcontext.fault_address` (8); `regs[0]` follows.
const SIGNAL_WORDS: usize = 34;
const SIGNAL_OFFSET: u64 = 312;

/// Indices in those words.
mod sigcontext {
    pub(super) const X22: usize = 22;
    pub(super) const X28: usize = 28;
    pub(super) const FP: usize = 29;
    pub(super) const LR: usize = 30;
    pub(super) const SP: usize = 31;
    pub(super) const PC: usize = 32;
}

/// User-space addresses on arm64 fit in 48 bits; the bits above hold a
/// pointer-authentication code (or a tag) on signed return addresses.
/// Upstream masks with the PAC mask the kernel reports; the twin and the
/// BPF side both keep the low 48 bits, which is the same for the 48-bit
/// virtual address spaces Linux uses for user space by default.
const ADDRESS_MASK: u64 = (1 << 48) - 1;

/// A return address without its pointer-authentication bits.
pub fn normalize_pac(pointer: u64) -> u64 {
    pointer & ADDRESS_MASK
}

/// Applies `rule` (not STOP) to the registers of `cursor`.
pub(crate) fn step(
    cursor: &mut Cursor,
    rule: Rule,
    memory: &dyn Memory,
) -> Result<Unwound, StopReason> {
    let info = match rule {
        Rule::Stop => return Err(StopReason::End),
        Rule::Command(c) => {
            return match i32::from(c) {
                command::STOP => Err(StopReason::End),
                command::SIGNAL => signal(cursor, memory),
                command::FRAME_POINTER => frame_pointer(cursor, memory),
                _ => Err(StopReason::Unsupported),
            }
        }
        Rule::Info(info) => info,
    };
    let cfa = register_address(cursor, 0, info.opcode, info.param, memory);
    let mut ra = register_address(cursor, cfa, info.fp_opcode, info.fp_param, memory);
    if ra != 0 {
        let pc = if info.fp_opcode == opcode::BASE_LR {
            if cursor.lr_invalid {
                return Err(StopReason::LrMidTrace);
            }
            ra
        } else {
            match memory.read_u64(ra) {
                Some(pc) => pc,
                None => {
                    ra = 0;
                    0
                }
            }
        };
        cursor.regs.pc = normalize_pac(pc);
    }
    if ra == 0 {
        return Err(StopReason::ReadError);
    }
    if info.fp_param == 8 && info.fp_opcode != opcode::BASE_LR {
        // Unchecked upstream: a failed read leaves fp 0 (spec §11 O3).
        cursor.regs.fp = memory.read_u64(ra.wrapping_sub(8)).unwrap_or(0);
    }
    cursor.regs.sp = cfa;
    Ok(Unwound::Caller)
}

/// The registers the kernel saved in the signal frame at `sp`.
fn signal(cursor: &mut Cursor, memory: &dyn Memory) -> Result<Unwound, StopReason> {
    let at = cursor.regs.sp.wrapping_add(SIGNAL_OFFSET);
    let r = read_words::<SIGNAL_WORDS>(memory, at).ok_or(StopReason::ReadError)?;
    let regs = &mut cursor.regs;
    regs.pc = normalize_pac(r[sigcontext::PC]);
    regs.sp = r[sigcontext::SP];
    regs.fp = r[sigcontext::FP];
    regs.lr = normalize_pac(r[sigcontext::LR]);
    regs.r22 = r[sigcontext::X22];
    regs.r28 = r[sigcontext::X28];
    Ok(Unwound::Interrupted)
}

/// `unwind_register_address` on arm64: CFA, FP and SP bases, and
/// `BASE_LR` (LR itself, never dereferenced, param ignored); any other base
/// gives 0.
fn register_address(cursor: &Cursor, cfa: u64, op: u8, param: i32, memory: &dyn Memory) -> u64 {
    if let Some(base) = common_base(cfa, &cursor.regs, op) {
        return offset_from(base, op, param, memory);
    }
    if op & !opcode::FLAG_DEREF == opcode::BASE_LR {
        return cursor.regs.lr;
    }
    0
}
