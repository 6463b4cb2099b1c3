//! What one step of either architecture shares: the walk's state between
//! frames ([`Cursor`]), what a step leaves ([`Unwound`]), and the pieces
//! of spec §4.5 both architectures apply (DEREF addresses, the shared
//! bases, multi-word reads, the FRAME_POINTER command). The frame loop is
//! `walk.rs`; the rules per architecture `x86.rs` and `arm64.rs`.

use crate::abi::opcode;

use super::{Memory, Regs, StopReason};

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
    pub(crate) regs: Regs,
    /// The current PC is a return address: look it up at −1.
    pub(crate) return_address: bool,
    /// The current frame was reached through a signal frame.
    pub(crate) via_signal: bool,
    /// arm64: LR no longer holds this frame's return address (every frame
    /// but the first and one reached through a signal frame).
    pub(crate) lr_invalid: bool,
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
