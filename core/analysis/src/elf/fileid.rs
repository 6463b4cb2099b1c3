//! File ids (spec 9): the 128-bit id upstream derives from an executable's
//! contents, and the 64-bit host id the BPF maps are keyed by.
//!
//! The id is the first 16 bytes of SHA-256 over the file's first
//! `min(4096, size)` bytes, then its last `min(4096, size)` bytes, then its
//! size as a big-endian `u64`. A file under 8 KiB therefore has some (or
//! all) of its bytes hashed twice; that is upstream's definition, kept.
//!
//! No I/O here: [`file_id`] takes the two chunks, so a caller holding a
//! memory map passes two sub-slices of it (nothing is copied), and a caller
//! with a plain reader reads [`head_range`] and [`tail_range`] itself.
//! [`file_id_of`] does both for bytes already in memory.

use std::fmt;
use std::ops::Range;

use sha2::{Digest, Sha256};

use eim_machine::FileId;

/// How many bytes are hashed from each end of the file.
pub(crate) const CHUNK: u64 = 4096;

/// An executable's 128-bit file id (upstream's `libpf.FileID`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId128 {
    /// Digest bytes 0..8, big-endian.
    pub hi: u64,
    /// Digest bytes 8..16, big-endian.
    pub lo: u64,
}

impl FileId128 {
    /// The id whose big-endian bytes are `bytes`.
    pub(crate) fn from_bytes(bytes: [u8; 16]) -> Self {
        let (hi, lo) = bytes.split_at(8);
        Self {
            hi: u64::from_be_bytes(hi.try_into().expect("8 bytes")),
            lo: u64::from_be_bytes(lo.try_into().expect("8 bytes")),
        }
    }

    /// The id's 16 bytes, as the digest had them.
    #[cfg(test)]
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.hi.to_be_bytes());
        out[8..].copy_from_slice(&self.lo.to_be_bytes());
        out
    }

    /// The 64-bit host file id: the first 8 digest bytes, big-endian
    /// (upstream's `host.FileIDFromLibpf`).
    pub fn host(&self) -> FileId {
        FileId(self.hi)
    }
}

/// 32 lowercase hex digits, `hi` first (the oracle's `.fileid` form).
impl fmt::Display for FileId128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.hi, self.lo)
    }
}

impl fmt::Debug for FileId128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileId128({self})")
    }
}

/// Why a string is not a 128-bit file id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a 128-bit file id (32 hex digits): {0:?}")]
pub struct ParseFileIdError(pub String);

impl std::str::FromStr for FileId128 {
    type Err = ParseFileIdError;

    /// Parses the [`Display`](fmt::Display) form: exactly 32 hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseFileIdError(s.to_string());
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let hi = u64::from_str_radix(&s[..16], 16).map_err(|_| bad())?;
        let lo = u64::from_str_radix(&s[16..], 16).map_err(|_| bad())?;
        Ok(Self { hi, lo })
    }
}

/// The byte range of the file hashed first: `[0, min(4096, size))`.
pub fn head_range(size: u64) -> Range<u64> {
    0..size.min(CHUNK)
}

/// The byte range of the file hashed second: the last `min(4096, size)`
/// bytes.
pub fn tail_range(size: u64) -> Range<u64> {
    size - size.min(CHUNK)..size
}

/// The file id of a file of `size` bytes whose [`head_range`] holds `head`
/// and whose [`tail_range`] holds `tail`.
///
/// The chunks are hashed as given: passing anything else gives an id that
/// matches no other implementation's.
pub fn file_id(head: &[u8], tail: &[u8], size: u64) -> FileId128 {
    let mut h = Sha256::new();
    h.update(head);
    h.update(tail);
    h.update(size.to_be_bytes());
    let digest = h.finalize();
    let mut first = [0; 16];
    first.copy_from_slice(&digest[..16]);
    FileId128::from_bytes(first)
}

/// The file id of a whole file's contents (a memory map, say).
pub fn file_id_of(data: &[u8]) -> FileId128 {
    let size = data.len() as u64;
    // Both ranges lie within `data`, so the casts back to usize are exact.
    let head = head_range(size);
    let tail = tail_range(size);
    file_id(
        &data[head.start as usize..head.end as usize],
        &data[tail.start as usize..tail.end as usize],
        size,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct transcription of the definition, for comparison.
    fn reference(data: &[u8]) -> [u8; 16] {
        let n = data.len().min(4096);
        let mut buf = data[..n].to_vec();
        buf.extend_from_slice(&data[data.len() - n..]);
        buf.extend_from_slice(&(data.len() as u64).to_be_bytes());
        let digest = Sha256::digest(&buf);
        digest[..16].try_into().unwrap()
    }

    #[test]
    fn upstream_vector() {
        // libpf/fileid_test.go: 9 bytes, the whole file hashed twice.
        let data = [0x7f, 0x45, 0x4c, 0x46, 0x00, 0x01, 0x02, 0x03, 0x04];
        let id = file_id_of(&data);
        assert_eq!(id.hi, 0xcaf6_e590_7166_ac76);
        assert_eq!(id.lo, 0xeef6_18e5_f7f5_9cd9);
        assert_eq!(id.to_string(), "caf6e5907166ac76eef618e5f7f59cd9");
        assert_eq!(id.host(), FileId(0xcaf6_e590_7166_ac76));
        assert_eq!(id.host().to_string(), "caf6e5907166ac76");
        assert_eq!(file_id(&data, &data, 9), id);
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn small_files_hash_overlapping_data_and_large_ones_skip_the_middle() {
        for len in [0, 1, 100, 4095, 4096, 4097, 8191, 8192, 8193, 20_000] {
            let data = pattern(len);
            let id = file_id_of(&data);
            assert_eq!(id.to_bytes(), reference(&data), "len {len}");
            let size = len as u64;
            assert_eq!(head_range(size).end, size.min(4096), "len {len}");
            assert_eq!(
                tail_range(size).end - tail_range(size).start,
                size.min(4096)
            );
        }
        // Under 8 KiB every byte is hashed, so any change changes the id.
        let mut small = pattern(6000);
        let before = file_id_of(&small);
        small[3000] ^= 1;
        assert_ne!(file_id_of(&small), before);
        // From 8 KiB on, the middle is not hashed: upstream's id ignores it.
        let mut large = pattern(20_000);
        let before = file_id_of(&large);
        large[10_000] ^= 1;
        assert_eq!(file_id_of(&large), before);
        large[19_999] ^= 1;
        assert_ne!(file_id_of(&large), before);
        // The size is hashed too: same chunks, different size.
        let data = pattern(9000);
        let head = &data[..4096];
        let tail = &data[9000 - 4096..];
        assert_eq!(file_id(head, tail, 9000), file_id_of(&data));
        assert_ne!(file_id(head, tail, 9001), file_id_of(&data));
    }

    #[test]
    fn display_parse_and_bytes_round_trip() {
        let id = FileId128 {
            hi: 0x0123_4567_89ab_cdef,
            lo: 0x0000_0000_0000_0001,
        };
        let text = id.to_string();
        assert_eq!(text, "0123456789abcdef0000000000000001");
        assert_eq!(text.parse::<FileId128>(), Ok(id));
        assert_eq!(FileId128::from_bytes(id.to_bytes()), id);
        assert_eq!(
            format!("{id:?}"),
            "FileId128(0123456789abcdef0000000000000001)"
        );
        for bad in [
            "",
            "0123",
            "0123456789abcdef000000000000000g",
            "+123456789abcdef0000000000000001",
        ] {
            assert!(bad.parse::<FileId128>().is_err(), "{bad:?}");
        }
    }
}
