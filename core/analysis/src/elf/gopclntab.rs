//! Go's `.gopclntab` (spec 5.6): stack deltas for the Go functions of a
//! binary, as upstream's SEED revision extracts them.
//!
//! Go code keeps frame pointers, so most functions get one FRAME_POINTER
//! delta; assembly (`.s` files) and a few Go files known to clobber the
//! frame pointer get exact stack-pointer deltas from the pc → SP-delta
//! tables instead, and on arm64 before Go 1.21 every function does. A few
//! runtime functions end a stack (STOP) or are signal trampolines (SIGNAL).
//!
//! The parser borrows the table bytes (zero-copy) and checks every offset:
//! hostile input gives an error or a harmless result, never a panic. Parts:
//! * `go/locate.rs`: where the table is (section, symbols, heuristic scan);
//! * `go/table.rs`: the header and the function, name and file tables;
//! * `go/pcvalue.rs`: the pc-value table decoder;
//! * `go/buildinfo.rs`: the Go version from the build information.
//!
//! Upstream (SEED) behaviour kept on purpose, so the lists stay identical:
//! * a function without an SP table gets no delta (the previous rule runs
//!   on over it);
//! * an SP table that ends before its first step yields one delta at
//!   address 0 with the initial value −1 (SP + 7 on x86-64), appended out of
//!   order;
//! * Go 1.18+ pcs are relative to the header's text start even when it is
//!   0 (Go 1.26 writes 0; HEAD reads the text start elsewhere, SEED not);
//! * a pc-value walk runs to the table's terminating zero byte, not to the
//!   function's end.
//!
//! Deliberate difference: all walks of a file together may take at most
//! [`STEPS_PER_TABLE_BYTE`] steps per byte of the table. Real tables are
//! walked about once per byte (the linker shares a table between functions
//! only when it is identical, usually tiny); a crafted file whose functions
//! all share one long table would otherwise cost functions × table length.
//!
//! Where upstream would panic (an offset outside its slice), eim returns
//! `GoError::Corrupt`.

#[path = "go/buildinfo.rs"]
mod buildinfo;
#[path = "go/error.rs"]
mod error;
#[path = "go/locate.rs"]
mod locate;
#[path = "go/pcvalue.rs"]
mod pcvalue;
#[path = "go/table.rs"]
mod table;

pub(crate) use error::GoError;

use std::collections::HashMap;
use std::ops::Range;

use super::{Arch, Elf};
use eim_machine::abi::{opcode, UnwindInfo};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use pcvalue::PcValue;
use table::{Pclntab, Version};

/// How the functions of one source file are unwound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// One FRAME_POINTER delta per function.
    FramePointer,
    /// SP deltas, and the caller's frame pointer recovered from the frame.
    DeltasWithFrame,
    /// SP deltas only.
    DeltasWithoutFrame,
}

/// Go files (by path suffix) whose functions call assembly that clobbers
/// the frame pointer on x86-64: unwound with SP deltas, frame pointer
/// recovered.
const X86_FRAME_CLOBBERING_FILES: [&[u8]; 6] = [
    b"/src/crypto/sha1/sha1.go",
    b"/src/crypto/sha256/sha256.go",
    b"/src/crypto/sha512/sha512.go",
    b"/src/crypto/elliptic/p256_asm.go",
    b"golang.org/x/crypto/curve25519/curve25519_amd64.go",
    b"golang.org/x/crypto/chacha20poly1305/chacha20poly1305_amd64.go",
];

/// The strategy for the functions of `source_file` (upstream's
/// `getSourceFileStrategy`).
pub(crate) fn source_file_strategy(arch: Arch, source_file: &[u8], default: Strategy) -> Strategy {
    if arch != Arch::X86_64 {
        return default;
    }
    if source_file.ends_with(b".s") {
        return Strategy::DeltasWithoutFrame;
    }
    if X86_FRAME_CLOBBERING_FILES
        .iter()
        .any(|suffix| source_file.ends_with(suffix))
    {
        return Strategy::DeltasWithFrame;
    }
    default
}

/// Runtime functions that get one command delta and nothing else.
const SPECIAL_FUNCTIONS: [(&[u8], UnwindInfo); 6] = [
    (b"runtime.mstart", info::STOP),
    (b"runtime.goexit", info::STOP),
    (b"runtime.mcall", info::STOP),
    (b"runtime.systemstack", info::STOP),
    (b"runtime.sigreturn", info::SIGNAL),
    (b"runtime.sigreturn__sigaction", info::SIGNAL),
];

fn special_function(names: &[u8], name_off: i32) -> Option<UnwindInfo> {
    let tail = names.get(usize::try_from(name_off).ok()?..)?;
    // Every special name starts with "runtime.": most functions stop here
    // (most at the first byte).
    if tail.first() != Some(&b'r') || !tail.starts_with(b"runtime.") {
        return None;
    }
    // The letter after "runtime." tells most of the others apart.
    let letter = tail.get(8).copied();
    SPECIAL_FUNCTIONS
        .iter()
        .filter(|(name, _)| name.get(8).copied() == letter)
        .find(|(name, _)| table::c_string_is(tail, 0, name))
        .map(|&(_, info)| info)
}

/// How many pc-value steps per byte of `.gopclntab` one file may take in
/// all, so that extraction stays linear in the input.
pub const STEPS_PER_TABLE_BYTE: usize = 16;

/// Appends the SP-delta rules of one function's pc → SP table, spending
/// one unit of `budget` per step.
fn add_sp_deltas(
    data: &mut IntervalData,
    arch: Arch,
    mut p: PcValue<'_>,
    strategy: Strategy,
    budget: &mut usize,
) -> Result<(), GoError> {
    let with_frame = strategy == Strategy::DeltasWithFrame;
    let mut hints = hint::KEEP;
    loop {
        *budget = budget.checked_sub(1).ok_or_else(|| {
            GoError::Corrupt(
                ".gopclntab pc-value tables are walked too often (shared tables?)".into(),
            )
        })?;
        let info = match arch {
            Arch::X86_64 => {
                let param = p.value.wrapping_add(8);
                let mut info = UnwindInfo {
                    opcode: opcode::BASE_SP,
                    param,
                    ..UnwindInfo::default()
                };
                if with_frame && param >= 16 {
                    // The caller's frame pointer sits just below the return
                    // address.
                    info.fp_opcode = opcode::BASE_CFA;
                    info.fp_param = -16;
                }
                info
            }
            Arch::Aarch64 if p.value == 0 => info::LR,
            Arch::Aarch64 => {
                let mut info = UnwindInfo {
                    opcode: opcode::BASE_SP,
                    param: p.value,
                    ..UnwindInfo::default()
                };
                if with_frame {
                    // The caller's return address is at the top of the stack.
                    info.fp_opcode = opcode::BASE_SP;
                    info.fp_param = 0;
                }
                info
            }
        };
        data.add(StackDelta::new(p.pc_start, hints, info));
        hints = hint::NONE;
        if !p.step() {
            return Ok(());
        }
    }
}

/// The Go toolchain version recorded in the file's build information (for
/// example `go1.23.5`), or `None` when it has none or it cannot be read.
pub fn go_version<'d>(elf: &Elf<'d>) -> Option<&'d [u8]> {
    buildinfo::go_version(elf)
}

/// Whether a note segment of the file holds Go's build-id note
/// (`.note.go.buildid`, which the Go linker writes into every ELF file).
pub(crate) fn has_go_build_id_note(elf: &Elf<'_>) -> bool {
    buildinfo::has_build_id_note(elf)
}

/// What the Go interpreter loader learns from the table: its size in bytes
/// and its number of functions; `None` when the file has no Go table.
pub(crate) fn table_summary(elf: &Elf<'_>) -> Result<Option<(usize, usize)>, GoError> {
    let Some(bytes) = locate::pclntab_bytes(elf)? else {
        return Ok(None);
    };
    let table = Pclntab::parse(bytes)?;
    Ok(Some((bytes.len(), table.num_funcs)))
}

/// The code range of the Go function named `name` (its entry to the next
/// function's), by the table's own names, which stripping a binary keeps;
/// `None` when the file has no table or no such function. One pass over the
/// function table: bounded by its size.
pub(crate) fn function_range(elf: &Elf<'_>, name: &[u8]) -> Result<Option<Range<u64>>, GoError> {
    let Some(bytes) = locate::pclntab_bytes(elf)? else {
        return Ok(None);
    };
    let table = Pclntab::parse(bytes)?;
    for i in 0..table.num_funcs {
        let Some((_, func_off)) = table.func_map_entry(i) else {
            continue;
        };
        let Some(func) = table.func(func_off) else {
            continue;
        };
        if table::c_string_is(table.funcnametab(), i64::from(func.name_off), name) {
            let end = table.func_map_entry(i + 1).map_or(func.entry, |(pc, _)| pc);
            return Ok(Some(func.entry..end.max(func.entry)));
        }
    }
    Ok(None)
}

/// The per-file default strategy (spec 5.6): frame pointers, except on
/// arm64 before Go 1.21.
fn default_strategy(elf: &Elf<'_>, version: Version) -> Strategy {
    let untrusted_arm64_fp = elf.arch == Arch::Aarch64
        && match version {
            Version::Go12 | Version::Go116 | Version::Go118 => true,
            Version::Go120 => buildinfo::before_arm64_frame_pointers(buildinfo::go_version(elf)),
        };
    if untrusted_arm64_fp {
        Strategy::DeltasWithFrame
    } else {
        Strategy::FramePointer
    }
}

/// Adds the deltas of the Go functions to `data` (with [`IntervalData::add`],
/// in address order) and ends them with an INVALID delta at the end of the
/// last function. Returns the text range the table covers, `[first function,
/// end of the last)`, whose FDEs the caller drops; `None` (and no deltas) if
/// the file has no Go table.
pub fn extract(elf: &Elf<'_>, data: &mut IntervalData) -> Result<Option<Range<u64>>, GoError> {
    let Some(bytes) = locate::pclntab_bytes(elf)? else {
        return Ok(None);
    };
    let table = Pclntab::parse(bytes)?;
    // About one delta per function (more with SP tables).
    eim_machine::deltas::DeltaSink::reserve_hint(data, table.num_funcs.saturating_add(1));
    let default = default_strategy(elf, table.version);
    extract_from(elf.arch, default, &table, data).map(Some)
}

/// Strategies by file index: the last one asked for, then a hash map
/// with a multiplicative hash (the keys are small integers from the file).
#[derive(Default)]
struct StrategyCache {
    last: Option<(i64, Strategy)>,
    map: HashMap<i64, Strategy, std::hash::BuildHasherDefault<IntHasher>>,
}

impl StrategyCache {
    #[inline]
    fn get(&mut self, file_index: i64, compute: impl FnOnce() -> Strategy) -> Strategy {
        if let Some((index, strategy)) = self.last {
            if index == file_index {
                return strategy;
            }
        }
        let strategy = *self.map.entry(file_index).or_insert_with(compute);
        self.last = Some((file_index, strategy));
        strategy
    }
}

/// Hashes one integer key by a multiplication (Fibonacci hashing).
#[derive(Default)]
struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_i64(&mut self, n: i64) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The per-function walk over a parsed table.
fn extract_from(
    arch: Arch,
    default: Strategy,
    table: &Pclntab<'_>,
    data: &mut IntervalData,
) -> Result<Range<u64>, GoError> {
    let names = table.funcnametab();
    let adds_cu_offset = table.version >= Version::Go116;
    // Strategy per file index: few distinct files, many functions, and
    // neighbours mostly from the same file.
    let mut strategies = StrategyCache::default();
    // One step always consumes a table byte, so +num_funcs covers empty tables.
    let mut budget = (table.pctab_len() + table.num_funcs).saturating_mul(STEPS_PER_TABLE_BYTE);

    for i in 0..table.num_funcs {
        let (map_pc, func_off) = table
            .func_map_entry(i)
            .ok_or_else(|| GoError::Corrupt(format!(".gopclntab func {i} entry is missing")))?;
        let func = match table.func(func_off) {
            Some(f) if f.entry == map_pc => f,
            other => {
                return Err(GoError::Corrupt(format!(
                    ".gopclntab func {i} descriptor is invalid (pc {map_pc:x}/{:x})",
                    other.map_or(0, |f| f.entry)
                )))
            }
        };
        let entry = func.entry;

        if let Some(info) = special_function(names, func.name_off) {
            data.add(StackDelta::new(entry, hint::NONE, info));
            continue;
        }

        let mut strategy = default;
        if func.pcfile_off != 0 {
            let pcfile = table.pcvalue_table(func.pcfile_off).ok_or_else(|| {
                GoError::Corrupt(format!(
                    ".gopclntab func {i} pcfile offset ({}) is invalid",
                    func.pcfile_off
                ))
            })?;
            let first = PcValue::new(pcfile, entry, table.quantum);
            let mut file_index = i64::from(first.value);
            if adds_cu_offset {
                file_index += i64::from(func.cu_off);
            }
            strategy = strategies.get(file_index, || {
                source_file_strategy(arch, table.file_name(file_index), default)
            });
        }

        if strategy == Strategy::FramePointer {
            data.add(StackDelta::new(entry, hint::NONE, info::FRAME_POINTER));
            continue;
        }
        if func.pcsp_off == 0 {
            // No SP table: the previous rule runs on (as upstream).
            continue;
        }
        let pcsp = table.pcvalue_table(func.pcsp_off).ok_or_else(|| {
            GoError::Corrupt(format!(
                ".gopclntab func {i} pcsp offset ({}) is invalid",
                func.pcsp_off
            ))
        })?;
        add_sp_deltas(
            data,
            arch,
            PcValue::new(pcsp, entry, table.quantum),
            strategy,
            &mut budget,
        )?;
    }

    let start = table.func_map_entry(0).map(|(pc, _)| pc);
    let end = table.func_map_entry(table.num_funcs).map(|(pc, _)| pc);
    let (Some(start), Some(end)) = (start, end) else {
        // Unreachable: parse() checked the table holds num_funcs + 1 entries.
        return Err(GoError::Corrupt(".gopclntab end entry is missing".into()));
    };
    data.add(StackDelta::new(end, hint::NONE, info::INVALID));
    Ok(start..end)
}

#[cfg(test)]
#[path = "go/tests.rs"]
mod tests;
