//! tracefs, which the events program's tracepoints need (aya reads each
//! tracepoint's id there): used where it is mounted, mounted at the
//! kernel's own place, `/sys/kernel/tracing`, when nothing is (as systemd
//! does at boot; a container or a minimal system may not have).

use std::io;
use std::path::{Path, PathBuf};

/// Where the kernel creates tracefs's mount point.
pub const TRACEFS: &str = "/sys/kernel/tracing";
/// The same, for mount(2) (checked equal below).
const TRACEFS_C: &std::ffi::CStr = c"/sys/kernel/tracing";
/// Where it is found under debugfs on older systems.
pub const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Why tracefs could not be found or mounted.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error("{} does not exist (a kernel without tracefs?)", path.display())]
    NoMountPoint { path: PathBuf },
    #[error("mounting tracefs on {}: {error}", path.display())]
    Mount { path: PathBuf, error: io::Error },
}

/// Whether `path` is a mounted tracefs (or anything not empty: an empty
/// directory is the bare mount point).
fn mounted(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_some())
}

/// Makes sure tracefs is mounted; `Some(path)` when this call mounted it.
pub fn ensure() -> Result<Option<PathBuf>, TracefsError> {
    if mounted(Path::new(TRACEFS)) || mounted(Path::new(DEBUGFS_TRACING)) {
        return Ok(None);
    }
    let path = PathBuf::from(TRACEFS);
    if !path.is_dir() {
        return Err(TracefsError::NoMountPoint { path });
    }
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: NUL-terminated literals; no data.
    let rc = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            TRACEFS_C.as_ptr(),
            c"tracefs".as_ptr(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::Mount {
            path,
            error: io::Error::last_os_error(),
        });
    }
    Ok(Some(path))
}

#[test]
fn the_mount_point_is_spelled_once() {
    assert_eq!(TRACEFS_C.to_str(), Ok(TRACEFS));
}
