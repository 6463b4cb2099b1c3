//! CPython (`libpython3.N*`, or a `python3.N` executable that does not link
//! one).
//!
//! Extracts the version from the file name (as upstream does; 3.6 to 3.13),
//! the patch level from `Py_Version` when the file has it (3.11+), the
//! address of `_PyRuntime` (3.7+), the address of the thread-state key that
//! `PyGILState_GetThisThreadState` reads (x86-64 and arm64, the `tss` module), and
//! asks for `_PyEval_EvalFrameDefault` (else `PyEval_EvalFrameEx`) in
//! `interpreter_offsets` (program 4). On x86-64 the second range is the
//! `.cold` part of the evaluation loop: the FDE that covers the first jump
//! target outside the function (upstream looks for it on x86-64 only).
//! It also reads the layouts CPython publishes of its code, frame and bytes
//! objects (`types`) and, from 3.13, the address of `_Py_NoneStruct`
//! (the top frame's code object is `None` there, where unwinding stops).
//!
//! A key that cannot be found is an error, as upstream's loader makes it
//! (and like the missing symbols of spec 11, O8): the Python unwinder
//! finds a thread's frames only through that key, so handing the
//! evaluation loop's frames to it without one would lose them all, where
//! without the file's `interpreter_offsets` they are at least unwound
//! natively. The error names the stub, so a new code shape shows up as
//! such instead of as empty Python stacks.

mod tss;
pub(crate) mod types;

use std::collections::BTreeMap;

use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, OpKind};

use super::access::{read_u32, Relocations, Symbol, Symbols};
use super::names::{PYTHON_EXE, PYTHON_LIB};
use super::InterpreterData;
use super::{InterpreterOffsets, Loaded, LoaderError, LoaderInfo, Version};
use crate::elf::ehframe::lookup_fde;
use crate::elf::{Arch, Elf};
use eim_machine::abi::program;

pub const NAME: &str = "python";

/// Bytes of the evaluation loop decoded in search of its cold part.
const MAX_LOOP_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonData {
    /// Major and minor from the name; the patch level from `Py_Version`.
    pub version: Version,
    pub(crate) runtime: Option<u64>,
    /// Address of the `pthread_key_t` `PyGILState_GetThisThreadState`
    /// reads (inside `_PyRuntime` from 3.7 on).
    pub(crate) tss_key: u64,
    pub(crate) eval_loop: Symbol,
    pub(crate) cold: Option<std::ops::Range<u64>>,
    /// `PyCode_Type`, `PyFrame_Type`, `PyBytes_Type` -> their layouts.
    pub types: BTreeMap<&'static str, types::TypeLayout>,
    /// `_Py_NoneStruct` (3.13+).
    pub none_struct: Option<u64>,
}

impl InterpreterData for PythonData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("version", self.version()),
            ("tss key", super::hex(self.tss_key)),
            ("eval loop", self.eval_loop.fact()),
            ("type layouts", self.types.len().to_string()),
        ];
        if let Some(r) = self.runtime {
            out.push(("runtime", super::hex(r)));
        }
        if let Some(c) = &self.cold {
            out.push((
                "cold code",
                eim_machine::abi::inclusive_range(c.start, c.end),
            ));
        }
        out
    }
}

/// The version in the name, if the file is a python file.
fn version_from_name(info: &LoaderInfo<'_, '_>) -> Result<Option<(u32, u32)>, LoaderError> {
    let caps = match PYTHON_LIB.captures(info.name) {
        Some(caps) => caps,
        None => {
            let Some(caps) = PYTHON_EXE.captures(info.name) else {
                return Ok(None);
            };
            let links_lib = info
                .elf
                .needed()
                .iter()
                .any(|lib| PYTHON_LIB.is_match(&String::from_utf8_lossy(lib)));
            if links_lib {
                return Ok(None);
            }
            caps
        }
    };
    let part = |i: usize| -> Result<u32, LoaderError> {
        caps.get(i)
            .and_then(|m| m.as_str().parse().ok())
            .ok_or_else(|| LoaderError::Invalid(format!("no version in the name {}", info.name)))
    };
    Ok(Some((part(1)?, part(2)?)))
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    let Some((major, minor)) = version_from_name(info)? else {
        return Ok(None);
    };
    Version(major, minor, 0).check(Version(3, 6, 0), Version(3, 14, 0), "3.6 to 3.13")?;
    let syms = info.symbols();
    let elf = info.elf;
    let mut version = Version(major, minor, 0);
    if let Some(sym) = syms.get("Py_Version") {
        // PY_VERSION_HEX: 0xMMmmppLS.
        let hex = read_u32(elf, sym.address, "Py_Version")?;
        let (m, n) = (hex >> 24, (hex >> 16) & 0xff);
        if (m, n) != (major, minor) {
            return Err(LoaderError::Invalid(format!(
                "Py_Version says {m}.{n} but the name says {major}.{minor}"
            )));
        }
        version.2 = (hex >> 8) & 0xff;
    }
    let runtime = if (major, minor) >= (3, 7) {
        Some(syms.require("_PyRuntime")?.address)
    } else {
        None
    };
    let tss_key = tss_key(elf, syms)?;
    let eval_loop = syms
        .get("_PyEval_EvalFrameDefault")
        .or_else(|| syms.get("PyEval_EvalFrameEx"))
        .ok_or_else(|| LoaderError::MissingSymbol("_PyEval_EvalFrameDefault".into()))?;
    let cold = match elf.arch {
        Arch::X86_64 => cold_range(elf, eval_loop),
        Arch::Aarch64 => None,
    };
    let relocations = Relocations::of(elf);
    let mut layouts = BTreeMap::new();
    for name in types::TYPES {
        layouts.insert(name, types::layout(elf, syms, &relocations, name)?);
    }
    let none_struct = if (major, minor) >= (3, 13) {
        Some(syms.require("_Py_NoneStruct")?.address)
    } else {
        None
    };
    let offsets = InterpreterOffsets {
        program: program::PYTHON,
        first: eval_loop.range(),
        second: cold.clone(),
    };
    Ok(Some(Loaded::new(
        PythonData {
            version,
            runtime,
            tss_key,
            eval_loop,
            cold,
            types: layouts,
            none_struct,
        },
        Some(offsets),
    )))
}

/// The first near branch of `func` whose target lies outside it.
fn external_jump_target(elf: &Elf<'_>, func: Symbol) -> Option<u64> {
    let len = func.size.min(MAX_LOOP_BYTES);
    let code = elf.virtual_memory(func.address, len as usize)?;
    let mut decoder = Decoder::with_ip(64, &code, func.address, DecoderOptions::NONE);
    let range = func.range();
    // One instruction per step, each at least one byte: bounded by `len`.
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.code() == Code::INVALID {
            continue;
        }
        // Near-branch operands belong to jumps, calls and loops: skip calls.
        let jump = insn.op0_kind() == OpKind::NearBranch64 && insn.mnemonic() != Mnemonic::Call;
        if jump {
            let target = insn.near_branch_target();
            if !range.contains(&target) {
                return Some(target);
            }
        }
    }
    None
}

/// The `.cold` part of the evaluation loop: the FDE covering its first
/// external jump target.
fn cold_range(elf: &Elf<'_>, func: Symbol) -> Option<std::ops::Range<u64>> {
    let target = external_jump_target(elf, func)?;
    let fde = lookup_fde(elf, target).ok()??;
    Some(fde.start..fde.start.saturating_add(fde.len))
}

/// The address of the TSS key, found in `PyGILState_GetThisThreadState`.
pub fn tss_key(elf: &Elf<'_>, syms: &Symbols<'_>) -> Result<u64, LoaderError> {
    const STUB: &str = "PyGILState_GetThisThreadState";
    let stub = syms.require(STUB)?;
    tss::key_of(elf, stub).ok_or_else(|| {
        LoaderError::Invalid(format!(
            "{STUB} at {:#x} shows no thread-state key this loader can follow",
            stub.address
        ))
    })
}
