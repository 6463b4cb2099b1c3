//! The test data: the repository's `tests/data` (`$EIM_TESTDATA`
//! overrides it), so that a clone holds everything its tests read.

use std::path::{Path, PathBuf};

/// The repository's own copy of the test data (`tests/data`), whatever
/// `$EIM_TESTDATA` says: the copy the integrity test checks.
pub fn in_repo() -> PathBuf {
    // Known at compile time: this crate is `tests/support`, and its parent
    // is `tests/`.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/support is inside tests/")
        .join("data")
}

/// Where the test data is meant to be, whether or not it is there (for a
/// tool that reports its absence itself): `$EIM_TESTDATA`, else
/// [`in_repo`].
pub fn testdata_path() -> PathBuf {
    std::env::var_os("EIM_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(in_repo)
}

/// The test data's directory. Panics loudly when it is missing: an oracle
/// test must never pass by finding nothing to compare.
pub fn testdata() -> PathBuf {
    let dir = testdata_path();
    let how = if std::env::var_os("EIM_TESTDATA").is_some() {
        "$EIM_TESTDATA names it"
    } else {
        "the repository's tests/data; $EIM_TESTDATA overrides it"
    };
    assert!(
        dir.join("oracle/MANIFEST.tsv").is_file() && dir.join("upstream").is_dir(),
        "oracle test data not found at {} ({how})",
        dir.display()
    );
    dir
}

/// The oracle's own binaries (`oracle/bin`).
pub fn oracle_bin() -> PathBuf {
    testdata().join("oracle/bin")
}

/// A file's bytes; panics naming the file.
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Decompresses an `.xz` file to text.
pub fn read_xz(path: &Path) -> String {
    let raw = read(path);
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out)
        .unwrap_or_else(|e| panic!("{}: not a valid xz file: {e:?}", path.display()));
    String::from_utf8(out).unwrap_or_else(|e| panic!("{}: not UTF-8: {e}", path.display()))
}

/// The SHA-256 of `data`, in lower-case hex (as `sha256sum` and the
/// manifests write it).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
