//! Loading: files planned as one batch, then committed, or rolled back as
//! far as the backend got. A single file is a batch of one: the same
//! plan, commit and rollback, with its own ops.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    class_index, zeroed_slots, ClassTable, KernelBook, LoadManyPlan, LoadPlan, LoadedTable, MapRef,
    Pending, PlanError, Reservation, Rollback, Stopped,
};
use crate::abi::{OffsetRange, StackDeltaPageKey, UnwindInfo};
use crate::deltas::IntervalData;
use crate::ops::{MapOp, OpFailure};
use crate::FileId;

/// What one file's part of a batch rollback undoes.
struct FileUndo {
    ops: Vec<MapOp>,
    /// Slots of the file whose write took effect.
    written: Vec<u16>,
    /// The file's table was published (a reader may have followed it).
    published: bool,
}

impl KernelBook {
    /// Plans the load of one file, a batch of one, with the file's own
    /// ops: its table is published by its own [`MapOp::PutDeltaTable`].
    /// An `interpreter_offsets` entry, if its loaders need one, is written
    /// after the table and before the pages, and deleted after the pages
    /// on unload; a full map refuses the file before anything is written.
    /// On error nothing was reserved.
    pub fn plan_load(
        &mut self,
        file_id: FileId,
        deltas: &IntervalData,
        offsets: Option<OffsetRange>,
    ) -> Result<LoadManyPlan, PlanError> {
        let plan = self.plan_one(file_id, deltas, offsets, &Pending::default())?;
        Ok(LoadManyPlan {
            ops: plan.ops.clone(),
            files: vec![plan],
        })
    }

    /// Plans the load of several files as one batch. Files refused here
    /// (already loaded, cleanup pending, repeated in the batch, capacity,
    /// encoding) get their error and do not block the others; nothing is
    /// reserved for them.
    pub fn plan_load_many(
        &mut self,
        files: &[(FileId, &IntervalData)],
    ) -> (LoadManyPlan, Vec<(FileId, PlanError)>) {
        let files: Vec<_> = files.iter().map(|&(id, d)| (id, d, None)).collect();
        self.plan_load_many_with(&files)
    }

    /// [`Self::plan_load_many`] for files with `interpreter_offsets`
    /// entries: one put per file, after the tables and before the pages.
    pub fn plan_load_many_with(
        &mut self,
        files: &[(FileId, &IntervalData, Option<OffsetRange>)],
    ) -> (LoadManyPlan, Vec<(FileId, PlanError)>) {
        let mut pending = Pending::default();
        let mut plans = Vec::with_capacity(files.len());
        let mut refused = Vec::new();
        for &(file_id, deltas, offsets) in files {
            match self.plan_one(file_id, deltas, offsets, &pending) {
                Ok(plan) => {
                    pending.files.insert(file_id);
                    pending.offsets += u32::from(plan.reserved.offsets.is_some());
                    if plan.map_ref.map_id != 0 {
                        pending.pages += u64::from(plan.map_ref.page_entries);
                        pending.tables[class_index(plan.map_ref.map_id)] += 1;
                    }
                    plans.push(plan);
                }
                Err(e) => refused.push((file_id, e)),
            }
        }
        let mut slots = Vec::new();
        let mut tables: BTreeMap<u16, Vec<ClassTable>> = BTreeMap::new();
        let mut pages = Vec::new();
        let mut offsets = Vec::new();
        for plan in &plans {
            for op in &plan.ops {
                match op {
                    MapOp::PutUnwindInfos(v) => slots.extend(v.iter().copied()),
                    MapOp::PutDeltaTable {
                        file_id,
                        map_id,
                        deltas,
                    } => tables
                        .entry(*map_id)
                        .or_default()
                        .push((*file_id, deltas.clone())),
                    MapOp::PutPages(v) => pages.extend(v.iter().copied()),
                    put @ MapOp::PutInterpreterOffsets { .. } => offsets.push(put.clone()),
                    other => unreachable!("a load plan holds no {other:?}"),
                }
            }
        }
        let mut ops = Vec::with_capacity(2 + tables.len() + offsets.len());
        if !slots.is_empty() {
            ops.push(MapOp::PutUnwindInfos(slots));
        }
        ops.extend(
            tables
                .into_iter()
                .map(|(map_id, tables)| MapOp::PutDeltaTables { map_id, tables }),
        );
        ops.extend(offsets);
        if !pages.is_empty() {
            ops.push(MapOp::PutPages(pages));
        }
        (LoadManyPlan { ops, files: plans }, refused)
    }

    /// Records a batch whose ops all took effect.
    pub fn commit_load(&mut self, plan: LoadManyPlan) -> Vec<(FileId, MapRef)> {
        let refs = plan
            .files
            .into_iter()
            .map(|p| (p.file_id, self.commit_file(p)))
            .collect();
        self.debug_check_gauges();
        refs
    }

    /// Records one file of a batch whose ops all took effect.
    fn commit_file(&mut self, plan: LoadPlan) -> MapRef {
        let before = (
            self.pages_in_use,
            self.tables.iter().sum::<u32>(),
            self.loaded.len(),
            self.offsets.len(),
        );
        let map_ref = self.record_commit(plan);
        let table = usize::from(map_ref.map_id != 0);
        debug_assert_eq!(
            (
                self.pages_in_use,
                self.tables.iter().sum::<u32>() as usize,
                self.loaded.len(),
            ),
            (
                before.0
                    + if table == 1 {
                        u64::from(map_ref.page_entries)
                    } else {
                        0
                    },
                before.1 as usize + table,
                before.2 + table,
            ),
            "commit: the book's accounting is not what it was plus the plan"
        );
        debug_assert!(self.offsets.len() - before.3 <= 1, "commit: offsets");
        map_ref
    }

    fn record_commit(&mut self, plan: LoadPlan) -> MapRef {
        let map_ref = plan.map_ref;
        if let Some(range) = plan.reserved.offsets {
            self.offsets.insert(plan.file_id, range);
        }
        if map_ref.map_id == 0 {
            return map_ref;
        }
        for &slot in plan.reserved.slots.iter() {
            self.slots.add_user(slot);
        }
        self.pages_in_use += u64::from(map_ref.page_entries);
        self.tables[class_index(map_ref.map_id)] += 1;
        self.loaded.insert(
            plan.file_id,
            LoadedTable {
                map_ref,
                slots: plan.reserved.slots,
                dead_pages: plan.dead_pages.into_boxed_slice(),
            },
        );
        map_ref
    }

    /// A batch stopped part way: the ops that undo what took effect for
    /// every file of the batch, deepest first (every page, every table, then
    /// the new slots back to zero). Slots that were reserved but never
    /// written are released at once. Every file of the batch is rolled back.
    pub fn abort_load(&mut self, plan: &LoadManyPlan, stopped: Stopped) -> Rollback {
        // Elements of each batch op in effect.
        let in_effect: Vec<usize> = plan
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| match i.cmp(&stopped.at) {
                std::cmp::Ordering::Less => op.len(),
                std::cmp::Ordering::Equal => stopped.failure.done.min(op.len()),
                std::cmp::Ordering::Greater => 0,
            })
            .collect();
        // Position of each file's elements inside the batch ops.
        let slot_op = plan
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::PutUnwindInfos(_)));
        let page_op = plan
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::PutPages(_)));
        let mut slot_base = 0;
        let mut page_base = 0;
        let mut table_base: BTreeMap<u16, usize> = BTreeMap::new();
        let mut pages = Vec::new();
        let mut tables = Vec::new();
        let mut zeros = Vec::new();
        let mut written = Vec::new();
        let mut published = false;
        let reserved: Vec<Reservation> = plan.files.iter().map(|p| p.reserved.clone()).collect();
        for file in &plan.files {
            // The file's own ops in effect, as a single-file stop point.
            let mut counts = Vec::with_capacity(file.ops.len());
            for op in &file.ops {
                // A file's offsets are an op of their own: no base to share.
                let mut own = 0;
                let (at, base) = match op {
                    MapOp::PutUnwindInfos(_) => (slot_op, &mut slot_base),
                    MapOp::PutDeltaTable { map_id, .. } => {
                        // A batch of one publishes its table by its own op.
                        let at = plan.ops.iter().position(|o| {
                            matches!(o, MapOp::PutDeltaTables { map_id: m, .. }
                                | MapOp::PutDeltaTable { map_id: m, .. } if m == map_id)
                        });
                        (at, table_base.entry(*map_id).or_default())
                    }
                    MapOp::PutPages(_) => (page_op, &mut page_base),
                    put @ MapOp::PutInterpreterOffsets { .. } => {
                        (plan.ops.iter().position(|o| o == put), &mut own)
                    }
                    other => unreachable!("a load plan holds no {other:?}"),
                };
                let done = at.map_or(0, |at| in_effect[at]);
                counts.push(done.saturating_sub(*base).min(op.len()));
                *base += op.len();
            }
            let Some(at) = counts
                .iter()
                .zip(&file.ops)
                .position(|(n, op)| *n < op.len())
                .or(file.ops.len().checked_sub(1))
            else {
                continue;
            };
            let own = Stopped {
                at,
                failure: OpFailure::new(stopped.failure.errno, counts[at]),
            };
            let rollback = Self::abort_file(file, own);
            published |= rollback.published;
            written.extend(rollback.written);
            for op in rollback.ops {
                match op {
                    MapOp::DeletePages(keys) => pages.extend(keys),
                    MapOp::PutUnwindInfos(v) => zeros.extend(v),
                    table => tables.push(table),
                }
            }
        }
        let mut ops = Vec::with_capacity(2 + tables.len());
        if !pages.is_empty() {
            ops.push(MapOp::DeletePages(pages));
        }
        ops.extend(tables);
        if !zeros.is_empty() {
            ops.push(MapOp::PutUnwindInfos(zeros));
        }
        Rollback {
            ops,
            files: plan.files.iter().map(|p| p.file_id).collect(),
            reserved,
            written,
            published,
        }
    }

    /// Records how far a rollback got. Returns true when nothing is owed:
    /// every page, table and offsets entry the batch wrote is gone (a slot
    /// it wrote whose zeroing failed keeps its rule, unreferenced, and the
    /// book knows it; that is not a debt). What could not be removed
    /// becomes a leftover of the file it belongs to; a table that stays
    /// published keeps its slots in use; the other slots the batch took
    /// are settled (see `settle`).
    pub fn finish_rollback(&mut self, rollback: Rollback, result: Result<(), Stopped>) -> bool {
        let zeroed = zeroed_slots(&rollback.ops, result);
        let mut pinned = BTreeSet::new();
        let mut owed = false;
        if let Err(stopped) = result {
            for (i, op) in rollback.ops.iter().enumerate().skip(stopped.at) {
                let from = if i == stopped.at {
                    stopped.failure.done
                } else {
                    0
                };
                // What of the op is still to do: none when the stop came
                // after its last element (a crash after the write).
                let Some(rest) = op.tail(from) else {
                    continue;
                };
                match rest {
                    MapOp::PutUnwindInfos(_) => {}
                    MapOp::DeletePages(keys) => {
                        let mut by_file: BTreeMap<FileId, Vec<StackDeltaPageKey>> = BTreeMap::new();
                        for key in keys {
                            by_file.entry(FileId(key.file_id)).or_default().push(key);
                        }
                        for (file_id, keys) in by_file {
                            owed = true;
                            self.leftovers
                                .entry(file_id)
                                .or_default()
                                .push_back(MapOp::DeletePages(keys));
                        }
                    }
                    MapOp::DeleteDeltaTable { file_id, .. } => {
                        pinned.insert(file_id);
                        owed = true;
                        self.leftovers.entry(file_id).or_default().push_back(rest);
                    }
                    MapOp::DeleteInterpreterOffsets { file_id } => {
                        owed = true;
                        self.leftovers.entry(file_id).or_default().push_back(rest);
                    }
                    other => unreachable!("a rollback holds no {other:?}"),
                }
            }
        }
        let written: BTreeSet<u16> = rollback.written.iter().copied().collect();
        self.settle(
            &rollback.reserved,
            &pinned,
            &written,
            &zeroed,
            rollback.published,
        );
        // Nothing of the batch stays loaded; what is owed is a leftover.
        for file_id in &rollback.files {
            debug_assert!(
                !self.is_loaded(*file_id),
                "rollback: file {file_id} is still loaded"
            );
        }
        debug_assert!(
            owed == rollback
                .files
                .iter()
                .any(|f| self.leftovers.contains_key(f)),
            "rollback: the leftovers do not say what is owed"
        );
        self.debug_check_gauges();
        !owed
    }

    /// One file of a batch stopped part way (`stopped` counts in the
    /// file's own ops): the ops that undo what took effect, deepest first
    /// (pages, offsets, table, then the written slots back to zero).
    fn abort_file(plan: &LoadPlan, stopped: Stopped) -> FileUndo {
        let mut undo = Vec::new();
        let mut written_slots: Vec<u16> = Vec::new();
        for (i, op) in plan.ops.iter().enumerate().take(stopped.at + 1) {
            let in_effect = if i < stopped.at {
                op.len()
            } else {
                stopped.failure.done.min(op.len())
            };
            if in_effect == 0 {
                continue;
            }
            match op {
                MapOp::PutUnwindInfos(v) => {
                    written_slots.extend(v[..in_effect].iter().map(|(s, _)| *s))
                }
                MapOp::PutDeltaTable {
                    file_id, map_id, ..
                } => undo.push(MapOp::DeleteDeltaTable {
                    file_id: *file_id,
                    map_id: *map_id,
                }),
                MapOp::PutDeltaTables { map_id, tables } => {
                    undo.extend(tables[..in_effect].iter().map(|(file_id, _)| {
                        MapOp::DeleteDeltaTable {
                            file_id: *file_id,
                            map_id: *map_id,
                        }
                    }))
                }
                MapOp::PutPages(v) => undo.push(MapOp::DeletePages(
                    v[..in_effect].iter().map(|(k, _)| *k).collect(),
                )),
                MapOp::PutInterpreterOffsets { file_id, .. } => {
                    undo.push(MapOp::DeleteInterpreterOffsets { file_id: *file_id })
                }
                // A load plan holds no process mappings (the host writes
                // them, not the manager); deletes need no undo.
                MapOp::DeletePages(_)
                | MapOp::DeleteDeltaTable { .. }
                | MapOp::DeleteInterpreterOffsets { .. }
                | MapOp::PutProcessMappings { .. }
                | MapOp::DeleteProcessMappings { .. } => {}
            }
        }
        undo.reverse();
        let published = undo
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }));
        if !written_slots.is_empty() {
            undo.push(MapOp::PutUnwindInfos(
                written_slots
                    .iter()
                    .map(|&s| (s, UnwindInfo::default()))
                    .collect(),
            ));
        }
        FileUndo {
            ops: undo,
            written: written_slots,
            published,
        }
    }
}
