//! The interpreter_offsets entries of the loaders in the machine: written
//! with the file's load (after the table, before the pages), all or nothing
//! under every fault, deleted when the file is unloaded (upstream weakness
//! 7), a full map an error of that file only, and every loader's answer
//! kept (weakness 11).

use std::sync::Arc;
use std::time::Duration;

use eim_analysis::interp::{InterpreterOffsets, Loaded, LoaderError};
use eim_analysis::{InterpreterData, LibcInfo};
use eim_core::manager::ManualClock;
use eim_core::provider::{Extraction, MemoryProvider};
use eim_core::tracers::LoaderMatch;
use eim_core::Error;
use eim_machine::abi::{program, OffsetRange};
use eim_machine::deltas::info::sp;
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::{Errno, MapKind};
use eim_machine::FileId;
use eim_sim_harness::world::{CheckedManager, CheckedWorld, WorldSpec};
use eim_sim_harness::{check_all, Sources};

const FILE: FileId = FileId(0x9e7);
const OTHER: FileId = FileId(0x07e7);

#[derive(Debug)]
struct Fake(&'static str);

impl InterpreterData for Fake {
    fn loader(&self) -> &'static str {
        self.0
    }
}

fn three_pages(base: u64) -> IntervalData {
    let mut d = IntervalData::new();
    d.add(StackDelta::new(base + 0x100, hint::KEEP, sp(8)));
    d.add(StackDelta::new(base + 0x1_0200, hint::KEEP, sp(24)));
    d.add(StackDelta::new(base + 0x2_0300, hint::KEEP, sp(40)));
    d.add(StackDelta::new(base + 0x2_0340, hint::GAP, info::INVALID));
    d
}

/// One page, a rule no other file uses (so `FILE`'s load writes slots).
fn other() -> IntervalData {
    let mut d = IntervalData::new();
    d.add(StackDelta::new(0x10_0100, hint::KEEP, sp(120)));
    d.add(StackDelta::new(0x10_0140, hint::GAP, info::INVALID));
    d
}

fn python_match(first: std::ops::Range<u64>) -> LoaderMatch {
    LoaderMatch {
        loader: "python",
        outcome: Ok(Loaded::new(
            Fake("python"),
            Some(InterpreterOffsets {
                program: program::PYTHON,
                first,
                second: Some(0x9000..0x9100),
            }),
        )),
    }
}

fn extraction(data: IntervalData, interpreters: Vec<LoaderMatch>) -> Extraction {
    Extraction {
        data,
        libc: LibcInfo::default(),
        interpreters,
    }
}

type Manager = CheckedManager;

struct Setup {
    m: Manager,
    clock: Arc<ManualClock>,
    sources: Arc<Sources>,
    provider: Arc<MemoryProvider>,
}

type Extra = (FileId, IntervalData, Vec<LoaderMatch>);

/// `OTHER` (no interpreter) is loaded; `FILE` (python, with ranges) and the
/// `extra` files are not.
fn setup(offsets_capacity: u32) -> Setup {
    setup_with(offsets_capacity, Vec::new())
}

fn setup_with(offsets_capacity: u32, extra: Vec<Extra>) -> Setup {
    let mut files: Vec<Extra> = vec![
        (
            FILE,
            three_pages(0x40_0000),
            vec![python_match(0x1000..0x2000)],
        ),
        (OTHER, other(), Vec::new()),
    ];
    files.extend(extra);
    let spec = WorldSpec {
        interpreter_offsets: offsets_capacity,
        ..WorldSpec::default()
    };
    let w = CheckedWorld::new(files.iter().map(|(id, d, _)| (*id, d.clone())), &spec);
    for (id, data, matches) in files {
        w.provider.set(id, Ok(extraction(data, matches)));
    }
    let (m, clock, sources, provider) = (w.manager, w.clock, w.sources, w.provider);
    m.add_or_inc_ref(OTHER, &OTHER)
        .expect("load the other file");
    Setup {
        m,
        clock,
        sources,
        provider,
    }
}

fn check(s: &Setup) {
    let state = s.m.state();
    s.m.with_backend(|b| {
        check_all(&state, &b.maps, &s.sources).unwrap();
        assert_eq!(b.violation, None);
    });
}

fn expected_value() -> OffsetRange {
    OffsetRange {
        lower_offset1: 0x1000,
        upper_offset1: 0x2000,
        lower_offset2: 0x9000,
        upper_offset2: 0x9100,
        program_index: program::PYTHON,
        pad: [0; 6],
    }
}

#[test]
fn the_entry_is_written_with_the_load_and_deleted_with_the_unload() {
    let s = setup(32);
    let before = s.m.with_backend(|b| b.maps.ops_applied());
    let info = s.m.add_or_inc_ref(FILE, &FILE).expect("loaded");
    assert_eq!(info.interpreters.len(), 1);
    assert_eq!(
        info.interpreter_data().next().map(|d| d.loader()),
        Some("python")
    );
    assert_eq!(
        s.m.with_backend(|b| b.maps.ops_applied()) - before,
        4,
        "slots, table, offsets, pages"
    );
    let held = s.m.with_backend(|b| b.maps.interpreter_offsets());
    assert_eq!(held.len(), 1);
    assert_eq!(held[&FILE], expected_value());
    check(&s);
    // A second reference shares the entry; the last one removes it.
    s.m.add_or_inc_ref(FILE, &FILE).expect("second reference");
    s.m.remove_or_dec_ref(FILE).expect("released");
    assert_eq!(s.m.with_backend(|b| b.maps.interpreter_offsets().len()), 1);
    s.m.remove_or_dec_ref(FILE).expect("unloaded");
    assert!(
        s.m.with_backend(|b| b.maps.interpreter_offsets().is_empty()),
        "weakness 7"
    );
    check(&s);
    s.m.remove_or_dec_ref(OTHER).expect("unloaded");
    s.m.with_backend(|b| assert!(b.maps.holds_no_file_data()));
}

#[test]
fn a_failure_at_any_op_of_the_load_takes_the_whole_file_back() {
    // Op 2 is the offsets put; ops 0 and 3 are batches that may stop part way.
    let mut injections: Vec<(u64, Option<usize>)> = (0..4).map(|k| (k, None)).collect();
    injections.extend([(0, Some(1)), (0, Some(2)), (3, Some(1)), (3, Some(2))]);
    for (k, after) in injections {
        for errno in [Errno::E2BIG, Errno::ENOMEM] {
            let s = setup(32);
            let maps_before = s.m.with_backend(|b| b.maps.clone());
            s.m.with_backend(|b| match after {
                None => b.maps.fail_op(k, errno),
                Some(n) => b.maps.stop_batch(k, n, errno),
            });
            let what = format!("op {k} after {after:?}, {errno}");
            let err = s.m.add_or_inc_ref(FILE, &FILE).expect_err(&what);
            assert!(
                matches!(err, Error::Kernel { rolled_back: true, errno: e, .. } if e == errno),
                "{what}: {err}"
            );
            if k == 2 {
                assert!(
                    matches!(
                        err,
                        Error::Kernel {
                            map: MapKind::InterpreterOffsets,
                            ..
                        }
                    ),
                    "{what}: {err}"
                );
                assert!(err.to_string().contains("interpreter_offsets"), "{err}");
            }
            s.m.with_backend(|b| assert!(b.maps == maps_before, "{what}: maps changed"));
            check(&s);
            s.clock.advance(Duration::from_secs(91));
            s.m.add_or_inc_ref(FILE, &FILE)
                .unwrap_or_else(|e| panic!("{what}: retry: {e}"));
            assert_eq!(
                s.m.with_backend(|b| b.maps.interpreter_offsets()[&FILE]),
                expected_value()
            );
            check(&s);
        }
    }
}

#[test]
fn an_entry_that_cannot_be_deleted_is_a_leftover_removed_later() {
    let s = setup(32);
    s.m.add_or_inc_ref(FILE, &FILE).expect("loaded");
    // Unload: pages (op 0), offsets (op 1), table (op 2).
    s.m.with_backend(|b| b.maps.fail_op(1, Errno::EBUSY));
    let err =
        s.m.remove_or_dec_ref(FILE)
            .expect_err("offsets delete fails");
    assert!(
        matches!(
            err,
            Error::UnloadIncomplete {
                map: MapKind::InterpreterOffsets,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        s.m.state().book.leftover_ops(),
        2,
        "the offsets, then the table"
    );
    assert_eq!(s.m.with_backend(|b| b.maps.interpreter_offsets().len()), 1);
    check(&s);
    assert_eq!(s.m.retry_leftovers(), 0);
    assert!(s
        .m
        .with_backend(|b| b.maps.interpreter_offsets().is_empty()));
    check(&s);
}

#[test]
fn a_full_map_is_an_error_of_that_file_only() {
    let ids = [FileId(0xa1), FileId(0xa2), FileId(0xa3)];
    let extra = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            let base = 0x100_0000 * (n as u64 + 1);
            (
                *id,
                three_pages(base),
                vec![python_match(base..base + 0x10)],
            )
        })
        .collect();
    let s = setup_with(2, extra);
    s.m.add_or_inc_ref(ids[0], &ids[0]).expect("first");
    s.m.add_or_inc_ref(ids[1], &ids[1]).expect("second");
    let ops = s.m.with_backend(|b| b.maps.ops_applied());
    let err =
        s.m.add_or_inc_ref(ids[2], &ids[2])
            .expect_err("the map is full");
    assert_eq!(
        err,
        Error::MapFull {
            file_id: ids[2],
            map: MapKind::InterpreterOffsets,
            capacity: 2
        }
    );
    assert!(
        err.to_string().contains("interpreter_offsets is full"),
        "{err}"
    );
    assert!(err.to_string().contains(&ids[2].to_string()), "{err}");
    assert_eq!(
        s.m.with_backend(|b| b.maps.ops_applied()),
        ops,
        "nothing written"
    );
    check(&s);
    // Files without ranges still load; the others keep working.
    s.m.remove_or_dec_ref(OTHER).expect("unload other");
    s.m.add_or_inc_ref(OTHER, &OTHER)
        .expect("a file without ranges loads");
    // Room again after an unload: the refused file loads after its deferral.
    s.m.remove_or_dec_ref(ids[0]).expect("unload");
    s.clock.advance(Duration::from_secs(91));
    s.m.add_or_inc_ref(ids[2], &ids[2])
        .expect("third, now that there is room");
    assert_eq!(s.m.with_backend(|b| b.maps.interpreter_offsets().len()), 2);
    check(&s);
}

#[test]
fn every_loader_answer_is_kept_and_an_error_hides_no_match() {
    // Weakness 11: the first loader's error does not hide the second's match.
    let s = setup(32);
    let failed = LoaderMatch {
        loader: "perl",
        outcome: Err(LoaderError::MissingSymbol("PL_version".into())),
    };
    s.provider.set(
        FILE,
        Ok(extraction(
            three_pages(0x40_0000),
            vec![failed.clone(), python_match(0x1000..0x2000)],
        )),
    );
    let info = s.m.add_or_inc_ref(FILE, &FILE).expect("loaded");
    assert_eq!(info.interpreters.len(), 2);
    assert_eq!(info.interpreters[0], failed);
    assert_eq!(info.interpreter_data().count(), 1);
    assert_eq!(
        s.m.with_backend(|b| b.maps.interpreter_offsets()[&FILE]),
        expected_value()
    );
    check(&s);
}

#[test]
fn a_batch_writes_each_files_entry_and_rolls_all_back_on_failure() {
    let second = FileId(0xb2);
    let s = setup_with(
        32,
        vec![(
            second,
            three_pages(0x200_0000),
            vec![python_match(0x5000..0x6000)],
        )],
    );
    // Batch plan: slots, one table op (one class), two offsets puts, pages.
    // Fail the second offsets put: everything of both files goes.
    let maps_before = s.m.with_backend(|b| b.maps.clone());
    s.m.with_backend(|b| b.maps.fail_op(3, Errno::EBUSY));
    let results = s.m.load_many(&[(FILE, &FILE), (second, &second)]);
    for r in &results {
        assert!(
            matches!(
                r,
                Err(Error::Kernel {
                    map: MapKind::InterpreterOffsets,
                    rolled_back: true,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    s.m.with_backend(|b| assert!(b.maps == maps_before, "maps changed"));
    check(&s);
    s.clock.advance(Duration::from_secs(91));
    let results = s.m.load_many(&[(FILE, &FILE), (second, &second)]);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(s.m.with_backend(|b| b.maps.interpreter_offsets().len()), 2);
    check(&s);
    s.m.remove_or_dec_ref(FILE).expect("unload");
    s.m.remove_or_dec_ref(second).expect("unload");
    assert!(s
        .m
        .with_backend(|b| b.maps.interpreter_offsets().is_empty()));
    check(&s);
}
