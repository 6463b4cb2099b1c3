//! Batched loading (`ExecutableInfoManager::load_many`): one plan for many
//! files, one outer-map publication per size class. Checked on `Observed`
//! sim maps (reader safety after every op): the result equals loading the
//! files one by one; every fault position of an errno that concerns the
//! whole batch (each op failing outright, each batch stopping after every
//! possible count) leaves the maps exactly as before with every file of
//! the batch errored; an errno that may concern one element (memory,
//! descriptors, a full map) fails only the files it hits, each with its own
//! error, and everything else loads; known, deferred, repeated and new
//! files mix in one call.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::ManualClock;
use eim_core::provider::MemoryProvider;
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::deltas::IntervalData;
use eim_machine::ops::{Errno, MapOp};
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};
use eim_sim_harness::world::{CheckedManager, CheckedWorld, WorldSpec};
use eim_sim_harness::{check_all, Sources};
use eim_tests::gen::arb_interval_data;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

type Manager = CheckedManager;

/// Deterministic varied files: small ones (class 8) and bigger ones
/// (classes 9 and 10), some sharing rules, a few with empty pages.
fn files(n: usize) -> Vec<(FileId, IntervalData)> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|i| {
            let max_functions = [3, 12, 60, 120][i % 4];
            let data = arb_interval_data(max_functions)
                .new_tree(&mut runner)
                .expect("a value")
                .current();
            (FileId(0x1000 + i as u64 * 7), data)
        })
        .collect()
}

fn setup(files: &[(FileId, IntervalData)]) -> (Manager, Arc<ManualClock>, Arc<Sources>) {
    let spec = WorldSpec {
        spread: 8,
        ..WorldSpec::default()
    };
    let w = CheckedWorld::new(files.iter().cloned(), &spec);
    (w.manager, w.clock, w.sources)
}

fn check(m: &Manager, sources: &Sources, what: &str) {
    let state = m.state();
    m.with_backend(|b| {
        check_all(&state, &b.maps, sources).unwrap_or_else(|v| panic!("{what}: {v}"));
        assert_eq!(b.violation, None, "{what}");
    });
}

/// The classes the loaded files' tables use.
fn classes(m: &Manager) -> BTreeSet<u16> {
    m.state()
        .book
        .loaded()
        .values()
        .map(|t| t.map_ref.map_id)
        .collect()
}

#[test]
fn a_batch_loads_like_one_by_one_with_one_publication_per_class() {
    let files = files(20);
    let ids: Vec<(FileId, FileId)> = files.iter().map(|(id, _)| (*id, *id)).collect();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|(id, elf)| (*id, elf)).collect();

    let (one, _, sources) = setup(&files);
    for (id, elf) in &batch {
        one.add_or_inc_ref(*id, elf).unwrap();
    }
    let (many, _, _) = setup(&files);
    let before = many.with_backend(|b| b.maps.ops_applied());
    let results = many.load_many(&batch);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let ops = many.with_backend(|b| b.maps.ops_applied()) - before;
    let used = classes(&many);
    assert!(used.len() >= 3, "several classes: {used:?}");
    assert_eq!(ops, 2 + used.len() as u64, "slots, one per class, pages");

    check(&many, &sources, "batch");
    one.with_backend(|a| many.with_backend(|b| assert!(a.maps == b.maps, "same maps")));
    let refs = |m: &Manager| -> Vec<(FileId, u64)> {
        m.state().files.iter().map(|(id, e)| (*id, e.rc)).collect()
    };
    assert_eq!(refs(&one), refs(&many));
    assert_eq!(
        one.state().book.loaded(),
        many.state().book.loaded(),
        "same tables, pages and slots"
    );
    // Everything unloads cleanly.
    for (id, _) in &batch {
        many.remove_or_dec_ref(*id).unwrap();
    }
    check(&many, &sources, "unloaded");
    many.with_backend(|b| assert!(b.maps.holds_no_file_data()));
}

/// The ops of the batch plan for `files[skip..]` once `files[..skip]` are
/// loaded one by one (planned on a copy of the book).
fn plan_ops(files: &[(FileId, IntervalData)], skip: usize) -> Vec<MapOp> {
    let (m, _, _) = setup(files);
    for (id, _) in &files[..skip] {
        m.add_or_inc_ref(*id, id).unwrap();
    }
    let datas: Vec<(FileId, &IntervalData)> =
        files[skip..].iter().map(|(id, d)| (*id, d)).collect();
    let mut book = m.state().book;
    let (plan, refused) = book.plan_load_many(&datas);
    assert!(refused.is_empty());
    plan.ops
}

#[test]
fn every_fault_of_a_batch_leaves_the_maps_as_before() {
    let files = files(12);
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let ops = plan_ops(&files, 1);
    let mut injections: Vec<(u64, Option<usize>)> = Vec::new();
    for (k, op) in ops.iter().enumerate() {
        injections.push((k as u64, None));
        for after in 1..op.len() {
            injections.push((k as u64, Some(after)));
        }
    }
    assert!(injections.len() > 20, "{} injections", injections.len());
    for (k, stop_after) in injections {
        let (m, clock, sources) = setup(&files);
        // A file loaded before the batch shares slots with it and must
        // not be disturbed.
        m.add_or_inc_ref(FileId(0x1000), &FileId(0x1000)).unwrap();
        let rest = &batch[1..];
        let maps_before = m.with_backend(|b| b.maps.clone());
        let state_before = m.state();
        // EBUSY says nothing of one element: the whole batch fails.
        let errno = Errno::EBUSY;
        m.with_backend(|b| match stop_after {
            None => b.maps.fail_op(k, errno),
            Some(after) => b.maps.stop_batch(k, after, errno),
        });
        let what = format!("op {k}, stopped after {stop_after:?}");
        let results = m.load_many(rest);
        m.with_backend(|b| b.maps.clear_faults());
        for r in &results {
            assert!(
                matches!(r, Err(Error::Kernel { rolled_back: true, errno: e, .. }) if *e == errno),
                "{what}: {r:?}"
            );
        }
        m.with_backend(|b| {
            assert!(b.maps == maps_before, "{what}: maps changed");
            assert_eq!(b.violation, None, "{what}");
        });
        let state = m.state();
        assert_eq!(
            state.files.keys().collect::<Vec<_>>(),
            state_before.files.keys().collect::<Vec<_>>(),
            "{what}"
        );
        assert_eq!(state.book.loaded(), state_before.book.loaded(), "{what}");
        assert_eq!(
            state.book.slots().in_use(),
            state_before.book.slots().in_use(),
            "{what}"
        );
        assert_eq!(state.book.leftover_ops(), 0, "{what}");
        check(&m, &sources, &what);
        // Deferred now; after the deferral the same batch succeeds.
        assert!(m
            .load_many(rest)
            .iter()
            .all(|r| r.as_ref().is_err_and(Error::is_deferred)));
        clock.advance(Duration::from_secs(91));
        let results = m.load_many(rest);
        assert!(results.iter().all(Result::is_ok), "{what}: retry");
        check(&m, &sources, &what);
    }
}

#[test]
fn a_failing_batch_rollback_leaves_exact_leftovers_finished_later() {
    let files = files(8);
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let ops = plan_ops(&files, 0);
    let pages_op = ops.len() as u64 - 1;
    let (m, clock, sources) = setup(&files);
    // The page batch stops half way; the rollback's page delete (the op
    // right after it) then stops after 1 page: pages and tables stay as
    // leftovers of their files.
    let half = ops.last().unwrap().len() / 2;
    m.with_backend(|b| {
        b.maps.stop_batch(pages_op, half, Errno::EINVAL);
        b.maps.stop_batch(pages_op + 1, 1, Errno::EBUSY);
    });
    let results = m.load_many(&batch);
    assert!(results.iter().all(Result::is_err));
    assert!(results.iter().any(|r| matches!(
        r,
        Err(Error::Kernel {
            rolled_back: false,
            ..
        })
    )));
    let state = m.state();
    assert!(state.book.leftover_ops() > 0);
    check(&m, &sources, "leftovers");
    clock.advance(Duration::from_secs(91));
    assert_eq!(m.retry_leftovers(), 0);
    check(&m, &sources, "retried");
    let results = m.load_many(&batch);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    check(&m, &sources, "reloaded");
}

#[test]
fn known_deferred_repeated_and_new_files_mix_in_one_batch() {
    let files = files(10);
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let (m, _, sources) = setup(&files);
    let (known, deferred) = (ids[0], ids[1]);
    m.add_or_inc_ref(known, &known).unwrap();
    m.with_backend(|b| b.maps.fail_op(0, Errno::ENOMEM));
    assert!(m.add_or_inc_ref(deferred, &deferred).is_err());
    assert!(m.is_deferred(deferred));
    let missing = FileId(0xdead);

    let mut batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    batch.push((ids[4], &ids[4]));
    batch.push((missing, &missing));
    let results = m.load_many(&batch);
    assert!(results[0].is_ok(), "known file: fast path");
    assert_eq!(results[1], Err(Error::Deferred { file_id: deferred }));
    for r in &results[2..10] {
        assert!(r.is_ok(), "{r:?}");
    }
    assert!(
        results[10].is_ok(),
        "a repeated file waits on its own flight"
    );
    assert!(matches!(results[11], Err(Error::Extraction { .. })));
    let state = m.state();
    assert_eq!(state.files[&known].rc, 2);
    assert_eq!(state.files[&ids[4]].rc, 2);
    assert!(!state.files.contains_key(&deferred));
    assert_eq!(state.in_flight, 0);
    check(&m, &sources, "mixed");
}

#[test]
fn a_file_refused_at_planning_does_not_block_the_others() {
    let files = files(6);
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let (m, _, sources) = setup(&files);
    // A failed unload leaves the file's table as a leftover that cannot be
    // removed yet: reloading it is refused (CleanupPending) at planning.
    m.add_or_inc_ref(ids[2], &ids[2]).unwrap();
    m.with_backend(|b| b.maps.fail_op(1, Errno::EBUSY));
    assert!(m.remove_or_dec_ref(ids[2]).is_err());
    // The next call retries the leftover first; make that retry fail too.
    m.with_backend(|b| b.maps.fail_op(0, Errno::EBUSY));
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let results = m.load_many(&batch);
    for (i, r) in results.iter().enumerate() {
        if i == 2 {
            assert_eq!(r, &Err(Error::CleanupPending { file_id: ids[2] }));
        } else {
            assert!(r.is_ok(), "{i}: {r:?}");
        }
    }
    check(&m, &sources, "refused");
    assert!(!m.is_deferred(ids[2]), "cleanup pending is no deferral");
}

/// Loads `files` in one batch with file `bad`'s every write failing with
/// `errno`; checks that only `bad` fails, with that errno, and everything
/// else loads. Returns the map ops the call took.
fn load_with_one_bad_file(
    files: &[(FileId, IntervalData)],
    bad: usize,
    errno: Errno,
    reader_checks: bool,
) -> u64 {
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let (m, _, sources) = setup(files);
    let what = format!("{errno} on file {bad} of {}", files.len());
    m.with_backend(|b| {
        b.reader_checks = reader_checks;
        b.maps.poison_file(ids[bad], errno);
    });
    let ops_before = m.with_backend(|b| b.maps.ops_applied());
    let results = m.load_many(&batch);
    let ops = m.with_backend(|b| b.maps.ops_applied()) - ops_before;
    m.with_backend(|b| b.maps.clear_faults());
    for (i, r) in results.iter().enumerate() {
        if i == bad {
            assert!(
                matches!(r, Err(Error::Kernel { errno: e, rolled_back: true, file_id, .. })
                    if *e == errno && *file_id == ids[bad]),
                "{what}: {r:?}"
            );
        } else {
            assert!(r.is_ok(), "{what}: file {i}: {r:?}");
        }
    }
    assert!(m.is_deferred(ids[bad]), "{what}");
    check(&m, &sources, &what);
    ops
}

/// One file of a batch of 500 whose every write fails with a resource
/// errno (its array's memory or descriptor, its table too big for what is
/// left): only that file fails, with that errno, and the 499 others load.
/// (Reader safety is checked at the end here, after every op in the
/// smaller batch below: the per-op check over 500 files takes minutes.)
#[test]
fn a_resource_error_of_one_element_fails_that_file_alone() {
    let files = files(500);
    for (errno, bad) in [
        (Errno::ENOMEM, 137),
        (Errno::EMFILE, 499),
        (Errno::E2BIG, 0),
    ] {
        let ops = load_with_one_bad_file(&files, bad, errno, false);
        // Two attempts per halving (the half with the bad file fails, the
        // other loads), 2 * 9 + 1 for 500 files, each a few ops per size
        // class; the failing ones also roll back what they published, at
        // most one delete per file, halving each time (under 2n in all).
        // A retry of each file alone would take thousands.
        assert!(ops < 2 * 500 + 40 * (2 * 9 + 1), "{errno}: {ops} ops");
    }
}

/// The same on 24 files, reader safety checked after every op of every
/// attempt and rollback; and a one-off resource failure (not tied to a
/// file) loads everything on the retries.
#[test]
fn a_resource_error_of_one_element_is_isolated_safely_for_readers() {
    let files = files(24);
    for bad in [0, 11, 23] {
        load_with_one_bad_file(&files, bad, Errno::ENOMEM, true);
    }
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let (m, _, sources) = setup(&files);
    m.with_backend(|b| b.maps.fail_op(3, Errno::ENOMEM));
    let results = m.load_many(&batch);
    assert!(results.iter().all(Result::is_ok), "a one-off ENOMEM");
    check(&m, &sources, "one-off");
}

/// Sim maps that remember which files each page write (one per part of a
/// batch: a part's pages go in with one op) was for.
struct PartsSeen {
    maps: SimMaps,
    parts: Vec<BTreeSet<FileId>>,
}

impl eim_machine::ops::Backend for PartsSeen {
    fn apply(&mut self, op: &MapOp) -> Result<(), eim_machine::ops::OpFailure> {
        if let MapOp::PutPages(pages) = op {
            self.parts
                .push(pages.iter().map(|(key, _)| FileId(key.file_id)).collect());
        }
        self.maps.apply(op)
    }
}

#[test]
fn a_batch_is_published_in_parts_of_at_most_batch_bytes_of_deltas() {
    let files = files(40);
    let bytes = |id: &FileId| {
        let (_, data) = files.iter().find(|(f, _)| f == id).expect("a file");
        data.bytes()
    };
    let total: usize = files.iter().map(|(id, _)| bytes(id)).sum();
    let budget = total / 6;
    let provider = Arc::new(MemoryProvider::new());
    for (id, data) in &files {
        provider.insert(*id, data.clone());
    }
    let m = ExecutableInfoManager::with_config(
        provider,
        PartsSeen {
            maps: SimMaps::new(SimConfig::default()).expect("sim maps"),
            parts: Vec::new(),
        },
        Tracers::none(),
        Config {
            batch_bytes: budget,
            ..Config::default()
        },
        Box::new(ManualClock::new()),
    );
    let ids: Vec<FileId> = files.iter().map(|(id, _)| *id).collect();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let results = m.load_many(&batch);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // The same tables as one unbounded batch loads.
    let (whole, _, _) = setup(&files);
    assert!(whole.load_many(&batch).iter().all(Result::is_ok));
    assert_eq!(m.state().book.loaded(), whole.state().book.loaded());
    whole.with_backend(|w| m.with_backend(|b| assert!(w.maps == b.maps, "same maps")));
    let parts = m.with_backend(|b| b.parts.clone());
    assert!(
        parts.len() >= 6,
        "{} parts for 6 budgets of deltas",
        parts.len()
    );
    let mut seen = BTreeSet::new();
    for part in &parts {
        // Files are extracted in batch order; a part is published once it
        // holds the budget, so all its files but its last are under it.
        let sizes: Vec<usize> = ids
            .iter()
            .filter(|id| part.contains(id))
            .map(bytes)
            .collect();
        let before_last: usize = sizes[..sizes.len() - 1].iter().sum();
        assert!(before_last < budget, "{sizes:?} over {budget}");
        assert!(
            part.iter().all(|id| seen.insert(*id)),
            "a file in two parts"
        );
    }
    assert_eq!(
        seen,
        m.state()
            .book
            .loaded()
            .keys()
            .copied()
            .collect::<BTreeSet<_>>()
    );
}
