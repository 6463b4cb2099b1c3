//! What the benchmarks that read a host's files share: reading a file with
//! `pread` as `eim` does (`src/files/elf_file.rs`). Finding the files is
//! `eim_test_support::files`.

#![allow(dead_code)] // each bench uses part of it

use std::fs::File;
use std::path::Path;

use eim_analysis::elf::{ByteSource, LazyFile, SourceError};

/// A file read with `pread`, as `eim::elf_file` reads one.
pub struct Pread(pub File);

impl ByteSource for Pread {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset).map_err(|e| {
            SourceError::Io {
                offset,
                len: buf.len() as u64,
                message: e.to_string(),
            }
        })
    }
}

/// `path` opened to be read on demand, or `None` if it cannot be opened.
pub fn lazy(path: &Path) -> Option<LazyFile> {
    let file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    Some(LazyFile::new(Box::new(Pread(file)), len))
}
