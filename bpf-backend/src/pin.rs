//! Pinned maps: the bpffs directory eim pins its maps in, and the check of
//! every pin found there against the map eim expects.
//!
//! [`crate::KernelMaps`] locks the directory ([`crate::lock`]), sets up its
//! bpffs ([`crate::bpffs`]), then calls [`check_pins`] on the maps it owns
//! before handing the pin paths to aya (`EbpfLoader::map_pin_path`). aya
//! re-uses whatever is pinned under a path without looking at it, so every
//! pin's type, key size, value size and max_entries are checked here first.
//! A pin of another shape is refused, not repaired: it may be another
//! program's, or an older eim's with other capacities, and whatever reads
//! it would lose it if it were replaced. Only when the operator asks
//! ([`crate::KernelConfig::recreate_mismatched`], the CLI's
//! `--recreate-mismatched`) is it unpinned, and aya creates a fresh map and
//! pins it under the same name; the report says which and why.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crate::error::{KernelError, ShapeMismatch};
use crate::stats::MapStats;
use crate::sys::{self, MapInfo};

/// The shape a pinned map must have to be re-used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// For an outer map: the size of its inner arrays, whose template must
    /// be [`sys::BPF_F_MMAPABLE`] (checked by [`inner_template_mismatch`]).
    pub inner_entries: Option<u32>,
    /// `map_flags` bits the map must have (0: none checked).
    pub required_flags: u32,
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
        let mut diffs: Vec<String> = fields
            .iter()
            .filter(|(_, got, want)| got != want)
            .map(|(name, got, want)| format!("{name} is {got}, expected {want}"))
            .collect();
        if info.map_flags & self.required_flags != self.required_flags {
            diffs.push(format!(
                "map_flags is {:#x}, expected the bits {:#x}",
                info.map_flags, self.required_flags
            ));
        }
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
    /// The pin did not fit (`why`) and replacing it was asked for: it was
    /// unpinned, and a fresh map was created and pinned in its place.
    Recreated { why: String },
}

/// How the pinned maps were opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinReport {
    pub dir: PathBuf,
    /// Where this start mounted a bpffs for `dir` (`dir` itself, or
    /// `/sys/fs/bpf`), if it did.
    pub mounted: Option<PathBuf>,
    /// The lock file this process holds, which makes it `dir`'s only owner.
    pub lock_file: PathBuf,
    /// Every map eim owns, by name, in creation order.
    pub maps: Vec<(String, PinState)>,
    /// What was removed from the re-opened maps (`None` when no pin was
    /// re-opened): see "Restarts" in [`crate::maps`].
    pub cleaned: Option<MapStats>,
}

impl PinReport {
    /// The maps in `state`.
    pub fn count(&self, state: fn(&PinState) -> bool) -> usize {
        self.maps.iter().filter(|(_, s)| state(s)).count()
    }

    /// The maps replaced because their pins had another shape, with why.
    pub fn replaced(&self) -> impl Iterator<Item = (&str, &str)> {
        self.maps.iter().filter_map(|(name, s)| match s {
            PinState::Recreated { why } => Some((name.as_str(), why.as_str())),
            _ => None,
        })
    }

    /// Whether any map was re-opened from an earlier run.
    pub fn any_reopened(&self) -> bool {
        self.count(|s| matches!(s, PinState::Reopened)) > 0
    }
}

pub(crate) fn pin_error(path: &Path, what: &'static str, cause: io::Error) -> KernelError {
    KernelError::Pin {
        path: path.to_path_buf(),
        what,
        cause,
    }
}

/// What is pinned under one name.
enum Found {
    Nothing,
    Fits,
    Differs(String),
}

/// Looks at what is pinned at `path`, without changing it.
fn look(path: &Path, want: &MapShape) -> Result<Found, KernelError> {
    let fd = match sys::obj_get(path) {
        Ok(fd) => fd,
        Err(e) if e.is(libc::ENOENT) => return Ok(Found::Nothing),
        Err(e) => {
            return Err(pin_error(
                path,
                "opening the pin",
                io::Error::from_raw_os_error(e.errno),
            ))
        }
    };
    Ok(match sys::map_info(fd.as_fd()) {
        Ok(info) => match want.mismatch(&info) {
            Some(why) => Found::Differs(why),
            None => match want.inner_entries {
                Some(entries) => inner_template_mismatch(fd.as_fd(), entries)
                    .map_err(|e| {
                        pin_error(
                            path,
                            "checking the inner template of",
                            io::Error::from_raw_os_error(e.errno),
                        )
                    })?
                    .map_or(Found::Fits, Found::Differs),
                None => Found::Fits,
            },
        },
        Err(e) => Found::Differs(format!(
            "not a map ({})",
            io::Error::from_raw_os_error(e.errno)
        )),
    })
}

/// Why the inner-map template of the outer map `outer` is not the
/// mappable ARRAY of `entries` values eim writes (pins of an eim from
/// before the arrays were mappable), or `None` if it is. The kernel does
/// not report a template's flags: they are read off an inner array the map
/// holds, or, from an empty map, tried: a fresh mappable array is inserted
/// under a key no page entry names and removed again (an empty outer map
/// has no reader to see it).
pub fn inner_template_mismatch(
    outer: BorrowedFd<'_>,
    entries: u32,
) -> Result<Option<String>, sys::SysError> {
    let refused = || {
        Some(format!(
            "its inner arrays are not BPF_F_MMAPABLE (map_flags {:#x}), which eim writes",
            sys::BPF_F_MMAPABLE
        ))
    };
    if let Some(key) = sys::first_key(outer, 8)? {
        let Some(id) = sys::lookup_elem(outer, &key, 4)? else {
            return Ok(None);
        };
        let id = u32::from_le_bytes([id[0], id[1], id[2], id[3]]);
        let inner = match sys::map_get_fd_by_id(id, sys::BPF_F_RDONLY) {
            Ok(fd) => fd,
            // Removed meanwhile: nothing to say about the template.
            Err(e) if e.is(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let info = sys::map_info(inner.as_fd())?;
        return Ok((info.map_flags & sys::BPF_F_MMAPABLE == 0)
            .then(refused)
            .flatten());
    }
    let probe = sys::map_create(&sys::MapSpec {
        map_type: sys::map_type::ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        map_flags: sys::BPF_F_MMAPABLE,
        inner_map: None,
        name: "eim_probe",
    })?;
    let key = u64::MAX.to_le_bytes();
    let value = (probe.as_raw_fd() as u32).to_le_bytes();
    match sys::update_elem(outer, &key, &value, sys::BPF_NOEXIST) {
        Ok(()) => {
            sys::delete_elem(outer, &key)?;
            Ok(None)
        }
        Err(e) if e.is(libc::EINVAL) => Ok(refused()),
        Err(e) => Err(e),
    }
}

/// Checks the pin of every map in `owned` under `dir`: nothing pinned
/// ([`PinState::Created`]: aya creates and pins the map), a map of the
/// expected shape ([`PinState::Reopened`]), or anything else. Anything else
/// is refused ([`ShapeMismatch`], every such pin named, none touched)
/// unless `recreate`, which unpins each ([`PinState::Recreated`]: aya then
/// creates and pins a fresh map under its name).
pub fn check_pins(
    dir: &Path,
    owned: &[(String, MapShape)],
    recreate: bool,
) -> Result<Vec<(String, PinState)>, KernelError> {
    let found = owned
        .iter()
        .map(|(name, shape)| Ok((name.clone(), look(&dir.join(name), shape)?)))
        .collect::<Result<Vec<_>, KernelError>>()?;
    let differ: Vec<(String, String)> = found
        .iter()
        .filter_map(|(name, f)| match f {
            Found::Differs(why) => Some((name.clone(), why.clone())),
            _ => None,
        })
        .collect();
    if !differ.is_empty() && !recreate {
        return Err(ShapeMismatch {
            dir: dir.to_path_buf(),
            maps: differ,
        }
        .into());
    }
    found
        .into_iter()
        .map(|(name, f)| {
            let state = match f {
                Found::Nothing => PinState::Created,
                Found::Fits => PinState::Reopened,
                Found::Differs(why) => {
                    let path = dir.join(&name);
                    std::fs::remove_file(&path).map_err(|e| pin_error(&path, "unpinning", e))?;
                    PinState::Recreated { why }
                }
            };
            Ok((name, state))
        })
        .collect()
}
