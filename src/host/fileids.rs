//! File ids of opened files (spec 9), cached by what identifies a file's
//! contents cheaply, so a file mapped by a thousand processes is hashed
//! once, not a thousand times.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use eim_analysis::elf::fileid::{self, FileId128};

use super::open::Identity;

/// Entries kept before the cache starts over (a bound, not a tuning knob:
/// a host rarely has this many distinct executables).
pub const CAPACITY: usize = 65_536;

/// File ids by device, inode, size and modification time.
#[derive(Debug, Default)]
pub struct FileIdCache {
    ids: HashMap<Identity, FileId128>,
    hashed: u64,
}

/// Reads exactly `buf.len()` bytes at `offset`, or says the file changed.
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::other("the file is shorter than its size: it changed while being read")
        } else {
            e
        }
    })
}

/// The file id of `file`, whose size is `size`: its first and last 4 KiB.
pub fn compute(file: &File, size: u64) -> io::Result<FileId128> {
    let head_range = fileid::head_range(size);
    let tail_range = fileid::tail_range(size);
    // Both ranges are at most fileid::CHUNK bytes long.
    let mut head = vec![0; (head_range.end - head_range.start) as usize];
    let mut tail = vec![0; (tail_range.end - tail_range.start) as usize];
    read_exact_at(file, &mut head, head_range.start)?;
    read_exact_at(file, &mut tail, tail_range.start)?;
    Ok(fileid::file_id(&head, &tail, size))
}

impl FileIdCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `file`, known by `identity`.
    pub fn get(&mut self, file: &File, identity: Identity) -> io::Result<FileId128> {
        if let Some(id) = self.ids.get(&identity) {
            return Ok(*id);
        }
        let id = compute(file, identity.size)?;
        self.hashed += 1;
        if self.ids.len() >= CAPACITY {
            self.ids.clear();
        }
        self.ids.insert(identity, id);
        Ok(id)
    }

    /// Files hashed so far (cache misses).
    pub fn hashed(&self) -> u64 {
        self.hashed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn identity(dev: u64, size: u64) -> Identity {
        Identity {
            dev,
            inode: 1,
            size,
            mtime_ns: 0,
        }
    }

    #[test]
    fn ids_are_upstreams_and_cached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        // Larger than two chunks, so head and tail differ.
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&bytes))
            .expect("write");
        let file = File::open(&path).expect("open");
        let mut cache = FileIdCache::new();
        let id = cache.get(&file, identity(1, 10_000)).expect("id");
        assert_eq!(id, fileid::file_id_of(&bytes));
        assert_eq!(cache.get(&file, identity(1, 10_000)).expect("id"), id);
        assert_eq!(cache.hashed(), 1);
        // Another identity is hashed again.
        cache.get(&file, identity(2, 10_000)).expect("id");
        assert_eq!(cache.hashed(), 2);
        // A size the file does not have is an error, not a wrong id.
        assert!(compute(&file, 20_000).is_err());
    }

    #[test]
    fn upstreams_test_vector() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v");
        std::fs::write(&path, [0x7f, 0x45, 0x4c, 0x46, 0, 1, 2, 3, 4]).expect("write");
        let id = compute(&File::open(&path).expect("open"), 9).expect("id");
        assert_eq!(
            (id.hi, id.lo),
            (0xcaf6_e590_7166_ac76, 0xeef6_18e5_f7f5_9cd9)
        );
    }
}
