//! Stack-delta extraction speed (`docs/BENCHMARKS.md`, "Extraction").
//!
//! * `extract/<name>`: every oracle input (the rows of
//!   `oracle/MANIFEST.tsv`, then upstream's four test files), one
//!   iteration = `Elf::parse` + `extract` (no debug-link lookup) on bytes
//!   already in memory;
//! * `extract/librustc_driver`: the stable toolchain's compiler driver
//!   (about a million deltas);
//! * `gimli_floor/<name>`: `Elf::parse` + a bare gimli walk over every
//!   CFI row of `.eh_frame` (FDEs, `UnwindTable` rows, nothing done with
//!   them), for the files whose ratio to the floor is reported;
//! * `usr_walk/{2_threads,1_thread}`: every 64-bit ELF file under `/usr`
//!   (collected once; unreadable and non-ELF files skipped, hard links
//!   counted once), one pass = open + map + parse + extract of each, the
//!   files shared out to two threads (and on one, for the scaling), each
//!   file extracted on its worker's thread;
//! * `usr_walk/2_threads_pread`: the same walk with every file read on
//!   demand through a `LazyFile` (`pread` into owned chunks, as `eim`
//!   reads files since weakness 24) instead of mapped;
//! * `from_file/librustc_driver_{mapped,pread}`: librustc_driver opened,
//!   mapped (or read through a `LazyFile`), parsed and extracted per
//!   iteration, page cache warm: what reading on demand costs against a map.
//!
//! Test data: `$EIM_TESTDATA`, else the repository's `tests/data`.
//! `EIM_BENCH_USR=0` skips the `/usr` walk.

use std::fs::File;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use eim_analysis::elf::ehframe::Parallelism;
use eim_analysis::elf::{extract, extract_with, Elf, LazyFile};

mod common;
use common::Pread;
use eim_test_support::files::{elf_files, file_named, stable_toolchain_lib};
use eim_test_support::{cfi, oracle, testdata};

/// (name, path) of every oracle input, as the oracle tests find them.
fn oracle_inputs() -> Vec<(String, PathBuf)> {
    oracle::inputs(&testdata())
        .into_iter()
        .map(|i| (i.name, i.file))
        .collect()
}

/// The stable toolchain's librustc_driver, if rustup has one.
fn rustc_driver() -> Option<PathBuf> {
    file_named(&stable_toolchain_lib()?, "librustc_driver-")
}

/// One extraction as measured: parse the ELF view, extract, no debug link.
/// Returns the delta count (0 on error: the error is part of the result).
fn extract_bytes(bytes: &[u8]) -> usize {
    match Elf::parse(bytes) {
        Ok(elf) => extract(&elf, None).map_or(0, |d| d.len()),
        Err(_) => 0,
    }
}

/// Every row of every FDE of `.eh_frame`, decoded by gimli: the floor a
/// CFI walk can reach. Includes `Elf::parse`, as `extract_bytes` does.
fn gimli_rows(bytes: &[u8]) -> usize {
    let Ok(elf) = Elf::parse(bytes) else {
        return 0;
    };
    elf.section(".eh_frame")
        .map_or(0, |s| cfi::gimli_rows(s.data, s.address))
}

/// Files with a gimli floor bench: the big CFI files.
const FLOOR_FILES: [&str; 4] = [
    "aarch64-libc.so.6",
    "x86_64-libc.so.6",
    "x86_64-libstdc++.so.6",
    "bash",
];

fn per_file(c: &mut Criterion) {
    let mut inputs: Vec<(String, Vec<u8>)> = oracle_inputs()
        .into_iter()
        .filter_map(|(name, path)| match std::fs::read(&path) {
            Ok(bytes) => Some((name, bytes)),
            Err(e) => {
                eprintln!("{}: {e}: skipped", path.display());
                None
            }
        })
        .collect();
    if let Some(path) = rustc_driver() {
        match std::fs::read(&path) {
            Ok(bytes) => inputs.push(("librustc_driver".into(), bytes)),
            Err(e) => eprintln!("{}: {e}: skipped", path.display()),
        }
    }
    for (name, bytes) in &inputs {
        eprintln!(
            "input {name}: {} bytes, {} deltas",
            bytes.len(),
            extract_bytes(bytes)
        );
    }

    let mut group = c.benchmark_group("extract");
    for (name, bytes) in &inputs {
        if name == "librustc_driver" {
            group
                .sample_size(30)
                .measurement_time(Duration::from_secs(10));
        }
        group.bench_function(name.as_str(), |b| {
            b.iter(|| extract_bytes(black_box(bytes)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("gimli_floor");
    for (name, bytes) in &inputs {
        if !FLOOR_FILES.contains(&name.as_str()) && name != "librustc_driver" {
            continue;
        }
        if name == "librustc_driver" {
            group
                .sample_size(30)
                .measurement_time(Duration::from_secs(10));
        }
        eprintln!("gimli rows {name}: {}", gimli_rows(bytes));
        group.bench_function(name.as_str(), |b| b.iter(|| gimli_rows(black_box(bytes))));
    }
    group.finish();
}

/// How a file's bytes reach the parser.
#[derive(Clone, Copy)]
enum Reading {
    /// A shared read-only map (what eim did before weakness 24).
    Mapped,
    /// `pread` on demand into a `LazyFile` (what eim does).
    Pread,
}

/// Open, read (as `how` says), parse and extract one file: its delta count.
fn extract_path(path: &Path, how: Reading, parallelism: Parallelism) -> usize {
    let Ok(file) = File::open(path) else {
        return 0;
    };
    let count = |elf: Result<Elf<'_>, _>| match elf {
        Ok(elf) => extract_with(&elf, None, parallelism).map_or(0, |d| d.len()),
        Err(_) => 0,
    };
    match how {
        Reading::Mapped => {
            // SAFETY: read-only mapping of a file nobody writes during the bench.
            let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
                return 0;
            };
            count(Elf::parse(&map))
        }
        Reading::Pread => {
            let Ok(len) = file.metadata().map(|m| m.len()) else {
                return 0;
            };
            let lazy = LazyFile::new(Box::new(Pread(file)), len);
            count(Elf::parse_lazy(&lazy))
        }
    }
}

/// One pass over `files` on `threads` threads: the total delta count.
fn walk(files: &[PathBuf], threads: usize, how: Reading) -> usize {
    let next = AtomicUsize::new(0);
    let work = || {
        let mut deltas = 0;
        while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
            deltas += extract_path(path, how, Parallelism::SEQUENTIAL);
        }
        deltas
    };
    std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mine = work();
        mine + others
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .sum::<usize>()
    })
}

fn usr_walk(c: &mut Criterion) {
    if std::env::var_os("EIM_BENCH_USR").is_some_and(|v| v == "0") {
        return;
    }
    let files = elf_files(&[PathBuf::from("/usr")]);
    let bytes: u64 = files
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let parsed = files
        .iter()
        .filter(|p| {
            File::open(p)
                .ok()
                .and_then(|f| unsafe { memmap2::Mmap::map(&f) }.ok())
                .is_some_and(|m| Elf::parse(&m).is_ok())
        })
        .count();
    eprintln!(
        "usr_walk: {} 64-bit ELF files ({parsed} x86-64/arm64), {:.1} MB, {} deltas in all",
        files.len(),
        bytes as f64 / 1e6,
        walk(&files, 2, Reading::Mapped)
    );
    let mut group = c.benchmark_group("usr_walk");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));
    group.bench_function("2_threads", |b| b.iter(|| walk(&files, 2, Reading::Mapped)));
    group.bench_function("1_thread", |b| b.iter(|| walk(&files, 1, Reading::Mapped)));
    group.bench_function("2_threads_pread", |b| {
        b.iter(|| walk(&files, 2, Reading::Pread))
    });
    group.finish();
}

fn from_file(c: &mut Criterion) {
    let Some(path) = rustc_driver() else {
        eprintln!("no librustc_driver: from_file skipped");
        return;
    };
    let mut group = c.benchmark_group("from_file");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    for (name, how) in [
        ("librustc_driver_mapped", Reading::Mapped),
        ("librustc_driver_pread", Reading::Pread),
    ] {
        eprintln!(
            "from_file {name}: {} deltas",
            extract_path(&path, how, Parallelism::available())
        );
        group.bench_function(name, |b| {
            b.iter(|| extract_path(black_box(&path), how, Parallelism::available()))
        });
    }
    group.finish();
}

criterion_group!(benches, per_file, from_file, usr_walk);
criterion_main!(benches);
