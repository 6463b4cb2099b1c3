//! The manager's errors. Every message names the file id, and for kernel
//! failures the map, the op and the errno.

use crate::encode::EncodeError;
use crate::ops::{Errno, MapKind};
use crate::provider::ExtractError;
use crate::FileId;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Upstream's `ErrDeferredFileID`: an earlier attempt failed recently.
    #[error("file {file_id}: deferred FileID (an earlier attempt failed; retried after the deferral timeout)")]
    Deferred { file_id: FileId },
    #[error("file {file_id}: failed to extract interval data: {source}")]
    Extraction {
        file_id: FileId,
        #[source]
        source: ExtractError,
    },
    #[error("file {file_id}: cannot encode its stack deltas: {source}")]
    Encode {
        file_id: FileId,
        #[source]
        source: EncodeError,
    },
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
