//! Pinned maps: the bpffs directory eim pins its maps in, and the check of
//! every pin found there against the map eim expects.
//!
//! [`crate::KernelMaps`] calls [`ensure_bpffs`] on the configured directory
//! (mounting a bpffs there when the directory is on another file system),
//! then [`check_pin`] for each map it owns before handing the pin paths to
//! aya (`EbpfLoader::map_pin_path`). aya re-uses whatever is pinned under a
//! path without looking at it, so a pin whose type, key size, value size or
//! max_entries differ from the expected ones is unpinned here; aya then
//! creates a fresh map and pins it under the same name.

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::maps::{KernelError, MapStats};
use crate::sys::{self, MapInfo};

/// `BPF_FS_MAGIC`: the `f_type` of a bpffs in `statfs`.
pub const BPF_FS_MAGIC: u32 = 0xcafe_4a11;

/// The shape a pinned map must have to be re-used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

impl MapShape {
    /// What differs between `info` and this shape, or `None` if nothing.
    pub fn mismatch(&self, info: &MapInfo) -> Option<String> {
        let fields = [
            ("map_type", info.map_type, self.map_type),
            ("key_size", info.key_size, self.key_size),
            ("value_size", info.value_size, self.value_size),
            ("max_entries", info.max_entries, self.max_entries),
        ];
        let diffs: Vec<String> = fields
            .iter()
            .filter(|(_, got, want)| got != want)
            .map(|(name, got, want)| format!("{name} is {got}, expected {want}"))
            .collect();
        (!diffs.is_empty()).then(|| diffs.join(", "))
    }
}

/// What happened to one map's pin when the maps were opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinState {
    /// Nothing was pinned under the name: a fresh map was created and pinned.
    Created,
    /// The pin had the expected shape and is used as it is.
    Reopened,
    /// The pin did not fit (`why`): it was unpinned, and a fresh map was
    /// created and pinned in its place.
    Recreated { why: String },
}

/// How the pinned maps were opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinReport {
    pub dir: PathBuf,
    /// Whether a bpffs was mounted on `dir` by this start.
    pub mounted: bool,
    /// Every map eim owns, by name, in creation order.
    pub maps: Vec<(String, PinState)>,
    /// What was removed from the re-opened maps (`None` when no pin was
    /// re-opened): see "Crash recovery" in [`crate::maps`].
    pub cleaned: Option<MapStats>,
}

impl PinReport {
    /// The maps in `state`.
    pub fn count(&self, state: fn(&PinState) -> bool) -> usize {
        self.maps.iter().filter(|(_, s)| state(s)).count()
    }

    /// Whether any map was re-opened from an earlier run.
    pub fn any_reopened(&self) -> bool {
        self.count(|s| matches!(s, PinState::Reopened)) > 0
    }
}

fn pin_error(path: &Path, what: &'static str, source: io::Error) -> KernelError {
    KernelError::Pin {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// Whether `path` is on a bpffs.
pub fn is_bpffs(path: &Path) -> io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: all-zero bytes are a valid `statfs`.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as u64 == u64::from(BPF_FS_MAGIC))
}

/// Creates `dir` (and its parents) if needed and mounts a bpffs on it
/// unless it already is on one. Returns whether it mounted one.
///
/// Creating the directory needs a parent that accepts `mkdir`: with the
/// default `/sys/fs/bpf/...` and no bpffs on `/sys/fs/bpf`, sysfs refuses,
/// and the error says so (mount one on `/sys/fs/bpf` first, or pin under a
/// directory of a writable file system, on which a bpffs is then mounted).
pub fn ensure_bpffs(dir: &Path) -> Result<bool, KernelError> {
    std::fs::create_dir_all(dir).map_err(|e| pin_error(dir, "creating the pin directory", e))?;
    if is_bpffs(dir).map_err(|e| pin_error(dir, "statfs of the pin directory", e))? {
        return Ok(false);
    }
    let target = CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
        pin_error(
            dir,
            "mounting a bpffs on",
            io::Error::from_raw_os_error(libc::EINVAL),
        )
    })?;
    // SAFETY: every pointer is a NUL-terminated string or null (no data).
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(pin_error(
            dir,
            "mounting a bpffs on",
            io::Error::last_os_error(),
        ));
    }
    Ok(true)
}

/// Looks at what is pinned at `path`: nothing ([`PinState::Created`], aya
/// creates and pins the map), a map of the expected shape
/// ([`PinState::Reopened`]), or anything else, which is unpinned
/// ([`PinState::Recreated`], aya creates and pins a fresh map).
pub fn check_pin(path: &Path, want: &MapShape) -> Result<PinState, KernelError> {
    let fd = match sys::obj_get(path) {
        Ok(fd) => fd,
        Err(e) if e.is(libc::ENOENT) => return Ok(PinState::Created),
        Err(e) => {
            return Err(pin_error(
                path,
                "opening the pin",
                io::Error::from_raw_os_error(e.errno),
            ))
        }
    };
    let why = match sys::map_info(fd.as_fd()) {
        Ok(info) => want.mismatch(&info),
        Err(e) => Some(format!(
            "not a map ({})",
            io::Error::from_raw_os_error(e.errno)
        )),
    };
    drop(fd);
    match why {
        None => Ok(PinState::Reopened),
        Some(why) => {
            std::fs::remove_file(path).map_err(|e| pin_error(path, "unpinning", e))?;
            Ok(PinState::Recreated { why })
        }
    }
}
