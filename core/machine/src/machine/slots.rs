//! The `unwind_info_array` bookkeeping: which rule each slot holds, how many
//! kernel tables use each slot, and when an unused slot may hold another
//! rule.
//!
//! The book mirrors the kernel array exactly (`contents`), so that undoing a
//! failed load can restore a slot to what it held before, and so that a
//! consistency checker can compare the mirror with the kernel.
//!
//! A slot is in one of four states:
//! * **free**: zero in the kernel, never reachable since it was zeroed;
//!   reusable at once, lowest first;
//! * **live**: referenced by `users` kernel tables (of loaded files, or
//!   leftover tables still waiting for their removal);
//! * **cooling**: no table references it any more, but a BPF reader that
//!   looked a table up before it was unpublished may still follow it here
//!   until `reusable_at`. It keeps its rule (or its zero), so a file needing
//!   the same rule revives it without any write; writing a *different* rule
//!   waits until `reusable_at`, when no reader can be on the old path;
//! * **reserved**: taken by a plan that is neither committed nor aborted
//!   yet (never seen between two calls of the book).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::abi::UnwindInfo;
use crate::machine::Timestamp;

/// How long a slot stays cooling after the last table that referenced it
/// was unpublished, before it may hold a different rule.
///
/// A reader is the unwinder's BPF program: a non-sleepable tracing program
/// that runs under `rcu_read_lock` and holds the inner-map pointer it looked
/// up only for that one run, microseconds (the verifier bounds a run to a
/// million instructions, well under a millisecond). The outer-map delete
/// that unpublishes a table also waits for an RCU grace period on the
/// kernels measured here (`KERNEL_FINDINGS.md`), but eim does not rely on
/// that alone: newer kernels defer the inner map's release instead of
/// waiting, a sleepable or preempted reader can outlast one grace period,
/// and a virtual CPU can be descheduled for hundreds of milliseconds. Five
/// seconds is more than three orders of magnitude above any of these,
/// and costs little: only the rules released in the last five seconds are
/// unavailable for reassignment (a file needing one of them still revives
/// it at once).
pub const DEFAULT_SLOT_GRACE: Duration = Duration::from_secs(5);

/// What a slot is used for (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Free,
    Live { users: u32 },
    Cooling { reusable_at: Timestamp },
    Reserved,
}

/// What a reassigned slot held before, so that a plan that never wrote it
/// can put it back exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reclaimed {
    pub(crate) content: Option<UnwindInfo>,
    pub(crate) reusable_at: Timestamp,
}

/// Slots of `unwind_info_array`.
#[derive(Clone, Debug)]
pub struct UnwindSlots {
    capacity: u32,
    /// What the kernel holds in each slot below the high-water mark; `None`
    /// is a zeroed (never written, or restored) slot.
    contents: Vec<Option<UnwindInfo>>,
    index: HashMap<UnwindInfo, u16, foldhash::fast::RandomState>,
    /// Kernel tables that reference each slot.
    users: Vec<u32>,
    /// Free slots below the high-water mark, reused lowest first.
    free: BTreeSet<u16>,
    /// Cooling slots, by the time they may hold another rule.
    cooling: BTreeSet<(Timestamp, u16)>,
    /// `Some` exactly for cooling slots.
    reusable_at: Vec<Option<Timestamp>>,
}

impl UnwindSlots {
    /// `capacity` must not exceed 0x8000: bit 15 of a kernel delta marks a
    /// command, so a slot index must fit in 15 bits.
    pub(crate) fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity.min(u32::from(crate::abi::DELTA_COMMAND_FLAG)),
            contents: Vec::new(),
            index: HashMap::default(),
            users: Vec::new(),
            free: BTreeSet::new(),
            cooling: BTreeSet::new(),
            reusable_at: Vec::new(),
        }
    }

    /// The mirror of an array observed at a warm restart
    /// ([`crate::machine::reconcile`]): `contents` up to the high-water mark
    /// (at most the capacity; each rule at most once) and the users of each
    /// slot. A slot with users is live; every other slot below the mark
    /// holding a rule cools until `cool_until`, keeping it, because a
    /// reader of a table unpublished just before the restart may still read
    /// it; every other zero slot cools until `zero_cool_until`, or is free
    /// if that is `None` (no reader can reach it any more).
    pub(crate) fn rebuilt(
        capacity: u32,
        contents: Vec<Option<UnwindInfo>>,
        users: Vec<u32>,
        cool_until: Timestamp,
        zero_cool_until: Option<Timestamp>,
    ) -> Self {
        let mut slots = Self::new(capacity);
        let high_water = contents.len().min(slots.capacity as usize);
        slots.contents = contents;
        slots.contents.truncate(high_water);
        slots.users = users;
        slots.users.resize(high_water, 0);
        slots.reusable_at = vec![None; high_water];
        for (i, content) in slots.contents.iter().enumerate() {
            if let Some(info) = content {
                slots.index.entry(*info).or_insert(i as u16);
            }
        }
        for slot in 0..high_water {
            if slots.users[slot] != 0 {
                continue;
            }
            let until = match (slots.contents[slot], zero_cool_until) {
                (Some(_), _) => cool_until,
                (None, Some(until)) => until,
                (None, None) => {
                    slots.free.insert(slot as u16);
                    continue;
                }
            };
            slots.reusable_at[slot] = Some(until);
            slots.cooling.insert((until, slot as u16));
        }
        slots
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots ever handed out (the kernel array is zero above).
    pub fn high_water(&self) -> usize {
        self.contents.len()
    }

    /// Slots that hold a rule, live or cooling (the kernel's non-zero slots).
    pub fn in_use(&self) -> usize {
        self.index.len()
    }

    /// Slots referenced by at least one kernel table (upstream's
    /// `UnwindInfoArraySize`: cooling slots are a cache, not a use).
    pub fn live(&self) -> usize {
        self.users.iter().filter(|&&u| u > 0).count()
    }

    /// Cooling slots, oldest first, with the time each may be reassigned.
    pub fn cooling(&self) -> impl Iterator<Item = (u16, Timestamp)> + '_ {
        self.cooling.iter().map(|&(at, slot)| (slot, at))
    }

    /// Free slots, lowest first.
    pub fn free(&self) -> impl Iterator<Item = u16> + '_ {
        self.free.iter().copied()
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

    /// The state of `slot`; slots at or above the high-water mark are free.
    pub fn state(&self, slot: u16) -> SlotState {
        let at = usize::from(slot);
        if at >= self.contents.len() || self.free.contains(&slot) {
            return SlotState::Free;
        }
        if let Some(reusable_at) = self.reusable_at[at] {
            return SlotState::Cooling { reusable_at };
        }
        match self.users[at] {
            0 => SlotState::Reserved,
            users => SlotState::Live { users },
        }
    }

    /// Takes `slot` out of cooling for a plan that uses its rule as it is
    /// (no write). Returns when it would have been reusable, for an undo.
    pub(crate) fn revive(&mut self, slot: u16) -> Option<Timestamp> {
        let at = self.reusable_at.get_mut(usize::from(slot))?.take()?;
        self.cooling.remove(&(at, slot));
        Some(at)
    }

    /// Reserves a slot for `info` and records it as holding it; the caller
    /// writes it. A free slot first, then a never-used one, then the cooling
    /// slot reusable earliest if that is no later than `now` (its old rule is
    /// returned for an undo). `None` when none is available.
    pub(crate) fn allocate(
        &mut self,
        info: UnwindInfo,
        now: Timestamp,
    ) -> Option<(u16, Option<Reclaimed>)> {
        let (slot, reclaimed) = if let Some(slot) = self.free.pop_first() {
            (slot, None)
        } else if (self.contents.len() as u32) < self.capacity {
            let slot = self.contents.len() as u16;
            self.contents.push(None);
            self.users.push(0);
            self.reusable_at.push(None);
            (slot, None)
        } else {
            let &(reusable_at, slot) = self.cooling.first()?;
            if reusable_at > now {
                return None;
            }
            self.cooling.pop_first();
            self.reusable_at[usize::from(slot)] = None;
            let content = self.contents[usize::from(slot)];
            self.unindex(slot, content);
            (
                slot,
                Some(Reclaimed {
                    content,
                    reusable_at,
                }),
            )
        };
        self.contents[usize::from(slot)] = Some(info);
        self.index.insert(info, slot);
        Some((slot, reclaimed))
    }

    fn unindex(&mut self, slot: u16, content: Option<UnwindInfo>) {
        if let Some(info) = content {
            if self.index.get(&info) == Some(&slot) {
                self.index.remove(&info);
            }
        }
    }

    /// Records that `slot` is zero again and was never reachable since: free.
    pub(crate) fn release(&mut self, slot: u16) {
        let at = usize::from(slot);
        if at >= self.contents.len() {
            return;
        }
        self.uncool(slot);
        let content = self.contents[at].take();
        self.unindex(slot, content);
        self.free.insert(slot);
        self.debug_check(slot);
    }

    /// Records that `slot` is zero again but may still be reached by a
    /// reader until `reusable_at`: cooling, with nothing to revive.
    pub(crate) fn quarantine_zeroed(&mut self, slot: u16, reusable_at: Timestamp) {
        let at = usize::from(slot);
        if at >= self.contents.len() {
            return;
        }
        let content = self.contents[at].take();
        self.unindex(slot, content);
        self.cool(slot, reusable_at);
    }

    /// Puts back what a reassigned, never written slot held.
    pub(crate) fn restore(&mut self, slot: u16, previous: Reclaimed) {
        let at = usize::from(slot);
        if at >= self.contents.len() {
            return;
        }
        let content = self.contents[at];
        self.unindex(slot, content);
        self.contents[at] = previous.content;
        if let Some(info) = previous.content {
            self.index.entry(info).or_insert(slot);
        }
        self.cool(slot, previous.reusable_at);
    }

    /// Makes an unused slot cooling until `reusable_at` (a later time wins
    /// if it is cooling already).
    pub(crate) fn cool(&mut self, slot: u16, reusable_at: Timestamp) {
        let at = usize::from(slot);
        if at >= self.contents.len() || self.users[at] > 0 {
            return;
        }
        self.free.remove(&slot);
        let until = self
            .uncool(slot)
            .map_or(reusable_at, |t| t.max(reusable_at));
        self.reusable_at[at] = Some(until);
        self.cooling.insert((until, slot));
        self.debug_check(slot);
    }

    fn uncool(&mut self, slot: u16) -> Option<Timestamp> {
        let at = self.reusable_at.get_mut(usize::from(slot))?.take()?;
        self.cooling.remove(&(at, slot));
        Some(at)
    }

    /// One more kernel table references `slot` (it stops cooling).
    pub(crate) fn add_user(&mut self, slot: u16) {
        self.uncool(slot);
        if let Some(u) = self.users.get_mut(usize::from(slot)) {
            *u += 1;
        }
        self.debug_check(slot);
    }

    /// The slot is in exactly one state (free, cooling, live or reserved),
    /// as the sets say. O(1): the accounting boundary the simulator checks
    /// from outside, asserted where it changes.
    fn debug_check(&self, slot: u16) {
        if !cfg!(debug_assertions) {
            return;
        }
        let at = usize::from(slot);
        let (Some(&users), Some(&until)) = (self.users.get(at), self.reusable_at.get(at)) else {
            return;
        };
        let free = self.free.contains(&slot);
        debug_assert!(
            !(free && (users > 0 || until.is_some() || self.contents[at].is_some())),
            "slot {slot}: free, yet {users} users, cooling {until:?} or holding a rule"
        );
        debug_assert!(
            until.is_none() || users == 0,
            "slot {slot}: cooling with {users} users"
        );
        debug_assert_eq!(
            until.is_some_and(|t| self.cooling.contains(&(t, slot))),
            until.is_some(),
            "slot {slot}: its cooling time and the cooling set disagree"
        );
    }

    /// A kernel table that referenced `slot` is unpublished; the last one
    /// makes it cooling until `reusable_at`.
    pub(crate) fn remove_user(&mut self, slot: u16, reusable_at: Timestamp) {
        let Some(u) = self.users.get_mut(usize::from(slot)) else {
            return;
        };
        debug_assert!(
            *u > 0,
            "slot {slot}: a user removed from a slot no table uses"
        );
        *u = u.saturating_sub(1);
        if *u == 0 {
            self.cool(slot, reusable_at);
        }
        self.debug_check(slot);
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

    fn t(secs: u64) -> Timestamp {
        Timestamp(Duration::from_secs(secs))
    }

    #[test]
    fn allocates_in_order_until_full() {
        let mut s = UnwindSlots::new(2);
        assert_eq!(s.allocate(rule(8), t(0)), Some((0, None)));
        assert_eq!(s.allocate(rule(16), t(0)), Some((1, None)));
        assert_eq!(s.allocate(rule(24), t(0)), None);
        assert_eq!(s.slot_of(&rule(16)), Some(1));
        assert_eq!(s.in_use(), 2);
    }

    #[test]
    fn cooling_leaves_a_slot_in_use_alone() {
        let mut s = UnwindSlots::new(2);
        let (slot, _) = s.allocate(rule(8), t(0)).unwrap();
        s.add_user(slot);
        s.cool(slot, t(5));
        assert_eq!(s.state(slot), SlotState::Live { users: 1 });
        assert_eq!(s.cooling().count(), 0);
        let (unused, _) = s.allocate(rule(16), t(0)).unwrap();
        s.cool(unused, t(5));
        assert_eq!(
            s.state(unused),
            SlotState::Cooling { reusable_at: t(5) },
            "an unused one cools"
        );
    }

    #[test]
    fn a_slot_cools_once_until_the_later_time_and_a_user_ends_it() {
        let mut s = UnwindSlots::new(2);
        let (slot, _) = s.allocate(rule(8), t(0)).unwrap();
        s.cool(slot, t(10));
        s.cool(slot, t(5));
        assert_eq!(s.state(slot), SlotState::Cooling { reusable_at: t(10) });
        assert_eq!(s.cooling().collect::<Vec<_>>(), [(slot, t(10))]);
        s.cool(slot, t(20));
        assert_eq!(s.cooling().collect::<Vec<_>>(), [(slot, t(20))]);
        s.add_user(slot);
        assert_eq!(s.cooling().count(), 0, "in use again");
        assert_eq!(s.state(slot), SlotState::Live { users: 1 });
    }

    #[test]
    fn released_slots_are_reused_lowest_first() {
        let mut s = UnwindSlots::new(4);
        for p in [8, 16, 24] {
            s.allocate(rule(p), t(0));
        }
        s.release(1);
        s.release(0);
        assert_eq!(s.content(1), None);
        assert_eq!(s.slot_of(&rule(16)), None);
        assert_eq!(s.allocate(rule(32), t(0)), Some((0, None)));
        assert_eq!(s.allocate(rule(40), t(0)), Some((1, None)));
        assert_eq!(s.allocate(rule(48), t(0)), Some((3, None)));
    }

    #[test]
    fn a_cooling_slot_is_reassigned_only_once_reusable_oldest_first() {
        let mut s = UnwindSlots::new(2);
        for p in [8, 16] {
            let (slot, _) = s.allocate(rule(p), t(0)).unwrap();
            s.add_user(slot);
        }
        s.remove_user(1, t(10));
        s.remove_user(0, t(12));
        assert_eq!(s.live(), 0);
        assert_eq!(s.in_use(), 2, "cooling slots keep their rules");
        assert_eq!(s.state(1), SlotState::Cooling { reusable_at: t(10) });
        assert_eq!(s.allocate(rule(24), t(9)), None, "not before the grace");
        let (slot, old) = s.allocate(rule(24), t(10)).unwrap();
        assert_eq!(slot, 1, "the one reusable earliest");
        assert_eq!(
            old,
            Some(Reclaimed {
                content: Some(rule(16)),
                reusable_at: t(10)
            })
        );
        assert_eq!(s.slot_of(&rule(16)), None);
        assert_eq!(s.slot_of(&rule(24)), Some(1));
        assert_eq!(s.state(1), SlotState::Reserved);
        // Putting it back is exact.
        s.restore(1, old.unwrap());
        assert_eq!(s.slot_of(&rule(16)), Some(1));
        assert_eq!(s.slot_of(&rule(24)), None);
        assert_eq!(s.state(1), SlotState::Cooling { reusable_at: t(10) });
    }

    #[test]
    fn a_cooling_slot_is_revived_without_waiting() {
        let mut s = UnwindSlots::new(1);
        let (slot, _) = s.allocate(rule(8), t(0)).unwrap();
        s.add_user(slot);
        s.remove_user(slot, t(100));
        assert_eq!(s.revive(slot), Some(t(100)));
        assert_eq!(s.revive(slot), None, "no longer cooling");
        s.add_user(slot);
        assert_eq!(s.state(slot), SlotState::Live { users: 1 });
        assert_eq!(s.cooling().count(), 0);
    }

    #[test]
    fn a_quarantined_zero_slot_holds_no_rule_but_waits() {
        let mut s = UnwindSlots::new(1);
        s.allocate(rule(8), t(0));
        s.quarantine_zeroed(0, t(5));
        assert_eq!(s.content(0), None);
        assert_eq!(s.slot_of(&rule(8)), None);
        assert_eq!(s.allocate(rule(8), t(4)), None);
        assert_eq!(
            s.allocate(rule(8), t(5)),
            Some((
                0,
                Some(Reclaimed {
                    content: None,
                    reusable_at: t(5)
                })
            ))
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a user removed from a slot no table uses")]
    fn a_user_removed_twice_is_caught() {
        let mut slots = UnwindSlots::new(4);
        let (slot, _) = slots.allocate(rule(8), t(0)).unwrap();
        slots.add_user(slot);
        slots.remove_user(slot, t(1));
        slots.remove_user(slot, t(1));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "free, yet 2 users")]
    fn a_live_slot_in_the_free_set_is_caught() {
        let mut slots = UnwindSlots::new(4);
        let (slot, _) = slots.allocate(rule(8), t(0)).unwrap();
        slots.add_user(slot);
        // Corrupt: a slot a table uses is also free.
        slots.free.insert(slot);
        slots.add_user(slot);
    }

    #[test]
    fn capacity_is_capped_below_the_command_flag() {
        assert_eq!(UnwindSlots::new(1 << 20).capacity(), 0x8000);
    }
}
