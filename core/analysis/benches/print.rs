//! Printing deltas and tables against extracting them
//! (`docs/BENCHMARKS.md`, "Printing deltas and tables").
//!
//! One big library (`$EIM_BENCH_PRINT_FILE`, else LLVM's shared library
//! under `/usr/lib/llvm-*/lib`, else the stable toolchain's
//! librustc_driver), bytes already in memory:
//!
//! * `print/extract`: `Elf::parse` + `extract` (what `eim deltas` does
//!   before it prints);
//! * `print/extract_from_file`: the same with the file opened and read on
//!   demand (`LazyFile`, `pread`, page cache warm), as `eim deltas` reads
//!   it;
//! * `print/deltas`: the `.deltas` text of those deltas written to a
//!   buffered sink, as `eim deltas` writes stdout;
//! * `print/plan`: the fresh book's load plan and its `Tables` (what
//!   `eim tables` computes between extracting and printing);
//! * `print/tables`: the `.encoded` text of those tables written the same
//!   way;
//! * `print/{deltas,tables}_core_fmt`: the baseline, how eim printed them
//!   before issue 17 (`write!` per row into one `String`, then written
//!   out), kept here so that both are measured in the same run.

use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use eim_analysis::elf::{extract, Elf};
use eim_machine::deltas::IntervalData;
use eim_machine::machine::{Capacities, KernelBook};
use eim_machine::text::{render_deltas, write_deltas, Tables};
use eim_machine::FileId;
use eim_test_support::files::{file_named, stable_toolchain_lib};

mod common;

/// The library to print: the largest `libLLVM*` of an LLVM install.
fn input() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("EIM_BENCH_PRINT_FILE") {
        return Some(PathBuf::from(path));
    }
    let llvm = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
        .filter_map(|e| file_named(&e.path().join("lib"), "libLLVM"))
        .max();
    llvm.or_else(|| file_named(&stable_toolchain_lib()?, "librustc_driver-"))
}

fn extract_bytes(bytes: &[u8]) -> Option<IntervalData> {
    extract(&Elf::parse(bytes).ok()?, None).ok()
}

fn extract_path(path: &std::path::Path) -> Option<IntervalData> {
    let lazy = common::lazy(path)?;
    extract(&Elf::parse_lazy(&lazy).ok()?, None).ok()
}

fn plan(data: &IntervalData) -> Option<Tables> {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(0x1234), data, None).ok()?;
    Some(Tables::of_plan(&plan))
}

/// The `.deltas` text as eim made it before issue 17.
fn deltas_core_fmt(path: &str, data: &IntervalData) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(32 * data.len() + 128);
    let _ = writeln!(out, "# file: {path}");
    let _ = writeln!(out, "# deltas: {}", data.len());
    out.push_str("# ADDRESS HINTS OPCODE PARAM FPOPCODE FPPARAM MERGEOPCODE\n");
    for d in data {
        let i = &d.info;
        let _ = writeln!(
            out,
            "{:x} {} {} {} {} {} {}",
            d.address, d.hints, i.opcode, i.param, i.fp_opcode, i.fp_param, i.merge_opcode
        );
    }
    out
}

/// The `.encoded` text as eim made it before issue 17.
fn tables_core_fmt(t: &Tables, path: &str, deltas_in: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(16 * (t.kernel_deltas.len() + t.pages.len()) + 256);
    let _ = writeln!(out, "# file: {path}");
    let _ = writeln!(out, "# deltas_in: {deltas_in}");
    let _ = writeln!(out, "# mapid: {}", t.map_id);
    let _ = writeln!(out, "# unwind_infos: {}", t.unwind_infos.len());
    for (slot, i) in &t.unwind_infos {
        let _ = writeln!(
            out,
            "{slot} {} {} {} {} {}",
            i.opcode, i.fp_opcode, i.merge_opcode, i.param, i.fp_param
        );
    }
    let _ = writeln!(out, "# kernel_deltas: {}", t.kernel_deltas.len());
    for d in &t.kernel_deltas {
        let _ = writeln!(out, "{:04x} {:04x}", d.addr_low, d.unwind_info);
    }
    let _ = writeln!(out, "# pages: {}", t.pages.len());
    for (k, v) in &t.pages {
        let _ = writeln!(
            out,
            "{:x} {} {} {}",
            k.page, v.first_delta, v.num_deltas, v.map_id
        );
    }
    let _ = writeln!(out, "# gaps: {}", t.gaps.len());
    for g in &t.gaps {
        let _ = writeln!(out, "{:x} {:x}", g.start, g.end);
    }
    out
}

/// What stdout is to the CLI: a `BufWriter` that throws the bytes away.
fn sink() -> BufWriter<std::io::Sink> {
    BufWriter::new(std::io::sink())
}

fn print(c: &mut Criterion) {
    let Some(path) = input() else {
        eprintln!("SKIPPED: no libLLVM or librustc_driver on this host");
        return;
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("SKIPPED: {}: {e}", path.display());
            return;
        }
    };
    let Some(data) = extract_bytes(&bytes) else {
        eprintln!("SKIPPED: {}: no deltas", path.display());
        return;
    };
    let Some(tables) = plan(&data) else {
        eprintln!("SKIPPED: {}: the fresh book refuses it", path.display());
        return;
    };
    let shown = path.display().to_string();
    let deltas_text = render_deltas(&shown, &data);
    let tables_text = tables.render(&shown, data.len());
    // The baseline prints the same bytes, or its figures mean nothing.
    assert!(deltas_core_fmt(&shown, &data) == deltas_text);
    assert!(tables_core_fmt(&tables, &shown, data.len()) == tables_text);
    eprintln!(
        "input {shown}: {} bytes, {} deltas ({} bytes of text), {} kernel deltas and {} pages ({} bytes of text)",
        bytes.len(),
        data.len(),
        deltas_text.len(),
        tables.kernel_deltas.len(),
        tables.pages.len(),
        tables_text.len()
    );

    let mut group = c.benchmark_group("print");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    group.bench_function("extract", |b| b.iter(|| extract_bytes(black_box(&bytes))));
    group.bench_function("extract_from_file", |b| {
        b.iter(|| extract_path(black_box(&path)))
    });
    group.bench_function("deltas", |b| {
        b.iter(|| {
            let mut out = sink();
            write_deltas(&mut out, black_box(&shown), black_box(&data))?;
            out.flush()
        })
    });
    group.bench_function("deltas_core_fmt", |b| {
        b.iter(|| {
            let mut out = sink();
            let text = deltas_core_fmt(black_box(&shown), black_box(&data));
            out.write_all(text.as_bytes())?;
            out.flush()
        })
    });
    group.bench_function("plan", |b| b.iter(|| plan(black_box(&data))));
    group.bench_function("tables", |b| {
        b.iter(|| {
            let mut out = sink();
            black_box(&tables).write(&mut out, &shown, data.len())?;
            out.flush()
        })
    });
    group.bench_function("tables_core_fmt", |b| {
        b.iter(|| {
            let mut out = sink();
            let text = tables_core_fmt(black_box(&tables), &shown, data.len());
            out.write_all(text.as_bytes())?;
            out.flush()
        })
    });
    group.finish();
}

criterion_group!(benches, print);
criterion_main!(benches);
