//! The pinned maps read without owning them: what an owner left (or is
//! writing) in a pin directory, as a [`Dump`], and the lookup program run
//! over them ([`PinnedReader`]).
//!
//! A reader never takes the owner's exclusive lock: it asks for the shared
//! one without waiting ([`crate::lock::read_lock`]), so it can neither
//! block a running owner nor be refused by one, and it changes nothing.
//! Every pin is first opened read-only (`BPF_F_RDONLY`) and checked; inner
//! arrays are opened by the ids the outer maps hold, which needs
//! CAP_SYS_ADMIN. Read while an owner writes, the maps may be caught
//! between two ops of a plan (safe for the unwinder, but a table may be
//! published before its pages, or left after them, for a moment); read
//! after it exited, they are what it left.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use aya::maps::MapData;
use aya::{Ebpf, EbpfLoader};
use eim_core::FileId;

use crate::error::KernelError;
use crate::lock::{self, ReadLock};
use crate::lookup::LookupResult;
use crate::maps::{
    dump_from, open_by_id, read_deltas, run_lookup, take, Dump, DumpSource, KernelConfig,
    LOOKUP_OBJECT, PROGRAM, RESULT_MAP,
};
use crate::sys;

/// One pin, opened read-only and checked.
struct Pin {
    name: String,
    fd: OwnedFd,
    max_entries: u32,
}

/// Opens every map eim pins in `dir` read-only. A pin missing, not a map,
/// or of another type, key size or value size than eim's is an error (its
/// capacity may be any: the maps of a start with other capacities read the
/// same way).
fn open_pins(dir: &Path) -> Result<Vec<Pin>, KernelError> {
    let mut pins = Vec::new();
    for (name, want) in KernelConfig::default().owned_maps() {
        let path = dir.join(&name);
        let pin_error = |errno: i32, what| KernelError::Pin {
            path: path.clone(),
            what,
            cause: std::io::Error::from_raw_os_error(errno),
        };
        let fd = sys::obj_get_with(&path, sys::BPF_F_RDONLY)
            .map_err(|e| pin_error(e.errno, "opening the pin read-only"))?;
        let info =
            sys::map_info(fd.as_fd()).map_err(|e| pin_error(e.errno, "reading the map info of"))?;
        let shape = crate::pin::MapShape {
            max_entries: info.max_entries,
            ..want
        };
        if let Some(why) = shape.mismatch(&info) {
            return Err(crate::error::ShapeMismatch {
                dir: dir.to_path_buf(),
                maps: vec![(name, why)],
            }
            .into());
        }
        pins.push(Pin {
            name,
            fd,
            max_entries: info.max_entries,
        });
    }
    Ok(pins)
}

/// Reads every map eim pins in `dir` (see `open_pins` for what is
/// refused).
pub fn dump_pinned(dir: &Path) -> Result<Dump, KernelError> {
    dump_pins(&open_pins(dir)?)
}

fn dump_pins(pins: &[Pin]) -> Result<Dump, KernelError> {
    let [pages, unwind_info, interpreter_offsets, outers @ .., process_mappings] = pins else {
        return Err(KernelError::Missing("the pinned maps".into()));
    };
    let source = DumpSource {
        pages: pages.fd.as_fd(),
        unwind_info: unwind_info.fd.as_fd(),
        unwind_entries: unwind_info.max_entries,
        interpreter_offsets: interpreter_offsets.fd.as_fd(),
        outers: outers.iter().map(|pin| pin.fd.as_fd()).collect(),
        process_mappings: process_mappings.fd.as_fd(),
    };
    let mut tables = 0;
    let mut dump = dump_from(&source, |class, file_id, id| {
        tables += 1;
        let inner = open_by_id(class, file_id, id)?;
        read_deltas(inner.as_fd(), class)
    })?;
    dump.live_inner_maps = tables;
    Ok(dump)
}

/// The pinned maps of a directory, read as the profiler's BPF program
/// reads them: dumped, and looked up through eim's lookup program loaded
/// over the pins themselves.
pub struct PinnedReader {
    dir: PathBuf,
    pins: Vec<Pin>,
    ebpf: Ebpf,
    result: MapData,
    /// Last: released after every map's fd is closed.
    lock: ReadLock,
}

impl PinnedReader {
    /// Opens the maps pinned in `dir` (resolved as an owner resolves it, so
    /// that both find the same lock), after asking for the shared lock.
    pub fn open(dir: &Path) -> Result<Self, KernelError> {
        let dir = lock::resolve(dir).map_err(|e| KernelError::Pin {
            path: dir.to_path_buf(),
            what: "resolving the pin directory",
            cause: e,
        })?;
        let lock = lock::read_lock(&dir)?;
        let pins = open_pins(&dir)?;
        // The program's map references are relocated to the pins: aya
        // re-opens a pin that exists. Every pin was just seen to exist,
        // and while this reader holds the shared lock no owner can start
        // and replace one (an owner never removes its pins).
        let mut loader = EbpfLoader::new();
        for pin in &pins {
            loader.map_max_entries(&pin.name, pin.max_entries);
            loader.map_pin_path(&pin.name, dir.join(&pin.name));
        }
        let mut ebpf = loader.load(LOOKUP_OBJECT)?;
        let program: &mut aya::programs::RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| KernelError::Missing(format!("program {PROGRAM}")))?
            .try_into()?;
        program.load()?;
        let result = take(&mut ebpf, RESULT_MAP)?;
        Ok(Self {
            dir,
            pins,
            ebpf,
            result,
            lock,
        })
    }

    /// The pin directory, resolved.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the shared lock said: whether an owner runs, and who.
    pub fn lock(&self) -> &ReadLock {
        &self.lock
    }

    /// The capacity of `unwind_info_array` as pinned.
    pub fn unwind_slots(&self) -> u32 {
        self.pins.get(1).map_or(0, |pin| pin.max_entries)
    }

    /// Reads every map.
    pub fn dump(&self) -> Result<Dump, KernelError> {
        dump_pins(&self.pins)
    }

    /// Runs the lookup program over the pins for `address` of `file_id`.
    pub fn lookup(&self, file_id: FileId, address: u64) -> Result<LookupResult, KernelError> {
        run_lookup(&self.ebpf, &self.result, file_id, address)
    }

    /// Runs the unwinder over the pins and `capture`
    /// ([`KernelMaps::unwind_capture`](crate::KernelMaps::unwind_capture)).
    pub fn unwind_capture(
        &mut self,
        capture: &eim_core::unwind::Capture,
    ) -> Result<eim_core::unwind::Stack, KernelError> {
        crate::unwind::run_capture(&mut self.ebpf, capture)
    }

    /// The stack of every thread of `pid`, walked over the pins
    /// ([`KernelMaps::task_stacks`](crate::KernelMaps::task_stacks)).
    pub fn task_stacks(&mut self, pid: u32) -> Result<Vec<eim_core::unwind::Stack>, KernelError> {
        crate::unwind::task_stacks(&mut self.ebpf, pid)
    }
}
