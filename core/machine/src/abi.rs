//! The kernel map ABI: the structs the native unwinder reads, byte for byte.
//!
//! Layouts are upstream's (SEED revision, `support/ebpf/types.h`); they are
//! the contract with the BPF side, so every struct here is `repr(C)` with a
//! compile-time check of its size and field offsets, and an explicit
//! little-endian encoding so that nothing depends on the host's padding.

use core::mem::{offset_of, size_of};

/// Bits of an address that select the position inside a stack-delta page.
pub const PAGE_BITS: u32 = 16;
/// Size of a stack-delta page (64 KiB).
pub const PAGE_SIZE: u64 = 1 << PAGE_BITS;
/// Mask of the in-page offset.
pub const PAGE_MASK: u64 = PAGE_SIZE - 1;

/// Smallest size class: inner arrays of 2^8 deltas.
pub const SIZE_CLASS_MIN: u16 = 8;
/// Largest size class: inner arrays of 2^23 deltas.
pub const SIZE_CLASS_MAX: u16 = 23;
/// Number of size classes, and so of `exe_id_to_N_stack_deltas` outer maps.
pub const SIZE_CLASS_COUNT: usize = (SIZE_CLASS_MAX - SIZE_CLASS_MIN + 1) as usize;
/// Largest number of kernel deltas one file may have (the inner array of the
/// largest class must be strictly larger than the table).
pub(crate) const MAX_KERNEL_DELTAS: usize = (1 << SIZE_CLASS_MAX) - 1;

/// Bit 15 of a kernel delta's `unwind_info`: the low bits are a command.
pub const DELTA_COMMAND_FLAG: u16 = 0x8000;
/// Bit 7 of a merge opcode: the merged neighbour's param is 8 lower.
pub const MERGE_OPCODE_NEGATIVE: u8 = 0x80;

/// Unwind opcodes (the base of the CFA or of the frame-pointer rule).
pub mod opcode {
    /// The delta is a command; `param` says which.
    pub const COMMAND: u8 = 0;
    pub const BASE_CFA: u8 = 1;
    pub const BASE_SP: u8 = 2;
    pub const BASE_FP: u8 = 3;
    pub const BASE_LR: u8 = 4;
    pub const BASE_REG: u8 = 5;
    /// Flag: dereference the computed address.
    pub const FLAG_DEREF: u8 = 0x80;

    /// The opcode in words: its base (`cfa`, `sp`, `fp`, `lr`, `reg`, or
    /// `command`), with `deref` when the flag is set; an unknown base is
    /// its number.
    pub fn name(op: u8) -> String {
        let base = match op & !FLAG_DEREF {
            COMMAND => "command".to_string(),
            BASE_CFA => "cfa".to_string(),
            BASE_SP => "sp".to_string(),
            BASE_FP => "fp".to_string(),
            BASE_LR => "lr".to_string(),
            BASE_REG => "reg".to_string(),
            other => format!("opcode {other:#x}"),
        };
        if op & FLAG_DEREF != 0 {
            format!("deref {base}")
        } else {
            base
        }
    }
}

/// Unwind commands, stored in `param` when the opcode is [`opcode::COMMAND`].
pub mod command {
    pub const INVALID: i32 = 0;
    pub const STOP: i32 = 1;
    pub const PLT: i32 = 2;
    pub const SIGNAL: i32 = 3;
    pub const FRAME_POINTER: i32 = 4;

    /// The command's name, as the unwinder's stop reasons and `eim lookup`
    /// print it; an unknown one is its number.
    pub fn name(command: i32) -> String {
        match command {
            INVALID => "INVALID".into(),
            STOP => "STOP".into(),
            PLT => "PLT".into(),
            SIGNAL => "SIGNAL".into(),
            FRAME_POINTER => "FRAME_POINTER".into(),
            other => format!("command {other}"),
        }
    }
}

/// Kernel delta values for commands encoded directly (no array slot).
pub mod encoded_command {
    use super::DELTA_COMMAND_FLAG;
    pub const INVALID: u16 = DELTA_COMMAND_FLAG;
    pub const STOP: u16 = DELTA_COMMAND_FLAG | 1;
    pub const PLT: u16 = DELTA_COMMAND_FLAG | 2;
    pub const SIGNAL: u16 = DELTA_COMMAND_FLAG | 3;
    pub const FRAME_POINTER: u16 = DELTA_COMMAND_FLAG | 4;
}

/// BPF program indices used in `OffsetRange::program_index` (SEED numbering).
pub mod program {
    pub(crate) const STOP: u16 = 0;
    pub(crate) const NATIVE: u16 = 1;
    pub(crate) const HOTSPOT: u16 = 2;
    pub const PERL: u16 = 3;
    pub const PYTHON: u16 = 4;
    pub const PHP: u16 = 5;
    pub const RUBY: u16 = 6;
    pub const V8: u16 = 7;
    pub(crate) const DOTNET: u16 = 8;
    pub(crate) const GO_LABELS: u16 = 9;

    /// The program's name (its loader's, or `native`/`stop`); an unknown
    /// index is its number.
    pub fn name(program: u16) -> String {
        match program {
            STOP => "stop".into(),
            NATIVE => "native".into(),
            HOTSPOT => "hotspot".into(),
            PERL => "perl".into(),
            PYTHON => "python".into(),
            PHP => "php".into(),
            RUBY => "ruby".into(),
            V8 => "v8".into(),
            DOTNET => "dotnet".into(),
            GO_LABELS => "golabels".into(),
            other => format!("program {other}"),
        }
    }
}

/// An inclusive address range as eim prints every one (`0x10..=0x1f`): the
/// kernel compares the bounds of `interpreter_offsets` inclusively.
pub fn inclusive_range(lower: u64, upper: u64) -> String {
    format!("{lower:#x}..={upper:#x}")
}

/// One `interpreter_offsets` range and the program it dispatches to, as
/// every report writes it: `0xfab70..=0x1054c1 (python)`.
pub fn interpreter_range(lower: u64, upper: u64, program: u16) -> String {
    format!(
        "{} ({})",
        inclusive_range(lower, upper),
        program::name(program)
    )
}

/// Map names, as the BPF object declares them.
pub mod map_name {
    pub const PAGES: &str = "stack_delta_page_to_info";
    pub const UNWIND_INFO: &str = "unwind_info_array";
    pub const INTERPRETER_OFFSETS: &str = "interpreter_offsets";
    /// pid -> that process's executable file mappings (eim's own map: the
    /// unwinder maps a PC to a file id and an ELF address through it).
    pub const PROCESS_MAPPINGS: &str = "eim_process_mappings";
    /// eim's own, for readers in other processes only (no BPF program reads
    /// it): a one-element ARRAY whose u64 the owner makes odd before a run
    /// of writes and even after (a seqlock; `docs/MAP_ABI.md`).
    pub const GENERATION: &str = "eim_generation";

    /// `exe_id_to_<class>_stack_deltas`.
    pub fn outer(class: u16) -> String {
        format!("exe_id_to_{class}_stack_deltas")
    }
}

/// Default capacities (upstream's runtime sizes with map scale factor 0).
pub mod capacity {
    /// `unwind_info_array` slots.
    pub const UNWIND_INFO: u32 = 16384;
    /// `interpreter_offsets` entries.
    pub const INTERPRETER_OFFSETS: u32 = 32;
    /// `stack_delta_page_to_info`: 40000 compiled, 65536 at run time.
    pub const PAGES_COMPILED: u32 = 40000;
    pub const PAGES: u32 = 65536;
    /// Each `exe_id_to_N_stack_deltas`: 4096 compiled, 65536 at run time.
    pub const OUTER_COMPILED: u32 = 4096;
    pub const OUTER: u32 = 65536;
    /// `eim_process_mappings` entries: processes (not preallocated, so an
    /// entry costs memory only while its process is followed).
    pub const PROCESSES: u32 = 32768;
}

/// The most executable file mappings one `eim_process_mappings` entry holds.
/// A process with more keeps its first (lowest) ones and the rest are
/// counted as not followed: the unwinder then stops at an unknown mapping,
/// it never resolves a PC to the wrong file.
pub const MAX_PROCESS_MAPPINGS: usize = 512;

/// One entry of an inner delta array: where a rule starts inside its page
/// and which rule applies (an `unwind_info_array` index, or a command).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackDelta {
    pub addr_low: u16,
    pub unwind_info: u16,
}

/// Key of `stack_delta_page_to_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackDeltaPageKey {
    pub file_id: u64,
    /// Page-aligned ELF virtual address.
    pub page: u64,
}

/// Value of `stack_delta_page_to_info`: the slice of the file's inner array
/// that covers the page, and which size class holds that array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackDeltaPageInfo {
    pub first_delta: u32,
    pub num_deltas: u16,
    pub map_id: u16,
}

/// One `unwind_info_array` slot (SEED layout, with its explicit pad byte).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnwindInfo {
    pub opcode: u8,
    pub fp_opcode: u8,
    pub merge_opcode: u8,
    pub pad: u8,
    pub param: i32,
    pub fp_param: i32,
}

impl UnwindInfo {
    /// A rule: the CFA is `opcode`'s base plus `param`; the frame-pointer
    /// (x86-64) or return-address (arm64) rule is `fp_opcode` plus `fp_param`.
    pub const fn new(opcode: u8, param: i32, fp_opcode: u8, fp_param: i32) -> Self {
        Self {
            opcode,
            fp_opcode,
            merge_opcode: 0,
            pad: 0,
            param,
            fp_param,
        }
    }
}

/// Value of `interpreter_offsets`: up to two code ranges (bounds compared
/// inclusively by the BPF side) and the program to tail-call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OffsetRange {
    pub lower_offset1: u64,
    pub upper_offset1: u64,
    pub lower_offset2: u64,
    pub upper_offset2: u64,
    pub program_index: u16,
    pub pad: [u8; 6],
}

/// One executable file mapping of a process: `[start, end)` of its address
/// space maps the file `file_id` from `file_offset`, and an address `pc` in
/// it is the ELF virtual address `pc - bias` of that file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessMapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub bias: u64,
    pub file_id: u64,
}

/// Value of `eim_process_mappings`: `count` mappings sorted by start and
/// not overlapping (the unwinder searches them by bisection), then zeros
/// up to [`MAX_PROCESS_MAPPINGS`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProcessMappings {
    pub mappings: Vec<ProcessMapping>,
}

// The layouts the BPF side was compiled against. A change here is an ABI break.
const _: () = {
    assert!(size_of::<StackDelta>() == 4);
    assert!(offset_of!(StackDelta, addr_low) == 0);
    assert!(offset_of!(StackDelta, unwind_info) == 2);

    assert!(size_of::<StackDeltaPageKey>() == 16);
    assert!(offset_of!(StackDeltaPageKey, file_id) == 0);
    assert!(offset_of!(StackDeltaPageKey, page) == 8);

    assert!(size_of::<StackDeltaPageInfo>() == 8);
    assert!(offset_of!(StackDeltaPageInfo, first_delta) == 0);
    assert!(offset_of!(StackDeltaPageInfo, num_deltas) == 4);
    assert!(offset_of!(StackDeltaPageInfo, map_id) == 6);

    assert!(size_of::<UnwindInfo>() == 12);
    assert!(offset_of!(UnwindInfo, opcode) == 0);
    assert!(offset_of!(UnwindInfo, fp_opcode) == 1);
    assert!(offset_of!(UnwindInfo, merge_opcode) == 2);
    assert!(offset_of!(UnwindInfo, pad) == 3);
    assert!(offset_of!(UnwindInfo, param) == 4);
    assert!(offset_of!(UnwindInfo, fp_param) == 8);

    assert!(size_of::<OffsetRange>() == 40);
    assert!(offset_of!(OffsetRange, lower_offset1) == 0);
    assert!(offset_of!(OffsetRange, upper_offset1) == 8);
    assert!(offset_of!(OffsetRange, lower_offset2) == 16);
    assert!(offset_of!(OffsetRange, upper_offset2) == 24);
    assert!(offset_of!(OffsetRange, program_index) == 32);
    assert!(size_of::<ProcessMapping>() == 40);
    assert!(offset_of!(ProcessMapping, bias) == 24);
    assert!(offset_of!(ProcessMapping, file_id) == 32);
};

/// A fixed-size little-endian encoding, the bytes a map key or value holds.
pub trait Wire: Sized {
    const SIZE: usize;
    fn write(&self, out: &mut [u8]);
    fn read(bytes: &[u8]) -> Option<Self>;

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; Self::SIZE];
        self.write(&mut out);
        out
    }
}

/// The wire bytes of `items`, end to end: a batch syscall's key or value
/// buffer, as both backends hand it to their maps.
pub fn flatten<T: Wire>(items: impl ExactSizeIterator<Item = T>) -> Vec<u8> {
    // Written in place: a buffer per element was a tenth of a big load.
    let mut out = vec![0u8; items.len() * T::SIZE];
    for (slot, item) in out.chunks_exact_mut(T::SIZE.max(1)).zip(items) {
        item.write(slot);
    }
    out
}

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Wire for u32 {
    const SIZE: usize = 4;
    fn write(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.to_le_bytes());
    }
    fn read(b: &[u8]) -> Option<Self> {
        (b.len() == 4).then(|| le_u32(b, 0)).flatten()
    }
}

impl Wire for u64 {
    const SIZE: usize = 8;
    fn write(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.to_le_bytes());
    }
    fn read(b: &[u8]) -> Option<Self> {
        (b.len() == 8).then(|| le_u64(b, 0)).flatten()
    }
}

impl Wire for StackDelta {
    const SIZE: usize = 4;
    fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.addr_low.to_le_bytes());
        out[2..4].copy_from_slice(&self.unwind_info.to_le_bytes());
    }
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        Some(Self {
            addr_low: le_u16(b, 0)?,
            unwind_info: le_u16(b, 2)?,
        })
    }
}

impl Wire for StackDeltaPageKey {
    const SIZE: usize = 16;
    fn write(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.file_id.to_le_bytes());
        out[8..16].copy_from_slice(&self.page.to_le_bytes());
    }
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        Some(Self {
            file_id: le_u64(b, 0)?,
            page: le_u64(b, 8)?,
        })
    }
}

impl Wire for StackDeltaPageInfo {
    const SIZE: usize = 8;
    fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.first_delta.to_le_bytes());
        out[4..6].copy_from_slice(&self.num_deltas.to_le_bytes());
        out[6..8].copy_from_slice(&self.map_id.to_le_bytes());
    }
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        Some(Self {
            first_delta: le_u32(b, 0)?,
            num_deltas: le_u16(b, 4)?,
            map_id: le_u16(b, 6)?,
        })
    }
}

impl Wire for UnwindInfo {
    const SIZE: usize = 12;
    fn write(&self, out: &mut [u8]) {
        out[0] = self.opcode;
        out[1] = self.fp_opcode;
        out[2] = self.merge_opcode;
        out[3] = self.pad;
        out[4..8].copy_from_slice(&self.param.to_le_bytes());
        out[8..12].copy_from_slice(&self.fp_param.to_le_bytes());
    }
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        Some(Self {
            opcode: b[0],
            fp_opcode: b[1],
            merge_opcode: b[2],
            pad: b[3],
            param: le_u32(b, 4)? as i32,
            fp_param: le_u32(b, 8)? as i32,
        })
    }
}

impl Wire for OffsetRange {
    const SIZE: usize = 40;
    fn write(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.lower_offset1.to_le_bytes());
        out[8..16].copy_from_slice(&self.upper_offset1.to_le_bytes());
        out[16..24].copy_from_slice(&self.lower_offset2.to_le_bytes());
        out[24..32].copy_from_slice(&self.upper_offset2.to_le_bytes());
        out[32..34].copy_from_slice(&self.program_index.to_le_bytes());
        out[34..40].copy_from_slice(&self.pad);
    }
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        let mut pad = [0; 6];
        pad.copy_from_slice(&b[34..40]);
        Some(Self {
            lower_offset1: le_u64(b, 0)?,
            upper_offset1: le_u64(b, 8)?,
            lower_offset2: le_u64(b, 16)?,
            upper_offset2: le_u64(b, 24)?,
            program_index: le_u16(b, 32)?,
            pad,
        })
    }
}

impl Wire for ProcessMapping {
    const SIZE: usize = 40;
    fn write(&self, out: &mut [u8]) {
        let fields = [
            self.start,
            self.end,
            self.file_offset,
            self.bias,
            self.file_id,
        ];
        for (slot, v) in out[..Self::SIZE].chunks_exact_mut(8).zip(fields) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
    }
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        Some(Self {
            start: le_u64(b, 0)?,
            end: le_u64(b, 8)?,
            file_offset: le_u64(b, 16)?,
            bias: le_u64(b, 24)?,
            file_id: le_u64(b, 32)?,
        })
    }
}

impl Wire for ProcessMappings {
    /// `u32 count`, `u32 pad`, then [`MAX_PROCESS_MAPPINGS`] mappings.
    const SIZE: usize = 8 + MAX_PROCESS_MAPPINGS * ProcessMapping::SIZE;
    fn write(&self, out: &mut [u8]) {
        let out = &mut out[..Self::SIZE];
        out.fill(0);
        let count = self.mappings.len().min(MAX_PROCESS_MAPPINGS);
        out[0..4].copy_from_slice(&(count as u32).to_le_bytes());
        for (slot, m) in out[8..]
            .chunks_exact_mut(ProcessMapping::SIZE)
            .zip(&self.mappings[..count])
        {
            m.write(slot);
        }
    }
    /// `None` for a value of another size or a count past the capacity.
    fn read(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        let count = le_u32(b, 0)? as usize;
        if count > MAX_PROCESS_MAPPINGS {
            return None;
        }
        let mappings = b[8..]
            .chunks_exact(ProcessMapping::SIZE)
            .take(count)
            .map(ProcessMapping::read)
            .collect::<Option<Vec<_>>>()?;
        Some(Self { mappings })
    }
}

impl ProcessMappings {
    /// The mapping containing `address`, by bisection over the sorted
    /// mappings (as the unwinder searches them).
    pub fn find(&self, address: u64) -> Option<&ProcessMapping> {
        let i = self.mappings.partition_point(|m| m.start <= address);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (address < m.end).then_some(m)
    }

    /// Whether the mappings are sorted by start, non-empty and do not
    /// overlap: what the unwinder's bisection needs.
    pub fn is_well_formed(&self) -> bool {
        self.mappings.len() <= MAX_PROCESS_MAPPINGS
            && self.mappings.iter().all(|m| m.start < m.end)
            && self.mappings.windows(2).all(|w| w[0].end <= w[1].start)
    }
}

/// The size class (`mapID`) whose inner arrays hold `num_deltas` deltas:
/// the number of significant bits, at least 8. `None` above 2^23 - 1.
pub fn size_class(num_deltas: u32) -> Option<u16> {
    let bits = (32 - num_deltas.leading_zeros()) as u16;
    match bits {
        0..=8 => Some(SIZE_CLASS_MIN),
        b if b > SIZE_CLASS_MAX => None,
        b => Some(b),
    }
}

/// Entries of an inner array of the given class; `None` outside 8..=23.
pub fn class_entries(class: u16) -> Option<u32> {
    (SIZE_CLASS_MIN..=SIZE_CLASS_MAX)
        .contains(&class)
        .then(|| 1u32 << class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_names_and_unknown_ones_their_numbers() {
        assert_eq!(command::name(command::PLT), "PLT");
        assert_eq!(command::name(9), "command 9");
        assert_eq!(opcode::name(opcode::BASE_SP), "sp");
        assert_eq!(
            opcode::name(opcode::BASE_FP | opcode::FLAG_DEREF),
            "deref fp"
        );
        assert_eq!(opcode::name(0x17), "opcode 0x17");
        assert_eq!(program::name(program::PYTHON), "python");
        assert_eq!(program::name(program::GO_LABELS), "golabels");
        assert_eq!(program::name(42), "program 42");
        assert_eq!(inclusive_range(0xfab70, 0x1054c1), "0xfab70..=0x1054c1");
    }

    #[test]
    fn flatten_lays_the_elements_end_to_end() {
        assert_eq!(
            flatten([1u32, 0x0203_0405].into_iter()),
            [1, 0, 0, 0, 5, 4, 3, 2]
        );
        assert!(flatten(std::iter::empty::<u64>()).is_empty());
    }

    #[test]
    fn encoded_commands_are_the_kernel_values() {
        // spec/UPSTREAM_FACTS.md, "Encoded command values": what the BPF
        // unwinder compares a delta with.
        use encoded_command::*;
        assert_eq!(
            [INVALID, STOP, PLT, SIGNAL, FRAME_POINTER],
            [0x8000, 0x8001, 0x8002, 0x8003, 0x8004]
        );
    }

    fn round_trip<T: Wire + PartialEq + core::fmt::Debug>(v: T) {
        let bytes = v.to_bytes();
        assert_eq!(bytes.len(), T::SIZE);
        assert_eq!(T::read(&bytes), Some(v));
        assert_eq!(T::read(&bytes[1..]), None, "a short buffer must not decode");
    }

    #[test]
    fn wire_round_trips() {
        // The plain keys and values of the hash and array maps.
        round_trip(0x0102_0304u32);
        round_trip(0x0102_0304_0506_0708u64);
        round_trip(StackDelta {
            addr_low: 0xbeef,
            unwind_info: 0x8003,
        });
        round_trip(StackDeltaPageKey {
            file_id: 0x0102_0304_0506_0708,
            page: 0x7f00_0001_0000,
        });
        round_trip(StackDeltaPageInfo {
            first_delta: 0x00ab_cdef,
            num_deltas: 65535,
            map_id: 23,
        });
        round_trip(UnwindInfo {
            opcode: 2,
            fp_opcode: 1,
            merge_opcode: 0x81,
            pad: 0,
            param: -8,
            fp_param: i32::MIN,
        });
        round_trip(OffsetRange {
            lower_offset1: 1,
            upper_offset1: 2,
            lower_offset2: 3,
            upper_offset2: 4,
            program_index: program::PYTHON,
            pad: [0; 6],
        });
    }

    #[test]
    fn process_mappings_round_trip_and_are_found_by_bisection() {
        let m = |start: u64, end: u64, file_id| ProcessMapping {
            start,
            end,
            file_offset: 0x1000,
            bias: start - 0x1000,
            file_id,
        };
        let list = ProcessMappings {
            mappings: vec![m(0x1000, 0x2000, 1), m(0x5000, 0x8000, 2)],
        };
        let bytes = list.to_bytes();
        assert_eq!(bytes.len(), 8 + 40 * MAX_PROCESS_MAPPINGS);
        assert_eq!(&bytes[..4], &2u32.to_le_bytes(), "the count first");
        assert_eq!(&bytes[8..16], &0x1000u64.to_le_bytes(), "then the mappings");
        assert_eq!(ProcessMappings::read(&bytes), Some(list.clone()));
        let mut too_many = bytes.clone();
        too_many[..4].copy_from_slice(&(MAX_PROCESS_MAPPINGS as u32 + 1).to_le_bytes());
        assert_eq!(ProcessMappings::read(&too_many), None);
        assert_eq!(ProcessMappings::read(&bytes[1..]), None);
        let found = |pc| list.find(pc).map(|m| m.file_id);
        assert_eq!(found(0xfff), None);
        assert_eq!(found(0x1000), Some(1));
        assert_eq!(found(0x1fff), Some(1));
        assert_eq!(found(0x2000), None, "end is exclusive");
        assert_eq!(found(0x7fff), Some(2));
        assert_eq!(found(u64::MAX), None);
    }

    #[test]
    fn encodings_are_little_endian_in_field_order() {
        let info = UnwindInfo {
            opcode: 0x82,
            fp_opcode: 3,
            merge_opcode: 0x81,
            pad: 0,
            param: 0x0102_0304,
            fp_param: -2,
        };
        assert_eq!(
            info.to_bytes(),
            [0x82, 3, 0x81, 0, 4, 3, 2, 1, 0xfe, 0xff, 0xff, 0xff]
        );
        let page = StackDeltaPageInfo {
            first_delta: 0x0403_0201,
            num_deltas: 0x0605,
            map_id: 0x0807,
        };
        assert_eq!(page.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    /// Upstream's getMapID vectors (spec 3.2).
    #[test]
    fn size_class_matches_upstream_vectors() {
        let vectors: [(u32, Option<u16>); 12] = [
            (0, Some(8)),
            (1, Some(8)),
            (2, Some(8)),
            (0xFF, Some(8)),
            (0x100, Some(9)),
            (0x1FF, Some(9)),
            (0x200, Some(10)),
            (0x3FF, Some(10)),
            (0x400, Some(11)),
            (0xFFFFF, Some(20)),
            ((1 << 23) - 1, Some(23)),
            (1 << 24, None),
        ];
        for (n, want) in vectors {
            assert_eq!(size_class(n), want, "size_class({n:#x})");
        }
        assert_eq!(size_class(1 << 23), None);
    }

    #[test]
    fn class_arrays_are_strictly_larger_than_their_tables() {
        for n in [0u32, 1, 255, 256, 65535, 65536, (1 << 23) - 1] {
            let class = size_class(n).expect("within range");
            assert!(class_entries(class).expect("a class") > n);
        }
        for class in [0, 7, 24, 40, u16::MAX] {
            assert_eq!(class_entries(class), None);
        }
    }
}
