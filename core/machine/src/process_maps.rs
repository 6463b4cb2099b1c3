//! [`ProcessMapTable`]: what `eim_process_mappings` holds for each followed
//! process, and the ops that keep it equal to what the host last read.
//!
//! The host reads a process's executable file mappings and says what they
//! resolve to ([`ProcessMapTable::set`]); the table answers with the one
//! op that makes the map say so (none when it already does), and with a
//! delete when the process goes. Entries the maps held before this
//! instance started (a warm restart) are adopted as stale: the first full
//! pass rewrites the live ones and [`ProcessMapTable::sweep`] deletes the
//! rest. Pure: the caller applies the ops and reports failures back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::abi::{ProcessMapping, ProcessMappings, MAX_PROCESS_MAPPINGS};
use crate::ops::MapOp;

/// The process entries written, and those found at start not yet rewritten.
#[derive(Clone, Debug, Default)]
pub struct ProcessMapTable {
    written: BTreeMap<u32, Arc<ProcessMappings>>,
    stale: BTreeSet<u32>,
    /// Mappings left out because a process had more than the entry holds.
    truncated: u64,
}

impl ProcessMapTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes over the entries the maps held at start: each is deleted by
    /// the next [`Self::sweep`] unless [`Self::set`] before it, which writes
    /// it only if it differs (a restart over an unchanged host writes
    /// nothing).
    pub fn adopt(&mut self, entries: impl IntoIterator<Item = (u32, ProcessMappings)>) {
        for (pid, mappings) in entries {
            self.written.insert(pid, Arc::new(mappings));
            self.stale.insert(pid);
        }
    }

    /// The op that makes process `pid`'s entry hold `mappings` (any order;
    /// sorted here, a mapping overlapping an earlier one and empty ranges
    /// left out, at most [`MAX_PROCESS_MAPPINGS`] kept, the lowest), or
    /// `None` when it already does. The entry counts as written: if the op
    /// fails, [`Self::failed`] forgets it so that the next read retries.
    pub fn set(&mut self, pid: u32, mut mappings: Vec<ProcessMapping>) -> Option<MapOp> {
        mappings.sort_unstable();
        let mut kept: Vec<ProcessMapping> = Vec::with_capacity(mappings.len());
        for m in mappings {
            let overlaps = kept.last().is_some_and(|last| m.start < last.end);
            if m.start < m.end && !overlaps {
                kept.push(m);
            }
        }
        if kept.len() > MAX_PROCESS_MAPPINGS {
            self.truncated += (kept.len() - MAX_PROCESS_MAPPINGS) as u64;
            kept.truncate(MAX_PROCESS_MAPPINGS);
        }
        self.stale.remove(&pid);
        let value = ProcessMappings { mappings: kept };
        if self.written.get(&pid).is_some_and(|w| **w == value) {
            return None;
        }
        let value = Arc::new(value);
        self.written.insert(pid, Arc::clone(&value));
        Some(MapOp::PutProcessMappings {
            pid,
            mappings: value,
        })
    }

    /// The delete of process `pid`'s entry, if it has one.
    pub fn remove(&mut self, pid: u32) -> Option<MapOp> {
        let had = self.written.remove(&pid).is_some() | self.stale.remove(&pid);
        had.then_some(MapOp::DeleteProcessMappings { pid })
    }

    /// An op for `pid` failed: what the map holds for it is unknown, so the
    /// next [`Self::set`] writes it again and a [`Self::sweep`] deletes it
    /// if it is not.
    pub fn failed(&mut self, pid: u32) {
        self.written.remove(&pid);
        self.stale.insert(pid);
    }

    /// After a full pass: deletes the entries found at start (or left
    /// unknown by a failure) that the pass did not write.
    pub fn sweep(&mut self) -> Vec<MapOp> {
        std::mem::take(&mut self.stale)
            .into_iter()
            .map(|pid| {
                self.written.remove(&pid);
                MapOp::DeleteProcessMappings { pid }
            })
            .collect()
    }

    #[cfg(test)]
    /// The pids with an entry written.
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.written.keys().copied()
    }

    /// Process `pid`'s entry as written.
    pub fn get(&self, pid: u32) -> Option<&ProcessMappings> {
        self.written.get(&pid).map(|m| &**m)
    }

    #[cfg(test)]
    /// Mappings left out so far because a process had more than
    /// [`MAX_PROCESS_MAPPINGS`].
    pub(crate) fn truncated(&self) -> u64 {
        self.truncated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, file_id: u64) -> ProcessMapping {
        ProcessMapping {
            start,
            end,
            file_offset: 0,
            bias: start,
            file_id,
        }
    }

    fn put_of(op: Option<MapOp>) -> Vec<ProcessMapping> {
        match op {
            Some(MapOp::PutProcessMappings { mappings, .. }) => mappings.mappings.clone(),
            other => panic!("a put expected, got {other:?}"),
        }
    }

    #[test]
    fn an_entry_is_written_sorted_once_and_again_only_when_it_changes() {
        let mut t = ProcessMapTable::new();
        let written = put_of(t.set(5, vec![m(0x3000, 0x4000, 2), m(0x1000, 0x2000, 1)]));
        assert_eq!(written, vec![m(0x1000, 0x2000, 1), m(0x3000, 0x4000, 2)]);
        assert!(written.windows(2).all(|w| w[0].end <= w[1].start));
        assert_eq!(
            t.set(5, vec![m(0x1000, 0x2000, 1), m(0x3000, 0x4000, 2)]),
            None
        );
        assert_eq!(put_of(t.set(5, vec![m(0x1000, 0x2000, 1)])).len(), 1);
        assert_eq!(t.remove(5), Some(MapOp::DeleteProcessMappings { pid: 5 }));
        assert_eq!(t.remove(5), None, "deleted once");
    }

    #[test]
    fn overlapping_and_empty_ranges_are_left_out_and_the_count_is_capped() {
        let mut t = ProcessMapTable::new();
        let written = put_of(t.set(
            1,
            vec![
                m(0x1000, 0x3000, 1),
                m(0x2000, 0x4000, 2),
                m(0x5000, 0x5000, 3),
            ],
        ));
        assert_eq!(written, vec![m(0x1000, 0x3000, 1)]);
        let many = (0..MAX_PROCESS_MAPPINGS as u64 + 3)
            .map(|i| m(0x1000 * (i + 1), 0x1000 * (i + 1) + 0x800, i))
            .collect();
        let written = put_of(t.set(2, many));
        assert_eq!(written.len(), MAX_PROCESS_MAPPINGS);
        assert_eq!(written[0].file_id, 0, "the lowest are kept");
        assert_eq!(t.truncated(), 3);
    }

    #[test]
    fn adopted_entries_are_rewritten_or_swept_and_a_failure_retries() {
        let mut t = ProcessMapTable::new();
        let entry = |list| ProcessMappings { mappings: list };
        t.adopt([
            (6, entry(vec![m(0x1000, 0x2000, 1)])),
            (7, entry(vec![m(0x1000, 0x2000, 2)])),
            (8, entry(vec![])),
        ]);
        assert_eq!(
            t.set(6, vec![m(0x1000, 0x2000, 1)]),
            None,
            "unchanged: kept"
        );
        assert!(t.set(7, vec![m(0x1000, 0x2000, 1)]).is_some(), "changed");
        assert_eq!(t.sweep(), vec![MapOp::DeleteProcessMappings { pid: 8 }]);
        assert_eq!(t.pids().collect::<Vec<_>>(), vec![6, 7]);
        assert!(t.sweep().is_empty());
        t.failed(7);
        assert!(
            t.set(7, vec![m(0x1000, 0x2000, 1)]).is_some(),
            "written again after a failure"
        );
        t.failed(7);
        assert_eq!(t.sweep(), vec![MapOp::DeleteProcessMappings { pid: 7 }]);
        assert_eq!(t.pids().collect::<Vec<_>>(), vec![6]);
    }
}
