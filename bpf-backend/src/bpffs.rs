//! The pin directory's file system: when eim mounts a bpffs for its pins,
//! and when it refuses to.
//!
//! A mount hides whatever the directory held and changes what every other
//! process sees there, so eim mounts only where that is harmless and asked
//! for:
//!
//! * a directory that already is on a bpffs is used as it is (its pins are
//!   eim's to check, [`crate::pin`]), unless that bpffs is read-only;
//! * under `/sys/fs/bpf`, the kernel's own mount point for a bpffs, a
//!   bpffs is mounted on `/sys/fs/bpf` itself when none is there yet (what
//!   systemd does at boot), and the pin directory is made inside it;
//! * anywhere else only when asked ([`crate::KernelConfig::mount_bpffs`],
//!   the CLI's `--mount-bpffs`), and then only on an **empty** directory
//!   (created if missing) of a writable file system.
//!
//! Everything else is refused with an error that says what to do
//! ([`MountError`]). A bpffs mounted by a start that then fails is
//! unmounted again ([`Mounted`]), so a failed start leaves the mounts as it
//! found them. eim mounts with `nosuid,nodev,noexec,mode=0700`, as systemd
//! mounts `/sys/fs/bpf`: the pins are root's alone.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::path_io::{io_error, PathIoError};

/// `BPF_FS_MAGIC`: the `f_type` of a bpffs in `statfs`.
pub const BPF_FS_MAGIC: u32 = 0xcafe_4a11;

/// The kernel's mount point for a bpffs.
pub const SYS_FS_BPF: &str = "/sys/fs/bpf";

/// Why eim did not set up the pin directory's bpffs.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("refusing to mount a bpffs on {}: it is not empty (it holds {count} {}, such as {example:?}), and the mount would hide them; pin in an empty directory, or in one that already is a bpffs", dir.display(), if *count == 1 { "entry" } else { "entries" })]
    NotEmpty {
        dir: PathBuf,
        count: usize,
        example: String,
    },
    #[error("refusing to use {} as the pin directory: it is on a read-only file system", dir.display())]
    ReadOnly { dir: PathBuf },
    #[error("the pin directory {} is not on a bpffs; mount one there ({}), or let eim mount it with --mount-bpffs", dir.display(), mount_command(dir, *exists))]
    NotAsked { dir: PathBuf, exists: bool },
    #[error("the pin directory {} is not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// The shell command that mounts a bpffs on `dir`.
fn mount_command(dir: &Path, exists: bool) -> String {
    let d = dir.display();
    if exists {
        format!("mount -t bpf bpf {d}")
    } else {
        format!("mkdir -p {d} && mount -t bpf bpf {d}")
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Whether `path` is on a bpffs.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    let c = c_path(path)?;
    // SAFETY: all-zero bytes are a valid `statfs`.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as u64 == u64::from(BPF_FS_MAGIC))
}

/// Whether `path` is on a file system mounted read-only.
pub fn is_read_only(path: &Path) -> io::Result<bool> {
    let c = c_path(path)?;
    // SAFETY: all-zero bytes are a valid `statvfs`.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is writable.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_flag & libc::ST_RDONLY != 0)
}

/// A bpffs this start mounted. Dropped without [`Mounted::keep`], it is
/// unmounted again (lazily: `MNT_DETACH`), so a start that fails after
/// mounting leaves no mount behind.
#[derive(Debug)]
pub struct Mounted {
    path: PathBuf,
    keep: bool,
}

impl Mounted {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the bpffs mounted for good; returns where it is.
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        std::mem::take(&mut self.path)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Ok(c) = c_path(&self.path) {
            // SAFETY: a NUL-terminated path. A failure leaves the mount,
            // which the next start uses as it is.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Mounts a bpffs on the directory `target` if it is empty and (unless
/// `any_fs`) not on a read-only file system.
pub fn mount_bpffs(target: &Path, any_fs: bool) -> Result<Mounted, MountError> {
    refuse_if_not_empty(target)?;
    if !any_fs && is_read_only(target).map_err(io_error("statvfs of", target))? {
        return Err(MountError::ReadOnly {
            dir: target.to_path_buf(),
        });
    }
    let c = c_path(target).map_err(io_error("mounting a bpffs on", target))?;
    // SAFETY: every pointer is a NUL-terminated string.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c.as_ptr(),
            c"bpf".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io_error("mounting a bpffs on", target)(io::Error::last_os_error()).into());
    }
    Ok(Mounted {
        path: target.to_path_buf(),
        keep: false,
    })
}

/// [`MountError::NotEmpty`] if the directory `dir` holds anything.
fn refuse_if_not_empty(dir: &Path) -> Result<(), MountError> {
    let mut entries = std::fs::read_dir(dir).map_err(io_error("listing the pin directory", dir))?;
    match entries.next() {
        None => Ok(()),
        Some(first) => {
            let first = first.map_err(io_error("listing the pin directory", dir))?;
            Err(MountError::NotEmpty {
                dir: dir.to_path_buf(),
                count: 1 + entries.count(),
                example: first.file_name().to_string_lossy().into_owned(),
            })
        }
    }
}

/// The nearest ancestor of `dir` that exists (`/` at worst).
fn nearest_existing(dir: &Path) -> &Path {
    dir.ancestors()
        .find(|a| a.symlink_metadata().is_ok())
        .unwrap_or(Path::new("/"))
}

/// Makes `dir` (absolute and resolved: [`crate::lock::resolve`]) a usable
/// pin directory on a bpffs under the rules of the module documentation.
/// Returns the bpffs mounted for it, if one was.
pub fn prepare(dir: &Path, mount_asked: bool) -> Result<Option<Mounted>, MountError> {
    let sys_root = Path::new(SYS_FS_BPF);
    let system = dir.starts_with(sys_root);
    let bpffs = |p: &Path| is_bpffs(p).map_err(io_error("statfs of", p));
    let read_only = |p: &Path| is_read_only(p).map_err(io_error("statvfs of", p));
    let mut mounted = None;
    if system && dir != sys_root && sys_root.is_dir() && !bpffs(sys_root)? {
        // Its underlying directory is sysfs's, which a container may mount
        // read-only: mounting on it is still what the kernel made it for.
        mounted = Some(mount_bpffs(sys_root, true)?);
    }
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(MountError::NotADirectory {
            dir: dir.to_path_buf(),
        }),
        Ok(_) if bpffs(dir)? => {
            if read_only(dir)? {
                return Err(MountError::ReadOnly {
                    dir: dir.to_path_buf(),
                });
            }
            Ok(mounted)
        }
        Ok(_) => {
            if !(mount_asked || system) {
                // Say first what the flag would not cure.
                refuse_if_not_empty(dir)?;
                if read_only(dir)? {
                    return Err(MountError::ReadOnly {
                        dir: dir.to_path_buf(),
                    });
                }
                return Err(MountError::NotAsked {
                    dir: dir.to_path_buf(),
                    exists: true,
                });
            }
            mount_bpffs(dir, dir == sys_root).map(Some)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let ancestor = nearest_existing(dir);
            if read_only(ancestor)? {
                return Err(MountError::ReadOnly {
                    dir: dir.to_path_buf(),
                });
            }
            let on_bpffs = bpffs(ancestor)?;
            if !(on_bpffs || mount_asked || system) {
                return Err(MountError::NotAsked {
                    dir: dir.to_path_buf(),
                    exists: false,
                });
            }
            std::fs::create_dir_all(dir).map_err(io_error("creating the pin directory", dir))?;
            if on_bpffs {
                return Ok(mounted);
            }
            mount_bpffs(dir, false).map(Some)
        }
        Err(e) => Err(io_error("stat of the pin directory", dir)(e).into()),
    }
}
