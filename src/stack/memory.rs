//! A process's memory as the unwinder's [`Memory`]: `pread` on
//! `/proc/PID/mem` (never a mapping of it), each read 8 bytes; a read that
//! fails or comes back short is `None`, as a failed BPF read is.

use std::fs::File;
use std::os::unix::fs::FileExt;

use eim_machine::unwind::Memory;

/// `/proc/PID/mem` could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("process {pid}: cannot open /proc/{pid}/mem: {cause}")]
pub struct MemoryError {
    pub pid: i32,
    pub cause: std::io::Error,
}

/// The memory of one process (readable while it is ptrace-stopped by us,
/// or by a caller with CAP_SYS_PTRACE).
#[derive(Debug)]
pub struct ProcMemory {
    file: File,
}

impl ProcMemory {
    pub fn open(pid: i32) -> Result<Self, MemoryError> {
        let file =
            File::open(format!("/proc/{pid}/mem")).map_err(|cause| MemoryError { pid, cause })?;
        Ok(Self { file })
    }
}

impl Memory for ProcMemory {
    fn read_u64(&self, address: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        // /proc/PID/mem takes the address as the file offset; addresses at
        // or above 2^63 are not user space, and pread refuses them anyway.
        let n = self.file.read_at(&mut word, address).ok()?;
        (n == word.len()).then(|| u64::from_le_bytes(word))
    }
}
