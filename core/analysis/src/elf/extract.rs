//! The extraction stages in upstream's order (spec 5.2): entry stub,
//! `.gopclntab`, `.eh_frame`, `.debug_frame`, the `.gnu_debuglink` file's
//! `.debug_frame`, the pending entry deltas, and the final sort.
//!
//! Core does no I/O: the debug-link file is opened by the caller through a
//! [`DebugLinkOpener`] callback.

use std::fmt;
use std::ops::Range;

use super::ehframe::{self, CfiError, FdeFilter, ForkFilter, Parallelism};
use super::gopclntab::{self, GoError};
use super::{entry, Elf, FileView};
use eim_machine::deltas::{hint, info, CfiList, DeltaSink, FoldingList, IntervalData, StackDelta};

/// With fewer deltas than this after the file's own sources, the
/// debug-link file's `.debug_frame` is parsed too
/// (`numIntervalsToOmitDebugLink`).
pub const DEBUG_LINK_THRESHOLD: usize = 20;

/// Bytes read at the entry point for the entry-stub matchers.
const ENTRY_CODE_BYTES: usize = 128;

/// Why the caller could not provide the debug-link file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DebugFileError {
    pub(crate) kind: ExtractErrorKind,
    pub(crate) message: String,
}

impl DebugFileError {
    pub fn new(kind: ExtractErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// The contents of a debug-link file, however the caller holds them
/// (a `Vec<u8>`, a memory map).
pub type DebugBytes = Box<dyn DebugFileBytes>;

/// A debug file's bytes as the extraction reads them: in memory, or read on
/// demand (so a debug file, too, is never mapped).
pub trait DebugFileBytes {
    /// The whole file.
    fn view(&self) -> FileView<'_>;
    /// The CRC-32 of the whole file, as `.gnu_debuglink` records it.
    fn crc(&self) -> u32;
}

impl DebugFileBytes for Vec<u8> {
    fn view(&self) -> FileView<'_> {
        FileView::Slice(self)
    }

    fn crc(&self) -> u32 {
        debuglink_crc(self)
    }
}

/// Opens the debug-link file named `name` (the `.gnu_debuglink` name) with
/// link CRC `crc`: `Ok(None)` if there is no such file (not an error, as
/// upstream). The bytes are checked against the CRC here, so the caller
/// may return any candidate; a mismatch counts as "no file".
pub type DebugLinkOpener<'a> =
    dyn FnMut(&str, u32) -> Result<Option<DebugBytes>, DebugFileError> + 'a;

/// The stage an extraction failed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Golang,
    EhFrame,
    DebugFrame,
    /// The `.debug_frame` of the debug-link file.
    Debug,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Golang => "golang",
            Stage::EhFrame => "eh_frame",
            Stage::DebugFrame => "debug_frame",
            Stage::Debug => "debug",
        })
    }
}

/// What went wrong inside a stage.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Cause {
    #[error(transparent)]
    Go(#[from] GoError),
    #[error(transparent)]
    Cfi(#[from] CfiError),
    #[error(transparent)]
    DebugFile(#[from] DebugFileError),
}

/// What kind of failure an extraction is, for the caller's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtractErrorKind {
    /// The file or its process is gone: not deferred, not counted.
    NotFound,
    /// The file is not a usable ELF, or its unwind data is malformed.
    Invalid,
    /// The file is of a kind eim does not extract by design (not ELF, a
    /// 32-bit or big-endian ELF, a machine other than x86-64 and arm64):
    /// deferred and counted as upstream does, but reports list it apart
    /// from the failures.
    Unsupported,
    /// The file exceeds a configured limit.
    TooLarge,
    /// Reading failed for another reason.
    Io,
    /// The file changed while it was read (rewritten or truncated): its
    /// tables are not loaded, and it is deferred like a failure, but it is
    /// counted as changed, not as a failed extraction: nothing is wrong
    /// with it or with eim.
    Changed,
}

/// An extraction failure: the stage (worded as upstream's stage wrappers)
/// and the cause. [`ExtractError::kind`] keeps a debug-link opener's
/// `NotFound` distinguishable, unlike upstream's `%v` wrapping.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("failure to parse {stage} stack deltas: {cause}")]
pub struct ExtractError {
    pub stage: Stage,
    pub cause: Cause,
}

impl ExtractError {
    fn new(stage: Stage, cause: impl Into<Cause>) -> Self {
        Self {
            stage,
            cause: cause.into(),
        }
    }

    /// `NotFound`/`Io`/... as the debug-link opener said; `Invalid` for
    /// malformed unwind data.
    pub fn kind(&self) -> ExtractErrorKind {
        match &self.cause {
            Cause::DebugFile(e) => e.kind,
            // Too many deltas, or not the memory for them.
            Cause::Cfi(CfiError::NoRoom(_)) => ExtractErrorKind::TooLarge,
            Cause::Go(_) | Cause::Cfi(_) => ExtractErrorKind::Invalid,
        }
    }
}

/// Upstream's `extractionFilter`: drops FDEs that the Go table covers, that
/// overlap the entry stub, or (from unsorted sources) start at 0, and puts
/// the entry stub's deltas in place.
#[derive(Clone, Debug, Default)]
struct Filter {
    /// Code covered by `.gopclntab` (empty if none).
    go: Range<u64>,
    /// The entry stub (empty if none).
    entry: Range<u64>,
    entry_pending: bool,
    eh_frames: bool,
    golang_frames: bool,
    unsorted: bool,
}

impl Filter {
    fn add_entry_deltas(&mut self, deltas: &mut dyn DeltaSink) {
        deltas.add_ex(
            StackDelta::new(self.entry.start, hint::KEEP, info::STOP),
            !self.unsorted,
        );
        deltas.add_ex(
            StackDelta::new(self.entry.end, hint::NONE, info::INVALID),
            true,
        );
        self.eh_frames = true;
        self.entry_pending = false;
    }
}

impl FdeFilter for Filter {
    fn mark_unsorted(&mut self) {
        self.unsorted = true;
    }

    #[inline]
    fn keep(&mut self, ip_start: u64, ip_len: u64, deltas: &mut dyn DeltaSink) -> bool {
        // Address arithmetic wraps, as upstream's uintptr does.
        let ip_end = ip_start.wrapping_add(ip_len);
        if self.go.start <= ip_start && ip_end <= self.go.end {
            return false;
        }
        // .debug_frame sometimes has broken FDEs at address 0.
        if self.unsorted && ip_start == 0 {
            return false;
        }
        if self.entry_pending && ip_start >= self.entry.start {
            self.add_entry_deltas(deltas);
        }
        if ip_end > self.entry.start && self.entry.end >= ip_start {
            return false;
        }
        self.eh_frames = true;
        true
    }
}

impl ForkFilter for Filter {
    /// The entry deltas are still pending after the entries before a part
    /// if none of them reached the entry stub: for a table sorted by
    /// address, if the last one starts below it.
    fn fork(&self, last_ip: u64) -> Self {
        Self {
            entry_pending: self.entry_pending && last_ip < self.entry.start,
            ..self.clone()
        }
    }

    /// `keep` reads `go`, `entry`, `entry_pending` and `unsorted`;
    /// `eh_frames` and `golang_frames` are only written.
    fn same_state(&self, other: &Self) -> bool {
        self.go == other.go
            && self.entry == other.entry
            && self.entry_pending == other.entry_pending
            && self.unsorted == other.unsorted
    }

    /// `eh_frames` only ever becomes true: either part may have set it.
    fn join(&mut self, end: Self) {
        *self = Self {
            eh_frames: self.eh_frames || end.eh_frames,
            golang_frames: self.golang_frames || end.golang_frames,
            ..end
        };
    }
}

/// Whether unwinding may use general registers as CFA base: only for
/// OpenSSL's libcrypto, whose hand-written assembly needs it.
fn allows_generic_registers(elf: &Elf<'_>) -> bool {
    elf.soname()
        .is_some_and(|name| name.starts_with(b"libcrypto.so."))
}

/// The entry stub's range, if the entry code is a known stub.
fn entry_stub(elf: &Elf<'_>) -> Option<Range<u64>> {
    let start = elf.entry();
    if start == 0 {
        return None;
    }
    let code = elf.virtual_memory(start, ENTRY_CODE_BYTES)?;
    match entry::stub_len(elf.arch, &code) {
        0 => None,
        len => Some(start..start.wrapping_add(len as u64)),
    }
}

/// The CRC-32 (IEEE) of a whole file, as `.gnu_debuglink` records it.
pub fn debuglink_crc(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |crc, &b| {
        TABLE[usize::from((crc as u8) ^ b)] ^ (crc >> 8)
    })
}

/// Stage 5: the debug-link file's `.debug_frame`.
fn debug_link_stage<L: CfiList>(
    elf: &Elf<'_>,
    allow_generic_regs: bool,
    open: &mut DebugLinkOpener<'_>,
    filter: &mut Filter,
    deltas: &mut L,
) -> Result<(), ExtractError> {
    let Some(link) = elf.debug_link() else {
        return Ok(());
    };
    let Some(file) = open(&link.name, link.crc).map_err(|e| ExtractError::new(Stage::Debug, e))?
    else {
        return Ok(());
    };
    if file.crc() != link.crc {
        return Ok(());
    }
    let Ok(debug) = Elf::parse_view(file.view()) else {
        return Ok(());
    };
    ehframe::parse_debug_frame(&debug, elf, allow_generic_regs, filter, deltas)
        .map_err(|e| ExtractError::new(Stage::Debug, e))
}

/// Extracts the stack deltas of `elf` (upstream's `extractFile`).
///
/// `debug_link` stands for upstream's file reference: without it the
/// debug-link stage is skipped; with it, a file with fewer than
/// [`DEBUG_LINK_THRESHOLD`] deltas has its `.gnu_debuglink` file opened
/// through it.
pub fn extract(
    elf: &Elf<'_>,
    debug_link: Option<&mut DebugLinkOpener<'_>>,
) -> Result<IntervalData, ExtractError> {
    extract_with(elf, debug_link, Parallelism::available())
}

/// [`extract`], with the `.eh_frame` search-table walk using at most
/// `parallelism.threads` threads (the result does not depend on it).
pub fn extract_with(
    elf: &Elf<'_>,
    debug_link: Option<&mut DebugLinkOpener<'_>>,
    parallelism: Parallelism,
) -> Result<IntervalData, ExtractError> {
    // Folded as they come while they come in order: a linear walk need
    // not hold every delta until the final sort.
    extract_folding(elf, debug_link, parallelism, FoldingList::new())
}

/// [`extract_with`], appending to `folding`.
fn extract_folding(
    elf: &Elf<'_>,
    mut debug_link: Option<&mut DebugLinkOpener<'_>>,
    parallelism: Parallelism,
    mut folding: FoldingList,
) -> Result<IntervalData, ExtractError> {
    let sort = extract_into(elf, debug_link.as_deref_mut(), parallelism, &mut folding);
    if !folding.is_lost() {
        if let Some(deltas) = folding.finish(sort?) {
            return Ok(deltas);
        }
    }
    // Out of order after some were folded away: again, holding them all.
    let mut deltas = IntervalData::new();
    if extract_into(elf, debug_link, parallelism, &mut deltas)? {
        deltas.sort_and_dedup();
    }
    Ok(deltas)
}

/// The stages of [`extract_with`], appending to `deltas`; returns whether
/// the list must then be sorted and de-duplicated.
fn extract_into<L: CfiList>(
    elf: &Elf<'_>,
    debug_link: Option<&mut DebugLinkOpener<'_>>,
    parallelism: Parallelism,
    deltas: &mut L,
) -> Result<bool, ExtractError> {
    let mut filter = Filter::default();
    let allow_generic_regs = allows_generic_registers(elf);

    if let Some(range) = entry_stub(elf) {
        filter.entry = range;
        filter.entry_pending = true;
    }
    if let Some(range) =
        gopclntab::extract(elf, deltas.list()).map_err(|e| ExtractError::new(Stage::Golang, e))?
    {
        filter.go = range;
        filter.golang_frames = true;
    }
    ehframe::parse_eh_frame_with(elf, allow_generic_regs, &mut filter, deltas, parallelism)
        .map_err(|e| ExtractError::new(Stage::EhFrame, e))?;
    ehframe::parse_debug_frame(elf, elf, allow_generic_regs, &mut filter, deltas)
        .map_err(|e| ExtractError::new(Stage::DebugFrame, e))?;
    if let Some(open) = debug_link {
        if deltas.held() < DEBUG_LINK_THRESHOLD {
            debug_link_stage(elf, allow_generic_regs, open, &mut filter, deltas)?;
        }
    }
    if filter.entry_pending {
        filter.add_entry_deltas(deltas);
    }
    Ok(filter.unsorted || (filter.eh_frames && filter.golang_frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(debuglink_crc(b"123456789"), 0xcbf4_3926);
        assert_eq!(debuglink_crc(b""), 0);
    }

    #[test]
    fn the_filter_drops_go_code_and_the_entry_stub() {
        let mut f = Filter {
            go: 0x1000..0x2000,
            entry: 0x3000..0x3040,
            entry_pending: true,
            ..Filter::default()
        };
        let mut d = IntervalData::new();
        assert!(!f.keep(0x1000, 0x1000, &mut d), "inside the Go range");
        assert!(f.keep(0x2000, 0x10, &mut d));
        assert!(d.is_empty() && f.entry_pending);
        assert!(!f.keep(0x3030, 0x20, &mut d), "overlaps the entry stub");
        assert!(
            !f.entry_pending,
            "entry deltas come before the first FDE at or after it"
        );
        assert_eq!(
            d.to_vec(),
            vec![
                StackDelta::new(0x3000, hint::KEEP, info::STOP),
                StackDelta::new(0x3040, hint::NONE, info::INVALID),
            ]
        );
        assert!(f.keep(0x3041, 0x10, &mut d));
    }

    #[test]
    fn without_an_entry_stub_fdes_at_zero_are_dropped() {
        // Upstream's overlap test with an empty entry range [0, 0).
        let mut f = Filter::default();
        let mut d = IntervalData::new();
        assert!(!f.keep(0, 0x10, &mut d));
        assert!(f.keep(1, 0x10, &mut d));
    }

    /// A walk cut in two, the second part walked from `fork` into a
    /// detached run, then joined: the same filter state and deltas as
    /// the sequential walk, and `fork` guesses right on sorted tables.
    #[test]
    fn a_forked_filter_continues_as_the_sequential_one() {
        use eim_machine::deltas::{DeltaSink, Detached};
        fn walk(f: &mut Filter, fdes: &[(u64, u64)], out: &mut dyn DeltaSink) {
            for &(start, len) in fdes {
                if f.keep(start, len, out) {
                    out.add_ex(StackDelta::new(start, hint::KEEP, info::sp(8)), true);
                    out.add_ex(StackDelta::new(start + 4, hint::NONE, info::sp(16)), true);
                    out.add_ex(StackDelta::new(start + len, hint::GAP, info::INVALID), true);
                }
            }
        }
        // Functions every 0x20 bytes, some padding-adjacent, a Go range
        // at the end (a last part that keeps nothing) and an entry stub
        // in the middle.
        let fdes: Vec<(u64, u64)> = (0..40u64)
            .map(|i| (0x1000 + i * 0x20, if i % 3 == 0 { 0x20 } else { 0x12 }))
            .collect();
        let initial = Filter {
            go: 0x1480..0x1520,
            entry: 0x1300..0x1318,
            entry_pending: true,
            ..Filter::default()
        };
        let mut sequential = initial.clone();
        let mut want = IntervalData::new();
        walk(&mut sequential, &fdes, &mut want);
        assert!(!sequential.entry_pending);
        for split in 1..fdes.len() {
            let mut first = initial.clone();
            let start = first.fork(fdes[split - 1].0);
            let mut got = IntervalData::new();
            walk(&mut first, &fdes[..split], &mut got);
            assert!(first.same_state(&start), "split {split}: wrong guess");
            let mut second = start.clone();
            let mut run = Detached::with_capacity(0);
            walk(&mut second, &fdes[split..], &mut run);
            assert!(run.attach_to(&mut got), "split {split}");
            first.join(second);
            assert_eq!(got, want, "split {split}");
            assert!(first.same_state(&sequential) && first.eh_frames == sequential.eh_frames);
        }
    }

    /// Real files, their `.eh_frame` walked linearly (the search table's
    /// section renamed away) and folded a delta at a time: exactly the
    /// deltas of the plain list sorted at the end, unless out-of-order
    /// FDEs lose the folded list (then extraction walks again).
    #[test]
    fn folding_real_files_as_they_are_walked_gives_what_sorting_at_the_end_gives() {
        let root = eim_test_support::testdata();
        let (mut folded, mut lost) = (0, 0);
        for input in eim_test_support::oracle::available(&root) {
            let mut bytes = input.bytes();
            let name = b".eh_frame_hdr\0";
            let Some(at) = bytes.windows(name.len()).position(|w| w == name) else {
                continue;
            };
            bytes[at + 1] = b'E';
            let Ok(elf) = Elf::parse(&bytes) else {
                continue;
            };
            let mut plain = IntervalData::new();
            let sort = extract_into(&elf, None, Parallelism::SEQUENTIAL, &mut plain);
            let Ok(sort) = sort else {
                continue;
            };
            assert!(sort, "{}: a linear walk", input.name);
            plain.sort_and_dedup();
            let mut folding = FoldingList::with_chunk(1);
            let folding_sort = extract_into(&elf, None, Parallelism::SEQUENTIAL, &mut folding);
            match folding_sort.map(|sort| folding.finish(sort)) {
                Ok(Some(list)) => {
                    assert_eq!(list, plain, "{}", input.name);
                    folded += 1;
                }
                _ => lost += 1,
            }
            // Lost or not, extraction gives the plain list's deltas.
            let extracted = extract_folding(
                &elf,
                None,
                Parallelism::SEQUENTIAL,
                FoldingList::with_chunk(1),
            );
            assert_eq!(extracted.ok(), Some(plain), "{}", input.name);
        }
        eprintln!("{folded} files folded as walked, {lost} lost");
        assert!(
            folded >= 4 && lost >= 1,
            "{folded} files folded, {lost} lost"
        );
    }
}
