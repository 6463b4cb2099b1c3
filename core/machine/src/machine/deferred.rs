//! Files whose extraction or load failed, not retried until a timeout
//! passes: upstream's deferred-id LRU (8192 ids, 90 s), with time passed in.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::machine::Timestamp;
use crate::FileId;

pub const DEFAULT_CAPACITY: usize = 8192;
pub const DEFAULT_TTL: Duration = Duration::from_secs(90);

#[derive(Clone, Debug)]
pub struct Deferred {
    capacity: usize,
    ttl: Duration,
    /// id -> (expiry, recency stamp)
    entries: HashMap<FileId, (Timestamp, u64)>,
    /// recency stamp -> id, oldest first
    order: BTreeMap<u64, FileId>,
    next_stamp: u64,
}

impl Default for Deferred {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY, DEFAULT_TTL)
    }
}

impl Deferred {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            ttl,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Whether `id` is deferred at `now`. An expired entry is dropped; a live
    /// one becomes the most recently used.
    pub fn contains(&mut self, id: FileId, now: Timestamp) -> bool {
        let Some(&(expiry, stamp)) = self.entries.get(&id) else {
            return false;
        };
        self.order.remove(&stamp);
        if now >= expiry {
            self.entries.remove(&id);
            return false;
        }
        let fresh = self.stamp();
        self.order.insert(fresh, id);
        self.entries.insert(id, (expiry, fresh));
        true
    }

    /// Defers `id` from `now` for the TTL (restarting it if already there),
    /// evicting the least recently used id when full.
    pub fn insert(&mut self, id: FileId, now: Timestamp) {
        self.remove(id);
        if self.entries.len() >= self.capacity {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.entries.remove(&oldest);
            }
        }
        let stamp = self.stamp();
        self.order.insert(stamp, id);
        self.entries.insert(id, (now.after(self.ttl), stamp));
    }

    /// Forgets `id`'s deferral.
    pub fn remove(&mut self, id: FileId) {
        if let Some((_, stamp)) = self.entries.remove(&id) {
            self.order.remove(&stamp);
        }
    }

    /// Defers `id` from `now` until `until`, or for the TTL if that ends
    /// sooner: a failure known to clear at a given time (a full
    /// `unwind_info_array` whose slots are cooling) is tried again then.
    pub fn insert_until(&mut self, id: FileId, now: Timestamp, until: Timestamp) {
        self.insert(id, now);
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.0 = entry.0.min(until.max(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> Timestamp {
        Timestamp(Duration::from_secs(secs))
    }

    #[test]
    fn expires_after_the_ttl() {
        let mut d = Deferred::default();
        d.insert(FileId(1), t(0));
        assert!(d.contains(FileId(1), t(89)));
        assert!(!d.is_empty());
        assert!(!d.contains(FileId(1), t(90)));
        assert!(d.is_empty(), "an expired entry is dropped");
    }

    #[test]
    fn reinsertion_restarts_the_ttl() {
        let mut d = Deferred::default();
        d.insert(FileId(1), t(0));
        d.insert(FileId(1), t(50));
        assert!(d.contains(FileId(1), t(139)));
    }

    #[test]
    fn a_deferral_until_a_time_ends_then_or_at_the_ttl_whichever_is_first() {
        let mut d = Deferred::default();
        d.insert_until(FileId(1), t(10), t(15));
        assert!(d.contains(FileId(1), t(14)));
        assert!(!d.contains(FileId(1), t(15)));
        d.insert_until(FileId(2), t(10), t(500));
        assert!(d.contains(FileId(2), t(99)));
        assert!(!d.contains(FileId(2), t(100)), "capped by the TTL");
    }

    #[test]
    fn deferring_again_makes_an_id_the_most_recently_used() {
        // Full, and 1 deferred again: it takes no second place (2 stays),
        // and then 2, the least recently used, is the one a new id evicts.
        let mut d = Deferred::new(2, DEFAULT_TTL);
        d.insert(FileId(2), t(0));
        d.insert(FileId(1), t(0));
        d.insert(FileId(1), t(1));
        assert_eq!(d.len(), 2);
        assert!(d.contains(FileId(2), t(2)), "nothing was evicted");
        d.insert(FileId(1), t(3));
        d.insert(FileId(3), t(4));
        assert!(d.contains(FileId(1), t(5)));
        assert!(!d.contains(FileId(2), t(5)));
        assert!(d.contains(FileId(3), t(5)));
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let mut d = Deferred::new(2, DEFAULT_TTL);
        d.insert(FileId(1), t(0));
        d.insert(FileId(2), t(0));
        assert!(d.contains(FileId(1), t(1)));
        d.insert(FileId(3), t(1));
        assert!(d.contains(FileId(1), t(2)));
        assert!(!d.contains(FileId(2), t(2)));
        assert!(d.contains(FileId(3), t(2)));
        assert_eq!(d.len(), 2);
    }
}
