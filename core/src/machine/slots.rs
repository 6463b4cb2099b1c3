//! The `unwind_info_array` bookkeeping: which rule each slot holds, which
//! slots are free, and how many loaded files use each slot.
//!
//! The book mirrors the kernel array exactly (`contents`), so that undoing a
//! failed load can restore a slot to what it held before, and so that a
//! consistency checker can compare the mirror with the kernel.

use std::collections::{BTreeSet, HashMap};

use crate::abi::UnwindInfo;

/// Slots of `unwind_info_array`.
#[derive(Clone, Debug)]
pub struct UnwindSlots {
    capacity: u32,
    /// What the kernel holds in each slot below the high-water mark; `None`
    /// is a zeroed (never written, or restored) slot.
    contents: Vec<Option<UnwindInfo>>,
    index: HashMap<UnwindInfo, u16>,
    /// Loaded files that use each slot.
    users: Vec<u32>,
    /// Zeroed slots below the high-water mark, reused lowest first.
    free: BTreeSet<u16>,
}

impl UnwindSlots {
    /// `capacity` must not exceed 0x8000: bit 15 of a kernel delta marks a
    /// command, so a slot index must fit in 15 bits.
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity.min(u32::from(crate::abi::DELTA_COMMAND_FLAG)),
            contents: Vec::new(),
            index: HashMap::new(),
            users: Vec::new(),
            free: BTreeSet::new(),
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots that hold a rule (upstream's `UnwindInfoArraySize`).
    pub fn in_use(&self) -> usize {
        self.index.len()
    }

    pub fn slot_of(&self, info: &UnwindInfo) -> Option<u16> {
        self.index.get(info).copied()
    }

    /// The kernel contents of `slot` as the book knows them.
    pub fn content(&self, slot: u16) -> Option<UnwindInfo> {
        self.contents.get(usize::from(slot)).copied().flatten()
    }

    /// Every slot that holds a rule, in slot order.
    pub fn occupied(&self) -> impl Iterator<Item = (u16, UnwindInfo)> + '_ {
        self.contents
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.map(|info| (i as u16, info)))
    }

    pub fn users(&self, slot: u16) -> u32 {
        self.users.get(usize::from(slot)).copied().unwrap_or(0)
    }

    /// Reserves a zeroed slot for `info` and records it as holding it; the
    /// caller writes it. `None` when the array is full.
    pub fn allocate(&mut self, info: UnwindInfo) -> Option<u16> {
        let slot = match self.free.pop_first() {
            Some(slot) => slot,
            None => {
                let next = self.contents.len() as u32;
                if next >= self.capacity {
                    return None;
                }
                self.contents.push(None);
                self.users.push(0);
                next as u16
            }
        };
        self.contents[usize::from(slot)] = Some(info);
        self.index.insert(info, slot);
        Some(slot)
    }

    /// Records that `slot` is zeroed again (a rollback wrote zeros to it).
    pub fn release(&mut self, slot: u16) {
        let at = usize::from(slot);
        if let Some(Some(info)) = self.contents.get(at).copied() {
            if self.index.get(&info) == Some(&slot) {
                self.index.remove(&info);
            }
            self.contents[at] = None;
            self.free.insert(slot);
        }
    }

    pub fn add_user(&mut self, slot: u16) {
        if let Some(u) = self.users.get_mut(usize::from(slot)) {
            *u += 1;
        }
    }

    pub fn remove_user(&mut self, slot: u16) {
        if let Some(u) = self.users.get_mut(usize::from(slot)) {
            *u = u.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(param: i32) -> UnwindInfo {
        UnwindInfo {
            opcode: crate::abi::opcode::BASE_SP,
            param,
            ..UnwindInfo::default()
        }
    }

    #[test]
    fn allocates_in_order_until_full() {
        let mut s = UnwindSlots::new(2);
        assert_eq!(s.allocate(rule(8)), Some(0));
        assert_eq!(s.allocate(rule(16)), Some(1));
        assert_eq!(s.allocate(rule(24)), None);
        assert_eq!(s.slot_of(&rule(16)), Some(1));
        assert_eq!(s.in_use(), 2);
    }

    #[test]
    fn released_slots_are_reused_lowest_first() {
        let mut s = UnwindSlots::new(4);
        for p in [8, 16, 24] {
            s.allocate(rule(p));
        }
        s.release(1);
        s.release(0);
        assert_eq!(s.content(1), None);
        assert_eq!(s.slot_of(&rule(16)), None);
        assert_eq!(s.allocate(rule(32)), Some(0));
        assert_eq!(s.allocate(rule(40)), Some(1));
        assert_eq!(s.allocate(rule(48)), Some(3));
    }

    #[test]
    fn capacity_is_capped_below_the_command_flag() {
        assert_eq!(UnwindSlots::new(1 << 20).capacity(), 0x8000);
    }
}
