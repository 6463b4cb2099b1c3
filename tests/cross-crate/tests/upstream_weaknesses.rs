//! Upstream's known weaknesses (spec, "Known weaknesses upstream") that
//! eim must not have, one named test each. Each test drives eim into the
//! situation that breaks upstream and shows that eim stays consistent.

use eim_machine::deltas::info::sp;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eim_core::manager::ManualClock;
use eim_core::metrics;
use eim_core::provider::{ExtractError, Extraction, MemoryProvider, Provider};
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::encode::EncodeError;
use eim_machine::ops::Errno;
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};
use eim_sim_harness::world::{CheckedWorld, WorldSpec};
use eim_sim_harness::{check_all, Observed, Sources};

/// `pages` pages, one function each.
fn file(pages: u64, seed: i32) -> IntervalData {
    let mut d = IntervalData::new();
    for p in 0..pages {
        let base = 0x40_0000 + (p << 16);
        d.add(StackDelta::new(base + 0x10, hint::KEEP, sp(8 * seed)));
        d.add(StackDelta::new(base + 0x14, hint::NONE, sp(8 * seed + 16)));
        d.add(StackDelta::new(base + 0x80, hint::GAP, info::INVALID));
    }
    d
}

struct World {
    m: ExecutableInfoManager<Arc<MemoryProvider>, Observed>,
    clock: Arc<ManualClock>,
    sources: Arc<Sources>,
}

impl World {
    fn new(files: &[(FileId, IntervalData)]) -> Self {
        Self::with_slots(files, SimConfig::default().unwind_info)
    }

    /// A world whose `unwind_info_array` has `slots` entries. The backend
    /// also watches slot reuse with the default grace on the manager's clock.
    fn with_slots(files: &[(FileId, IntervalData)], slots: u32) -> Self {
        let spec = WorldSpec {
            unwind_slots: slots,
            spread: 16,
            watch_slots: Some(Config::default().slot_grace),
            ..WorldSpec::default()
        };
        let w = CheckedWorld::new(files.iter().cloned(), &spec);
        Self {
            m: w.manager,
            clock: w.clock,
            sources: w.sources,
        }
    }

    fn check(&self) {
        let state = self.m.state();
        self.m.with_backend(|b| {
            assert_eq!(b.violation, None);
            check_all(&state, &b.maps, &self.sources).unwrap();
        });
    }

    fn add(&self, id: FileId) -> Result<eim_core::ExecutableInfo, Error> {
        self.m.add_or_inc_ref(id, &id)
    }
}

const A: FileId = FileId(0xa);
const B: FileId = FileId(0xb);

/// Upstream removes the outer entry with map id 0 after a failed page write,
/// which the handler rejects, so the table leaks and the retry hits EEXIST.
#[test]
fn weakness_01_a_failed_page_write_removes_the_table_it_published() {
    let w = World::new(&[(A, file(3, 1))]);
    w.m.with_backend(|b| b.maps.fail_op(2, Errno::ENOMEM));
    assert!(w.add(A).is_err());
    w.m.with_backend(|b| {
        assert_eq!(b.maps.table_count(), 0, "no orphan outer-map entry");
        assert_eq!(b.maps.live_inner_maps(), 0);
    });
    w.check();
    w.clock.advance(Duration::from_secs(91));
    w.add(A).expect("the retry finds no stale entry in its way");
    w.check();
}

/// Upstream never deletes the pages a stopped batch did write.
#[test]
fn weakness_02_pages_of_a_stopped_batch_are_removed_again() {
    for after in 1..3 {
        let w = World::new(&[(A, file(3, 1))]);
        w.m.with_backend(|b| b.maps.stop_batch(2, after, Errno::E2BIG));
        assert!(w.add(A).is_err());
        w.m.with_backend(|b| assert!(b.maps.pages().is_empty(), "{after} pages left behind"));
        w.check();
    }
}

/// Upstream's page batch asks for NOEXIST, which the kernel ignores, so it
/// silently overwrites. eim never writes a page that is present: the
/// machine refuses while its own leftovers occupy the keys, and the backend
/// checks absence itself.
#[test]
fn weakness_03_a_present_page_is_never_overwritten() {
    let w = World::new(&[(A, file(3, 1))]);
    w.add(A).unwrap();
    // The unload fails after removing one page: two stay, as leftovers.
    w.m.with_backend(|b| {
        b.maps.stop_batch(0, 1, Errno::EBUSY);
        b.maps.fail_op(1, Errno::EBUSY);
    });
    assert!(w.m.remove_or_dec_ref(A).is_err());
    let leftover_pages = w.m.with_backend(|b| b.maps.pages());
    assert_eq!(leftover_pages.len(), 2);
    // Reloading while the removal keeps failing must not touch those keys.
    w.m.with_backend(|b| b.maps.fail_op(0, Errno::EBUSY));
    assert_eq!(w.add(A).unwrap_err(), Error::CleanupPending { file_id: A });
    w.m.with_backend(|b| assert_eq!(b.maps.pages(), leftover_pages));
    w.check();
    // The backend itself refuses a present key with EEXIST, leaving it as is.
    let mut maps = SimMaps::new(SimConfig::default()).unwrap();
    let key = *leftover_pages.keys().next().unwrap();
    let first = eim_machine::abi::StackDeltaPageInfo {
        first_delta: 1,
        num_deltas: 2,
        map_id: 8,
    };
    let second = eim_machine::abi::StackDeltaPageInfo {
        first_delta: 9,
        ..first
    };
    use eim_machine::ops::{Backend, MapOp};
    maps.apply(&MapOp::PutPages(vec![(key, first)])).unwrap();
    let err = maps
        .apply(&MapOp::PutPages(vec![(key, second)]))
        .unwrap_err();
    assert_eq!(err.errno, Errno::EEXIST);
    assert_eq!(maps.page(&key), Some(first));
    // Once the removal succeeds, the file loads again.
    assert_eq!(w.m.retry_leftovers(), 0);
    w.add(A).unwrap();
    w.check();
}

/// Upstream queues the outer insert before filling the inner array and
/// never cancels it. eim publishes a table only once it is filled.
#[test]
fn weakness_04_a_table_that_cannot_be_filled_is_never_published() {
    let w = World::new(&[(A, file(3, 1))]);
    // Slots are written (op 0); the table op fails.
    w.m.with_backend(|b| b.maps.fail_op(1, Errno::ENOMEM));
    assert!(w.add(A).is_err());
    w.m.with_backend(|b| {
        assert_eq!(b.maps.table_count(), 0);
        assert_eq!(
            b.maps.live_inner_maps(),
            0,
            "the unfilled inner array is freed"
        );
        assert!(b.maps.is_pristine(), "slots are zeroed again too");
    });
    w.check();
}

/// Upstream never frees `unwind_info_array` slots: a host that keeps seeing
/// new binaries fills the array, and from then on every file needing a new
/// rule fails. eim reclaims the slots of unloaded files once no reader can
/// reach them: here 40 binaries with 2 rules each of their own pass through
/// a 6-slot array (upstream fails the fourth), and the metric counts only
/// the slots loaded files use.
#[test]
fn weakness_06_unwind_slots_of_unloaded_files_are_reused() {
    let binaries: Vec<(FileId, IntervalData)> = (0..40)
        .map(|k| (FileId(0x600 + k), file(1, 10 + 4 * k as i32)))
        .collect();
    let w = World::with_slots(&binaries, 6);
    let mut s = metrics::Summary::new();
    for (k, (id, _)) in binaries.iter().enumerate() {
        w.add(*id)
            .unwrap_or_else(|e| panic!("binary {k} of {}: {e}", binaries.len()));
        w.m.update_metric_summary(&mut s);
        assert_eq!(s[&metrics::UNWIND_INFO_ARRAY_SIZE], 2, "binary {k}");
        w.m.remove_or_dec_ref(*id).unwrap();
        w.clock
            .advance(eim_machine::machine::slots::DEFAULT_SLOT_GRACE / 2);
        w.check();
    }
    w.m.update_metric_summary(&mut s);
    assert_eq!(s[&metrics::UNWIND_INFO_ARRAY_SIZE], 0);
}

/// Upstream keeps an entry with rc 1 when a page delete fails, though the
/// caller has dropped it: a zombie whose data is partly gone. eim releases
/// the reference, records what stays in the kernel, and removes it later.
#[test]
fn weakness_08_a_failed_unload_leaves_no_zombie() {
    let w = World::new(&[(A, file(3, 1)), (B, file(1, 4))]);
    w.add(A).unwrap();
    w.add(B).unwrap();
    w.m.with_backend(|b| b.maps.stop_batch(0, 1, Errno::EBUSY));
    let err = w.m.remove_or_dec_ref(A).unwrap_err();
    assert!(
        matches!(err, Error::UnloadIncomplete { entries: 3, .. }),
        "{err}"
    );
    assert!(!w.m.state().files.contains_key(&A), "no zombie entry");
    w.check();
    let mut s = metrics::Summary::new();
    w.m.update_metric_summary(&mut s);
    assert_eq!(
        s[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES],
        1,
        "only B's page"
    );
    assert_eq!(s[&metrics::NUM_EXE_ID_LOADED_TO_EBPF], 1);
    // Other files are not blocked, and a new reference reloads A cleanly.
    w.m.remove_or_dec_ref(B).unwrap();
    w.add(A).unwrap();
    w.check();
    w.m.update_metric_summary(&mut s);
    assert_eq!(
        s[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES],
        3,
        "not drifted by the failure"
    );
    // Delayed unloading: one failing file does not stop the others.
    w.add(B).unwrap();
    w.m.dec_ref(A).unwrap();
    w.m.dec_ref(B).unwrap();
    w.clock.advance(Duration::from_secs(600));
    w.m.with_backend(|b| b.maps.fail_op(0, Errno::EBUSY));
    let report = w.m.cleanup_unused(Duration::from_secs(300));
    assert_eq!(report.unloaded, 2);
    assert_eq!(report.errors.len(), 1);
    w.check();
    assert_eq!(w.m.retry_leftovers(), 0);
    w.m.with_backend(|b| assert!(b.maps.holds_no_file_data()));
}

/// A V8-like file: a function, an end marker with the gap hint, 1 MiB of
/// nothing, then more functions. Pages 0x41..=0x4f lie wholly in the gap.
fn file_with_gap() -> IntervalData {
    let mut d = IntervalData::new();
    d.add(StackDelta::new(0x40_0010, hint::KEEP, sp(8)));
    d.add(StackDelta::new(0x40_0014, hint::NONE, sp(24)));
    d.add(StackDelta::new(0x40_8000, hint::GAP, info::INVALID));
    let after = 0x40_8000 + (1 << 20);
    d.add(StackDelta::new(after, hint::KEEP, sp(16)));
    d.add(StackDelta::new(after + 0x40, hint::GAP, info::INVALID));
    d.add(StackDelta::new(after + 0x1_0000, hint::KEEP, sp(40)));
    d.add(StackDelta::new(after + 0x1_0100, hint::GAP, info::INVALID));
    d
}

/// Upstream writes a page entry for every page between a file's first and
/// last delta, also for the empty pages of a long gap (V8 snapshots). eim
/// writes none for the pages wholly inside a gap of 512 KiB or more after
/// an INVALID marker: a lookup there finds no page instead of the marker,
/// and both end native unwinding.
#[test]
fn weakness_14_dead_pages_inside_a_gap_get_no_entry() {
    use eim_sim::{answer_for, LookupError, SimReader};
    let data = file_with_gap();
    let w = World::new(&[(A, data.clone())]);
    w.add(A).unwrap();
    w.check();
    let first = data.get(0).unwrap().address >> 16;
    let last = data.last().unwrap().address >> 16;
    let span = last - first + 1;
    // Dead: strictly after the marker's page and before the next delta's.
    let dead = |address: u64| (0x41..0x50).contains(&(address >> 16));
    let written = w.m.with_backend(|b| b.maps.pages().len()) as u64;
    assert_eq!(span, 18);
    assert_eq!(written, span - 15, "no entry for the 15 dead pages");
    let mut s = metrics::Summary::new();
    w.m.update_metric_summary(&mut s);
    assert_eq!(s[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES], written);
    assert_eq!(w.m.state().book.pages_in_use(), written);
    // Every 256 bytes of the span, and every delta with its neighbours.
    let mut addresses: Vec<u64> = ((first << 16)..((last + 1) << 16)).step_by(0x100).collect();
    for d in &data {
        addresses.extend([d.address - 1, d.address, d.address + 1]);
    }
    let (mut in_dead, mut outside) = (0, 0);
    w.m.with_backend(|b| {
        let reader = SimReader::new(&b.maps);
        for &address in &addresses {
            let result = reader.lookup(A, address);
            if dead(address) {
                in_dead += 1;
                assert!(
                    matches!(result, Err(LookupError::TextSection { .. })),
                    "{address:#x}: {result:?}"
                );
            } else if address >= data.get(0).unwrap().address {
                outside += 1;
                // A direct search of the deltas, not eim's own `expected`.
                let direct = data
                    .iter()
                    .rev()
                    .find(|d| d.address <= address)
                    .map(|d| answer_for(&d.info));
                assert_eq!(reader.answer(A, address), direct, "{address:#x}");
            }
        }
    });
    assert_eq!(in_dead, 15 * 256, "every probe of the dead pages");
    assert!(outside > 3 * 256, "{outside} probes outside them");
    // The unload deletes exactly the pages written (the kernel's delete
    // batch stops at the first missing key, so one dead key would strand
    // the rest), also when it fails part way and is retried.
    w.m.with_backend(|b| b.maps.stop_batch(0, 2, Errno::EBUSY));
    assert!(w.m.remove_or_dec_ref(A).is_err());
    w.check();
    assert_eq!(w.m.retry_leftovers(), 0);
    w.m.with_backend(|b| assert!(b.maps.holds_no_file_data()));
    w.check();
    // And it loads and unloads cleanly again.
    w.clock.advance(Duration::from_secs(91));
    w.add(A).unwrap();
    w.check();
    w.m.remove_or_dec_ref(A).unwrap();
    w.m.with_backend(|b| assert!(b.maps.holds_no_file_data()));
    w.check();
}

/// Upstream's vDSO path took two references for one mapping and then failed
/// "mapping already exists" forever. In eim a synthetic load takes exactly
/// one reference, later mappings share it, and after the last release the
/// data can be loaded again.
#[test]
fn weakness_09_synthetic_data_is_counted_once_and_can_return() {
    let vdso = FileId(0x7d50);
    let w = World::new(&[(vdso, file(1, 2))]);
    w.m.add_synth_interval_data(vdso, &w.sources[&vdso])
        .unwrap();
    assert_eq!(w.m.state().files[&vdso].rc, 1);
    w.add(vdso).unwrap();
    w.m.remove_or_dec_ref(vdso).unwrap();
    w.m.remove_or_dec_ref(vdso).unwrap();
    w.m.with_backend(|b| assert!(b.maps.holds_no_file_data()));
    w.m.add_synth_interval_data(vdso, &w.sources[&vdso])
        .unwrap();
    w.check();
}

/// A provider whose extraction of one file blocks until released.
struct Blocking {
    inner: MemoryProvider,
    blocked: FileId,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Provider for Blocking {
    type Elf = FileId;
    fn extract(&self, id: &FileId) -> Result<Extraction, ExtractError> {
        if *id == self.blocked {
            if let Some(tx) = self.entered.lock().unwrap().take() {
                tx.send(()).unwrap();
            }
            if let Some(rx) = self.release.lock().unwrap().take() {
                rx.recv().unwrap();
            }
        }
        self.inner.extract(id)
    }
}

/// Upstream holds one global write lock across loads and interpreter
/// detection, and concurrent callers extract the same file twice. In eim an
/// extraction holds no lock: other files load and churn meanwhile, and a
/// second caller for the same file waits for the first extraction.
#[test]
fn weakness_12_extraction_blocks_neither_other_files_nor_repeats() {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let provider = Arc::new(Blocking {
        inner: MemoryProvider::new(),
        blocked: A,
        entered: Mutex::new(Some(entered_tx)),
        release: Mutex::new(Some(release_rx)),
    });
    provider.inner.insert(A, file(2, 1));
    provider.inner.insert(B, file(1, 3));
    let m = Arc::new(ExecutableInfoManager::new(
        provider.clone(),
        SimMaps::new(SimConfig::default()).unwrap(),
        Tracers::none(),
    ));
    let first = {
        let m = m.clone();
        std::thread::spawn(move || m.add_or_inc_ref(A, &A))
    };
    entered_rx.recv().unwrap();
    // A's extraction is in progress: B loads, churns and unloads meanwhile.
    m.add_or_inc_ref(B, &B).unwrap();
    for _ in 0..100 {
        m.add_or_inc_ref(B, &B).unwrap();
        m.remove_or_dec_ref(B).unwrap();
    }
    m.remove_or_dec_ref(B).unwrap();
    let second = {
        let m = m.clone();
        std::thread::spawn(move || m.add_or_inc_ref(A, &A))
    };
    // Give the second caller time to queue up behind the extraction (if it
    // is late, it finds A loaded instead: either way, no second extraction).
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(m.state().in_flight, 1);
    release_tx.send(()).unwrap();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    assert_eq!(provider.inner.extractions(), 2, "A once, B once");
    assert_eq!(m.state().files[&A].rc, 2);
}

/// Upstream counts a page's deltas in a u16 that silently wraps at 65536.
#[test]
fn weakness_15_a_page_with_65536_deltas_is_an_error_not_a_wrap() {
    let deltas: Vec<StackDelta> = (0..65536u64)
        .map(|a| StackDelta::new(a, 0, if a % 2 == 0 { sp(8) } else { sp(32) }))
        .collect();
    let w = World::new(&[(A, IntervalData::from_deltas(deltas))]);
    let err = w.add(A).unwrap_err();
    assert_eq!(
        err,
        Error::Encode {
            file_id: A,
            cause: EncodeError::PageOverflow {
                page: 0,
                count: 65536
            }
        }
    );
    w.m.with_backend(|b| assert!(b.maps.is_pristine()));
    w.check();
}

/// Upstream decrements the page gauge even when deletes fail, and counts
/// files without BPF data as loaded.
#[test]
fn weakness_23_metrics_equal_a_recount() {
    let empty = FileId(0xe);
    let w = World::new(&[
        (A, file(3, 1)),
        (B, file(2, 5)),
        (empty, IntervalData::new()),
    ]);
    for id in [A, B, empty] {
        w.add(id).unwrap();
    }
    let mut s = metrics::Summary::new();
    w.m.update_metric_summary(&mut s);
    assert_eq!(
        s[&metrics::NUM_EXE_ID_LOADED_TO_EBPF],
        2,
        "a file without deltas has no BPF data"
    );
    assert_eq!(s[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES], 5);
    // A failed unload, then its retry, then a second failure: the gauge
    // drops once, by A's pages, and never below the truth.
    w.m.with_backend(|b| b.maps.fail_op(0, Errno::EBUSY));
    assert!(w.m.remove_or_dec_ref(A).is_err());
    w.m.with_backend(|b| b.maps.fail_op(0, Errno::EBUSY));
    assert!(w.m.retry_leftovers() > 0);
    w.m.update_metric_summary(&mut s);
    assert_eq!(s[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES], 2);
    assert_eq!(s[&metrics::NUM_EXE_ID_LOADED_TO_EBPF], 1);
    let pages_in_kernel = w.m.with_backend(|b| b.maps.pages().len());
    assert_eq!(pages_in_kernel, 2 + 3, "B's pages plus A's leftovers");
    w.check();
}
