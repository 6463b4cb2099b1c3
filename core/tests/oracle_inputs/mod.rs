//! The oracle's inputs, shared by the tests that compare with it
//! (`elf_oracle.rs`, `tsd.rs`): where the test data is, which files the
//! manifest names, and the check that a file of the machine image is the
//! one the oracle was made from.
//!
//! Test data: `$EIM_TESTDATA`, else `../../shared/testdata` from this
//! crate.

#![allow(dead_code)] // each test crate uses a different part

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub fn testdata() -> PathBuf {
    let dir = match std::env::var_os("EIM_TESTDATA") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata"),
    };
    assert!(
        dir.join("oracle/MANIFEST.tsv").is_file(),
        "test data not found at {} (set EIM_TESTDATA)",
        dir.display()
    );
    dir
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// One input: its name in the oracle, where it is here, and, for files of
/// the machine image, the sha256 it must have.
pub struct Input {
    pub name: String,
    pub file: PathBuf,
    pub sha256: Option<String>,
    pub deltas: PathBuf,
    /// The oracle's `.tsd` file (the upstream test files have none).
    pub tsd: Option<PathBuf>,
}

impl Input {
    /// The file's bytes, after checking a stock file is the one the
    /// oracle was made from: a different package version fails loudly
    /// instead of being compared with another file's outputs.
    pub fn bytes(&self) -> Vec<u8> {
        let bytes = read(&self.file);
        if let Some(want) = &self.sha256 {
            let have: String = Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                &have,
                want,
                "{} is not the file the oracle was made from: compare {} with MANIFEST.tsv",
                self.file.display(),
                self.name
            );
        }
        bytes
    }
}

/// Every input of `oracle/MANIFEST.tsv`, then upstream's four test files.
pub fn inputs(root: &Path) -> Vec<Input> {
    let oracle = root.join("oracle");
    let manifest = std::fs::read_to_string(oracle.join("MANIFEST.tsv")).expect("manifest");
    let mut out = Vec::new();
    for line in manifest.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (name, path, sha) = (cols[0], cols[1], cols[3]);
        let absolute = path.starts_with('/');
        out.push(Input {
            name: name.to_string(),
            file: if absolute {
                PathBuf::from(path)
            } else {
                oracle.join(path)
            },
            sha256: absolute.then(|| sha.to_string()),
            deltas: oracle.join(format!("{name}.deltas.xz")),
            tsd: Some(oracle.join(format!("{name}.tsd"))),
        });
    }
    let upstream = root.join("upstream");
    for name in [
        "volname",
        "libcrypto-alpine-test.so",
        "schrodinger-libpython3.8.so.1.0",
        "vdso.arch64.withframe",
    ] {
        out.push(Input {
            name: name.to_string(),
            file: upstream.join(name),
            sha256: None,
            deltas: upstream.join(format!("{name}.deltas.xz")),
            tsd: None,
        });
    }
    out
}
