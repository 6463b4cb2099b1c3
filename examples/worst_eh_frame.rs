//! Writes the worst input eim's caps allow a CFI walk (a 64 MiB
//! `.eh_frame` of minimal FDEs, see `eim_test_support::worst_eh_frame`)
//! to FILE, for the peak-memory figures of docs/BENCHMARKS.md:
//!
//! ```text
//! cargo run --example worst_eh_frame -- FILE [SHAPE]
//! /usr/bin/time -v target/debug/eim deltas FILE > /dev/null
//! ```
//!
//! SHAPE: `table-apart` (the default: a search table, two deltas per
//! FDE), `table-adjacent`, `linear-apart` or `linear-adjacent` (no search
//! table).

use eim_test_support::worst_eh_frame::{fdes_in, minimal_fde_elf, Shape, MAX_SECTION_BYTES};

fn main() -> std::process::ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: worst_eh_frame FILE [SHAPE]");
        return std::process::ExitCode::FAILURE;
    };
    let shape = match args.next().as_deref().and_then(|s| s.to_str()) {
        None | Some("table-apart") => Shape::WORST,
        Some(name @ ("table-adjacent" | "linear-apart" | "linear-adjacent")) => Shape {
            search_table: name.starts_with("table"),
            apart: name.ends_with("apart"),
        },
        Some(other) => {
            eprintln!("worst_eh_frame: unknown shape {other:?}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let fdes = fdes_in(MAX_SECTION_BYTES);
    if let Err(e) = std::fs::write(&path, minimal_fde_elf(fdes, shape)) {
        eprintln!("worst_eh_frame: {}: {e}", path.to_string_lossy());
        return std::process::ExitCode::FAILURE;
    }
    println!(
        "{fdes} FDEs ({shape:?}) written to {}",
        path.to_string_lossy()
    );
    std::process::ExitCode::SUCCESS
}
