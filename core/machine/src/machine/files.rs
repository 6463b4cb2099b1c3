//! The file table: which files are known, their reference counts and the
//! payload handed to callers (the facade's `ExecutableInfo`; the machine
//! stores and clones it, never looks inside). One table per shard of the facade, so that the
//! per-process fast path of different files never shares a lock.

use std::collections::HashMap;

use crate::machine::Timestamp;
use crate::FileId;

/// One known file.
#[derive(Clone, Debug)]
pub struct FileEntry<P> {
    pub info: P,
    pub rc: u64,
    /// When the count reached zero under delayed unloading.
    pub unused_since: Option<Timestamp>,
}

/// What releasing a reference did.
#[derive(Debug)]
pub enum Release<P> {
    /// Other references remain.
    Held { rc: u64 },
    /// That was the last reference; the entry was removed and its table
    /// must be unloaded.
    Last(FileEntry<P>),
    /// That was the last reference; the entry stays, unused, until
    /// [`FileTable::take_unused`] collects it.
    Unused,
}

/// Why a reference could not be released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseError {
    Unknown,
    /// The file is known but nobody holds a reference (delayed unloading).
    NoReference,
}

#[derive(Clone, Debug)]
pub struct FileTable<P> {
    entries: HashMap<FileId, FileEntry<P>>,
}

impl<P> Default for FileTable<P> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }
}

impl<P: Clone> FileTable<P> {
    pub fn get(&self, id: FileId) -> Option<&FileEntry<P>> {
        self.entries.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&FileId, &FileEntry<P>)> {
        self.entries.iter()
    }

    /// Takes one more reference on a known file.
    pub fn inc_ref(&mut self, id: FileId) -> Option<P> {
        let entry = self.entries.get_mut(&id)?;
        debug_assert!(entry.rc < u64::MAX, "file {id}: reference count overflow");
        entry.rc += 1;
        entry.unused_since = None;
        Some(entry.info.clone())
    }

    /// Adds a freshly loaded file with `rc` references.
    pub fn insert(&mut self, id: FileId, info: P, rc: u64) {
        self.entries.insert(
            id,
            FileEntry {
                info,
                rc,
                unused_since: None,
            },
        );
    }

    /// Releases a reference. With `delay_since`, the last release keeps the
    /// entry as unused from that time on instead of removing it.
    pub fn release(
        &mut self,
        id: FileId,
        delay_since: Option<Timestamp>,
    ) -> Result<Release<P>, ReleaseError> {
        let entry = self.entries.get_mut(&id).ok_or(ReleaseError::Unknown)?;
        match entry.rc {
            0 => Err(ReleaseError::NoReference),
            1 => match delay_since {
                Some(now) => {
                    entry.rc = 0;
                    entry.unused_since = Some(now);
                    Ok(Release::Unused)
                }
                None => Ok(Release::Last(
                    self.entries.remove(&id).ok_or(ReleaseError::Unknown)?,
                )),
            },
            _ => {
                debug_assert!(entry.rc > 1, "file {id}: released past its last reference");
                entry.rc -= 1;
                Ok(Release::Held { rc: entry.rc })
            }
        }
    }

    /// Removes and returns `id` if no reference holds it (a delayed
    /// unload waiting), whatever its age.
    pub fn take_if_unused(&mut self, id: FileId) -> Option<FileEntry<P>> {
        match self.entries.get(&id) {
            Some(e) if e.rc == 0 => self.entries.remove(&id),
            _ => None,
        }
    }

    /// Removes and returns the files unused since `cutoff` or earlier, in
    /// file id order (so a run is reproducible).
    pub fn take_unused(&mut self, cutoff: Timestamp) -> Vec<(FileId, FileEntry<P>)> {
        let mut ids: Vec<FileId> = self
            .entries
            .iter()
            .filter(|(_, e)| e.rc == 0 && e.unused_since.is_some_and(|t| t <= cutoff))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| self.entries.remove(&id).map(|e| (id, e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(secs: u64) -> Timestamp {
        Timestamp(Duration::from_secs(secs))
    }

    #[test]
    fn counts_references_and_removes_at_the_last() {
        let mut files = FileTable::<()>::default();
        let id = FileId(7);
        assert!(files.inc_ref(id).is_none());
        files.insert(id, (), 1);
        assert!(files.inc_ref(id).is_some());
        assert!(matches!(
            files.release(id, None),
            Ok(Release::Held { rc: 1 })
        ));
        assert!(matches!(files.release(id, None), Ok(Release::Last(_))));
        assert_eq!(files.release(id, None).err(), Some(ReleaseError::Unknown));
    }

    #[test]
    fn delayed_release_keeps_the_entry_until_collected() {
        let mut files = FileTable::<()>::default();
        files.insert(FileId(1), (), 1);
        files.insert(FileId(2), (), 1);
        assert!(matches!(
            files.release(FileId(1), Some(t(10))),
            Ok(Release::Unused)
        ));
        assert!(matches!(
            files.release(FileId(2), Some(t(20))),
            Ok(Release::Unused)
        ));
        assert_eq!(
            files.release(FileId(1), Some(t(11))).err(),
            Some(ReleaseError::NoReference)
        );
        let taken: Vec<_> = files
            .take_unused(t(15))
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(taken, vec![FileId(1)]);
        // A new reference revives the unused entry.
        assert!(files.inc_ref(FileId(2)).is_some());
        assert!(files.take_unused(t(100)).is_empty());
    }
}
