//! A thin wrapper over the raw `bpf()` syscall for what aya 0.14 lacks:
//! batch update / delete / lookup, and map creation with `inner_map_fd`
//! (outer maps) and a chosen name. Plus the single-element calls the
//! backend needs on maps it holds by fd, and `BPF_OBJ_GET_INFO_BY_FD`.
//!
//! Every call goes through `bpf`, which counts it ([`syscalls`]), so that
//! tests and benchmarks can state how many syscalls an operation costs.
//!
//! Errors carry the errno and, for batch calls, how many elements the
//! kernel processed before it stopped (it writes that count back into the
//! attribute even on failure).

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// `bpf()` commands used here (`enum bpf_cmd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Cmd {
    MapCreate = 0,
    MapLookupElem = 1,
    MapUpdateElem = 2,
    MapDeleteElem = 3,
    MapGetNextKey = 4,
    ObjPin = 6,
    ObjGet = 7,
    MapGetFdById = 14,
    ObjGetInfoByFd = 15,
    MapLookupBatch = 24,
    MapUpdateBatch = 26,
    MapDeleteBatch = 27,
}

/// Map types used here (`enum bpf_map_type`).
pub mod map_type {
    pub const HASH: u32 = 1;
    pub const ARRAY: u32 = 2;
    pub const HASH_OF_MAPS: u32 = 13;
}

/// Element flags of single-element updates.
pub const BPF_ANY: u64 = 0;
pub const BPF_NOEXIST: u64 = 1;
pub const BPF_EXIST: u64 = 2;
/// `map_flags`: the inner-map template accepts arrays of other sizes.
pub const BPF_F_INNER_MAP: u32 = 1 << 12;
/// `map_flags`: an ARRAY whose values user space can map (and write) with
/// `mmap`.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Open flag of `BPF_OBJ_GET` and `BPF_MAP_GET_FD_BY_ID`: a read-only fd.
pub const BPF_F_RDONLY: u32 = 1 << 3;

/// A failed `bpf()` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bpf({cmd:?}): {} after {processed} elements", io::Error::from_raw_os_error(*errno))]
pub struct SysError {
    pub cmd: Cmd,
    pub errno: i32,
    /// Elements in effect before the call stopped (batch calls; 0 otherwise).
    pub processed: usize,
}

impl SysError {
    pub fn is(&self, errno: i32) -> bool {
        self.errno == errno
    }
}

static SYSCALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_SYSCALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `bpf()` calls issued through this module so far (all threads).
pub fn syscalls() -> u64 {
    SYSCALLS.load(Ordering::Relaxed)
}

/// `bpf()` calls issued through this module so far by the calling thread
/// (what a test that runs beside others can attribute to its own work).
pub fn thread_syscalls() -> u64 {
    THREAD_SYSCALLS.with(std::cell::Cell::get)
}

/// Issues one `bpf()` call; `Err(errno)` on failure.
///
/// # Safety
/// `attr` must be a valid attribute for `cmd` whose pointers are valid for
/// what the kernel reads and writes through them.
unsafe fn bpf<T>(cmd: Cmd, attr: &mut T) -> Result<i64, i32> {
    SYSCALLS.fetch_add(1, Ordering::Relaxed);
    THREAD_SYSCALLS.with(|n| n.set(n.get() + 1));
    // SAFETY: per the function contract.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as u32 as libc::c_long,
            attr as *mut T as *mut c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(ret)
    }
}

/// `union bpf_attr` for `BPF_MAP_CREATE` (the prefix up to `map_extra`).
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
    map_extra: u64,
}

/// `union bpf_attr` for the single-element commands.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for the batch commands.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `union bpf_attr` for `BPF_MAP_GET_FD_BY_ID`.
#[repr(C)]
struct IdAttr {
    map_id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `union bpf_attr` for `BPF_OBJ_GET`.
#[repr(C)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The head of `struct bpf_map_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: [u8; 16],
}

/// What [`map_create`] creates.
#[derive(Clone, Copy, Debug)]
pub struct MapSpec<'a> {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    /// The template of an outer map's inner maps.
    pub inner_map: Option<BorrowedFd<'a>>,
    /// At most 15 bytes of `[A-Za-z0-9_.]`; longer names are cut.
    pub name: &'a str,
}

/// `BPF_MAP_CREATE`.
pub fn map_create(spec: &MapSpec<'_>) -> Result<OwnedFd, SysError> {
    let mut attr = MapCreateAttr {
        map_type: spec.map_type,
        key_size: spec.key_size,
        value_size: spec.value_size,
        max_entries: spec.max_entries,
        map_flags: spec.map_flags,
        inner_map_fd: spec.inner_map.map_or(0, |fd| fd.as_raw_fd() as u32),
        ..Default::default()
    };
    let name = spec.name.as_bytes();
    let n = name.len().min(15);
    attr.map_name[..n].copy_from_slice(&name[..n]);
    // SAFETY: the attribute holds no pointers.
    let fd = unsafe { bpf(Cmd::MapCreate, &mut attr) }.map_err(|errno| SysError {
        cmd: Cmd::MapCreate,
        errno,
        processed: 0,
    })?;
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_OBJ_GET_INFO_BY_FD` for a map.
pub fn map_info(fd: BorrowedFd<'_>) -> Result<MapInfo, SysError> {
    let mut info = MapInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<MapInfo>() as u32,
        info: &mut info as *mut MapInfo as u64,
    };
    // SAFETY: `info` is writable for `info_len` bytes.
    unsafe { bpf(Cmd::ObjGetInfoByFd, &mut attr) }.map_err(|errno| SysError {
        cmd: Cmd::ObjGetInfoByFd,
        errno,
        processed: 0,
    })?;
    Ok(info)
}

/// `BPF_OBJ_GET`: opens the object pinned at `path` (ENOENT when nothing
/// is pinned there).
pub fn obj_get(path: &std::path::Path) -> Result<OwnedFd, SysError> {
    obj_get_with(path, 0)
}

/// `BPF_MAP_GET_FD_BY_ID` (needs CAP_SYS_ADMIN), with `open_flags` such
/// as [`BPF_F_RDONLY`].
pub fn map_get_fd_by_id(id: u32, open_flags: u32) -> Result<OwnedFd, SysError> {
    let mut attr = IdAttr {
        map_id: id,
        next_id: 0,
        open_flags,
    };
    // SAFETY: the attribute holds no pointers.
    let fd = unsafe { bpf(Cmd::MapGetFdById, &mut attr) }.map_err(|errno| SysError {
        cmd: Cmd::MapGetFdById,
        errno,
        processed: 0,
    })?;
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_OBJ_PIN`: pins the map `fd` at `path` (EEXIST when something is
/// pinned there already).
pub fn obj_pin(fd: BorrowedFd<'_>, path: &std::path::Path) -> Result<(), SysError> {
    use std::os::unix::ffi::OsStrExt;
    let fail = |errno| SysError {
        cmd: Cmd::ObjPin,
        errno,
        processed: 0,
    };
    let path =
        std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| fail(libc::EINVAL))?;
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
    };
    // SAFETY: `pathname` is a NUL-terminated string that outlives the call.
    unsafe { bpf(Cmd::ObjPin, &mut attr) }.map_err(fail)?;
    Ok(())
}

/// [`obj_get`] with `file_flags` such as [`BPF_F_RDONLY`].
pub fn obj_get_with(path: &std::path::Path, file_flags: u32) -> Result<OwnedFd, SysError> {
    use std::os::unix::ffi::OsStrExt;
    let fail = |errno| SysError {
        cmd: Cmd::ObjGet,
        errno,
        processed: 0,
    };
    let path =
        std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| fail(libc::EINVAL))?;
    let mut attr = ObjAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags,
    };
    // SAFETY: `pathname` is a NUL-terminated string that outlives the call.
    let fd = unsafe { bpf(Cmd::ObjGet, &mut attr) }.map_err(fail)?;
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn elem(
    cmd: Cmd,
    fd: BorrowedFd<'_>,
    key: &[u8],
    value: *mut u8,
    flags: u64,
) -> Result<(), SysError> {
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
        key: key.as_ptr() as u64,
        value: value as u64,
        flags,
    };
    // SAFETY: the caller passes key and value buffers of the map's sizes.
    unsafe { bpf(cmd, &mut attr) }
        .map(drop)
        .map_err(|errno| SysError {
            cmd,
            errno,
            processed: 0,
        })
}

/// `BPF_MAP_LOOKUP_ELEM`: the value under `key` (`value_size` bytes), or
/// `None` for ENOENT.
pub fn lookup_elem(
    fd: BorrowedFd<'_>,
    key: &[u8],
    value_size: usize,
) -> Result<Option<Vec<u8>>, SysError> {
    let mut value = vec![0u8; value_size];
    match elem(Cmd::MapLookupElem, fd, key, value.as_mut_ptr(), 0) {
        Ok(()) => Ok(Some(value)),
        Err(e) if e.is(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_GET_NEXT_KEY` from no key: some key of the map
/// (`key_size` bytes), or `None` if it is empty.
pub fn first_key(fd: BorrowedFd<'_>, key_size: usize) -> Result<Option<Vec<u8>>, SysError> {
    let mut next = vec![0u8; key_size];
    let mut attr = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
        key: 0,
        value: next.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: no key (the first one is asked for), and `next` has the map's
    // key size.
    match unsafe { bpf(Cmd::MapGetNextKey, &mut attr) } {
        Ok(_) => Ok(Some(next)),
        Err(libc::ENOENT) => Ok(None),
        Err(errno) => Err(SysError {
            cmd: Cmd::MapGetNextKey,
            errno,
            processed: 0,
        }),
    }
}

/// `BPF_MAP_UPDATE_ELEM` (`value` must have the map's value size; for an
/// outer map it is an inner map's fd as a `u32`).
pub fn update_elem(
    fd: BorrowedFd<'_>,
    key: &[u8],
    value: &[u8],
    flags: u64,
) -> Result<(), SysError> {
    elem(
        Cmd::MapUpdateElem,
        fd,
        key,
        value.as_ptr() as *mut u8,
        flags,
    )
}

/// `BPF_MAP_DELETE_ELEM`.
pub fn delete_elem(fd: BorrowedFd<'_>, key: &[u8]) -> Result<(), SysError> {
    elem(Cmd::MapDeleteElem, fd, key, std::ptr::null_mut(), 0)
}

fn batch(
    cmd: Cmd,
    fd: BorrowedFd<'_>,
    keys: *const u8,
    values: *const u8,
    count: usize,
    elem_flags: u64,
) -> Result<(), SysError> {
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys as u64,
        values: values as u64,
        count: u32::try_from(count).map_err(|_| SysError {
            cmd,
            errno: libc::E2BIG,
            processed: 0,
        })?,
        map_fd: fd.as_raw_fd() as u32,
        elem_flags,
        flags: 0,
    };
    // SAFETY: the callers check that the buffers hold `count` elements.
    match unsafe { bpf(cmd, &mut attr) } {
        Ok(_) => Ok(()),
        Err(errno) => Err(SysError {
            cmd,
            errno,
            processed: attr.count as usize,
        }),
    }
}

fn check_len(cmd: Cmd, buf: &[u8], count: usize, size: usize) -> Result<(), SysError> {
    if size == 0 || buf.len() != count * size {
        return Err(SysError {
            cmd,
            errno: libc::EINVAL,
            processed: 0,
        });
    }
    Ok(())
}

/// `BPF_MAP_UPDATE_BATCH`: `count` keys and values, end to end. The
/// kernel stops at the first failing element; `processed` counts the ones
/// written before it. `elem_flags` may only be 0 or `BPF_F_LOCK`.
/// An empty batch issues no syscall.
pub fn update_batch(
    fd: BorrowedFd<'_>,
    keys: &[u8],
    values: &[u8],
    count: usize,
    elem_flags: u64,
) -> Result<(), SysError> {
    if count == 0 {
        return Ok(());
    }
    check_len(Cmd::MapUpdateBatch, keys, count, keys.len() / count)?;
    check_len(Cmd::MapUpdateBatch, values, count, values.len() / count)?;
    batch(
        Cmd::MapUpdateBatch,
        fd,
        keys.as_ptr(),
        values.as_ptr(),
        count,
        elem_flags,
    )
}

/// `BPF_MAP_DELETE_BATCH`: stops at the first missing key (ENOENT) with
/// `processed` keys deleted. Not supported by ARRAY maps (ENOTSUPP).
/// An empty batch issues no syscall.
pub fn delete_batch(fd: BorrowedFd<'_>, keys: &[u8], count: usize) -> Result<(), SysError> {
    if count == 0 {
        return Ok(());
    }
    check_len(Cmd::MapDeleteBatch, keys, count, keys.len() / count)?;
    batch(
        Cmd::MapDeleteBatch,
        fd,
        keys.as_ptr(),
        std::ptr::null(),
        count,
        0,
    )
}

/// Successive `BPF_MAP_LOOKUP_BATCH` calls over one map: the batch token
/// (a bucket index for hashes, a key for arrays) carried from one call to
/// the next.
struct LookupCursor<'a> {
    fd: BorrowedFd<'a>,
    key_size: usize,
    value_size: usize,
    in_token: Vec<u8>,
    out_token: Vec<u8>,
    first: bool,
}

impl<'a> LookupCursor<'a> {
    fn new(fd: BorrowedFd<'a>, key_size: usize, value_size: usize) -> Self {
        let token_size = key_size.max(8);
        Self {
            fd,
            key_size,
            value_size,
            in_token: vec![0u8; token_size],
            out_token: vec![0u8; token_size],
            first: true,
        }
    }

    /// One call for up to `count` entries: the keys and values read, and
    /// the call's errno if it failed. Only a call that succeeded moves the
    /// cursor on.
    fn next(&mut self, count: usize) -> (Vec<u8>, Vec<u8>, Result<(), i32>) {
        let mut keys = vec![0u8; count * self.key_size];
        let mut values = vec![0u8; count * self.value_size];
        let mut attr = BatchAttr {
            in_batch: if self.first {
                0
            } else {
                self.in_token.as_ptr() as u64
            },
            out_batch: self.out_token.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: count as u32,
            map_fd: self.fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: the buffers hold `count` keys and values and a token.
        let result = unsafe { bpf(Cmd::MapLookupBatch, &mut attr) };
        let got = (attr.count as usize).min(count);
        keys.truncate(got * self.key_size);
        values.truncate(got * self.value_size);
        if result.is_ok() {
            self.first = false;
            std::mem::swap(&mut self.in_token, &mut self.out_token);
        }
        (keys, values, result.map(|_| ()))
    }
}

fn lookup_error(errno: i32, keys: &[u8], key_size: usize) -> SysError {
    SysError {
        cmd: Cmd::MapLookupBatch,
        errno,
        processed: keys.len() / key_size.max(1),
    }
}

/// The first `count` entries of an array map (keys 0 to `count - 1`),
/// with one `BPF_MAP_LOOKUP_BATCH` call of that many (more calls only if
/// the kernel returns fewer).
pub fn lookup_first(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    count: usize,
) -> Result<(Vec<u8>, Vec<u8>), SysError> {
    let mut cursor = LookupCursor::new(fd, key_size, value_size);
    let mut all_keys = Vec::with_capacity(count * key_size);
    let mut all_values = Vec::with_capacity(count * value_size);
    // Each call returns at least one entry or ends the loop.
    while all_values.len() < count * value_size {
        let want = count - all_values.len() / value_size.max(1);
        let (keys, values, result) = cursor.next(want);
        let got = !values.is_empty();
        all_keys.extend_from_slice(&keys);
        all_values.extend_from_slice(&values);
        match result {
            Ok(()) if got => {}
            Ok(()) | Err(libc::ENOENT) => break,
            Err(errno) => return Err(lookup_error(errno, &all_keys, key_size)),
        }
    }
    Ok((all_keys, all_values))
}

/// Every entry of a map with `BPF_MAP_LOOKUP_BATCH`, as flat key and value
/// buffers (`n * key_size` and `n * value_size` bytes), `chunk` entries per
/// call (grown when a hash bucket does not fit, ENOSPC).
pub fn lookup_all(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    chunk: usize,
) -> Result<(Vec<u8>, Vec<u8>), SysError> {
    let mut cursor = LookupCursor::new(fd, key_size, value_size);
    let mut chunk = chunk.max(1);
    let mut all_keys = Vec::new();
    let mut all_values = Vec::new();
    loop {
        let (keys, values, result) = cursor.next(chunk);
        match result {
            Ok(()) | Err(libc::ENOENT) => {
                all_keys.extend_from_slice(&keys);
                all_values.extend_from_slice(&values);
                if result.is_err() {
                    return Ok((all_keys, all_values));
                }
            }
            Err(libc::ENOSPC) if keys.is_empty() && chunk < (1 << 24) => chunk *= 2,
            Err(errno) => return Err(lookup_error(errno, &all_keys, key_size)),
        }
    }
}

/// Bytes of an array mapped at once by [`write_mapped`]: a whole table's
/// mapping would count in eim's resident memory until unmapped (54 MB for
/// the 6.7 million deltas of the worst `.eh_frame`, in 8-byte slots).
const MAPPED_WINDOW: usize = 4 << 20;

/// Writes the first `len` bytes of the values of a [`BPF_F_MMAPABLE`]
/// ARRAY through shared mappings of its value area, `MAPPED_WINDOW`
/// bytes at a time (whole pages, which the array's allocation covers):
/// `fill(at, window)` writes the bytes at `at..at + window.len()`, which
/// start zeroed. One copy instead of a syscall that copies and checks each
/// element. `Err(errno)` if a window cannot be mapped; the windows before
/// it are written then (the caller frees an array it could not fill).
pub fn write_mapped(
    fd: BorrowedFd<'_>,
    len: usize,
    mut fill: impl FnMut(usize, &mut [u8]),
) -> Result<(), i32> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let window = MAPPED_WINDOW.next_multiple_of(page.max(1));
    let mut at = 0;
    while at < len {
        let bytes = window.min(len - at);
        let mapped = bytes.div_ceil(page) * page;
        let offset = libc::off_t::try_from(at).map_err(|_| libc::EINVAL)?;
        // SAFETY: a new shared mapping of the array's value area at a
        // page-aligned offset, which the kernel checks against the
        // array's size; nothing else refers to it, and it is unmapped
        // below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        // SAFETY: `base` maps `mapped >= bytes` writable bytes that only
        // this function uses until the unmap below.
        let slice = unsafe { std::slice::from_raw_parts_mut(base.cast::<u8>(), bytes) };
        fill(at, slice);
        // SAFETY: the mapping made above; `slice` is not used any more.
        unsafe { libc::munmap(base, mapped) };
        at += bytes;
    }
    Ok(())
}

/// Waits up to `timeout` for `fd` (a ring buffer) to have something to
/// read; `false` on timeout. An interrupted wait (a signal) is `true`: the
/// caller looks, finds nothing or something, and comes back.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> std::io::Result<bool> {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(true)
        } else {
            Err(e)
        };
    }
    Ok(rc > 0)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// Creates a map, or `None` (with a loud note) without BPF privileges.
    fn create(map_type: u32, key: u32, value: u32, entries: u32) -> Option<OwnedFd> {
        match map_create(&MapSpec {
            map_type,
            key_size: key,
            value_size: value,
            max_entries: entries,
            map_flags: 0,
            inner_map: None,
            name: "eim_sys_test",
        }) {
            Ok(fd) => Some(fd),
            Err(e) if e.is(libc::EPERM) => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "\n***** SKIPPED: bpf() is not permitted (needs root/CAP_BPF) *****"
                );
                assert!(
                    std::env::var("EIM_REQUIRE_BPF").as_deref() != Ok("1"),
                    "EIM_REQUIRE_BPF=1 but bpf() is not permitted"
                );
                None
            }
            Err(e) => panic!("map_create: {e}"),
        }
    }

    fn flat<const N: usize>(items: impl IntoIterator<Item = [u8; N]>) -> Vec<u8> {
        items.into_iter().flatten().collect()
    }

    #[test]
    fn hash_batch_update_lookup_delete_and_partial_counts() {
        let Some(map) = create(map_type::HASH, 8, 4, 4) else {
            return;
        };
        let fd = map.as_fd();
        let keys = flat((0..3u64).map(u64::to_le_bytes));
        let values = flat((10..13u32).map(u32::to_le_bytes));
        update_batch(fd, &keys, &values, 3, 0).expect("update");
        let info = map_info(fd).expect("info");
        assert_eq!(
            (
                info.map_type,
                info.key_size,
                info.value_size,
                info.max_entries
            ),
            (map_type::HASH, 8, 4, 4)
        );
        let (k, v) = lookup_all(fd, 8, 4, 1).expect("lookup all");
        let mut got: Vec<(u64, u32)> = k
            .chunks(8)
            .zip(v.chunks(4))
            .map(|(k, v)| {
                (
                    u64::from_le_bytes(k.try_into().unwrap()),
                    u32::from_le_bytes(v.try_into().unwrap()),
                )
            })
            .collect();
        got.sort();
        assert_eq!(got, vec![(0, 10), (1, 11), (2, 12)]);
        // Past max_entries: E2BIG after the one that still fits.
        let more = flat((3..6u64).map(u64::to_le_bytes));
        let err = update_batch(fd, &more, &values, 3, 0).expect_err("full");
        assert_eq!((err.errno, err.processed), (libc::E2BIG, 1));
        // NOEXIST is not an element flag a batch accepts.
        let err = update_batch(fd, &keys, &values, 3, BPF_NOEXIST).expect_err("flags");
        assert_eq!(err.errno, libc::EINVAL);
        // Delete stops at the first missing key.
        let del = flat([0u64, 1, 9, 2].map(u64::to_le_bytes));
        let err = delete_batch(fd, &del, 4).expect_err("missing");
        assert_eq!((err.errno, err.processed), (libc::ENOENT, 2));
        assert_eq!(lookup_elem(fd, &0u64.to_le_bytes(), 4), Ok(None));
        assert_eq!(
            lookup_elem(fd, &2u64.to_le_bytes(), 4),
            Ok(Some(12u32.to_le_bytes().to_vec()))
        );
        let before = thread_syscalls();
        assert_eq!(update_batch(fd, &[], &[], 0, 0), Ok(()));
        assert_eq!(thread_syscalls(), before, "an empty batch is no syscall");
    }

    #[test]
    fn array_batches_and_an_outer_map_holding_inner_fds() {
        let Some(template) = create(map_type::ARRAY, 4, 4, 256) else {
            return;
        };
        let keys = flat((0..256u32).map(u32::to_le_bytes));
        let values = flat((0..256u32).map(|i| (i * 3).to_le_bytes()));
        update_batch(template.as_fd(), &keys, &values, 256, 0).expect("fill");
        let (k, v) = lookup_all(template.as_fd(), 4, 4, 100).expect("read");
        assert_eq!((k, v), (keys.clone(), values.clone()));
        let err = delete_batch(template.as_fd(), &keys[..4], 1).expect_err("array");
        assert_eq!(err.errno, 524, "ENOTSUPP");

        let outer = map_create(&MapSpec {
            map_type: map_type::HASH_OF_MAPS,
            key_size: 8,
            value_size: 4,
            max_entries: 2,
            map_flags: 0,
            inner_map: Some(template.as_fd()),
            name: "eim_sys_outer",
        })
        .expect("outer");
        let inner_fd = (template.as_raw_fd() as u32).to_le_bytes();
        update_elem(outer.as_fd(), &7u64.to_le_bytes(), &inner_fd, BPF_NOEXIST).expect("insert");
        let err = update_elem(outer.as_fd(), &7u64.to_le_bytes(), &inner_fd, BPF_NOEXIST)
            .expect_err("present");
        assert_eq!(err.errno, libc::EEXIST);
        // The outer map reads back map ids, not fds.
        let id = map_info(template.as_fd()).expect("info").id;
        assert_eq!(
            lookup_elem(outer.as_fd(), &7u64.to_le_bytes(), 4),
            Ok(Some(id.to_le_bytes().to_vec()))
        );
        // Batch insert of inner fds works too.
        let k2 = flat([8u64].map(u64::to_le_bytes));
        update_batch(outer.as_fd(), &k2, &inner_fd, 1, 0).expect("batch insert");
        delete_batch(outer.as_fd(), &flat([7u64, 8].map(u64::to_le_bytes)), 2).expect("delete");
        assert_eq!(
            delete_elem(outer.as_fd(), &7u64.to_le_bytes()).map_err(|e| e.errno),
            Err(libc::ENOENT)
        );
        // An inner array of another size is refused without BPF_F_INNER_MAP.
        let small = create(map_type::ARRAY, 4, 4, 8).expect("small");
        let err = update_elem(
            outer.as_fd(),
            &9u64.to_le_bytes(),
            &(small.as_raw_fd() as u32).to_le_bytes(),
            BPF_ANY,
        )
        .expect_err("size mismatch");
        assert_eq!(err.errno, libc::EINVAL);
    }
}
