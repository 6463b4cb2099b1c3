//! The per-process fast path: a reference taken and released on a file
//! that is already loaded. Measured on one thread, and on two threads
//! working on two different files (throughput ratio two-to-one).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use eim_core::provider::MemoryProvider;
use eim_core::{ExecutableInfoManager, Tracers};
use eim_machine::abi::{opcode, UnwindInfo};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::{Backend, MapOp, OpFailure};
use eim_machine::FileId;

/// The kernel is not on the fast path; a backend that accepts everything.
struct Accept;

impl Backend for Accept {
    fn apply(&mut self, _: &MapOp) -> Result<(), OpFailure> {
        Ok(())
    }
}

fn loaded(ids: &[FileId]) -> ExecutableInfoManager<MemoryProvider, Accept> {
    let provider = MemoryProvider::new();
    for (i, id) in ids.iter().enumerate() {
        let rule = UnwindInfo {
            opcode: opcode::BASE_SP,
            param: 8 * (i as i32 + 1),
            ..UnwindInfo::default()
        };
        provider.insert(
            *id,
            IntervalData::from_deltas(vec![
                StackDelta::new(0x1000, hint::KEEP, rule),
                StackDelta::new(0x2000, hint::GAP, info::INVALID),
            ]),
        );
    }
    let m = ExecutableInfoManager::new(provider, Accept, Tracers::none());
    for id in ids {
        // One long-lived reference, as a running process would hold.
        m.add_or_inc_ref(*id, id).expect("load");
    }
    m
}

fn churn(m: &ExecutableInfoManager<MemoryProvider, Accept>, id: FileId, iters: u64) {
    for _ in 0..iters {
        black_box(m.add_or_inc_ref(black_box(id), &id).expect("known file"));
        m.remove_or_dec_ref(black_box(id)).expect("held reference");
    }
}

fn fast_path(c: &mut Criterion) {
    let (a, b) = (FileId(0x1111), FileId(0x2222));
    let m = loaded(&[a, b]);
    assert_ne!(
        m.shard_of(a),
        m.shard_of(b),
        "pick files of different shards"
    );

    let mut group = c.benchmark_group("fast_path");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("inc_dec_one_thread", |bench| {
        bench.iter_custom(|iters| {
            let start = Instant::now();
            churn(&m, a, iters);
            start.elapsed()
        })
    });
    // Each iteration is one inc+dec on each of two threads: if the threads
    // did not contend at all, the time per iteration would equal the
    // one-thread time, and the throughput ratio would be 2.
    group.bench_function("inc_dec_two_threads_two_files", |bench| {
        bench.iter_custom(|iters| {
            std::thread::scope(|s| {
                let start = Instant::now();
                let t = s.spawn(|| churn(&m, b, iters));
                churn(&m, a, iters);
                t.join().expect("worker");
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, fast_path);
criterion_main!(benches);
