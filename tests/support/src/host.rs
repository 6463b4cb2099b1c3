//! A big host in one process: distinct shared libraries of `/usr` mapped
//! executable into the calling process, as a process that had loaded them
//! would show in `/proc/self/maps` (shared by the tests and benches that
//! measure eim at host scale).

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

/// One page of each of up to `n` distinct ELF files named `*.so*` under
/// `/usr/lib`, `/usr/lib64` and `/usr/libexec`, mapped read and execute
/// (never read through or executed); unmapped when dropped.
pub struct Libraries {
    at: Vec<usize>,
}

impl Libraries {
    pub fn map(n: usize) -> Self {
        let mut at = Vec::new();
        let mut seen = HashSet::new();
        let mut stack: Vec<PathBuf> = ["/usr/lib", "/usr/lib64", "/usr/libexec"]
            .iter()
            .map(PathBuf::from)
            .collect();
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            entries.sort();
            for path in entries {
                if at.len() >= n {
                    return Self { at };
                }
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !meta.is_file() || !name.contains(".so") || meta.len() < 4096 {
                    continue;
                }
                if !seen.insert((meta.dev(), meta.ino())) {
                    continue;
                }
                let Ok(file) = std::fs::File::open(&path) else {
                    continue;
                };
                let mut magic = [0u8; 4];
                if file.read_exact_at(&mut magic, 0).is_err() || magic != *crate::elf::MAGIC {
                    continue;
                }
                // SAFETY: a private, read-and-execute mapping of a file we
                // opened; never read through or executed, only left in
                // place for eim to see, and unmapped by `drop`.
                let addr = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ | libc::PROT_EXEC,
                        libc::MAP_PRIVATE,
                        file.as_raw_fd(),
                        0,
                    )
                };
                if addr != libc::MAP_FAILED {
                    at.push(addr as usize);
                }
            }
        }
        Self { at }
    }

    /// How many were mapped.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether none could be mapped.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

impl Drop for Libraries {
    fn drop(&mut self) {
        for &addr in &self.at {
            // SAFETY: a mapping `map` made, of one page, unmapped once.
            unsafe {
                libc::munmap(addr as *mut libc::c_void, 4096);
            }
        }
    }
}
