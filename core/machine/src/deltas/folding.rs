//! A list of deltas that extraction sorts at the end, folded as it is
//! built while its deltas come in order.
//!
//! After an unsorted source (a linear CFI walk), extraction used to hold
//! every delta until its final [`IntervalData::sort_and_dedup`]: 6.7
//! million of them (161 MB) for 64 MiB of minimal FDEs, even when they
//! fold into a few. Yet `sort_and_dedup` of a list already in its sort
//! order is the fold of the list as it stands (upstream's sorted appends,
//! one by one, from an empty list), and a left fold can be run a piece at
//! a time. So, while the deltas come in order (FDEs in address order, the
//! usual case), [`FoldingList`] folds them a chunk at a time and holds
//! only the fold and the latest chunk. Order is checked over every delta
//! the plain list would hold, exactly as it would hold it (an FDE's rows
//! fold into its first delta as they do there).
//!
//! Deltas out of order before anything was folded away leave the list
//! exactly the plain one: it holds the rest and is sorted at the end as
//! before. After something was folded away, the sorted list cannot be had
//! from what is left: the list is lost, and the caller extracts again
//! with a plain list ([`FoldingList::finish`]). Lists of fewer than
//! [`FOLD_CHUNK`] deltas are never folded, so they never cost a second
//! walk.

use std::cmp::Ordering;

use super::{
    append_sorted, hint, normalized, same_rule, sort_order, CfiList, DeltaSink, Front,
    IntervalData, NoRoom, Packed, StackDelta, Tail, MAX_EXTRACTED_DELTAS, MINIMUM_GAP,
};

/// Deltas held before they are folded: the room a CFI walk reserves up
/// front (`walk::MAX_RESERVED_DELTAS`), 24 MiB.
pub(super) const FOLD_CHUNK: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The plain list, exactly: before the first unsorted source, or for
    /// good after deltas out of order arrived before any was folded away.
    Plain,
    /// `data[..folded]` is the fold of the first `committed` deltas of
    /// the plain list, all in sort order; `data[folded..]` the plain
    /// list's deltas after them, as it holds them.
    Folding,
    /// Deltas out of order after some were folded away.
    Lost,
}

/// See the module documentation.
#[derive(Debug)]
pub struct FoldingList {
    data: IntervalData,
    mode: Mode,
    /// Whether the list may still start folding.
    may_fold: bool,
    folded: usize,
    committed: usize,
    /// The plain list's last committed delta (the fold may have merged
    /// it into an earlier one).
    last_committed: Option<StackDelta>,
    /// The plain list's length when folding started.
    started_at: usize,
    /// The plain list's capacity: [`DeltaSink::make_room`] refuses more
    /// than [`MAX_EXTRACTED_DELTAS`] exactly when the plain list would.
    capacity: usize,
    /// [`FOLD_CHUNK`], smaller in the tests.
    chunk: usize,
}

impl Default for FoldingList {
    fn default() -> Self {
        Self::new()
    }
}

/// The capacity `Vec::try_reserve(additional)` (or a push, with 1) leaves
/// a `Vec` of `len` packed deltas with: std's amortized growth, at least
/// twice the old capacity and at least 4.
fn grown(capacity: usize, len: usize, additional: usize) -> usize {
    if capacity.saturating_sub(len) >= additional {
        return capacity;
    }
    capacity
        .saturating_mul(2)
        .max(len.saturating_add(additional))
        .max(4)
}

/// `list[floor..]`, the deltas not folded yet, as the end of the plain list.
struct Pending<'a> {
    list: &'a mut Packed,
    floor: usize,
}

impl Tail for Pending<'_> {
    fn last(&self) -> Option<StackDelta> {
        match self.list.len() > self.floor {
            true => self.list.last(),
            false => None,
        }
    }
    fn before_last(&self) -> Option<StackDelta> {
        match self.list.len() > self.floor.saturating_add(1) {
            true => self.list.get(self.list.len() - 2),
            false => None,
        }
    }
    fn set_last(&mut self, delta: &StackDelta) {
        if self.list.len() > self.floor {
            self.list.set(self.list.len() - 1, delta);
        }
    }
    fn push(&mut self, delta: &StackDelta) {
        self.list.push(delta);
    }
    fn pop(&mut self) {
        if self.list.len() > self.floor {
            self.list.pop();
        }
    }
}

impl FoldingList {
    pub fn new() -> Self {
        Self::with_chunk(FOLD_CHUNK)
    }

    /// A list that folds every `chunk` deltas, not every `FOLD_CHUNK`: what
    /// lets a test (here and in eim-analysis's extraction) fold small inputs.
    pub fn with_chunk(chunk: usize) -> Self {
        Self {
            data: IntervalData::new(),
            mode: Mode::Plain,
            may_fold: true,
            folded: 0,
            committed: 0,
            last_committed: None,
            started_at: 0,
            capacity: 0,
            chunk,
        }
    }

    /// Whether deltas came out of order after some were folded away: the
    /// caller must extract again with a plain list.
    pub fn is_lost(&self) -> bool {
        self.mode == Mode::Lost
    }

    /// The extracted list: `sort` says whether the plain list would now
    /// be sorted and de-duplicated. `None` if the list is lost.
    pub fn finish(mut self, sort: bool) -> Option<IntervalData> {
        if self.mode == Mode::Folding {
            if !sort {
                self.stop_folding();
            } else if self.committed == 0 {
                // Nothing folded yet: the plain list, as it is.
                self.mode = Mode::Plain;
            } else {
                self.commit();
                if self.mode == Mode::Folding {
                    return Some(self.data);
                }
            }
        }
        match self.mode {
            Mode::Lost | Mode::Folding => None,
            Mode::Plain => {
                if sort {
                    self.data.sort_and_dedup();
                }
                Some(self.data)
            }
        }
    }

    /// Folding cannot go on: back to the plain list if nothing was
    /// folded away (then it is the plain list exactly), else lost.
    fn stop_folding(&mut self) {
        if self.mode == Mode::Folding {
            self.mode = if self.folded == self.committed {
                Mode::Plain
            } else {
                Mode::Lost
            };
        }
    }

    /// Folds the pending deltas in, if they are in order (with the ones
    /// before); else stops folding.
    fn commit(&mut self) {
        let mut last = self.last_committed;
        for delta in self.data.iter_from(self.folded) {
            if last.is_some_and(|last| sort_order(&last, &delta) == Ordering::Greater) {
                self.stop_folding();
                return;
            }
            last = Some(delta);
        }
        let (start, end) = (self.folded, self.data.len());
        let mut front = Front {
            list: &mut self.data.packed,
            len: start,
        };
        for read in start..end {
            let Some(delta) = front.list.get(read) else {
                break;
            };
            append_sorted(&mut front, normalized(delta));
        }
        self.folded = front.len;
        self.data.packed.truncate(self.folded);
        self.committed += end - start;
        self.last_committed = last;
    }

    /// A sorted append while folding: to the pending deltas, as the plain
    /// list would make it to its end.
    fn append_pending(&mut self, delta: StackDelta) {
        let pending = self.data.len() - self.folded;
        if self.committed > 0 && pending < 2 {
            let marker = match pending {
                1 => self.data.last(),
                // After a commit there is always a pending delta.
                _ => None,
            };
            let reaches_back = marker.is_none_or(|marker| {
                marker.hints & hint::GAP != 0
                    && marker.address.wrapping_add(MINIMUM_GAP) >= delta.address
            });
            if reaches_back {
                // The plain list reads the delta before the end marker:
                // the last one committed.
                if let (Some(before), Some(_)) = (self.last_committed, marker) {
                    if !same_rule(&before.info, &delta.info) {
                        Tail::set_last(&mut self.data.packed, &delta);
                        return;
                    }
                }
                // It would merge into a committed delta.
                self.stop_folding();
                if self.mode == Mode::Plain {
                    self.data.add_ex(delta, true);
                }
                return;
            }
        }
        append_sorted(
            &mut Pending {
                list: &mut self.data.packed,
                floor: self.folded,
            },
            delta,
        );
    }
}

impl DeltaSink for FoldingList {
    fn add_ex(&mut self, delta: StackDelta, sorted: bool) {
        let delta = normalized(delta);
        if self.mode != Mode::Folding {
            if self.mode == Mode::Plain {
                self.data.add_ex(delta, sorted);
            }
            return;
        }
        let held = self.held();
        if sorted {
            self.append_pending(delta);
        } else {
            let pending = self.data.len() - self.folded;
            if pending >= self.chunk && held >= self.started_at.saturating_add(self.chunk) {
                self.commit();
            }
            if self.mode == Mode::Lost {
                return;
            }
            self.data.push(delta);
        }
        if self.mode == Mode::Folding && self.held() > self.capacity {
            self.capacity = grown(self.capacity, held, 1);
        }
    }

    /// As [`IntervalData`]'s: while folding, over the plain list's length
    /// and capacity, with the memory had for the deltas this list holds.
    fn make_room(&mut self, additional: usize) -> Result<(), NoRoom> {
        match self.mode {
            Mode::Plain => return self.data.make_room(additional),
            Mode::Lost => return Ok(()),
            Mode::Folding => {}
        }
        let held = self.held();
        if self.capacity.saturating_sub(held) < additional {
            if held.saturating_add(additional) > MAX_EXTRACTED_DELTAS {
                return Err(NoRoom::TooMany {
                    max: MAX_EXTRACTED_DELTAS,
                });
            }
            self.capacity = grown(self.capacity, held, additional.max(self.capacity));
        }
        let packed = &mut self.data.packed;
        let want = additional.max(packed.capacity());
        let held = packed.len();
        packed
            .reserve(additional, want)
            .map_err(|bytes| NoRoom::Memory { held, bytes })
    }

    fn reserve_hint(&mut self, additional: usize) {
        match self.mode {
            Mode::Plain => self.data.reserve_hint(additional),
            Mode::Lost => {}
            Mode::Folding => {
                if self.data.packed.reserve_hint(additional) {
                    self.capacity = grown(self.capacity, self.held(), additional);
                }
            }
        }
    }

    fn will_be_sorted(&mut self) {
        if self.mode == Mode::Plain && self.may_fold {
            self.may_fold = false;
            self.mode = Mode::Folding;
            self.started_at = self.data.len();
            self.capacity = self.data.packed.capacity();
        }
    }
}

impl CfiList for FoldingList {
    fn list(&mut self) -> &mut IntervalData {
        self.stop_folding();
        &mut self.data
    }

    fn held(&self) -> usize {
        match self.mode {
            Mode::Plain => self.data.len(),
            Mode::Folding | Mode::Lost => {
                self.committed + (self.data.len().saturating_sub(self.folded))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::info::{self, sp};
    use super::*;

    /// One step of a walk: an append, room asked for, or a reservation.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Add(StackDelta, bool),
        Room(usize),
        Reserve(usize),
    }

    fn apply(sink: &mut impl DeltaSink, op: Op) -> Result<(), NoRoom> {
        match op {
            Op::Add(delta, sorted) => sink.add_ex(delta, sorted),
            Op::Room(n) => return sink.make_room(n),
            Op::Reserve(n) => sink.reserve_hint(n),
        }
        Ok(())
    }

    struct Rand(u64);

    impl Rand {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// A walk's appends: runs of rows (the first unsorted, as a linear
    /// walk's FDEs start), mostly in address order, each ending in an
    /// end marker, with room asked for and reservations between them.
    fn walk(rand: &mut Rand) -> Vec<Op> {
        let rules = [sp(8), sp(16), info::INVALID, info::STOP];
        let in_order = rand.below(3) != 0;
        let mut address = rand.below(64);
        let mut ops = Vec::new();
        for _ in 0..1 + rand.below(30) {
            if rand.below(4) == 0 {
                ops.push(Op::Room(rand.below(12) as usize));
            }
            if rand.below(16) == 0 {
                ops.push(Op::Reserve(rand.below(40) as usize));
            }
            // An FDE: it starts anywhere when out of order.
            address = match rand.below(8) {
                0 if !in_order => address.wrapping_sub(rand.below(64)),
                1 => address,
                _ => address.wrapping_add(rand.below(24)),
            };
            let mut sorted = rand.below(10) == 0;
            for _ in 0..1 + rand.below(4) {
                let hints = [hint::NONE, hint::KEEP][rand.below(2) as usize];
                let rule = rules[rand.below(rules.len() as u64) as usize];
                ops.push(Op::Add(StackDelta::new(address, hints, rule), sorted));
                sorted = true;
                address = address.wrapping_add(rand.below(if in_order { 6 } else { 9 }));
            }
            let marker = StackDelta::new(address, hint::GAP, info::INVALID);
            ops.push(Op::Add(marker, true));
        }
        ops
    }

    /// The folding list gives exactly what the plain list, sorted and
    /// de-duplicated at the end, gives (or says it is lost), holds and
    /// refuses as it does, and grows its capacity as the plain one grows.
    #[test]
    fn folding_as_it_goes_gives_what_sorting_at_the_end_gives() {
        let mut rand = Rand(0x9e37_79b9_7f4a_7c15);
        let (mut cases, mut exact_after_folding, mut plain_again, mut lost) = (0, 0, 0, 0);
        for _ in 0..60_000 {
            // Sorted appends first (a search-table walk), then the walk
            // from which the list is sorted at the end.
            let before: Vec<Op> = walk(&mut rand)
                .into_iter()
                .take(rand.below(8) as usize)
                .map(|op| match op {
                    Op::Add(delta, _) => Op::Add(delta, true),
                    other => other,
                })
                .collect();
            let after = walk(&mut rand);
            let mut plain = IntervalData::new();
            let mut folding = FoldingList::with_chunk(1 + rand.below(6) as usize);
            for &op in &before {
                apply(&mut plain, op).expect("room");
                apply(folding.list(), op).expect("room");
            }
            plain.will_be_sorted();
            folding.will_be_sorted();
            for &op in &after {
                let (p, f) = (apply(&mut plain, op), apply(&mut folding, op));
                if folding.is_lost() {
                    continue;
                }
                assert_eq!(p, f, "{op:?}");
                assert_eq!(folding.held(), plain.len(), "{op:?}");
                if folding.mode == Mode::Folding {
                    assert_eq!(folding.capacity, plain.packed.capacity(), "{op:?}");
                }
            }
            let was = (folding.mode, folding.folded < folding.committed);
            plain.sort_and_dedup();
            cases += 1;
            match folding.finish(true) {
                Some(folded) => {
                    assert_eq!(folded, plain, "{before:?} then {after:?}");
                    match was {
                        (Mode::Folding, true) => exact_after_folding += 1,
                        (Mode::Plain, _) => plain_again += 1,
                        _ => {}
                    }
                }
                None => lost += 1,
            }
        }
        // Every way through is taken, folding often.
        assert!(
            exact_after_folding * 10 > cases,
            "{exact_after_folding} folded, {plain_again} plain again, {lost} lost, of {cases}"
        );
        assert!(plain_again > 100 && lost > 100, "{plain_again}, {lost}");
    }

    /// Without a final sort, the list is the plain list as it stands.
    #[test]
    fn without_the_final_sort_the_list_is_the_plain_one_or_lost() {
        let mut rand = Rand(0x2545_f491_4f6c_dd1d);
        for _ in 0..5_000 {
            let ops = walk(&mut rand);
            let mut plain = IntervalData::new();
            let mut folding = FoldingList::with_chunk(2);
            folding.will_be_sorted();
            for &op in &ops {
                apply(&mut plain, op).expect("room");
                apply(&mut folding, op).expect("room");
            }
            if let Some(list) = folding.finish(false) {
                assert_eq!(list, plain);
            }
        }
    }

    #[test]
    fn more_than_the_kernel_takes_is_refused_as_the_plain_list_refuses_it() {
        let mut folding = FoldingList::with_chunk(1);
        folding.will_be_sorted();
        for at in 0..10 {
            folding.add_ex(StackDelta::new(at * 64, hint::KEEP, sp(8)), false);
        }
        assert!(folding.held() == 10 && folding.data.len() < 10, "folded");
        assert_eq!(
            folding.make_room(MAX_EXTRACTED_DELTAS - 9),
            Err(NoRoom::TooMany {
                max: MAX_EXTRACTED_DELTAS
            })
        );
        let mut plain = IntervalData::new();
        for at in 0..10 {
            plain.add_ex(StackDelta::new(at * 64, hint::KEEP, sp(8)), false);
        }
        assert_eq!(
            plain.make_room(MAX_EXTRACTED_DELTAS - 9),
            folding.make_room(MAX_EXTRACTED_DELTAS - 9)
        );
    }
}
