//! The facade's contract: reference counting, single-flight extraction,
//! deferral, synthetic data, delayed unloading, metrics and error messages.

use eim_machine::deltas::info::sp;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use eim_analysis::LibcInfo;
use eim_core::manager::{Clock, ManualClock};
use eim_core::metrics;
use eim_core::provider::{ExtractError, ExtractErrorKind, Extraction, MemoryProvider, Provider};
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::{Backend, Errno, MapOp, OpFailure};
use eim_machine::FileId;

/// Records ops; fails the op with the given number (counted from 0) once.
#[derive(Default, Clone)]
struct Recorder {
    log: Arc<Mutex<Vec<MapOp>>>,
    fail_at: Arc<Mutex<Option<(usize, Errno)>>>,
}

impl Backend for Recorder {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        let mut log = self.log.lock().unwrap();
        let mut fail = self.fail_at.lock().unwrap();
        if let Some((n, errno)) = *fail {
            if n == 0 {
                *fail = None;
                return Err(OpFailure::new(errno, 0));
            }
            *fail = Some((n - 1, errno));
        }
        log.push(op.clone());
        Ok(())
    }
}

impl Recorder {
    fn names(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().iter().map(MapOp::name).collect()
    }
}

fn data(seed: i32) -> IntervalData {
    IntervalData::from_deltas(vec![
        StackDelta::new(0x1000, hint::KEEP, sp(8 * seed)),
        StackDelta::new(0x1010, hint::GAP, info::INVALID),
    ])
}

type Manager<P> = ExecutableInfoManager<P, Recorder>;

fn manager<P: Provider>(provider: P) -> (Manager<P>, Recorder, Arc<ManualClock>) {
    let backend = Recorder::default();
    let clock = Arc::new(ManualClock::new());
    let m = ExecutableInfoManager::with_config(
        provider,
        backend.clone(),
        Tracers::none(),
        Config::default(),
        Box::new(clock.clone()),
    );
    (m, backend, clock)
}

#[test]
fn references_share_one_load_and_the_last_one_unloads() {
    let provider = MemoryProvider::new();
    provider.insert(FileId(1), data(1));
    let (m, backend, _) = manager(provider);
    m.add_or_inc_ref(FileId(1), &FileId(1)).unwrap();
    m.add_or_inc_ref(FileId(1), &FileId(1)).unwrap();
    assert_eq!(
        backend.names(),
        ["put unwind infos", "put delta table", "put pages"]
    );
    m.remove_or_dec_ref(FileId(1)).unwrap();
    assert_eq!(backend.names().len(), 3, "one reference remains");
    m.remove_or_dec_ref(FileId(1)).unwrap();
    assert_eq!(
        &backend.names()[3..],
        ["delete pages", "delete delta table"]
    );
    let err = m.remove_or_dec_ref(FileId(1)).unwrap_err();
    assert_eq!(err, Error::Unknown { file_id: FileId(1) });
    assert!(err.to_string().contains("0000000000000001"), "{err}");
}

/// A provider that holds every extraction until all callers have arrived.
struct Gate {
    barrier: Barrier,
    calls: AtomicUsize,
    fail: bool,
}

impl Provider for Gate {
    type Elf = ();
    fn extract(&self, _: &()) -> Result<Extraction, ExtractError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        // Give the other callers time to queue up behind this extraction.
        std::thread::sleep(Duration::from_millis(50));
        if self.fail {
            return Err(ExtractError::new(
                ExtractErrorKind::Invalid,
                "/gate",
                "broken",
            ));
        }
        Ok(Extraction {
            data: data(1),
            libc: LibcInfo::default(),
            interpreters: Vec::new(),
        })
    }
}

type RaceOutcome = (
    Vec<Result<eim_core::ExecutableInfo, Error>>,
    usize,
    Arc<Manager<Arc<Gate>>>,
);

fn race(fail: bool) -> RaceOutcome {
    const THREADS: usize = 4;
    let gate = Arc::new(Gate {
        barrier: Barrier::new(THREADS),
        calls: AtomicUsize::new(0),
        fail,
    });
    let (m, _, _) = manager(gate.clone());
    let m = Arc::new(m);
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (m, gate) = (m.clone(), gate.clone());
            std::thread::spawn(move || {
                gate.barrier.wait();
                m.add_or_inc_ref(FileId(9), &())
            })
        })
        .collect();
    let results = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (results, gate.calls.load(Ordering::SeqCst), m)
}

#[test]
fn concurrent_callers_share_one_extraction() {
    let (results, calls, m) = race(false);
    assert!(results.iter().all(Result::is_ok));
    // Callers that arrive after the load took the fast path; either way one extraction.
    assert_eq!(calls, 1);
    assert_eq!(m.state().files[&FileId(9)].rc, 4);
}

#[test]
fn concurrent_callers_see_one_failure_and_then_the_deferral() {
    let (results, calls, m) = race(true);
    assert_eq!(
        calls, 1,
        "a failed extraction is not repeated by the waiters"
    );
    for r in &results {
        let e = r.as_ref().unwrap_err();
        assert!(
            matches!(e, Error::Extraction { .. } | Error::Deferred { .. }),
            "{e}"
        );
    }
    assert!(m.is_deferred(FileId(9)));
}

#[test]
fn failures_are_deferred_for_the_ttl_but_vanished_files_are_not() {
    let provider = MemoryProvider::new();
    provider.set(
        FileId(1),
        Err(ExtractError::new(
            ExtractErrorKind::Invalid,
            "/bad",
            "garbage",
        )),
    );
    let (m, _, clock) = manager(provider);
    assert!(matches!(
        m.add_or_inc_ref(FileId(1), &FileId(1)),
        Err(Error::Extraction { .. })
    ));
    assert_eq!(
        m.add_or_inc_ref(FileId(1), &FileId(1)).unwrap_err(),
        Error::Deferred { file_id: FileId(1) }
    );
    clock.advance(Duration::from_secs(90));
    assert!(matches!(
        m.add_or_inc_ref(FileId(1), &FileId(1)),
        Err(Error::Extraction { .. })
    ));
    // FileId(2) is unknown to the provider: NotFound, never deferred.
    for _ in 0..3 {
        let e = m.add_or_inc_ref(FileId(2), &FileId(2)).unwrap_err();
        assert!(
            matches!(e, Error::Extraction { ref cause, .. } if cause.is_not_found()),
            "{e}"
        );
    }
    let mut summary = metrics::Summary::new();
    m.update_metric_summary(&mut summary);
    assert_eq!(summary[&metrics::STACK_DELTA_PROVIDER_EXTRACTION_ERROR], 2);
    assert_eq!(summary[&metrics::STACK_DELTA_PROVIDER_SUCCESS], 0);
}

#[test]
fn a_kernel_failure_names_the_map_and_errno_and_is_deferred() {
    let provider = MemoryProvider::new();
    provider.insert(FileId(3), data(1));
    let (m, backend, _) = manager(provider);
    *backend.fail_at.lock().unwrap() = Some((2, Errno::E2BIG));
    let e = m.add_or_inc_ref(FileId(3), &FileId(3)).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("0000000000000003"), "{text}");
    assert!(text.contains("stack_delta_page_to_info"), "{text}");
    assert!(text.contains("E2BIG"), "{text}");
    assert!(text.contains("nothing it wrote is left in use"), "{text}");
    // The rollback removed the table and zeroed the slot.
    assert_eq!(
        &backend.names()[2..],
        ["delete delta table", "put unwind infos"]
    );
    assert!(m.is_deferred(FileId(3)));
    assert!(m.state().files.is_empty());
}

#[test]
fn synthetic_data_loads_once() {
    let (m, backend, _) = manager(MemoryProvider::new());
    m.add_synth_interval_data(FileId(5), &data(2)).unwrap();
    assert_eq!(
        m.add_synth_interval_data(FileId(5), &data(2)).unwrap_err(),
        Error::AlreadyLoaded { file_id: FileId(5) }
    );
    // A later mapping of the same file takes a reference on it.
    m.add_or_inc_ref(FileId(5), &FileId(5)).unwrap();
    m.remove_or_dec_ref(FileId(5)).unwrap();
    m.remove_or_dec_ref(FileId(5)).unwrap();
    assert_eq!(backend.names().len(), 5);
    assert!(m.state().book.loaded().is_empty());
}

#[test]
fn delayed_unloading_waits_for_the_age() {
    let provider = MemoryProvider::new();
    provider.insert(FileId(1), data(1));
    provider.insert(FileId(2), data(2));
    let (m, backend, clock) = manager(provider);
    m.add_or_inc_ref(FileId(1), &FileId(1)).unwrap();
    m.add_or_inc_ref(FileId(2), &FileId(2)).unwrap();
    m.dec_ref(FileId(1)).unwrap();
    clock.advance(Duration::from_secs(200));
    m.dec_ref(FileId(2)).unwrap();
    assert_eq!(
        m.dec_ref(FileId(2)).unwrap_err(),
        Error::NoReference { file_id: FileId(2) }
    );
    let report = m.cleanup_unused(Duration::from_secs(300));
    assert_eq!(report.unloaded, 0);
    clock.advance(Duration::from_secs(100));
    let report = m.cleanup_unused(Duration::from_secs(300));
    assert_eq!(report.unloaded, 1);
    assert!(report.errors.is_empty());
    // The second file is revived by a new reference before its time comes.
    m.add_or_inc_ref(FileId(2), &FileId(2)).unwrap();
    clock.advance(Duration::from_secs(1000));
    assert_eq!(m.cleanup_unused(Duration::from_secs(300)).unloaded, 0);
    let state = m.state();
    assert_eq!(state.files.len(), 1);
    assert_eq!(state.files[&FileId(2)].rc, 1);
    assert_eq!(
        backend.names().len(),
        8,
        "two loads of 3 ops and one unload of 2"
    );
}

#[test]
fn metrics_count_what_is_loaded() {
    let provider = MemoryProvider::new();
    provider.insert(FileId(1), data(1));
    provider.insert(FileId(2), data(2));
    provider.insert(FileId(3), IntervalData::new());
    let (m, _, _) = manager(provider);
    for id in 1..=3 {
        m.add_or_inc_ref(FileId(id), &FileId(id)).unwrap();
    }
    let mut s = metrics::Summary::new();
    m.update_metric_summary(&mut s);
    assert_eq!(
        s[&metrics::NUM_EXE_ID_LOADED_TO_EBPF],
        2,
        "a file without deltas has no table"
    );
    assert_eq!(s[&metrics::UNWIND_INFO_ARRAY_SIZE], 2);
    assert_eq!(s[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES], 2);
    assert_eq!(s[&metrics::STACK_DELTA_PROVIDER_SUCCESS], 3);
    m.update_metric_summary(&mut s);
    assert_eq!(
        s[&metrics::STACK_DELTA_PROVIDER_SUCCESS],
        0,
        "reset by the read"
    );
}

#[test]
fn the_clock_is_the_callers() {
    let clock = ManualClock::new();
    let t0 = clock.now();
    clock.advance(Duration::from_secs(5));
    assert_eq!(clock.now().0 - t0.0, Duration::from_secs(5));
}

#[test]
fn the_manager_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ExecutableInfoManager<MemoryProvider, Recorder>>();
}
