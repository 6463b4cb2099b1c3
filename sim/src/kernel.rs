//! [`SimMaps`]: eim's kernel map set in memory, and the [`Backend`] that
//! applies [`MapOp`]s to it the way the real kernel backend does.
//!
//! Each op is carried out with the syscalls a kernel backend would issue
//! (one batch call where the real backend uses one), so every partial
//! failure the kernel can produce, the simulator produces too, with the same
//! errno and the same number of elements left in effect.

use std::collections::BTreeMap;

use eim_machine::abi::flatten;
use eim_machine::abi::{
    self, capacity, OffsetRange, ProcessMappings, StackDelta, StackDeltaPageInfo,
    StackDeltaPageKey, UnwindInfo, Wire, SIZE_CLASS_COUNT, SIZE_CLASS_MAX, SIZE_CLASS_MIN,
};
use eim_machine::ops::{self, Backend, Errno, MapOp, OpFailure, OpTarget};
use eim_machine::FileId;

use crate::faults::{Fault, FaultPlan};
use crate::maps::{BatchError, BpfMap, MapId, MapRegistry, MapSpec, BPF_ANY, BPF_NOEXIST};

/// Capacities of the simulated maps. The defaults are upstream's runtime
/// sizes; tests use tiny ones to reach the limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// `unwind_info_array` slots.
    pub unwind_info: u32,
    /// `interpreter_offsets` entries.
    pub interpreter_offsets: u32,
    /// `stack_delta_page_to_info` entries.
    pub pages: u32,
    /// Entries of each `exe_id_to_N_stack_deltas` outer map.
    pub outer: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            unwind_info: capacity::UNWIND_INFO,
            interpreter_offsets: capacity::INTERPRETER_OFFSETS,
            pages: capacity::PAGES,
            outer: capacity::OUTER,
        }
    }
}

/// Why the map set could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("cannot create map {name}: {errno}")]
    CreateMap { name: String, errno: Errno },
}

/// The spec of the inner delta array of a size class (also the outer map's
/// template): ARRAY, u32 index to a 4-byte [`StackDelta`], 2^class entries.
/// A class outside 8..=23 gets zero entries, which map creation refuses.
pub fn inner_spec(class: u16) -> MapSpec {
    MapSpec::array(
        StackDelta::SIZE as u32,
        abi::class_entries(class).unwrap_or(0),
    )
}

/// eim's maps in a simulated kernel.
///
/// Equality compares what a reader can observe: the contents of every map,
/// with inner delta arrays compared by contents (their ids may differ), plus
/// the number of live inner arrays (so a leak is a difference). The op
/// counter and pending faults are not part of it, so a test can compare the
/// maps before and after a failed call.
#[derive(Clone, Debug)]
pub struct SimMaps {
    pub(crate) config: SimConfig,
    pub(crate) reg: MapRegistry,
    pub(crate) pages: MapId,
    pub(crate) outers: [MapId; SIZE_CLASS_COUNT],
    pub(crate) unwind_info: MapId,
    pub(crate) interpreter_offsets: MapId,
    pub(crate) process_mappings: MapId,
    pub(crate) faults: FaultPlan,
}

impl SimMaps {
    /// Creates the maps with the given capacities (a zero capacity is
    /// `EINVAL`, as the kernel refuses such a map).
    pub fn new(config: SimConfig) -> Result<Self, SimError> {
        let mut reg = MapRegistry::new();
        let mut create = |name: String, spec: MapSpec| {
            reg.create(spec)
                .map_err(|errno| SimError::CreateMap { name, errno })
        };
        let pages = create(
            abi::map_name::PAGES.into(),
            MapSpec::hash(
                StackDeltaPageKey::SIZE as u32,
                StackDeltaPageInfo::SIZE as u32,
                config.pages,
            ),
        )?;
        let unwind_info = create(
            abi::map_name::UNWIND_INFO.into(),
            MapSpec::array(UnwindInfo::SIZE as u32, config.unwind_info),
        )?;
        let interpreter_offsets = create(
            abi::map_name::INTERPRETER_OFFSETS.into(),
            MapSpec::hash(
                u64::SIZE as u32,
                OffsetRange::SIZE as u32,
                config.interpreter_offsets,
            ),
        )?;
        // Not a SimConfig field: no simulation varies it.
        let process_mappings = create(
            abi::map_name::PROCESS_MAPPINGS.into(),
            MapSpec::hash(
                u32::SIZE as u32,
                ProcessMappings::SIZE as u32,
                capacity::PROCESSES,
            ),
        )?;
        let mut outers = [MapId(0); SIZE_CLASS_COUNT];
        for (slot, class) in outers.iter_mut().zip(SIZE_CLASS_MIN..=SIZE_CLASS_MAX) {
            *slot = create(
                abi::map_name::outer(class),
                MapSpec::hash_of_maps(u64::SIZE as u32, config.outer, inner_spec(class)),
            )?;
        }
        Ok(Self {
            config,
            reg,
            pages,
            outers,
            unwind_info,
            interpreter_offsets,
            process_mappings,
            faults: FaultPlan::default(),
        })
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// The underlying maps, for tests that poke at the kernel level.
    pub fn registry(&self) -> &MapRegistry {
        &self.reg
    }

    /// The outer map of a size class; `None` outside 8..=23.
    pub fn outer(&self, class: u16) -> Option<MapId> {
        let at = usize::from(class.checked_sub(SIZE_CLASS_MIN)?);
        self.outers.get(at).copied()
    }

    fn map(&self, id: MapId) -> Option<&BpfMap> {
        self.reg.get(id)
    }

    /// One of eim's maps by its name (`abi::map_name`), for tests that
    /// compare raw bytes with the kernel's.
    pub fn map_named(&self, name: &str) -> Option<&BpfMap> {
        let id = match name {
            abi::map_name::PAGES => self.pages,
            abi::map_name::UNWIND_INFO => self.unwind_info,
            abi::map_name::INTERPRETER_OFFSETS => self.interpreter_offsets,
            _ => (SIZE_CLASS_MIN..=SIZE_CLASS_MAX)
                .find(|&class| abi::map_name::outer(class) == name)
                .and_then(|class| self.outer(class))?,
        };
        self.map(id)
    }

    /// The page entry under `key`.
    pub fn page(&self, key: &StackDeltaPageKey) -> Option<StackDeltaPageInfo> {
        let value = self.reg.lookup(self.pages, &key.to_bytes()).ok()?;
        StackDeltaPageInfo::read(value)
    }

    /// Every page entry, decoded, in key order.
    pub fn pages(&self) -> BTreeMap<StackDeltaPageKey, StackDeltaPageInfo> {
        decoded(self.map(self.pages))
    }

    /// The inner delta array published for `file_id` in class `class`.
    pub fn delta_table(&self, class: u16, file_id: FileId) -> Option<InnerTable<'_>> {
        let map = self.reg.inner(self.outer(class)?, &file_id.0.to_bytes())?;
        Some(InnerTable { map })
    }

    /// Every published delta array, by (class, file id).
    pub fn delta_tables(&self) -> BTreeMap<(u16, FileId), InnerTable<'_>> {
        let mut all = BTreeMap::new();
        for class in SIZE_CLASS_MIN..=SIZE_CLASS_MAX {
            for file_id in self.file_ids(class) {
                if let Some(table) = self.delta_table(class, file_id) {
                    all.insert((class, file_id), table);
                }
            }
        }
        all
    }

    /// The file ids present in the outer map of `class`, in order.
    pub fn file_ids(&self, class: u16) -> Vec<FileId> {
        let Some(outer) = self.outer(class).and_then(|id| self.map(id)) else {
            return Vec::new();
        };
        let mut ids: Vec<FileId> = outer
            .entries()
            .filter_map(|(k, _)| u64::read(k).map(FileId))
            .collect();
        ids.sort();
        ids
    }

    /// `unwind_info_array[slot]` as the BPF side reads it (zeros if never
    /// written); `None` at or past the capacity.
    pub fn unwind_info(&self, slot: u32) -> Option<UnwindInfo> {
        UnwindInfo::read(self.map(self.unwind_info)?.slot(slot)?)
    }

    /// All `unwind_info_array` slots (capacity many; zero where unwritten).
    pub fn unwind_infos(&self) -> Vec<UnwindInfo> {
        (0..self.config.unwind_info)
            .map(|slot| self.unwind_info(slot).unwrap_or_default())
            .collect()
    }

    /// What the maps hold, as a warm restart's reconcile reads it (the
    /// same dump `KernelMaps::dump` gives of real maps). The maps keep no
    /// record of when a slot was last zeroed (`zeroed_ago` unknown; the
    /// simulator's `FaultyBackend` keeps one).
    pub fn observed(&self) -> eim_machine::machine::Observed {
        eim_machine::machine::Observed {
            pages: self.pages(),
            delta_tables: self
                .delta_tables()
                .into_iter()
                .map(|(key, table)| (key, table.entries()))
                .collect(),
            unwind_infos: self.unwind_infos(),
            interpreter_offsets: self.interpreter_offsets(),
            process_mappings: self.process_mappings(),
            zeroed_ago: None,
        }
    }

    /// Slots outside of `0..n` all read as zero, for the returned `n`.
    pub fn unwind_info_extent(&self) -> usize {
        self.map(self.unwind_info).map_or(0, BpfMap::array_extent)
    }

    /// Every `interpreter_offsets` entry, decoded.
    pub fn interpreter_offsets(&self) -> BTreeMap<FileId, OffsetRange> {
        decoded::<u64, OffsetRange>(self.map(self.interpreter_offsets))
            .into_iter()
            .map(|(k, v)| (FileId(k), v))
            .collect()
    }

    /// Every `eim_process_mappings` entry, decoded (an entry that does not
    /// decode is left out; only a corrupt writer makes one).
    pub fn process_mappings(&self) -> BTreeMap<u32, ProcessMappings> {
        decoded::<u32, ProcessMappings>(self.map(self.process_mappings))
    }

    /// Process `pid`'s mappings, as the unwinder reads them.
    pub fn process(&self, pid: u32) -> Option<ProcessMappings> {
        let value = self
            .reg
            .lookup(self.process_mappings, &pid.to_bytes())
            .ok()?;
        ProcessMappings::read(value)
    }

    /// Inner delta arrays alive (published, or leaked if the count is
    /// higher than the number of published tables).
    pub fn live_inner_maps(&self) -> usize {
        self.reg.live().saturating_sub(4 + SIZE_CLASS_COUNT)
    }

    /// Number of published delta tables over all classes.
    pub fn table_count(&self) -> usize {
        self.outers
            .iter()
            .filter_map(|&id| self.map(id))
            .map(BpfMap::len)
            .sum()
    }

    /// Nothing of any file is in the maps: no page, no delta table (and no
    /// inner array alive), no interpreter offsets. Unwind infos may remain:
    /// an unused slot keeps its rule (cooling) until another rule needs it.
    pub fn holds_no_file_data(&self) -> bool {
        self.map(self.pages).is_none_or(BpfMap::is_empty)
            && self.table_count() == 0
            && self.live_inner_maps() == 0
            && self
                .map(self.interpreter_offsets)
                .is_none_or(BpfMap::is_empty)
    }

    /// As freshly created: no file data and every unwind slot zero.
    pub fn is_pristine(&self) -> bool {
        self.holds_no_file_data() && self.unwind_info_extent() == 0
    }

    /// Applies `op` without fault injection or counting: the kernel's
    /// answer to the syscalls a real backend issues for it.
    pub(crate) fn apply_now(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        ops::apply_to(self, op)
    }
}

/// Each kind of op as the syscalls a real backend issues for it.
impl OpTarget for SimMaps {
    fn put_unwind_infos(&mut self, infos: &[(u16, UnwindInfo)]) -> Result<(), OpFailure> {
        let (keys, values) = ops::slot_buffers(infos);
        self.reg
            .update_batch(self.unwind_info, &keys, &values, infos.len(), 0)
            .map_err(failure)
    }

    /// Create the inner array, fill it with one batch, publish it with
    /// `BPF_NOEXIST`, close the creator's fd. All or nothing: on any failure
    /// the fd is closed and the unpublished array freed.
    fn put_delta_table(
        &mut self,
        file_id: FileId,
        class: u16,
        deltas: &[StackDelta],
    ) -> Result<(), OpFailure> {
        let fail = |errno| OpFailure::new(errno, 0);
        let outer = self.outer(class).ok_or(fail(Errno::EINVAL))?;
        u32::try_from(deltas.len()).map_err(|_| fail(Errno::E2BIG))?;
        let inner = self.reg.create(inner_spec(class)).map_err(fail)?;
        let filled = fill(&mut self.reg, inner, deltas).map_err(|e| e.errno);
        let published = filled.and_then(|()| {
            self.reg.update(
                outer,
                &file_id.0.to_bytes(),
                &inner.0.to_le_bytes(),
                BPF_NOEXIST,
            )
        });
        // The creator's fd is closed on every path; the outer entry, if
        // any, keeps the array alive.
        let closed = self.reg.close(inner);
        published.and(closed).map_err(fail)
    }

    /// Create and fill the inner array of every table (one batch each),
    /// then publish them all with ONE batch update of the outer map, then
    /// close the creator's fds. A batch update cannot say `BPF_NOEXIST`, so,
    /// like the real backend, the file ids are checked absent first (and
    /// against repeats inside the op): the absent prefix is published and
    /// `EEXIST` reported at the first present id. A failed create or fill
    /// publishes nothing (`done` 0); a failed publish leaves the kernel's
    /// processed prefix. Unpublished arrays are freed on every path.
    fn put_delta_tables(
        &mut self,
        class: u16,
        tables: &[(FileId, std::sync::Arc<[StackDelta]>)],
    ) -> Result<(), OpFailure> {
        let fail = |errno| OpFailure::new(errno, 0);
        let outer = self.outer(class).ok_or(fail(Errno::EINVAL))?;
        let mut created = Vec::with_capacity(tables.len());
        let mut filled = Ok(());
        for (_, deltas) in tables {
            if u32::try_from(deltas.len()).is_err() {
                filled = Err(Errno::E2BIG);
                break;
            }
            let inner = match self.reg.create(inner_spec(class)) {
                Ok(inner) => inner,
                Err(errno) => {
                    filled = Err(errno);
                    break;
                }
            };
            created.push(inner);
            if let Err(e) = fill(&mut self.reg, inner, deltas) {
                filled = Err(e.errno);
                break;
            }
        }
        let published = filled.map_err(fail).and_then(|()| {
            let absent = ops::noexist_prefix(tables.iter().map(|(id, _)| *id), |id| {
                self.reg.inner(outer, &id.0.to_bytes()).is_some()
            });
            let keys = flatten(tables[..absent].iter().map(|(id, _)| id.0));
            let values = flatten(created[..absent].iter().map(|inner| inner.0));
            self.reg
                .update_batch(outer, &keys, &values, absent, 0)
                .map_err(failure)?;
            if absent < tables.len() {
                return Err(OpFailure::new(Errno::EEXIST, absent));
            }
            Ok(())
        });
        // The creator's fds are closed on every path; the outer entries
        // keep the published arrays alive.
        let mut closed = Ok(());
        for inner in created {
            closed = closed.and(self.reg.close(inner));
        }
        match (published, closed) {
            (Err(e), _) => Err(e),
            (Ok(()), Err(errno)) => Err(OpFailure::new(errno, tables.len())),
            (Ok(()), Ok(())) => Ok(()),
        }
    }

    /// Pages must be absent, but a batch update cannot say `BPF_NOEXIST`
    /// (its `elem_flags` may only be 0). So, like the real backend, look
    /// each key up first (and catch a key repeated inside the op), then
    /// write the absent prefix with one batch and report `EEXIST` at the
    /// first present key.
    fn put_pages(
        &mut self,
        pages: &[(StackDeltaPageKey, StackDeltaPageInfo)],
    ) -> Result<(), OpFailure> {
        let absent = ops::noexist_prefix(pages.iter().map(|(k, _)| *k), |key| {
            self.page(key).is_some()
        });
        let prefix = &pages[..absent];
        let (keys, values) = ops::page_buffers(prefix);
        self.reg
            .update_batch(self.pages, &keys, &values, prefix.len(), 0)
            .map_err(failure)?;
        if absent < pages.len() {
            return Err(OpFailure::new(Errno::EEXIST, absent));
        }
        Ok(())
    }

    fn delete_pages(&mut self, keys: &[StackDeltaPageKey]) -> Result<(), OpFailure> {
        let flat = flatten(keys.iter().copied());
        self.reg
            .delete_batch(self.pages, &flat, keys.len(), 0)
            .map_err(failure)
    }

    fn delete_delta_table(&mut self, file_id: FileId, class: u16) -> Result<(), OpFailure> {
        // A real backend rejects a class it has no map for before any
        // syscall.
        let outer = self.outer(class).ok_or(OpFailure::new(Errno::EINVAL, 0))?;
        self.reg
            .delete(outer, &file_id.0.to_bytes())
            .map_err(|errno| OpFailure::new(errno, 0))
    }

    fn put_interpreter_offsets(
        &mut self,
        file_id: FileId,
        range: &OffsetRange,
    ) -> Result<(), OpFailure> {
        self.reg
            .update(
                self.interpreter_offsets,
                &file_id.0.to_bytes(),
                &range.to_bytes(),
                BPF_ANY,
            )
            .map_err(|errno| OpFailure::new(errno, 0))
    }

    fn delete_interpreter_offsets(&mut self, file_id: FileId) -> Result<(), OpFailure> {
        self.reg
            .delete(self.interpreter_offsets, &file_id.0.to_bytes())
            .map_err(|errno| OpFailure::new(errno, 0))
    }

    fn put_process_mappings(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
    ) -> Result<(), OpFailure> {
        self.reg
            .update(
                self.process_mappings,
                &pid.to_bytes(),
                &mappings.to_bytes(),
                BPF_ANY,
            )
            .map_err(|errno| OpFailure::new(errno, 0))
    }

    fn delete_process_mappings(&mut self, pid: u32) -> Result<(), OpFailure> {
        self.reg
            .delete(self.process_mappings, &pid.to_bytes())
            .map_err(|errno| OpFailure::new(errno, 0))
    }
}

/// The unwinder's PC-to-mapping step, over the simulated map.
impl eim_machine::unwind::Mappings for SimMaps {
    fn find(&self, pid: u32, pc: u64) -> Option<abi::ProcessMapping> {
        self.process(pid)?.find(pc).copied()
    }
}

impl Backend for SimMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        match self
            .faults
            .next_op()
            .or_else(|| self.faults.poison_fault(op))
        {
            None => self.apply_now(op),
            Some(fault) => self.apply_faulty(op, fault),
        }
    }
}

impl PartialEq for SimMaps {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: MapId, b: MapId| self.map(a) == other.map(b);
        self.config == other.config
            && same(self.pages, other.pages)
            && same(self.unwind_info, other.unwind_info)
            && same(self.interpreter_offsets, other.interpreter_offsets)
            && self.live_inner_maps() == other.live_inner_maps()
            && self.delta_tables() == other.delta_tables()
    }
}

impl Eq for SimMaps {}

/// A published inner delta array, as a reader sees it.
#[derive(Clone, Copy, Debug)]
pub struct InnerTable<'a> {
    map: &'a BpfMap,
}

impl PartialEq for InnerTable<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for InnerTable<'_> {}

impl InnerTable<'_> {
    /// Entries of the array (2^class).
    pub fn capacity(&self) -> u32 {
        self.map.spec().max_entries
    }

    /// Entry `index` (zero if never written); `None` past the end.
    pub fn get(&self, index: u32) -> Option<StackDelta> {
        StackDelta::read(self.map.slot(index)?)
    }

    /// Entries outside of `0..n` all read as zero, for the returned `n`.
    pub fn extent(&self) -> usize {
        self.map.array_extent()
    }

    /// The first `n` entries (fewer if the array is smaller).
    pub fn prefix(&self, n: usize) -> Vec<StackDelta> {
        let n = n.min(self.capacity() as usize) as u32;
        (0..n).filter_map(|i| self.get(i)).collect()
    }

    /// The entries up to [`InnerTable::extent`]. A table whose last deltas
    /// are all-zero (`{0, 0}`) is shorter here than it was written; compare
    /// with [`InnerTable::holds`] when the length is known.
    pub fn entries(&self) -> Vec<StackDelta> {
        self.prefix(self.extent())
    }

    /// The array holds exactly `deltas` followed by zeros.
    pub fn holds(&self, deltas: &[StackDelta]) -> bool {
        deltas.len() <= self.capacity() as usize
            && self.extent() <= deltas.len()
            && self.prefix(deltas.len()) == deltas
    }
}

/// Elements an inner array is filled with per batch call: the keys and
/// values of a whole table at once would be two more copies of it (54 MB
/// for the 6.7 million deltas of the worst `.eh_frame`).
const FILL_CHUNK: usize = 1 << 16;

/// Fills the new inner array `inner` with `deltas` from index 0, a chunk at
/// a time. Only whether it failed, and with which errno, matters: a table
/// not filled is never published, so how far the fill got does not show
/// (the real backend writes the whole array through one mapping).
fn fill(reg: &mut MapRegistry, inner: MapId, deltas: &[StackDelta]) -> Result<(), BatchError> {
    let mut start = 0u32;
    for chunk in deltas.chunks(FILL_CHUNK) {
        // `deltas` has at most `u32::MAX` elements (checked by the caller).
        let end = start.saturating_add(chunk.len() as u32);
        let keys = flatten(start..end);
        let values = flatten(chunk.iter().copied());
        reg.update_batch(inner, &keys, &values, chunk.len(), 0)
            .map_err(|e| BatchError {
                errno: e.errno,
                processed: start as usize + e.processed,
            })?;
        start = end;
    }
    Ok(())
}

fn failure(e: BatchError) -> OpFailure {
    OpFailure::new(e.errno, e.processed)
}

/// A hash map's entries decoded; entries that do not decode (impossible
/// when the map's sizes match the types) are skipped.
fn decoded<K: Wire + Ord, V: Wire>(map: Option<&BpfMap>) -> BTreeMap<K, V> {
    map.into_iter()
        .flat_map(BpfMap::entries)
        .filter_map(|(k, v)| Some((K::read(k)?, V::read(v)?)))
        .collect()
}

/// Fault injection ([`crate::faults`]): what a test or a workload schedules.
impl SimMaps {
    /// The k-th apply from now (0 = the next) fails with `errno`, `done = 0`
    /// and no effect.
    pub fn fail_op(&mut self, k: u64, errno: Errno) {
        self.faults.schedule(k, Fault::Fail(errno));
    }

    /// The k-th apply from now processes `after` elements, capped at the
    /// op's length − 1 so that it still fails, then fails with `errno`. If
    /// the kernel itself fails earlier inside those elements, that failure
    /// is reported instead (it happens first).
    pub fn stop_batch(&mut self, k: u64, after: usize, errno: Errno) {
        self.faults.schedule(k, Fault::StopAfter { after, errno });
    }

    /// Every write of `file_id`'s entries fails with `errno` at its own
    /// element (the elements before it take effect), until
    /// [`SimMaps::clear_faults`].
    pub fn poison_file(&mut self, file_id: FileId, errno: Errno) {
        self.faults.poison(file_id, errno);
    }

    /// Drops every scheduled fault and poisoned file (the op counter keeps
    /// counting).
    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// Poisons no file any more (scheduled faults stay).
    pub fn clear_poison(&mut self) {
        self.faults.clear_poison();
    }

    /// Writes that failed because they wrote a poisoned file's entries.
    pub fn poison_hits(&self) -> u64 {
        self.faults.poison_hits()
    }

    /// Number of `apply` calls so far, faulty or not.
    pub fn ops_applied(&self) -> u64 {
        self.faults.applied()
    }

    /// Faults scheduled and not yet reached.
    pub fn pending_faults(&self) -> usize {
        self.faults.pending()
    }

    /// Applies `op` under `fault`.
    pub(crate) fn apply_faulty(&mut self, op: &MapOp, fault: Fault) -> Result<(), OpFailure> {
        match fault {
            Fault::Fail(errno) => Err(OpFailure::new(errno, 0)),
            Fault::StopAfter { after, errno } => {
                let done = after.min(op.len().saturating_sub(1));
                if let Some(head) = op.head(done) {
                    self.apply_now(&head)?;
                }
                Err(OpFailure::new(errno, done))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use eim_machine::deltas::info::sp;
    use std::sync::Arc;

    use super::*;
    use crate::maps::{MapType, BPF_ANY};

    pub(crate) fn tiny() -> SimConfig {
        SimConfig {
            unwind_info: 4,
            interpreter_offsets: 2,
            pages: 4,
            outer: 2,
        }
    }

    fn sim(config: SimConfig) -> SimMaps {
        SimMaps::new(config).expect("valid config")
    }

    fn key(file: u64, page: u64) -> StackDeltaPageKey {
        StackDeltaPageKey {
            file_id: file,
            page: page << 16,
        }
    }

    fn info(first: u32) -> StackDeltaPageInfo {
        StackDeltaPageInfo {
            first_delta: first,
            num_deltas: 1,
            map_id: 8,
        }
    }

    fn deltas(n: u16) -> Arc<[StackDelta]> {
        (0..n)
            .map(|i| StackDelta {
                addr_low: i * 4,
                unwind_info: i % 3,
            })
            .collect()
    }

    fn put_table(file: u64, map_id: u16, n: u16) -> MapOp {
        MapOp::PutDeltaTable {
            file_id: FileId(file),
            map_id,
            deltas: deltas(n),
        }
    }

    #[test]
    fn a_new_map_set_is_pristine_and_sized_by_the_config() {
        let s = sim(SimConfig::default());
        assert!(s.is_pristine());
        assert_eq!(s.unwind_infos().len(), 16384);
        assert_eq!(s.live_inner_maps(), 0);
        let t = sim(tiny());
        assert_eq!(t.unwind_infos(), vec![UnwindInfo::default(); 4]);
        let zero = SimConfig { pages: 0, ..tiny() };
        assert!(matches!(
            SimMaps::new(zero),
            Err(SimError::CreateMap {
                errno: Errno::EINVAL,
                ..
            })
        ));
    }

    #[test]
    fn the_outer_template_is_the_class_array() {
        let s = sim(tiny());
        for class in SIZE_CLASS_MIN..=SIZE_CLASS_MAX {
            let outer = s.outer(class).and_then(|id| s.map(id)).expect("outer map");
            assert_eq!(outer.spec().inner.as_deref(), Some(&inner_spec(class)));
            assert_eq!(outer.spec().key_size, 8);
        }
        assert_eq!(s.outer(7), None);
        assert_eq!(s.outer(24), None);
    }

    #[test]
    fn maps_are_found_by_their_names() {
        let mut s = sim(tiny());
        let shape = |name: &str| {
            let spec = s.map_named(name).expect(name).spec();
            (spec.kind, spec.key_size, spec.value_size, spec.max_entries)
        };
        assert_eq!(shape("stack_delta_page_to_info"), (MapType::Hash, 16, 8, 4));
        assert_eq!(shape("unwind_info_array"), (MapType::Array, 4, 12, 4));
        assert_eq!(shape("interpreter_offsets"), (MapType::Hash, 8, 40, 2));
        for class in SIZE_CLASS_MIN..=SIZE_CLASS_MAX {
            let name = format!("exe_id_to_{class}_stack_deltas");
            assert_eq!(shape(&name), (MapType::HashOfMaps, 8, 4, 2));
            let inner = s.map_named(&name).and_then(|m| m.spec().inner.clone());
            assert_eq!(inner.as_deref(), Some(&inner_spec(class)));
        }
        for name in ["exe_id_to_7_stack_deltas", "exe_id_to_24_stack_deltas", ""] {
            assert!(s.map_named(name).is_none(), "{name}");
        }
        let range = OffsetRange {
            lower_offset1: 1,
            upper_offset1: 2,
            program_index: 4,
            ..OffsetRange::default()
        };
        let op = MapOp::PutInterpreterOffsets {
            file_id: FileId(9),
            range,
        };
        assert_eq!(s.apply(&op), Ok(()));
        let raw: Vec<(Vec<u8>, Vec<u8>)> = s
            .map_named("interpreter_offsets")
            .expect("offsets")
            .entries()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(raw, [(9u64.to_le_bytes().to_vec(), range.to_bytes())]);
    }

    #[test]
    fn unwind_infos_are_one_batch_that_stops_at_the_capacity() {
        let mut s = sim(tiny());
        let op = MapOp::PutUnwindInfos(vec![(0, sp(8)), (3, sp(16)), (4, sp(24)), (1, sp(32))]);
        assert_eq!(s.apply(&op), Err(OpFailure::new(Errno::E2BIG, 2)));
        assert_eq!(
            s.unwind_infos(),
            vec![sp(8), UnwindInfo::default(), UnwindInfo::default(), sp(16)]
        );
        assert_eq!(s.apply(&MapOp::PutUnwindInfos(vec![(3, sp(40))])), Ok(()));
        assert_eq!(s.unwind_info(3), Some(sp(40)));
        assert_eq!(s.unwind_info(4), None);
        assert!(s.holds_no_file_data());
        assert!(!s.is_pristine());
    }

    #[test]
    fn a_delta_table_is_published_whole() {
        let mut s = sim(tiny());
        assert_eq!(s.apply(&put_table(5, 8, 10)), Ok(()));
        let table = s.delta_table(8, FileId(5)).expect("published");
        assert_eq!(table.capacity(), 256);
        assert!(table.holds(&deltas(10)));
        assert_eq!(table.entries(), deltas(10)[..].to_vec());
        assert_eq!(table.get(255), Some(StackDelta::default()));
        assert_eq!(table.get(256), None);
        assert_eq!(s.file_ids(8), vec![FileId(5)]);
        assert_eq!(s.live_inner_maps(), 1);
        assert_eq!(s.table_count(), 1);
        // The same file again: EEXIST, and the second array does not leak.
        let before = s.clone();
        assert_eq!(
            s.apply(&put_table(5, 8, 3)),
            Err(OpFailure::new(Errno::EEXIST, 0))
        );
        assert_eq!(s, before);
        assert_eq!(s.live_inner_maps(), 1);
        assert!(s
            .delta_table(8, FileId(5))
            .is_some_and(|t| t.holds(&deltas(10))));
    }

    #[test]
    fn a_table_too_big_for_its_class_fails_the_fill_and_leaves_nothing() {
        let mut s = sim(tiny());
        let before = s.clone();
        assert_eq!(
            s.apply(&put_table(5, 8, 257)),
            Err(OpFailure::new(Errno::E2BIG, 0))
        );
        assert_eq!(s, before);
        assert_eq!(s.live_inner_maps(), 0);
        assert_eq!(
            s.apply(&put_table(5, 7, 1)),
            Err(OpFailure::new(Errno::EINVAL, 0))
        );
        assert_eq!(
            s.apply(&put_table(5, 24, 1)),
            Err(OpFailure::new(Errno::EINVAL, 0))
        );
        assert_eq!(s.live_inner_maps(), 0);
    }

    #[test]
    fn a_full_outer_map_rejects_the_publish_and_frees_the_array() {
        let mut s = sim(tiny());
        assert_eq!(s.apply(&put_table(1, 9, 300)), Ok(()));
        assert_eq!(s.apply(&put_table(2, 9, 300)), Ok(()));
        let before = s.clone();
        assert_eq!(
            s.apply(&put_table(3, 9, 300)),
            Err(OpFailure::new(Errno::E2BIG, 0))
        );
        assert_eq!(s, before);
        assert_eq!(s.live_inner_maps(), 2);
        // Another class has its own outer map.
        assert_eq!(s.apply(&put_table(3, 10, 600)), Ok(()));
        assert_eq!(s.live_inner_maps(), 3);
    }

    #[test]
    fn deleting_a_table_frees_its_array() {
        let mut s = sim(tiny());
        assert_eq!(s.apply(&put_table(1, 8, 4)), Ok(()));
        let del = MapOp::DeleteDeltaTable {
            file_id: FileId(1),
            map_id: 8,
        };
        assert_eq!(s.apply(&del), Ok(()));
        assert_eq!(s.live_inner_maps(), 0);
        assert!(s.is_pristine());
        assert_eq!(s.apply(&del), Err(OpFailure::new(Errno::ENOENT, 0)));
        let bad = MapOp::DeleteDeltaTable {
            file_id: FileId(1),
            map_id: 30,
        };
        assert_eq!(s.apply(&bad), Err(OpFailure::new(Errno::EINVAL, 0)));
    }

    #[test]
    fn pages_must_be_absent_and_stop_at_the_first_present_key() {
        let mut s = sim(tiny());
        assert_eq!(
            s.apply(&MapOp::PutPages(vec![(key(1, 2), info(0))])),
            Ok(())
        );
        let op = MapOp::PutPages(vec![
            (key(1, 0), info(0)),
            (key(1, 1), info(1)),
            (key(1, 2), info(9)),
        ]);
        assert_eq!(s.apply(&op), Err(OpFailure::new(Errno::EEXIST, 2)));
        assert_eq!(s.page(&key(1, 2)), Some(info(0)), "not overwritten");
        assert_eq!(s.pages().len(), 3);
        // A key repeated inside one op is present by the time it comes again.
        let mut t = sim(tiny());
        let dup = MapOp::PutPages(vec![(key(1, 0), info(0)), (key(1, 0), info(5))]);
        assert_eq!(t.apply(&dup), Err(OpFailure::new(Errno::EEXIST, 1)));
        assert_eq!(t.page(&key(1, 0)), Some(info(0)));
    }

    #[test]
    fn pages_stop_at_the_capacity() {
        let mut s = sim(tiny());
        let op = MapOp::PutPages((0..6).map(|p| (key(1, p), info(p as u32))).collect());
        assert_eq!(s.apply(&op), Err(OpFailure::new(Errno::E2BIG, 4)));
        let keys: Vec<_> = s.pages().into_keys().collect();
        assert_eq!(keys, (0..4).map(|p| key(1, p)).collect::<Vec<_>>());
    }

    #[test]
    fn page_deletes_stop_at_the_first_missing_key() {
        let mut s = sim(tiny());
        let put = MapOp::PutPages((0..3).map(|p| (key(1, p), info(0))).collect());
        assert_eq!(s.apply(&put), Ok(()));
        let del = MapOp::DeletePages(vec![key(1, 0), key(1, 7), key(1, 1)]);
        assert_eq!(s.apply(&del), Err(OpFailure::new(Errno::ENOENT, 1)));
        let keys: Vec<_> = s.pages().into_keys().collect();
        assert_eq!(keys, vec![key(1, 1), key(1, 2)]);
        assert_eq!(
            s.apply(&MapOp::DeletePages(vec![key(1, 1), key(1, 2)])),
            Ok(())
        );
        assert!(s.is_pristine());
    }

    #[test]
    fn interpreter_offsets_replace_and_fill_up() {
        let mut s = sim(tiny());
        let range = |p: u16| OffsetRange {
            lower_offset1: 0x10,
            upper_offset1: 0x20,
            program_index: p,
            ..OffsetRange::default()
        };
        let put = |f: u64, p: u16| MapOp::PutInterpreterOffsets {
            file_id: FileId(f),
            range: range(p),
        };
        assert_eq!(s.apply(&put(1, 3)), Ok(()));
        assert_eq!(s.apply(&put(1, 4)), Ok(()), "BPF_ANY replaces");
        assert_eq!(s.apply(&put(2, 4)), Ok(()));
        assert_eq!(s.apply(&put(3, 4)), Err(OpFailure::new(Errno::E2BIG, 0)));
        assert_eq!(
            s.interpreter_offsets(),
            BTreeMap::from([(FileId(1), range(4)), (FileId(2), range(4))])
        );
        let del = |f: u64| MapOp::DeleteInterpreterOffsets { file_id: FileId(f) };
        assert_eq!(s.apply(&del(1)), Ok(()));
        assert_eq!(s.apply(&del(1)), Err(OpFailure::new(Errno::ENOENT, 0)));
        assert_eq!(s.interpreter_offsets().len(), 1);
    }

    #[test]
    fn equality_ignores_inner_map_ids_but_not_contents() {
        let mut a = sim(tiny());
        let mut b = sim(tiny());
        // Burn an id in b so the inner arrays get different ids.
        assert!(b.apply(&put_table(9, 8, 300)).is_err());
        assert_eq!(a.apply(&put_table(1, 8, 5)), Ok(()));
        assert_eq!(b.apply(&put_table(1, 8, 5)), Ok(()));
        assert_eq!(a, b);
        assert_eq!(a.apply(&put_table(2, 8, 5)), Ok(()));
        assert_eq!(b.apply(&put_table(2, 8, 6)), Ok(()));
        assert_ne!(a, b);
        let mut c = sim(tiny());
        assert_eq!(c.apply(&put_table(1, 9, 5)), Ok(()));
        let mut d = sim(tiny());
        assert_eq!(d.apply(&put_table(1, 8, 5)), Ok(()));
        assert_ne!(c, d, "the class matters");
    }

    #[test]
    fn registry_level_writes_are_visible_through_the_accessors() {
        let mut s = sim(tiny());
        let pages = s.pages;
        let k = key(3, 1);
        assert_eq!(
            s.reg
                .update(pages, &k.to_bytes(), &info(7).to_bytes(), BPF_ANY),
            Ok(())
        );
        assert_eq!(s.pages(), BTreeMap::from([(k, info(7))]));
        assert!(!s.holds_no_file_data());
    }
}
