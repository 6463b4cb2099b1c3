//! loom models of the facade's races: every interleaving of a few threads
//! (up to a preemption bound) over the shard locks, the flights, the kernel
//! side lock and the deferred set.
//!
//! Run with `core/loom-ci` (or
//! `RUSTFLAGS="--cfg loom" cargo test -p eim-core --test loom`); without
//! `--cfg loom` this file is empty.
//!
//! Each model checks outcomes that a broken facade would violate in some
//! interleaving: the number of extractions (single flight), the reference
//! count, the info every caller gets, deferral seen the same way by all
//! callers, and a kernel that holds exactly the tables the book says.
//!
//! The manager's primitives come from its sync shim (loom's under `--cfg
//! loom`), so these models run the production code: the batch load's
//! extractor thread and its handoff of parts to the publisher included.
#![cfg(loom)]

use std::collections::BTreeSet;
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use eim_analysis::{LibcInfo, TsdInfo};
use eim_core::manager::ManualClock;
use eim_core::provider::{ExtractError, ExtractErrorKind, Extraction, Provider};
use eim_core::{Config, Error, ExecutableInfo, ExecutableInfoManager, Tracers};
use eim_machine::deltas::info::sp;
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::{Backend, MapOp, OpFailure};
use eim_machine::FileId;

const FILE: FileId = FileId(0x10ad);
const AGE: Duration = Duration::from_secs(5);

/// What the provider answers.
#[derive(Clone, Copy)]
enum Answer {
    Data,
    /// Not an ELF file: deferred.
    Broken,
}

/// Counts its extractions with a loom atomic, so the count is part of the
/// modelled state.
struct Counting {
    answer: Answer,
    extractions: AtomicUsize,
}

impl Counting {
    fn new(answer: Answer) -> Self {
        Self {
            answer,
            extractions: AtomicUsize::new(0),
        }
    }
}

fn deltas() -> IntervalData {
    let mut d = IntervalData::new();
    d.add(StackDelta::new(0x1000, hint::KEEP, sp(8)));
    d.add(StackDelta::new(0x1040, hint::NONE, sp(16)));
    d.add(StackDelta::new(0x1100, hint::GAP, info::INVALID));
    d
}

/// A C-library record no default info has, so "every caller got the
/// extraction's info" is a real check.
fn libc() -> LibcInfo {
    LibcInfo {
        tsd: Some(TsdInfo {
            offset: 0x1d8,
            multiplier: 8,
            indirect: 1,
        }),
        dtv: None,
    }
}

impl Provider for Counting {
    type Elf = FileId;

    fn extract(&self, id: &FileId) -> Result<Extraction, ExtractError> {
        self.extractions.fetch_add(1, Ordering::SeqCst);
        match self.answer {
            Answer::Data => Ok(Extraction {
                data: deltas(),
                libc: libc(),
                interpreters: Vec::new(),
            }),
            Answer::Broken => Err(ExtractError::new(
                ExtractErrorKind::Invalid,
                id.to_string(),
                "not an ELF file",
            )),
        }
    }
}

/// The delta tables a kernel holds (the only thing these models compare):
/// a table is published and removed by whole ops, never half.
#[derive(Default)]
struct Tables(BTreeSet<FileId>);

impl Backend for Tables {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        match op {
            MapOp::PutDeltaTable { file_id, .. } => {
                self.0.insert(*file_id);
            }
            MapOp::PutDeltaTables { tables, .. } => self.0.extend(tables.iter().map(|t| t.0)),
            MapOp::DeleteDeltaTable { file_id, .. } => {
                self.0.remove(file_id);
            }
            _ => {}
        }
        Ok(())
    }
}

type Manager = ExecutableInfoManager<std::sync::Arc<Counting>, Tables>;

struct Fixture {
    manager: Arc<Manager>,
    provider: std::sync::Arc<Counting>,
    clock: std::sync::Arc<ManualClock>,
}

fn fixture(answer: Answer) -> Fixture {
    fixture_with(answer, Config::default().batch_bytes)
}

fn fixture_with(answer: Answer, batch_bytes: usize) -> Fixture {
    let provider = std::sync::Arc::new(Counting::new(answer));
    let clock = std::sync::Arc::new(ManualClock::new());
    let config = Config {
        // One shard keeps the model small; the shard is what the racing
        // callers share anyway.
        shards: 1,
        batch_bytes,
        ..Config::default()
    };
    let manager = Arc::new(ExecutableInfoManager::with_config(
        provider.clone(),
        Tables::default(),
        Tracers::none(),
        config,
        Box::new(clock.clone()),
    ));
    Fixture {
        manager,
        provider,
        clock,
    }
}

impl Fixture {
    fn extractions(&self) -> usize {
        self.provider.extractions.load(Ordering::SeqCst)
    }

    /// The file's reference count, None if unknown.
    fn rc(&self) -> Option<u64> {
        self.manager.state().files.get(&FILE).map(|e| e.rc)
    }

    /// Quiescent-point checks: nothing in flight, and the kernel holds the
    /// tables of exactly the files the book has loaded, which are exactly
    /// the known files.
    fn check_quiescent(&self) {
        let state = self.manager.state();
        assert_eq!(state.in_flight, 0, "a flight outlived its callers");
        let kernel: BTreeSet<FileId> = self.manager.with_backend(|b| b.0.clone());
        let book: BTreeSet<FileId> = state.book.loaded().keys().copied().collect();
        let known: BTreeSet<FileId> = state.files.keys().copied().collect();
        assert_eq!(kernel, book, "kernel and book disagree");
        assert_eq!(book, known, "a known file without a table or the reverse");
    }

    fn spawn_add(&self) -> thread::JoinHandle<Result<ExecutableInfo, Error>> {
        let m = self.manager.clone();
        thread::spawn(move || m.add_or_inc_ref(FILE, &FILE))
    }
}

fn extracted_info() -> ExecutableInfo {
    ExecutableInfo {
        interpreters: Vec::new().into(),
        libc: libc(),
    }
}

/// Explores every interleaving, or with `Some(n)` every one with at most n
/// preemptions (`LOOM_MAX_PREEMPTIONS` overrides a bound). Two-thread
/// models here are small enough to run unbounded. Prints the number of
/// executions explored, so a model that stopped exploring shows in the log.
fn model(name: &str, preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = preemptions;
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom: {name}: {runs} executions");
    assert!(runs > 1, "{name}: nothing to interleave");
}

/// N callers add the same new file: one extraction, every caller gets its
/// info, the count is N.
fn concurrent_adds(callers: usize) {
    let f = fixture(Answer::Data);
    // The main thread is a caller too: loom counts it among its threads.
    let others: Vec<_> = (1..callers).map(|_| f.spawn_add()).collect();
    let mut results = vec![f.manager.add_or_inc_ref(FILE, &FILE)];
    results.extend(others.into_iter().map(|h| h.join().expect("caller")));
    for r in results {
        assert_eq!(r.expect("every caller succeeds"), extracted_info());
    }
    assert_eq!(f.extractions(), 1, "the file was extracted more than once");
    assert_eq!(f.rc(), Some(callers as u64));
    f.check_quiescent();
}

#[test]
fn two_callers_share_one_extraction() {
    model("two adds", None, || concurrent_adds(2));
}

#[test]
fn three_callers_share_one_extraction() {
    model("three adds", Some(4), || concurrent_adds(3));
}

/// The last reference is released while another caller adds the file:
/// either the add comes first (one extraction, the release leaves one
/// reference) or the release unloads it and the add loads it again (a
/// second extraction). Either way the file ends loaded with one reference.
#[test]
fn add_racing_remove_of_the_last_reference() {
    model("add vs remove", None, || {
        let f = fixture(Answer::Data);
        f.manager.add_or_inc_ref(FILE, &FILE).expect("first load");
        let m = f.manager.clone();
        let remover = thread::spawn(move || m.remove_or_dec_ref(FILE));
        let added = f.manager.add_or_inc_ref(FILE, &FILE);
        remover.join().expect("remover").expect("release");
        assert_eq!(added.expect("add"), extracted_info());
        assert!(
            (1..=2).contains(&f.extractions()),
            "{} extractions",
            f.extractions()
        );
        assert_eq!(f.rc(), Some(1));
        f.check_quiescent();
    });
}

/// An unused file is old enough for the delayed cleanup when a caller adds
/// it again: either the add revives it (nothing unloaded, no extraction) or
/// the cleanup unloads it first and the add loads it anew. The number of
/// extractions tells which, and must match what the cleanup reports.
#[test]
fn add_racing_the_delayed_cleanup() {
    model("add vs cleanup", None, || {
        let f = fixture(Answer::Data);
        f.manager.add_or_inc_ref(FILE, &FILE).expect("first load");
        f.manager.dec_ref(FILE).expect("release");
        f.clock.advance(AGE * 2);
        let m = f.manager.clone();
        let cleaner = thread::spawn(move || m.cleanup_unused(AGE));
        let added = f.manager.add_or_inc_ref(FILE, &FILE);
        let report = cleaner.join().expect("cleaner");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(added.expect("add"), extracted_info());
        assert_eq!(
            f.extractions(),
            1 + report.unloaded,
            "extractions vs unloads"
        );
        assert_eq!(f.rc(), Some(1));
        let entry = f.manager.state().files[&FILE].clone();
        assert_eq!(entry.unused_since, None, "a used file is marked unused");
        f.check_quiescent();
    });
}

/// Two callers add a file whose extraction fails. The failure must be
/// extracted once and seen consistently: a caller that shared the flight
/// gets the extraction error, one that came later finds the file deferred;
/// no caller may start a second extraction in between.
#[test]
fn a_failing_extraction_racing_a_second_caller() {
    model("failing extraction", None, || {
        let f = fixture(Answer::Broken);
        let other = f.spawn_add();
        let mine = f.manager.add_or_inc_ref(FILE, &FILE);
        let theirs = other.join().expect("caller");
        let mut extraction_errors = 0;
        for r in [mine, theirs] {
            match r {
                Err(Error::Extraction { file_id, .. }) => {
                    assert_eq!(file_id, FILE);
                    extraction_errors += 1;
                }
                Err(Error::Deferred { file_id }) => assert_eq!(file_id, FILE),
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert!(extraction_errors >= 1, "nobody saw the extraction fail");
        assert_eq!(f.extractions(), 1, "a deferred file was extracted again");
        assert!(f.manager.is_deferred(FILE));
        assert_eq!(f.rc(), None);
        f.check_quiescent();
    });
}

/// A batch load and a single add of the same new file: whichever registers
/// the flight extracts, the other waits for it; one extraction, two
/// references, the same info for both.
#[test]
fn a_batch_load_racing_an_add() {
    model("batch vs add", None, || {
        let f = fixture(Answer::Data);
        let m = f.manager.clone();
        let batch = thread::spawn(move || m.load_many(&[(FILE, &FILE)]));
        let added = f.manager.add_or_inc_ref(FILE, &FILE);
        let batched = batch.join().expect("batch");
        assert_eq!(batched.len(), 1);
        for r in batched.into_iter().chain([added]) {
            assert_eq!(r.expect("both succeed"), extracted_info());
        }
        assert_eq!(f.extractions(), 1, "the file was extracted more than once");
        assert_eq!(f.rc(), Some(2));
        f.check_quiescent();
    });
}

/// The batch pipeline as it runs: two new files, each its own part (a part
/// ends at every file here), extracted on the extractor thread while this
/// thread publishes the part before; meanwhile a reader takes and drops a
/// reference on the first file. Every file the batch returns is loaded and
/// stays loaded while referenced (a reader holding a reference finds its
/// table), the references add up, and at rest the kernel holds exactly
/// the known files' tables. The reader's release may unload the first
/// file before the batch takes it, which then extracts it again.
#[test]
fn a_batch_pipeline_racing_a_reader_and_a_remove() {
    const OTHER: FileId = FileId(0x10ae);
    model("pipeline vs reader", Some(4), || {
        let f = fixture_with(Answer::Data, 1);
        let m = f.manager.clone();
        let reader = thread::spawn(move || {
            let info = m.add_or_inc_ref(FILE, &FILE);
            let loaded = m.with_backend(|b| b.0.contains(&FILE));
            let released = m.remove_or_dec_ref(FILE);
            (info, loaded, released)
        });
        let batched = f.manager.load_many(&[(FILE, &FILE), (OTHER, &OTHER)]);
        let held: BTreeSet<FileId> = f.manager.with_backend(|b| b.0.clone());
        let (info, loaded, released) = reader.join().expect("reader");
        assert_eq!(batched.len(), 2);
        for r in batched {
            assert_eq!(r.expect("the batch succeeds"), extracted_info());
        }
        assert!(
            held.contains(&FILE) && held.contains(&OTHER),
            "a file the batch returned is not loaded: {held:?}"
        );
        assert_eq!(info.expect("the reader succeeds"), extracted_info());
        assert!(loaded, "a referenced file's table is gone");
        released.expect("the reader's release");
        assert!(
            (2..=3).contains(&f.extractions()),
            "{} extractions",
            f.extractions()
        );
        let state = f.manager.state();
        assert_eq!(state.files.get(&FILE).map(|e| e.rc), Some(1));
        assert_eq!(state.files.get(&OTHER).map(|e| e.rc), Some(1));
        f.check_quiescent();
    });
}
