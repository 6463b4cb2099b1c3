//! A backend that checks reader safety after every single op it applies,
//! so that the moments *inside* a plan (between two ops) are checked too,
//! not only the quiescent points between calls.

use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::Clock;
use eim_machine::ops::{Backend, MapOp, OpFailure};

use crate::checker::{check_reader_safety, Sources, Violation};
use crate::slot_watch::SlotWatch;
use eim_sim::kernel::SimMaps;

/// [`SimMaps`] plus a reader-safety check after each op.
#[derive(Clone, Debug)]
pub struct Observed {
    pub maps: SimMaps,
    sources: Arc<Sources>,
    /// Spread-out addresses per page, besides every delta and its neighbours.
    spread: u64,
    /// The first violation seen, with the op that produced it.
    pub violation: Option<(MapOp, Violation)>,
    /// Ops checked so far.
    pub checked: u64,
    /// Every op applied, by name and number of elements, in order: where a
    /// test can place its next fault.
    pub applied: Vec<(&'static str, usize)>,
    /// Slot reuse against readers still in flight, when watched.
    pub watch: Option<SlotWatch>,
    /// Whether reader safety is checked after each op (on by default; a
    /// long run may check only some stretches, the slot watch still runs).
    pub reader_checks: bool,
}

impl Observed {
    pub fn new(maps: SimMaps, sources: Arc<Sources>, spread: u64) -> Self {
        Self {
            maps,
            sources,
            spread,
            violation: None,
            checked: 0,
            applied: Vec::new(),
            watch: None,
            reader_checks: true,
        }
    }

    /// Also checks, after each slot write, that no slot got a different rule
    /// less than `grace` (by `clock`, the manager's) after a published table
    /// last referenced it.
    pub fn watch_slots(mut self, clock: Arc<dyn Clock>, grace: Duration) -> Self {
        self.watch = Some(SlotWatch::new(clock, grace));
        self
    }
}

impl Backend for Observed {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        if let Some(watch) = &mut self.watch {
            if SlotWatch::wants_observation(op) {
                watch.observe(&self.maps);
            }
        }
        let result = self.maps.apply(op);
        self.checked += 1;
        self.applied.push((op.name(), op.len()));
        if self.violation.is_none() {
            let reuse = self
                .watch
                .as_ref()
                .map_or(Ok(()), |w| w.check_write(&self.maps, op));
            let readers = || match self.reader_checks {
                true => check_reader_safety(&self.maps, &self.sources, self.spread),
                false => Ok(()),
            };
            if let Err(v) = reuse.and_then(|()| readers()) {
                self.violation = Some((op.clone(), v));
            }
        }
        result
    }
}
