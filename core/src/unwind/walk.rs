//! The frame loop shared by both architectures: PC to mapping, the rule
//! lookup (with the return-address −1 of spec §4.4, HEAD), recording, and
//! the hand-off to the architecture's rule ([`super::x86`], [`super::arm64`]).
//!
//! This is the user-space twin of `bpf/unwinder.h`: for the same registers,
//! tables and memory both must record the same frames and stop for the
//! same reason. So the order of the checks below is part of the contract:
//!
//! 1. the frame budget ([`MAX_FRAMES`] recorded: [`StopReason::Budget`]);
//! 2. `pc == 0`: [`StopReason::ZeroPc`], nothing recorded;
//! 3. the mapping of `pc`; none: the frame is recorded with file id 0 and
//!    address 0, then [`StopReason::UnknownMapping`];
//! 4. the frame is recorded with `address = pc − bias` (never −1) and its
//!    flags, both known before the lookup;
//! 5. the rule at `address − 1` (a return address) or `address`; a failed
//!    lookup stops (`STACK_DELTA_INVALID` as [`StopReason::Invalid`], the
//!    other codes as [`StopReason::NoDelta`]), STOP ends the stack;
//! 6. the architecture's step, which reads memory in the order its module
//!    documents and either gives the caller's registers or a stop reason.

use crate::abi::opcode;

use super::{
    arm64, frame_flag, x86, Arch, Frame, Mappings, Memory, Regs, Rule, Rules, Stack, StopReason,
    MAX_FRAMES,
};

/// `EIM_LOOKUP_ERR_STACK_DELTA_INVALID` (`bpf/lookup.h`): the delta in force
/// is INVALID, which the unwinder reports as its own stop reason.
pub const LOOKUP_ERR_STACK_DELTA_INVALID: u32 = 6;

/// What the registers mean after a step, for the next frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unwound {
    /// An ordinary caller: its PC is a return address.
    Caller,
    /// The frame interrupted by a signal: its PC is where it stopped, not a
    /// return address, and (arm64) its LR is valid again.
    Interrupted,
}

/// The walk's state between frames.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor {
    pub regs: Regs,
    /// The current PC is a return address: look it up at −1.
    pub return_address: bool,
    /// The current frame was reached through a signal frame.
    pub via_signal: bool,
    /// arm64: LR no longer holds this frame's return address (every frame
    /// but the first and one reached through a signal frame).
    pub lr_invalid: bool,
}

/// Walks the stack of thread `tid` of process `pid` from `regs`.
///
/// Pure: everything outside the registers comes through `rules` (the delta
/// tables), `memory` (the target's memory) and `mappings` (its executable
/// file mappings). Always ends: at most [`MAX_FRAMES`] iterations, each
/// with a bounded number of reads.
pub fn unwind(
    pid: u32,
    tid: u32,
    regs: Regs,
    rules: &dyn Rules,
    memory: &dyn Memory,
    mappings: &dyn Mappings,
) -> Stack {
    let mut frames = Vec::with_capacity(16);
    let stop = walk(pid, regs, rules, memory, mappings, &mut frames);
    Stack {
        pid,
        tid,
        frames,
        stop,
    }
}

fn walk(
    pid: u32,
    regs: Regs,
    rules: &dyn Rules,
    memory: &dyn Memory,
    mappings: &dyn Mappings,
    frames: &mut Vec<Frame>,
) -> StopReason {
    let mut cursor = Cursor {
        regs,
        return_address: regs.return_address,
        via_signal: false,
        lr_invalid: false,
    };
    while frames.len() < MAX_FRAMES {
        let pc = cursor.regs.pc;
        if pc == 0 {
            return StopReason::ZeroPc;
        }
        let mut flags = 0;
        if cursor.return_address {
            flags |= frame_flag::RETURN_ADDRESS;
        }
        if cursor.via_signal {
            flags |= frame_flag::SIGNAL;
        }
        let Some(mapping) = mappings.find(pid, pc) else {
            frames.push(Frame {
                pc,
                file_id: 0,
                address: 0,
                flags,
            });
            return StopReason::UnknownMapping;
        };
        let address = pc.wrapping_sub(mapping.bias);
        frames.push(Frame {
            pc,
            file_id: mapping.file_id,
            address,
            flags,
        });
        let lookup_at = if cursor.return_address {
            address.wrapping_sub(1)
        } else {
            address
        };
        let rule = match rules.rule(mapping.file_id, lookup_at) {
            Ok(Rule::Stop) => return StopReason::End,
            Ok(rule) => rule,
            Err(LOOKUP_ERR_STACK_DELTA_INVALID) => return StopReason::Invalid,
            Err(code) => return StopReason::NoDelta(code),
        };
        let step = match cursor.regs.arch {
            Arch::X86_64 => x86::step(&mut cursor, rule, memory),
            Arch::Arm64 => arm64::step(&mut cursor, rule, memory),
        };
        match step {
            Ok(Unwound::Caller) => {
                cursor.return_address = true;
                cursor.via_signal = false;
                cursor.lr_invalid = true;
            }
            Ok(Unwound::Interrupted) => {
                cursor.return_address = false;
                cursor.via_signal = true;
                cursor.lr_invalid = false;
            }
            Err(stop) => return stop,
        }
    }
    StopReason::Budget
}

/// The address part of spec §4.5's `unwind_register_address` once the
/// architecture has resolved the base: `base + preDeref`, and with the
/// DEREF flag `*(base + preDeref) + postDeref` (one read; a failed read
/// gives 0, not an error: the caller's 0 checks turn it into one).
pub(crate) fn offset_from(base: u64, op: u8, param: i32, memory: &dyn Memory) -> u64 {
    if op & opcode::FLAG_DEREF == 0 {
        return base.wrapping_add(param as i64 as u64);
    }
    let pre_deref = param & !DEREF_MASK;
    let post_deref = ((param & DEREF_MASK) as u64) * DEREF_MULTIPLIER;
    match memory.read_u64(base.wrapping_add(pre_deref as i64 as u64)) {
        Some(value) => value.wrapping_add(post_deref),
        None => 0,
    }
}

/// `UnwindDerefMask`: the low bits of a DEREF param count 8-byte steps
/// added after the read.
const DEREF_MASK: i32 = 7;
/// `UnwindDerefMultiplier`.
const DEREF_MULTIPLIER: u64 = 8;

/// A rule's base register, by `opcode & !FLAG_DEREF`, for the bases both
/// architectures share (CFA, FP, SP); `None` for the others.
pub(crate) fn common_base(cfa: u64, regs: &Regs, op: u8) -> Option<u64> {
    match op & !opcode::FLAG_DEREF {
        opcode::BASE_CFA => Some(cfa),
        opcode::BASE_FP => Some(regs.fp),
        opcode::BASE_SP => Some(regs.sp),
        _ => None,
    }
}

/// Reads `N` consecutive u64 from `address` (a signal frame's saved
/// registers), in order; `None` if any of them cannot be read (the BPF side
/// reads them in one copy, which fails as a whole).
pub(crate) fn read_words<const N: usize>(memory: &dyn Memory, address: u64) -> Option<[u64; N]> {
    let mut words = [0; N];
    for (i, word) in words.iter_mut().enumerate() {
        *word = memory.read_u64(address.wrapping_add(8 * i as u64))?;
    }
    Some(words)
}

/// The FRAME_POINTER command, the same on both architectures at SEED
/// (spec §11 O5: no PAC normalisation on arm64): the 16 bytes at `fp` are
/// the caller's fp and the return address; the caller's sp is `fp + 16`.
pub(crate) fn frame_pointer(
    cursor: &mut Cursor,
    memory: &dyn Memory,
) -> Result<Unwound, StopReason> {
    let fp = cursor.regs.fp;
    let [saved_fp, return_address] = read_words::<2>(memory, fp).ok_or(StopReason::ReadError)?;
    cursor.regs.fp = saved_fp;
    cursor.regs.pc = return_address;
    cursor.regs.sp = fp.wrapping_add(16);
    Ok(Unwound::Caller)
}
