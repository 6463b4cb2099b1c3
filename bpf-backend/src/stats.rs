//! How many entries eim's maps hold, as the kernel reports them.

use std::collections::BTreeMap;

/// How many entries eim's maps hold (or, in [`crate::PinReport::cleaned`], how
/// many were removed), as the kernel reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapStats {
    /// `stack_delta_page_to_info` entries.
    pub pages: usize,
    /// Outer-map entries (published delta tables) by size class, for the
    /// classes that have any.
    pub tables: BTreeMap<u16, usize>,
    /// `unwind_info_array` slots that are not all zero.
    pub unwind_slots: usize,
    /// `interpreter_offsets` entries.
    pub interpreter_offsets: usize,
    /// `eim_process_mappings` entries (processes).
    pub processes: usize,
}

impl MapStats {
    /// Whether no map holds anything.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}
