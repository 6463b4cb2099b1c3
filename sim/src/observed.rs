//! A backend that checks reader safety after every single op it applies,
//! so that the moments *inside* a plan (between two ops) are checked too,
//! not only the quiescent points between calls.

use std::sync::Arc;

use eim_core::ops::{Backend, MapOp, OpFailure};

use crate::checker::{check_reader_safety, Sources, Violation};
use crate::kernel::SimMaps;

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
}

impl Observed {
    pub fn new(maps: SimMaps, sources: Arc<Sources>, spread: u64) -> Self {
        Self {
            maps,
            sources,
            spread,
            violation: None,
            checked: 0,
        }
    }
}

impl Backend for Observed {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        let result = self.maps.apply(op);
        self.checked += 1;
        if self.violation.is_none() {
            if let Err(v) = check_reader_safety(&self.maps, &self.sources, self.spread) {
                self.violation = Some((op.clone(), v));
            }
        }
        result
    }
}
