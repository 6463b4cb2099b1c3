//! The manager's errors. Every message names the file id, and for kernel
//! failures the map, the op and the errno.
//!
//! eim's one convention for causes, in every crate: an error prints its
//! cause in its own message and does not also return it from
//! [`std::error::Error::source`]. A reader of the CLI's `{:#}` (or of a
//! log line's `{}`) then sees each cause once, and `to_string` alone is
//! the whole story (reports and logs print only that). A cause from
//! another crate, whose own message may leave its cause to `source()` (an
//! aya error, a syscall error), is printed with [`Causes`].

use crate::provider::ExtractError;
use eim_machine::encode::EncodeError;
use eim_machine::ops::{Errno, MapKind};
use eim_machine::FileId;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Upstream's `ErrDeferredFileID`: an earlier attempt failed recently.
    #[error("file {file_id}: deferred FileID (an earlier attempt failed; retried after the deferral timeout)")]
    Deferred { file_id: FileId },
    #[error("file {file_id}: failed to extract interval data: {cause}")]
    Extraction {
        file_id: FileId,
        cause: ExtractError,
    },
    #[error("file {file_id}: cannot encode its stack deltas: {cause}")]
    Encode { file_id: FileId, cause: EncodeError },
    #[error("file {file_id}: {map} is full ({capacity} entries)")]
    MapFull {
        file_id: FileId,
        map: MapKind,
        capacity: u32,
    },
    #[error(
        "file {file_id}: {op} on {map} failed with {errno} after {done} of {len} elements; {}",
        if *rolled_back { "nothing it wrote is left in use" } else { "entries that could not be removed yet will be retried" }
    )]
    Kernel {
        file_id: FileId,
        map: MapKind,
        op: &'static str,
        errno: Errno,
        done: usize,
        len: usize,
        rolled_back: bool,
    },
    #[error("file {file_id}: the reference was released, but {entries} entries could not be removed from {map} yet ({errno}); they will be retried")]
    UnloadIncomplete {
        file_id: FileId,
        map: MapKind,
        errno: Errno,
        entries: usize,
    },
    #[error("file {file_id}: mapping already exists")]
    AlreadyLoaded { file_id: FileId },
    #[error("file {file_id} is not known to the executable info manager")]
    Unknown { file_id: FileId },
    #[error("file {file_id} is known but holds no reference")]
    NoReference { file_id: FileId },
    #[error(
        "file {file_id}: entries of an earlier unload are still being removed from the kernel"
    )]
    CleanupPending { file_id: FileId },
    #[error("file {file_id}: the extraction this call waited for was aborted")]
    ExtractionAborted { file_id: FileId },
}

impl Error {
    pub fn file_id(&self) -> FileId {
        match self {
            Self::Deferred { file_id }
            | Self::Extraction { file_id, .. }
            | Self::Encode { file_id, .. }
            | Self::MapFull { file_id, .. }
            | Self::Kernel { file_id, .. }
            | Self::UnloadIncomplete { file_id, .. }
            | Self::AlreadyLoaded { file_id }
            | Self::Unknown { file_id }
            | Self::NoReference { file_id }
            | Self::CleanupPending { file_id }
            | Self::ExtractionAborted { file_id } => *file_id,
        }
    }

    pub fn is_deferred(&self) -> bool {
        matches!(self, Self::Deferred { .. })
    }
}

/// An error from another crate and every cause under it, joined by `": "`
/// as the CLI prints a chain, each text once: a cause whose text its
/// parent already printed (aya's `"map error: {0}"` over a `#[source]`) is
/// not printed again. Bounded: a chain deeper than `Causes::MAX_DEPTH`
/// (a cycle through a buggy `source()`) is cut.
#[derive(Clone, Copy)]
pub struct Causes<'a>(pub &'a (dyn std::error::Error + 'static));

impl Causes<'_> {
    /// The most causes printed under the error itself.
    pub(crate) const MAX_DEPTH: usize = 16;
}

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        let mut next = self.0.source();
        for _ in 0..Self::MAX_DEPTH {
            let Some(cause) = next else { break };
            let text = cause.to_string();
            if !shown.contains(&text) {
                shown.push_str(": ");
                shown.push_str(&text);
            }
            next = cause.source();
        }
        f.write_str(&shown)
    }
}

impl std::fmt::Debug for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
