//! Writes the worst input eim's caps allow a CFI walk (a 64 MiB
//! `.eh_frame` of minimal FDEs with its search table, see
//! `eim_test_support::worst_eh_frame`) to FILE, for the peak-memory figure
//! of docs/BENCHMARKS.md:
//!
//! ```text
//! cargo run --example worst_eh_frame -- FILE [FDES]
//! /usr/bin/time -v target/debug/eim tables FILE > /dev/null
//! ```

use eim_test_support::worst_eh_frame::{fdes_in, minimal_fde_elf, MAX_SECTION_BYTES};

fn main() -> std::process::ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: worst_eh_frame FILE [FDES]");
        return std::process::ExitCode::FAILURE;
    };
    let fdes = match args.next().map(|n| n.to_string_lossy().parse::<usize>()) {
        None => fdes_in(MAX_SECTION_BYTES),
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("worst_eh_frame: FDES: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(&path, minimal_fde_elf(fdes)) {
        eprintln!("worst_eh_frame: {}: {e}", path.to_string_lossy());
        return std::process::ExitCode::FAILURE;
    }
    println!("{fdes} FDEs written to {}", path.to_string_lossy());
    std::process::ExitCode::SUCCESS
}
