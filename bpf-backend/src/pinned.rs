//! The pinned maps read without owning them: what an owner left (or is
//! writing) in a pin directory, as a [`Dump`].
//!
//! A reader takes no lock ([`crate::lock`]): it can neither block an owner
//! nor be refused by one, and it changes nothing. Every pin and inner array
//! is opened read-only (`BPF_F_RDONLY`); inner arrays are opened by the ids
//! the outer maps hold, which needs CAP_SYS_ADMIN. Read while an owner
//! writes, the maps may be caught between two ops of a plan; read after it
//! exited, they are what it left.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::error::KernelError;
use crate::maps::{dump_from, open_by_id, read_deltas, Dump, DumpSource, KernelConfig};
use crate::sys;

/// Reads every map eim pins in `dir`. A pin missing, not a map, or of
/// another type, key size or value size than eim's is an error (its
/// capacity may be any: the maps of a start with other capacities read
/// the same way).
pub fn dump_pinned(dir: &Path) -> Result<Dump, KernelError> {
    let mut fds: Vec<(OwnedFd, u32)> = Vec::new();
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
        fds.push((fd, info.max_entries));
    }
    let [(pages, _), (unwind_info, unwind_entries), (interpreter_offsets, _), outers @ ..] =
        fds.as_slice()
    else {
        return Err(KernelError::Missing("the pinned maps".into()));
    };
    let source = DumpSource {
        pages: pages.as_fd(),
        unwind_info: unwind_info.as_fd(),
        unwind_entries: *unwind_entries,
        interpreter_offsets: interpreter_offsets.as_fd(),
        outers: outers.iter().map(|(fd, _)| fd.as_fd()).collect(),
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
