//! Finding the CFI sections, walking their FDEs and emitting the deltas.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::reader::{format_len, Reader};
use super::record::{parse_cie, parse_fde_range, parse_header, FdeRange, HeaderError};
use super::rules::unwind_info;
use super::vm::{Cie, Vm};
use super::{CfiError, EntryError, FdeFilter, ForkFilter, Parallelism, MAX_SECTION_BYTES};

mod parallel;

use crate::elf::{Arch, Elf, Extent, FileView, Region};
use crate::sync::AtomicBool;
use eim_machine::deltas::{hint, info, CfiList, DeltaSink, IntervalData, StackDelta};
#[cfg(test)]
pub(crate) use parallel::PARTS_TAKEN_OVER;

/// `.eh_frame_hdr` fixed part: version, eh_frame_ptr encoding, fde_count
/// encoding, table encoding.
const HDR_SIZE: usize = 4;
/// `.eh_frame` bytes per delta are about 6 on x86-64 (more on arm64):
/// reserving up front spares the walk the copies and the page faults of
/// growing a large output (pages reserved but never written cost nothing).
const SECTION_BYTES_PER_DELTA: usize = 6;

/// The most deltas reserved up front (24 MiB): a 64 MiB section would
/// otherwise reserve 268 MB of address space, which an address-space
/// limit refuses though the walk may never need it. Past this the list
/// grows as it needs (large blocks are remapped, not copied).
const MAX_RESERVED_DELTAS: usize = 1 << 20;

/// A parallel walk hands its helpers copies of the two sections; past this
/// many bytes of them it walks on this thread alone, with no copy. Real
/// files stay well under it (librustc_driver: 7 MB), so they keep their
/// helpers; the biggest sections the caps allow (64 MiB of `.eh_frame`
/// and its table) do not double the walk's memory.
const MAX_PARALLEL_SECTION_BYTES: usize = 16 << 20;

/// A search table bigger than this (which a parallel walk would not copy
/// anyway) is read from a file a window at a time instead of whole: the
/// 25.6 MiB table of the worst `.eh_frame` need not be held while the
/// deltas it leads to grow. Real files' tables stay under it
/// (librustc_driver's: about 1 MB).
const MAX_HELD_TABLE_BYTES: u64 = MAX_PARALLEL_SECTION_BYTES as u64;

/// Bytes of a big search table read at once ([`MAX_HELD_TABLE_BYTES`]).
const TABLE_WINDOW: usize = 64 << 10;

/// The search table's first bytes, read whole when the rest is read a
/// window at a time: the header and its two pointers (20 bytes at most).
const TABLE_HEAD_BYTES: u64 = 64;

/// A walk may parse at most this many times its section's bytes (CIE and
/// FDE records together). A valid section needs at most twice; only a
/// search table naming the same FDEs over and over needs more, and would
/// make upstream's walk quadratic.
const WORK_PER_SECTION_BYTE: u64 = 8;

/// The only search-table encoding used: datarel, signed 4-byte.
const TABLE_ENC: u8 = 0x3b;

/// `rt_sigreturn` trampolines: `mov $15,%rax; syscall` and
/// `mov x8,#139; svc #0`.
const SIGRETURN_X86_64: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
const SIGRETURN_AARCH64: [u8; 8] = [0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

fn usable_header(data: &[u8]) -> bool {
    data.len() >= HDR_SIZE && data.first() == Some(&1) && data.get(3) == Some(&TABLE_ENC)
}

/// An `.eh_frame_hdr`: read whole, or (a big one in a file read on demand)
/// read a window at a time as it is walked.
enum Hdr<'d> {
    Held(Region<'d>),
    Windowed {
        file: FileView<'d>,
        extent: Extent,
        /// The first [`TABLE_HEAD_BYTES`] (or all, if fewer).
        head: &'d [u8],
    },
}

impl<'d> Hdr<'d> {
    /// The first bytes (the whole table if held).
    fn head(&self) -> &'d [u8] {
        match self {
            Hdr::Held(region) => region.data,
            Hdr::Windowed { head, .. } => head,
        }
    }
}

/// `elf`'s `.eh_frame_hdr` as [`Elf::section_region`] finds it, read whole
/// unless it is bigger than [`MAX_HELD_TABLE_BYTES`] and the file is read
/// on demand.
fn eh_frame_hdr<'d>(elf: &Elf<'d>) -> Option<Hdr<'d>> {
    const NAME: &str = ".eh_frame_hdr";
    let extent = elf.section_extent(NAME, MAX_SECTION_BYTES)?;
    if extent.size <= MAX_HELD_TABLE_BYTES || matches!(elf.data, FileView::Slice(_)) {
        return elf.section_region(NAME, MAX_SECTION_BYTES).map(Hdr::Held);
    }
    Some(Hdr::Windowed {
        file: elf.data,
        extent,
        head: elf.bytes_at(extent.offset, extent.size.min(TABLE_HEAD_BYTES))?,
    })
}

/// Upstream's `findEhSections`: `.eh_frame` with a usable `.eh_frame_hdr`
/// (or none), else the `PT_GNU_EH_FRAME` window, whose header must be
/// usable since the FDEs can only be found through it.
fn find_eh_sections<'d>(elf: &Elf<'d>) -> Result<(Option<Hdr<'d>>, Option<Region<'d>>), CfiError> {
    let eh = elf.section_region(".eh_frame", MAX_SECTION_BYTES);
    let hdr = eh_frame_hdr(elf).filter(|hdr| usable_header(hdr.head()));
    if eh.is_some() {
        return Ok((hdr, eh));
    }
    let Some(seg) = elf
        .eh_frame_segment(MAX_SECTION_BYTES)
        .map_err(CfiError::Sections)?
    else {
        return Ok((None, None));
    };
    if seg.data.len() < HDR_SIZE {
        return Err(CfiError::Sections(
            "located ELF region is too small to be a valid eh_frame header",
        ));
    }
    if !usable_header(seg.data) {
        return Err(CfiError::Sections(
            "no suitable way to parsing eh_frame found",
        ));
    }
    let eh = Region {
        vaddr: seg.vaddr.wrapping_add(HDR_SIZE as u64),
        data: seg.data.get(HDR_SIZE..).unwrap_or_default(),
    };
    Ok((Some(Hdr::Held(seg)), Some(eh)))
}

/// Where a search table's entries are read from.
enum Entries<'d> {
    Held(&'d [u8]),
    /// The file, read [`TABLE_WINDOW`] bytes at a time into `window`,
    /// whose first `filled` bytes are the table's from offset `at` on.
    Windowed {
        file: FileView<'d>,
        offset: u64,
        window: Vec<u8>,
        at: u64,
        filled: usize,
    },
}

impl Entries<'_> {
    /// The 4 bytes at table offset `pos`, which lie inside the table;
    /// `None` if they could not be read.
    fn u32_at(&mut self, pos: u64, len: u64) -> Option<u32> {
        let word = |bytes: &[u8], at: u64| {
            usize::try_from(at)
                .ok()
                .and_then(|at| bytes.get(at..)?.first_chunk::<4>())
                .map(|b| u32::from_le_bytes(*b))
        };
        match self {
            Entries::Held(data) => word(data, pos),
            Entries::Windowed {
                file,
                offset,
                window,
                at,
                filled,
            } => {
                let inside = pos >= *at && pos - *at + 4 <= *filled as u64;
                if !inside {
                    // In order, a window at a time: the walk reads on from
                    // `pos`.
                    let n = (len - pos).min(TABLE_WINDOW as u64) as usize;
                    window.resize(n, 0);
                    *at = pos;
                    *filled = 0;
                    if !file.read_into(offset.saturating_add(pos), window) {
                        return None;
                    }
                    *filled = n;
                }
                word(window.get(..*filled).unwrap_or_default(), pos - *at)
            }
        }
    }
}

/// The `.eh_frame_hdr` binary search table.
struct Table<'d> {
    entries: Entries<'d>,
    /// The table's address (pointers are relative to it) and length.
    vaddr: u64,
    len: u64,
    /// Where the next entry is read.
    pos: u64,
    count: u64,
    start: u64,
}

impl<'d> Table<'d> {
    fn new(hdr: &Hdr<'d>) -> Result<Self, CfiError> {
        let (vaddr, len, entries) = match hdr {
            Hdr::Held(region) => (
                region.vaddr,
                region.data.len() as u64,
                Entries::Held(region.data),
            ),
            Hdr::Windowed { file, extent, .. } => (
                extent.vaddr,
                extent.size,
                Entries::Windowed {
                    file: *file,
                    offset: extent.offset,
                    window: Vec::new(),
                    at: 0,
                    filled: 0,
                },
            ),
        };
        // The header lies in the head: its two pointers take 16 bytes at
        // most after its 4.
        let head = hdr.head();
        let mut r = Reader::new(head, HDR_SIZE as u64, vaddr, false);
        let ptr_enc = head.get(1).copied().unwrap_or_default();
        let count_enc = head.get(2).copied().unwrap_or_default();
        r.ptr(ptr_enc).map_err(CfiError::Table)?;
        let count = r.ptr(count_enc).map_err(CfiError::Table)?;
        Ok(Self {
            entries,
            vaddr,
            len,
            pos: r.pos,
            start: r.pos,
            count,
        })
    }

    /// Entries the table really holds.
    fn held(&self) -> u64 {
        let entry = 2 * format_len(TABLE_ENC);
        self.count.min(self.len.saturating_sub(self.start) / entry)
    }

    fn seek(&mut self, index: u64) {
        let entry = 2 * format_len(TABLE_ENC);
        self.pos = self.start.saturating_add(index.saturating_mul(entry));
    }

    /// A pointer in the table's encoding (datarel, signed 4-byte), read as
    /// [`Reader`] reads it: zero past the end.
    fn field(&mut self) -> Result<u64, CfiError> {
        let pos = self.pos;
        self.pos = pos.saturating_add(4);
        let value = match pos.checked_add(4) {
            Some(end) if end <= self.len => self
                .entries
                .u32_at(pos, self.len)
                .ok_or(CfiError::TableUnreadable(pos))?,
            _ => 0,
        };
        Ok((value as i32 as u64).wrapping_add(self.vaddr))
    }

    /// The next entry: (function start, FDE address).
    fn next(&mut self) -> Result<(u64, u64), CfiError> {
        let ip = self.field()?;
        let fde = self.field()?;
        Ok((ip, fde))
    }

    /// A reader at the FDE an entry names.
    fn fde_reader(eh: &Region<'d>, fde: u64) -> Result<Reader<'d>, CfiError> {
        if fde < eh.vaddr {
            return Err(CfiError::FdeBeforeSection {
                fde,
                section: eh.vaddr,
            });
        }
        Ok(Reader::new(eh.data, fde - eh.vaddr, eh.vaddr, false))
    }
}

/// Why [`Walker::fde`] failed: the record, or no room for its deltas.
enum FdeError {
    Header(HeaderError),
    NoRoom(eim_machine::deltas::NoRoom),
}

impl From<HeaderError> for FdeError {
    fn from(e: HeaderError) -> Self {
        Self::Header(e)
    }
}

impl From<EntryError> for FdeError {
    fn from(e: EntryError) -> Self {
        Self::Header(HeaderError::Fatal(e))
    }
}

/// Parsed CIEs by section offset. Every CIE is parsed once (upstream keeps
/// 16 in an LRU; the result is the same, and a hostile file cannot make eim
/// re-parse CIEs).
#[derive(Default)]
struct CieCache {
    /// Bytes of CIE records parsed.
    parsed: u64,
    cies: Vec<Cie>,
    index: HashMap<u64, usize>,
    /// The last CIE used (most FDEs share their predecessor's CIE).
    last: Option<(u64, usize)>,
}

impl CieCache {
    /// The CIE at `pos`; `fde` is the reader of the FDE naming it.
    #[inline]
    fn get(&mut self, fde: &Reader<'_>, pos: u64, arch: Arch) -> Result<&Cie, EntryError> {
        let at = match self.last {
            Some((last, at)) if last == pos => at,
            _ => self.lookup(fde, pos, arch)?,
        };
        match self.cies.get(at) {
            Some(cie) => Ok(cie),
            None => Err(EntryError::CieBeyondEnd(pos)),
        }
    }

    #[inline(never)]
    fn lookup(&mut self, fde: &Reader<'_>, pos: u64, arch: Arch) -> Result<usize, EntryError> {
        let at = match self.index.get(&pos) {
            Some(&at) => at,
            None => {
                let mut r = *fde;
                r.pos = pos;
                let cie = parse_cie(r, arch)?;
                self.parsed = self.parsed.saturating_add(cie.size);
                self.cies.push(cie);
                let at = self.cies.len() - 1;
                self.index.insert(pos, at);
                at
            }
        };
        self.last = Some((pos, at));
        Ok(at)
    }
}

fn sigreturn_code(arch: Arch) -> &'static [u8] {
    match arch {
        Arch::X86_64 => &SIGRETURN_X86_64,
        Arch::Aarch64 => &SIGRETURN_AARCH64,
    }
}

/// Whether the FDE's code in `code` is an `rt_sigreturn` trampoline.
fn is_sigreturn_trampoline(code: &Elf<'_>, range: FdeRange) -> bool {
    let want = sigreturn_code(code.arch);
    range.len == want.len() as u64
        && code
            .virtual_memory(range.start, want.len())
            .is_some_and(|bytes| *bytes == *want)
}

/// Where an emitter reads signal trampolines: the file being extracted,
/// or, on a helper thread (which has no access to it), nowhere: FDEs of a
/// trampoline's length are then taken as ordinary and listed, and the
/// thread taking the part over checks them.
enum Code<'a, 'd> {
    File(&'a Elf<'d>),
    Deferred { arch: Arch, candidates: Vec<u64> },
}

/// Walks the FDEs of one section.
struct Walker<'a, 'd, F: ?Sized, S = IntervalData> {
    cies: CieCache,
    out: Emitter<'a, 'd, F, S>,
    /// Bytes of FDE records parsed.
    parsed: u64,
    /// Most record bytes the walk may parse.
    budget: u64,
}

/// Turns FDEs into deltas.
struct Emitter<'a, 'd, F: ?Sized, S = IntervalData> {
    /// Machine of the file whose CFI is walked.
    arch: Arch,
    /// Where signal trampolines are read.
    code: Code<'a, 'd>,
    allow_generic_regs: bool,
    filter: &'a mut F,
    deltas: &'a mut S,
}

impl<'a, 'd, F: FdeFilter + ?Sized, S: DeltaSink> Walker<'a, 'd, F, S> {
    fn new(section_size: usize, out: Emitter<'a, 'd, F, S>) -> Self {
        Self {
            cies: CieCache::default(),
            out,
            parsed: 0,
            budget: (section_size as u64).saturating_mul(WORK_PER_SECTION_BYTE),
        }
    }

    /// Accounts for an FDE record of `size` bytes.
    fn spend(&mut self, size: u64) -> Result<(), CfiError> {
        self.parsed = self.parsed.saturating_add(size);
        if self.parsed.saturating_add(self.cies.parsed) > self.budget {
            return Err(CfiError::WorkLimit);
        }
        Ok(())
    }

    /// Parses the FDE at `r.pos` and emits its deltas; returns its size.
    /// `sorted` is passed to the first delta's append (later ones are
    /// sorted within the FDE).
    fn fde(&mut self, r: &mut Reader<'_>, table_ip: u64, sorted: bool) -> Result<u64, FdeError> {
        let fde_at = r.pos;
        let (len, cie_pos) = parse_header(r, false)?;
        let cie = self.cies.get(r, cie_pos, self.out.arch)?;
        let range = parse_fde_range(r, cie, table_ip, fde_at)?;
        let out = &mut self.out;
        if out.filter.keep(range.start, range.len, out.deltas) {
            // At most one delta per instruction byte, the state after the
            // last, and the end marker: room for them is had (or refused)
            // here, so that the appends cannot fail.
            let most = r.end().saturating_sub(r.pos).saturating_add(2);
            out.deltas
                .make_room(usize::try_from(most).unwrap_or(usize::MAX))
                .map_err(FdeError::NoRoom)?;
            out.emit(*r, cie, range, sorted, fde_at)?;
        }
        Ok(len)
    }
}

impl<F: FdeFilter + ?Sized, S: DeltaSink> Emitter<'_, '_, F, S> {
    fn is_sigreturn_trampoline(&mut self, range: FdeRange) -> bool {
        match &mut self.code {
            Code::File(elf) => is_sigreturn_trampoline(elf, range),
            Code::Deferred { arch, candidates } => {
                if range.len == sigreturn_code(*arch).len() as u64 {
                    candidates.push(range.start);
                }
                false
            }
        }
    }

    /// `r` is at the FDE's instructions (taken by value so that the hot
    /// loop keeps the cursor in registers).
    fn emit(
        &mut self,
        mut r: Reader<'_>,
        cie: &Cie,
        range: FdeRange,
        mut sorted: bool,
        fde_at: u64,
    ) -> Result<(), EntryError> {
        if cie.signal || self.is_sigreturn_trampoline(range) {
            self.deltas.add_ex(
                StackDelta::new(range.start, hint::KEEP, info::SIGNAL),
                sorted,
            );
        } else {
            sorted = match self.arch {
                Arch::X86_64 => self.rows::<false>(&mut r, cie, range.start, sorted)?,
                Arch::Aarch64 => self.rows::<true>(&mut r, cie, range.start, sorted)?,
            };
            if !r.is_valid() {
                return Err(EntryError::FdeInstructions(fde_at));
            }
        }
        // End of function; a function starting within the padding after it
        // replaces the marker.
        self.deltas.add_ex(
            StackDelta::new(
                range.start.wrapping_add(range.len),
                hint::GAP,
                info::INVALID,
            ),
            sorted,
        );
        Ok(())
    }
}

impl<F: FdeFilter + ?Sized, S: DeltaSink> Emitter<'_, '_, F, S> {
    /// Runs an FDE's instructions from `start`, one delta per row and one
    /// for the state after the last; returns `sorted` for what follows.
    /// `ARM` fixes the architecture at compile time.
    #[inline(always)]
    fn rows<const ARM: bool>(
        &mut self,
        r: &mut Reader<'_>,
        cie: &Cie,
        start: u64,
        mut sorted: bool,
    ) -> Result<bool, EntryError> {
        let arch = if ARM { Arch::Aarch64 } else { Arch::X86_64 };
        let mut vm = Vm::new(arch, cie, start, cie.initial);
        let mut hints = hint::KEEP;
        // On arm64 rows often only save an untracked register: the rule
        // is then recomputed only when the tracked rules may have changed.
        let mut row = info::INVALID;
        while r.has_data() {
            let ip = vm.loc;
            vm.step(r)?;
            if !ARM || vm.changed {
                row = unwind_info(arch, &vm.cur, self.allow_generic_regs);
                vm.changed = false;
            }
            self.deltas.add_ex(StackDelta::new(ip, hints, row), sorted);
            sorted = true;
            hints = hint::NONE;
        }
        if !ARM || vm.changed {
            row = unwind_info(arch, &vm.cur, self.allow_generic_regs);
        }
        self.deltas
            .add_ex(StackDelta::new(vm.loc, hints, row), sorted);
        Ok(sorted)
    }
}

impl<F: FdeFilter + ?Sized, S: DeltaSink> Walker<'_, '_, F, S> {
    /// Walks the FDEs in search-table order (sorted by address).
    fn walk_table(&mut self, hdr: &Hdr<'_>, eh: &Region<'_>) -> Result<(), CfiError> {
        let mut table = Table::new(hdr)?;
        let (held, count) = (table.held(), table.count);
        self.walk_entries(&mut table, eh, 0..count, held, None)
    }

    /// Walks the table entries `indices` (the table positioned at the
    /// first), `held` of which the table holds. Stops early, with `Ok`,
    /// when `cancel` is set.
    fn walk_entries(
        &mut self,
        table: &mut Table<'_>,
        eh: &Region<'_>,
        indices: std::ops::Range<u64>,
        held: u64,
        cancel: Option<&AtomicBool>,
    ) -> Result<(), CfiError> {
        for index in indices {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Ok(());
            }
            let (ip, fde) = table.next()?;
            let mut r = Table::fde_reader(eh, fde)?;
            if index >= held {
                return Err(CfiError::TableTruncated(index));
            }
            match self.fde(&mut r, ip, index > 0) {
                Ok(size) => self.spend(size)?,
                Err(FdeError::Header(HeaderError::Empty)) => {}
                Err(FdeError::Header(HeaderError::UnexpectedType { id, .. })) => {
                    return Err(CfiError::TableFde(EntryError::UnexpectedType(id)))
                }
                Err(FdeError::Header(HeaderError::Fatal(e))) => return Err(CfiError::TableFde(e)),
                Err(FdeError::NoRoom(e)) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Walks every record of a section in file order (unsorted), skipping
    /// CIEs and empty records.
    fn walk_linear(&mut self, section: &Region<'_>, debug_frame: bool) -> Result<(), CfiError> {
        self.out.filter.mark_unsorted();
        self.out.deltas.will_be_sorted();
        let size = section.data.len() as u64;
        let mut at = 0;
        while at < size {
            let mut r = Reader::new(section.data, at, section.vaddr, debug_frame);
            let len = match self.fde(&mut r, 0, false) {
                Ok(len) | Err(FdeError::Header(HeaderError::UnexpectedType { len, .. })) => len,
                Err(FdeError::Header(HeaderError::Empty)) => 4,
                Err(FdeError::Header(HeaderError::Fatal(error))) => {
                    return Err(CfiError::Fde { at, error })
                }
                Err(FdeError::NoRoom(e)) => return Err(e.into()),
            };
            self.spend(len)?;
            // Records are at least 4 bytes, so the walk moves forward.
            at = at.saturating_add(len.max(4));
        }
        Ok(())
    }
}

/// A walker over a CFI section of `section_len` bytes whose CFI describes
/// `code`'s machine code, emitting into `deltas` (with room reserved for
/// the deltas a section of that size usually gives, returned too). The one
/// set-up of the three walks below: they differ only in the section and
/// in how its FDEs are found.
fn walker_over<'a, 'd, F: FdeFilter + ?Sized, S: DeltaSink>(
    section_len: usize,
    arch: Arch,
    code: &'a Elf<'d>,
    allow_generic_regs: bool,
    filter: &'a mut F,
    deltas: &'a mut S,
) -> (Walker<'a, 'd, F, S>, usize) {
    let reserve = (section_len / SECTION_BYTES_PER_DELTA).min(MAX_RESERVED_DELTAS);
    // Only an estimate: without the room the walk still runs.
    deltas.reserve_hint(reserve);
    let out = Emitter {
        arch,
        code: Code::File(code),
        allow_generic_regs,
        filter,
        deltas,
    };
    (Walker::new(section_len, out), reserve)
}

/// The `.eh_frame` walk both entry points share: `table` walks the FDEs
/// through a usable search table (given the walker, the table, the section
/// and the reserved delta count), else they are walked linearly.
fn walk_eh_frame<F: FdeFilter + ?Sized, L: CfiList>(
    elf: &Elf<'_>,
    allow_generic_regs: bool,
    filter: &mut F,
    deltas: &mut L,
    table: impl FnOnce(&mut Walker<'_, '_, F>, &Hdr<'_>, &Region<'_>, usize) -> Result<(), CfiError>,
) -> Result<(), CfiError> {
    let (hdr, eh) = find_eh_sections(elf)?;
    let Some(eh) = eh else {
        return Ok(());
    };
    let len = eh.data.len();
    match hdr {
        Some(hdr) => {
            // In table order, so appended to the plain list.
            let (mut walker, reserve) = walker_over(
                len,
                elf.arch,
                elf,
                allow_generic_regs,
                filter,
                deltas.list(),
            );
            table(&mut walker, &hdr, &eh, reserve)
        }
        None => {
            let (mut walker, _) =
                walker_over(len, elf.arch, elf, allow_generic_regs, filter, deltas);
            walker.walk_linear(&eh, false)
        }
    }
}

/// Adds the deltas of `elf`'s `.eh_frame` (spec 5.3): through the
/// `.eh_frame_hdr` search table when it is usable, else by a linear walk.
/// A file without `.eh_frame` adds nothing.
pub fn parse_eh_frame<F: FdeFilter + ?Sized, L: CfiList>(
    elf: &Elf<'_>,
    allow_generic_regs: bool,
    filter: &mut F,
    deltas: &mut L,
) -> Result<(), CfiError> {
    walk_eh_frame(elf, allow_generic_regs, filter, deltas, |w, hdr, eh, _| {
        w.walk_table(hdr, eh)
    })
}

/// [`parse_eh_frame`] with the search-table walk cut into parts walked on
/// threads of their own (see [`Parallelism`]): the same deltas, the same
/// filter state and the same error as the sequential walk.
pub fn parse_eh_frame_with<F: ForkFilter, L: CfiList>(
    elf: &Elf<'_>,
    allow_generic_regs: bool,
    filter: &mut F,
    deltas: &mut L,
    parallelism: Parallelism,
) -> Result<(), CfiError> {
    walk_eh_frame(
        elf,
        allow_generic_regs,
        filter,
        deltas,
        |w, hdr, eh, reserve| w.walk_table_parallel(hdr, eh, parallelism, reserve),
    )
}

/// Adds the deltas of `elf`'s `.debug_frame` (always a linear walk).
/// `code` is the file being extracted, which differs from `elf` for a
/// separate debug file.
pub fn parse_debug_frame<F: FdeFilter + ?Sized, L: CfiList>(
    elf: &Elf<'_>,
    code: &Elf<'_>,
    allow_generic_regs: bool,
    filter: &mut F,
    deltas: &mut L,
) -> Result<(), CfiError> {
    let Some(section) = elf.section_region(".debug_frame", MAX_SECTION_BYTES) else {
        return Ok(());
    };
    let (mut walker, _) = walker_over(
        section.data.len(),
        elf.arch,
        code,
        allow_generic_regs,
        filter,
        deltas,
    );
    walker.walk_linear(&section, true)
}

/// The FDE covering `addr`, found by binary search in `.eh_frame_hdr`.
/// `Ok(None)` if no FDE covers it or the file has no usable search table.
pub fn lookup_fde(elf: &Elf<'_>, addr: u64) -> Result<Option<FdeRange>, CfiError> {
    let (Some(hdr), Some(eh)) = find_eh_sections(elf)? else {
        return Ok(None);
    };
    let mut table = Table::new(&hdr)?;
    // The first entry starting above addr.
    let (mut lo, mut hi) = (0, table.held());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        table.seek(mid);
        let ip = table.next().map(|(ip, _)| ip).unwrap_or(0);
        if ip > addr {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let Some(index) = lo.checked_sub(1) else {
        return Ok(None);
    };
    table.seek(index);
    let (ip, fde) = table.next()?;
    let mut r = Table::fde_reader(&eh, fde)?;
    let fde_at = r.pos;
    let header = parse_header(&mut r, false).map_err(|e| match e {
        HeaderError::Empty => EntryError::Empty,
        HeaderError::UnexpectedType { id, .. } => EntryError::UnexpectedType(id),
        HeaderError::Fatal(e) => e,
    });
    let range = header
        .and_then(|(_, cie_pos)| {
            let mut tmp = r;
            tmp.pos = cie_pos;
            let cie = parse_cie(tmp, elf.arch)?;
            parse_fde_range(&mut r, &cie, ip, fde_at)
        })
        .map_err(CfiError::TableFde)?;
    let covers = addr >= range.start && addr - range.start < range.len;
    Ok(covers.then_some(range))
}

#[cfg(test)]
mod tests {
    use super::super::KeepAll;
    use super::*;
    use crate::elf::source::{ByteSource, LazyFile};
    use eim_machine::abi::{opcode, UnwindInfo};
    use proptest::prelude::*;

    /// A 64-byte ELF header with no sections and no segments.
    fn bare_elf(machine: u16) -> Vec<u8> {
        let header = eim_test_support::elf::Header {
            machine,
            ..Default::default()
        };
        header.bytes().to_vec()
    }

    const VADDR: u64 = 0x1000;

    /// Builds an `.eh_frame` at [`VADDR`]: one CIE ("zR", pcrel sdata4,
    /// code align 1, data align -8, RA r16) and FDEs.
    struct EhFrame {
        data: Vec<u8>,
    }

    impl EhFrame {
        fn new(cie_instructions: &[u8]) -> Self {
            let mut body = vec![0, 0, 0, 0, 1]; // id 0, version 1
            body.extend_from_slice(b"zR\0");
            body.extend_from_slice(&[1, 0x78, 16, 1, 0x1b]);
            body.extend_from_slice(cie_instructions);
            let mut s = Self { data: vec![] };
            s.record(body);
            s
        }

        fn record(&mut self, mut body: Vec<u8>) {
            while !(body.len() + 4).is_multiple_of(8) {
                body.push(0); // DW_CFA_nop
            }
            self.data
                .extend_from_slice(&(body.len() as u32).to_le_bytes());
            self.data.extend_from_slice(&body);
        }

        /// Adds an FDE for `start .. start + len`; returns its offset.
        fn fde(&mut self, start: u64, len: u32, instructions: &[u8]) -> u64 {
            let at = self.data.len() as u64;
            let id_pos = at + 4;
            let mut body = (id_pos as u32).to_le_bytes().to_vec(); // back to the CIE at 0
            let field = VADDR + id_pos + 4;
            body.extend_from_slice(&(start.wrapping_sub(field) as i32).to_le_bytes());
            body.extend_from_slice(&len.to_le_bytes());
            body.push(0); // augmentation data length
            body.extend_from_slice(instructions);
            self.record(body);
            at
        }

        /// A `.eh_frame_hdr` (placed just before the section) naming
        /// `entries` as (start, FDE offset).
        fn hdr(&self, entries: &[(u64, u64)]) -> (Vec<u8>, u64) {
            self.hdr_at(VADDR - 0x100, entries)
        }

        fn hdr_at(&self, hdr_vaddr: u64, entries: &[(u64, u64)]) -> (Vec<u8>, u64) {
            let mut h = vec![1, 0x1b, 0x03, 0x3b];
            h.extend_from_slice(&0u32.to_le_bytes());
            h.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for &(ip, fde) in entries {
                h.extend_from_slice(&(ip.wrapping_sub(hdr_vaddr) as i32).to_le_bytes());
                h.extend_from_slice(&((VADDR + fde).wrapping_sub(hdr_vaddr) as i32).to_le_bytes());
            }
            (h, hdr_vaddr)
        }
    }

    /// `def_cfa rsp+8; offset r16 at cfa-8`
    const X86_CIE: &[u8] = &[0x0c, 7, 8, 0x90, 1];
    /// `advance 1; def_cfa_offset 16; offset rbp at cfa-16; advance 3;
    /// def_cfa_register rbp; advance 0x20; def_cfa rsp+8`
    const X86_FDE: &[u8] = &[
        0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6, 0x02, 0x20, 0x0c, 7, 8,
    ];

    enum Mode<'a> {
        Linear {
            debug_frame: bool,
        },
        Table {
            hdr: &'a [u8],
            hdr_vaddr: u64,
        },
        /// The table read a window at a time from a file holding it at
        /// offset 100.
        Windowed {
            file: &'a LazyFile,
            hdr_vaddr: u64,
        },
        /// The table walked in chunks with helper threads.
        #[cfg_attr(not(loom), allow(dead_code))]
        Parallel {
            hdr: &'a [u8],
            hdr_vaddr: u64,
            parallelism: Parallelism,
        },
    }

    /// The search-table walk of `data` through `hdr` (at `hdr_vaddr`).
    fn walk_table(data: &[u8], hdr: &[u8], hdr_vaddr: u64) -> Result<IntervalData, CfiError> {
        walk(data, Mode::Table { hdr, hdr_vaddr })
    }

    /// A file holding `hdr` at offset 100, read on demand from `source`
    /// (a copy of those bytes, or one that fails).
    fn hdr_file(hdr: &[u8], source: impl FnOnce(Vec<u8>) -> Box<dyn ByteSource>) -> LazyFile {
        let mut bytes = vec![0xee; 100];
        bytes.extend_from_slice(hdr);
        let len = bytes.len() as u64;
        LazyFile::new(source(bytes), len)
    }

    /// Both ways through the table: read whole, and a window at a time.
    fn walk_table_both(
        data: &[u8],
        hdr: &[u8],
        hdr_vaddr: u64,
    ) -> (
        Result<IntervalData, CfiError>,
        Result<IntervalData, CfiError>,
    ) {
        let file = hdr_file(hdr, |b| Box::new(b));
        let windowed = walk(
            data,
            Mode::Windowed {
                file: &file,
                hdr_vaddr,
            },
        );
        // Only the head's block was kept.
        assert!(file.held() <= 4096, "{} bytes held", file.held());
        (walk_table(data, hdr, hdr_vaddr), windowed)
    }

    fn walk(data: &[u8], mode: Mode<'_>) -> Result<IntervalData, CfiError> {
        let elf_bytes = bare_elf(object::elf::EM_X86_64);
        let elf = Elf::parse(&elf_bytes).expect("bare ELF");
        let mut deltas = IntervalData::new();
        let mut filter = KeepAll;
        let mut walker = Walker::new(
            data.len(),
            Emitter {
                arch: Arch::X86_64,
                code: Code::File(&elf),
                allow_generic_regs: false,
                filter: &mut filter,
                deltas: &mut deltas,
            },
        );
        let section = Region { vaddr: VADDR, data };
        match mode {
            Mode::Linear { debug_frame } => walker.walk_linear(&section, debug_frame)?,
            Mode::Table { hdr, hdr_vaddr } => walker.walk_table(
                &Hdr::Held(Region {
                    vaddr: hdr_vaddr,
                    data: hdr,
                }),
                &section,
            )?,
            Mode::Windowed { file, hdr_vaddr } => {
                let size = file.len() - 100;
                let head = file
                    .view()
                    .bytes_at(100, size.min(TABLE_HEAD_BYTES))
                    .expect("the head");
                let hdr = Hdr::Windowed {
                    file: file.view(),
                    extent: Extent {
                        vaddr: hdr_vaddr,
                        offset: 100,
                        size,
                    },
                    head,
                };
                walker.walk_table(&hdr, &section)?
            }
            Mode::Parallel {
                hdr,
                hdr_vaddr,
                parallelism,
            } => walker.walk_table_parallel(
                &Hdr::Held(Region {
                    vaddr: hdr_vaddr,
                    data: hdr,
                }),
                &section,
                parallelism,
                0,
            )?,
        }
        Ok(deltas)
    }

    fn sp(param: i32, fp: i32) -> UnwindInfo {
        UnwindInfo {
            opcode: opcode::BASE_SP,
            param,
            fp_opcode: if fp == 0 { 0 } else { opcode::BASE_CFA },
            fp_param: fp,
            ..UnwindInfo::default()
        }
    }

    fn sample() -> (EhFrame, Vec<(u64, u64)>) {
        let mut eh = EhFrame::new(X86_CIE);
        let a = eh.fde(0x2000, 0x40, X86_FDE);
        let b = eh.fde(0x2040, 0x10, &[0x41, 0x0e, 16]);
        (eh, vec![(0x2000, a), (0x2040, b)])
    }

    #[test]
    fn an_fde_becomes_rows_and_an_end_marker() {
        let (eh, entries) = sample();
        let fp = UnwindInfo {
            opcode: opcode::BASE_FP,
            param: 16,
            fp_opcode: opcode::BASE_CFA,
            fp_param: -16,
            ..UnwindInfo::default()
        };
        let want = vec![
            StackDelta::new(0x2000, hint::KEEP, sp(8, 0)),
            StackDelta::new(0x2001, hint::NONE, sp(16, -16)),
            StackDelta::new(0x2004, hint::NONE, fp),
            // rbp at CFA-16 is no longer between the CFA and the stack top;
            // the next function starts at the end marker with the same rule,
            // so the marker goes and this delta gains Keep
            StackDelta::new(0x2024, hint::KEEP, sp(8, 0)),
            StackDelta::new(0x2041, hint::NONE, sp(16, 0)),
            StackDelta::new(0x2050, hint::GAP, info::INVALID),
        ];
        let (hdr, hdr_vaddr) = eh.hdr(&entries);
        let table = walk_table(&eh.data, &hdr, hdr_vaddr).unwrap();
        assert_eq!(table.to_vec(), want);
        let mut linear = walk(&eh.data, Mode::Linear { debug_frame: false }).unwrap();
        linear.sort_and_dedup();
        assert_eq!(linear.to_vec(), want);
    }

    #[test]
    fn a_table_naming_one_fde_over_and_over_is_cut_off() {
        let (eh, entries) = sample();
        let (hdr, hdr_vaddr) = eh.hdr(&vec![entries[0]; 1000]);
        assert_eq!(
            walk_table(&eh.data, &hdr, hdr_vaddr).unwrap_err(),
            CfiError::WorkLimit
        );
    }

    #[test]
    fn a_truncated_table_is_an_error() {
        let (eh, entries) = sample();
        // Past the table, upstream reads zeros: an FDE at the header's own
        // address, before the section here...
        let (mut hdr, hdr_vaddr) = eh.hdr(&entries);
        hdr[8..12].copy_from_slice(&3u32.to_le_bytes()); // claims 3 entries
        assert_eq!(
            walk_table(&eh.data, &hdr, hdr_vaddr).unwrap_err(),
            CfiError::FdeBeforeSection {
                fde: hdr_vaddr,
                section: VADDR
            }
        );
        // ... and after it here, where eim stops.
        let (mut hdr, hdr_vaddr) = eh.hdr_at(VADDR + 0x1000, &entries);
        hdr[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            walk_table(&eh.data, &hdr, hdr_vaddr).unwrap_err(),
            CfiError::TableTruncated(2)
        );
    }

    /// A section of `n` small functions 0x20 bytes apart, and its table.
    fn many_functions(n: usize) -> (EhFrame, Vec<(u64, u64)>) {
        let mut eh = EhFrame::new(X86_CIE);
        let entries = (0..n as u64)
            .map(|i| {
                let start = 0x10_0000 + i * 0x20;
                (start, eh.fde(start, 0x10, &[0x41, 0x0e, 16]))
            })
            .collect();
        (eh, entries)
    }

    /// A table read a window at a time walks as the same table held whole:
    /// across the windows' edges, and when it claims more entries than it
    /// holds or ends inside an entry, before or after the section.
    #[test]
    fn a_table_read_a_window_at_a_time_walks_as_a_held_one() {
        // Entries for three windows and more.
        let n = 3 * TABLE_WINDOW / 8 + 100;
        let (eh, entries) = many_functions(n);
        let before = eh.hdr(&entries);
        let after = eh.hdr_at(VADDR + 0x100_0000, &entries);
        let (held, windowed) = walk_table_both(&eh.data, &before.0, before.1);
        let deltas = held.as_ref().map(IntervalData::len);
        assert_eq!(deltas, Ok(3 * n), "a rule, a push, an end marker each");
        assert_eq!(held, windowed);
        for (hdr, hdr_vaddr) in [before, after] {
            for (count, cut) in [(n + 5, 0), (n, 3), (n, 8 * 100 + 5), (n, 8 * n - 7)] {
                let mut hdr = hdr.clone();
                hdr[8..12].copy_from_slice(&(count as u32).to_le_bytes());
                hdr.truncate(hdr.len() - cut);
                let (held, windowed) = walk_table_both(&eh.data, &hdr, hdr_vaddr);
                assert!(held.is_err(), "{count} entries, {cut} bytes cut");
                assert_eq!(held, windowed, "{count} entries, {cut} bytes cut");
            }
        }
    }

    /// loom model of the parallel walk's split and merge: four chunks, this
    /// thread from the front and one helper from the back, every
    /// interleaving of their claims and of the mailbox up to a preemption
    /// bound; the result is the sequential walk's. Run by `core/loom-ci`.
    #[cfg(loom)]
    #[test]
    fn loom_a_parallel_walk_equals_the_sequential_one() {
        let (eh, entries) = many_functions(8);
        let (hdr, hdr_vaddr) = eh.hdr(&entries);
        let sequential = walk_table(&eh.data, &hdr, hdr_vaddr);
        assert_eq!(sequential.as_ref().map(IntervalData::len), Ok(3 * 8));
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = runs.clone();
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let parallelism = Parallelism {
                threads: 2,
                min_fdes_per_part: 2,
            };
            let parallel = walk(
                &eh.data,
                Mode::Parallel {
                    hdr: &hdr,
                    hdr_vaddr,
                    parallelism,
                },
            );
            assert_eq!(parallel, sequential);
        });
        let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("loom: parallel walk: {runs} executions");
        assert!(runs > 1, "nothing to interleave");
    }

    /// A window of the table that cannot be read (the file was cut short
    /// under the walk) ends it, and the file remembers why.
    #[test]
    fn a_table_window_that_cannot_be_read_ends_the_walk() {
        let (eh, entries) = many_functions(2 * TABLE_WINDOW / 8);
        let (hdr, hdr_vaddr) = eh.hdr(&entries);
        let cut = 100 + TABLE_WINDOW + 1000;
        let file = hdr_file(&hdr, |b| Box::new(b[..cut].to_vec()) as Box<dyn ByteSource>);
        let walked = walk(
            &eh.data,
            Mode::Windowed {
                file: &file,
                hdr_vaddr,
            },
        );
        assert!(
            matches!(walked, Err(CfiError::TableUnreadable(_))),
            "{walked:?}"
        );
        assert!(file.failure().is_some());
    }

    #[test]
    fn a_cie_named_by_the_table_is_an_error() {
        let (eh, _) = sample();
        let (hdr, hdr_vaddr) = eh.hdr(&[(0x2000, 0)]);
        assert!(matches!(
            walk_table(&eh.data, &hdr, hdr_vaddr),
            Err(CfiError::TableFde(EntryError::UnexpectedType(0)))
        ));
    }

    #[test]
    fn the_linear_walk_skips_cies_and_terminators() {
        let (mut eh, _) = sample();
        eh.data.extend_from_slice(&[0, 0, 0, 0]);
        let d = walk(&eh.data, Mode::Linear { debug_frame: false }).unwrap();
        // Unsorted: the second FDE's first row is appended after the first
        // one's end marker at the same address; the final sort folds them.
        assert_eq!(d.len(), 8, "{:?}", d.to_vec());
        assert_eq!(d.get(4).unwrap().hints, hint::GAP);
        assert_eq!(d.get(5).unwrap().address, 0x2040);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes: no panic, and the walk ends.
        #[test]
        fn arbitrary_sections_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = walk(&data, Mode::Linear { debug_frame: false });
            let _ = walk(&data, Mode::Linear { debug_frame: true });
        }

        /// A valid section with a few bytes changed: no panic.
        #[test]
        fn mutated_sections_never_panic(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            table_edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        ) {
            let (mut eh, entries) = sample();
            let (mut hdr, hdr_vaddr) = eh.hdr(&entries);
            let len = eh.data.len();
            for (at, b) in edits {
                eh.data[at % len] = b;
            }
            let hlen = hdr.len();
            for (at, b) in table_edits {
                hdr[at % hlen] = b;
            }
            let _ = walk(&eh.data, Mode::Linear { debug_frame: false });
            let _ = walk(&eh.data, Mode::Linear { debug_frame: true });
            let _ = walk(&eh.data, Mode::Table { hdr: &hdr, hdr_vaddr });
        }
    }
}
