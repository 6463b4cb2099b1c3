//! Which process holds which files: the bookkeeping that makes a process's
//! exit release exactly the references it took.
//!
//! A process holds ONE reference on each distinct file it maps executable,
//! however many executable mappings of that file it has (a file mapped
//! twice, or a library `dlopen`ed twice, is still one reference). The
//! references a process holds therefore never depend on how its mappings
//! are split, and releasing them on exit is a set difference, not a count
//! that could drift.
//!
//! Each mapping (range, offset, device, inode) is resolved to a file id
//! once per process: the same mapping seen again in the next step is not
//! opened or hashed again.

use std::collections::{BTreeSet, HashMap, HashSet};

use eim_machine::FileId;

use super::procs::ExecMapping;

/// A mapping, as far as its file is concerned: if none of these change,
/// the mapped file has not either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MappingKey {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub dev: (u32, u32),
    pub inode: u64,
}

impl MappingKey {
    pub fn of(m: &ExecMapping) -> Self {
        Self {
            start: m.start,
            end: m.end,
            offset: m.offset,
            dev: m.dev,
            inode: m.inode,
        }
    }
}

/// What a mapping was found to map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The file with this host file id.
    File(FileId),
    /// A file that could not be opened as the mapped one (the reason was
    /// reported when it was first tried); not tried again for this process.
    Unusable,
    /// A file presenting this id whose bytes differ from the file that owns
    /// it (`host::claims`): not loaded for this process, and its mapping
    /// left out of the unwinder's table.
    Collision(FileId),
}

impl Resolution {
    /// Whether it names `id` (as the file, or as the id it collided with).
    pub fn names(&self, id: FileId) -> bool {
        matches!(self, Self::File(i) | Self::Collision(i) if *i == id)
    }
}

/// One process: when it started (a reused pid is a new process), what its
/// mappings resolved to, and the files it holds a reference on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessEntry {
    pub start_time: u64,
    pub mappings: HashMap<MappingKey, Resolution>,
    pub held: BTreeSet<FileId>,
}

/// References to take and to give back so that a process holds exactly
/// the files it maps now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub take: Vec<FileId>,
    pub release: Vec<FileId>,
}

impl ProcessEntry {
    pub fn new(start_time: u64) -> Self {
        Self {
            start_time,
            ..Self::default()
        }
    }

    /// What to change for the process to hold exactly `mapped`.
    pub fn changes(&self, mapped: &BTreeSet<FileId>) -> Changes {
        Changes {
            take: mapped.difference(&self.held).copied().collect(),
            release: self.held.difference(mapped).copied().collect(),
        }
    }

    /// Forgets every resolution naming `id` (its owner changed: each is
    /// judged again), and whether it held `id`.
    pub fn forget_file(&mut self, id: FileId) -> (bool, bool) {
        let before = self.mappings.len();
        self.mappings.retain(|_, r| !r.names(id));
        (self.mappings.len() != before, self.held.remove(&id))
    }

    /// Forgets the resolutions of mappings that are gone.
    pub fn keep_mappings(&mut self, current: &HashSet<MappingKey>) {
        self.mappings.retain(|k, _| current.contains(k));
    }
}

/// Every process known, by pid.
#[derive(Clone, Debug, Default)]
pub struct ProcessTable {
    entries: HashMap<i32, ProcessEntry>,
}

impl ProcessTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the entry of `pid` out to work on it. A process that started
    /// at another time is another process that had the same pid: its
    /// entry is returned as `replaced`, for its references to be released.
    pub fn take(&mut self, pid: i32, start_time: u64) -> (ProcessEntry, Option<ProcessEntry>) {
        match self.entries.remove(&pid) {
            Some(entry) if entry.start_time == start_time => (entry, None),
            old => (ProcessEntry::new(start_time), old),
        }
    }

    /// Puts an entry (back).
    pub fn put(&mut self, pid: i32, entry: ProcessEntry) {
        self.entries.insert(pid, entry);
    }

    pub fn remove(&mut self, pid: i32) -> Option<ProcessEntry> {
        self.entries.remove(&pid)
    }

    pub fn get(&self, pid: i32) -> Option<&ProcessEntry> {
        self.entries.get(&pid)
    }

    pub fn get_mut(&mut self, pid: i32) -> Option<&mut ProcessEntry> {
        self.entries.get_mut(&pid)
    }

    /// Pids known but not in `alive`: processes that exited.
    pub fn gone(&self, alive: &HashSet<i32>) -> Vec<i32> {
        let mut gone: Vec<i32> = self
            .entries
            .keys()
            .filter(|pid| !alive.contains(pid))
            .copied()
            .collect();
        gone.sort_unstable();
        gone
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// References held, summed over processes.
    pub fn references(&self) -> usize {
        self.entries.values().map(|e| e.held.len()).sum()
    }

    /// The pids holding each file (in no order).
    pub fn pids_by_file(&self) -> HashMap<FileId, Vec<i32>> {
        let mut out: HashMap<FileId, Vec<i32>> = HashMap::new();
        for (pid, entry) in &self.entries {
            for id in &entry.held {
                out.entry(*id).or_default().push(*pid);
            }
        }
        out
    }

    /// The processes with a mapping resolved to `id` or holding it, by pid.
    pub fn pids_naming(&self, id: FileId) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .entries
            .iter()
            .filter(|(_, e)| e.held.contains(&id) || e.mappings.values().any(|r| r.names(id)))
            .map(|(pid, _)| *pid)
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Processes holding each file.
    pub fn holders(&self) -> HashMap<FileId, usize> {
        let mut out = HashMap::new();
        for entry in self.entries.values() {
            for id in &entry.held {
                *out.entry(*id).or_insert(0) += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> BTreeSet<FileId> {
        v.iter().map(|&i| FileId(i)).collect()
    }

    #[test]
    fn changes_make_the_held_set_the_mapped_set() {
        let mut e = ProcessEntry::new(5);
        e.held = ids(&[1, 2, 3]);
        let c = e.changes(&ids(&[2, 3, 4, 5]));
        assert_eq!(c.take, vec![FileId(4), FileId(5)]);
        assert_eq!(c.release, vec![FileId(1)]);
        assert_eq!(e.changes(&e.held.clone()), Changes::default());
    }

    #[test]
    fn a_reused_pid_is_another_process() {
        let mut t = ProcessTable::new();
        let mut e = ProcessEntry::new(100);
        e.held = ids(&[7]);
        t.put(42, e);
        let (same, replaced) = t.take(42, 100);
        assert_eq!(same.held, ids(&[7]));
        assert!(replaced.is_none());
        t.put(42, same);
        let (fresh, replaced) = t.take(42, 200);
        assert!(fresh.held.is_empty());
        assert_eq!(replaced.map(|r| r.held), Some(ids(&[7])));
    }

    #[test]
    fn exited_processes_are_those_not_alive() {
        let mut t = ProcessTable::new();
        for pid in [3, 1, 2] {
            let mut e = ProcessEntry::new(1);
            e.held = ids(&[9, u64::from(pid as u32)]);
            t.put(pid, e);
        }
        assert_eq!(t.gone(&HashSet::from([2])), vec![1, 3]);
        assert_eq!(t.references(), 6);
        assert_eq!(t.holders()[&FileId(9)], 3);
        let mut nine = t.pids_by_file()[&FileId(9)].clone();
        nine.sort_unstable();
        assert_eq!(nine, [1, 2, 3]);
    }
}
