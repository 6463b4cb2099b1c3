//! The mapped files of sampled frames, as a pprof mapping names them: where
//! the process maps the file (start, limit, file offset), its path, its
//! GNU build id, and whether it is the process's executable (pprof takes
//! the first mapping for the main binary).
//!
//! Each process's executable mappings are read from `/proc/PID/maps` once,
//! and again at most once per batch of samples when a frame falls outside
//! all of them (the process mapped new code). A file's build id is read
//! once per file (device, inode): opened the way every file of a process
//! is ([`open_mapping`]), only its headers and note segments read.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::sync::Arc;

use eim_analysis::elf::build_id;

use crate::host::open::{open_mapping, OpenStrategy};
use crate::host::procs::{self, ExecMapping};

/// Processes whose mappings are kept; past this the cache starts over (a
/// host of many short-lived processes must not grow it without bound).
const MAX_PROCESSES: usize = 65_536;

/// One mapping of a file, as pprof's `Mapping` describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappedFile {
    pub start: u64,
    /// One past the mapping's last byte.
    pub limit: u64,
    /// The file offset mapped at `start`.
    pub offset: u64,
    /// The path as the process sees it.
    pub path: String,
    /// The GNU build id in hex, if the file has one and could be read.
    pub build_id: Option<String>,
    /// Whether the file is the process's executable (`/proc/PID/exe`).
    pub main: bool,
}

/// A process's executable mappings and the batch they were read in.
struct ProcessMaps {
    mappings: Vec<(ExecMapping, Arc<MappedFile>)>,
    batch: u64,
}

/// The mapped files of every process sampled.
#[derive(Default)]
pub struct Binaries {
    processes: HashMap<u32, ProcessMaps>,
    /// By (device, inode): the build id in hex, `None` if there is none.
    build_ids: HashMap<((u32, u32), u64), Option<String>>,
}

impl Binaries {
    /// The mapping of process `pid` holding `pc` in batch `batch`, with
    /// the kernel's description of it (to open the file).
    pub fn find(
        &mut self,
        pid: u32,
        pc: u64,
        batch: u64,
    ) -> Option<(ExecMapping, Arc<MappedFile>)> {
        let known = self.processes.get(&pid);
        let hit = known.and_then(|p| p.mappings.iter().find(|(m, _)| m.contains(pc)));
        if let Some(hit) = hit {
            return Some(hit.clone());
        }
        if known.is_some_and(|p| p.batch == batch) {
            return None;
        }
        let mappings = self.read(pid);
        if self.processes.len() >= MAX_PROCESSES {
            self.processes.clear();
        }
        let hit = mappings.iter().find(|(m, _)| m.contains(pc)).cloned();
        self.processes.insert(pid, ProcessMaps { mappings, batch });
        hit
    }

    /// Process `pid`'s executable file mappings now (none once it is gone).
    fn read(&mut self, pid: u32) -> Vec<(ExecMapping, Arc<MappedFile>)> {
        let Ok(found) = procs::exec_mappings(pid as i32) else {
            return Vec::new();
        };
        let exe = std::fs::metadata(format!("/proc/{pid}/exe"))
            .ok()
            .map(|m| ((libc::major(m.dev()), libc::minor(m.dev())), m.ino()));
        // The vDSO too (`[vdso]`, read from the process's memory).
        found
            .into_loadable()
            .into_iter()
            .map(|m| {
                let key = (m.dev, m.inode);
                let build_id = self
                    .build_ids
                    .entry(key)
                    .or_insert_with(|| read_build_id(pid, &m))
                    .clone();
                let file = MappedFile {
                    start: m.start,
                    limit: m.end,
                    offset: m.offset,
                    path: m.path.to_string_lossy().into_owned(),
                    build_id,
                    main: exe == Some(key),
                };
                (m, Arc::new(file))
            })
            .collect()
    }
}

/// The build id of the file `mapping` of process `pid` maps, in hex.
fn read_build_id(pid: u32, mapping: &ExecMapping) -> Option<String> {
    let opened = match open_mapping(pid as i32, mapping, OpenStrategy::MapFilesThenRoot) {
        Ok(opened) => opened,
        Err(e) => {
            tracing::debug!("build id of {}: {}", mapping.path.display(), e.cause());
            return None;
        }
    };
    let read = |at: u64, buf: &mut [u8]| read_full(&opened.file, at, buf);
    match build_id::gnu_build_id(read) {
        Ok(id) => id.map(|id| build_id::hex(&id)),
        Err(e) => {
            tracing::debug!("build id of {}: {e}", mapping.path.display());
            None
        }
    }
}

/// As much of `buf` as the file has at `at` (fewer bytes only at its end).
fn read_full(file: &std::fs::File, at: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    // Each turn reads at least a byte or stops: bounded by the buffer.
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_maps_its_executable_with_its_build_id() {
        let mut binaries = Binaries::default();
        let pid = std::process::id();
        let pc = this_process_maps_its_executable_with_its_build_id as fn() as usize as u64;
        let (mapping, file) = binaries.find(pid, pc, 1).expect("the test's own code");
        assert!(file.main, "{file:?}");
        assert!(mapping.contains(pc));
        assert_eq!((file.start, file.limit), (mapping.start, mapping.end));
        let exe = std::env::current_exe().expect("exe");
        let data = std::fs::read(&exe).expect("read exe");
        let object = object::File::parse(data.as_slice()).expect("an ELF file");
        let want = object::Object::build_id(&object)
            .expect("notes")
            .map(build_id::hex);
        assert!(want.is_some(), "rustc's linker writes a build id");
        assert_eq!(file.build_id, want);
        // Nothing is mapped at address 0: no mapping, and in the same batch
        // no second read.
        assert!(binaries.find(pid, 0, 1).is_none());
        assert!(binaries.find(u32::MAX, pc, 1).is_none(), "no such process");
    }
}
