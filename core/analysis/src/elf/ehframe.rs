//! `.eh_frame`, `.eh_frame_hdr` and `.debug_frame` (spec 5.3, 5.4): call
//! frame information to stack deltas, exactly as upstream's SEED revision
//! derives them.
//!
//! * `reader`: a byte cursor with upstream's overread rule, LEB128 and
//!   pointer encodings.
//! * `record`: CIE and FDE records.
//! * `vm`: the CFA instructions and the recognised expressions.
//! * `rules`: register rules to [`UnwindInfo`](eim_machine::abi::UnwindInfo).
//! * `walk`: finding the sections, walking the FDEs (through the
//!   `.eh_frame_hdr` search table or linearly) and emitting the deltas; a
//!   big search table is walked in chunks on the machine's cores
//!   ([`Parallelism`], [`ForkFilter`], [`eim_machine::deltas::Detached`]), with
//!   exactly the sequential walk's result.
//!
//! The parser allocates nothing per FDE or per delta (apart from growing
//! the output and caching parsed CIEs); it reads the section in place,
//! except that a parallel walk hands its helper threads one copy of the
//! two sections. Every loop is bounded by the input: records must lie
//! inside their section and every walk step moves forward.

mod reader;
mod record;
mod rules;
mod vm;
mod walk;

#[cfg(test)]
pub(crate) use walk::PARTS_TAKEN_OVER;

pub use record::FdeRange;
pub use walk::{lookup_fde, parse_debug_frame, parse_eh_frame, parse_eh_frame_with};

use eim_machine::deltas::DeltaSink;

/// Largest `.eh_frame` / `.debug_frame` (or `PT_GNU_EH_FRAME` window)
/// read, as upstream's `maxBytesEHFrame`.
pub(crate) const MAX_SECTION_BYTES: u64 = 64 * 1024 * 1024;

/// Decides, per FDE, whether its deltas are wanted (upstream's `fdeHook`).
/// It may add deltas of its own first (the entry stub's).
pub trait FdeFilter {
    /// The FDEs come from an unsorted source (a linear walk).
    fn mark_unsorted(&mut self);
    /// Whether to emit the deltas of the FDE covering
    /// `ip_start .. ip_start + ip_len`.
    fn keep(&mut self, ip_start: u64, ip_len: u64, deltas: &mut dyn DeltaSink) -> bool;
}

/// A filter that a walk split into parts (one thread each) can hand from
/// one part to the next.
///
/// Contract: what [`FdeFilter::keep`] returns and appends depends only on
/// its arguments and on the state that [`ForkFilter::same_state`]
/// compares; `join` then gives the state walking both parts in a row
/// gives.
pub trait ForkFilter: FdeFilter + Clone + Send + 'static {
    /// A guess of the state the walk will be in after the table entries
    /// before a part, the last of which starts at `last_ip`. A wrong
    /// guess costs time (the part is walked again), never correctness.
    fn fork(&self, last_ip: u64) -> Self;
    /// Whether `self` behaves as `other` from here on.
    fn same_state(&self, other: &Self) -> bool;
    /// Takes the state reached by walking a part from a state that
    /// `same_state` found equal to `self`'s.
    fn join(&mut self, end: Self);
}

/// How a `.eh_frame` walk through the search table may use threads: the
/// table is cut into chunks of at least `min_fdes_per_part` FDEs (at most
/// sixteen per thread, at least [`Parallelism::MIN_CHUNKS`]); this thread
/// walks them from the front, `threads - 1` helpers from the back, until
/// they meet. A helper that is slow to start (a busy machine) only means
/// this thread walks more chunks itself: it never waits for more than the
/// chunk a helper is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallelism {
    pub(crate) threads: usize,
    pub(crate) min_fdes_per_part: u64,
}

impl Parallelism {
    /// One thread.
    pub const SEQUENTIAL: Self = Self {
        threads: 1,
        min_fdes_per_part: u64::MAX,
    };

    /// Chunks of at least this many FDEs (about 50 to 100 microseconds of
    /// work): starting a helper costs tens of microseconds.
    pub(crate) const DEFAULT_MIN_FDES_PER_PART: u64 = 256;

    /// Fewer chunks than this: no helper.
    pub const MIN_CHUNKS: u64 = 4;

    /// The machine's cores (at most 4), with the default chunk size.
    pub fn available() -> Self {
        static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let threads = *THREADS
            .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)));
        Self {
            threads,
            min_fdes_per_part: Self::DEFAULT_MIN_FDES_PER_PART,
        }
    }

    /// How many chunks a table of `fdes` entries is cut into (1: walked
    /// sequentially).
    fn chunks(self, fdes: u64) -> u64 {
        if self.threads < 2 {
            return 1;
        }
        let by_size = fdes / self.min_fdes_per_part.max(1);
        let chunks = by_size.min(16 * self.threads as u64);
        if chunks < Self::MIN_CHUNKS.min(fdes) {
            1
        } else {
            chunks.max(1)
        }
    }
}

/// A filter that keeps every FDE.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeepAll;

#[cfg(test)]
impl FdeFilter for KeepAll {
    fn mark_unsorted(&mut self) {}
    fn keep(&mut self, _: u64, _: u64, _: &mut dyn DeltaSink) -> bool {
        true
    }
}

#[cfg(test)]
impl ForkFilter for KeepAll {
    fn fork(&self, _: u64) -> Self {
        Self
    }
    fn same_state(&self, _: &Self) -> bool {
        true
    }
    fn join(&mut self, _: Self) {}
}

/// Why a CIE or FDE could not be used. The messages follow upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("FDE/CIE empty")]
    Empty,
    #[error("CIE/FDE {0:#x}: unexpected FDE/CIE type")]
    UnexpectedType(u64),
    #[error("unsupported initial length {0:#x}")]
    InitialLength(u32),
    #[error("CIE/FDE extends beyond end at {0:#x}")]
    BeyondEnd(u64),
    #[error("FDE starts beyond end at {0:#x}")]
    CieBeyondEnd(u64),
    #[error("CIE {at:#x} failed: {error}")]
    Cie { at: u64, error: Box<EntryError> },
    #[error("CIE version {0} not supported")]
    CieVersion(u8),
    #[error("CIE augmentation string is not terminated")]
    UnterminatedAugmentation,
    #[error("too old augmentation string '{0}'")]
    OldAugmentation(String),
    #[error("unsupported augmentation string '{0}'")]
    Augmentation(String),
    #[error("CIE not valid after header")]
    CieTruncated,
    #[error("CIE {0:x} parsing failed")]
    CieInstructions(u64),
    #[error("unsupported format encoding {0:#04x}")]
    PointerFormat(u8),
    #[error("unsupported adjust encoding {0:#04x}")]
    PointerAdjust(u8),
    #[error("unsupported indirect encoding {0:#04x}")]
    PointerIndirect(u8),
    #[error("FDE ipStart ({fde:x}) not matching search table FDE ipStart ({table:x})")]
    TableMismatch { fde: u64, table: u64 },
    #[error("FDE {0:x} not valid after header")]
    FdeTruncated(u64),
    #[error("DWARF opcode {0:#04x} not implemented")]
    Opcode(u8),
    #[error("dwarf stack overflow at {0:x}")]
    StackOverflow(u64),
    #[error("dwarf stack underflow at {0:x}")]
    StackUnderflow(u64),
    #[error("FDE {0:x} parsing failed")]
    FdeInstructions(u64),
}

/// Why a `.eh_frame` or `.debug_frame` walk failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CfiError {
    /// No usable section was found although a `PT_GNU_EH_FRAME` exists.
    #[error("failed to get EH sections: {0}")]
    Sections(&'static str),
    /// The `.eh_frame_hdr` search table could not be decoded.
    #[error("{0}")]
    Table(EntryError),
    #[error("FDE {fde:#x} before section start {section:#x}")]
    FdeBeforeSection { fde: u64, section: u64 },
    /// A search table read a window at a time could not be read there
    /// (the file's read failed; the file remembers why).
    #[error("the .eh_frame_hdr search table could not be read at byte {0}")]
    TableUnreadable(u64),
    /// The search table claims more entries than it holds (eim stops here;
    /// upstream would read zeros for the missing ones).
    #[error("the .eh_frame_hdr search table is truncated at entry {0}")]
    TableTruncated(u64),
    /// The walk parsed several times its section's size in records: a
    /// search table naming the same FDEs over and over (eim stops;
    /// upstream's walk would go on, quadratically).
    #[error("the .eh_frame_hdr search table names the same FDEs too often")]
    WorkLimit,
    /// An FDE named by the search table failed.
    #[error("failed to parse FDE: {0}")]
    TableFde(EntryError),
    /// The record at a section offset failed (linear walk).
    #[error("failed to parse FDE {at:#x}: {error}")]
    Fde { at: u64, error: EntryError },
    /// The deltas outgrew the memory eim could have, or what the kernel
    /// takes: the file is refused, eim goes on.
    #[error(transparent)]
    NoRoom(#[from] eim_machine::deltas::NoRoom),
}
