//! Why the kernel maps could not be created, read or checked: every error
//! of the backend, naming the map, file id, path and errno it concerns.

use std::path::{Path, PathBuf};

use eim_core::FileId;

use crate::bpffs::MountError;
use crate::lock::LockError;
use crate::sys::SysError;

/// Why the maps could not be created or read.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("loading the lookup object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("loading the lookup program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("the lookup object has no {0}")]
    Missing(String),
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("outer map of class {class} holds file {file_id} with map id {id}, which this backend did not publish")]
    Untracked {
        class: u16,
        file_id: FileId,
        id: u32,
    },
    #[error("opening the inner array (map id {id}) of file {file_id} in the outer map of class {class}: {source}")]
    InnerArray {
        class: u16,
        file_id: FileId,
        id: u32,
        #[source]
        source: SysError,
    },
    #[error("the outer map of class {class} holds a value of {len} bytes for file {file_id}, not a map id")]
    OuterValue {
        class: u16,
        file_id: FileId,
        len: usize,
    },
    #[error("the lookup result could not be decoded")]
    Result,
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Shape(#[from] ShapeMismatch),
    #[error("{what} {}: {source}", path.display())]
    Pin {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Pins whose shape differs from the one eim expects, left as they are.
#[derive(Debug, thiserror::Error)]
#[error("{}", mismatch_message(dir, maps))]
pub struct ShapeMismatch {
    pub dir: PathBuf,
    /// Each map's name and what differs (every differing field, with the
    /// pinned value and the expected one).
    pub maps: Vec<(String, String)>,
}

fn mismatch_message(dir: &Path, maps: &[(String, String)]) -> String {
    let each: Vec<String> = maps
        .iter()
        .map(|(name, why)| format!("{name}: {why}"))
        .collect();
    format!(
        "pinned maps in {} do not have the shape eim expects: {}; eim does not replace \
         them on its own (whatever reads them would lose them): remove them, or start \
         with --recreate-mismatched to replace them",
        dir.display(),
        each.join("; ")
    )
}
