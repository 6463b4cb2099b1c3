use super::*;
use crate::abi::{StackDeltaPageInfo, StackDeltaPageKey};

const FILE: FileId = FileId(0x1234);
const RULE: UnwindInfo = UnwindInfo::new(1, 8, 0, 0);
const OTHER_RULE: UnwindInfo = UnwindInfo::new(1, 16, 3, -16);

fn delta(addr_low: u16, unwind_info: u16) -> abi::StackDelta {
    abi::StackDelta {
        addr_low,
        unwind_info,
    }
}

/// One file of two pages over a class-8 table: slots 1 and 2 hold rules.
fn consistent() -> Observed {
    let mut o = Observed {
        unwind_infos: vec![UnwindInfo::default(), RULE, OTHER_RULE],
        ..Observed::default()
    };
    o.delta_tables.insert(
        (8, FILE),
        vec![
            delta(0, 1),
            delta(0x10, 2),
            delta(0x20, abi::encoded_command::STOP),
            delta(0, 2),
        ],
    );
    let page = |page: u64, first_delta, num_deltas| {
        (
            StackDeltaPageKey {
                file_id: FILE.0,
                page,
            },
            StackDeltaPageInfo {
                first_delta,
                num_deltas,
                map_id: 8,
            },
        )
    };
    o.pages.extend([page(0x10000, 0, 3), page(0x20000, 3, 1)]);
    o
}

#[test]
fn a_consistent_load_has_no_violation_and_says_what_the_file_holds() {
    let a = audit(&consistent(), 16);
    assert_eq!(a.violations, []);
    assert!(a.is_consistent());
    let [file] = a.files.as_slice() else {
        panic!("one file expected: {:?}", a.files)
    };
    assert_eq!(file.file_id, FILE);
    assert_eq!(file.classes, [8]);
    assert_eq!(file.pages, 2);
    assert_eq!(file.deltas, 4);
    assert_eq!(file.slots, BTreeSet::from([1, 2]));
    assert_eq!((a.slots_holding_rules, a.slots_referenced), (2, 2));
}

fn only(o: &Observed, slots: u32) -> MapViolation {
    let a = audit(o, slots);
    match a.violations.as_slice() {
        [v] => v.clone(),
        other => panic!("one violation expected, got {other:?}"),
    }
}

#[test]
fn a_page_whose_table_is_gone_is_reported() {
    let mut o = consistent();
    o.delta_tables.clear();
    assert_eq!(audit(&o, 16).violations.len(), 2, "both pages");
    let mut o = consistent();
    let info = o.pages.values_mut().next().expect("a page");
    info.map_id = 9;
    assert!(matches!(
        only(&o, 16),
        MapViolation::PageWithoutTable {
            map_id: 9,
            page: 0x10000,
            ..
        }
    ));
    let info = o.pages.values_mut().next().expect("a page");
    info.map_id = 3;
    assert!(matches!(
        only(&o, 16),
        MapViolation::NoSuchClass { map_id: 3, .. }
    ));
}

#[test]
fn a_slice_past_its_table_is_reported() {
    let mut o = consistent();
    let info = o.pages.values_mut().last().expect("a page");
    info.first_delta = 250;
    info.num_deltas = 7;
    let a = audit(&o, 16);
    assert!(
        a.violations.iter().any(|v| matches!(
            v,
            MapViolation::SliceOutOfBounds {
                first: 250,
                end: 257,
                capacity: 256,
                ..
            }
        )),
        "{:?}",
        a.violations
    );
    // The part inside reads zero deltas: slot 0, which holds no rule.
    assert!(a.violations.iter().any(|v| matches!(
        v,
        MapViolation::ZeroSlot {
            slot: 0,
            index: 250,
            ..
        }
    )));
}

#[test]
fn a_delta_naming_an_empty_or_missing_slot_is_reported() {
    let mut o = consistent();
    o.unwind_infos[2] = UnwindInfo::default();
    // Deltas 1 and 3 both name slot 2.
    assert_eq!(
        audit(&o, 16).violations,
        [
            MapViolation::ZeroSlot {
                file_id: FILE,
                index: 1,
                slot: 2
            },
            MapViolation::ZeroSlot {
                file_id: FILE,
                index: 3,
                slot: 2
            },
        ]
    );
    let o = consistent();
    assert!(matches!(
        audit(&o, 2).violations.as_slice(),
        [
            MapViolation::SlotOutOfRange {
                slot: 2,
                capacity: 2,
                ..
            },
            ..
        ]
    ));
}

#[test]
fn a_rule_in_two_slots_and_an_orphan_table_are_reported() {
    let mut o = consistent();
    o.unwind_infos.push(RULE);
    assert_eq!(
        only(&o, 16),
        MapViolation::DuplicateRule {
            first: 1,
            second: 3
        }
    );
    let mut o = consistent();
    o.delta_tables.insert((10, FileId(7)), vec![delta(0, 1)]);
    assert_eq!(
        only(&o, 16),
        MapViolation::OrphanTable {
            file_id: FileId(7),
            map_id: 10
        }
    );
    let mut o = consistent();
    let (key, info) = o.pages.pop_first().expect("a page");
    o.pages.insert(
        StackDeltaPageKey {
            page: key.page + 1,
            ..key
        },
        info,
    );
    assert!(matches!(only(&o, 16), MapViolation::UnalignedPage { .. }));
}

#[test]
fn unreferenced_rules_are_counted_not_reported() {
    let mut o = consistent();
    o.unwind_infos.push(UnwindInfo::new(2, 24, 0, 0));
    let a = audit(&o, 16);
    assert_eq!(a.violations, []);
    assert_eq!((a.slots_holding_rules, a.slots_referenced), (3, 2));
}

#[test]
fn overlapping_pages_walk_each_delta_once_and_reports_are_bounded() {
    let mut o = consistent();
    o.unwind_infos.truncate(1);
    // A hostile dump: 1,000 pages over the same 65,535 zero deltas of a
    // class-23 table. The walk stays bounded by the dump.
    o.delta_tables.insert((23, FILE), vec![delta(0, 5); 100]);
    for i in 0..1000u64 {
        o.pages.insert(
            StackDeltaPageKey {
                file_id: FILE.0,
                page: 0x100_0000 + (i << 16),
            },
            StackDeltaPageInfo {
                first_delta: 0,
                num_deltas: u16::MAX,
                map_id: 23,
            },
        );
    }
    let a = audit(&o, 16);
    let zero_slots = a
        .violations
        .iter()
        .filter(|v| v.kind() == "zero_slot")
        .count();
    assert_eq!(zero_slots, PER_FILE_AND_KIND);
    assert!(a.violations.len() <= 8 * PER_FILE_AND_KIND);
}

#[test]
fn reached_indices_cover_each_index_once_and_the_zero_tail_once() {
    let mut ranges = vec![(5, 9), (0, 3), (2, 6), (8, 20)];
    assert_eq!(
        reached_indices(&mut ranges, 10),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    );
    assert_eq!(reached_indices(&mut [(12, 20), (15, 30)], 10), [12]);
    assert_eq!(reached_indices(&mut [(3, 3)], 10), Vec::<u32>::new());
}

#[test]
fn process_mappings_the_bisection_could_miss_are_reported() {
    let m = |start, end| abi::ProcessMapping {
        start,
        end,
        file_offset: 0,
        bias: start,
        file_id: 7,
    };
    let mut o = consistent();
    o.process_mappings.insert(
        10,
        abi::ProcessMappings {
            mappings: vec![m(0x1000, 0x2000), m(0x2000, 0x3000)],
        },
    );
    assert!(audit(&o, 16).is_consistent(), "adjacent ranges are fine");
    for bad in [
        vec![m(0x2000, 0x3000), m(0x1000, 0x2000)],
        vec![m(0x1000, 0x2800), m(0x2000, 0x3000)],
        vec![m(0x1000, 0x1000)],
    ] {
        let mut o = consistent();
        o.process_mappings
            .insert(11, abi::ProcessMappings { mappings: bad });
        assert_eq!(
            only(&o, 16),
            MapViolation::MalformedProcessMappings { pid: 11 }
        );
    }
}
