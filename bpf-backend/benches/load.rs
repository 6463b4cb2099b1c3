//! Loading into real BPF maps (root only; prints SKIPPED and does nothing
//! otherwise):
//!
//! * `load64/one_by_one` vs `load64/load_many`: 64 synthetic files in four
//!   size classes into fresh `KernelMaps`, with `add_or_inc_ref` per file
//!   (one outer-map update, so one map-in-map RCU wait, per file) against
//!   one `load_many` batch (one outer update per size class). The number of
//!   outer-map updates of each is printed.
//!   `load64/per_element` is the same one-by-one load with one `bpf()`
//!   call per map element (`WriteMode::PerElement`).
//! * `corpus/<file>/batch` and `corpus/<file>/per_element`: one corpus
//!   file through `add_or_inc_ref` into fresh maps, with batch writes and
//!   with one call per element, each with its `bpf()` call count printed.
//! * `corpus_all/{load_many,one_by_one,per_element}`: every corpus file at
//!   once, with batched publication, one outer insert per file, and one
//!   call per element.
//!
//! Map creation is outside the timed part (`iter_batched`).

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use eim_bpf::{sys, KernelConfig, KernelMaps, WriteMode};
use eim_core::provider::MemoryProvider;
use eim_core::{ExecutableInfoManager, Tracers};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::FileId;

// The kernel tests' corpus (every test-data ELF with its extracted deltas).
#[path = "../tests/common/mod.rs"]
#[allow(dead_code)]
mod common;

type Manager = ExecutableInfoManager<Arc<MemoryProvider>, KernelMaps>;

fn have_bpf() -> bool {
    eim_bpf::probe::can_create_maps().unwrap_or(false)
}

/// File `i` of 64: 200, 400, 800 or 1600 deltas (classes 8 to 11) over a
/// few pages, with a handful of shared rules.
fn synthetic(i: u64) -> IntervalData {
    let n = 200u64 << (i % 4);
    let mut d = IntervalData::new();
    let mut addr = 0x10_0000 + i * 0x1000;
    for j in 0..n {
        let rule = info::sp(8 * (1 + (j % 6) as i32));
        d.add(StackDelta::new(
            addr,
            if j % 8 == 0 { hint::KEEP } else { hint::NONE },
            rule,
        ));
        addr += 16 + (j % 7) * 4;
    }
    d.add(StackDelta::new(addr, hint::GAP, info::INVALID));
    d
}

fn manager(provider: &Arc<MemoryProvider>) -> Manager {
    manager_in(provider, WriteMode::Batch)
}

fn manager_in(provider: &Arc<MemoryProvider>, write_mode: WriteMode) -> Manager {
    let maps = KernelMaps::with_config(KernelConfig {
        write_mode,
        ..KernelConfig::default()
    })
    .expect("maps");
    ExecutableInfoManager::new(provider.clone(), maps, Tracers::none())
}

/// The `bpf()` calls and outer-map updates of `load` on fresh maps.
fn count(provider: &Arc<MemoryProvider>, mode: WriteMode, load: impl Fn(&Manager)) -> (u64, u64) {
    let m = manager_in(provider, mode);
    let before = sys::thread_syscalls();
    load(&m);
    let calls = sys::thread_syscalls() - before;
    (calls, m.with_backend(|b| b.outer_updates()))
}

/// One way of loading a batch of files.
type Load = fn(&Manager, &[(FileId, &FileId)]);

fn one_by_one(m: &Manager, batch: &[(FileId, &FileId)]) {
    for (id, elf) in batch {
        m.add_or_inc_ref(*id, elf).expect("load");
    }
}

fn many(m: &Manager, batch: &[(FileId, &FileId)]) {
    assert!(m.load_many(batch).iter().all(Result::is_ok));
}

/// Times the three ways of loading `batch` into fresh maps, printing each
/// way's `bpf()` calls and outer-map updates first.
fn three_ways(
    c: &mut Criterion,
    group: &str,
    provider: &Arc<MemoryProvider>,
    batch: &[(FileId, &FileId)],
) {
    let ways: [(&str, WriteMode, Load); 3] = [
        ("load_many", WriteMode::Batch, many),
        ("one_by_one", WriteMode::Batch, one_by_one),
        ("per_element", WriteMode::PerElement, one_by_one),
    ];
    for (name, mode, load) in ways {
        let (calls, outer) = count(provider, mode, |m| load(m, batch));
        eprintln!(
            "{group}/{name}: {} files, {calls} bpf() calls, {outer} outer-map updates (RCU waits)",
            batch.len()
        );
    }
    let mut g = c.benchmark_group(group);
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for (name, mode, load) in ways {
        g.bench_function(name, |b| {
            b.iter_batched(
                || manager_in(provider, mode),
                |m| {
                    load(&m, batch);
                    m
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// The corpus files that have deltas.
fn corpus() -> Vec<(String, IntervalData)> {
    common::corpus()
        .into_iter()
        .filter(|(_, data)| !data.is_empty())
        .collect()
}

fn load64(c: &mut Criterion) {
    if !have_bpf() {
        eprintln!("***** SKIPPED: load bench (bpf() needs root/CAP_BPF) *****");
        return;
    }
    let provider = Arc::new(MemoryProvider::new());
    let ids: Vec<FileId> = (0..64).map(|i| FileId(0x5000 + i)).collect();
    for (i, id) in ids.iter().enumerate() {
        provider.insert(*id, synthetic(i as u64));
    }
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let m = manager(&provider);
    many(&m, &batch);
    let classes: std::collections::BTreeSet<u16> = m
        .state()
        .book
        .loaded()
        .values()
        .map(|t| t.map_ref.map_id)
        .collect();
    eprintln!("load64: 64 files in {} size classes", classes.len());
    three_ways(c, "load64", &provider, &batch);
}

fn corpus_files(c: &mut Criterion) {
    if !have_bpf() {
        return;
    }
    let files = corpus();
    let provider = Arc::new(MemoryProvider::new());
    let ids: Vec<FileId> = (0..files.len() as u64)
        .map(|i| FileId(0x7000 + i))
        .collect();
    for ((_, data), id) in files.iter().zip(&ids) {
        provider.insert(*id, data.clone());
    }
    let mut g = c.benchmark_group("corpus");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    for ((name, data), id) in files.iter().zip(&ids) {
        for (way, mode) in [
            ("batch", WriteMode::Batch),
            ("per_element", WriteMode::PerElement),
        ] {
            let (calls, _) = count(&provider, mode, |m| {
                m.add_or_inc_ref(*id, id).expect("load");
            });
            eprintln!(
                "corpus/{name}/{way}: {} deltas, {calls} bpf() calls",
                data.len()
            );
            g.bench_function(format!("{name}/{way}"), |b| {
                b.iter_batched(
                    || manager_in(&provider, mode),
                    |m| {
                        m.add_or_inc_ref(*id, id).expect("load");
                        m
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    three_ways(c, "corpus_all", &provider, &batch);
}

criterion_group!(benches, load64, corpus_files);
criterion_main!(benches);
