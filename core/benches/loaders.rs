//! The interpreter loaders on a host's files, beside extraction
//! (`docs/BENCHMARKS.md`, "Interpreter loaders").
//!
//! Every file is handled as `eim` handles a new file: read on demand
//! through a `LazyFile` (`pread`), parsed, its stack deltas extracted
//! (no debug-link lookup), then every loader asked (all tracers on) about
//! it and its deltas, on the same `LazyFile` (what extraction read is
//! cached for the loaders, as in `eim`).
//!
//! * `host/extract` and `host/loaders`: every 64-bit ELF file under `/usr`
//!   and the stable toolchain (its sysroot, if rustup has one), one thread.
//!   One pass does both phases; `extract` reports the time of parse +
//!   extract, `loaders` the time of the loaders (gaps included, when a
//!   loader computes them), so the two add up to a pass;
//! * `file/librustc_driver`, `file/libLLVM`: the loaders alone on the
//!   toolchain's two largest libraries (read, parsed and extracted afresh,
//!   untimed, before each timed run of the loaders); and on the files
//!   `EIM_BENCH_FILES` names (`:`-separated paths).
//!
//! Before the benches, the setup prints each loader's own time and the
//! bytes it made the `LazyFile` read on those files, and how many files
//! each loader claimed over the walk and the files the loaders took
//! longest on. `EIM_BENCH_HOST=0` skips the
//! walk; `EIM_BENCH_CLAIMS=<file>` writes every claim of the first pass
//! there, one line per file and loader (path, loader, data or error), to
//! compare two builds' claims.
//!
//! Criterion sizes its samples by the wall time of an iteration, setup
//! included, so the untimed extraction keeps the number of iterations (and
//! the bench's run time) bounded however fast the loaders are.

// Reading a file as `eim` does: shared with eim-analysis's benches.
#[path = "../analysis/benches/common.rs"]
mod common;
use eim_test_support::files;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use eim_analysis::elf::ehframe::Parallelism;
use eim_analysis::elf::{extract_with, Elf, LazyFile};
use eim_analysis::interp::LoaderInfo;
use eim_core::tracers::{self, LoaderMatch, LOADERS};
use eim_core::Tracers;
use eim_machine::deltas::IntervalData;
use eim_machine::FileId;

const ALL_TRACERS: Tracers = Tracers(u32::MAX);

/// The time of each phase of one pass.
#[derive(Default, Clone, Copy)]
struct Phases {
    extract: Duration,
    loaders: Duration,
}

/// Parse and extract `file` as `eim` does before the loaders.
fn extracted<'d>(file: &'d LazyFile, parallelism: Parallelism) -> Option<(Elf<'d>, IntervalData)> {
    let elf = Elf::parse_lazy(file).ok()?;
    let data = extract_with(&elf, None, parallelism).ok()?;
    Some((elf, data))
}

/// Every enabled loader's answer, as `eim::loaders::detect` asks them.
fn detect(name: &str, elf: &Elf<'_>, data: &IntervalData) -> Vec<LoaderMatch> {
    let info = LoaderInfo::new(FileId(1), name, elf, data);
    tracers::detect(&info, ALL_TRACERS)
}

/// One pass over `files`: the time in each phase, and the matches.
fn pass(files: &[PathBuf], mut each: impl FnMut(&Path, &[LoaderMatch], Duration)) -> Phases {
    let mut phases = Phases::default();
    for path in files {
        let Some(file) = common::lazy(path) else {
            continue;
        };
        let name = path.to_string_lossy();
        let start = Instant::now();
        let Some((elf, data)) = extracted(&file, Parallelism::SEQUENTIAL) else {
            phases.extract += start.elapsed();
            continue;
        };
        let middle = Instant::now();
        let matches = detect(&name, &elf, &data);
        let end = Instant::now();
        phases.extract += middle - start;
        phases.loaders += end - middle;
        each(path, black_box(&matches), end - middle);
    }
    phases
}

/// The walk's files: `/usr` and the stable toolchain.
fn host_files() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/usr")];
    roots.extend(files::stable_sysroot());
    files::elf_files(&roots)
}

/// One line per claim: the path, the loader, and its data (all of it, as
/// `Debug` shows it) and ranges, or its error.
fn claim_lines(path: &Path, matches: &[LoaderMatch]) -> String {
    let mut out = String::new();
    for m in matches {
        let what = match &m.outcome {
            Ok(loaded) => format!("{:?} {:?}", loaded.data, loaded.offsets),
            Err(e) => format!("error: {e}"),
        };
        out.push_str(&format!("{}\t{}\t{what}\n", path.display(), m.loader));
    }
    out
}

/// The two libraries the issue names, from the stable toolchain, and the
/// files `EIM_BENCH_FILES` names (`:`-separated), by their file names.
fn big_files() -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    match files::stable_toolchain_lib() {
        Some(lib) => files.extend(
            [
                ("librustc_driver", "librustc_driver-"),
                ("libLLVM", "libLLVM"),
            ]
            .into_iter()
            .filter_map(|(name, prefix)| Some((name.into(), files::file_named(&lib, prefix)?))),
        ),
        None => eprintln!("no stable toolchain: librustc_driver and libLLVM are skipped"),
    }
    if let Some(more) = std::env::var_os("EIM_BENCH_FILES") {
        files.extend(std::env::split_paths(&more).map(|p| {
            let name = p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            (name, p)
        }));
    }
    files
}

/// Each loader alone on `path` (best of 5, each on a fresh read of the
/// file, extracted first): its time and the bytes it made the file read.
fn per_loader(name: &str, path: &Path) {
    let file_name = path.to_string_lossy();
    for loader in LOADERS {
        let mut best: Option<(Duration, u64)> = None;
        for _ in 0..5 {
            let Some(file) = common::lazy(path) else {
                return;
            };
            let Some((elf, data)) = extracted(&file, Parallelism::available()) else {
                eprintln!("{}: cannot be extracted", path.display());
                return;
            };
            let held = file.held();
            let start = Instant::now();
            let info = LoaderInfo::new(FileId(1), &file_name, &elf, &data);
            black_box((loader.load)(&info).is_ok());
            let took = start.elapsed();
            let read = file.held() - held;
            if best.is_none_or(|(t, _)| took < t) {
                best = Some((took, read));
            }
        }
        if let Some((took, read)) = best {
            eprintln!(
                "{name}: loader {:>10}: {:>9.3} ms, {:>10} bytes read",
                loader.name,
                took.as_secs_f64() * 1e3,
                read
            );
        }
    }
}

fn single_files(c: &mut Criterion) {
    let files = big_files();
    for (name, path) in &files {
        per_loader(name, path);
    }
    let mut group = c.benchmark_group("file");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for (name, path) in &files {
        group.bench_function(name.as_str(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let Some(file) = common::lazy(path) else {
                        continue;
                    };
                    let Some((elf, data)) = extracted(&file, Parallelism::available()) else {
                        continue;
                    };
                    let name = path.to_string_lossy();
                    let start = Instant::now();
                    black_box(detect(&name, &elf, &data));
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

fn host(c: &mut Criterion) {
    if std::env::var_os("EIM_BENCH_HOST").is_some_and(|v| v == "0") {
        return;
    }
    let files = host_files();
    let mut claimed = std::collections::BTreeMap::<&str, usize>::new();
    let mut lines = String::new();
    let mut slowest = Vec::new();
    let first = pass(&files, |path, matches, took| {
        for m in matches {
            *claimed.entry(m.loader).or_default() += 1;
        }
        lines.push_str(&claim_lines(path, matches));
        slowest.push((took, path.to_owned(), matches.len()));
    });
    if let Some(out) = std::env::var_os("EIM_BENCH_CLAIMS") {
        if let Err(e) = std::fs::write(&out, &lines) {
            eprintln!("{}: {e}", Path::new(&out).display());
        }
    }
    eprintln!(
        "host: {} files; first pass: extract {:.3} s, loaders {:.3} s; claimed: {claimed:?}",
        files.len(),
        first.extract.as_secs_f64(),
        first.loaders.as_secs_f64()
    );
    slowest.sort_by(|a, b| b.cmp(a));
    for (took, path, claims) in slowest.iter().take(12) {
        eprintln!(
            "host: loaders {:>8.3} ms, {claims} claims: {}",
            took.as_secs_f64() * 1e3,
            path.display()
        );
    }
    let mut group = c.benchmark_group("host");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));
    for (phase, pick) in [
        ("extract", (|p: Phases| p.extract) as fn(Phases) -> Duration),
        ("loaders", |p: Phases| p.loaders),
    ] {
        group.bench_function(phase, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| pick(pass(&files, |_, _, _| {}))).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, single_files, host);
criterion_main!(benches);
