//! Reader safety across time for `unwind_info_array` (invariant 6).
//!
//! The per-op reader-safety check looks at the maps at one instant. A real
//! BPF reader is not instantaneous: it looks a file's table up, then reads
//! a delta, then reads the slot the delta names. If the table is
//! unpublished in between, the reader still finishes with the pointer it
//! holds, and reads the slot a moment later. Writing a different rule into
//! that slot meanwhile would make it unwind with the wrong rule, silently.
//!
//! [`SlotWatch`] models that hazard with a clock shared with the manager: it
//! records, per slot, the last time a published table referenced it and the
//! rule the slot held then. A write that leaves a slot holding a different,
//! non-zero rule less than `grace` after that is a violation. Zeroing a slot
//! is not one: a zero slot is invalid to the unwinder (the frame fails, it is
//! never unwound wrongly), and a rollback zeroes slots right after
//! unpublishing the failed table. The watch's grace is the reader model's,
//! set independently of the manager's, so a manager that does not wait long
//! enough is caught.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::Clock;
use eim_machine::abi::{UnwindInfo, DELTA_COMMAND_FLAG};
use eim_machine::machine::Timestamp;
use eim_machine::ops::MapOp;

use crate::checker::Violation;
use eim_sim::kernel::SimMaps;

/// The last reference to each slot by a published table.
#[derive(Clone)]
pub struct SlotWatch {
    clock: Arc<dyn Clock>,
    grace: Duration,
    /// slot -> (last time a published table referenced it, its rule then)
    last_reference: HashMap<u32, (Timestamp, UnwindInfo)>,
}

impl std::fmt::Debug for SlotWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotWatch")
            .field("now", &self.clock.now())
            .field("grace", &self.grace)
            .field("slots", &self.last_reference.len())
            .finish()
    }
}

impl SlotWatch {
    /// The time on the watch's clock.
    pub fn now(&self) -> eim_machine::machine::Timestamp {
        self.clock.now()
    }

    /// A watch on `clock` (the manager's) with the readers' `grace`.
    pub fn new(clock: Arc<dyn Clock>, grace: Duration) -> Self {
        Self {
            clock,
            grace,
            last_reference: HashMap::new(),
        }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// When a published table last referenced `slot`, and the rule it held.
    pub fn last_reference(&self, slot: u32) -> Option<(Timestamp, UnwindInfo)> {
        self.last_reference.get(&slot).copied()
    }

    /// Records every slot a published table references, as of now.
    pub fn observe(&mut self, maps: &SimMaps) {
        let now = self.clock.now();
        for table in maps.delta_tables().values() {
            // Entries past the extent are zero and past every page's range.
            for index in 0..table.extent() as u32 {
                let Some(delta) = table.get(index) else {
                    break;
                };
                if delta.unwind_info & DELTA_COMMAND_FLAG != 0 {
                    continue;
                }
                let slot = u32::from(delta.unwind_info);
                let rule = maps.unwind_info(slot).unwrap_or_default();
                self.last_reference.insert(slot, (now, rule));
            }
        }
    }

    /// Whether the watch must look at the maps before `op` runs: before a
    /// table disappears (its references end now) and before a slot write
    /// (the tables published now reference their slots now).
    pub fn wants_observation(op: &MapOp) -> bool {
        matches!(
            op,
            MapOp::PutUnwindInfos(_) | MapOp::DeleteDeltaTable { .. }
        )
    }

    /// Checks the slots `op` wrote (as far as it got: the maps are read).
    pub fn check_write(&self, maps: &SimMaps, op: &MapOp) -> Result<(), Violation> {
        let MapOp::PutUnwindInfos(infos) = op else {
            return Ok(());
        };
        let now = self.clock.now();
        for &(slot, _) in infos {
            let slot = u32::from(slot);
            let Some(held) = maps.unwind_info(slot) else {
                continue;
            };
            if held == UnwindInfo::default() {
                continue;
            }
            let Some(&(at, rule)) = self.last_reference.get(&slot) else {
                continue;
            };
            let since = now.0.saturating_sub(at.0);
            if rule != held && since < self.grace {
                return Err(Violation::SlotReuse {
                    slot,
                    from: rule,
                    to: held,
                    since_reference: since,
                    grace: self.grace,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_core::manager::ManualClock;
    use eim_machine::deltas::info::sp;
    use eim_machine::ops::Backend;
    use eim_machine::FileId;

    use eim_sim::kernel::SimConfig;

    fn table(file: u64, slot: u16) -> MapOp {
        MapOp::PutDeltaTable {
            file_id: FileId(file),
            map_id: 8,
            deltas: Arc::from(vec![eim_machine::abi::StackDelta {
                addr_low: 0x10,
                unwind_info: slot,
            }]),
        }
    }

    #[test]
    fn a_different_rule_inside_the_grace_is_caught_and_after_it_is_not() {
        let clock = Arc::new(ManualClock::new());
        let mut watch = SlotWatch::new(clock.clone(), Duration::from_secs(2));
        let mut maps = SimMaps::new(SimConfig::default()).unwrap();
        maps.apply(&MapOp::PutUnwindInfos(vec![(3, sp(8))]))
            .unwrap();
        maps.apply(&table(1, 3)).unwrap();
        let unpublish = MapOp::DeleteDeltaTable {
            file_id: FileId(1),
            map_id: 8,
        };
        watch.observe(&maps);
        maps.apply(&unpublish).unwrap();
        assert_eq!(watch.last_reference(3), Some((clock.now(), sp(8))));

        clock.advance(Duration::from_millis(1999));
        let same = MapOp::PutUnwindInfos(vec![(3, sp(8))]);
        maps.apply(&same).unwrap();
        assert_eq!(watch.check_write(&maps, &same), Ok(()), "same rule");
        let zero = MapOp::PutUnwindInfos(vec![(3, UnwindInfo::default())]);
        maps.apply(&zero).unwrap();
        assert_eq!(watch.check_write(&maps, &zero), Ok(()), "zeroing");
        let other = MapOp::PutUnwindInfos(vec![(3, sp(16))]);
        maps.apply(&other).unwrap();
        assert!(matches!(
            watch.check_write(&maps, &other),
            Err(Violation::SlotReuse { slot: 3, .. })
        ));
        clock.advance(Duration::from_millis(1));
        assert_eq!(watch.check_write(&maps, &other), Ok(()), "grace elapsed");
    }

    #[test]
    fn a_slot_of_a_published_table_is_referenced_now() {
        let clock = Arc::new(ManualClock::new());
        let mut watch = SlotWatch::new(clock.clone(), Duration::from_secs(1));
        let mut maps = SimMaps::new(SimConfig::default()).unwrap();
        maps.apply(&MapOp::PutUnwindInfos(vec![(0, sp(8))]))
            .unwrap();
        maps.apply(&table(1, 0)).unwrap();
        clock.advance(Duration::from_secs(100));
        watch.observe(&maps);
        let other = MapOp::PutUnwindInfos(vec![(0, sp(16))]);
        maps.apply(&other).unwrap();
        assert!(watch.check_write(&maps, &other).is_err());
    }
}
