//! The oracle's inputs as `oracle/MANIFEST.tsv` names them, then
//! upstream's four test files: where each is here, its outputs, and the
//! check that a file of the machine image is the one the oracle was made
//! from.

use std::path::{Path, PathBuf};

use crate::data::{read, sha256_hex, testdata};

/// One input: its name in the oracle, where it is here, the sha256 it must
/// have, and where its outputs are.
pub struct Input {
    pub name: String,
    /// The file, as the manifest names it resolved against [`Input::dir`].
    pub file: PathBuf,
    /// The path as the manifest gives it (relative to [`Input::dir`], or
    /// absolute for a file of the machine image).
    pub path: String,
    /// The directory of its outputs (`oracle/` or `upstream/`).
    pub dir: PathBuf,
    pub sha256: String,
    pub deltas: PathBuf,
    /// The oracle's `.tsd` file (the upstream test files have none).
    pub tsd: Option<PathBuf>,
    /// The 64-bit host file id the manifest records (oracle inputs only).
    pub fileid64: Option<String>,
}

impl Input {
    /// The file's bytes, after checking it is the one the oracle was made
    /// from: a different package version fails loudly instead of being
    /// compared with another file's outputs.
    pub fn bytes(&self) -> Vec<u8> {
        let bytes = read(&self.file);
        assert_eq!(
            sha256_hex(&bytes),
            self.sha256,
            "{} is not the file the oracle was made from (compare {} with MANIFEST.tsv \
             or SHA256SUMS): its outputs cannot be compared",
            self.file.display(),
            self.name
        );
        bytes
    }

    /// Whether the file is here and is the oracle's. A file of the machine
    /// image that a stock machine lacks (musl's `libc.so`, which
    /// `tests/run` installs) or has in another version (another
    /// distribution, a later package) is a loud skip of this input, or a
    /// failure under `EIM_REQUIRE_INTERPRETERS`; a missing file of the
    /// test data itself is always a failure (and a changed one fails
    /// [`Input::bytes`] and the integrity test).
    pub fn available(&self) -> bool {
        let of_the_machine = Path::new(&self.path).is_absolute();
        if !self.file.exists() {
            assert!(
                of_the_machine,
                "{}: missing from the test data",
                self.file.display()
            );
            crate::skip::skip_or_fail(&format!(
                "the oracle input {} ({})",
                self.file.display(),
                self.name
            ));
            return false;
        }
        if !of_the_machine {
            return true;
        }
        let found = match std::fs::read(&self.file) {
            Ok(bytes) => sha256_hex(&bytes),
            Err(e) => format!("unreadable: {e}"),
        };
        if found == self.sha256 {
            return true;
        }
        crate::skip::skip_unless_required(
            "EIM_REQUIRE_INTERPRETERS",
            &format!(
                "the oracle input {} ({}) is not the file the oracle was made from \
                 (sha256 {found}, MANIFEST.tsv says {}): its outputs cannot be compared",
                self.file.display(),
                self.name,
                self.sha256
            ),
        );
        false
    }
}

/// Every input of `oracle/MANIFEST.tsv`, then upstream's test files (its
/// `SHA256SUMS`).
pub fn inputs(root: &Path) -> Vec<Input> {
    let oracle = root.join("oracle");
    let manifest = std::fs::read_to_string(oracle.join("MANIFEST.tsv")).expect("MANIFEST.tsv");
    let mut out = Vec::new();
    for line in manifest.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        assert!(cols.len() >= 7, "MANIFEST.tsv: short row {line:?}");
        let (name, path, sha, fileid64) = (cols[0], cols[1], cols[3], cols[6]);
        out.push(Input {
            name: name.to_string(),
            file: oracle.join(path),
            path: path.to_string(),
            dir: oracle.clone(),
            sha256: sha.to_string(),
            deltas: oracle.join(format!("{name}.deltas.xz")),
            tsd: Some(oracle.join(format!("{name}.tsd"))),
            fileid64: Some(fileid64.to_string()),
        });
    }
    let upstream = root.join("upstream");
    let sums = std::fs::read_to_string(upstream.join("SHA256SUMS")).expect("SHA256SUMS");
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (sha, name) = line.split_once("  ").expect("sha256sum's format");
        out.push(Input {
            name: name.to_string(),
            file: upstream.join(name),
            path: name.to_string(),
            dir: upstream.clone(),
            sha256: sha.to_string(),
            deltas: upstream.join(format!("{name}.deltas.xz")),
            tsd: None,
            fileid64: None,
        });
    }
    out
}

/// The inputs that are here ([`Input::available`]: the others are loud
/// skips).
pub fn available(root: &Path) -> Vec<Input> {
    inputs(root).into_iter().filter(Input::available).collect()
}

/// Every `<name>.deltas.xz` of the oracle and upstream sets, sorted: the
/// deltas of the inputs [`inputs`] names, which need no machine file to
/// be read.
pub fn delta_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = inputs(&testdata())
        .into_iter()
        .map(|input| input.deltas)
        .collect();
    files.sort();
    files
}
