//! Why the kernel maps could not be created, read or checked: every error
//! of the backend, naming the map, file id, path and errno it concerns.

use std::path::{Path, PathBuf};

use eim_core::error::Causes;
use eim_machine::unwind::{CAPTURE_STACK, MAX_FRAMES};
use eim_machine::FileId;

use crate::bpffs::MountError;
use crate::lock::LockError;
use crate::sys::SysError;

/// Why the maps could not be created or read. Each variant prints its
/// cause and returns none from `source()` (`eim_core::error`'s
/// convention); aya's errors are printed with their whole chain.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("loading the lookup object: {}", Causes(.0))]
    Load(aya::EbpfError),
    #[error("loading the lookup program: {}", Causes(.0))]
    Program(aya::programs::ProgramError),
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
    #[error("opening the inner array (map id {id}) of file {file_id} in the outer map of class {class}: {cause}")]
    InnerArray {
        class: u16,
        file_id: FileId,
        id: u32,
        cause: SysError,
    },
    #[error("the outer map of class {class} holds a value of {len} bytes for file {file_id}, not a map id")]
    OuterValue {
        class: u16,
        file_id: FileId,
        len: usize,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("the stack iterator for process {pid}: {what}: {why}")]
    StackIterator {
        pid: u32,
        what: &'static str,
        why: String,
    },
    #[error("the lookup result could not be decoded")]
    Result,
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Shape(#[from] ShapeMismatch),
    #[error("no consistent read of the maps pinned in {}: their owner{} was writing, or maps vanished, at each of {attempts} attempts over {waited:?}", dir.display(), owner.map_or(String::new(), |pid| format!(" (pid {pid})")))]
    Busy {
        dir: PathBuf,
        owner: Option<i32>,
        attempts: u32,
        waited: std::time::Duration,
    },
    #[error("{what} {}: {cause}", path.display())]
    Pin {
        path: PathBuf,
        what: &'static str,
        cause: std::io::Error,
    },
}

// By hand, not `#[from]`: that would also make aya's error our `source()`,
// and the CLI would print its text twice.
impl From<aya::EbpfError> for KernelError {
    fn from(e: aya::EbpfError) -> Self {
        Self::Load(e)
    }
}

impl From<aya::programs::ProgramError> for KernelError {
    fn from(e: aya::programs::ProgramError) -> Self {
        Self::Program(e)
    }
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

/// Why an unwinder record could not be decoded or a capture encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("an EimStack record of {len} bytes is shorter than its {need} bytes")]
    Short { len: usize, need: usize },
    #[error(
        "an EimStack record says {count} frames, more than the {MAX_FRAMES} an EimStack holds"
    )]
    TooManyFrames { count: u32 },
    #[error("an EimStack record has the unknown stop code {stop} (detail {detail})")]
    UnknownStop { stop: u32, detail: u32 },
    #[error(
        "a capture of {len} bytes of stack is more than the {CAPTURE_STACK} an EimCapture holds"
    )]
    CaptureTooLarge { len: usize },
    #[error(
        "an EimProfileSample record of {len} bytes is shorter than its {need}-byte kernel stack"
    )]
    ShortSample { len: usize, need: usize },
    #[error("an EimKernelStack says {count} frames, more than the {max} it holds")]
    TooManyKernelFrames { count: u32, max: usize },
}
