//! The real ELF files of the test data (`tests/data`), extracted once.
//!
//! The simulator maps real files next to synthetic ones, so that the tables
//! it loads have the shapes real compilers produce (Go binaries, C
//! libraries with thousands of deltas, an arm64 vDSO). Extraction is far
//! slower than a simulated step, so it runs once at start-up and every step
//! reuses the result.

use std::path::{Path, PathBuf};

use eim_analysis::elf::{extract, vdso, Elf};
use eim_machine::deltas::IntervalData;

/// Why the corpus could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error(
        "test data not found at {0} (by default the repository's tests/data; EIM_TESTDATA or --testdata name another)"
    )]
    Missing(PathBuf),
    #[error("cannot read {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {message}")]
    Elf { path: PathBuf, message: String },
}

/// One real file: its name and the deltas extraction gave (the arm64
/// vDSO's synthetic deltas for the vDSO image).
#[derive(Clone, Debug)]
pub struct RealFile {
    pub name: String,
    pub data: IntervalData,
}

/// The ELF inputs of the test data that do not depend on the machine:
/// `oracle/bin/*` and the upstream test files. Sorted by name, so file
/// indices mean the same everywhere.
const UPSTREAM: [&str; 4] = [
    "libcrypto-alpine-test.so",
    "schrodinger-libpython3.8.so.1.0",
    "vdso.arch64.withframe",
    "volname",
];

/// `$EIM_TESTDATA`, else the repository's `tests/data`.
pub fn default_testdata() -> PathBuf {
    eim_test_support::data::testdata_path()
}

/// The paths of the corpus files under `testdata`, sorted.
pub fn corpus_paths(testdata: &Path) -> Result<Vec<PathBuf>, CorpusError> {
    let bin = testdata.join("oracle/bin");
    if !bin.is_dir() || !testdata.join("upstream").is_dir() {
        return Err(CorpusError::Missing(testdata.to_path_buf()));
    }
    let read = |path: &Path| {
        std::fs::read_dir(path).map_err(|cause| CorpusError::Read {
            path: path.to_path_buf(),
            cause,
        })
    };
    let mut paths = Vec::new();
    for entry in read(&bin)? {
        let entry = entry.map_err(|cause| CorpusError::Read {
            path: bin.clone(),
            cause,
        })?;
        paths.push(entry.path());
    }
    paths.extend(UPSTREAM.iter().map(|n| testdata.join("upstream").join(n)));
    paths.sort();
    Ok(paths)
}

/// Extracts one file (no debug-link files: the corpus has none to follow).
pub fn extract_file(path: &Path) -> Result<RealFile, CorpusError> {
    let bytes = std::fs::read(path).map_err(|cause| CorpusError::Read {
        path: path.to_path_buf(),
        cause,
    })?;
    let fail = |message: String| CorpusError::Elf {
        path: path.to_path_buf(),
        message,
    };
    let elf = Elf::parse(&bytes).map_err(|e| fail(e.to_string()))?;
    let data = match vdso::synthesize(&elf) {
        Some(data) => data,
        None => extract(&elf, None).map_err(|e| fail(e.to_string()))?,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(RealFile { name, data })
}

/// Every corpus file, extracted, in path order.
pub fn load(testdata: &Path) -> Result<Vec<RealFile>, CorpusError> {
    corpus_paths(testdata)?
        .iter()
        .map(|p| extract_file(p))
        .collect()
}
