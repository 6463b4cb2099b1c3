//! [`SimReader`]: the native unwinder's stack-delta lookup, run against
//! [`SimMaps`], and [`expected`], the answer a direct search of a file's
//! deltas gives.
//!
//! The reader follows SEED's `get_stack_delta` step by step (spec §4.3: no
//! −1 return-address fixup), including its corner cases: the 16-step bounded
//! binary search, `hi == 0` as a failure, the step back to the previous
//! page's last delta, and the one-time +0x10000 correction of `addrDiff`.
//! Then it resolves the delta's rule as `unwind_one_frame` does: a command
//! is returned as is; anything else reads `unwind_info_array` (an ARRAY, so
//! an unwritten slot reads as zeros, spec §11 O4) and applies the merge
//! adjustment. Only what the unwinder *reads* is modelled; the register
//! arithmetic that follows is not.
//!
//! Tests compare `SimReader::answer` with [`expected`] address by address:
//! this is the lookup-equivalence invariant (DESIGN §5.3).

use eim_machine::abi::{
    self, encoded_command, opcode, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo, Wire,
    DELTA_COMMAND_FLAG, MERGE_OPCODE_NEGATIVE, PAGE_BITS, PAGE_MASK,
};
use eim_machine::deltas::{hint, IntervalData};
use eim_machine::FileId;

use crate::kernel::SimMaps;

/// Steps the BPF binary search may take (enough for 65535 deltas a page).
pub const MAX_SEARCH_STEPS: u32 = 16;

/// Why the unwinder finds no rule. Each variant is one BPF error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// `ERR_NATIVE_LOOKUP_TEXT_SECTION`: no page entry.
    #[error("ERR_NATIVE_LOOKUP_TEXT_SECTION: no page entry for file {file_id} page {page:#x}")]
    TextSection { file_id: FileId, page: u64 },
    /// `ERR_NATIVE_LOOKUP_STACK_DELTA_OUTER_MAP`: the page names no size class.
    #[error("ERR_NATIVE_LOOKUP_STACK_DELTA_OUTER_MAP: page {page:#x} of file {file_id} names map id {map_id}")]
    OuterMap {
        file_id: FileId,
        page: u64,
        map_id: u16,
    },
    /// `ERR_NATIVE_LOOKUP_STACK_DELTA_INNER_MAP`: no delta array for the file
    /// in the class the page names.
    #[error("ERR_NATIVE_LOOKUP_STACK_DELTA_INNER_MAP: no delta array for file {file_id} in class {map_id} (page {page:#x})")]
    InnerMap {
        file_id: FileId,
        page: u64,
        map_id: u16,
    },
    /// `ERR_NATIVE_EXCEEDED_DELTA_LOOKUP_ITERATIONS`: the search used all
    /// its steps, hit a missing element, or the address lies before the
    /// file's first delta.
    #[error("ERR_NATIVE_EXCEEDED_DELTA_LOOKUP_ITERATIONS: page {page:#x} of file {file_id} (deltas {first_delta}+{num_deltas})")]
    Iterations {
        file_id: FileId,
        page: u64,
        first_delta: u32,
        num_deltas: u16,
    },
    /// `ERR_NATIVE_LOOKUP_RANGE`: the delta before the search result is not
    /// in the array (inconsistent page data).
    #[error("ERR_NATIVE_LOOKUP_RANGE: delta {index:#x} of file {file_id} is outside its array")]
    Range {
        file_id: FileId,
        page: u64,
        index: u32,
    },
    /// `ERR_NATIVE_STACK_DELTA_INVALID`: the delta in force is INVALID.
    #[error("ERR_NATIVE_STACK_DELTA_INVALID: delta {index} of file {file_id} at {address:#x}")]
    StackDeltaInvalid {
        file_id: FileId,
        address: u64,
        index: u32,
    },
    /// `ERR_NATIVE_BAD_UNWIND_INFO_INDEX`: the slot is past the array.
    #[error("ERR_NATIVE_BAD_UNWIND_INFO_INDEX: slot {slot} (delta {index} of file {file_id})")]
    BadUnwindInfoIndex {
        file_id: FileId,
        index: u32,
        slot: u16,
    },
}

impl LookupError {
    /// The BPF error code's name.
    pub fn code(&self) -> &'static str {
        match self {
            Self::TextSection { .. } => "ERR_NATIVE_LOOKUP_TEXT_SECTION",
            Self::OuterMap { .. } => "ERR_NATIVE_LOOKUP_STACK_DELTA_OUTER_MAP",
            Self::InnerMap { .. } => "ERR_NATIVE_LOOKUP_STACK_DELTA_INNER_MAP",
            Self::Iterations { .. } => "ERR_NATIVE_EXCEEDED_DELTA_LOOKUP_ITERATIONS",
            Self::Range { .. } => "ERR_NATIVE_LOOKUP_RANGE",
            Self::StackDeltaInvalid { .. } => "ERR_NATIVE_STACK_DELTA_INVALID",
            Self::BadUnwindInfoIndex { .. } => "ERR_NATIVE_BAD_UNWIND_INFO_INDEX",
        }
    }
}

/// What `get_stack_delta` found: the delta in force and how it got there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaHit {
    /// The page entry used.
    pub page: StackDeltaPageInfo,
    /// Index of the delta in the inner array.
    pub index: u32,
    pub delta: abi::StackDelta,
    /// `page_offset − addrLow`, +0x10000 once if the delta is in an
    /// earlier page (so it is wrong by multiples of 0x10000 further back).
    pub addr_diff: i32,
    /// Binary-search steps taken (0 for a page without deltas).
    pub steps: u32,
}

/// The rule the unwinder applies at an address (one type with the kernel
/// backend's decoded lookup record).
pub use eim_machine::unwind::Resolved;

/// The part of a lookup that a file's deltas alone determine: what
/// [`SimReader::answer`] and [`expected`] both return, for comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Stop,
    /// The INVALID command (the reader's `ERR_NATIVE_STACK_DELTA_INVALID`).
    Invalid,
    Command(u16),
    Rule(UnwindInfo),
}

impl From<Resolved> for Answer {
    fn from(resolved: Resolved) -> Self {
        match resolved {
            Resolved::Stop => Answer::Stop,
            Resolved::Command(c) => Answer::Command(c),
            Resolved::Rule { info, .. } => Answer::Rule(info),
        }
    }
}

/// A lookup result as an [`Answer`]: `ERR_NATIVE_STACK_DELTA_INVALID` is the
/// INVALID delta's answer; every other error is "no answer".
pub fn answer_of(result: &Result<Resolved, LookupError>) -> Option<Answer> {
    match result {
        Ok(resolved) => Some(Answer::from(*resolved)),
        Err(LookupError::StackDeltaInvalid { .. }) => Some(Answer::Invalid),
        Err(_) => None,
    }
}

/// The BPF unwinder's lookups, against simulated maps.
#[derive(Clone, Copy, Debug)]
pub struct SimReader<'a> {
    maps: &'a SimMaps,
}

impl<'a> SimReader<'a> {
    pub fn new(maps: &'a SimMaps) -> Self {
        Self { maps }
    }

    /// SEED `get_stack_delta` for `address` (an ELF virtual address, that
    /// is `pc − bias`) in file `file_id`. STOP is a success here, as in BPF.
    pub fn get_stack_delta(&self, file_id: FileId, address: u64) -> Result<DeltaHit, LookupError> {
        let page = address & !PAGE_MASK;
        let key = StackDeltaPageKey {
            file_id: file_id.0,
            page,
        };
        let info = self
            .maps
            .page(&key)
            .ok_or(LookupError::TextSection { file_id, page })?;
        let map_id = info.map_id;
        let outer = self.maps.outer(map_id).ok_or(LookupError::OuterMap {
            file_id,
            page,
            map_id,
        })?;
        let inner =
            self.maps
                .reg
                .inner(outer, &file_id.0.to_bytes())
                .ok_or(LookupError::InnerMap {
                    file_id,
                    page,
                    map_id,
                })?;
        let read = |i: u32| inner.slot(i).and_then(abi::StackDelta::read);

        let page_offset = (address & PAGE_MASK) as u16;
        let mut idx = info.first_delta;
        let mut steps = 0;
        if info.num_deltas != 0 {
            // u32 arithmetic that wraps, as in C.
            let mut lo = info.first_delta;
            let mut hi = lo.wrapping_add(u32::from(info.num_deltas));
            let mut i = 0;
            while i < MAX_SEARCH_STEPS {
                steps += 1;
                let pivot = lo.wrapping_add(hi) >> 1;
                let more = match read(pivot) {
                    None => {
                        hi = 0;
                        false
                    }
                    Some(delta) => {
                        if page_offset >= delta.addr_low {
                            lo = pivot.wrapping_add(1);
                        } else {
                            hi = pivot;
                        }
                        lo < hi
                    }
                };
                if !more {
                    break;
                }
                i += 1;
            }
            if i >= MAX_SEARCH_STEPS || hi == 0 {
                return Err(LookupError::Iterations {
                    file_id,
                    page,
                    first_delta: info.first_delta,
                    num_deltas: info.num_deltas,
                });
            }
            // The first delta past the address.
            idx = hi;
        }
        // The last delta at or below it, possibly in an earlier page.
        idx = idx.wrapping_sub(1);
        let delta = read(idx).ok_or(LookupError::Range {
            file_id,
            page,
            index: idx,
        })?;
        let mut addr_diff = i32::from(page_offset) - i32::from(delta.addr_low);
        if idx < info.first_delta {
            addr_diff += 1 << PAGE_BITS;
        }
        if delta.unwind_info == encoded_command::INVALID {
            return Err(LookupError::StackDeltaInvalid {
                file_id,
                address,
                index: idx,
            });
        }
        Ok(DeltaHit {
            page: info,
            index: idx,
            delta,
            addr_diff,
            steps,
        })
    }

    /// The rule the unwinder applies at `address` of `file_id`.
    pub fn lookup(&self, file_id: FileId, address: u64) -> Result<Resolved, LookupError> {
        let hit = self.get_stack_delta(file_id, address)?;
        let value = hit.delta.unwind_info;
        if value & DELTA_COMMAND_FLAG != 0 {
            return Ok(match value {
                encoded_command::STOP => Resolved::Stop,
                _ => Resolved::Command(value & !DELTA_COMMAND_FLAG),
            });
        }
        let mut info =
            self.maps
                .unwind_info(u32::from(value))
                .ok_or(LookupError::BadUnwindInfoIndex {
                    file_id,
                    index: hit.index,
                    slot: value,
                })?;
        let merge = info.merge_opcode;
        if merge != 0 && hit.addr_diff >= i32::from(merge & !MERGE_OPCODE_NEGATIVE) {
            let step = if merge & MERGE_OPCODE_NEGATIVE != 0 {
                -8
            } else {
                8
            };
            info.param = info.param.wrapping_add(step);
        }
        info.merge_opcode = 0;
        Ok(Resolved::Rule {
            info,
            slot: value,
            addr_diff: hit.addr_diff,
        })
    }

    /// [`SimReader::lookup`] as an [`Answer`] (see [`answer_of`]).
    pub fn answer(&self, file_id: FileId, address: u64) -> Option<Answer> {
        answer_of(&self.lookup(file_id, address))
    }
}

/// The answer a direct search of `data` gives at `address`: the rule of the
/// last delta at or below it, classified as the reader classifies it.
///
/// `data` must be a list the encoder accepts (sorted, no merge opcode). When
/// the maps hold exactly `data`'s table for a file (and its unwind slots),
/// `SimReader::answer(file, address) == expected(data, address)` for every
/// address, because `expected` returns `None` exactly where the reader has
/// no answer:
///
/// * below the first delta: its page has no entry (text-section error) or
///   the search ends with `hi == 0` (iterations error);
/// * past the last delta's page: no page entry;
/// * in a dead page ([`in_dead_page`]): no page entry (eim writes none there);
/// * anywhere else from the first delta to the end of the last delta's
///   page: an answer.
///
/// This holds because eim never merges a pair split by a page boundary:
/// SEED's one-time +0x10000 correction would otherwise miss the merge at
/// offset 0 of later empty pages (a test below shows it resolves right).
pub fn expected(data: &IntervalData, address: u64) -> Option<Answer> {
    let first = data.first()?;
    let last = data.last()?;
    if address < first.address || address >> PAGE_BITS > last.address >> PAGE_BITS {
        return None;
    }
    if in_dead_page(data, address) {
        return None;
    }
    data.find(address).map(|delta| answer_for(&delta.info))
}

/// Whether `address` lies in a dead page of `data`: a page wholly inside a
/// gap of at least 512 KiB that follows a delta with the gap hint whose
/// rule the reader sees as INVALID. eim writes no page entry there (a
/// lookup would only find the INVALID marker). Worked out from the source
/// deltas alone, independently of the encoder.
pub fn in_dead_page(data: &IntervalData, address: u64) -> bool {
    let after = data.partition_point(|d| d.address <= address);
    let (Some(i), Some(next)) = (after.checked_sub(1), data.get(after)) else {
        return false;
    };
    let Some(marker) = data.get(i) else {
        return false;
    };
    let page = address >> PAGE_BITS;
    marker.hints & hint::GAP != 0
        && answer_for(&marker.info) == Answer::Invalid
        && next.address - marker.address >= 512 * 1024
        && page > marker.address >> PAGE_BITS
        && page < next.address >> PAGE_BITS
}

/// How the reader sees a source rule. A command is stored as
/// `param as u16 | 0x8000` (upstream truncates), so e.g. param 0x10001 is STOP.
pub fn answer_for(info: &UnwindInfo) -> Answer {
    if info.opcode != opcode::COMMAND {
        return Answer::Rule(*info);
    }
    match info.param as u16 | DELTA_COMMAND_FLAG {
        encoded_command::INVALID => Answer::Invalid,
        encoded_command::STOP => Answer::Stop,
        value => Answer::Command(value & !DELTA_COMMAND_FLAG),
    }
}

#[cfg(test)]
mod tests {
    use eim_machine::deltas::info::sp;
    use std::ops::Range;

    use eim_machine::abi::{command, StackDelta as KernelDelta};
    use eim_machine::deltas::{hint, info, StackDelta};
    use eim_machine::encode::{self, KernelTable};
    use eim_machine::ops::{Backend, MapOp};

    use super::*;
    use crate::kernel::SimConfig;

    fn d(address: u64, info: UnwindInfo) -> StackDelta {
        StackDelta::new(address, hint::NONE, info)
    }

    fn data(deltas: Vec<StackDelta>) -> IntervalData {
        IntervalData::from_deltas(deltas)
    }

    /// A map set plus the slots handed out so far (first use, first slot).
    struct Loader {
        sim: SimMaps,
        slots: Vec<UnwindInfo>,
    }

    impl Loader {
        fn new() -> Self {
            Self {
                sim: SimMaps::new(SimConfig::default()).expect("default config"),
                slots: Vec::new(),
            }
        }

        /// Encodes `data` and writes it with the backend ops, bottom up.
        fn load(&mut self, file: u64, data: &IntervalData) -> KernelTable {
            let draft = encode::draft(data, 1 << 16)
                .expect("encodable")
                .expect("not empty");
            let mut fresh = Vec::new();
            for rule in draft.slot_rules() {
                if !self.slots.contains(&rule) {
                    fresh.push((self.slots.len() as u16, rule));
                    self.slots.push(rule);
                }
            }
            let slots = &self.slots;
            let table = draft
                .resolve(file, |info| {
                    slots.iter().position(|s| s == info).map(|i| i as u16)
                })
                .expect("every rule has a slot");
            let ops = [
                MapOp::PutUnwindInfos(fresh),
                MapOp::PutDeltaTable {
                    file_id: FileId(file),
                    map_id: table.map_id,
                    deltas: table.deltas.clone(),
                },
                MapOp::PutPages(table.pages.clone()),
            ];
            for op in &ops {
                assert_eq!(self.sim.apply(op), Ok(()), "{op:?}");
            }
            table
        }

        fn reader(&self) -> SimReader<'_> {
            SimReader::new(&self.sim)
        }

        /// Reader answer == direct search for every address in `range`.
        fn assert_equivalent(&self, file: u64, data: &IntervalData, range: Range<u64>) {
            let reader = self.reader();
            for address in range {
                assert_eq!(
                    reader.answer(FileId(file), address),
                    expected(data, address),
                    "file {file} address {address:#x}: {:?}",
                    reader.lookup(FileId(file), address)
                );
            }
        }
    }

    #[test]
    fn one_page_with_every_kind_of_rule() {
        let deltas = data(vec![
            d(0x1000, sp(8)),
            d(0x1004, sp(32)),
            d(0x1010, info::STOP),
            d(0x1020, info::PLT),
            d(0x1030, info::SIGNAL),
            d(0x1040, info::FRAME_POINTER),
            d(0x1050, info::INVALID),
        ]);
        let mut l = Loader::new();
        l.load(7, &deltas);
        l.assert_equivalent(7, &deltas, 0..0x2_0000);
        let r = l.reader();
        let f = FileId(7);
        assert_eq!(
            r.lookup(f, 0x1005),
            Ok(Resolved::Rule {
                info: sp(32),
                slot: 1,
                addr_diff: 1
            })
        );
        assert_eq!(r.lookup(f, 0x1010), Ok(Resolved::Stop));
        assert_eq!(
            r.lookup(f, 0x1020),
            Ok(Resolved::Command(command::PLT as u16))
        );
        assert_eq!(
            r.lookup(f, 0x1040),
            Ok(Resolved::Command(command::FRAME_POINTER as u16))
        );
        assert!(matches!(
            r.lookup(f, 0x1050),
            Err(LookupError::StackDeltaInvalid { index: 6, .. })
        ));
        // Below the first delta of the file's first page: hi == 0.
        let below = r.lookup(f, 0xfff);
        assert!(matches!(
            below,
            Err(LookupError::Iterations {
                first_delta: 0,
                num_deltas: 7,
                ..
            })
        ));
        assert_eq!(
            below.map_err(|e| e.code()),
            Err("ERR_NATIVE_EXCEEDED_DELTA_LOOKUP_ITERATIONS")
        );
        // Unknown page, and a known page under another file id.
        assert_eq!(
            r.lookup(f, 0x1_0000),
            Err(LookupError::TextSection {
                file_id: f,
                page: 0x1_0000
            })
        );
        assert!(matches!(
            r.lookup(FileId(8), 0x1000),
            Err(LookupError::TextSection { .. })
        ));
    }

    #[test]
    fn several_pages_with_empty_ones_and_merges_near_a_boundary() {
        let deltas = data(vec![
            d(0x1_0010, sp(16)),
            d(0x1_0011, sp(8)), // merged: 0x81
            d(0x1_fff0, sp(8)),
            d(0x1_fff1, sp(16)), // merged: 0x01
            d(0x1_fffe, sp(8)),
            d(0x2_0000, sp(16)), // not merged: eim never merges across a page boundary
            d(0x2_0100, sp(24)),
            d(0x4_0010, info::INVALID),
        ]);
        let mut l = Loader::new();
        let table = l.load(3, &deltas);
        let shape: Vec<_> = table
            .pages
            .iter()
            .map(|(k, v)| (k.page, v.first_delta, v.num_deltas))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0x1_0000, 0, 3),
                (0x2_0000, 3, 2),
                (0x3_0000, 5, 0),
                (0x4_0000, 5, 1)
            ]
        );
        l.assert_equivalent(3, &deltas, 0..0x6_0000);
        let r = l.reader();
        let f = FileId(3);
        let rule_at = |addr| match r.lookup(f, addr) {
            Ok(Resolved::Rule {
                info, addr_diff, ..
            }) => Some((info, addr_diff)),
            _ => None,
        };
        // A positive merge inside the page: its own rule, then +8.
        assert_eq!(rule_at(0x1_fff0), Some((sp(8), 0)));
        assert_eq!(rule_at(0x1_fff1), Some((sp(16), 1)));
        // The pair split by the boundary stays two entries.
        assert_eq!(rule_at(0x1_ffff), Some((sp(8), 1)));
        assert_eq!(rule_at(0x2_0000), Some((sp(16), 0)));
        // A negative merge.
        assert_eq!(rule_at(0x1_0010), Some((sp(16), 0)));
        assert_eq!(rule_at(0x1_0011), Some((sp(8), 1)));
        // The empty page falls back to the previous page's last delta.
        let hit = r.get_stack_delta(f, 0x3_8000).expect("found");
        assert_eq!(
            (hit.index, hit.steps, hit.addr_diff),
            (4, 0, 0x8000 - 0x100 + 0x1_0000)
        );
    }

    /// Upstream merges a pair split by a page boundary; the unwinder then
    /// corrects the address difference by one page only, so offset 0 of
    /// every later empty page resolves to the unmerged rule. eim does not
    /// merge such pairs, and the reader agrees with the deltas everywhere.
    #[test]
    fn a_pair_split_by_a_page_boundary_resolves_right_in_later_empty_pages() {
        let deltas = data(vec![
            d(0x1_0000, sp(8)),
            d(0x1_ffff, sp(16)),
            d(0x2_0001, sp(24)),
            d(0x4_0010, info::INVALID),
        ]);
        let mut l = Loader::new();
        l.load(1, &deltas);
        let r = l.reader();
        let differ: Vec<u64> = (0x1_0000..0x5_0000)
            .filter(|&a| r.answer(FileId(1), a) != expected(&deltas, a))
            .collect();
        assert_eq!(differ, Vec::<u64>::new());
        assert_eq!(r.answer(FileId(1), 0x3_0000), Some(Answer::Rule(sp(24))));
        assert_eq!(r.answer(FileId(1), 0x4_0000), Some(Answer::Rule(sp(24))));
    }

    #[test]
    fn a_full_page_of_65535_deltas_is_searched_within_16_steps() {
        let deltas = data(
            (0..65535u64)
                .map(|a| d(a, if a % 2 == 0 { sp(8) } else { sp(32) }))
                .collect(),
        );
        let mut l = Loader::new();
        let table = l.load(9, &deltas);
        assert_eq!(table.pages.len(), 1);
        assert_eq!(table.pages[0].1.num_deltas, 65535);
        l.assert_equivalent(9, &deltas, 0..0x1_0000);
        let r = l.reader();
        let most = (0..0x1_0000u64)
            .filter_map(|a| r.get_stack_delta(FileId(9), a).ok())
            .map(|hit| hit.steps)
            .max();
        assert_eq!(most, Some(MAX_SEARCH_STEPS));
    }

    #[test]
    fn two_files_do_not_see_each_other() {
        let a = data(vec![d(0x1000, sp(8)), d(0x2000, info::INVALID)]);
        let b = data(vec![
            d(0x1800, sp(16)),
            d(0x1_2000, sp(8)),
            d(0x1_3000, info::STOP),
        ]);
        let mut l = Loader::new();
        l.load(1, &a);
        l.load(2, &b);
        l.assert_equivalent(1, &a, 0..0x3_0000);
        l.assert_equivalent(2, &b, 0..0x3_0000);
    }

    #[test]
    fn a_page_without_its_table_is_an_inner_map_error() {
        let mut sim = SimMaps::new(SimConfig::default()).expect("default config");
        let key = StackDeltaPageKey {
            file_id: 4,
            page: 0x1_0000,
        };
        let page = StackDeltaPageInfo {
            first_delta: 0,
            num_deltas: 1,
            map_id: 8,
        };
        assert_eq!(sim.apply(&MapOp::PutPages(vec![(key, page)])), Ok(()));
        assert_eq!(
            SimReader::new(&sim).lookup(FileId(4), 0x1_0042),
            Err(LookupError::InnerMap {
                file_id: FileId(4),
                page: 0x1_0000,
                map_id: 8
            })
        );
        // A table of the wrong class is just as missing.
        let table = MapOp::PutDeltaTable {
            file_id: FileId(4),
            map_id: 9,
            deltas: vec![KernelDelta::default()].into(),
        };
        assert_eq!(sim.apply(&table), Ok(()));
        assert!(matches!(
            SimReader::new(&sim).lookup(FileId(4), 0x1_0042),
            Err(LookupError::InnerMap { .. })
        ));
    }

    /// A sim with one file whose table is `deltas` (class 8) and whose pages
    /// are given raw, to build the inconsistent states a reader must survive.
    fn raw(
        deltas: Vec<KernelDelta>,
        pages: Vec<(u64, StackDeltaPageInfo)>,
        unwind: u32,
    ) -> SimMaps {
        let mut sim = SimMaps::new(SimConfig {
            unwind_info: unwind,
            ..SimConfig::default()
        })
        .expect("valid config");
        let ops = [
            MapOp::PutDeltaTable {
                file_id: FileId(5),
                map_id: 8,
                deltas: deltas.into(),
            },
            MapOp::PutPages(
                pages
                    .into_iter()
                    .map(|(page, info)| (StackDeltaPageKey { file_id: 5, page }, info))
                    .collect(),
            ),
        ];
        for op in &ops {
            assert_eq!(sim.apply(op), Ok(()));
        }
        sim
    }

    fn page_info(first_delta: u32, num_deltas: u16, map_id: u16) -> StackDeltaPageInfo {
        StackDeltaPageInfo {
            first_delta,
            num_deltas,
            map_id,
        }
    }

    fn kd(addr_low: u16, unwind_info: u16) -> KernelDelta {
        KernelDelta {
            addr_low,
            unwind_info,
        }
    }

    #[test]
    fn inconsistent_pages_give_the_bpf_errors() {
        let sim = raw(
            vec![kd(0x10, 0), kd(0x20, 5), kd(0x30, 1)],
            vec![
                (0x0_0000, page_info(0, 3, 8)),
                (0x1_0000, page_info(0, 0, 8)), // empty first page: idx wraps
                (0x2_0000, page_info(300, 4, 8)), // past the 256-entry array
                (0x3_0000, page_info(0, 3, 7)), // no such class
                (0x4_0000, page_info(0, 3, 24)),
            ],
            4,
        );
        let r = SimReader::new(&sim);
        let f = FileId(5);
        assert_eq!(
            r.lookup(f, 0x1_0000),
            Err(LookupError::Range {
                file_id: f,
                page: 0x1_0000,
                index: u32::MAX
            })
        );
        assert!(matches!(
            r.lookup(f, 0x2_0000),
            Err(LookupError::Iterations {
                first_delta: 300,
                ..
            })
        ));
        for (page, map_id) in [(0x3_0000, 7), (0x4_0000, 24)] {
            assert_eq!(
                r.lookup(f, page),
                Err(LookupError::OuterMap {
                    file_id: f,
                    page,
                    map_id
                })
            );
        }
        // Slot 5 is past the 4-slot array; slot 1 was never written and
        // reads as zeros (spec §11 O4).
        assert_eq!(
            r.lookup(f, 0x25),
            Err(LookupError::BadUnwindInfoIndex {
                file_id: f,
                index: 1,
                slot: 5
            })
        );
        assert_eq!(
            r.lookup(f, 0x35),
            Ok(Resolved::Rule {
                info: UnwindInfo::default(),
                slot: 1,
                addr_diff: 5
            })
        );
    }

    #[test]
    fn a_merge_applies_from_its_distance_on_in_both_directions() {
        let plus = UnwindInfo {
            merge_opcode: 2,
            ..sp(16)
        };
        let minus = UnwindInfo {
            merge_opcode: 0x81,
            ..sp(16)
        };
        let mut sim = raw(
            vec![kd(0x10, 0), kd(0x20, 1), kd(0x30, 0x8001)],
            vec![(0, page_info(0, 3, 8))],
            4,
        );
        assert_eq!(
            sim.apply(&MapOp::PutUnwindInfos(vec![(0, plus), (1, minus)])),
            Ok(())
        );
        let r = SimReader::new(&sim);
        let param = |a| match r.lookup(FileId(5), a) {
            Ok(Resolved::Rule { info, .. }) => Some(info.param),
            _ => None,
        };
        assert_eq!(
            [param(0x10), param(0x11), param(0x12), param(0x1f)],
            [Some(16), Some(16), Some(24), Some(24)]
        );
        assert_eq!(
            [param(0x20), param(0x21), param(0x2f)],
            [Some(16), Some(8), Some(8)]
        );
        assert_eq!(r.lookup(FileId(5), 0x30), Ok(Resolved::Stop));
    }

    #[test]
    fn expected_follows_the_reader_encoding_of_commands() {
        let cmd = |param| UnwindInfo {
            param,
            ..info::INVALID
        };
        assert_eq!(answer_for(&cmd(command::INVALID)), Answer::Invalid);
        assert_eq!(answer_for(&cmd(command::STOP)), Answer::Stop);
        assert_eq!(answer_for(&cmd(command::SIGNAL)), Answer::Command(3));
        assert_eq!(
            answer_for(&cmd(0x1_0001)),
            Answer::Stop,
            "truncated to 16 bits"
        );
        assert_eq!(answer_for(&cmd(0x8000)), Answer::Invalid);
        assert_eq!(answer_for(&sp(8)), Answer::Rule(sp(8)));
        let deltas = data(vec![d(0x1_0010, sp(8)), d(0x2_0000, info::STOP)]);
        assert_eq!(expected(&deltas, 0x1_000f), None);
        assert_eq!(expected(&deltas, 0x1_0010), Some(Answer::Rule(sp(8))));
        assert_eq!(expected(&deltas, 0x2_ffff), Some(Answer::Stop));
        assert_eq!(expected(&deltas, 0x3_0000), None);
        assert_eq!(expected(&IntervalData::new(), 0), None);
    }
}
