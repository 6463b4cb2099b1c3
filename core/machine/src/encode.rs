//! From a file's deltas to its kernel table, as upstream's `loadDeltas`
//! lays it out: merged neighbour pairs, one entry per delta left, one page
//! entry for every 64 KiB page between the first and the last delta (empty
//! ones too, except dead pages: see [`Draft::dead_pages`]), the size class,
//! and the gaps that interpreter loaders look for.
//!
//! Encoding is split in two so that the layout is a pure function of the
//! deltas: [`draft`] decides every entry and leaves unwind rules unresolved;
//! the machine then gives each rule its `unwind_info_array` slot and
//! [`Draft::resolve`] produces the final [`KernelTable`].

use core::ops::Range;
use std::sync::Arc;

use crate::abi::{
    self, opcode, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo, DELTA_COMMAND_FLAG,
    MERGE_OPCODE_NEGATIVE, PAGE_BITS, PAGE_MASK,
};
use crate::deltas::{hint, IntervalData, StackDelta};

/// A gap of at least this many bytes after an end-of-function marker is
/// reported to interpreter loaders (V8 keeps its snapshot code there).
pub const MEMOIZABLE_GAP: u64 = 512 * 1024;

/// Why a list of deltas cannot become a kernel table. Nothing is written
/// when this happens.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("delta #{index} at {address:#x} does not come after the previous delta")]
    Unsorted { index: usize, address: u64 },
    #[error("delta #{index} at {address:#x} carries a merge opcode or pad byte; only the encoder sets those")]
    Reserved { index: usize, address: u64 },
    #[error("{count} kernel deltas exceed the largest inner array ({max})")]
    TooManyDeltas { count: usize, max: usize },
    #[error("page {page:#x} would hold {count} deltas, more than a page entry can count (65535)")]
    PageOverflow { page: u64, count: usize },
    #[error("the deltas span {pages} pages, more than the {max} page entries allowed per file")]
    TooManyPages { pages: u64, max: u64 },
}

/// The rule of one kernel delta before slots are assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Rule {
    /// A command, stored directly in the delta (`0x8000 | command`).
    Command(u16),
    /// A rule that lives in an `unwind_info_array` slot (merge opcode included).
    Slot(UnwindInfo),
}

/// The layout of a file's kernel table, with rules not yet given slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draft<'a> {
    /// The deltas laid out: the entries are read from them again when
    /// needed rather than held (6.7 million entries would take 134 MB).
    deltas: &'a IntervalData,
    /// Page-aligned address of the first page.
    pub first_page: u64,
    /// How many entries the inner array holds ([`Draft::entries`]).
    pub(crate) entry_count: usize,
    /// Deltas per page, one slot for every page from the first to the last.
    pub per_page: Vec<u16>,
    /// Size class of the inner array.
    pub map_id: u16,
    /// Ranges after an end-of-function marker of at least [`MEMOIZABLE_GAP`].
    pub gaps: Vec<Range<u64>>,
    /// Page-aligned address ranges of the dead pages, in address order: the
    /// pages lying wholly inside a gap whose marker is the INVALID command.
    /// They hold no delta and get no page entry (deliberately unlike
    /// upstream, weakness 14): a lookup there would end native unwinding
    /// with the INVALID marker; without the page it ends it with "no page".
    pub dead_pages: Vec<Range<u64>>,
}

/// A file's kernel table, ready to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelTable {
    pub map_id: u16,
    pub(crate) first_page: u64,
    pub deltas: Arc<[abi::StackDelta]>,
    pub pages: Vec<(StackDeltaPageKey, StackDeltaPageInfo)>,
}

/// Upstream's merge rule: a delta and its neighbour one or two bytes later
/// that differ only by a push or pop of 8 bytes share one kernel entry.
pub(crate) fn merge_opcode(delta: &StackDelta, next: &StackDelta) -> u8 {
    let (a, b) = (&delta.info, &next.info);
    if a.opcode == opcode::COMMAND {
        return 0;
    }
    let addr_diff = next.address.wrapping_sub(delta.address);
    if !(1..=2).contains(&addr_diff) {
        return 0;
    }
    // Deliberate difference from upstream: never merge across a page
    // boundary. The unwinder corrects the address difference by one page
    // only, so a pair split by a page boundary and followed by empty pages
    // would resolve offset 0 of the later empty pages to the wrong rule.
    if next.address >> PAGE_BITS != delta.address >> PAGE_BITS {
        return 0;
    }
    if b.opcode != a.opcode || b.fp_opcode != a.fp_opcode || b.fp_param != a.fp_param {
        return 0;
    }
    match b.param.wrapping_sub(a.param) {
        8 => addr_diff as u8,
        -8 => addr_diff as u8 | MERGE_OPCODE_NEGATIVE,
        _ => 0,
    }
}

/// The rule a kernel delta stores for `info`: a command is encoded
/// directly, anything else needs a slot.
pub(crate) fn rule_of(info: UnwindInfo) -> Rule {
    if info.opcode == opcode::COMMAND {
        // Upstream truncates the param to 16 bits and sets the flag.
        Rule::Command(info.param as u16 | DELTA_COMMAND_FLAG)
    } else {
        Rule::Slot(info)
    }
}

/// The gaps of [`Draft::gaps`] without the rest of the layout, for the
/// interpreter loaders that run before the machine encodes the file (V8
/// finds its snapshot code there). Deltas merged into their predecessor are
/// skipped exactly as [`draft`] skips them; unsorted input gives no gap
/// where it is out of order (and is refused by [`draft`] anyway).
pub fn gaps(deltas: &IntervalData) -> Vec<Range<u64>> {
    let mut gaps = Vec::new();
    let mut merged_into_previous = false;
    for (delta, next) in deltas.iter().zip(deltas.iter_from(1)) {
        if merged_into_previous {
            merged_into_previous = false;
            continue;
        }
        merged_into_previous = merge_opcode(&delta, &next) != 0;
        let long = next
            .address
            .checked_sub(delta.address)
            .is_some_and(|len| len >= MEMOIZABLE_GAP);
        if delta.hints & hint::GAP != 0 && long {
            gaps.push(delta.address..next.address);
        }
    }
    gaps
}

/// Lays out the kernel table of `deltas`. `None` for an empty list: nothing
/// is written for such a file. `max_pages` bounds the page entries (and the
/// memory this function allocates) for one file.
pub fn draft(deltas: &IntervalData, max_pages: u64) -> Result<Option<Draft<'_>>, EncodeError> {
    let (Some(first), Some(last)) = (deltas.first(), deltas.last()) else {
        return Ok(None);
    };
    for (index, (delta, next)) in deltas.iter().zip(deltas.iter_from(1)).enumerate() {
        if next.address <= delta.address {
            return Err(EncodeError::Unsorted {
                index: index + 1,
                address: next.address,
            });
        }
    }
    if let Some((index, delta)) = deltas
        .iter()
        .enumerate()
        .find(|(_, d)| d.info.merge_opcode != 0 || d.info.pad != 0)
    {
        return Err(EncodeError::Reserved {
            index,
            address: delta.address,
        });
    }
    let first_page_no = first.address >> PAGE_BITS;
    let pages = (last.address >> PAGE_BITS) - first_page_no + 1;
    if pages > max_pages {
        return Err(EncodeError::TooManyPages {
            pages,
            max: max_pages,
        });
    }
    let mut per_page = vec![0u32; pages as usize];
    let mut entry_count = 0usize;
    let mut gaps = Vec::new();
    let mut dead_pages = Vec::new();
    let mut merged_into_previous = false;
    let mut ahead = deltas.iter_from(1);
    for delta in deltas.iter() {
        let next = ahead.next();
        if merged_into_previous {
            merged_into_previous = false;
            continue;
        }
        let mut info = delta.info;
        if let Some(next) = next {
            info.merge_opcode = merge_opcode(&delta, &next);
            merged_into_previous = info.merge_opcode != 0;
            if delta.hints & hint::GAP != 0 && next.address - delta.address >= MEMOIZABLE_GAP {
                gaps.push(delta.address..next.address);
                // Only behind the INVALID command is "no page" as final as
                // the marker's answer; any other rule would unwind there.
                if rule_of(info) == Rule::Command(abi::encoded_command::INVALID) {
                    // Pages strictly between the marker's page and the next
                    // delta's page: wholly inside the gap, so empty.
                    let first = ((delta.address >> PAGE_BITS) + 1) << PAGE_BITS;
                    let end = (next.address >> PAGE_BITS) << PAGE_BITS;
                    if first < end {
                        dead_pages.push(first..end);
                    }
                }
            }
        }
        entry_count += 1;
        per_page[((delta.address >> PAGE_BITS) - first_page_no) as usize] += 1;
    }
    if entry_count > abi::MAX_KERNEL_DELTAS {
        return Err(EncodeError::TooManyDeltas {
            count: entry_count,
            max: abi::MAX_KERNEL_DELTAS,
        });
    }
    let map_id = abi::size_class(entry_count as u32).ok_or(EncodeError::TooManyDeltas {
        count: entry_count,
        max: abi::MAX_KERNEL_DELTAS,
    })?;
    let per_page = per_page
        .iter()
        .enumerate()
        .map(|(p, &count)| {
            u16::try_from(count).map_err(|_| EncodeError::PageOverflow {
                page: (first_page_no + p as u64) << PAGE_BITS,
                count: count as usize,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    debug_assert!(
        per_page.len() as u64 <= max_pages && entry_count <= deltas.len(),
        "a draft spans {} pages (at most {max_pages}) with {entry_count} of {} deltas",
        per_page.len(),
        deltas.len()
    );
    Ok(Some(Draft {
        deltas,
        first_page: first_page_no << PAGE_BITS,
        entry_count,
        per_page,
        map_id,
        gaps,
        dead_pages,
    }))
}

impl Draft<'_> {
    /// (low 16 address bits, rule) of each entry, in inner-array order:
    /// every delta not merged into the one before, with the merge opcode
    /// of the pair it starts, as [`draft`] laid them out.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u16, Rule)> + '_ {
        let deltas = self.deltas;
        let mut merged_into_previous = false;
        let mut ahead = deltas.iter_from(1);
        deltas.iter().filter_map(move |delta| {
            let next = ahead.next();
            if merged_into_previous {
                merged_into_previous = false;
                return None;
            }
            let mut info = delta.info;
            if let Some(next) = next {
                info.merge_opcode = merge_opcode(&delta, &next);
                merged_into_previous = info.merge_opcode != 0;
            }
            Some(((delta.address & PAGE_MASK) as u16, rule_of(info)))
        })
    }

    /// The page entries the table writes: the span minus the dead pages.
    pub fn page_entries(&self) -> u64 {
        let dead: u64 = self
            .dead_pages
            .iter()
            .map(|r| (r.end - r.start) >> PAGE_BITS)
            .sum();
        debug_assert!(
            dead <= self.per_page.len() as u64,
            "more dead pages than pages"
        );
        self.per_page.len() as u64 - dead
    }

    /// Whether the page at `page` (page-aligned) is dead.
    pub fn is_dead(&self, page: u64) -> bool {
        is_dead_page(&self.dead_pages, page)
    }

    /// The distinct slot rules in first-use order (the order upstream hands
    /// out new slots in).
    pub fn slot_rules(&self) -> Vec<UnwindInfo> {
        let mut seen: std::collections::HashSet<UnwindInfo, foldhash::fast::RandomState> =
            Default::default();
        // Neighbouring deltas often share a rule: hashing it again for each
        // of them was a tenth of a big host's first step.
        let mut last = None;
        self.entries()
            .filter_map(|(_, rule)| match rule {
                Rule::Slot(info) if last != Some(info) => {
                    last = Some(info);
                    seen.insert(info).then_some(info)
                }
                _ => None,
            })
            .collect()
    }

    /// The final table, given each slot rule's `unwind_info_array` index.
    /// `slot_of` must know every rule of [`Draft::slot_rules`].
    pub fn resolve(
        &self,
        file_id: u64,
        mut slot_of: impl FnMut(&UnwindInfo) -> Option<u16>,
    ) -> Option<KernelTable> {
        let mut last: Option<(UnwindInfo, u16)> = None;
        let mut unresolved = false;
        let mut entries = self.entries();
        // Mapped from a range of exactly `entry_count` (the number of
        // entries): std then allocates the `Arc` once, at its size, and
        // fills it in place, rather than growing a `Vec` and copying it
        // into the `Arc` (a second 27 MB for 6.7 million entries).
        let deltas: Arc<[abi::StackDelta]> = (0..self.entry_count)
            .map(|_| {
                let (addr_low, rule) = entries.next().unwrap_or((0, Rule::Command(0)));
                let unwind_info = match rule {
                    Rule::Command(value) => value,
                    Rule::Slot(info) => match last {
                        Some((seen, slot)) if seen == info => slot,
                        _ => {
                            let slot = slot_of(&info).unwrap_or_else(|| {
                                unresolved = true;
                                0
                            });
                            last = Some((info, slot));
                            slot
                        }
                    },
                };
                abi::StackDelta {
                    addr_low,
                    unwind_info,
                }
            })
            .collect();
        if unresolved {
            return None;
        }
        let mut first_delta = 0u32;
        let mut pages = Vec::with_capacity(self.page_entries() as usize);
        for (p, &num_deltas) in self.per_page.iter().enumerate() {
            let page = self.first_page + ((p as u64) << PAGE_BITS);
            // A dead page holds no delta, so skipping it leaves the running
            // `first_delta` of the later pages as it was.
            if num_deltas == 0 && self.is_dead(page) {
                continue;
            }
            pages.push((
                StackDeltaPageKey { file_id, page },
                StackDeltaPageInfo {
                    first_delta,
                    num_deltas,
                    map_id: self.map_id,
                },
            ));
            first_delta += u32::from(num_deltas);
        }
        Some(KernelTable {
            map_id: self.map_id,
            first_page: self.first_page,
            deltas,
            pages,
        })
    }
}

/// Whether `page` lies in one of `dead` (sorted, disjoint page ranges).
pub(crate) fn is_dead_page(dead: &[Range<u64>], page: u64) -> bool {
    let i = dead.partition_point(|r| r.end <= page);
    dead.get(i).is_some_and(|r| r.contains(&page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deltas::info;
    use crate::deltas::info::sp;

    fn d(address: u64, info: UnwindInfo) -> StackDelta {
        StackDelta::new(address, hint::NONE, info)
    }

    fn list<const N: usize>(deltas: [StackDelta; N]) -> IntervalData {
        IntervalData::from_deltas(deltas.to_vec())
    }

    /// Resolves slots the way a fresh machine does: first use, first slot.
    fn fresh(draft: &Draft) -> KernelTable {
        let rules = draft.slot_rules();
        draft
            .resolve(1, |info| {
                rules.iter().position(|r| r == info).map(|i| i as u16)
            })
            .expect("every rule has a slot")
    }

    #[test]
    fn no_deltas_no_table() {
        assert_eq!(draft(&list([]), u64::MAX), Ok(None));
    }

    #[test]
    fn merge_opcodes_follow_upstreams_rule() {
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(1, sp(24))), 1);
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(2, sp(24))), 2);
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(1, sp(8))), 0x81);
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(2, sp(8))), 0x82);
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(3, sp(24))), 0, "too far");
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(1, sp(32))), 0, "not 8");
        assert_eq!(merge_opcode(&d(0, info::STOP), &d(1, info::STOP)), 0);
        assert_eq!(
            merge_opcode(&d(0x1_ffff, sp(16)), &d(0x2_0000, sp(24))),
            0,
            "never across a page boundary (deliberately unlike upstream)"
        );
        let mut framed = sp(24);
        framed.fp_opcode = opcode::BASE_CFA;
        framed.fp_param = -16;
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(1, framed)), 0);
        // Each frame-pointer field alone keeps a pair apart.
        let (mut fp_param_only, mut fp_opcode_only) = (sp(24), sp(24));
        fp_param_only.fp_param = -16;
        fp_opcode_only.fp_opcode = opcode::BASE_CFA;
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(1, fp_param_only)), 0);
        assert_eq!(merge_opcode(&d(0, sp(16)), &d(1, fp_opcode_only)), 0);
    }

    #[test]
    fn a_commands_rule_is_its_param_truncated_and_flagged() {
        let command = |param| UnwindInfo::new(opcode::COMMAND, param, 0, 0);
        assert_eq!(
            rule_of(info::STOP),
            Rule::Command(abi::encoded_command::STOP)
        );
        // As upstream: the low 16 bits, with the flag set whether or not
        // the param already had it.
        assert_eq!(rule_of(command(0x1_0002)), Rule::Command(0x8002));
        assert_eq!(rule_of(command(0x8003)), Rule::Command(0x8003));
        assert_eq!(rule_of(sp(16)), Rule::Slot(sp(16)));
    }

    #[test]
    fn every_command_encodes_to_the_value_the_reader_compares_with() {
        // The reader (BPF and the simulator's) compares a delta's value with
        // `encoded_command`; the encoder computes it from the command.
        use abi::{command as c, encoded_command as e};
        let command = |param| UnwindInfo::new(opcode::COMMAND, param, 0, 0);
        for (param, want) in [
            (c::INVALID, e::INVALID),
            (c::STOP, e::STOP),
            (c::PLT, e::PLT),
            (c::SIGNAL, e::SIGNAL),
            (c::FRAME_POINTER, e::FRAME_POINTER),
        ] {
            assert_eq!(
                rule_of(command(param)),
                Rule::Command(want),
                "command {param}"
            );
        }
    }

    #[test]
    fn a_merged_pair_becomes_one_entry() {
        let t = fresh(
            &draft(&list([d(0x10, sp(16)), d(0x11, sp(8)), d(0x20, sp(8))]), 16)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(t.deltas.len(), 2);
        assert_eq!(t.pages[0].1.num_deltas, 2);
    }

    #[test]
    fn empty_pages_get_entries_and_first_delta_runs_on() {
        let deltas = list([
            d(0x1_fff0, sp(8)),
            d(0x4_0010, sp(16)),
            d(0x4_0020, info::INVALID),
        ]);
        let t = fresh(&draft(&deltas, 16).unwrap().unwrap());
        let pages: Vec<_> = t
            .pages
            .iter()
            .map(|(k, v)| (k.page, v.first_delta, v.num_deltas))
            .collect();
        assert_eq!(
            pages,
            vec![
                (0x1_0000, 0, 1),
                (0x2_0000, 1, 0),
                (0x3_0000, 1, 0),
                (0x4_0000, 1, 2)
            ]
        );
        assert_eq!(t.deltas[2].unwind_info, 0x8000);
    }

    #[test]
    fn gaps_need_the_hint_and_the_size() {
        let big = MEMOIZABLE_GAP;
        let deltas = list([
            d(0x1000, sp(8)),
            StackDelta::new(0x2000, hint::GAP, info::INVALID),
            d(0x2000 + big, sp(8)),
            d(0x3000 + big, info::INVALID),
            d(0x3000 + 2 * big, sp(8)),
            StackDelta::new(0x4000 + 2 * big, hint::GAP, info::INVALID),
            d(0x4000 + 3 * big - 1, sp(8)),
        ]);
        let draft = draft(&deltas, 1 << 20).unwrap().unwrap();
        assert_eq!(draft.gaps, vec![0x2000..0x2000 + big]);
        assert_eq!(gaps(&deltas), draft.gaps);
        // A gap marker right after a merged pair is seen by both.
        let merged = list([
            d(0x1000, sp(16)),
            d(0x1001, sp(8)),
            StackDelta::new(0x1002, hint::GAP, info::INVALID),
            d(0x1002 + big, sp(8)),
        ]);
        let draft = super::draft(&merged, 1 << 20).unwrap().unwrap();
        assert_eq!(draft.entry_count, 3, "the pair was merged");
        assert_eq!(gaps(&merged), draft.gaps);
        assert_eq!(draft.gaps.len(), 1);
    }

    #[test]
    fn dead_pages_inside_a_gap_get_no_entry() {
        // A 1 MiB gap after an INVALID marker at 0x2_8000: pages 0x3..=0x11
        // lie wholly inside it; page 0x2 (the marker's) and page 0x12 (the
        // next delta's, partly in the gap) keep their entries.
        let marker = 0x2_8000;
        let after = marker + (1 << 20);
        let deltas = list([
            d(0x1_0010, sp(8)),
            d(0x1_ff00, sp(16)),
            StackDelta::new(marker, hint::GAP, info::INVALID),
            d(after, sp(8)),
            d(after + 0x1_0000, info::INVALID),
        ]);
        let draft = draft(&deltas, 64).unwrap().unwrap();
        assert_eq!(draft.gaps, vec![marker..after]);
        assert_eq!(draft.dead_pages, vec![0x3_0000..0x12_0000]);
        assert_eq!(draft.per_page.len(), 19, "the span is unchanged");
        assert_eq!(draft.page_entries(), 4);
        let t = fresh(&draft);
        let pages: Vec<_> = t
            .pages
            .iter()
            .map(|(k, v)| (k.page, v.first_delta, v.num_deltas))
            .collect();
        assert_eq!(
            pages,
            vec![
                (0x1_0000, 0, 2),
                (0x2_0000, 2, 1),
                (0x12_0000, 3, 1),
                (0x13_0000, 4, 1)
            ]
        );
        assert!(!draft.is_dead(0x2_0000) && draft.is_dead(0x3_0000));
        assert!(draft.is_dead(0x11_0000) && !draft.is_dead(0x12_0000));
    }

    #[test]
    fn only_an_invalid_marker_makes_pages_dead() {
        let big = 2 * MEMOIZABLE_GAP;
        // A gap hint on another rule: the gap is reported, no page dies.
        let stop = list([
            StackDelta::new(0x1_0000, hint::GAP, info::STOP),
            d(0x1_0000 + big, sp(8)),
        ]);
        let draft_stop = draft(&stop, 64).unwrap().unwrap();
        assert_eq!(draft_stop.gaps.len(), 1);
        assert!(draft_stop.dead_pages.is_empty());
        assert_eq!(fresh(&draft_stop).pages.len(), draft_stop.per_page.len());
        // No hint: no gap, no dead page.
        let plain = list([d(0x1_0000, info::INVALID), d(0x1_0000 + big, sp(8))]);
        let draft_plain = draft(&plain, 64).unwrap().unwrap();
        assert!(draft_plain.gaps.is_empty() && draft_plain.dead_pages.is_empty());
        // A gap marker at the very end of a page and the next delta at the
        // start of one: exactly the pages in between die.
        let edge = list([
            StackDelta::new(0x1_ffff, hint::GAP, info::INVALID),
            d(0x1_ffff + MEMOIZABLE_GAP + 1, sp(8)),
        ]);
        let draft_edge = draft(&edge, 64).unwrap().unwrap();
        assert_eq!(draft_edge.dead_pages, vec![0x2_0000..0xa_0000]);
        assert_eq!(fresh(&draft_edge).pages.len(), 2);
    }

    #[test]
    fn rejects_unsorted_and_reserved_fields() {
        assert_eq!(
            draft(&list([d(0x10, sp(8)), d(0x10, sp(16))]), 16),
            Err(EncodeError::Unsorted {
                index: 1,
                address: 0x10
            })
        );
        let mut merged = sp(8);
        merged.merge_opcode = 1;
        assert!(matches!(
            draft(&list([d(0x10, merged)]), 16),
            Err(EncodeError::Reserved { index: 0, .. })
        ));
    }

    #[test]
    fn bounds_the_page_span() {
        let deltas = list([d(0, sp(8)), d(u64::MAX, sp(16))]);
        assert!(matches!(
            draft(&deltas, 65536),
            Err(EncodeError::TooManyPages { .. })
        ));
        // The bound is inclusive: first and last delta four pages apart
        // span five pages.
        let five_pages = list([d(0x10, sp(8)), d((4 << PAGE_BITS) + 0x10, sp(16))]);
        assert!(matches!(draft(&five_pages, 5), Ok(Some(_))));
        assert!(matches!(
            draft(&five_pages, 4),
            Err(EncodeError::TooManyPages { pages: 5, max: 4 })
        ));
    }

    /// Alternating rules so that nothing folds or merges.
    fn distinct(n: usize, stride: u64) -> IntervalData {
        (0..n as u64)
            .map(|i| d(i * stride, if i % 2 == 0 { sp(8) } else { sp(32) }))
            .collect()
    }

    /// The entries read back from the deltas are the ones `draft` counted
    /// into the pages: merged pairs once, in address order.
    #[test]
    fn the_entries_are_the_ones_the_pages_count() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..2000 {
            let mut address = rand(1 << 17);
            let deltas: Vec<StackDelta> = (0..1 + rand(40))
                .map(|_| {
                    let far = rand(4) == 0;
                    address += 1 + rand(if far { 1 << 16 } else { 3 });
                    d(address, sp(8 * rand(4) as i32))
                })
                .collect();
            let list = IntervalData::from_deltas(deltas.clone());
            let draft = draft(&list, u64::MAX).unwrap().unwrap();
            let entries: Vec<(u16, Rule)> = draft.entries().collect();
            assert_eq!(entries.len(), draft.entry_count);
            let paged: usize = draft.per_page.iter().map(|&n| usize::from(n)).sum();
            assert_eq!(paged, draft.entry_count);
            let merged = deltas
                .windows(2)
                .filter(|w| merge_opcode(&w[0], &w[1]) != 0)
                .count();
            assert!(entries.len() >= deltas.len() - merged && entries.len() <= deltas.len());
            let table = draft.resolve(1, |_| Some(7)).unwrap();
            for (delta, (addr_low, _)) in table.deltas.iter().zip(&entries) {
                assert_eq!(delta.addr_low, *addr_low);
            }
        }
    }

    #[test]
    fn the_largest_table_fits_and_one_more_does_not() {
        let max = abi::MAX_KERNEL_DELTAS;
        let most = distinct(max, 4);
        let ok = draft(&most, u64::MAX).unwrap().unwrap();
        assert_eq!(ok.map_id, 23);
        assert_eq!(ok.entry_count, max);
        assert_eq!(
            draft(&distinct(max + 1, 4), u64::MAX),
            Err(EncodeError::TooManyDeltas {
                count: max + 1,
                max
            })
        );
    }

    #[test]
    fn a_full_page_counts_65535_and_65536_is_an_error() {
        let one_page = distinct(65535, 1);
        let full = draft(&one_page, 16).unwrap().unwrap();
        assert_eq!(full.per_page, vec![65535]);
        assert_eq!(full.map_id, 16);
        let t = fresh(&full);
        assert_eq!(t.pages[0].1.num_deltas, 65535);
        assert_eq!(
            draft(&distinct(65536, 1), 16),
            Err(EncodeError::PageOverflow {
                page: 0,
                count: 65536
            })
        );
        // The error names the page that overflowed, not the first one.
        let later: IntervalData = std::iter::once(d(0x1_0000, sp(16)))
            .chain(
                distinct(65536, 1)
                    .iter()
                    .map(|x| d(0x3_0000 + x.address, x.info)),
            )
            .collect();
        assert_eq!(
            draft(&later, 16),
            Err(EncodeError::PageOverflow {
                page: 0x3_0000,
                count: 65536
            })
        );
    }
}
