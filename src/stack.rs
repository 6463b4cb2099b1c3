//! `eim stack`: every thread's user stack of one process, unwound with
//! eim's own tables (the native unwinder of issue 19) and symbolized from
//! the files' symbol tables.
//!
//! A [`StackSource`] produces the raw [`Stack`]s: [`SimStacks`] runs the
//! user-space twin (`eim_machine::unwind::unwind`) over a simulated kernel's
//! tables and the process's real memory while its threads are stopped
//! ([`freeze`]); the kernel source (the BPF task iterator) plugs in here
//! too. [`stacks`] adds what a reader needs: thread names, files, symbols.

pub mod freeze;
pub mod kernel;
pub mod memory;
pub mod output;
pub mod refusal;
pub mod regs;
pub mod symbols;

use eim_machine::unwind::{unwind, Mappings, Rules, Stack, StopReason};

use crate::host::procs::{self, ProcessError};

pub use output::{ProcessStacks, StackFrame, ThreadStack};

/// Why no stacks could be produced.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(transparent)]
    Freeze(#[from] freeze::FreezeError),
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("process {pid}: {message}")]
    Backend { pid: i32, message: String },
}

/// Where stacks come from.
pub trait StackSource {
    /// `sim` or `kernel`, for the output.
    fn name(&self) -> &'static str;
    /// One stack per thread of process `pid`.
    fn unwind(&self, pid: i32) -> Result<Vec<Stack>, StackError>;
}

/// The user-space twin over a simulated kernel: its tables (`rules`, a
/// `SimReader`) and its process mapping table (`mappings`); the registers
/// and memory are the real process's, read while it is stopped.
pub struct SimStacks<'a> {
    rules: &'a dyn Rules,
    mappings: &'a dyn Mappings,
}

impl<'a> SimStacks<'a> {
    pub fn new(rules: &'a dyn Rules, mappings: &'a dyn Mappings) -> Self {
        Self { rules, mappings }
    }
}

impl StackSource for SimStacks<'_> {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn unwind(&self, pid: i32) -> Result<Vec<Stack>, StackError> {
        let frozen = freeze::Frozen::process(pid)?;
        let memory = memory::ProcMemory::open(pid)?;
        let upid = pid as u32;
        let stacks = frozen
            .tids()
            .map(|tid| match regs::thread_regs(tid) {
                Ok(regs) => unwind(upid, tid as u32, regs, self.rules, &memory, self.mappings),
                Err(e) => {
                    tracing::debug!("{e}");
                    Stack {
                        pid: upid,
                        tid: tid as u32,
                        frames: Vec::new(),
                        stop: StopReason::NoRegs,
                    }
                }
            })
            .collect();
        // The threads run again before symbolization (files only from here).
        drop(frozen);
        Ok(stacks)
    }
}

/// Every thread's stack of process `pid` from `source`, with thread names,
/// files and symbols.
pub fn stacks(pid: i32, source: &dyn StackSource) -> Result<ProcessStacks, StackError> {
    let raw = source.unwind(pid)?;
    // The mappings after the walk: the same ones unless the process mapped
    // or unmapped code meanwhile (a frame in such a mapping then has no file).
    // The vDSO with the files: its frames are named `[vdso]` and by its
    // symbols (`host::open` reads its image from the process's memory).
    let mappings = procs::exec_mappings(pid)?.into_loadable();
    let mut symbolizer = symbols::Symbolizer::new();
    let threads = raw
        .iter()
        .map(|stack| output::thread_stack(pid, stack, &mappings, &mut symbolizer))
        .collect();
    Ok(ProcessStacks {
        pid,
        backend: source.name(),
        threads,
    })
}
