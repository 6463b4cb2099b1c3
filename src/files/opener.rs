//! The one way eim opens a file on a process's behalf (issue 28).
//!
//! eim runs as root and opens files that processes, and so their users,
//! name: the files they map, the debug files their `.gnu_debuglink` names.
//! A user controls the directories such a name passes through. Three rules
//! keep that from steering root:
//!
//! * **Resolved inside the process's root, through root's links only.** A
//!   path is resolved inside a directory treated as `/` ([`Root`], for
//!   example `/proc/PID/root`): `..` and absolute links stop at that root,
//!   `/proc`'s magic links are never followed, and a symbolic link is
//!   followed only if root owns it. Any user can plant a link
//!   (`shadowlink -> /etc/shadow`) where a process of theirs makes eim
//!   look; only root can plant a root-owned one, and distributions do
//!   (`/usr/lib/debug/.build-id/xx/yyy.debug -> ../../../..`), so refusing
//!   every link would lose real debug files. First `openat2(2)` with
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS` (the
//!   kernel refuses any link, atomically); a path it refuses for a link,
//!   and every path on a kernel without `openat2` (before 5.6, or a seccomp
//!   policy that denies it), is walked one component at a time with
//!   `O_PATH | O_NOFOLLOW`: each link is inspected on a descriptor of the
//!   link itself (owner and file system from `fstat`/`fstatfs`, its text
//!   from `readlinkat`), so what is checked is what is followed.
//! * **Its type checked before any open with side effects.** The path ends
//!   in an `O_PATH` descriptor, which opens nothing (a device's `open`, a
//!   FIFO's rendezvous and inotify's `IN_OPEN` do not happen). `fstat` on
//!   it must say regular file; the caller then checks what it must (the
//!   mapping's device and inode, the debug-file trust rule) on the same
//!   descriptor ([`Located::metadata`]).
//! * **Only then opened for reading**, through `/proc/self/fd/N` of that
//!   descriptor, `O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`, and the
//!   file opened must have the device and inode checked.
//!
//! Paths the operator gives (`eim inspect FILE`) and the kernel's own links
//! (`/proc/PID/map_files/START-END`, `/proc/PID/root`) are followed as
//! given ([`locate`]): the operator and the kernel are trusted, but their
//! paths get the same `O_PATH` check and reopen.

use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// At most this many symbolic links in one resolution (the kernel's
/// `MAXSYMLINKS`).
const MAX_LINKS: u32 = 40;

/// At most this many components walked in one resolution, links' texts
/// included: a bound on the work a crafted path or link can cause.
const MAX_STEPS: u32 = 4096;

/// A link's text is at most a path (`PATH_MAX` bytes with its NUL).
const MAX_LINK_TEXT: usize = 4096;

/// Cleared once `openat2` is found missing (ENOSYS, or denied by a
/// seccomp policy): every later resolution walks.
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// Why a file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenerError {
    #[error("{}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
    #[error("{}: not a regular file: {kind}", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{}: the symbolic link {} is owned by uid {uid}: only root's links are followed on a process's behalf", path.display(), link.display())]
    UntrustedLink {
        path: PathBuf,
        link: PathBuf,
        uid: u32,
    },
    #[error("{}: {} is a link of /proc: not followed on a process's behalf", path.display(), link.display())]
    MagicLink { path: PathBuf, link: PathBuf },
    #[error("{}: more than {MAX_LINKS} symbolic links or {MAX_STEPS} components", path.display())]
    TooManyLinks { path: PathBuf },
    #[error("{}: the file reopened (device {}, inode {}) is not the one checked (device {}, inode {})", path.display(), found.0, found.1, checked.0, checked.1)]
    Swapped {
        path: PathBuf,
        checked: (u64, u64),
        found: (u64, u64),
    },
}

impl OpenerError {
    /// The kind of failure, as an I/O error's kind: `NotFound` for a path
    /// that does not exist (or has gone), `InvalidInput` for anything that
    /// is not a regular file, `PermissionDenied` for a refused link.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            Self::Io { cause, .. } => cause.kind(),
            Self::NotRegular { .. } => io::ErrorKind::InvalidInput,
            Self::UntrustedLink { .. } | Self::MagicLink { .. } => io::ErrorKind::PermissionDenied,
            Self::TooManyLinks { .. } | Self::Swapped { .. } => io::ErrorKind::Other,
        }
    }

    /// The underlying errno, if the failure is the kernel's.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::Io { cause, .. } => cause.raw_os_error(),
            _ => None,
        }
    }

    /// Whether the path does not exist (any more).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
        )
    }

    /// Whether the refusal is this module's (a link, a type, a swap), not
    /// the kernel's: reported as such, never as a missing capability.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Io { .. })
    }

    /// The reason without the path (for callers that name the file
    /// themselves).
    pub fn reason(&self) -> String {
        match self {
            Self::Io { cause, .. } => cause.to_string(),
            Self::NotRegular { kind, .. } => format!("not a regular file: {kind}"),
            other => {
                let text = other.to_string();
                let path = other.path().display().to_string();
                text.strip_prefix(&format!("{path}: "))
                    .map(str::to_string)
                    .unwrap_or(text)
            }
        }
    }

    fn path(&self) -> &Path {
        match self {
            Self::Io { path, .. }
            | Self::NotRegular { path, .. }
            | Self::UntrustedLink { path, .. }
            | Self::MagicLink { path, .. }
            | Self::TooManyLinks { path }
            | Self::Swapped { path, .. } => path,
        }
    }
}

impl From<OpenerError> for io::Error {
    fn from(e: OpenerError) -> Self {
        match e {
            OpenerError::Io { cause, .. } => cause,
            other => io::Error::new(other.kind(), other.reason()),
        }
    }
}

/// A regular file found and checked, not yet opened: an `O_PATH`
/// descriptor and its metadata, for the caller's own checks before
/// [`open`](Self::open).
#[derive(Debug)]
pub struct Located {
    fd: OwnedFd,
    meta: Metadata,
    path: PathBuf,
}

impl Located {
    /// The file's metadata, from its `O_PATH` descriptor.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// Opens the file for reading (`O_RDONLY | O_NONBLOCK | O_NOCTTY |
    /// O_CLOEXEC`) through its `O_PATH` descriptor, and checks that the
    /// file opened is the one located.
    pub fn open(self) -> Result<(File, Metadata), OpenerError> {
        let io = |cause| OpenerError::Io {
            path: self.path.clone(),
            cause,
        };
        let proc_path = CString::new(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .map_err(|e| io(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        // SAFETY: a valid NUL-terminated path; the result is checked.
        let raw = unsafe {
            libc::open(
                proc_path.as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor we just opened and own.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        let meta = file.metadata().map_err(io)?;
        let checked = (self.meta.dev(), self.meta.ino());
        let found = (meta.dev(), meta.ino());
        if checked != found || !meta.is_file() {
            return Err(OpenerError::Swapped {
                path: self.path,
                checked,
                found,
            });
        }
        Ok((file, meta))
    }
}

/// A directory that paths are resolved inside, as a process whose root it
/// is would see them (through root's links only).
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    /// Opens `path` (`/proc/PID/root`, or any directory) as a root. The
    /// path itself is followed: it is eim's or the kernel's, not a
    /// process's.
    pub fn open(path: &Path) -> Result<Self, OpenerError> {
        let fd = open_path(None, path.as_os_str(), libc::O_DIRECTORY).map_err(|cause| {
            OpenerError::Io {
                path: path.to_path_buf(),
                cause,
            }
        })?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The path this root was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where `inner` (as seen inside the root) is on this file system, for
    /// messages: lexically, `..` stopping at the root.
    pub fn shown(&self, inner: &Path) -> PathBuf {
        let mut out = PathBuf::new();
        for c in inner.components() {
            match c {
                Component::Normal(part) => out.push(part),
                Component::ParentDir => {
                    out.pop();
                }
                _ => {}
            }
        }
        self.path.join(out)
    }

    /// Finds `inner` inside the root (see the module documentation): a
    /// regular file reached through root's links only, not yet opened.
    pub fn locate(&self, inner: &Path) -> Result<Located, OpenerError> {
        let shown = self.shown(inner);
        let fd = self.resolve(inner, &shown)?;
        located(fd, shown)
    }

    /// [`locate`](Self::locate) by the component walk alone, as on a
    /// kernel without `openat2`.
    #[cfg(test)]
    fn locate_by_walk(&self, inner: &Path) -> Result<Located, OpenerError> {
        let shown = self.shown(inner);
        let fd = self.walk(&relative_bytes(inner), &shown)?;
        located(fd, shown)
    }

    fn resolve(&self, inner: &Path, shown: &Path) -> Result<OwnedFd, OpenerError> {
        let io = |cause| OpenerError::Io {
            path: shown.to_path_buf(),
            cause,
        };
        let relative = relative_bytes(inner);
        if OPENAT2.load(Ordering::Relaxed) {
            match openat2_in_root(self.fd.as_fd(), &relative) {
                Ok(fd) => return Ok(fd),
                Err(e) => match e.raw_os_error() {
                    // No openat2 here (or a policy denies it): walk, now
                    // and from now on.
                    Some(libc::ENOSYS | libc::EPERM | libc::E2BIG) => {
                        OPENAT2.store(false, Ordering::Relaxed);
                    }
                    // A link on the way (ELOOP), a root escape attempt
                    // or a rename race (EXDEV, EAGAIN): the walk decides.
                    Some(libc::ELOOP | libc::EXDEV | libc::EAGAIN) => {}
                    _ => return Err(io(e)),
                },
            }
        }
        self.walk(&relative, shown)
    }

    /// Resolves `relative` one component at a time (see the module
    /// documentation). `..` pops the directories walked, never above the
    /// root; an absolute link's text starts again at the root.
    fn walk(&self, relative: &[u8], shown: &Path) -> Result<OwnedFd, OpenerError> {
        let io = |cause| OpenerError::Io {
            path: shown.to_path_buf(),
            cause,
        };
        let mut pending: Vec<OsString> = components(relative);
        pending.reverse(); // popped from the end: next component last
        let mut dirs: Vec<OwnedFd> = Vec::new();
        let (mut links, mut steps) = (0u32, 0u32);
        let mut walked = PathBuf::from("/");
        while let Some(part) = pending.pop() {
            steps += 1;
            if steps > MAX_STEPS {
                return Err(OpenerError::TooManyLinks {
                    path: shown.to_path_buf(),
                });
            }
            if part == ".." {
                dirs.pop();
                walked.pop();
                continue;
            }
            let at = dirs.last().map(|d| d.as_fd()).unwrap_or(self.fd.as_fd());
            let fd = open_path(Some(at), &part, libc::O_NOFOLLOW).map_err(io)?;
            let meta = metadata_of(&fd).map_err(io)?;
            walked.push(&part);
            let kind = meta.file_type();
            if kind.is_symlink() {
                if on_procfs(&fd).map_err(io)? {
                    return Err(OpenerError::MagicLink {
                        path: shown.to_path_buf(),
                        link: self.shown(&walked),
                    });
                }
                if meta.uid() != 0 {
                    return Err(OpenerError::UntrustedLink {
                        path: shown.to_path_buf(),
                        link: self.shown(&walked),
                        uid: meta.uid(),
                    });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(OpenerError::TooManyLinks {
                        path: shown.to_path_buf(),
                    });
                }
                let text = read_link(&fd).map_err(io)?;
                walked.pop();
                if text.first() == Some(&b'/') {
                    dirs.clear();
                    walked = PathBuf::from("/");
                }
                let mut more = components(&text);
                more.reverse();
                pending.extend(more);
                continue;
            }
            if kind.is_dir() {
                dirs.push(fd);
                continue;
            }
            if !pending.is_empty() {
                return Err(io(io::Error::from_raw_os_error(libc::ENOTDIR)));
            }
            return Ok(fd);
        }
        // The path ends in a directory (or is the root itself).
        match dirs.pop() {
            Some(fd) => Ok(fd),
            None => self.fd.try_clone().map_err(io),
        }
    }
}

/// Finds `path` as given, links included (an operator's path, or a link
/// the kernel keeps in `/proc`): a regular file, not yet opened.
pub fn locate(path: &Path) -> Result<Located, OpenerError> {
    let fd = open_path(None, path.as_os_str(), 0).map_err(|cause| OpenerError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    located(fd, path.to_path_buf())
}

/// Checks that `fd` (an `O_PATH` descriptor) is a regular file.
fn located(fd: OwnedFd, path: PathBuf) -> Result<Located, OpenerError> {
    let meta = metadata_of(&fd).map_err(|cause| OpenerError::Io {
        path: path.clone(),
        cause,
    })?;
    if !meta.is_file() {
        return Err(OpenerError::NotRegular {
            path,
            kind: kind_of(&meta),
        });
    }
    Ok(Located { fd, meta, path })
}

/// What a non-regular file is, in a user's words.
pub fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "of an unknown type"
    }
}

/// `inner` as bytes relative to a root (leading `/` dropped).
fn relative_bytes(inner: &Path) -> Vec<u8> {
    let bytes = inner.as_os_str().as_bytes();
    let start = bytes.iter().position(|&b| b != b'/').unwrap_or(bytes.len());
    bytes[start..].to_vec()
}

/// The components of a path's bytes, `.` and empty ones dropped.
fn components(bytes: &[u8]) -> Vec<OsString> {
    bytes
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(|c| OsString::from_vec(c.to_vec()))
        .collect()
}

fn c_path(path: &OsStr) -> io::Result<CString> {
    CString::new(path.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path with a NUL byte cannot be opened",
        )
    })
}

/// `openat(at, path, O_PATH | O_CLOEXEC | extra)`.
fn open_path(at: Option<BorrowedFd<'_>>, path: &OsStr, extra: i32) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let dir: RawFd = at.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: a valid NUL-terminated path and a directory descriptor (or
    // AT_FDCWD); the result is checked.
    let raw = unsafe { libc::openat(dir, c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | extra) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The kernel's `struct open_how` (`linux/openat2.h`).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(root, relative, O_PATH | O_CLOEXEC)` resolved in the root,
/// with no link of any kind.
fn openat2_in_root(root: BorrowedFd<'_>, relative: &[u8]) -> io::Result<OwnedFd> {
    // An empty path names the root itself: "." does that for openat2.
    let c = if relative.is_empty() {
        c_path(OsStr::new("."))?
    } else {
        c_path(OsStr::from_bytes(relative))?
    };
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS,
    };
    // SAFETY: a valid directory descriptor, a NUL-terminated path and an
    // `open_how` of the size passed; the result is checked.
    let raw = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    let raw =
        RawFd::try_from(raw).map_err(|_| io::Error::other("openat2: descriptor out of range"))?;
    // SAFETY: `raw` is a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `fstat` of a descriptor (an `O_PATH` one too).
fn metadata_of(fd: &OwnedFd) -> io::Result<Metadata> {
    // Through a duplicate: `File` closes what it holds.
    File::from(fd.try_clone()?).metadata()
}

/// Whether `fd` lives on a procfs: its links are the kernel's magic ones.
fn on_procfs(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: zeroed `statfs` is a valid output buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and output buffer; the result is checked.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type == libc::PROC_SUPER_MAGIC)
}

/// The text of the link `fd` (opened `O_PATH | O_NOFOLLOW`) holds.
fn read_link(fd: &OwnedFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_LINK_TEXT + 1];
    // SAFETY: a valid descriptor, an empty NUL-terminated path (the link
    // itself) and a buffer of the length passed; the result is checked.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    if n > MAX_LINK_TEXT {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    if n == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests;
