//! Finding the CFI sections, walking their FDEs and emitting the deltas.

use std::collections::HashMap;

use super::reader::{format_len, Reader};
use super::record::{parse_cie, parse_fde_range, parse_header, FdeRange, HeaderError};
use super::rules::unwind_info;
use super::vm::{Cie, Vm};
use super::{CfiError, EntryError, FdeFilter, MAX_SECTION_BYTES};
use crate::deltas::{hint, info, IntervalData, StackDelta};
use crate::elf::{Arch, Elf, Region};

/// `.eh_frame_hdr` fixed part: version, eh_frame_ptr encoding, fde_count
/// encoding, table encoding.
const HDR_SIZE: usize = 4;
/// `.eh_frame` bytes per delta are about 6 on x86-64 (more on arm64):
/// reserving up front spares the walk the copies and the page faults of
/// growing a large output (pages reserved but never written cost nothing).
const SECTION_BYTES_PER_DELTA: usize = 6;

/// The only search-table encoding used: datarel, signed 4-byte.
const TABLE_ENC: u8 = 0x3b;

/// `rt_sigreturn` trampolines: `mov $15,%rax; syscall` and
/// `mov x8,#139; svc #0`.
const SIGRETURN_X86_64: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
const SIGRETURN_AARCH64: [u8; 8] = [0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

fn usable_header(hdr: &Region<'_>) -> bool {
    hdr.data.len() >= HDR_SIZE
        && hdr.data.first() == Some(&1)
        && hdr.data.get(3) == Some(&TABLE_ENC)
}

/// Upstream's `findEhSections`: `.eh_frame` with a usable `.eh_frame_hdr`
/// (or none), else the `PT_GNU_EH_FRAME` window, whose header must be
/// usable since the FDEs can only be found through it.
fn find_eh_sections<'d>(
    elf: &Elf<'d>,
) -> Result<(Option<Region<'d>>, Option<Region<'d>>), CfiError> {
    let eh = elf.section_region(".eh_frame", MAX_SECTION_BYTES);
    let hdr = elf
        .section_region(".eh_frame_hdr", MAX_SECTION_BYTES)
        .filter(usable_header);
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
    if !usable_header(&seg) {
        return Err(CfiError::Sections(
            "no suitable way to parsing eh_frame found",
        ));
    }
    let eh = Region {
        vaddr: seg.vaddr.wrapping_add(HDR_SIZE as u64),
        data: seg.data.get(HDR_SIZE..).unwrap_or_default(),
    };
    Ok((Some(seg), Some(eh)))
}

/// The `.eh_frame_hdr` binary search table.
struct Table<'d> {
    r: Reader<'d>,
    count: u64,
    start: u64,
}

impl<'d> Table<'d> {
    fn new(hdr: &Region<'d>) -> Result<Self, CfiError> {
        let mut r = Reader::new(hdr.data, HDR_SIZE as u64, hdr.vaddr, false);
        let ptr_enc = hdr.data.get(1).copied().unwrap_or_default();
        let count_enc = hdr.data.get(2).copied().unwrap_or_default();
        r.ptr(ptr_enc).map_err(CfiError::Table)?;
        let count = r.ptr(count_enc).map_err(CfiError::Table)?;
        Ok(Self {
            start: r.pos,
            r,
            count,
        })
    }

    /// Entries the table really holds.
    fn held(&self) -> u64 {
        let entry = 2 * format_len(TABLE_ENC);
        self.count
            .min(self.r.end.saturating_sub(self.start) / entry)
    }

    fn seek(&mut self, index: u64) {
        let entry = 2 * format_len(TABLE_ENC);
        self.r.pos = self.start.saturating_add(index.saturating_mul(entry));
    }

    /// The next entry: (function start, FDE address).
    fn next(&mut self) -> Result<(u64, u64), CfiError> {
        let ip = self.r.ptr(TABLE_ENC).map_err(CfiError::Table)?;
        let fde = self.r.ptr(TABLE_ENC).map_err(CfiError::Table)?;
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

/// Parsed CIEs by section offset. Every CIE is parsed once (upstream keeps
/// 16 in an LRU; the result is the same, and a hostile file cannot make eim
/// re-parse CIEs).
#[derive(Default)]
struct CieCache {
    cies: Vec<Cie>,
    index: HashMap<u64, usize>,
    /// The last CIE used (most FDEs share their predecessor's CIE).
    last: Option<(u64, usize)>,
}

impl CieCache {
    /// The CIE at `pos`; `fde` is the reader of the FDE naming it.
    fn get(&mut self, fde: &Reader<'_>, pos: u64, arch: Arch) -> Result<&Cie, EntryError> {
        let at = match self.last {
            Some((last, at)) if last == pos => at,
            _ => {
                let at = match self.index.get(&pos) {
                    Some(&at) => at,
                    None => {
                        let mut r = *fde;
                        r.pos = pos;
                        self.cies.push(parse_cie(r, arch)?);
                        let at = self.cies.len() - 1;
                        self.index.insert(pos, at);
                        at
                    }
                };
                self.last = Some((pos, at));
                at
            }
        };
        self.cies.get(at).ok_or(EntryError::CieBeyondEnd(pos))
    }
}

/// Walks the FDEs of one section.
struct Walker<'a, 'd, F: ?Sized> {
    cies: CieCache,
    out: Emitter<'a, 'd, F>,
}

/// Turns FDEs into deltas.
struct Emitter<'a, 'd, F: ?Sized> {
    /// Machine of the file whose CFI is walked.
    arch: Arch,
    /// The file being extracted: where signal trampolines are read.
    code: &'a Elf<'d>,
    allow_generic_regs: bool,
    filter: &'a mut F,
    deltas: &'a mut IntervalData,
}

impl<F: FdeFilter + ?Sized> Walker<'_, '_, F> {
    /// Parses the FDE at `r.pos` and emits its deltas; returns its size.
    /// `sorted` is passed to the first delta's append (later ones are
    /// sorted within the FDE).
    fn fde(&mut self, r: &mut Reader<'_>, table_ip: u64, sorted: bool) -> Result<u64, HeaderError> {
        let fde_at = r.pos;
        let (len, cie_pos) = parse_header(r, false)?;
        let cie = self.cies.get(r, cie_pos, self.out.arch)?;
        let range = parse_fde_range(r, cie, table_ip, fde_at)?;
        let out = &mut self.out;
        if out.filter.keep(range.start, range.len, out.deltas) {
            out.emit(*r, cie, range, sorted, fde_at)?;
        }
        Ok(len)
    }
}

impl<F: FdeFilter + ?Sized> Emitter<'_, '_, F> {
    fn is_sigreturn_trampoline(&self, range: FdeRange) -> bool {
        let code: &[u8] = match self.code.arch {
            Arch::X86_64 => &SIGRETURN_X86_64,
            Arch::Aarch64 => &SIGRETURN_AARCH64,
        };
        range.len == code.len() as u64
            && self
                .code
                .virtual_memory(range.start, code.len())
                .is_some_and(|bytes| *bytes == *code)
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
            let mut vm = Vm::new(self.arch, cie, range.start, cie.initial);
            let mut hints = hint::KEEP;
            while r.has_data() {
                let ip = vm.loc;
                vm.step(&mut r)?;
                let row = unwind_info(self.arch, &vm.cur, self.allow_generic_regs);
                self.deltas.add_ex(StackDelta::new(ip, hints, row), sorted);
                sorted = true;
                hints = hint::NONE;
            }
            let row = unwind_info(self.arch, &vm.cur, self.allow_generic_regs);
            self.deltas
                .add_ex(StackDelta::new(vm.loc, hints, row), sorted);
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

impl<F: FdeFilter + ?Sized> Walker<'_, '_, F> {
    /// Walks the FDEs in search-table order (sorted by address).
    fn walk_table(&mut self, hdr: &Region<'_>, eh: &Region<'_>) -> Result<(), CfiError> {
        let mut table = Table::new(hdr)?;
        let held = table.held();
        for index in 0..table.count {
            let (ip, fde) = table.next()?;
            let mut r = Table::fde_reader(eh, fde)?;
            if index >= held {
                return Err(CfiError::TableTruncated(index));
            }
            match self.fde(&mut r, ip, index > 0) {
                Ok(_) | Err(HeaderError::Empty) => {}
                Err(HeaderError::UnexpectedType { id, .. }) => {
                    return Err(CfiError::TableFde(EntryError::UnexpectedType(id)))
                }
                Err(HeaderError::Fatal(e)) => return Err(CfiError::TableFde(e)),
            }
        }
        Ok(())
    }

    /// Walks every record of a section in file order (unsorted), skipping
    /// CIEs and empty records.
    fn walk_linear(&mut self, section: &Region<'_>, debug_frame: bool) -> Result<(), CfiError> {
        self.out.filter.mark_unsorted();
        let size = section.data.len() as u64;
        let mut at = 0;
        while at < size {
            let mut r = Reader::new(section.data, at, section.vaddr, debug_frame);
            let len = match self.fde(&mut r, 0, false) {
                Ok(len) | Err(HeaderError::UnexpectedType { len, .. }) => len,
                Err(HeaderError::Empty) => 4,
                Err(HeaderError::Fatal(error)) => return Err(CfiError::Fde { at, error }),
            };
            // Records are at least 4 bytes, so the walk moves forward.
            at = at.saturating_add(len.max(4));
        }
        Ok(())
    }
}

/// Adds the deltas of `elf`'s `.eh_frame` (spec 5.3): through the
/// `.eh_frame_hdr` search table when it is usable, else by a linear walk.
/// A file without `.eh_frame` adds nothing.
pub fn parse_eh_frame<F: FdeFilter + ?Sized>(
    elf: &Elf<'_>,
    allow_generic_regs: bool,
    filter: &mut F,
    deltas: &mut IntervalData,
) -> Result<(), CfiError> {
    let (hdr, eh) = find_eh_sections(elf)?;
    let Some(eh) = eh else {
        return Ok(());
    };
    deltas
        .deltas
        .reserve(eh.data.len() / SECTION_BYTES_PER_DELTA);
    let mut walker = Walker {
        cies: CieCache::default(),
        out: Emitter {
            arch: elf.arch,
            code: elf,
            allow_generic_regs,
            filter,
            deltas,
        },
    };
    match hdr {
        Some(hdr) => walker.walk_table(&hdr, &eh),
        None => walker.walk_linear(&eh, false),
    }
}

/// Adds the deltas of `elf`'s `.debug_frame` (always a linear walk).
/// `code` is the file being extracted, which differs from `elf` for a
/// separate debug file.
pub fn parse_debug_frame<F: FdeFilter + ?Sized>(
    elf: &Elf<'_>,
    code: &Elf<'_>,
    allow_generic_regs: bool,
    filter: &mut F,
    deltas: &mut IntervalData,
) -> Result<(), CfiError> {
    let Some(section) = elf.section_region(".debug_frame", MAX_SECTION_BYTES) else {
        return Ok(());
    };
    deltas
        .deltas
        .reserve(section.data.len() / SECTION_BYTES_PER_DELTA);
    let mut walker = Walker {
        cies: CieCache::default(),
        out: Emitter {
            arch: elf.arch,
            code,
            allow_generic_regs,
            filter,
            deltas,
        },
    };
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
