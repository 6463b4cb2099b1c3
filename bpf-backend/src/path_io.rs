//! An I/O error on a named path, with what eim was doing there: the pin
//! directory's lock ([`crate::lock`]) and mount rules ([`crate::bpffs`])
//! report their file-system errors in this one shape.

use std::io;
use std::path::{Path, PathBuf};

/// `what` failed on `path`, with the OS's cause (printed, not chained:
/// `eim_core::error`'s convention).
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {cause}", path.display())]
pub struct PathIoError {
    pub what: &'static str,
    pub path: PathBuf,
    pub cause: io::Error,
}

/// A `map_err` argument: `cause` as what failed on `path` (`?` turns it
/// into the caller's error).
pub(crate) fn io_error<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> PathIoError + 'a {
    move |cause| PathIoError {
        what,
        path: path.to_path_buf(),
        cause,
    }
}
