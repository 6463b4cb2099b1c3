//! Helpers shared by the kernel test files and the load benchmark: the
//! corpus with its extracted deltas, and the sim's maps in the shape of a
//! kernel dump.

use std::path::{Path, PathBuf};

use eim_analysis::elf::{extract::extract, Elf};
use eim_bpf::Dump;
use eim_machine::deltas::IntervalData;
use eim_sim::SimMaps;

pub use eim_test_support::testdata;

/// Every ELF of the oracle and upstream test data with its extracted deltas
/// (also the files with none), by file name.
pub fn corpus() -> Vec<(String, IntervalData)> {
    let mut files = Vec::new();
    for dir in ["oracle/bin", "upstream"] {
        let dir = testdata().join(dir);
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        paths.sort();
        for path in paths {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            if !bytes.starts_with(eim_test_support::elf::MAGIC) {
                continue;
            }
            let elf = Elf::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let data = extract(&elf, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            files.push((name(&path), data));
        }
    }
    assert!(
        files.len() >= 10,
        "test data not found under {}",
        testdata().display()
    );
    files
}

pub fn name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// The sim's maps in the shape of [`eim_bpf::KernelMaps::dump`].
pub fn sim_dump(s: &SimMaps) -> Dump {
    Dump {
        pages: s.pages(),
        delta_tables: s
            .delta_tables()
            .into_iter()
            .map(|(key, table)| (key, (table.capacity(), table.entries())))
            .collect(),
        unwind_infos: s.unwind_infos(),
        interpreter_offsets: s.interpreter_offsets(),
        process_mappings: s.process_mappings(),
        live_inner_maps: s.live_inner_maps(),
    }
}
