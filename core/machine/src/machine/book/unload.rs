//! Unloading, and the leftovers: the entries a failed unload or rollback
//! could not remove, retried one op at a time until they are gone.

use std::collections::VecDeque;

use super::{class_index, KernelBook, Stopped, UnloadPlan};
use crate::ops::{MapOp, OpFailure};
use crate::FileId;

impl KernelBook {
    /// The ops that unload a file, the reverse of its load: pages,
    /// interpreter offsets (upstream never deletes them, weakness 7), the
    /// table. `None` when it has nothing in the kernel.
    pub fn plan_unload(&self, file_id: FileId) -> Option<UnloadPlan> {
        let table = self.loaded.get(&file_id);
        let offsets = self.offsets.contains_key(&file_id);
        if table.is_none() && !offsets {
            return None;
        }
        let mut ops = Vec::with_capacity(3);
        if let Some(table) = table {
            ops.push(MapOp::DeletePages(table.page_keys(file_id).collect()));
        }
        if offsets {
            ops.push(MapOp::DeleteInterpreterOffsets { file_id });
        }
        if let Some(table) = table {
            ops.push(MapOp::DeleteDeltaTable {
                file_id,
                map_id: table.map_ref.map_id,
            });
        }
        Some(UnloadPlan { file_id, ops })
    }

    /// Records an unload. The file is no longer loaded whatever happened;
    /// what the backend could not remove becomes a leftover. Returns the
    /// number of leftover entries.
    pub fn finish_unload(&mut self, plan: UnloadPlan, result: Result<(), Stopped>) -> usize {
        self.offsets.remove(&plan.file_id);
        let table = self.loaded.remove(&plan.file_id);
        if let Some(table) = &table {
            self.pages_in_use -= u64::from(table.map_ref.page_entries);
            self.tables[class_index(table.map_ref.map_id)] -= 1;
        }
        let Err(stopped) = result else {
            if let Some(table) = table {
                self.unreference(&table.slots);
            }
            return 0;
        };
        let remaining: VecDeque<MapOp> = plan
            .ops
            .iter()
            .enumerate()
            .skip(stopped.at)
            .filter_map(|(i, op)| {
                op.tail(if i == stopped.at {
                    stopped.failure.done
                } else {
                    0
                })
            })
            .collect();
        let entries = remaining.iter().map(MapOp::len).sum();
        let table_stays = remaining
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }));
        if let Some(table) = table {
            if table_stays {
                // Still published: a reader can reach its slots until the
                // leftover removal succeeds.
                self.leftover_slots.insert(plan.file_id, table.slots);
            } else {
                self.unreference(&table.slots);
            }
        }
        if !remaining.is_empty() {
            self.leftovers.insert(plan.file_id, remaining);
        }
        entries
    }

    /// A table that referenced `slots` was unpublished just now.
    fn unreference(&mut self, slots: &[u16]) {
        let until = self.reusable_after_grace();
        for &slot in slots {
            self.slots.remove_user(slot, until);
        }
    }

    /// The next leftover op to retry for each file, in file order.
    pub fn leftover_fronts(&self) -> Vec<(FileId, MapOp)> {
        self.leftovers
            .iter()
            .filter_map(|(id, q)| q.front().map(|op| (*id, op.clone())))
            .collect()
    }

    /// Records the result of retrying `file_id`'s front leftover op.
    /// Returns true if the op completed.
    pub fn leftover_result(&mut self, file_id: FileId, result: Result<(), OpFailure>) -> bool {
        let Some(queue) = self.leftovers.get_mut(&file_id) else {
            return false;
        };
        let Some(front) = queue.pop_front() else {
            return false;
        };
        let completed = match result {
            Ok(()) => true,
            Err(failure) => {
                if let Some(rest) = front.tail(failure.done) {
                    queue.push_front(rest);
                }
                false
            }
        };
        if queue.is_empty() {
            self.leftovers.remove(&file_id);
        }
        if completed && matches!(front, MapOp::DeleteDeltaTable { .. }) {
            if let Some(slots) = self.leftover_slots.remove(&file_id) {
                self.unreference(&slots);
            }
        }
        completed
    }
}
