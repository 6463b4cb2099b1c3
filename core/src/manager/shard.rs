//! A shard of the file table, and single-flight extraction: one caller
//! extracts a file, the others wait for its result.

use std::collections::HashMap;

use crate::error::Error;
use crate::info::ExecutableInfo;
use crate::sync::{lock, Arc, Condvar, Mutex};
use eim_machine::machine::FileTable;
use eim_machine::FileId;

/// A shard on cache lines of its own: two threads working on files of
/// different shards must not invalidate each other's lines.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

#[derive(Default)]
pub(super) struct Shard {
    pub(super) files: FileTable<ExecutableInfo>,
    /// Extractions in flight, with the number of callers waiting on each.
    pub(super) flights: HashMap<FileId, (Arc<Flight>, u64)>,
}

/// Spreads file ids over shards (ids in tests are often small integers).
pub(super) fn shard_index(id: FileId, shards: usize) -> usize {
    let mixed = id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 32) as usize & (shards - 1)
}

/// One extraction in progress; callers for the same file wait on it.
pub(super) struct Flight {
    pub(super) result: Mutex<Option<Result<ExecutableInfo, Error>>>,
    pub(super) ready: Condvar,
}

impl Flight {
    pub(super) fn new() -> Self {
        Self {
            result: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    pub(super) fn publish(&self, result: Result<ExecutableInfo, Error>) {
        *lock(&self.result) = Some(result);
        self.ready.notify_all();
    }

    pub(super) fn wait(&self) -> Result<ExecutableInfo, Error> {
        let mut slot = lock(&self.result);
        loop {
            if let Some(result) = slot.as_ref() {
                return result.clone();
            }
            slot = self.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Lands an extraction: records the file (with a reference for every caller
/// that waited) and wakes the waiters. If the extracting thread unwinds
/// instead, the waiters are woken with an error rather than left hanging.
pub(super) struct FlightGuard<'a> {
    /// The shard that holds the file.
    pub(super) shard: &'a Mutex<Shard>,
    pub(super) file_id: FileId,
    pub(super) flight: Arc<Flight>,
    pub(super) landed: bool,
}

impl FlightGuard<'_> {
    pub(super) fn land(
        &mut self,
        result: Result<ExecutableInfo, Error>,
    ) -> Result<ExecutableInfo, Error> {
        self.landed = true;
        let mut shard = lock(self.shard);
        let waiters = shard
            .flights
            .remove(&self.file_id)
            .map_or(0, |(_, waiters)| waiters);
        if let Ok(info) = &result {
            shard.files.insert(self.file_id, info.clone(), 1 + waiters);
        }
        drop(shard);
        self.flight.publish(result.clone());
        result
    }
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        if !self.landed {
            lock(self.shard).flights.remove(&self.file_id);
            self.flight.publish(Err(Error::ExtractionAborted {
                file_id: self.file_id,
            }));
        }
    }
}
