//! [`KernelStacks`]: the BPF unwinder's stacks of a process, walked in the
//! kernel by the task iterator over real maps that a host step filled for
//! that process (its files' tables and its `eim_process_mappings` entry).

use eim_machine::unwind::Stack;

use crate::bpf::KernelMaps;
use crate::host::scan::HostManager;

use super::{freeze, StackError, StackSource};

/// The task iterator over `manager`'s kernel maps.
pub struct KernelStacks<'a> {
    manager: &'a HostManager<KernelMaps>,
}

impl<'a> KernelStacks<'a> {
    pub fn new(manager: &'a HostManager<KernelMaps>) -> Self {
        Self { manager }
    }
}

impl StackSource for KernelStacks<'_> {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn unwind(&self, pid: i32) -> Result<Vec<Stack>, StackError> {
        // Stopped first: the registers a thread entered the kernel with
        // are its user registers only while it stays there, and its stack
        // must not change under the walk.
        let frozen = freeze::Frozen::process(pid)?;
        let stacks = self
            .manager
            .with_backend(|timed| timed.inner.task_stacks(pid as u32))
            .map_err(|e| StackError::Backend {
                pid,
                message: e.to_string(),
            })?;
        drop(frozen);
        Ok(stacks)
    }
}
