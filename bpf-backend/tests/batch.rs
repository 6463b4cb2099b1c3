//! Batched publication in the real kernel (root or CAP_BPF; a loud SKIPPED
//! otherwise, a failure under `EIM_REQUIRE_BPF=1`):
//!
//! * `load_many` of the corpus into `KernelMaps` and `SimMaps` leaves
//!   identical maps, with exactly one outer-map update per size class used
//!   and a `bpf()` call count independent of the delta counts;
//! * a batch stopped by an injected fault inside the table publication
//!   rolls back to identical, empty maps in kernel and sim;
//! * a batch that the kernel itself stops part way (an outer map too small
//!   for it, E2BIG) loads every file that fits and fails each other file on
//!   its own, alike in kernel and sim.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use eim_bpf::{sys, KernelConfig, KernelMaps};
use eim_core::manager::MonotonicClock;
use eim_core::provider::MemoryProvider;
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::deltas::IntervalData;
use eim_machine::ops::{Backend, Errno, MapOp, OpFailure};
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};

mod common;
use common::sim_dump;

/// Every corpus file that has deltas.
fn corpus() -> Vec<(String, IntervalData)> {
    common::corpus()
        .into_iter()
        .filter(|(_, data)| !data.is_empty())
        .collect()
}

fn require_bpf() -> bool {
    eim_bpf::probe::require_bpf("kernel batch test")
}

fn provider(files: &[(String, IntervalData)]) -> (Arc<MemoryProvider>, Vec<FileId>) {
    let provider = Arc::new(MemoryProvider::new());
    let ids: Vec<FileId> = (0..files.len() as u64).map(|i| FileId(0x100 + i)).collect();
    for (id, (_, data)) in ids.iter().zip(files) {
        provider.insert(*id, data.clone());
    }
    (provider, ids)
}

fn manager<B: Backend>(
    p: &Arc<MemoryProvider>,
    b: B,
) -> ExecutableInfoManager<Arc<MemoryProvider>, B> {
    ExecutableInfoManager::with_config(
        p.clone(),
        b,
        Tracers::none(),
        Config::default(),
        Box::new(MonotonicClock::default()),
    )
}

#[test]
fn load_many_of_the_corpus_is_one_outer_update_per_class_and_matches_the_sim() {
    if !require_bpf() {
        return;
    }
    let files = corpus();
    let (provider, ids) = provider(&files);
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let kernel = manager(&provider, KernelMaps::new().expect("maps"));
    let sim = manager(&provider, SimMaps::new(SimConfig::default()).expect("sim"));

    let syscalls = sys::thread_syscalls();
    let results = kernel.load_many(&batch);
    let syscalls = sys::thread_syscalls() - syscalls;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(sim.load_many(&batch).iter().all(Result::is_ok));

    let classes: BTreeSet<u16> = kernel
        .state()
        .book
        .loaded()
        .values()
        .map(|t| t.map_ref.map_id)
        .collect();
    let n = files.len() as u64;
    let k = classes.len() as u64;
    assert!(k >= 3, "several classes: {classes:?}");
    let outer = kernel.with_backend(|b| b.outer_updates());
    assert_eq!(outer, k, "one outer-map update per class for {n} files");
    // Slots, create + fill per table, one outer batch per class, pages.
    assert!(
        syscalls <= 2 + 2 * n + k,
        "{syscalls} bpf() calls for {n} files in {k} classes"
    );
    eprintln!(
        "load_many of {n} corpus files ({} deltas) in {k} classes: {syscalls} bpf() calls, {outer} outer updates",
        files.iter().map(|(_, d)| d.len()).sum::<usize>()
    );

    let kdump = kernel.with_backend(|b| b.dump().expect("dump"));
    let sdump = sim.with_backend(|s| sim_dump(s));
    assert_eq!(kdump.delta_tables.len(), files.len());
    assert!(kdump == sdump, "kernel and sim differ after load_many");

    // Unloading is per file and leaves both empty alike.
    for id in &ids {
        kernel.remove_or_dec_ref(*id).unwrap();
        sim.remove_or_dec_ref(*id).unwrap();
    }
    let kdump = kernel.with_backend(|b| b.dump().expect("dump"));
    assert!(kdump.pages.is_empty() && kdump.delta_tables.is_empty());
    assert!(kdump == sim.with_backend(|s| sim_dump(s)));
}

/// Stops the `PutDeltaTables` op of one class after `after` tables (the
/// first `after` published for real), like `SimMaps::stop_batch`.
struct StopTables<B> {
    inner: B,
    class: u16,
    after: usize,
}

impl<B: Backend> Backend for StopTables<B> {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        match op {
            MapOp::PutDeltaTables { map_id, tables } if *map_id == self.class => {
                let done = self.after.min(tables.len().saturating_sub(1));
                if let Some(head) = op.head(done) {
                    self.inner.apply(&head)?;
                }
                // An errno about the op, not one element: the whole batch
                // goes (a resource errno would be retried in halves).
                Err(OpFailure::new(Errno::EBUSY, done))
            }
            _ => self.inner.apply(op),
        }
    }
}

#[test]
fn a_batch_stopped_in_the_publication_rolls_back_alike_in_kernel_and_sim() {
    if !require_bpf() {
        return;
    }
    let files = corpus();
    let (provider, ids) = provider(&files);
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    // The class with the most tables.
    let probe = manager(&provider, SimMaps::new(SimConfig::default()).expect("sim"));
    probe.load_many(&batch);
    let mut per_class: BTreeMap<u16, usize> = BTreeMap::new();
    for t in probe.state().book.loaded().values() {
        *per_class.entry(t.map_ref.map_id).or_default() += 1;
    }
    let (&class, &count) = per_class.iter().max_by_key(|(_, n)| **n).unwrap();
    assert!(count >= 2, "{per_class:?}");
    for after in 0..count {
        let kernel = manager(
            &provider,
            StopTables {
                inner: KernelMaps::new().expect("maps"),
                class,
                after,
            },
        );
        let sim = manager(
            &provider,
            StopTables {
                inner: SimMaps::new(SimConfig::default()).expect("sim"),
                class,
                after,
            },
        );
        for r in kernel.load_many(&batch) {
            assert!(
                matches!(
                    r,
                    Err(Error::Kernel {
                        rolled_back: true,
                        ..
                    })
                ),
                "{r:?}"
            );
        }
        sim.load_many(&batch);
        let kdump = kernel.with_backend(|b| b.inner.dump().expect("dump"));
        assert!(kdump.pages.is_empty() && kdump.delta_tables.is_empty());
        assert_eq!(kdump.live_inner_maps, 0, "no inner array kept");
        assert!(
            kdump == sim.with_backend(|s| sim_dump(&s.inner)),
            "after {after}"
        );
    }
}

#[test]
fn an_outer_map_too_small_for_the_batch_loads_what_fits_alike_in_kernel_and_sim() {
    if !require_bpf() {
        return;
    }
    let files = corpus();
    let (provider, ids) = provider(&files);
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    // The book believes the default capacities; the maps hold 2 tables per
    // class: the kernel itself stops the outer batch of a bigger class with
    // E2BIG, which concerns elements, not the op: the batch is retried in
    // halves until every file that fits is in.
    let kernel = manager(
        &provider,
        KernelMaps::with_config(KernelConfig {
            outer: 2,
            ..KernelConfig::default()
        })
        .expect("maps"),
    );
    let sim = manager(
        &provider,
        SimMaps::new(SimConfig {
            outer: 2,
            ..SimConfig::default()
        })
        .expect("sim"),
    );
    let kr = kernel.load_many(&batch);
    let sr = sim.load_many(&batch);
    assert_eq!(kr, sr, "same results (errno and processed count)");
    // How many tables each class would hold with room for all.
    let roomy = manager(&provider, SimMaps::new(SimConfig::default()).expect("sim"));
    assert!(roomy.load_many(&batch).iter().all(Result::is_ok));
    let mut per_class: BTreeMap<u16, usize> = BTreeMap::new();
    for t in roomy.state().book.loaded().values() {
        *per_class.entry(t.map_ref.map_id).or_default() += 1;
    }
    assert!(per_class.values().any(|n| *n > 2), "{per_class:?}");
    let mut loaded: BTreeMap<u16, usize> = BTreeMap::new();
    for t in kernel.state().book.loaded().values() {
        *loaded.entry(t.map_ref.map_id).or_default() += 1;
    }
    for (class, n) in &per_class {
        assert_eq!(
            loaded.get(class).copied().unwrap_or(0),
            (*n).min(2),
            "class {class}"
        );
    }
    let failed: Vec<&Error> = kr.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(
        failed.len(),
        per_class
            .values()
            .map(|n| n.saturating_sub(2))
            .sum::<usize>()
    );
    for e in &failed {
        assert!(
            matches!(
                e,
                Error::Kernel {
                    map: eim_machine::ops::MapKind::DeltaTables(_),
                    errno: Errno::E2BIG,
                    len: 1,
                    rolled_back: true,
                    ..
                }
            ),
            "each failure is its own, on the full map: {e}"
        );
    }
    let kdump = kernel.with_backend(|b| b.dump().expect("dump"));
    assert_eq!(
        kdump.delta_tables.len(),
        kernel.state().book.loaded().len(),
        "every file loaded has its table"
    );
    assert!(kdump == sim.with_backend(|s| sim_dump(s)));
}
