//! How a run of map elements is written or deleted: with one batch call
//! (the normal way), or with one single-element call per element.
//!
//! The per-element way exists for two reasons: it is the baseline the
//! batch writes are measured against (`benches/load.rs`), and it is what a
//! kernel without `BPF_MAP_UPDATE_BATCH` / `BPF_MAP_DELETE_BATCH` (before
//! Linux 5.6) can do. Both ways stop at the first failing element and say
//! how many were in effect before it ([`SysError::processed`]), so the
//! backend reports partial failures the same way whichever is used.

use std::os::fd::BorrowedFd;

use crate::sys::{self, SysError};

/// The way [`crate::KernelMaps`] writes runs of elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteMode {
    /// One `UPDATE_BATCH` / `DELETE_BATCH` per run, and one outer-map
    /// update per size class for a batch of delta tables.
    #[default]
    Batch,
    /// One `UPDATE_ELEM` / `DELETE_ELEM` per element, and one outer-map
    /// update per delta table.
    PerElement,
}

/// Writes `count` elements (`keys` and `values` end to end) with
/// `BPF_ANY`.
pub fn update(
    mode: WriteMode,
    fd: BorrowedFd<'_>,
    keys: &[u8],
    values: &[u8],
    count: usize,
) -> Result<(), SysError> {
    match mode {
        WriteMode::Batch => sys::update_batch(fd, keys, values, count, 0),
        WriteMode::PerElement => {
            let (key_size, value_size) = sizes(sys::Cmd::MapUpdateElem, keys, Some(values), count)?;
            let pairs = keys
                .chunks_exact(key_size)
                .zip(values.chunks_exact(value_size));
            for (done, (key, value)) in pairs.enumerate() {
                sys::update_elem(fd, key, value, sys::BPF_ANY).map_err(|e| SysError {
                    processed: done,
                    ..e
                })?;
            }
            Ok(())
        }
    }
}

/// Deletes `count` keys (end to end); stops at the first missing one
/// (ENOENT) as the batch call does.
pub fn delete(
    mode: WriteMode,
    fd: BorrowedFd<'_>,
    keys: &[u8],
    count: usize,
) -> Result<(), SysError> {
    match mode {
        WriteMode::Batch => sys::delete_batch(fd, keys, count),
        WriteMode::PerElement => {
            let (key_size, _) = sizes(sys::Cmd::MapDeleteElem, keys, None, count)?;
            for (done, key) in keys.chunks_exact(key_size).enumerate() {
                sys::delete_elem(fd, key).map_err(|e| SysError {
                    processed: done,
                    ..e
                })?;
            }
            Ok(())
        }
    }
}

/// The key and value sizes of a run of `count` elements, or EINVAL if a
/// buffer does not split into `count` equal, non-empty parts (as the batch
/// calls check). An empty run gives sizes that `chunks_exact` accepts.
fn sizes(
    cmd: sys::Cmd,
    keys: &[u8],
    values: Option<&[u8]>,
    count: usize,
) -> Result<(usize, usize), SysError> {
    if count == 0 {
        return Ok((1, 1));
    }
    let invalid = SysError {
        cmd,
        errno: libc::EINVAL,
        processed: 0,
    };
    let split = |buf: &[u8]| {
        let size = buf.len() / count;
        (size > 0 && size * count == buf.len()).then_some(size)
    };
    let key_size = split(keys).ok_or(invalid)?;
    let value_size = match values {
        Some(values) => split(values).ok_or(invalid)?,
        None => 1,
    };
    Ok((key_size, value_size))
}
