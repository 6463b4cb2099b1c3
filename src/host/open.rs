//! Opening the file behind a process's mapping the way a profiler must.
//!
//! First through `/proc/PID/map_files/START-END`: the kernel's own link to
//! the mapped file, right even when the file was deleted or replaced on
//! disk, or lives in another container's mount namespace. Reading those
//! links needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE), so without them
//! eim falls back to `/proc/PID/root/PATH`, the path inside the process's
//! root. The path may now name another file (replaced by a package update,
//! or a different file of the same name in another container): the file
//! opened is used only if its device and inode are the ones the kernel
//! recorded for the mapping.
//!
//! Both ways go through [`crate::files::opener`]: the `map_files` link
//! (the kernel's) is followed to an `O_PATH` descriptor, and the root path
//! is resolved inside the process's root through root's links only; in
//! both, the type and the device and inode are checked on that descriptor
//! before the file is opened for reading. A FIFO or a device a process
//! maps, or plants where its mapped file was, is never opened.
//!
//! The vDSO has no file: its image is read from the process's memory into
//! a sealed memory file ([`super::vdso`]), reached [`Via::Memory`].
//!
//! Caveat: on overlayfs, `/proc/PID/maps` shows the underlying file's device
//! while a path lookup gives the overlay's, so the fallback refuses such
//! files (reported as "not the file mapped"); `map_files` has no such
//! problem, which is why it is tried first.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::procs::ExecMapping;
use super::vdso::{self, VdsoError};
use crate::files::opener::{self, OpenerError, Root};

/// How a file was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    MapFiles,
    Root,
    /// The vDSO's image, read from the process's memory.
    Memory,
}

/// Which ways to try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenStrategy {
    /// `map_files`, then the root path (the default).
    MapFilesThenRoot,
    /// The root path only (what an unprivileged eim can do; tests use it
    /// to check the fallback).
    RootOnly,
}

/// What identifies a file's contents cheaply: if all four are unchanged,
/// its file id is too (the cache key of [`super::fileids`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i128,
}

impl Identity {
    /// The identity of an opened file, from its metadata.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// A mapping's file, opened and checked.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub via: Via,
    pub identity: Identity,
}

/// Why a mapping's file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("process {pid}: {} has gone", path.display())]
    Vanished { pid: i32, path: PathBuf },
    #[error("process {pid}: {} is not the file mapped (mapped device {}:{} inode {}, found device {}:{} inode {}): replaced on disk or seen through another mount", path.display(), mapped.0, mapped.1, mapped_inode, found.0, found.1, found_inode)]
    NotTheMappedFile {
        pid: i32,
        path: PathBuf,
        mapped: (u32, u32),
        mapped_inode: u64,
        found: (u32, u32),
        found_inode: u64,
    },
    /// Through the process's root, the kernel checks ptrace read access
    /// to the process first, then the file's own permissions.
    #[error("process {pid}: permission denied opening {}: it needs CAP_SYS_PTRACE or running as the process's user, and read permission on the file", path.display())]
    PermissionDenied { pid: i32, path: PathBuf },
    /// The opener refused it: not a regular file, a link a user planted.
    #[error("process {pid}: {} refused: {reason}", path.display())]
    Refused {
        pid: i32,
        path: PathBuf,
        reason: String,
    },
    #[error("process {pid}: cannot open {}: {cause}", path.display())]
    Io {
        pid: i32,
        path: PathBuf,
        cause: io::Error,
    },
}

impl OpenError {
    /// Whether the file (or its process) is simply gone: counted, not
    /// reported as a failure.
    pub fn is_vanished(&self) -> bool {
        matches!(self, Self::Vanished { .. })
    }

    /// The reason without the process and path: the same for every
    /// mapping refused the same way, so that a summary can group them.
    pub fn cause(&self) -> String {
        match self {
            Self::Vanished { .. } => "gone".into(),
            Self::NotTheMappedFile { .. } => {
                "not the file mapped: replaced on disk or seen through another mount".into()
            }
            Self::PermissionDenied { .. } => "permission denied: it needs CAP_SYS_PTRACE or running as the process's user, and read permission on the file".into(),
            Self::Refused { reason, .. } => format!("refused: {reason}"),
            Self::Io { cause, .. } => format!("cannot open: {cause}"),
        }
    }
}

/// The process's root directory in our mount namespace.
pub fn root_of(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root"))
}

/// `path` (absolute, as the process sees it) under `root`. Only for
/// `lstat` of components already checked one by one (`host::collide`):
/// opening goes through `files::opener`, which resolves links in the root.
pub fn under_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn classify(pid: i32, path: &Path, e: OpenerError) -> OpenError {
    if e.is_refusal() {
        return OpenError::Refused {
            pid,
            path: path.to_path_buf(),
            reason: e.reason(),
        };
    }
    let e = io::Error::from(e);
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => OpenError::Vanished {
            pid,
            path: path.to_path_buf(),
        },
        io::ErrorKind::PermissionDenied => OpenError::PermissionDenied {
            pid,
            path: path.to_path_buf(),
        },
        _ if e.raw_os_error() == Some(libc::ESRCH) => OpenError::Vanished {
            pid,
            path: path.to_path_buf(),
        },
        _ => OpenError::Io {
            pid,
            path: path.to_path_buf(),
            cause: e,
        },
    }
}

fn dev_pair(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

/// Where a mapping's file is looked for.
enum At<'a> {
    /// The kernel's link, `/proc/PID/map_files/START-END`.
    Link(&'a Path),
    /// The mapping's path inside the process's root.
    InRoot,
}

/// Finds the file `mapping` names, checks that it is the file mapped
/// (before opening it: a FIFO or device is never opened), and opens it.
fn open_checked(pid: i32, mapping: &ExecMapping, at: At<'_>) -> Result<Opened, OpenError> {
    let name = &mapping.path;
    let (located, via) = match at {
        At::Link(link) => (opener::locate(link), Via::MapFiles),
        At::InRoot => (
            Root::open(&root_of(pid)).and_then(|root| root.locate(name)),
            Via::Root,
        ),
    };
    let located = located.map_err(|e| classify(pid, name, e))?;
    let meta = located.metadata();
    let found = dev_pair(meta.dev());
    if found != mapping.dev || meta.ino() != mapping.inode {
        return Err(OpenError::NotTheMappedFile {
            pid,
            path: name.clone(),
            mapped: mapping.dev,
            mapped_inode: mapping.inode,
            found,
            found_inode: meta.ino(),
        });
    }
    let (file, meta) = located.open().map_err(|e| classify(pid, name, e))?;
    Ok(Opened {
        file,
        via,
        identity: Identity::of(&meta),
    })
}

/// The vDSO mapping's image in a memory file of its own.
fn open_vdso(pid: i32, mapping: &ExecMapping) -> Result<Opened, OpenError> {
    let path = || mapping.path.clone();
    let file = vdso::open_process_image(pid, mapping.start, mapping.end).map_err(|e| match e {
        VdsoError::Vanished { .. } | VdsoError::Short { .. } => {
            OpenError::Vanished { pid, path: path() }
        }
        e => OpenError::Io {
            pid,
            path: path(),
            cause: io::Error::other(e.to_string()),
        },
    })?;
    let meta = file.metadata().map_err(|cause| OpenError::Io {
        pid,
        path: path(),
        cause,
    })?;
    Ok(Opened {
        file,
        via: Via::Memory,
        identity: Identity::of(&meta),
    })
}

/// Opens the file `mapping` of process `pid` maps (see the module
/// documentation for the order and the checks).
pub fn open_mapping(
    pid: i32,
    mapping: &ExecMapping,
    strategy: OpenStrategy,
) -> Result<Opened, OpenError> {
    if mapping.is_vdso() {
        return open_vdso(pid, mapping);
    }
    if strategy == OpenStrategy::MapFilesThenRoot {
        let link = PathBuf::from(format!(
            "/proc/{pid}/map_files/{}",
            mapping.map_files_name()
        ));
        match open_checked(pid, mapping, At::Link(&link)) {
            // Without the capability, or with the mapping gone (unmapped,
            // or the process exiting): the root path may still work.
            Err(OpenError::PermissionDenied { .. } | OpenError::Vanished { .. }) => {}
            other => return other,
        }
    }
    open_checked(pid, mapping, At::InRoot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::procs;

    fn own_exe_mapping() -> (i32, ExecMapping) {
        let me = std::process::id() as i32;
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        let m = procs::exec_mappings(me)
            .expect("maps")
            .files
            .into_iter()
            .find(|m| m.path == exe)
            .expect("own executable mapped");
        (me, m)
    }

    #[test]
    fn both_ways_open_the_mapped_file() {
        let (me, m) = own_exe_mapping();
        let by_root = open_mapping(me, &m, OpenStrategy::RootOnly).expect("root path");
        assert_eq!(by_root.via, Via::Root);
        assert_eq!(by_root.identity.inode, m.inode);
        // map_files needs CAP_SYS_ADMIN; without it the root path is used.
        let best = open_mapping(me, &m, OpenStrategy::MapFilesThenRoot).expect("opened");
        assert_eq!(best.identity, by_root.identity);
    }

    #[test]
    fn a_file_replaced_on_disk_is_not_taken_for_the_mapped_one() {
        let (me, mut m) = own_exe_mapping();
        // The kernel says another inode is mapped there: what the path
        // names now is a different file.
        m.inode ^= 1;
        let e = open_mapping(me, &m, OpenStrategy::RootOnly).expect_err("mismatch");
        assert!(matches!(e, OpenError::NotTheMappedFile { .. }), "{e}");
        assert!(e.to_string().contains(&m.path.display().to_string()), "{e}");
        // Through map_files (as root) the mapping's range no longer names
        // this inode either: the same refusal, never a wrong file.
        let e = open_mapping(me, &m, OpenStrategy::MapFilesThenRoot).expect_err("mismatch");
        assert!(matches!(e, OpenError::NotTheMappedFile { .. }), "{e}");
    }

    #[test]
    fn a_fifo_where_the_mapped_file_was_is_refused_unopened() {
        let (me, mut m) = own_exe_mapping();
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("exe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        m.path = fifo;
        // A blocking open of a FIFO without a writer would never return.
        let e = open_mapping(me, &m, OpenStrategy::RootOnly).expect_err("a FIFO");
        assert!(matches!(e, OpenError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("not a regular file: a FIFO"), "{e}");
    }

    #[test]
    fn the_vdso_opens_as_its_image_in_memory() {
        let me = std::process::id() as i32;
        let m = procs::exec_mappings(me)
            .expect("maps")
            .vdso
            .expect("a vDSO");
        let opened = open_mapping(me, &m, OpenStrategy::RootOnly).expect("opened");
        assert_eq!(opened.via, Via::Memory);
        assert_eq!(opened.identity.size, m.end - m.start);
        let mut magic = [0; 4];
        std::os::unix::fs::FileExt::read_exact_at(&opened.file, &mut magic, 0).expect("read");
        assert_eq!(&magic, b"\x7fELF");
    }

    #[test]
    fn a_deleted_file_is_vanished() {
        let (me, mut m) = own_exe_mapping();
        m.path = PathBuf::from("/nonexistent/eim/exe");
        m.start = 1;
        m.end = 2;
        let e = open_mapping(me, &m, OpenStrategy::MapFilesThenRoot).expect_err("gone");
        assert!(e.is_vanished(), "{e}");
    }
}
