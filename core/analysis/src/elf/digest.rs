//! What a file's tables were built from: the byte ranges the analysis read
//! and their SHA-256 ([`SourceDigest`]).
//!
//! Why: a file id (SEED's definition, the maps' key) hashes only the first
//! and last 4 KiB and the size, so two files can present one id with
//! different unwind tables in between (a user's edited copy of a root
//! library). The id stays the key; the digest is what says whether
//! another file with the same id would have given the same tables: the
//! analysis is a function of the bytes it read, so a file with the same
//! length and the same bytes in the same ranges gives the same tables,
//! loaders' answers and C-library layouts.
//!
//! Checking another file costs reading those ranges again (headers,
//! `.eh_frame`, `.eh_frame_hdr`, symbol tables...: a fraction of the file),
//! not an extraction. Ranges are kept to at most [`MAX_RANGES`] (the
//! smallest gaps between them merged), so a loaded file keeps a few KiB at
//! most however scattered the analysis's reads were.

use std::ops::Range;

use sha2::{Digest, Sha256};

use super::source::{ByteSource, LazyFile, SourceError};

/// The most ranges a digest keeps: gaps beyond are merged, their bytes
/// read and hashed too.
pub const MAX_RANGES: usize = 256;

/// Bytes read at once when checking another file.
const READ_BUFFER: usize = 1 << 20;

/// What the digest's hash starts with: a digest of another scheme never
/// equals one of this one.
const DOMAIN: &[u8] = b"eim source digest v1\0";

/// The ranges of a file an analysis read, and the hash of their bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct SourceDigest {
    /// The file's length.
    pub(crate) len: u64,
    /// Sorted, disjoint, non-empty, inside `0..len`.
    pub ranges: Box<[Range<u64>]>,
    pub(crate) sha256: [u8; 32],
}

impl std::fmt::Debug for SourceDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceDigest")
            .field("len", &self.len)
            .field("ranges", &self.ranges.len())
            .field("bytes", &self.bytes_covered())
            .field("sha256", &self.hex())
            .finish()
    }
}

/// Sorted ranges with overlapping and touching ones merged.
fn coalesce(mut spans: Vec<Range<u64>>) -> Vec<Range<u64>> {
    spans.retain(|r| r.start < r.end);
    spans.sort_unstable_by_key(|r| (r.start, r.end));
    let mut out: Vec<Range<u64>> = Vec::with_capacity(spans.len());
    for r in spans {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// `ranges` (sorted, disjoint) with the smallest gaps merged until at most
/// `max` remain.
fn coarsen(ranges: Vec<Range<u64>>, max: usize) -> Vec<Range<u64>> {
    let max = max.max(1);
    if ranges.len() <= max {
        return ranges;
    }
    let mut gaps: Vec<u64> = ranges.windows(2).map(|w| w[1].start - w[0].end).collect();
    gaps.sort_unstable();
    // Merging every gap up to this one leaves at most `max` ranges (more
    // gaps of the same length merge too, which only leaves fewer).
    let threshold = gaps[ranges.len() - max - 1];
    let mut out: Vec<Range<u64>> = Vec::with_capacity(max);
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start - last.end <= threshold => last.end = r.end,
            _ => out.push(r),
        }
    }
    out
}

fn hasher(len: u64) -> Sha256 {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update(len.to_le_bytes());
    h
}

/// Hashes the bytes of `range`, read a buffer at a time and not kept.
fn hash_unkept(h: &mut Sha256, file: &LazyFile, range: Range<u64>) -> Option<()> {
    let mut buf = vec![0u8; (range.end - range.start).min(READ_BUFFER as u64) as usize];
    let mut pos = range.start;
    while pos < range.end {
        let n = (range.end - pos).min(READ_BUFFER as u64) as usize;
        let piece = buf.get_mut(..n)?;
        file.read_uncached(pos, piece)?;
        h.update(&*piece);
        pos += n as u64;
    }
    Some(())
}

fn hash_range_header(h: &mut Sha256, r: &Range<u64>) {
    h.update(r.start.to_le_bytes());
    h.update(r.end.to_le_bytes());
}

impl SourceDigest {
    /// The digest of what `file` holds: every chunk the analysis read, and
    /// the ranges it read without keeping them ([`LazyFile::streamed`]).
    /// Those, and a gap merged in by [`MAX_RANGES`], are read now, a
    /// buffer at a time (not kept); `None` if that read fails.
    pub fn of(file: &LazyFile) -> Option<Self> {
        let chunks = file.chunks_by_start();
        let spans = chunks
            .iter()
            .map(|&(start, bytes)| start..start.saturating_add(bytes.len() as u64))
            .chain(file.streamed())
            .collect();
        let ranges = coarsen(coalesce(spans), MAX_RANGES);
        let mut h = hasher(file.len());
        let mut next = 0;
        for r in &ranges {
            hash_range_header(&mut h, r);
            let mut pos = r.start;
            while let Some(&(start, bytes)) = chunks.get(next) {
                if start >= r.end {
                    break;
                }
                next += 1;
                let end = start.saturating_add(bytes.len() as u64).min(r.end);
                if end <= pos {
                    continue;
                }
                if start > pos {
                    hash_unkept(&mut h, file, pos..start)?;
                    pos = start;
                }
                let from = usize::try_from(pos - start).ok()?;
                let to = usize::try_from(end - start).ok()?;
                h.update(bytes.get(from..to)?);
                pos = end;
            }
            if pos < r.end {
                hash_unkept(&mut h, file, pos..r.end)?;
            }
        }
        Some(Self {
            len: file.len(),
            ranges: ranges.into_boxed_slice(),
            sha256: h.finalize().into(),
        })
    }

    /// Bytes the ranges cover.
    pub fn bytes_covered(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Whether a file of `len` bytes read from `source` has the same bytes
    /// in every range: then its analysis gives what this file's gave. An
    /// error if a read fails (the other file changed or is unreadable: the
    /// caller cannot call it the same).
    pub fn matches(&self, len: u64, source: &dyn ByteSource) -> Result<bool, SourceError> {
        if len != self.len {
            return Ok(false);
        }
        let mut h = hasher(len);
        let mut buf = vec![0u8; READ_BUFFER];
        for r in self.ranges.iter() {
            hash_range_header(&mut h, r);
            let mut pos = r.start;
            while pos < r.end {
                let n = (r.end - pos).min(READ_BUFFER as u64) as usize;
                let piece = &mut buf[..n];
                source.read_exact_at(pos, piece)?;
                h.update(&*piece);
                pos += n as u64;
            }
        }
        let sha: [u8; 32] = h.finalize().into();
        Ok(sha == self.sha256)
    }

    /// The hash in hex, for reports.
    pub(crate) fn hex(&self) -> String {
        self.sha256.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::source::BLOCK;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 13 + i / 509) as u8).collect()
    }

    /// A lazy file over `bytes` that the "analysis" read `reads` of.
    fn read(bytes: &[u8], reads: &[Range<u64>]) -> LazyFile {
        let lazy = LazyFile::new(Box::new(bytes.to_vec()), bytes.len() as u64);
        for r in reads {
            lazy.view()
                .bytes_at(r.start, r.end - r.start)
                .expect("read");
        }
        lazy
    }

    #[test]
    fn ranges_are_what_was_read_by_block() {
        let bytes = pattern(40 * BLOCK as usize);
        let lazy = read(
            &bytes,
            &[
                0..64,
                10..100,
                5 * BLOCK..5 * BLOCK + 1,
                30 * BLOCK - 3..30 * BLOCK + 3,
            ],
        );
        let d = SourceDigest::of(&lazy).expect("digest");
        assert_eq!(
            &*d.ranges,
            &[0..BLOCK, 5 * BLOCK..6 * BLOCK, 29 * BLOCK..31 * BLOCK]
        );
        assert_eq!(d.len, bytes.len() as u64);
        assert!(d.matches(d.len, &bytes).expect("readable"));
    }

    #[test]
    fn a_change_inside_a_read_range_changes_the_digest_and_outside_does_not() {
        let bytes = pattern(40 * BLOCK as usize);
        let reads = [0..BLOCK, 10 * BLOCK..12 * BLOCK, 39 * BLOCK..40 * BLOCK];
        let d = SourceDigest::of(&read(&bytes, &reads)).expect("digest");

        // Between the file id's head and tail, inside what was read.
        let mut inside = bytes.clone();
        inside[(11 * BLOCK + 7) as usize] ^= 0x55;
        assert!(!d.matches(d.len, &inside).expect("readable"));
        let other = SourceDigest::of(&read(&inside, &reads)).expect("digest");
        assert_ne!(other.sha256, d.sha256);

        // Outside every range: the analysis could not have seen it.
        let mut outside = bytes.clone();
        outside[(20 * BLOCK) as usize] ^= 0x55;
        assert!(d.matches(d.len, &outside).expect("readable"));

        // Another length is never the same file.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(!d.matches(longer.len() as u64, &longer).expect("readable"));
        // A file shorter than a range cannot be read: an error, not "same".
        assert!(d
            .matches(d.len, &bytes[..(11 * BLOCK) as usize].to_vec())
            .is_err());
    }

    /// What an analysis read without keeping it (a search table walked a
    /// window at a time) is in the digest as if it had been kept.
    #[test]
    fn ranges_read_and_not_kept_are_digested_as_kept_ones() {
        let bytes = pattern(40 * BLOCK as usize);
        let kept = [0..BLOCK, 10 * BLOCK..14 * BLOCK];
        let d = SourceDigest::of(&read(&bytes, &kept)).expect("digest");
        let lazy = read(&bytes, &kept[..1]);
        let mut window = vec![0u8; BLOCK as usize];
        for b in 10..14 {
            assert!(lazy.read_into(b * BLOCK, &mut window));
            assert_eq!(
                window[..],
                bytes[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
            );
        }
        assert_eq!(lazy.held(), BLOCK, "nothing kept");
        let streamed = SourceDigest::of(&lazy).expect("digest");
        assert_eq!(streamed, d);
        // A change inside what was read and not kept is seen.
        let mut inside = bytes.clone();
        inside[(12 * BLOCK + 5) as usize] ^= 1;
        assert!(!streamed.matches(streamed.len, &inside).expect("readable"));
    }

    #[test]
    fn an_identical_copy_matches_and_gives_the_same_digest() {
        let bytes = pattern(9 * BLOCK as usize + 17);
        let reads = [0..200, 3 * BLOCK..4 * BLOCK + 5, 9 * BLOCK..9 * BLOCK + 17];
        let a = SourceDigest::of(&read(&bytes, &reads)).expect("digest");
        let b = SourceDigest::of(&read(&bytes.clone(), &reads)).expect("digest");
        assert_eq!(a, b);
        assert!(a.matches(a.len, &bytes.clone()).expect("readable"));
    }

    #[test]
    fn scattered_reads_are_merged_into_few_ranges_that_still_cover_them() {
        let blocks = 3 * MAX_RANGES as u64;
        let bytes = pattern((blocks * BLOCK) as usize);
        // Every third block, a few with a larger gap.
        let reads: Vec<Range<u64>> = (0..blocks)
            .step_by(3)
            .map(|b| b * BLOCK..b * BLOCK + 1)
            .collect();
        let lazy = read(&bytes, &reads);
        let d = SourceDigest::of(&lazy).expect("digest");
        assert!(d.ranges.len() <= MAX_RANGES, "{}", d.ranges.len());
        for r in &reads {
            assert!(d
                .ranges
                .iter()
                .any(|c| c.start <= r.start && r.end <= c.end));
        }
        assert!(d.ranges.windows(2).all(|w| w[0].end < w[1].start));
        assert!(d.matches(d.len, &bytes).expect("readable"));
        let mut changed = bytes.clone();
        changed[(3 * BLOCK + 9) as usize] ^= 1;
        assert!(!d.matches(d.len, &changed).expect("readable"));
    }

    #[test]
    fn coarsening_keeps_order_and_bound() {
        let r: Vec<Range<u64>> = vec![0..1, 2..3, 10..11, 11..12, 30..31];
        assert_eq!(coalesce(r.clone()), vec![0..1, 2..3, 10..12, 30..31]);
        assert_eq!(coarsen(coalesce(r.clone()), 2), vec![0..12, 30..31]);
        assert_eq!(coarsen(coalesce(r), 1), vec![0..31]);
        assert_eq!(coarsen(vec![], 4), Vec::<Range<u64>>::new());
    }
}
