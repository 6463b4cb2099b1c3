//! Shared helpers of eim's cross-crate tests.

use std::path::{Path, PathBuf};

/// `../shared/testdata` next to the repository, or `$EIM_TESTDATA`.
/// Panics loudly when it is missing: an oracle test must never pass by
/// finding nothing to compare.
pub fn testdata_dir() -> PathBuf {
    let dir = std::env::var_os("EIM_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata"));
    assert!(
        dir.join("oracle").is_dir() && dir.join("upstream").is_dir(),
        "oracle test data not found at {} (set EIM_TESTDATA)",
        dir.display()
    );
    dir
}

/// Decompresses an `.xz` file to text.
pub fn read_xz(path: &Path) -> String {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out)
        .unwrap_or_else(|e| panic!("{}: not a valid xz file: {e:?}", path.display()));
    String::from_utf8(out).unwrap_or_else(|e| panic!("{}: not UTF-8: {e}", path.display()))
}

/// Every `<name>.deltas.xz` of the oracle and upstream sets, sorted.
pub fn oracle_delta_files() -> Vec<PathBuf> {
    let dir = testdata_dir();
    let mut files: Vec<PathBuf> = ["oracle", "upstream"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(dir.join(sub)).expect("readable test data"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".deltas.xz"))
        .collect();
    files.sort();
    files
}
