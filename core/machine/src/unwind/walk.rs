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

use super::step::{Cursor, Unwound};
use super::{
    arm64, frame_flag, lookup_code, x86, Arch, Frame, Mappings, Memory, Regs, Rule, Rules, Stack,
    StopReason, MAX_FRAMES,
};

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
            Err(lookup_code::ERR_STACK_DELTA_INVALID) => return StopReason::Invalid,
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
