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
    pub(crate) const ENFILE: Errno = Errno(23);
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

    pub(crate) fn name(self) -> Option<&'static str> {
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
    /// `eim_process_mappings`
    ProcessMappings,
}

impl fmt::Display for MapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pages => f.write_str(abi::map_name::PAGES),
            Self::DeltaTables(class) => f.write_str(&abi::map_name::outer(*class)),
            Self::UnwindInfo => f.write_str(abi::map_name::UNWIND_INFO),
            Self::InterpreterOffsets => f.write_str(abi::map_name::INTERPRETER_OFFSETS),
            Self::ProcessMappings => f.write_str(abi::map_name::PROCESS_MAPPINGS),
        }
    }
}

/// What a backend does for each kind of op: the one dispatch of a
/// [`MapOp`] to its maps ([`apply_to`]) is shared by every backend, which
/// implements only the per-kind writes. Each method has the contract of
/// its op ([`MapOp`]'s variants) and of [`Backend::apply`].
pub trait OpTarget {
    fn put_unwind_infos(&mut self, infos: &[(u16, UnwindInfo)]) -> Result<(), OpFailure>;
    fn put_delta_table(
        &mut self,
        file_id: FileId,
        class: u16,
        deltas: &[abi::StackDelta],
    ) -> Result<(), OpFailure>;
    fn put_delta_tables(
        &mut self,
        class: u16,
        tables: &[(FileId, Arc<[abi::StackDelta]>)],
    ) -> Result<(), OpFailure>;
    fn put_pages(
        &mut self,
        pages: &[(StackDeltaPageKey, StackDeltaPageInfo)],
    ) -> Result<(), OpFailure>;
    fn delete_pages(&mut self, keys: &[StackDeltaPageKey]) -> Result<(), OpFailure>;
    fn delete_delta_table(&mut self, file_id: FileId, class: u16) -> Result<(), OpFailure>;
    fn put_interpreter_offsets(
        &mut self,
        file_id: FileId,
        range: &OffsetRange,
    ) -> Result<(), OpFailure>;
    fn delete_interpreter_offsets(&mut self, file_id: FileId) -> Result<(), OpFailure>;
    fn put_process_mappings(
        &mut self,
        pid: u32,
        mappings: &abi::ProcessMappings,
    ) -> Result<(), OpFailure>;
    fn delete_process_mappings(&mut self, pid: u32) -> Result<(), OpFailure>;
}

/// Carries out `op` on `target`: the dispatch every backend shares.
pub fn apply_to<T: OpTarget + ?Sized>(target: &mut T, op: &MapOp) -> Result<(), OpFailure> {
    match op {
        MapOp::PutUnwindInfos(infos) => target.put_unwind_infos(infos),
        MapOp::PutDeltaTable {
            file_id,
            map_id,
            deltas,
        } => target.put_delta_table(*file_id, *map_id, deltas),
        MapOp::PutDeltaTables { map_id, tables } => target.put_delta_tables(*map_id, tables),
        MapOp::PutPages(pages) => target.put_pages(pages),
        MapOp::DeletePages(keys) => target.delete_pages(keys),
        MapOp::DeleteDeltaTable { file_id, map_id } => target.delete_delta_table(*file_id, *map_id),
        MapOp::PutInterpreterOffsets { file_id, range } => {
            target.put_interpreter_offsets(*file_id, range)
        }
        MapOp::DeleteInterpreterOffsets { file_id } => target.delete_interpreter_offsets(*file_id),
        MapOp::PutProcessMappings { pid, mappings } => target.put_process_mappings(*pid, mappings),
        MapOp::DeleteProcessMappings { pid } => target.delete_process_mappings(*pid),
    }
}

/// The key and value buffers of a `PutUnwindInfos`: each slot index as
/// the array's 4-byte key, each rule as its value, end to end.
pub fn slot_buffers(infos: &[(u16, UnwindInfo)]) -> (Vec<u8>, Vec<u8>) {
    (
        abi::flatten(infos.iter().map(|(slot, _)| u32::from(*slot))),
        abi::flatten(infos.iter().map(|(_, info)| *info)),
    )
}

/// How many elements of a write with `BPF_NOEXIST` semantics (a
/// `PutPages`' entries, a `PutDeltaTables`' outer entries) are written
/// before it fails: the first key `present` in the map already, or
/// repeated within the op, stops it there with `EEXIST` (the elements
/// before it take effect). Both backends apply this one rule.
pub fn noexist_prefix<K: Ord + Copy>(
    keys: impl IntoIterator<Item = K>,
    present: impl Fn(&K) -> bool,
) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    let mut count = 0;
    for key in keys {
        if !seen.insert(key) || present(&key) {
            break;
        }
        count += 1;
    }
    count
}

/// The key and value buffers of a `PutPages`' entries (each key and
/// page info as the page map stores them, end to end).
pub fn page_buffers(pages: &[(StackDeltaPageKey, StackDeltaPageInfo)]) -> (Vec<u8>, Vec<u8>) {
    (
        abi::flatten(pages.iter().map(|(k, _)| *k)),
        abi::flatten(pages.iter().map(|(_, v)| *v)),
    )
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
    /// Insert or replace a process's executable file mappings (one update:
    /// readers see the old list or the new one, never a mix).
    PutProcessMappings {
        pid: u32,
        mappings: Arc<abi::ProcessMappings>,
    },
    /// Delete a process's mappings.
    DeleteProcessMappings { pid: u32 },
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
            Self::PutProcessMappings { .. } => "put process mappings",
            Self::DeleteProcessMappings { .. } => "delete process mappings",
        }
    }

    /// Whether the op removes entries (a missing entry is then no failure).
    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            Self::DeletePages(_)
                | Self::DeleteDeltaTable { .. }
                | Self::DeleteInterpreterOffsets { .. }
                | Self::DeleteProcessMappings { .. }
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
            Self::PutProcessMappings { .. } | Self::DeleteProcessMappings { .. } => {
                MapKind::ProcessMappings
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
    pub(crate) fn tail(&self, from: usize) -> Option<MapOp> {
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
            Self::PutProcessMappings { pid, mappings } => {
                write!(
                    f,
                    "PutProcessMappings({pid}, {} mappings)",
                    mappings.mappings.len()
                )
            }
            Self::DeleteProcessMappings { pid } => write!(f, "DeleteProcessMappings({pid})"),
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

    /// A run of ops that belong together (a plan and its rollback) starts:
    /// a backend whose maps other processes read may tell them not to
    /// trust a read that overlaps it (the kernel backend's generation
    /// counter). Every call is followed by one [`Self::end_writes`],
    /// whatever the ops gave; runs do not nest.
    fn begin_writes(&mut self) {}

    /// The run [`Self::begin_writes`] started is over.
    fn end_writes(&mut self) {}
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        (**self).apply(op)
    }
    fn begin_writes(&mut self) {
        (**self).begin_writes()
    }
    fn end_writes(&mut self) {
        (**self).end_writes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noexist_write_stops_at_the_first_present_or_repeated_key() {
        let info = StackDeltaPageInfo::default();
        let pages = [
            (key(1), info),
            (key(2), info),
            (key(1), info),
            (key(3), info),
        ];
        assert_eq!(
            noexist_prefix(pages.iter().map(|(k, _)| *k), |_| false),
            2,
            "the repeat stops it"
        );
        assert_eq!(
            noexist_prefix(pages.iter().map(|(k, _)| *k), |k| *k == key(2)),
            1
        );
        assert_eq!(
            noexist_prefix(pages[..2].iter().map(|(k, _)| *k), |_| false),
            2,
            "all are written"
        );
        assert_eq!(noexist_prefix(std::iter::empty::<u64>(), |_| true), 0);
    }

    #[test]
    fn slot_buffers_key_each_rule_by_its_slot() {
        use crate::abi::Wire;
        let rule = UnwindInfo::new(abi::opcode::BASE_SP, 16, 0, 0);
        let (keys, values) = slot_buffers(&[(3, rule), (0x1234, UnwindInfo::default())]);
        assert_eq!(keys, [3, 0, 0, 0, 0x34, 0x12, 0, 0]);
        assert_eq!(values.len(), 2 * UnwindInfo::SIZE);
        assert_eq!(UnwindInfo::read(&values[..UnwindInfo::SIZE]), Some(rule));
    }

    fn key(page: u64) -> StackDeltaPageKey {
        StackDeltaPageKey { file_id: 7, page }
    }

    /// One op of every kind; batches of three.
    fn every_op() -> Vec<MapOp> {
        let deltas: Arc<[abi::StackDelta]> = Arc::from(vec![abi::StackDelta::default(); 2]);
        vec![
            MapOp::PutUnwindInfos((0..3).map(|s| (s, UnwindInfo::default())).collect()),
            MapOp::PutDeltaTable {
                file_id: FileId(7),
                map_id: 9,
                deltas: deltas.clone(),
            },
            MapOp::PutDeltaTables {
                map_id: 10,
                tables: (1..4).map(|f| (FileId(f), deltas.clone())).collect(),
            },
            MapOp::PutPages(
                (0..3)
                    .map(|p| (key(p), StackDeltaPageInfo::default()))
                    .collect(),
            ),
            MapOp::DeletePages((0..3).map(key).collect()),
            MapOp::DeleteDeltaTable {
                file_id: FileId(7),
                map_id: 11,
            },
            MapOp::PutInterpreterOffsets {
                file_id: FileId(7),
                range: OffsetRange::default(),
            },
            MapOp::DeleteInterpreterOffsets { file_id: FileId(7) },
        ]
    }

    #[test]
    fn errnos_are_named_as_linux_names_them() {
        // The numbers are Linux's (asm-generic/errno-base.h, errno.h and
        // the kernel-internal ENOTSUPP), written out here, not taken from
        // the constants under test.
        let linux = [
            (1, "EPERM"),
            (2, "ENOENT"),
            (7, "E2BIG"),
            (9, "EBADF"),
            (12, "ENOMEM"),
            (14, "EFAULT"),
            (16, "EBUSY"),
            (17, "EEXIST"),
            (22, "EINVAL"),
            (23, "ENFILE"),
            (24, "EMFILE"),
            (28, "ENOSPC"),
            (524, "ENOTSUPP"),
        ];
        for (n, name) in linux {
            assert_eq!(Errno(n).name(), Some(name));
            assert_eq!(Errno(n).to_string(), format!("{name} ({n})"));
            assert_eq!(format!("{:?}", Errno(n)), format!("{name} ({n})"));
        }
        assert_eq!(Errno(99).name(), None);
        assert_eq!(Errno(99).to_string(), "errno 99");
    }

    #[test]
    fn only_per_element_and_resource_errnos_may_pass_in_part() {
        for e in [
            Errno::ENOMEM,
            Errno::E2BIG,
            Errno::ENOSPC,
            Errno::EMFILE,
            Errno::ENFILE,
        ] {
            assert!(e.may_pass_in_part(), "{e}");
        }
        for e in [
            Errno::EPERM,
            Errno::ENOENT,
            Errno::EBADF,
            Errno::EFAULT,
            Errno::EBUSY,
            Errno::EEXIST,
            Errno::EINVAL,
            Errno::ENOTSUPP,
        ] {
            assert!(!e.may_pass_in_part(), "{e}");
        }
    }

    #[test]
    fn maps_are_named_as_the_unwinder_names_them() {
        assert_eq!(MapKind::Pages.to_string(), "stack_delta_page_to_info");
        assert_eq!(
            MapKind::DeltaTables(12).to_string(),
            "exe_id_to_12_stack_deltas"
        );
        assert_eq!(MapKind::UnwindInfo.to_string(), "unwind_info_array");
        assert_eq!(
            MapKind::InterpreterOffsets.to_string(),
            "interpreter_offsets"
        );
    }

    #[test]
    fn each_op_knows_its_length_name_map_and_kind() {
        let want = [
            (
                3,
                "put unwind infos",
                MapKind::UnwindInfo,
                false,
                "PutUnwindInfos([",
            ),
            (
                1,
                "put delta table",
                MapKind::DeltaTables(9),
                false,
                "PutDeltaTable(0000000000000007, class 9, 2 deltas)",
            ),
            (
                3,
                "put delta tables",
                MapKind::DeltaTables(10),
                false,
                "PutDeltaTables(class 10, 3 tables",
            ),
            (3, "put pages", MapKind::Pages, false, "PutPages(3 pages)"),
            (
                3,
                "delete pages",
                MapKind::Pages,
                true,
                "DeletePages(3 pages)",
            ),
            (
                1,
                "delete delta table",
                MapKind::DeltaTables(11),
                true,
                "DeleteDeltaTable(0000000000000007, class 11)",
            ),
            (
                1,
                "put interpreter offsets",
                MapKind::InterpreterOffsets,
                false,
                "PutInterpreterOffsets(0000000000000007",
            ),
            (
                1,
                "delete interpreter offsets",
                MapKind::InterpreterOffsets,
                true,
                "DeleteInterpreterOffsets(0000000000000007)",
            ),
        ];
        for (op, (len, name, map, delete, debug)) in every_op().iter().zip(want) {
            assert_eq!(op.len(), len, "{op:?}");
            assert!(!op.is_empty(), "{op:?}");
            assert_eq!(op.name(), name);
            assert_eq!(op.map(), map, "{op:?}");
            assert_eq!(op.is_delete(), delete, "{op:?}");
            assert!(format!("{op:?}").starts_with(debug), "{op:?}");
        }
        assert!(MapOp::PutPages(Vec::new()).is_empty());
    }

    #[test]
    fn head_and_tail_split_an_op_where_a_batch_stopped() {
        for op in every_op() {
            let len = op.len();
            for n in 0..=len + 1 {
                let head = op.head(n);
                let tail = op.tail(n);
                let in_head = head.as_ref().map_or(0, MapOp::len);
                let in_tail = tail.as_ref().map_or(0, MapOp::len);
                assert_eq!(in_head, n.min(len), "{op:?} head {n}");
                assert_eq!(in_head + in_tail, len, "{op:?} split at {n}");
                if n >= len {
                    assert_eq!(head.as_ref(), Some(&op), "{op:?} head {n}");
                    assert_eq!(tail, None, "{op:?} tail {n}");
                }
                if n == 0 {
                    assert_eq!(tail.as_ref(), Some(&op), "{op:?} tail 0");
                }
                for part in head.iter().chain(tail.iter()) {
                    assert_eq!(part.name(), op.name(), "{op:?} at {n}");
                    assert_eq!(part.map(), op.map(), "{op:?} at {n}");
                }
            }
            // A batch's head of 0 is an empty batch; a single op's is none.
            match len {
                1 => assert_eq!(op.head(0), None, "{op:?}"),
                _ => assert_eq!(op.head(0).map(|h| h.len()), Some(0), "{op:?}"),
            }
        }
        // The elements kept are the first ones, and the tail the rest.
        let op = MapOp::DeletePages((0..3).map(key).collect());
        assert_eq!(op.head(2), Some(MapOp::DeletePages(vec![key(0), key(1)])));
        assert_eq!(op.tail(2), Some(MapOp::DeletePages(vec![key(2)])));
    }

    #[test]
    fn a_boxed_backend_applies_through_the_box() {
        struct Refuses(Vec<&'static str>);
        impl Backend for Refuses {
            fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
                self.0.push(op.name());
                Err(OpFailure::new(Errno::EPERM, 0))
            }
        }
        let mut boxed: Box<Refuses> = Box::new(Refuses(Vec::new()));
        let op = MapOp::DeleteInterpreterOffsets { file_id: FileId(1) };
        let result = <Box<Refuses> as Backend>::apply(&mut boxed, &op);
        assert_eq!(result, Err(OpFailure::new(Errno::EPERM, 0)));
        assert_eq!(boxed.0, ["delete interpreter offsets"]);
    }
}
