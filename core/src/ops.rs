//! Map mutation commands, and the trait of whatever applies them.
//!
//! Every kernel effect of eim is a [`MapOp`]. The machine emits them in an
//! order that keeps a concurrent reader safe; a [`Backend`] (the real kernel
//! or the simulated one) applies them one at a time and reports exactly how
//! far it got, so that the machine never has to guess what the kernel holds.

use std::fmt;
use std::sync::Arc;

use crate::abi::{self, OffsetRange, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo};
use crate::FileId;

/// A Linux errno, as the `bpf()` syscall returns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const EBADF: Errno = Errno(9);
    pub const ENOMEM: Errno = Errno(12);
    pub const EFAULT: Errno = Errno(14);
    pub const EBUSY: Errno = Errno(16);
    pub const EEXIST: Errno = Errno(17);
    pub const EINVAL: Errno = Errno(22);
    pub const ENOSPC: Errno = Errno(28);
    pub const E2BIG: Errno = Errno(7);
    pub const ENOTSUPP: Errno = Errno(524);
    pub const ENFILE: Errno = Errno(23);
    pub const EMFILE: Errno = Errno(24);

    /// Whether a batch that failed with this errno may succeed in part:
    /// the error concerns one element (a table too big for a full map,
    /// E2BIG, ENOSPC) or a resource the whole batch used at once (memory,
    /// descriptors), so a smaller batch may not meet it.
    pub fn may_pass_in_part(self) -> bool {
        [
            Self::ENOMEM,
            Self::E2BIG,
            Self::ENOSPC,
            Self::EMFILE,
            Self::ENFILE,
        ]
        .contains(&self)
    }

    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::EPERM => "EPERM",
            Self::ENOENT => "ENOENT",
            Self::EBADF => "EBADF",
            Self::ENOMEM => "ENOMEM",
            Self::EFAULT => "EFAULT",
            Self::EBUSY => "EBUSY",
            Self::EEXIST => "EEXIST",
            Self::EINVAL => "EINVAL",
            Self::ENOSPC => "ENOSPC",
            Self::E2BIG => "E2BIG",
            Self::ENOTSUPP => "ENOTSUPP",
            Self::ENFILE => "ENFILE",
            Self::EMFILE => "EMFILE",
            _ => return None,
        })
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "errno {}", self.0),
        }
    }
}

/// The maps eim writes, for error messages and capacity bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapKind {
    /// `stack_delta_page_to_info`
    Pages,
    /// `exe_id_to_<class>_stack_deltas` and the inner array it points to.
    DeltaTables(u16),
    /// `unwind_info_array`
    UnwindInfo,
    /// `interpreter_offsets`
    InterpreterOffsets,
}

impl fmt::Display for MapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pages => f.write_str(abi::map_name::PAGES),
            Self::DeltaTables(class) => f.write_str(&abi::map_name::outer(*class)),
            Self::UnwindInfo => f.write_str(abi::map_name::UNWIND_INFO),
            Self::InterpreterOffsets => f.write_str(abi::map_name::INTERPRETER_OFFSETS),
        }
    }
}

/// One kernel effect. Batch ops hold several elements and may stop part way.
#[derive(Clone, PartialEq, Eq)]
pub enum MapOp {
    /// Write `unwind_info_array` slots (one batch).
    PutUnwindInfos(Vec<(u16, UnwindInfo)>),
    /// Create an inner array of the class, fill it with `deltas` (entries
    /// past the table read as zero) and publish it in the outer map of the
    /// class under the file id. All or nothing: a failed fill or publish
    /// leaves nothing in the kernel.
    PutDeltaTable {
        file_id: FileId,
        map_id: u16,
        deltas: Arc<[abi::StackDelta]>,
    },
    /// Create and fill an inner array of class `map_id` for each table (in
    /// order), then publish them all with ONE batch update of the class's
    /// outer map (one map-in-map RCU wait for the whole batch). The file ids
    /// must be absent from the outer map. `done` counts the tables published,
    /// always a prefix; the arrays of the others are freed. The undo of each
    /// published table is its [`MapOp::DeleteDeltaTable`].
    PutDeltaTables {
        map_id: u16,
        tables: Vec<(FileId, Arc<[abi::StackDelta]>)>,
    },
    /// Insert page entries (one batch; the keys must be absent).
    PutPages(Vec<(StackDeltaPageKey, StackDeltaPageInfo)>),
    /// Delete page entries (one batch; stops at the first missing key).
    DeletePages(Vec<StackDeltaPageKey>),
    /// Remove a file's inner array from the outer map of its class.
    DeleteDeltaTable { file_id: FileId, map_id: u16 },
    /// Insert or replace a file's interpreter ranges.
    PutInterpreterOffsets { file_id: FileId, range: OffsetRange },
    /// Delete a file's interpreter ranges.
    DeleteInterpreterOffsets { file_id: FileId },
}

impl MapOp {
    /// Elements in the op: what a backend's `done` counts.
    pub fn len(&self) -> usize {
        match self {
            Self::PutUnwindInfos(v) => v.len(),
            Self::PutDeltaTables { tables, .. } => tables.len(),
            Self::PutPages(v) => v.len(),
            Self::DeletePages(v) => v.len(),
            _ => 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The op's name, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::PutUnwindInfos(_) => "put unwind infos",
            Self::PutDeltaTable { .. } => "put delta table",
            Self::PutDeltaTables { .. } => "put delta tables",
            Self::PutPages(_) => "put pages",
            Self::DeletePages(_) => "delete pages",
            Self::DeleteDeltaTable { .. } => "delete delta table",
            Self::PutInterpreterOffsets { .. } => "put interpreter offsets",
            Self::DeleteInterpreterOffsets { .. } => "delete interpreter offsets",
        }
    }

    /// Whether the op removes entries (a missing entry is then no failure).
    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            Self::DeletePages(_)
                | Self::DeleteDeltaTable { .. }
                | Self::DeleteInterpreterOffsets { .. }
        )
    }

    /// The map the op writes.
    pub fn map(&self) -> MapKind {
        match self {
            Self::PutUnwindInfos(_) => MapKind::UnwindInfo,
            Self::PutDeltaTable { map_id, .. }
            | Self::PutDeltaTables { map_id, .. }
            | Self::DeleteDeltaTable { map_id, .. } => MapKind::DeltaTables(*map_id),
            Self::PutPages(_) | Self::DeletePages(_) => MapKind::Pages,
            Self::PutInterpreterOffsets { .. } | Self::DeleteInterpreterOffsets { .. } => {
                MapKind::InterpreterOffsets
            }
        }
    }

    /// The op restricted to its first `n` elements (what a batch that
    /// stopped after `n` elements left in effect). `None` when that is
    /// nothing for a single-element op (`n == 0`); a batch op gives a
    /// (possibly empty) batch.
    pub fn head(&self, n: usize) -> Option<MapOp> {
        Some(match self {
            Self::PutUnwindInfos(v) => Self::PutUnwindInfos(v[..n.min(v.len())].to_vec()),
            Self::PutDeltaTables { map_id, tables } => Self::PutDeltaTables {
                map_id: *map_id,
                tables: tables[..n.min(tables.len())].to_vec(),
            },
            Self::PutPages(v) => Self::PutPages(v[..n.min(v.len())].to_vec()),
            Self::DeletePages(v) => Self::DeletePages(v[..n.min(v.len())].to_vec()),
            single if n > 0 => single.clone(),
            _ => return None,
        })
    }

    /// The op restricted to the elements from `from` on (for a batch that
    /// stopped part way). Single-element ops are returned whole for `from == 0`.
    pub fn tail(&self, from: usize) -> Option<MapOp> {
        if from >= self.len() {
            return None;
        }
        Some(match self {
            Self::PutUnwindInfos(v) => Self::PutUnwindInfos(v[from..].to_vec()),
            Self::PutDeltaTables { map_id, tables } => Self::PutDeltaTables {
                map_id: *map_id,
                tables: tables[from..].to_vec(),
            },
            Self::PutPages(v) => Self::PutPages(v[from..].to_vec()),
            Self::DeletePages(v) => Self::DeletePages(v[from..].to_vec()),
            other => other.clone(),
        })
    }
}

impl fmt::Debug for MapOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PutUnwindInfos(v) => write!(f, "PutUnwindInfos({:?})", v),
            Self::PutDeltaTable {
                file_id,
                map_id,
                deltas,
            } => write!(
                f,
                "PutDeltaTable({file_id}, class {map_id}, {} deltas)",
                deltas.len()
            ),
            Self::PutDeltaTables { map_id, tables } => write!(
                f,
                "PutDeltaTables(class {map_id}, {} tables: {:?})",
                tables.len(),
                tables.iter().map(|(id, _)| *id).collect::<Vec<_>>()
            ),
            Self::PutPages(v) => write!(f, "PutPages({} pages)", v.len()),
            Self::DeletePages(v) => write!(f, "DeletePages({} pages)", v.len()),
            Self::DeleteDeltaTable { file_id, map_id } => {
                write!(f, "DeleteDeltaTable({file_id}, class {map_id})")
            }
            Self::PutInterpreterOffsets { file_id, range } => {
                write!(f, "PutInterpreterOffsets({file_id}, {range:?})")
            }
            Self::DeleteInterpreterOffsets { file_id } => {
                write!(f, "DeleteInterpreterOffsets({file_id})")
            }
        }
    }
}

/// How an op failed: the errno, and how many of its elements the kernel
/// processed before it stopped (for single-element ops always 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{errno} after {done} elements")]
pub struct OpFailure {
    pub errno: Errno,
    pub done: usize,
}

impl OpFailure {
    pub fn new(errno: Errno, done: usize) -> Self {
        Self { errno, done }
    }
}

/// Applies map ops to a kernel (real or simulated).
///
/// Contract: on success every element of the op is in effect; on failure
/// exactly the first `done` elements are in effect and nothing else changed.
pub trait Backend: Send {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure>;
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        (**self).apply(op)
    }
}
