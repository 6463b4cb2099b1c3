//! What one stack delta is: an address, hint flags and an unwind rule,
//! with the rules and hints extraction uses by name.

use crate::abi::{command, opcode, UnwindInfo};

/// Hint flags carried by a delta during extraction.
pub mod hint {
    pub const NONE: u8 = 0;
    /// The delta starts a function: keep it even when it repeats a rule.
    pub const KEEP: u8 = 1;
    /// The delta marks the end of a function: a following function that starts
    /// within [`crate::deltas::MINIMUM_GAP`] bytes replaces it.
    pub const GAP: u8 = 4;
}

/// Predefined unwind rules.
pub mod info {
    use super::{command, opcode, UnwindInfo};

    const fn cmd(param: i32) -> UnwindInfo {
        UnwindInfo::new(opcode::COMMAND, param, 0, 0)
    }

    pub const INVALID: UnwindInfo = cmd(command::INVALID);
    pub const STOP: UnwindInfo = cmd(command::STOP);
    pub const PLT: UnwindInfo = cmd(command::PLT);
    pub const SIGNAL: UnwindInfo = cmd(command::SIGNAL);
    pub const FRAME_POINTER: UnwindInfo = cmd(command::FRAME_POINTER);
    /// arm64 leaf: CFA = SP, return address in LR.
    pub const LR: UnwindInfo = UnwindInfo::new(opcode::BASE_SP, 0, opcode::BASE_LR, 0);

    /// CFA = SP + `offset`, no frame-pointer rule.
    pub const fn sp(offset: i32) -> UnwindInfo {
        UnwindInfo::new(opcode::BASE_SP, offset, 0, 0)
    }
}

/// One extracted delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackDelta {
    /// ELF virtual address where the rule starts.
    pub address: u64,
    pub hints: u8,
    pub info: UnwindInfo,
}

impl StackDelta {
    pub const fn new(address: u64, hints: u8, info: UnwindInfo) -> Self {
        Self {
            address,
            hints,
            info,
        }
    }
}
