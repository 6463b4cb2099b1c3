//! Stack deltas as extraction produces them, and upstream's de-duplicating
//! append rules.
//!
//! A delta says "from this address on, until the next delta, unwind with this
//! rule". Extraction appends deltas through [`IntervalData::add_ex`], which
//! folds away repeats and end-of-function markers exactly as upstream's
//! `AddEx` does, so that the lists (and everything encoded from them) are
//! identical to upstream's.

use crate::abi::{opcode, UnwindInfo};

mod delta;
mod folding;
mod packed;

pub use delta::{hint, info, StackDelta};
pub use folding::FoldingList;
pub(crate) use packed::Iter;
use packed::Packed;

/// An end-of-function marker followed by a delta at most this many bytes
/// later is padding, not a real gap.
pub const MINIMUM_GAP: u64 = 15;

/// `a == b`, without branches.
#[inline(always)]
fn same_rule(a: &UnwindInfo, b: &UnwindInfo) -> bool {
    let bytes = |i: &UnwindInfo| u32::from_ne_bytes([i.opcode, i.fp_opcode, i.merge_opcode, i.pad]);
    ((bytes(a) ^ bytes(b)) | (a.param ^ b.param) as u32 | (a.fp_param ^ b.fp_param) as u32) == 0
}

/// A command carries no frame-pointer rule.
#[inline(always)]
fn normalized(mut delta: StackDelta) -> StackDelta {
    if delta.info.opcode == opcode::COMMAND {
        delta.info.fp_opcode = 0;
        delta.info.fp_param = 0;
    }
    delta
}

/// The end of a list that sorted appends fold into: a whole list, the
/// front of one being folded in place ([`IntervalData::sort_and_dedup`]),
/// or its deltas after a folded part ([`FoldingList`]). The deltas are
/// read and written by value (the list holds them packed).
trait Tail {
    fn last(&self) -> Option<StackDelta>;
    /// The delta before the last one.
    fn before_last(&self) -> Option<StackDelta>;
    fn set_last(&mut self, delta: &StackDelta);
    fn push(&mut self, delta: &StackDelta);
    fn pop(&mut self);
}

impl Tail for Packed {
    #[inline(always)]
    fn last(&self) -> Option<StackDelta> {
        Packed::last(self)
    }
    #[inline(always)]
    fn before_last(&self) -> Option<StackDelta> {
        self.len().checked_sub(2).and_then(|at| self.get(at))
    }
    #[inline(always)]
    fn set_last(&mut self, delta: &StackDelta) {
        if let Some(at) = self.len().checked_sub(1) {
            self.set(at, delta);
        }
    }
    #[inline(always)]
    fn push(&mut self, delta: &StackDelta) {
        Packed::push(self, delta);
    }
    #[inline(always)]
    fn pop(&mut self) {
        Packed::pop(self);
    }
}

/// `list[..len]`, written while `list[len..]` is still being read.
struct Front<'a> {
    list: &'a mut Packed,
    len: usize,
}

impl Tail for Front<'_> {
    fn last(&self) -> Option<StackDelta> {
        self.len.checked_sub(1).and_then(|at| self.list.get(at))
    }
    fn before_last(&self) -> Option<StackDelta> {
        self.len.checked_sub(2).and_then(|at| self.list.get(at))
    }
    fn set_last(&mut self, delta: &StackDelta) {
        if let Some(at) = self.len.checked_sub(1) {
            self.list.set(at, delta);
        }
    }
    fn push(&mut self, delta: &StackDelta) {
        // The caller reads element `len` or later before pushing, so the
        // slot is its own or one it has read.
        if self.len < self.list.len() {
            self.list.set(self.len, delta);
            self.len += 1;
        }
    }
    fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
    }
}

/// A sorted append (upstream's `AddEx` with a sorted source).
#[inline(always)]
fn append_sorted<T: Tail>(tail: &mut T, delta: StackDelta) {
    // The common case inline: the tail is not an end marker, so only the
    // tail is compared (as `fold` does).
    if let Some(prev) = tail.last() {
        if prev.hints & hint::GAP == 0 {
            if same_rule(&prev.info, &delta.info) {
                keep_hint(tail, prev, &delta);
            } else if prev.address == delta.address {
                tail.set_last(&delta);
            } else {
                tail.push(&delta);
            }
            return;
        }
    }
    if let Some(folded) = fold(tail, delta) {
        tail.push(&folded);
    }
}

/// `delta` folds into `prev`, the tail's last delta: only its KEEP hint
/// carries over.
#[inline(always)]
fn keep_hint<T: Tail>(tail: &mut T, prev: StackDelta, delta: &StackDelta) {
    let hints = prev.hints | (delta.hints & hint::KEEP);
    if hints != prev.hints {
        tail.set_last(&StackDelta { hints, ..prev });
    }
}

/// Applies the folding rules against the tail; returns the delta if it
/// still has to be appended.
#[inline]
fn fold<T: Tail>(tail: &mut T, delta: StackDelta) -> Option<StackDelta> {
    let Some(last) = tail.last() else {
        return Some(delta);
    };
    let prev =
        if last.hints & hint::GAP != 0 && last.address.wrapping_add(MINIMUM_GAP) >= delta.address {
            // The marker was padding between two functions.
            match tail.before_last() {
                Some(before) if same_rule(&before.info, &delta.info) => {
                    tail.pop();
                    before
                }
                _ => {
                    tail.set_last(&delta);
                    return None;
                }
            }
        } else {
            last
        };
    if same_rule(&prev.info, &delta.info) {
        keep_hint(tail, prev, &delta);
        return None;
    }
    if prev.address == delta.address {
        tail.set_last(&delta);
        return None;
    }
    Some(delta)
}

/// The order [`IntervalData::sort_and_dedup`] sorts in: by (address,
/// opcode, param), ties broken by the whole delta, so that deltas it finds
/// equal are identical.
fn sort_order(a: &StackDelta, b: &StackDelta) -> std::cmp::Ordering {
    (a.address, a.info.opcode, a.info.param)
        .cmp(&(b.address, b.info.opcode, b.info.param))
        .then_with(|| (a.info, a.hints).cmp(&(b.info, b.hints)))
}

/// The unwind data of one file: deltas sorted by address.
///
/// Held packed, 8 bytes a delta (`deltas/packed.rs`): the deltas are read by value
/// ([`IntervalData::iter`], [`IntervalData::get`]), exactly as they were
/// appended.
#[derive(Clone, Default)]
pub struct IntervalData {
    packed: Packed,
}

impl std::fmt::Debug for IntervalData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Two lists are equal when they hold the same deltas, however stored.
impl PartialEq for IntervalData {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for IntervalData {}

impl FromIterator<StackDelta> for IntervalData {
    /// The deltas as they come: nothing folded.
    fn from_iter<I: IntoIterator<Item = StackDelta>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut data = Self {
            packed: Packed::with_capacity(iter.size_hint().0),
        };
        for delta in iter {
            data.push(delta);
        }
        data
    }
}

impl<'a> IntoIterator for &'a IntervalData {
    type Item = StackDelta;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntervalData {
    pub fn new() -> Self {
        Self::default()
    }

    /// A list holding exactly `deltas` (nothing folded).
    pub fn from_deltas(deltas: Vec<StackDelta>) -> Self {
        deltas.into_iter().collect()
    }

    pub fn len(&self) -> usize {
        self.packed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.len() == 0
    }

    /// The deltas, in order.
    pub fn iter(&self) -> Iter<'_> {
        self.packed.iter_from(0)
    }

    /// The deltas from `index` on.
    pub fn iter_from(&self, index: usize) -> Iter<'_> {
        self.packed.iter_from(index)
    }

    /// The delta at `index`.
    #[inline]
    pub fn get(&self, index: usize) -> Option<StackDelta> {
        self.packed.get(index)
    }

    pub fn first(&self) -> Option<StackDelta> {
        self.packed.get(0)
    }

    pub fn last(&self) -> Option<StackDelta> {
        self.packed.last()
    }

    /// The deltas as a plain list (for small lists and tests: it takes 24
    /// bytes a delta).
    pub fn to_vec(&self) -> Vec<StackDelta> {
        self.iter().collect()
    }

    /// The index of the first delta for which `pred` is false (the list
    /// being partitioned by it), as `slice::partition_point`.
    pub fn partition_point(&self, mut pred: impl FnMut(&StackDelta) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid) {
                Some(delta) if pred(&delta) => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// Bytes the deltas take, with the rules they share (what a copy of
    /// the list holds).
    pub fn bytes(&self) -> usize {
        self.packed.bytes()
    }

    /// Appends `delta` as it is: nothing folded, nothing normalised (a
    /// list read back from its text, or built by a test).
    pub(crate) fn push(&mut self, delta: StackDelta) {
        self.packed.push(&delta);
    }

    /// Appends a delta known to come after every delta already present.
    #[inline]
    pub fn add(&mut self, delta: StackDelta) {
        self.add_ex(delta, true);
    }

    /// Upstream's `AddEx`: appends `delta`, folding it into the previous one
    /// when it repeats the rule, replaces a same-address delta, or lands in
    /// the padding after an end-of-function marker. With `sorted == false`
    /// it only appends (the list is sorted and de-duplicated later).
    #[inline(always)]
    pub fn add_ex(&mut self, delta: StackDelta, sorted: bool) {
        let delta = normalized(delta);
        if sorted {
            append_sorted(&mut self.packed, delta);
        } else {
            self.packed.push(&delta);
        }
    }

    /// Sorts by (address, opcode, param) and re-applies the folding rules,
    /// as upstream does after unsorted sources. Ties are broken by the whole
    /// delta so the result never depends on the input order (upstream's sort
    /// is not stable; eim's is deterministic).
    ///
    /// In place: the folded list is written over the front of the sorted
    /// one (each append adds at most one element, so it never overtakes
    /// the element being read), so an unsorted list of millions of deltas
    /// does not need a second one.
    pub fn sort_and_dedup(&mut self) {
        self.packed.sort_by(sort_order);
        let mut front = Front {
            list: &mut self.packed,
            len: 0,
        };
        for read in 0..front.list.len() {
            let Some(delta) = front.list.get(read) else {
                break;
            };
            append_sorted(&mut front, normalized(delta));
        }
        let len = front.len;
        self.packed.truncate(len);
    }

    /// The delta in force at `address`: the last one at or below it.
    pub fn find(&self, address: u64) -> Option<StackDelta> {
        let after = self.partition_point(|d| d.address <= address);
        after.checked_sub(1).and_then(|i| self.get(i))
    }
}

/// Where appended deltas go: [`IntervalData`], or a [`Detached`] run.
pub trait DeltaSink {
    /// [`IntervalData::add_ex`].
    fn add_ex(&mut self, delta: StackDelta, sorted: bool);

    /// Makes sure `additional` more appends cannot fail for want of
    /// memory, or says why they could: the appends themselves cannot
    /// fail, and an allocation failing there ends the process.
    fn make_room(&mut self, additional: usize) -> Result<(), NoRoom> {
        let _ = additional;
        Ok(())
    }

    /// Room for about `additional` more deltas, if the memory is there:
    /// only an estimate, nothing fails without it.
    fn reserve_hint(&mut self, additional: usize) {
        let _ = additional;
    }

    /// The deltas appended from here on do not come in order: the list
    /// is sorted and de-duplicated ([`IntervalData::sort_and_dedup`]) once
    /// extraction is done, so a sink may fold it as it goes
    /// ([`FoldingList`]).
    fn will_be_sorted(&mut self) {}
}

/// A list that CFI walks append to: a plain [`IntervalData`], or a
/// [`FoldingList`].
pub trait CfiList: DeltaSink {
    /// The plain list, for appends that come in order (a search-table
    /// walk, before any unsorted one). A folding list stops folding.
    fn list(&mut self) -> &mut IntervalData;
    /// How many deltas the plain list would hold now.
    fn held(&self) -> usize;
}

impl CfiList for IntervalData {
    fn list(&mut self) -> &mut IntervalData {
        self
    }
    fn held(&self) -> usize {
        self.len()
    }
}

/// The most deltas an extraction holds: twice what the kernel takes for
/// one file (a kernel entry holds one delta or a merged pair), so a file
/// with more could never be loaded. Bounds the memory of a hostile CFI
/// walk (64 MiB of `.eh_frame` rows would otherwise give 22 million
/// deltas).
pub(crate) const MAX_EXTRACTED_DELTAS: usize = 2 * crate::abi::MAX_KERNEL_DELTAS;

/// Why a list of deltas cannot grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    #[error("more than {max} stack deltas, more than the kernel maps can hold")]
    TooMany { max: usize },
    #[error("no memory for more than {held} stack deltas ({bytes} bytes more could not be had)")]
    Memory { held: usize, bytes: usize },
}

impl DeltaSink for IntervalData {
    #[inline(always)]
    fn add_ex(&mut self, delta: StackDelta, sorted: bool) {
        IntervalData::add_ex(self, delta, sorted);
    }

    #[inline]
    fn make_room(&mut self, additional: usize) -> Result<(), NoRoom> {
        let held = self.len();
        let capacity = self.packed.capacity();
        if capacity - held < additional && held.saturating_add(additional) > MAX_EXTRACTED_DELTAS {
            return Err(NoRoom::TooMany {
                max: MAX_EXTRACTED_DELTAS,
            });
        }
        // As the list would have grown: to twice its size at least.
        let want = additional.max(capacity);
        self.packed
            .reserve(additional, want)
            .map_err(|bytes| NoRoom::Memory { held, bytes })
    }

    fn reserve_hint(&mut self, additional: usize) {
        self.packed.reserve_hint(additional);
    }
}

/// A run of [`IntervalData::add_ex`] appends made before the list they
/// continue is known (a later part of an `.eh_frame` walked on another
/// thread): the appends go to an empty list, and [`Detached::attach_to`]
/// later puts the result behind the real list if, and only if, that gives
/// exactly the list the same appends would have given one by one.
///
/// Why it is exact. An append reads and writes only the last element and,
/// in the end-marker case (a tail with [`hint::GAP`] and the delta within
/// [`MINIMUM_GAP`] of it), the element before; it removes at most one
/// element; an unsorted append only pushes. Write `P` for the real list,
/// `Z` for the run's own list.
/// * The first appends (until `Z` holds [`Detached::LOG_LEN`] elements)
///   are logged and, when attaching, replayed onto a copy of `P`'s last
///   `log + 2` elements: `k` appends remove at most `k` elements and read
///   at most two from the end, so the copy behaves as `P` itself. Call
///   the result `P[..cut] ++ S` and the run's list at that point `Z_t`.
/// * From there on the run records the lowest index of `Z` any append
///   reads or writes (`floor`); an end-marker case with no element before
///   (which `P`'s copy would have) fails the run.
/// * If `W = Z_t[floor..]` is also the end of `S`, then `S = Q ++ W` and
///   `Z_t = Q' ++ W` with every later append touching only the `W` part:
///   by induction over the appends, both lists keep the same elements
///   after `Q` (resp. `Q'`) and each append does the same to them. So the
///   sequential list is `P[..cut] ++ Q ++ Z[floor..]`.
///
/// Otherwise the run is refused, `P` is left as it was, and the caller
/// redoes the appends one by one.
#[derive(Debug)]
pub struct Detached {
    data: IntervalData,
    /// The first appends and their `sorted` flags.
    log: Vec<(StackDelta, bool)>,
    /// The list when the log was closed (`Z_t`); `None` while logging.
    logged: Option<Vec<StackDelta>>,
    /// The lowest index an append after the log touched.
    floor: usize,
    /// An append after the log read an element before the run.
    reached_front: bool,
}

impl Detached {
    /// Appends logged before `floor` is tracked (the list's length).
    pub const LOG_LEN: usize = 4;

    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            data: IntervalData {
                packed: Packed::with_capacity(capacity),
            },
            log: Vec::new(),
            logged: None,
            floor: usize::MAX,
            reached_front: false,
        }
    }

    /// An append while the list is short: logged, or its lowest touched
    /// index recorded.
    #[cold]
    fn note_front(&mut self, delta: StackDelta, sorted: bool) {
        if self.logged.is_none() {
            self.log.push((delta, sorted));
            self.data.add_ex(delta, sorted);
            if self.data.len() >= Self::LOG_LEN {
                self.logged = Some(self.data.to_vec());
            }
            return;
        }
        if sorted {
            let len = self.data.len();
            let gap_case = self.data.last().is_some_and(|prev| {
                prev.hints & hint::GAP != 0
                    && prev.address.wrapping_add(MINIMUM_GAP) >= delta.address
            });
            let touched = if gap_case {
                len.checked_sub(2)
            } else {
                len.checked_sub(1)
            };
            match touched {
                Some(at) => self.floor = self.floor.min(at),
                None => self.reached_front = true,
            }
        }
        self.data.add_ex(delta, sorted);
    }

    /// Appends the run to `to` if that gives exactly what its appends,
    /// made one by one to `to`, would give, and says so; else leaves `to`
    /// unchanged.
    pub fn attach_to(&self, to: &mut IntervalData) -> bool {
        if self.reached_front {
            return false;
        }
        let cut = to.len().saturating_sub(self.log.len() + 2);
        let mut replayed: IntervalData = to.iter_from(cut).collect();
        for &(delta, sorted) in &self.log {
            replayed.add_ex(delta, sorted);
        }
        let (keep, from) = match &self.logged {
            // The log is the whole run.
            None => (replayed.len(), self.data.len()),
            Some(logged) => {
                let floor = self.floor.min(logged.len());
                let common = logged.get(floor..).unwrap_or_default();
                match replayed.len().checked_sub(common.len()) {
                    Some(keep) if replayed.iter_from(keep).eq(common.iter().copied()) => {
                        (keep, floor)
                    }
                    _ => return false,
                }
            }
        };
        to.packed.truncate(cut);
        to.packed.extend_from(&replayed.packed, 0..keep);
        to.packed
            .extend_from(&self.data.packed, from..self.data.len());
        true
    }
}

impl DeltaSink for Detached {
    #[inline(always)]
    fn add_ex(&mut self, delta: StackDelta, sorted: bool) {
        if self.data.len() <= Self::LOG_LEN + 1 {
            self.note_front(delta, sorted);
        } else {
            self.data.add_ex(delta, sorted);
        }
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
    fn rules_differing_in_two_fields_by_the_same_bits_differ() {
        // same_rule folds the fields' differences together: differences
        // that cancel out (or hide each other) must not make two rules equal.
        let base = sp(16);
        let mut opcode_and_param = base;
        opcode_and_param.opcode ^= 1;
        opcode_and_param.param ^= 1;
        let mut opcode_and_fp_param = base;
        opcode_and_fp_param.opcode ^= 1;
        opcode_and_fp_param.fp_param ^= 1;
        let mut param_and_fp_param = base;
        param_and_fp_param.param ^= 1;
        param_and_fp_param.fp_param ^= 1;
        for other in [opcode_and_param, opcode_and_fp_param, param_and_fp_param] {
            assert!(!same_rule(&base, &other), "{base:?} vs {other:?}");
            assert!(!same_rule(&other, &base), "{other:?} vs {base:?}");
        }
        assert!(same_rule(&base, &sp(16)));
        // Each field alone, against a rule whose every field is set.
        let full = || UnwindInfo::new(opcode::BASE_SP, 16, opcode::BASE_CFA, -16);
        assert!(same_rule(&full(), &full()));
        for change in [
            |i: &mut UnwindInfo| i.opcode = opcode::BASE_FP,
            |i: &mut UnwindInfo| i.param = 0,
            |i: &mut UnwindInfo| i.fp_opcode = 0,
            |i: &mut UnwindInfo| i.fp_param = 0,
            |i: &mut UnwindInfo| i.fp_param = -8,
        ] {
            let mut other = full();
            change(&mut other);
            assert!(!same_rule(&full(), &other), "{other:?}");
        }
    }

    #[test]
    fn commands_lose_their_frame_pointer_rule() {
        let mut data = IntervalData::new();
        let mut stop = info::STOP;
        stop.fp_opcode = opcode::BASE_CFA;
        stop.fp_param = -16;
        data.add(d(0x10, hint::KEEP, stop));
        assert_eq!(data.to_vec(), vec![d(0x10, hint::KEEP, info::STOP)]);
    }

    #[test]
    fn a_repeated_rule_folds_and_keeps_the_keep_hint() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x20, hint::KEEP, sp(8)));
        assert_eq!(data.to_vec(), vec![d(0x10, hint::KEEP, sp(8))]);
    }

    #[test]
    fn the_same_address_replaces() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x10, hint::NONE, sp(16)));
        assert_eq!(data.to_vec(), vec![d(0x10, hint::NONE, sp(16))]);
    }

    #[test]
    fn an_end_marker_within_the_padding_is_replaced() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::KEEP, sp(8)));
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x2f, hint::KEEP, sp(16)));
        assert_eq!(
            data.to_vec(),
            vec![d(0x10, hint::KEEP, sp(8)), d(0x2f, hint::KEEP, sp(16))]
        );
    }

    #[test]
    fn an_end_marker_between_equal_rules_is_dropped_and_the_rules_merge() {
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x25, hint::KEEP, sp(8)));
        assert_eq!(data.to_vec(), vec![d(0x10, hint::KEEP, sp(8))]);
        // Only a KEEP hint carries over.
        let mut data = IntervalData::new();
        data.add(d(0x10, hint::NONE, sp(8)));
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x25, hint::NONE, sp(8)));
        assert_eq!(data.to_vec(), vec![d(0x10, hint::NONE, sp(8))]);
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
        assert_eq!(data.to_vec(), vec![d(0x21, hint::NONE, sp(8))]);
    }

    #[test]
    fn a_lone_end_marker_beyond_the_padding_stays() {
        let mut data = IntervalData::new();
        data.add(d(0x20, hint::GAP, info::INVALID));
        data.add(d(0x20 + MINIMUM_GAP + 1, hint::NONE, sp(8)));
        assert_eq!(data.len(), 2);
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
            unsorted.to_vec(),
            vec![
                d(0x10, hint::KEEP, sp(8)),
                d(0x20, hint::KEEP, sp(24)),
                d(0x30, hint::KEEP, sp(16)),
            ]
        );
    }

    /// The in-place fold of `sort_and_dedup` gives what appending the
    /// sorted deltas one by one to a new list gives (its former way, which
    /// held the sorted list and the folded one at once).
    #[test]
    fn sorting_in_place_folds_as_appending_to_a_new_list() {
        use proptest::prelude::*;
        let rules = [sp(8), sp(16), info::INVALID, info::STOP, sp(24)];
        let hints = [hint::NONE, hint::KEEP, hint::GAP, hint::KEEP | hint::GAP];
        let delta = (0u64..96, 0..hints.len(), 0..rules.len())
            .prop_map(move |(a, h, r)| d(a, hints[h], rules[r]));
        proptest!(ProptestConfig::with_cases(4000), |(input in proptest::collection::vec(delta, 0..40))| {
            let mut in_place = IntervalData::from_deltas(input.clone());
            in_place.sort_and_dedup();
            let mut sorted = input;
            sorted.sort_by(|a, b| {
                (a.address, a.info.opcode, a.info.param)
                    .cmp(&(b.address, b.info.opcode, b.info.param))
                    .then_with(|| (a.info, a.hints).cmp(&(b.info, b.hints)))
            });
            let mut appended = IntervalData::new();
            for x in sorted {
                appended.add(x);
            }
            prop_assert_eq!(in_place.to_vec(), appended.to_vec());
        });
    }

    #[test]
    fn room_past_what_the_kernel_takes_is_refused() {
        let mut data = IntervalData::new();
        assert_eq!(data.make_room(1000), Ok(()));
        assert!(data.packed.capacity() >= 1000);
        assert_eq!(
            data.make_room(MAX_EXTRACTED_DELTAS + 1),
            Err(NoRoom::TooMany {
                max: MAX_EXTRACTED_DELTAS
            })
        );
        assert!(
            data.packed.capacity() < MAX_EXTRACTED_DELTAS,
            "nothing reserved"
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

    /// Splits random append sequences in two: an attached detached run
    /// must give exactly the sequential list, and most runs attach.
    #[test]
    fn a_detached_run_attaches_only_when_exact() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rand = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let rules = [info::INVALID, sp(8), sp(16), info::STOP];
        let (mut attached, mut cases, mut naive_wrong) = (0, 0, 0);
        for _ in 0..200_000 {
            let longest = if rand(2) == 0 { 12 } else { 60 };
            let len = 1 + rand(longest) as usize;
            // Dense cases: few rules, many end markers, small steps (the
            // folds that reach furthest back).
            let dense = rand(2) == 0;
            let mut address = rand(64);
            let ops: Vec<(StackDelta, bool)> = (0..len)
                .map(|_| {
                    // Mostly increasing, within the end-marker padding,
                    // sometimes equal or going back.
                    address = match rand(8) {
                        0 => address.wrapping_sub(rand(20)),
                        1 => address,
                        _ if dense => address.wrapping_add(rand(9)),
                        _ => address.wrapping_add(rand(24)),
                    };
                    let (hints, rule) = if dense {
                        let h = [hint::NONE, hint::KEEP, hint::GAP, hint::GAP][rand(4) as usize];
                        (h, rules[rand(2) as usize])
                    } else {
                        let h = [hint::NONE, hint::KEEP, hint::GAP][rand(3) as usize];
                        (h, rules[rand(4) as usize])
                    };
                    (d(address, hints, rule), rand(10) != 0)
                })
                .collect();
            let split = rand(len as u64 + 1) as usize;
            let mut sequential = IntervalData::new();
            for &(x, sorted) in &ops {
                sequential.add_ex(x, sorted);
            }
            let mut front = IntervalData::new();
            for &(x, sorted) in &ops[..split] {
                front.add_ex(x, sorted);
            }
            let mut run = Detached::with_capacity(0);
            for &(x, sorted) in &ops[split..] {
                DeltaSink::add_ex(&mut run, x, sorted);
            }
            let before = front.clone();
            let mut naive = front.clone();
            naive
                .packed
                .extend_from(&run.data.packed, 0..run.data.len());
            if naive != sequential {
                naive_wrong += 1;
            }
            cases += 1;
            if run.attach_to(&mut front) {
                attached += 1;
                assert_eq!(front, sequential, "{ops:?} split at {split}");
            } else {
                assert_eq!(front, before, "a refused run leaves the list");
            }
        }
        assert!(attached * 2 > cases, "{attached} of {cases} attached");
        // The checks matter: plain concatenation is often wrong.
        assert!(naive_wrong * 10 > cases, "{naive_wrong} of {cases}");
    }

    #[test]
    fn an_append_after_the_log_touches_only_the_tail_unless_it_lands_in_a_markers_padding() {
        let rules = [sp(8), sp(24)];
        let mut run = Detached::with_capacity(0);
        for i in 0..Detached::LOG_LEN as u64 {
            DeltaSink::add_ex(
                &mut run,
                d(0x10 * (i + 1), hint::NONE, rules[i as usize % 2]),
                true,
            );
        }
        assert!(run.logged.is_some());
        // Within MINIMUM_GAP of a tail that is no end marker: only the
        // tail is read.
        let next = d(0x40 + MINIMUM_GAP, hint::GAP, sp(32));
        DeltaSink::add_ex(&mut run, next, true);
        assert_eq!(run.floor, Detached::LOG_LEN - 1);
        // Within the padding of the end marker just added: the element
        // before it is read too.
        DeltaSink::add_ex(&mut run, d(next.address + 1, hint::NONE, sp(8)), true);
        assert_eq!(run.floor, Detached::LOG_LEN - 1);
        assert!(!run.reached_front);
    }

    /// Appends `ops` one by one, and as a detached run behind `front`.
    fn sequential_and_attached(
        front: &[(StackDelta, bool)],
        ops: &[(StackDelta, bool)],
    ) -> (IntervalData, Result<IntervalData, ()>) {
        let mut sequential = IntervalData::new();
        for &(x, sorted) in front.iter().chain(ops) {
            sequential.add_ex(x, sorted);
        }
        let mut list = IntervalData::new();
        for &(x, sorted) in front {
            list.add_ex(x, sorted);
        }
        let mut run = Detached::with_capacity(0);
        for &(x, sorted) in ops {
            DeltaSink::add_ex(&mut run, x, sorted);
        }
        let attached = if run.attach_to(&mut list) {
            Ok(list)
        } else {
            Err(())
        };
        (sequential, attached)
    }

    /// End markers replaced by markers, then folded away: the first
    /// appends of a run reach three elements back into the real list.
    #[test]
    fn a_detached_run_replays_its_first_appends_deep_into_the_list() {
        let front = [
            (d(0, hint::NONE, sp(8)), true),
            (d(10, hint::GAP, info::INVALID), true),
            (d(200, hint::NONE, sp(16)), true),
            (d(200, hint::GAP, info::INVALID), true),
        ];
        let ops = [
            // Folds the last marker into the first one ...
            (d(205, hint::NONE, info::INVALID), true),
            // ... and that one into the first rule.
            (d(20, hint::KEEP, sp(8)), true),
            (d(30, hint::NONE, sp(24)), true),
        ];
        let (sequential, attached) = sequential_and_attached(&front, &ops);
        assert_eq!(
            sequential.to_vec(),
            vec![d(0, hint::KEEP, sp(8)), d(30, hint::NONE, sp(24))]
        );
        assert_eq!(attached, Ok(sequential));
    }

    /// After its log, a run folds back to one end marker and then meets
    /// the end-marker case: only the real list knows the element before,
    /// so the run must be refused.
    #[test]
    fn a_detached_run_that_folds_back_to_its_start_is_refused() {
        let front = [(d(0, hint::KEEP, sp(8)), true)];
        let ops = [
            (d(1000, hint::KEEP, sp(8)), false),
            (d(1010, hint::GAP, info::INVALID), true),
            (d(1040, hint::NONE, sp(16)), true),
            (d(1050, hint::GAP, info::INVALID), true),
            // The log is closed (four elements); now fold back.
            (d(1055, hint::NONE, sp(16)), true),
            (d(1040, hint::GAP, info::INVALID), true),
            (d(1045, hint::NONE, info::INVALID), true),
            (d(1020, hint::NONE, sp(8)), true),
            (d(1000, hint::GAP, info::INVALID), true),
            // The end-marker case with the real list's rule before it.
            (d(1005, hint::NONE, sp(8)), true),
        ];
        let (sequential, attached) = sequential_and_attached(&front, &ops);
        let mut naive = IntervalData::new();
        for &(x, sorted) in &front {
            naive.add_ex(x, sorted);
        }
        let mut alone = IntervalData::new();
        for &(x, sorted) in &ops {
            alone.add_ex(x, sorted);
        }
        naive.packed.extend_from(&alone.packed, 0..alone.len());
        assert_ne!(naive, sequential, "the run does depend on the list");
        assert_eq!(attached, Err(()));
    }
}
