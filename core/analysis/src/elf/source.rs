//! Where an ELF file's bytes come from: a slice the caller owns, or a file
//! read on demand into memory eim owns.
//!
//! A shared memory map of a file that another process can truncate raises
//! `SIGBUS` on the next read of a page past the new end (upstream weakness
//! 24): any unprivileged process that maps its own copy of an executable
//! can kill a profiler that maps it too. So the file is never mapped: the
//! analysis reads it through [`FileView`], `object`'s [`ReadRef`] over a
//! [`LazyFile`] that reads each range it is asked for with `pread`
//! ([`ByteSource`], implemented outside the core) into chunks it keeps for
//! its own lifetime, so the slices it hands out stay valid. Only what the
//! analysis touches is read: for librustc_driver (150 MB) that is its
//! headers, `.eh_frame` and `.eh_frame_hdr`, and the symbol tables the
//! loaders look names up in.
//!
//! A read that fails (the file was truncated under it, or an I/O error) is
//! remembered: [`LazyFile::failure`] tells the caller that the analysis may
//! have seen less than the file, whatever it concluded.
//!
//! Chunks start at page ([`BLOCK`]) boundaries and cover whole pages: the
//! small scattered reads of an analysis (code at function starts, headers)
//! then read about what a map would have faulted in (reading 64 KiB blocks
//! instead made librustc_driver's extraction 3x slower). A string read
//! takes [`STRING_WINDOW`] at once, as names are read one after another
//! from a string table. Chunks may overlap (a read spanning two cached chunks gets a new
//! one covering both); the bytes held are bounded by the file's length
//! times [`BUDGET_FACTOR`] plus a block, so no access pattern of a hostile
//! file can make the cache grow past that.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use object::ReadRef;

/// The granularity of reads and of the cache: a page, so that the many
/// small scattered reads of an analysis (code at FDE starts, headers) read
/// what a map would have faulted in, not more.
pub const BLOCK: u64 = 4096;

/// What a string read takes at first: names are read one after another from
/// a string table, so a window of many pages serves many of them.
pub const STRING_WINDOW: u64 = 64 * 1024;

/// The cache holds at most this many times the file's length (plus a
/// block): overlapping chunks are the only way past 1.
pub const BUDGET_FACTOR: u64 = 2;

/// Candidate chunks examined per lookup before reading a new one: bounds
/// the work of a lookup whatever the access pattern.
const LOOKUP_CANDIDATES: usize = 16;

/// Why a read of the file failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// Fewer bytes than the file's length said: it was truncated.
    #[error("only {got} of {len} bytes at offset {offset} could be read: the file was truncated while being read")]
    Truncated { offset: u64, len: u64, got: u64 },
    /// The read failed.
    #[error("reading {len} bytes at offset {offset} failed: {message}")]
    Io {
        offset: u64,
        len: u64,
        message: String,
    },
    /// Reading more would pass the cache's byte budget.
    #[error("reading {len} bytes at offset {offset} would hold more than {budget} bytes of the file in memory")]
    OverBudget { offset: u64, len: u64, budget: u64 },
    /// The memory for the read could not be had (an address-space or
    /// cgroup limit): the file fails, eim goes on.
    #[error("no memory to read {len} bytes at offset {offset}")]
    NoMemory { offset: u64, len: u64 },
}

/// A file's bytes, read by range. Implemented outside the core (with
/// `pread`), and by tests.
pub trait ByteSource: Send + Sync {
    /// Fills `buf` with the bytes at `offset`.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError>;
}

impl ByteSource for Vec<u8> {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        match self.get(at..).and_then(|rest| rest.get(..buf.len())) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(SourceError::Truncated {
                offset,
                len: buf.len() as u64,
                got: self.len().saturating_sub(at) as u64,
            }),
        }
    }
}

/// A file of a known length, read on demand and cached (see the module
/// documentation).
pub struct LazyFile {
    source: Box<dyn ByteSource>,
    len: u64,
    budget: u64,
    /// The chunks, never moved or dropped before `self`: the slices handed
    /// out borrow from them.
    chunks: elsa::sync::FrozenVec<Box<[u8]>>,
    /// (start, end) of every chunk, to its index in `chunks`.
    index: Mutex<BTreeMap<(u64, u64), usize>>,
    held: AtomicU64,
    reads: AtomicU64,
    failure: Mutex<Option<SourceError>>,
    /// Ranges read through [`LazyFile::read_into`] and not kept: sorted,
    /// disjoint, at most [`MAX_STREAMED`].
    streamed: Mutex<Vec<Range<u64>>>,
}

/// Ranges read and not kept that a file remembers one by one; past this,
/// the closest are merged (the digest then covers the bytes between too).
const MAX_STREAMED: usize = 64;

impl fmt::Debug for LazyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyFile")
            .field("len", &self.len)
            .field("held", &self.held())
            .field("reads", &self.reads())
            .finish_non_exhaustive()
    }
}

fn align_down(x: u64) -> u64 {
    x - x % BLOCK
}

impl LazyFile {
    /// A file of `len` bytes read from `source`.
    pub fn new(source: Box<dyn ByteSource>, len: u64) -> Self {
        Self {
            source,
            len,
            budget: len.saturating_mul(BUDGET_FACTOR).saturating_add(BLOCK),
            chunks: elsa::sync::FrozenVec::new(),
            index: Mutex::new(BTreeMap::new()),
            held: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            failure: Mutex::new(None),
            streamed: Mutex::new(Vec::new()),
        }
    }

    /// A view of the whole file for the parsers.
    pub fn view(&self) -> FileView<'_> {
        FileView::Lazy(self)
    }

    /// The file's length, as given when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held in memory.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Reads made from the source.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The first read that failed, if any: the analysis may then have seen
    /// less than the file, whatever it concluded.
    pub fn failure(&self) -> Option<SourceError> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn fail(&self, e: SourceError) {
        let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(e);
        }
    }

    /// Every chunk held, as (its start, its bytes), by start (then end):
    /// what the analysis read, for [`super::digest::SourceDigest::of`].
    pub fn chunks_by_start(&self) -> Vec<(u64, &[u8])> {
        let index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let order: Vec<(u64, usize)> = index.iter().map(|(&(start, _), &i)| (start, i)).collect();
        drop(index);
        order
            .into_iter()
            .filter_map(|(start, i)| Some((start, self.chunks.get(i)?)))
            .collect()
    }

    /// The ranges read through [`LazyFile::read_into`] (not kept), sorted:
    /// what the analysis read besides [`LazyFile::chunks_by_start`].
    pub fn streamed(&self) -> Vec<Range<u64>> {
        self.streamed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fills `buf` with the bytes at `offset`, and keeps them only if a
    /// chunk held them already: for what an analysis reads once, in order,
    /// a window at a time (a search table of 25 MiB need not be held while
    /// the deltas it leads to grow). The range counts as read
    /// ([`LazyFile::streamed`]). `false` if it is not inside the file, or
    /// the read failed (remembered).
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> bool {
        match self.read_uncached(offset, buf) {
            Some(true) => {
                self.note_streamed(offset..offset + buf.len() as u64);
                true
            }
            Some(false) => true,
            None => false,
        }
    }

    /// Fills `buf` with the bytes at `offset`, from a chunk or from the
    /// source, keeping nothing: `Some(true)` if read from the source,
    /// `Some(false)` from a chunk, `None` if outside the file or the read
    /// failed (remembered).
    pub(crate) fn read_uncached(&self, offset: u64, buf: &mut [u8]) -> Option<bool> {
        let end = offset.checked_add(buf.len() as u64)?;
        if end > self.len {
            return None;
        }
        if buf.is_empty() {
            return Some(false);
        }
        if let Some((start, chunk)) = self.cached(&(offset..end)) {
            let at = usize::try_from(offset - start).ok()?;
            buf.copy_from_slice(chunk.get(at..at.checked_add(buf.len())?)?);
            return Some(false);
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        match self.source.read_exact_at(offset, buf) {
            Ok(()) => Some(true),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    /// Records `range` as read and not kept: merged with the ranges it
    /// touches; past [`MAX_STREAMED`] ranges, the two closest are merged.
    fn note_streamed(&self, range: Range<u64>) {
        let mut streamed = self.streamed.lock().unwrap_or_else(|e| e.into_inner());
        let at = streamed.partition_point(|r| r.end < range.start);
        let mut merged = range;
        while let Some(next) = streamed.get(at).filter(|r| r.start <= merged.end) {
            merged = merged.start.min(next.start)..merged.end.max(next.end);
            streamed.remove(at);
        }
        streamed.insert(at, merged);
        if streamed.len() > MAX_STREAMED {
            let closest = streamed
                .windows(2)
                .enumerate()
                .min_by_key(|(_, w)| w[1].start - w[0].end)
                .map(|(i, _)| i);
            if let Some(i) = closest {
                let next = streamed.remove(i + 1);
                if let Some(r) = streamed.get_mut(i) {
                    r.end = next.end;
                }
            }
        }
    }

    /// A cached chunk holding all of `range`, as (its start, its bytes): of
    /// those found, the one reaching furthest (a string read goes on from
    /// there).
    fn cached(&self, range: &Range<u64>) -> Option<(u64, &[u8])> {
        let index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let (&(start, _), &i) = index
            .range(..=(range.start, u64::MAX))
            .rev()
            .take(LOOKUP_CANDIDATES)
            .filter(|(&(_, end), _)| end >= range.end)
            .max_by_key(|(&(_, end), _)| end)?;
        drop(index);
        Some((start, self.chunks.get(i)?))
    }

    /// Reads the blocks covering `range` (inside the file) into a new chunk.
    fn fetch(&self, range: &Range<u64>) -> Result<(u64, &[u8]), SourceError> {
        let start = align_down(range.start);
        let end = range
            .end
            .checked_next_multiple_of(BLOCK)
            .unwrap_or(u64::MAX)
            .min(self.len);
        let size = end - start;
        let held = self.held.fetch_add(size, Ordering::Relaxed);
        if held.saturating_add(size) > self.budget {
            self.held.fetch_sub(size, Ordering::Relaxed);
            return Err(SourceError::OverBudget {
                offset: start,
                len: size,
                budget: self.budget,
            });
        }
        tracing::trace!(offset = start, len = size, "read");
        // Up to a whole section (64 MiB) at once: had fallibly.
        let mut buf = Vec::new();
        if !eim_machine::fallible::fallibly(|| buf.try_reserve_exact(size as usize).is_ok()) {
            self.held.fetch_sub(size, Ordering::Relaxed);
            return Err(SourceError::NoMemory {
                offset: start,
                len: size,
            });
        }
        buf.resize(size as usize, 0);
        let mut buf = buf.into_boxed_slice();
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.source.read_exact_at(start, &mut buf) {
            self.held.fetch_sub(size, Ordering::Relaxed);
            return Err(e);
        }
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let i = self.chunks.len();
        let bytes = self.chunks.push_get(buf);
        index.insert((start, end), i);
        Ok((start, bytes))
    }

    /// The bytes of `range`, from the cache or read now. `None` if the range
    /// is not inside the file, or the read failed (remembered).
    fn bytes(&self, range: Range<u64>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        if range.is_empty() {
            return self.empty_at(range.start);
        }
        let (start, chunk) = self.chunk_for(&range)?;
        chunk.get((range.start - start) as usize..(range.end - start) as usize)
    }

    /// A chunk holding all of `range`, cached or read now; `None` if the
    /// read failed (remembered).
    fn chunk_for(&self, range: &Range<u64>) -> Option<(u64, &[u8])> {
        if let Some(hit) = self.cached(range) {
            return Some(hit);
        }
        match self.fetch(range) {
            Ok(read) => Some(read),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    /// An empty slice at `offset` of the file, as a slice of the whole file
    /// gives it: its address has the alignment of the offset (`object`
    /// checks the alignment of a table it reads even when the table is
    /// empty, so a dangling `&[]` made an empty symbol table an error).
    fn empty_at(&self, offset: u64) -> Option<&[u8]> {
        let Some(last) = self.len.checked_sub(1) else {
            return Some(&[]);
        };
        let probe = offset.min(last);
        let (start, chunk) = self.chunk_for(&(probe..probe + 1))?;
        let at = (offset - start) as usize;
        chunk.get(at..at)
    }

    /// The bytes from `range.start` up to (not including) the first
    /// `delimiter` before `range.end`. A string usually ends inside what is
    /// cached already; otherwise [`STRING_WINDOW`] is read from its start,
    /// then twice as much each time the delimiter is not in it.
    fn bytes_until(&self, range: Range<u64>, delimiter: u8) -> Option<&[u8]> {
        // As a slice answers: a range that does not lie inside the file is
        // refused, even if the delimiter comes before its end.
        let end = range.end;
        if range.start >= end || end > self.len {
            return None;
        }
        let find = |from: u64, chunk: &'_ [u8]| -> (Option<usize>, u64) {
            let avail = chunk.get((range.start - from) as usize..).unwrap_or(&[]);
            let avail = &avail[..avail.len().min((end - range.start) as usize)];
            (
                avail.iter().position(|&b| b == delimiter),
                range.start + avail.len() as u64,
            )
        };
        if let Some((from, chunk)) = self.cached(&(range.start..range.start + 1)) {
            match find(from, chunk) {
                (Some(at), _) => {
                    let at_start = (range.start - from) as usize;
                    return chunk.get(at_start..at_start + at);
                }
                (None, reached) if reached >= end => return None,
                (None, _) => {}
            }
        }
        let mut want = STRING_WINDOW;
        loop {
            let stop = range.start.saturating_add(want).min(end);
            let bytes = self.bytes(range.start..stop)?;
            if let (Some(at), _) = find(range.start, bytes) {
                return Some(&bytes[..at]);
            }
            if stop >= end {
                return None;
            }
            want = want.saturating_mul(2);
        }
    }
}

/// The bytes an [`Elf`](super::Elf) is parsed from: `object`'s [`ReadRef`]
/// over a slice or over a [`LazyFile`].
#[derive(Clone, Copy, Debug)]
pub enum FileView<'d> {
    Slice(&'d [u8]),
    Lazy(&'d LazyFile),
}

impl<'d> FileView<'d> {
    /// The file's length.
    pub fn size(self) -> u64 {
        match self {
            FileView::Slice(s) => s.len() as u64,
            FileView::Lazy(f) => f.len,
        }
    }

    /// The bytes at `offset..offset + len`, if the file has them (and, for
    /// a lazy file, they could be read).
    pub fn bytes_at(self, offset: u64, len: u64) -> Option<&'d [u8]> {
        match self {
            FileView::Slice(s) => {
                let start = usize::try_from(offset).ok()?;
                let end = start.checked_add(usize::try_from(len).ok()?)?;
                s.get(start..end)
            }
            FileView::Lazy(f) => f.bytes(offset..offset.checked_add(len)?),
        }
    }
}

impl FileView<'_> {
    /// Fills `buf` with the bytes at `offset`, without keeping them in a
    /// lazy file's cache ([`LazyFile::read_into`]). `false` if the file does
    /// not have them or they could not be read.
    pub fn read_into(self, offset: u64, buf: &mut [u8]) -> bool {
        match self {
            FileView::Slice(s) => {
                let bytes = usize::try_from(offset)
                    .ok()
                    .and_then(|start| s.get(start..)?.get(..buf.len()));
                match bytes {
                    Some(bytes) => {
                        buf.copy_from_slice(bytes);
                        true
                    }
                    None => false,
                }
            }
            FileView::Lazy(f) => f.read_into(offset, buf),
        }
    }
}

impl<'d> ReadRef<'d> for FileView<'d> {
    fn len(self) -> Result<u64, ()> {
        Ok(self.size())
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'d [u8], ()> {
        self.bytes_at(offset, size).ok_or(())
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'d [u8], ()> {
        match self {
            FileView::Slice(s) => s.read_bytes_at_until(range, delimiter),
            FileView::Lazy(f) => f.bytes_until(range, delimiter).ok_or(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source counting its reads, over bytes that can be cut short.
    struct Cut {
        bytes: Vec<u8>,
        cut_at: AtomicU64,
    }

    impl ByteSource for Cut {
        fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
            let cut = self.cut_at.load(Ordering::Relaxed) as usize;
            self.bytes[..cut.min(self.bytes.len())]
                .to_vec()
                .read_exact_at(offset, buf)
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Reads into the caller's buffer keep nothing (unless a chunk held the
    /// bytes already), and are remembered as ranges, merged when they touch
    /// and bounded in number.
    #[test]
    fn reads_into_a_buffer_keep_nothing_and_are_remembered() {
        let bytes = pattern(300 * BLOCK as usize);
        let lazy = LazyFile::new(Box::new(bytes.clone()), bytes.len() as u64);
        let mut buf = vec![0u8; 100];
        assert!(lazy.read_into(10, &mut buf));
        assert_eq!(buf[..], bytes[10..110]);
        assert!(lazy.read_into(110, &mut buf));
        assert_eq!(buf[..], bytes[110..210]);
        assert_eq!(lazy.held(), 0);
        assert_eq!(
            lazy.streamed(),
            std::iter::once(10..210).collect::<Vec<_>>()
        );
        // Outside the file: refused, nothing remembered.
        assert!(!lazy.read_into(bytes.len() as u64 - 50, &mut buf));
        assert_eq!(lazy.failure(), None);
        // Held already: copied from the chunk, not a read of the range.
        lazy.view().bytes_at(5000, 10).expect("cached");
        assert!(lazy.read_into(4096, &mut buf));
        assert_eq!(buf[..], bytes[4096..4196]);
        assert_eq!(
            lazy.streamed(),
            std::iter::once(10..210).collect::<Vec<_>>()
        );
        // Scattered reads: at most MAX_STREAMED ranges, covering them all.
        for b in (10..300).step_by(2) {
            assert!(lazy.read_into(b * BLOCK, &mut buf));
        }
        let streamed = lazy.streamed();
        assert!(streamed.len() <= MAX_STREAMED, "{}", streamed.len());
        assert!(streamed.windows(2).all(|w| w[0].end < w[1].start));
        for b in (10..300).step_by(2) {
            let r = b * BLOCK..b * BLOCK + 100;
            assert!(streamed
                .iter()
                .any(|s| s.start <= r.start && r.end <= s.end));
        }
        assert_eq!(lazy.held(), BLOCK, "only the chunk read through the cache");
    }

    #[test]
    fn reads_match_the_bytes_and_are_cached_by_block() {
        let bytes = pattern(5 * BLOCK as usize + 123);
        let lazy = LazyFile::new(Box::new(bytes.clone()), bytes.len() as u64);
        let view = lazy.view();
        for (offset, len) in [(0u64, 64u64), (10, 100), (BLOCK - 3, 10), (0, 0)] {
            assert_eq!(
                view.read_bytes_at(offset, len),
                Ok(&bytes[offset as usize..(offset + len) as usize]),
                "{offset}+{len}"
            );
        }
        // The first read took block 0, the third blocks 0 and 1 (one chunk).
        assert_eq!(lazy.reads(), 2);
        assert_eq!(lazy.held(), 3 * BLOCK);
        // Inside cached chunks: no new read.
        view.read_bytes_at(BLOCK + 5, 100).expect("cached");
        assert_eq!(lazy.reads(), 2);
        // Past the end, or overflowing: refused, and not a read failure.
        let len = bytes.len() as u64;
        assert!(view.read_bytes_at(len - 1, 2).is_err());
        assert!(view.read_bytes_at(u64::MAX, 2).is_err());
        assert_eq!(view.read_bytes_at(len, 0), Ok(&[][..]));
        assert_eq!(
            view.read_bytes_at(len - 123, 123),
            Ok(&bytes[bytes.len() - 123..])
        );
        assert_eq!(lazy.failure(), None);
    }

    #[test]
    fn empty_reads_are_aligned_like_the_offset() {
        let bytes = pattern(3 * BLOCK as usize);
        let len = bytes.len() as u64;
        let lazy = LazyFile::new(Box::new(bytes), len);
        let view = lazy.view();
        let base = view.read_bytes_at(0, 1).expect("a byte").as_ptr() as usize;
        for offset in [0, 8, 24, 4096 + 16, len] {
            let empty = view.read_bytes_at(offset, 0).expect("empty");
            assert!(empty.is_empty());
            // Where the file's bytes are, as a slice of the file would be:
            // an empty table at an aligned offset is aligned.
            assert_eq!(
                (empty.as_ptr() as usize).wrapping_sub(base) % 8,
                offset as usize % 8,
                "{offset}"
            );
        }
        assert!(view.read_bytes_at(len + 1, 0).is_err());
        let nothing = LazyFile::new(Box::new(Vec::new()), 0);
        assert_eq!(nothing.view().read_bytes_at(0, 0), Ok(&[][..]));
    }

    #[test]
    fn strings_are_found_across_blocks() {
        let mut bytes = vec![b'a'; 3 * BLOCK as usize];
        bytes[2 * BLOCK as usize + 10] = 0;
        bytes[5] = 0;
        let lazy = LazyFile::new(Box::new(bytes.clone()), bytes.len() as u64);
        let view = lazy.view();
        let len = bytes.len() as u64;
        assert_eq!(view.read_bytes_at_until(0..len, 0), Ok(&bytes[..5]));
        let long = view.read_bytes_at_until(6..len, 0).expect("found");
        assert_eq!(long.len(), 2 * BLOCK as usize + 4);
        // No delimiter before the end of the range.
        assert!(view.read_bytes_at_until(6..100, 0).is_err());
        assert!(view.read_bytes_at_until(2 * BLOCK + 11..len, 0).is_err());
        // The same answers as a slice gives, also for ranges that pass the
        // end of the file (refused, even with a delimiter before it).
        for range in [
            0..len,
            6..len,
            6..100,
            2 * BLOCK..len,
            0..len + 1,
            6..u64::MAX,
        ] {
            assert_eq!(
                view.read_bytes_at_until(range.clone(), 0),
                bytes.as_slice().read_bytes_at_until(range, 0)
            );
        }
    }

    #[test]
    fn reading_every_string_of_a_table_holds_it_about_once() {
        // A string table of 1 MiB: names of 1 to 40 bytes, each ended by a
        // NUL, some pages read first (as symbol lookups do).
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        while bytes.len() < 1 << 20 {
            starts.push(bytes.len() as u64);
            let n = starts.len() % 40 + 1;
            bytes.extend(std::iter::repeat_n(b'a' + (n % 26) as u8, n));
            bytes.push(0);
        }
        let len = bytes.len() as u64;
        let lazy = LazyFile::new(Box::new(bytes.clone()), len);
        let view = lazy.view();
        for page in (0..len).step_by(7 * BLOCK as usize) {
            view.read_bytes_at(page, 1).expect("a page");
        }
        for &start in &starts {
            let name = view
                .read_bytes_at_until(start..len, 0)
                .unwrap_or_else(|()| panic!("{start}: {:?}, {} held", lazy.failure(), lazy.held()));
            assert_eq!(
                name,
                bytes
                    .as_slice()
                    .read_bytes_at_until(start..len, 0)
                    .expect("name")
            );
        }
        assert_eq!(lazy.failure(), None);
        // The pages read first are held twice (in their own chunks and in
        // the string windows), and windows overlap by a page at most.
        let pages = len.div_ceil(7 * BLOCK) * BLOCK;
        let windows = len.div_ceil(STRING_WINDOW) * BLOCK;
        assert!(
            lazy.held() <= len + pages + windows + BLOCK,
            "{} bytes held for a {len}-byte table",
            lazy.held()
        );
    }

    #[test]
    fn a_truncated_file_is_a_remembered_failure_never_stale_bytes() {
        let bytes = pattern(4 * BLOCK as usize);
        let len = bytes.len() as u64;
        // The file had `len` bytes when it was opened, one block now.
        let cut = LazyFile::new(
            Box::new(Cut {
                bytes,
                cut_at: AtomicU64::new(BLOCK),
            }),
            len,
        );
        let view = cut.view();
        view.read_bytes_at(0, 10).expect("before the cut");
        assert_eq!(cut.failure(), None);
        assert!(view.read_bytes_at(2 * BLOCK, 10).is_err());
        assert!(matches!(
            cut.failure(),
            Some(SourceError::Truncated { offset, .. }) if offset == 2 * BLOCK
        ));
        // The first failure stays the one reported.
        assert!(view.read_bytes_at_until(3 * BLOCK..len, 0).is_err());
        assert!(matches!(
            cut.failure(),
            Some(SourceError::Truncated { offset, .. }) if offset == 2 * BLOCK
        ));
    }

    #[test]
    fn the_cache_never_holds_more_than_its_budget() {
        let bytes = pattern(8 * BLOCK as usize);
        let len = bytes.len() as u64;
        let lazy = LazyFile::new(Box::new(bytes), len);
        let view = lazy.view();
        // Reads that each straddle two blocks make overlapping chunks,
        // then a read of the whole file would pass the budget.
        for b in 1..8 {
            view.read_bytes_at(b * BLOCK - 1, 2)
                .expect("within the budget");
        }
        assert_eq!(lazy.held(), 14 * BLOCK);
        assert!(view.read_bytes_at(0, len).is_err());
        assert!(
            lazy.held() <= len * BUDGET_FACTOR + BLOCK,
            "{}",
            lazy.held()
        );
        assert!(matches!(
            lazy.failure(),
            Some(SourceError::OverBudget { .. })
        ));
    }
}
