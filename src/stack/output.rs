//! What `eim stack` prints: per thread its name, its frames with file,
//! function (as gdb names it, and as the file spells it), source line and
//! the functions inlined there, and why the walk stopped; as text
//! (pstack's layout) or JSON.

use std::fmt::Write as _;

use eim_machine::unwind::{frame_flag, lookup_code, Frame, Stack, StopReason};
use serde::Serialize;

use super::symbols::{FunctionName, Symbolizer};
use crate::host::procs::ExecMapping;

/// One process's stacks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessStacks {
    pub pid: i32,
    pub backend: &'static str,
    pub threads: Vec<ThreadStack>,
}

/// One thread's stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadStack {
    pub tid: u32,
    pub comm: String,
    /// [`StopReason::name`].
    pub stop: &'static str,
    /// For `no-delta`: the lookup's `ERR_NATIVE_*` name.
    pub stop_detail: Option<&'static str>,
    pub frames: Vec<StackFrame>,
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StackFrame {
    pub pc: u64,
    /// The mapped file's path (as the process sees it).
    pub file: Option<String>,
    /// The host file id the unwinder found, 16 hex digits.
    pub file_id: Option<String>,
    /// The ELF address the unwinder computed.
    pub address: Option<u64>,
    /// The function as gdb names it (demangled).
    pub symbol: Option<String>,
    /// The function as the file spells it (mangled; `name@plt` for a PLT
    /// stub).
    pub system_name: Option<String>,
    /// From the start of the symbol table's function.
    pub symbol_offset: Option<u64>,
    /// The source file and line of the PC in the function (from DWARF;
    /// where functions are inlined there, of the call to the outermost).
    pub source_file: Option<String>,
    pub source_line: Option<u32>,
    /// The functions inlined at this PC, innermost first: gdb's inline
    /// frames above this one, at the same PC.
    pub inlined: Vec<FunctionName>,
}

fn comm(pid: i32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end_matches('\n').to_owned())
        .unwrap_or_default()
}

pub(super) fn thread_stack(
    pid: i32,
    stack: &Stack,
    mappings: &[ExecMapping],
    symbolizer: &mut Symbolizer,
) -> ThreadStack {
    ThreadStack {
        tid: stack.tid,
        comm: comm(pid, stack.tid),
        stop: stack.stop.name(),
        stop_detail: match stack.stop {
            StopReason::NoDelta(code) => Some(lookup_code::name(code).unwrap_or("ERR_UNKNOWN")),
            _ => None,
        },
        frames: stack
            .frames
            .iter()
            .map(|f| frame(pid, f, mappings, symbolizer))
            .collect(),
    }
}

fn frame(pid: i32, f: &Frame, mappings: &[ExecMapping], symbolizer: &mut Symbolizer) -> StackFrame {
    let known = f.file_id != 0;
    let mut out = StackFrame {
        pc: f.pc,
        file: None,
        file_id: known.then(|| format!("{:016x}", f.file_id)),
        address: known.then_some(f.address),
        symbol: None,
        system_name: None,
        symbol_offset: None,
        source_file: None,
        source_line: None,
        inlined: Vec::new(),
    };
    let Some(m) = mapping_of(mappings, f.pc) else {
        return out;
    };
    out.file = Some(m.path.to_string_lossy().into_owned());
    let symbols = match symbolizer.file(pid, m) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("{e}");
            return out;
        }
    };
    // The ELF address from the file itself (also for a frame the unwinder
    // found in no mapping it knew).
    let Some(address) = symbols.elf_address(m, f.pc) else {
        return out;
    };
    // A return address may be the first byte after a call that ends its
    // function: its function is the one of the byte before.
    let probe = if f.flags & frame_flag::RETURN_ADDRESS != 0 {
        address.saturating_sub(1)
    } else {
        address
    };
    // A return address that is a function's first byte (the signal
    // trampoline a handler returns to, `__restore_rt`) is that function's.
    let (probe, found) = match symbols.symbolize(probe) {
        None if probe != address => (address, symbols.symbolize(address)),
        found => (probe, found),
    };
    if let Some(found) = found {
        out.symbol = Some(found.function.name);
        out.system_name = Some(found.function.system_name);
        out.symbol_offset = found.offset.map(|o| o + (address - probe));
        out.source_file = found.function.file;
        out.source_line = found.function.line;
        out.inlined = found.inlined;
    }
    out
}

/// pstack's layout: a header per thread, one line per frame, then why the
/// walk stopped.
pub fn render_text(stacks: &ProcessStacks) -> String {
    let mut s = String::new();
    for t in &stacks.threads {
        let _ = writeln!(s, "Thread {} ({}):", t.tid, t.comm);
        for (i, f) in t.frames.iter().enumerate() {
            // gdb's inline frames: the same PC, above the frame they are in.
            for inlined in &f.inlined {
                let _ = write!(s, "#{i:<3} {:#018x} {} [inlined]", f.pc, inlined.name);
                source(&mut s, inlined.file.as_deref(), inlined.line);
                s.push('\n');
            }
            let _ = write!(s, "#{i:<3} {:#018x}", f.pc);
            match (&f.symbol, f.symbol_offset) {
                (Some(name), Some(off)) => {
                    let _ = write!(s, " {name}+{off:#x}");
                }
                (Some(name), None) => {
                    let _ = write!(s, " {name}");
                }
                _ => s.push_str(" ??"),
            }
            if let Some(file) = &f.file {
                let _ = write!(s, " ({file})");
            }
            source(&mut s, f.source_file.as_deref(), f.source_line);
            s.push('\n');
        }
        let _ = match t.stop_detail {
            Some(detail) => writeln!(s, "stopped: {}: {detail}", t.stop),
            None => writeln!(s, "stopped: {}", t.stop),
        };
    }
    s
}

/// ` at FILE:LINE`, as gdb shows a frame's source.
fn source(s: &mut String, file: Option<&str>, line: Option<u32>) {
    match (file, line) {
        (Some(file), Some(line)) => {
            let _ = write!(s, " at {file}:{line}");
        }
        (Some(file), None) => {
            let _ = write!(s, " at {file}");
        }
        _ => {}
    }
}

/// The mapping of `mappings` containing `pc`.
fn mapping_of(mappings: &[ExecMapping], pc: u64) -> Option<&ExecMapping> {
    mappings.iter().find(|m| m.contains(pc))
}
