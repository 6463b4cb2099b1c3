//! Stack deltas as extraction produces them, and upstream's de-duplicating
//! append rules.
//!
//! A delta says "from this address on, until the next delta, unwind with this
//! rule". Extraction appends deltas through [`IntervalData::add_ex`], which
//! folds away repeats and end-of-function markers exactly as upstream's
//! `AddEx` does, so that the lists (and everything encoded from them) are
//! identical to upstream's.

use crate::abi::{command, opcode, UnwindInfo};

/// Hint flags carried by a delta during extraction.
pub mod hint {
    pub const NONE: u8 = 0;
    /// The delta starts a function: keep it even when it repeats a rule.
    pub const KEEP: u8 = 1;
    /// The delta marks the end of a function: a following function that starts
    /// within [`super::MINIMUM_GAP`] bytes replaces it.
    pub const GAP: u8 = 4;
}

/// An end-of-function marker followed by a delta at most this many bytes
/// later is padding, not a real gap.
pub const MINIMUM_GAP: u64 = 15;

/// Predefined unwind rules.
pub mod info {
    use super::*;

    const fn cmd(param: i32) -> UnwindInfo {
        UnwindInfo::new(opcode::COMMAND, param, 0, 0)
    }

    pub const INVALID: UnwindInfo = cmd(command::INVALID);
    pub const STOP: UnwindInfo = cmd(command::STOP);
    pub const PLT: UnwindInfo = cmd(command::PLT);
    pub const SIGNAL: UnwindInfo = cmd(command::SIGNAL);
    pub const FRAME_POINTER: UnwindInfo = cmd(command::FRAME_POINTER);
    /// arm64 leaf: CFA = SP, return address in LR.
    pub const LR: UnwindInfo = UnwindInfo::new(opcode::BASE_SP, 0, opcode::BASE_LR, 0);

    /// CFA = SP + `offset`, no frame-pointer rule.
    pub const fn sp(offset: i32) -> UnwindInfo {
        UnwindInfo::new(opcode::BASE_SP, offset, 0, 0)
    }
}

/// One extracted delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackDelta {
    /// ELF virtual address where the rule starts.
    pub address: u64,
    pub hints: u8,
    pub info: UnwindInfo,
}

impl StackDelta {
    pub const fn new(address: u64, hints: u8, info: UnwindInfo) -> Self {
        Self {
            address,
            hints,
            info,
        }
    }
}

/// `a == b`, without branches.
#[inline(always)]
fn same_rule(a: &UnwindInfo, b: &UnwindInfo) -> bool {
    let bytes = |i: &UnwindInfo| u32::from_ne_bytes([i.opcode, i.fp_opcode, i.merge_opcode, i.pad]);
    ((bytes(a) ^ bytes(b)) | (a.param ^ b.param) as u32 | (a.fp_param ^ b.fp_param) as u32) == 0
}

/// The unwind data of one file: deltas sorted by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntervalData {
    pub deltas: Vec<StackDelta>,
}

impl IntervalData {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_deltas(deltas: Vec<StackDelta>) -> Self {
        Self { deltas }
    }

    pub fn len(&self) -> usize {
        self.deltas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }

    /// Appends a delta known to come after every delta already present.
    pub fn add(&mut self, delta: StackDelta) {
        self.add_ex(delta, true);
    }

    /// Upstream's `AddEx`: appends `delta`, folding it into the previous one
    /// when it repeats the rule, replaces a same-address delta, or lands in
    /// the padding after an end-of-function marker. With `sorted == false`
    /// it only appends (the list is sorted and de-duplicated later).
    #[inline(always)]
    pub fn add_ex(&mut self, mut delta: StackDelta, sorted: bool) {
        if delta.info.opcode == opcode::COMMAND {
            delta.info.fp_opcode = 0;
            delta.info.fp_param = 0;
        }
        if sorted {
            // The common case inline: the tail is not an end marker, so
            // only the tail is compared (as `fold` does).
            if let Some(prev) = self.deltas.last_mut() {
                if prev.hints & hint::GAP == 0 {
                    if same_rule(&prev.info, &delta.info) {
                        prev.hints |= delta.hints & hint::KEEP;
                    } else if prev.address == delta.address {
                        *prev = delta;
                    } else {
                        self.deltas.push(delta);
                    }
                    return;
                }
            }
            if let Some(folded) = self.fold(delta) {
                self.deltas.push(folded);
            }
        } else {
            self.deltas.push(delta);
        }
    }

    /// Applies the folding rules against the tail; returns the delta if it
    /// still has to be appended.
    fn fold(&mut self, delta: StackDelta) -> Option<StackDelta> {
        let Some(mut prev_at) = self.deltas.len().checked_sub(1) else {
            return Some(delta);
        };
        let prev = self.deltas[prev_at];
        if prev.hints & hint::GAP != 0 && prev.address.wrapping_add(MINIMUM_GAP) >= delta.address {
            // The marker was padding between two functions.
            match prev_at.checked_sub(1) {
                Some(before) if self.deltas[before].info == delta.info => {
                    self.deltas.pop();
                    prev_at = before;
                }
                _ => {
                    self.deltas[prev_at] = delta;
                    return None;
                }
            }
        }
        let prev = &mut self.deltas[prev_at];
        if prev.info == delta.info {
            prev.hints |= delta.hints & hint::KEEP;
            return None;
        }
        if prev.address == delta.address {
            *prev = delta;
            return None;
        }
        Some(delta)
    }

    /// Sorts by (address, opcode, param) and re-applies the folding rules,
    /// as upstream does after unsorted sources. Ties are broken by the whole
    /// delta so the result never depends on the input order (upstream's sort
    /// is not stable; eim's is deterministic).
    pub fn sort_and_dedup(&mut self) {
        let mut all = core::mem::take(&mut self.deltas);
        all.sort_by(|a, b| {
            (a.address, a.info.opcode, a.info.param)
                .cmp(&(b.address, b.info.opcode, b.info.param))
                .then_with(|| (a.info, a.hints).cmp(&(b.info, b.hints)))
        });
        self.deltas.reserve(all.len());
        for d in all {
            self.add(d);
        }
    }

    /// The delta in force at `address`: the last one at or below it.
    pub fn find(&self, address: u64) -> Option<&StackDelta> {
        let after = self.deltas.partition_point(|d| d.address <= address);
        after.checked_sub(1).map(|i| &self.deltas[i])
    }
}

#[cfg(test)]
mod tests {
    use super::info::sp;
    use super::*;

    fn d(address: u64, hints: u8, info: UnwindInfo) -> StackDelta {
        StackDelta::new(address, hints, info)
    }

    #[test]
    fn commands_lose_their_frame_pointer_rule() {
        let mut data = IntervalData::new();
        let mut stop = info::STOP;
        stop.fp_opcode = opcode::BASE_CFA;
        stop.fp_param = -16;
        data.add(d(0x10, hint::KEEP, stop));
        assert_eq!(data.deltas, vec![d(0x10, hint::KEEP, info::STOP)]);
    }

    #[test]
    fn a_repeated_rule_folds_and_keeps_the_keep_hint() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x20, hint::KEEP, sp(8)));
        assert_eq!(data.deltas, vec![d(0x10, hint::KEEP, sp(8))]);
    }

    #[test]
    fn the_same_address_replaces() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x10, hint::NONE, sp(16)));
        assert_eq!(data.deltas, vec![d(0x10, hint::NONE, sp(16))]);
    }

    #[test]
    fn an_end_marker_within_the_padding_is_replaced() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::KEEP, sp(8)));
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x2f, hint::KEEP, sp(16)));
        assert_eq!(
            data.deltas,
            vec![d(0x10, hint::KEEP, sp(8)), d(0x2f, hint::KEEP, sp(16))]
        );
    }

    #[test]
    fn an_end_marker_between_equal_rules_is_dropped_and_the_rules_merge() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x25, hint::KEEP, sp(8)));
        assert_eq!(data.deltas, vec![d(0x10, hint::KEEP, sp(8))]);
    }

    #[test]
    fn an_end_marker_beyond_the_padding_stays() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::KEEP, sp(8)));
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x30, hint::KEEP, sp(16)));
        assert_eq!(data.len(), 3);
    }

    #[test]
    fn a_lone_end_marker_is_replaced() {
        let mut data = IntervalData::new();
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x21, hint::NONE, sp(8)));
        assert_eq!(data.deltas, vec![d(0x21, hint::NONE, sp(8))]);
    }

    #[test]
    fn unsorted_appends_then_sort_gives_the_sorted_result() {
        let input = [
            d(0x30, hint::KEEP, sp(16)),
            d(0x10, hint::KEEP, sp(8)),
            d(0x20, hint::GAP, info::INVALID),
            d(0x20, hint::KEEP, sp(24)),
        ];
        let mut unsorted = IntervalData::new();
        for x in input {
            unsorted.add_ex(x, false);
        }
        unsorted.sort_and_dedup();
        // INVALID sorts before the real rule at 0x20, which then replaces it.
        assert_eq!(
            unsorted.deltas,
            vec![
                d(0x10, hint::KEEP, sp(8)),
                d(0x20, hint::KEEP, sp(24)),
                d(0x30, hint::KEEP, sp(16)),
            ]
        );
    }

    #[test]
    fn find_returns_the_rule_in_force() {
        let data = IntervalData::from_deltas(vec![d(0x10, 0, sp(8)), d(0x20, 0, sp(16))]);
        assert_eq!(data.find(0x0f), None);
        assert_eq!(data.find(0x10).map(|x| x.info), Some(sp(8)));
        assert_eq!(data.find(0x1f).map(|x| x.info), Some(sp(8)));
        assert_eq!(data.find(0x20).map(|x| x.info), Some(sp(16)));
        assert_eq!(data.find(u64::MAX).map(|x| x.info), Some(sp(16)));
    }
}
