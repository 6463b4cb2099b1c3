//! The native unwinder's model: what a stack walk over eim's maps reads,
//! computes and records, in the same terms as the BPF unwinder
//! (`bpf/unwinder.h`, interface `bpf/unwind.h`, mirrored here number for
//! number).
//!
//! The walk itself is pure: the maps are reached through [`Rules`] (a
//! simulated kernel's reader, or captured tables), the target's memory
//! through [`Memory`] and its mappings through [`Mappings`]. No I/O here.

use crate::abi::{ProcessMapping, UnwindInfo};

/// Frames one stack records at most (`EIM_MAX_FRAMES`).
pub const MAX_FRAMES: usize = 128;

/// Bytes of target memory one capture holds (`EIM_CAPTURE_STACK`).
pub const CAPTURE_STACK: usize = 32768;

/// `EIM_LOOKUP_*` (`bpf/lookup.h`): how the delta lookup ends, as the BPF
/// lookup and unwinder report it and `NoDelta` carries it. The one Rust
/// definition (the kernel backend checks it against the header; the
/// simulated reader maps its errors onto it).
pub mod lookup_code {
    pub const OK: u32 = 0;
    pub const ERR_TEXT_SECTION: u32 = 1;
    pub const ERR_OUTER_MAP: u32 = 2;
    pub const ERR_INNER_MAP: u32 = 3;
    pub const ERR_ITERATIONS: u32 = 4;
    pub const ERR_RANGE: u32 = 5;
    /// The delta in force is INVALID: the unwinder's own stop reason.
    pub const ERR_STACK_DELTA_INVALID: u32 = 6;
    pub const ERR_BAD_UNWIND_INFO_INDEX: u32 = 7;

    /// The upstream `ERR_NATIVE_*` name of an error code; `None` for OK and
    /// unknown codes.
    pub fn name(code: u32) -> Option<&'static str> {
        Some(match code {
            ERR_TEXT_SECTION => "ERR_NATIVE_LOOKUP_TEXT_SECTION",
            ERR_OUTER_MAP => "ERR_NATIVE_LOOKUP_STACK_DELTA_OUTER_MAP",
            ERR_INNER_MAP => "ERR_NATIVE_LOOKUP_STACK_DELTA_INNER_MAP",
            ERR_ITERATIONS => "ERR_NATIVE_EXCEEDED_DELTA_LOOKUP_ITERATIONS",
            ERR_RANGE => "ERR_NATIVE_LOOKUP_RANGE",
            ERR_STACK_DELTA_INVALID => "ERR_NATIVE_STACK_DELTA_INVALID",
            ERR_BAD_UNWIND_INFO_INDEX => "ERR_NATIVE_BAD_UNWIND_INFO_INDEX",
            _ => return None,
        })
    }
}

/// Which architecture's rules apply (`EIM_ARCH_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64 = 1,
    Arm64 = 2,
}

impl Arch {
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// `EimRegs.flags` bits.
pub mod regs_flag {
    /// The first PC is a return address (the thread is in a syscall).
    pub const RETURN_ADDRESS: u32 = 1;
}

/// The registers the rules read and write (`EimRegs`). x86-64 uses pc,
/// sp, fp (rbp), rax, r9, r11, r13, r15; arm64 pc, sp, fp (x29), lr (x30),
/// r22, r28. Unused ones are 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
    pub rax: u64,
    pub r9: u64,
    pub r11: u64,
    pub r13: u64,
    pub r15: u64,
    pub r22: u64,
    pub r28: u64,
    pub arch: Arch,
    /// `EIM_REGS_RETURN_ADDRESS`: look the first PC up at pc - 1.
    pub return_address: bool,
}

impl Regs {
    /// All zero but the architecture.
    pub fn zero(arch: Arch) -> Self {
        Self {
            pc: 0,
            sp: 0,
            fp: 0,
            lr: 0,
            rax: 0,
            r9: 0,
            r11: 0,
            r13: 0,
            r15: 0,
            r22: 0,
            r28: 0,
            arch,
            return_address: false,
        }
    }
}

/// Why a stack ends (`EIM_STOP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// A STOP delta: the outermost frame (`_start`, a thread's start).
    End,
    /// The PC is in no followed file mapping, or the process is unknown.
    UnknownMapping,
    /// `get_stack_delta` failed; the `EIM_LOOKUP_ERR_*` code (`lookup.h`).
    NoDelta(u32),
    /// An INVALID delta: no CFI there.
    Invalid,
    /// [`MAX_FRAMES`] frames recorded.
    Budget,
    /// Reading the target's memory failed, or the CFA was 0.
    ReadError,
    /// A command this architecture has no rule for (PLT on arm64).
    Unsupported,
    /// arm64: the return address is in LR, but this is not the first frame.
    LrMidTrace,
    /// The next PC is 0.
    ZeroPc,
    /// No user registers (a kernel thread).
    NoRegs,
}

impl StopReason {
    /// `EimStack.stop`.
    pub fn code(self) -> u32 {
        match self {
            Self::End => 0,
            Self::UnknownMapping => 1,
            Self::NoDelta(_) => 2,
            Self::Invalid => 3,
            Self::Budget => 4,
            Self::ReadError => 5,
            Self::Unsupported => 6,
            Self::LrMidTrace => 7,
            Self::ZeroPc => 8,
            Self::NoRegs => 9,
        }
    }

    /// `EimStack.detail`.
    pub fn detail(self) -> u32 {
        match self {
            Self::NoDelta(code) => code,
            _ => 0,
        }
    }

    /// From `EimStack.stop` and `.detail`; `None` for an unknown code.
    pub fn from_codes(stop: u32, detail: u32) -> Option<Self> {
        Some(match stop {
            0 => Self::End,
            1 => Self::UnknownMapping,
            2 => Self::NoDelta(detail),
            3 => Self::Invalid,
            4 => Self::Budget,
            5 => Self::ReadError,
            6 => Self::Unsupported,
            7 => Self::LrMidTrace,
            8 => Self::ZeroPc,
            9 => Self::NoRegs,
            _ => return None,
        })
    }

    /// A short name for output (`end`, `unknown-mapping`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::End => "end",
            Self::UnknownMapping => "unknown-mapping",
            Self::NoDelta(_) => "no-delta",
            Self::Invalid => "invalid",
            Self::Budget => "budget",
            Self::ReadError => "read-error",
            Self::Unsupported => "unsupported",
            Self::LrMidTrace => "lr-mid-trace",
            Self::ZeroPc => "zero-pc",
            Self::NoRegs => "no-regs",
        }
    }
}

/// `EimFrame.flags` bits.
pub mod frame_flag {
    /// The frame's PC was looked up at pc - 1.
    pub const RETURN_ADDRESS: u32 = 1;
    /// The frame was reached through a signal frame.
    pub const SIGNAL: u32 = 2;
}

/// One frame (`EimFrame`): its PC, and the file and ELF address it maps to
/// (0 and 0 where the PC is in no followed mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub pc: u64,
    pub file_id: u64,
    pub address: u64,
    /// `EIM_FRAME_*` bits.
    pub flags: u32,
}

/// One unwound stack (`EimStack`): `frames[0]` is the innermost.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stack {
    pub pid: u32,
    pub tid: u32,
    pub frames: Vec<Frame>,
    pub stop: StopReason,
}

/// The rule in force at an address, as the unwinder's lookup returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The STOP command.
    Stop,
    /// Another command (the low 15 bits of the delta): PLT, SIGNAL,
    /// FRAME_POINTER, or one with no rule.
    Command(u16),
    /// An `unwind_info_array` rule, merge adjustment applied (`merge_opcode`
    /// cleared, `param` adjusted).
    Info(UnwindInfo),
}

/// What one delta lookup resolved, in full: the rule and the slot and
/// page distance it came from. The simulated reader (`eim_sim`) and the
/// kernel backend's decoded lookup record both answer in this type, so
/// the two compare as values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// The STOP command: the unwinder ends the trace successfully.
    Stop,
    /// Another command (PLT, SIGNAL, FRAME_POINTER, …): the low 15 bits.
    Command(u16),
    /// An `unwind_info_array` rule, with the merge adjustment applied:
    /// `info.merge_opcode` is cleared and `info.param` adjusted.
    Rule {
        info: UnwindInfo,
        slot: u16,
        addr_diff: i32,
    },
}

/// The delta tables, as the unwinder reads them.
pub trait Rules {
    /// The rule at `address` (an ELF virtual address) of `file_id`: the
    /// delta's command or its merge-adjusted slot. `Err` is the lookup's
    /// `EIM_LOOKUP_ERR_*` code (`STACK_DELTA_INVALID` included).
    fn rule(&self, file_id: u64, address: u64) -> Result<Rule, u32>;
}

/// The target's memory.
pub trait Memory {
    /// The little-endian u64 at `address`; `None` if it cannot be read.
    fn read_u64(&self, address: u64) -> Option<u64>;
}

/// The target process's executable file mappings.
pub trait Mappings {
    /// The mapping of process `pid` containing `pc`.
    fn find(&self, pid: u32, pc: u64) -> Option<ProcessMapping>;
}

mod arm64;
mod step;
mod walk;
mod x86;

pub use arm64::normalize_pac;
pub use walk::unwind;
/// A thread's registers and a copy of its stack memory from `stack_base`
/// (at most [`CAPTURE_STACK`] bytes): the input of an unwind over captured
/// memory (`EimCapture`), in the kernel or in the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capture {
    pub regs: Regs,
    pub pid: u32,
    pub tid: u32,
    pub stack_base: u64,
    pub stack: Vec<u8>,
}

impl Memory for Capture {
    /// Reads inside `[stack_base, stack_base + stack.len())` only.
    fn read_u64(&self, address: u64) -> Option<u64> {
        let at = usize::try_from(address.checked_sub(self.stack_base)?).ok()?;
        let bytes = self.stack.get(at..at.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}
