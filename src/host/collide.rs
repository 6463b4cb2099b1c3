//! The I/O of [`super::claims`]: whether a file is trusted, its stamp, and
//! whether it has an owner's bytes where the owner's analysis read.
//!
//! **Trusted** means no one but root could have chosen its bytes: owned by
//! root, writable by no one else (no group or other write bit), and every
//! directory from the process's root down to it owned by root and
//! writable by no one else (so no one else could have put it there under
//! its name); the name, resolved inside the process's root, must still be
//! the file (device and inode) the process maps. A deleted file (no links
//! left) is judged by itself: no directory holds it any more. Anything
//! that cannot be checked is untrusted.

use std::fs::{File, Metadata};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path};

use eim_analysis::elf::digest::SourceDigest;
use eim_analysis::elf::{ByteSource, SourceError};

use super::claims::{FileKey, Stamp};
use super::open::{root_of, under_root};

/// Path components walked at most (a bound on a hostile path's cost).
const MAX_DEPTH: usize = 64;

/// The stamp of an opened file.
pub fn stamp_of(meta: &Metadata) -> Stamp {
    Stamp {
        key: FileKey {
            dev: meta.dev(),
            inode: meta.ino(),
        },
        size: meta.size(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
    }
}

/// Owned by root and writable by no one else.
fn root_only(meta: &Metadata) -> bool {
    meta.uid() == 0 && meta.permissions().mode() & 0o022 == 0
}

/// Whether `meta`, the file process `pid` maps at `path` (as the process
/// sees it), is trusted (see the module documentation).
pub fn trusted(pid: i32, path: &Path, meta: &Metadata) -> bool {
    if !meta.is_file() || !root_only(meta) {
        return false;
    }
    if meta.nlink() == 0 {
        return true;
    }
    let root = root_of(pid);
    let mut here = std::path::PathBuf::from("/");
    let mut depth = 0;
    // The root itself, then each directory down to the file's.
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() && root_only(&m) => {}
        _ => return false,
    }
    let Some(parent) = path.parent() else {
        return false;
    };
    for component in parent.components() {
        match component {
            Component::RootDir => continue,
            Component::Normal(name) => here.push(name),
            // A path from /proc/PID/maps is absolute and canonical.
            _ => return false,
        }
        depth += 1;
        if depth > MAX_DEPTH {
            return false;
        }
        match std::fs::symlink_metadata(under_root(&root, &here)) {
            Ok(m) if m.is_dir() && root_only(&m) => {}
            _ => return false,
        }
    }
    // The name must still be this file: a file renamed away from a
    // checked directory proves nothing about where it came from.
    match std::fs::symlink_metadata(under_root(&root, path)) {
        Ok(m) => m.is_file() && m.dev() == meta.dev() && m.ino() == meta.ino(),
        Err(_) => false,
    }
}

/// An opened file read with `pread`.
struct Pread<'f>(&'f File);

impl ByteSource for Pread<'_> {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        self.0
            .read_exact_at(buf, offset)
            .map_err(|e| SourceError::Io {
                offset,
                len: buf.len() as u64,
                message: e.to_string(),
            })
    }
}

/// Whether `file` (`len` bytes) has `digest`'s bytes in its ranges. An
/// error (unreadable, or shorter than it said) is the caller's to treat as
/// "not the same".
pub fn same_bytes(file: &File, len: u64, digest: &SourceDigest) -> Result<bool, SourceError> {
    digest.matches(len, &Pread(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> i32 {
        std::process::id() as i32
    }

    #[test]
    fn a_system_library_is_trusted_and_a_users_copy_is_not() {
        // The test's own executable's C library, root's on any test host.
        let lib = [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists());
        let Some(lib) = lib else {
            eprintln!("SKIPPED: no libc.so.6 at the usual places");
            return;
        };
        let real = std::fs::canonicalize(lib).expect("canonical");
        let meta = std::fs::metadata(&real).expect("stat");
        if meta.uid() != 0 {
            eprintln!("SKIPPED: {} is not root's here", real.display());
            return;
        }
        assert!(trusted(me(), &real, &meta));

        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("libc.so.6");
        std::fs::copy(&real, &copy).expect("copy");
        let meta = std::fs::metadata(&copy).expect("stat");
        // A copy in a temporary directory: /tmp is writable by everyone
        // (and the copy is the test user's unless the tests run as root).
        assert!(!trusted(me(), &copy, &meta));

        // Group- or other-writable: never trusted, wherever it is.
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let meta = std::fs::metadata(&copy).expect("stat");
        assert!(!root_only(&meta));
    }

    #[test]
    fn a_name_that_no_longer_names_the_file_is_not_trusted() {
        let meta = std::fs::metadata("/proc/self/exe").expect("stat");
        // Whatever the executable is, a made-up name under / is not it.
        assert!(!trusted(me(), Path::new("/nonexistent-eim/x"), &meta));
    }
}
