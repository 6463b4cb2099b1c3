//! How an [`IntervalData`](super::IntervalData) holds its deltas: 8 bytes
//! each instead of a [`StackDelta`]'s 24.
//!
//! A delta is its address, its hints and its rule. A file's deltas share
//! few rules (a few hundred in libc, a handful in the worst `.eh_frame` the
//! caps allow), and their addresses lie within 4 GiB of each other. So
//! each delta is stored as the low half of its address and the index of
//! its [`Key`], the rest (rule, hints, the address's high half), which is
//! stored once per list. Any address is representable (the high half is
//! in the key), so there is no second layout to fall back to: a hostile
//! list with distinct keys costs the key table's 24 to 36 bytes per
//! distinct key, had fallibly as the deltas are ([`Packed::reserve`]).
//!
//! What reads a list sees [`StackDelta`]s by value, exactly the ones
//! stored. The 6.7 million deltas of the worst `.eh_frame` the caps allow
//! take 54 MB this way instead of 161 (`docs/BENCHMARKS.md`, "Memory").

use std::hash::BuildHasher;

use super::delta::StackDelta;
use crate::abi::UnwindInfo;

/// What a stored delta names by index: all of it but the low half of its
/// address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Key {
    info: UnwindInfo,
    /// The high 32 bits of the address.
    high: u32,
    hints: u8,
}

impl Key {
    #[inline(always)]
    fn of(delta: &StackDelta) -> Self {
        Self {
            info: delta.info,
            high: (delta.address >> 32) as u32,
            hints: delta.hints,
        }
    }

    /// The key as two words and a byte, for the hasher.
    #[inline(always)]
    fn words(&self) -> (u64, u64, u8) {
        let i = &self.info;
        let head = u32::from_le_bytes([i.opcode, i.fp_opcode, i.merge_opcode, i.pad]);
        (
            u64::from(head) | u64::from(i.param as u32) << 32,
            u64::from(i.fp_param as u32) | u64::from(self.high) << 32,
            self.hints,
        )
    }
}

/// The distinct keys of a list, each stored once, found by hashing.
#[derive(Clone, Debug, Default)]
struct Keys {
    keys: Vec<Key>,
    /// Open addressing with linear probing: `index + 1` of the key placed
    /// there, 0 for none. Empty, or a power of two long and at least
    /// twice as long as `keys`, so a probe always meets an empty slot.
    table: Vec<u32>,
    /// Seeded per list, so that a hostile file cannot aim collisions.
    hasher: foldhash::fast::RandomState,
}

/// Keys stored before the table is first needed: most lists have a few.
const MIN_TABLE: usize = 64;

impl Keys {
    #[inline(always)]
    fn get(&self, index: u32) -> Key {
        // Indices come from `intern` only: always present.
        self.keys.get(index as usize).copied().unwrap_or_default()
    }

    /// Where `key` is in the table, or the empty slot it would go to.
    #[inline(always)]
    fn probe(&self, key: &Key) -> Result<u32, usize> {
        let mask = self.table.len().wrapping_sub(1);
        let mut at = self.hasher.hash_one(key.words()) as usize & mask;
        // The table is never full: an empty slot ends the probe.
        for _ in 0..self.table.len() {
            match self.table.get(at).copied().unwrap_or(0) {
                0 => return Err(at),
                id => {
                    if self.keys.get(id as usize - 1) == Some(key) {
                        return Ok(id - 1);
                    }
                }
            }
            at = (at + 1) & mask;
        }
        Err(usize::MAX)
    }

    /// The index of `key`, added if new. Never allocates after
    /// [`Keys::reserve`] made room for it.
    #[inline(always)]
    fn intern(&mut self, key: Key) -> u32 {
        match self.probe(&key) {
            Ok(index) => index,
            Err(at) => self.insert(key, at),
        }
    }

    #[inline(never)]
    fn insert(&mut self, key: Key, mut at: usize) -> u32 {
        if (self.keys.len() + 1) * 2 > self.table.len() {
            // Not reserved (a list built without extraction's checks):
            // grown as a `Vec` grows.
            let want = (self.keys.len() + 1).max(self.keys.capacity());
            self.keys.reserve(want);
            let table = vec![0; table_len(self.keys.capacity())];
            self.rehash(table);
            at = self.probe(&key).err().unwrap_or(usize::MAX);
        }
        let index = self.keys.len() as u32;
        self.keys.push(key);
        if let Some(slot) = self.table.get_mut(at) {
            *slot = index + 1;
        }
        index
    }

    /// Places every key in `table` (empty, a power of two at least twice
    /// as long as `keys`).
    fn rehash(&mut self, table: Vec<u32>) {
        self.table = table;
        for (index, key) in self.keys.iter().enumerate() {
            let mask = self.table.len() - 1;
            let mut at = self.hasher.hash_one(key.words()) as usize & mask;
            while self.table.get(at).is_some_and(|&s| s != 0) {
                at = (at + 1) & mask;
            }
            if let Some(slot) = self.table.get_mut(at) {
                *slot = index as u32 + 1;
            }
        }
    }

    /// Room for `additional` more keys without allocating, if the memory
    /// can be had; else the bytes that could not.
    fn reserve(&mut self, additional: usize) -> Result<(), usize> {
        let want = self.keys.len().saturating_add(additional);
        if want.saturating_mul(2) <= self.table.len() && want <= self.keys.capacity() {
            return Ok(());
        }
        let grow = additional.max(self.keys.capacity());
        if !crate::fallible::try_reserve(&mut self.keys, grow) {
            return Err(grow.saturating_mul(std::mem::size_of::<Key>()));
        }
        let len = table_len(self.keys.capacity());
        if len > self.table.len() {
            let mut table = Vec::new();
            if !crate::fallible::try_reserve(&mut table, len) {
                return Err(len.saturating_mul(4));
            }
            table.resize(len, 0);
            self.rehash(table);
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.keys.len() * std::mem::size_of::<Key>() + self.table.len() * 4
    }
}

/// A table for `keys` keys: a power of two, at least twice as many slots.
fn table_len(keys: usize) -> usize {
    keys.saturating_mul(2)
        .max(MIN_TABLE)
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
}

/// A list of deltas, 8 bytes each (see the module documentation).
#[derive(Clone, Debug, Default)]
pub(super) struct Packed {
    /// Each delta's address's low half, shifted up, and its key's index.
    slots: Vec<u64>,
    keys: Keys,
}

impl Packed {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            slots: Vec::with_capacity(capacity),
            keys: Keys::default(),
        }
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    #[inline(always)]
    pub(super) fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    #[inline(always)]
    fn decode(&self, slot: u64) -> StackDelta {
        let key = self.keys.get(slot as u32);
        StackDelta {
            address: u64::from(key.high) << 32 | slot >> 32,
            hints: key.hints,
            info: key.info,
        }
    }

    #[inline(always)]
    fn encode(&mut self, delta: &StackDelta) -> u64 {
        let index = self.keys.intern(Key::of(delta));
        (delta.address & 0xffff_ffff) << 32 | u64::from(index)
    }

    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<StackDelta> {
        self.slots.get(index).map(|&slot| self.decode(slot))
    }

    #[inline(always)]
    pub(super) fn last(&self) -> Option<StackDelta> {
        self.slots.last().map(|&slot| self.decode(slot))
    }

    /// Replaces the delta at `index` (if there is one).
    #[inline(always)]
    pub(super) fn set(&mut self, index: usize, delta: &StackDelta) {
        let slot = self.encode(delta);
        if let Some(at) = self.slots.get_mut(index) {
            *at = slot;
        }
    }

    #[inline(always)]
    pub(super) fn push(&mut self, delta: &StackDelta) {
        let slot = self.encode(delta);
        self.slots.push(slot);
    }

    #[inline(always)]
    pub(super) fn pop(&mut self) {
        self.slots.pop();
    }

    pub(super) fn truncate(&mut self, len: usize) {
        self.slots.truncate(len);
    }

    /// Sorts by `order`, which must tell apart any two different deltas
    /// (then an unstable sort, which needs no scratch memory, is exact).
    pub(super) fn sort_by(
        &mut self,
        mut order: impl FnMut(&StackDelta, &StackDelta) -> std::cmp::Ordering,
    ) {
        let keys = &self.keys;
        let decode = |slot: u64| {
            let key = keys.get(slot as u32);
            StackDelta {
                address: u64::from(key.high) << 32 | slot >> 32,
                hints: key.hints,
                info: key.info,
            }
        };
        self.slots
            .sort_unstable_by(|a, b| order(&decode(*a), &decode(*b)));
    }

    /// Room for `additional` more deltas (and as many new keys) without
    /// allocating: for the deltas, `grow` more slots if there is less room
    /// than that; else the bytes that could not be had.
    pub(super) fn reserve(&mut self, additional: usize, grow: usize) -> Result<(), usize> {
        if self.slots.capacity() - self.slots.len() < additional
            && !crate::fallible::try_reserve(&mut self.slots, grow)
        {
            return Err(grow.saturating_mul(std::mem::size_of::<u64>()));
        }
        self.keys.reserve(additional)
    }

    /// Room for about `additional` more deltas, if the memory is there.
    pub(super) fn reserve_hint(&mut self, additional: usize) -> bool {
        crate::fallible::try_reserve(&mut self.slots, additional)
    }

    /// Appends `other[range]`, its keys translated to this list's.
    pub(super) fn extend_from(&mut self, other: &Packed, range: std::ops::Range<usize>) {
        let rest = other.slots.get(range).unwrap_or_default();
        let mut index_of: Vec<Option<u32>> = vec![None; other.keys.keys.len()];
        self.slots.reserve(rest.len());
        for &slot in rest {
            let theirs = slot as u32;
            let mine = match index_of.get(theirs as usize).copied().flatten() {
                Some(mine) => mine,
                None => {
                    let mine = self.keys.intern(other.keys.get(theirs));
                    if let Some(at) = index_of.get_mut(theirs as usize) {
                        *at = Some(mine);
                    }
                    mine
                }
            };
            self.slots.push(slot & !0xffff_ffff | u64::from(mine));
        }
    }

    /// Bytes the deltas and their keys take (what a copy holds).
    pub(super) fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<u64>() + self.keys.bytes()
    }

    /// The deltas from `from` on, in order.
    pub(super) fn iter_from(&self, from: usize) -> Iter<'_> {
        Iter {
            slots: self.slots.get(from..).unwrap_or_default().iter(),
            packed: self,
        }
    }
}

/// The deltas of a list, by value.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    slots: std::slice::Iter<'a, u64>,
    packed: &'a Packed,
}

impl Iterator for Iter<'_> {
    type Item = StackDelta;

    #[inline(always)]
    fn next(&mut self) -> Option<StackDelta> {
        self.slots.next().map(|&slot| self.packed.decode(slot))
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.slots.size_hint()
    }

    #[inline]
    fn nth(&mut self, n: usize) -> Option<StackDelta> {
        self.slots.nth(n).map(|&slot| self.packed.decode(slot))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<StackDelta> {
        self.slots.next_back().map(|&slot| self.packed.decode(slot))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl std::iter::FusedIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::super::delta::{hint, info};
    use super::*;

    #[test]
    fn any_address_and_rule_comes_back_as_stored() {
        let mut packed = Packed::default();
        let mut odd = info::sp(-8);
        odd.merge_opcode = 0x81;
        odd.pad = 7;
        let deltas = [
            StackDelta::new(0, hint::NONE, info::INVALID),
            StackDelta::new(u64::MAX, hint::KEEP | hint::GAP, odd),
            StackDelta::new(0x1_0000_0000, 0xff, info::sp(16)),
            StackDelta::new(0xffff_ffff, hint::KEEP, info::sp(16)),
            StackDelta::new(0x1234_5678_9abc_def0, hint::NONE, info::STOP),
        ];
        for d in &deltas {
            packed.push(d);
        }
        let back: Vec<StackDelta> = packed.iter_from(0).collect();
        assert_eq!(back, deltas);
        assert_eq!(packed.get(1), Some(deltas[1]));
        assert_eq!(packed.last(), Some(deltas[4]));
        // The same key twice is stored once.
        assert_eq!(packed.keys.keys.len(), 5);
        packed.push(&StackDelta::new(0x20, hint::NONE, info::INVALID));
        assert_eq!(packed.keys.keys.len(), 5);
    }

    #[test]
    fn many_distinct_keys_are_each_found_again() {
        let mut packed = Packed::default();
        let delta = |i: i32| StackDelta::new(i as u64 * 0x9_0000_0001, hint::NONE, info::sp(i));
        for i in 0..20_000 {
            packed.push(&delta(i));
        }
        for i in 0..20_000 {
            packed.push(&delta(i));
        }
        assert_eq!(packed.keys.keys.len(), 20_000);
        assert!(packed.keys.table.len() >= 40_000);
        for (i, d) in packed.iter_from(20_000).enumerate() {
            assert_eq!(d, delta(i as i32));
        }
    }

    #[test]
    fn reserved_room_takes_the_appends_without_allocating() {
        let mut packed = Packed::default();
        assert_eq!(packed.reserve(1000, 1000), Ok(()));
        let (slots, keys, table) = (
            packed.slots.capacity(),
            packed.keys.keys.capacity(),
            packed.keys.table.len(),
        );
        for i in 0..1000 {
            packed.push(&StackDelta::new(i, hint::NONE, info::sp(i as i32)));
        }
        assert_eq!(packed.slots.capacity(), slots);
        assert_eq!(packed.keys.keys.capacity(), keys);
        assert_eq!(packed.keys.table.len(), table);
    }

    #[test]
    fn a_run_appended_to_another_list_keeps_its_deltas() {
        let mut a = Packed::default();
        let mut b = Packed::default();
        a.push(&StackDelta::new(0x10, hint::KEEP, info::sp(8)));
        for (i, rule) in [info::sp(16), info::sp(8), info::STOP, info::sp(16)]
            .into_iter()
            .enumerate()
        {
            b.push(&StackDelta::new(0x5_0000_0000 + i as u64, hint::NONE, rule));
        }
        a.extend_from(&b, 1..4);
        let want: Vec<StackDelta> = a.iter_from(0).take(1).chain(b.iter_from(1)).collect();
        assert_eq!(a.iter_from(0).collect::<Vec<_>>(), want);
        assert_eq!(a.len(), 4);
    }
}
