//! ELF analysis: from the bytes of an executable to its stack deltas,
//! exactly as upstream's SEED revision extracts them.
//!
//! Everything here works on bytes the caller provides: a slice, or a
//! [`source::LazyFile`] that reads ranges on demand through a
//! [`source::ByteSource`] (never a shared memory map: see [`source`]). No
//! file is opened here. The file handle, debug-link lookup and file reading
//! live in the `eim` package.
//!
//! * [`extract`](mod@extract): the stage order, the FDE filter, the final sort.
//! * [`ehframe`]: `.eh_frame` / `.eh_frame_hdr` / `.debug_frame` CFI.
//! * [`gopclntab`]: Go's pc/line tables.
//! * [`entry`]: entry-stub matchers.
//! * [`vdso`]: synthetic deltas for the arm64 vDSO.
//! * [`fileid`]: the 128-bit file id and the 64-bit host file id.
//! * [`header`]: which files are unsupported, which invalid.
//! * [`ident`]: the magic and identification bytes eim reads files by.
//! * [`build_id`]: the GNU build id, from the note segments.
//! * [`segments`]: the program headers (every reader's) and a mapping's
//!   load bias.
//!
//! [`Elf`] reads sections, segments, memory at virtual addresses, the
//! SONAME and the debug link the way upstream's `pfelf` does, so that every
//! stage sees the bytes upstream sees.

pub mod build_id;
pub(crate) mod debuglink;
pub mod digest;
pub mod ehframe;
pub mod entry;
pub mod extract;
pub mod fileid;
pub mod gopclntab;
pub mod header;
pub mod ident;
pub mod segments;
pub mod source;
pub mod vdso;

#[cfg(test)]
mod parallel_tests;

use std::borrow::Cow;

use object::elf::{PT_DYNAMIC, PT_GNU_EH_FRAME, PT_LOAD, SHF_COMPRESSED, SHT_NOBITS};
use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
use object::{LittleEndian, Object, ObjectSection};

pub use debuglink::DebugLink;
pub use extract::{extract, extract_with, DebugFileError, DebugLinkOpener, ExtractError, Stage};
pub(crate) use segments::Segment;
pub use source::{ByteSource, FileView, LazyFile, SourceError};

/// The architectures eim extracts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64,
    Aarch64,
}

/// Why a file cannot be analysed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error("not a 64-bit little-endian ELF file")]
    WrongClass,
    #[error("unsupported machine {0:#x}")]
    UnsupportedMachine(u16),
    #[error("malformed ELF: {0}")]
    Malformed(String),
}

/// A parsed 64-bit little-endian ELF file over borrowed bytes.
pub struct Elf<'d> {
    pub data: FileView<'d>,
    pub file: ElfFile64<'d, LittleEndian, FileView<'d>>,
    pub arch: Arch,
    /// Its program headers, read once ([`segments::segments_of`]).
    segments: Vec<Segment>,
}

/// Bytes of the file and the virtual address they are loaded at: a section,
/// or a window of a segment.
#[derive(Clone, Copy, Debug)]
pub struct Region<'d> {
    pub(crate) vaddr: u64,
    pub(crate) data: &'d [u8],
}

/// Where a section's bytes are in the file, and its virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub(crate) vaddr: u64,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// A section's address and contents (empty for `SHT_NOBITS`).
#[derive(Clone, Copy, Debug)]
pub struct Section<'d> {
    pub address: u64,
    pub data: &'d [u8],
    pub nobits: bool,
}

impl<'d> Elf<'d> {
    pub fn parse(data: &'d [u8]) -> Result<Self, ElfError> {
        Self::parse_view(FileView::Slice(data))
    }

    /// Parses a file read on demand (see [`source`]).
    pub fn parse_lazy(file: &'d LazyFile) -> Result<Self, ElfError> {
        Self::parse_view(file.view())
    }

    pub(crate) fn parse_view(data: FileView<'d>) -> Result<Self, ElfError> {
        let head = data.bytes_at(0, 6).or_else(|| data.bytes_at(0, 4));
        if head.and_then(|i| i.get(..4)) != Some(&ident::MAGIC[..]) {
            return Err(ElfError::NotElf);
        }
        if head.and_then(|i| i.get(4..6)) != Some(&[ident::ELFCLASS64, ident::ELFDATA2LSB]) {
            return Err(ElfError::WrongClass);
        }
        let file = ElfFile64::<LittleEndian, FileView<'d>>::parse(data)
            .map_err(|e| ElfError::Malformed(e.to_string()))?;
        let machine = file.elf_header().e_machine(LittleEndian);
        let arch = match machine {
            object::elf::EM_X86_64 => Arch::X86_64,
            object::elf::EM_AARCH64 => Arch::Aarch64,
            other => return Err(ElfError::UnsupportedMachine(other)),
        };
        // `object` has found the program header table whole in the file:
        // the one reader of eim reads it again here, for every stage.
        let segments = segments::segments_of(data);
        Ok(Self {
            data,
            file,
            arch,
            segments,
        })
    }

    /// The section called `name`, if present.
    pub fn section(&self, name: &str) -> Option<Section<'d>> {
        let s = self.file.section_by_name(name)?;
        let nobits = s.kind() == object::SectionKind::UninitializedData;
        let data = if nobits { &[][..] } else { s.data().ok()? };
        Some(Section {
            address: s.address(),
            data,
            nobits,
        })
    }

    pub fn entry(&self) -> u64 {
        self.file.entry()
    }

    /// The file bytes at `offset..offset + len`, if the file has them.
    pub(crate) fn bytes_at(&self, offset: u64, len: u64) -> Option<&'d [u8]> {
        self.data.bytes_at(offset, len)
    }

    /// The file's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.data.size()
    }

    /// Always false for a parsed file (it has at least its header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Upstream's `elfRegionFromSection`: the first section called `name`,
    /// unless it is `SHT_NOBITS` or compressed, larger than `max` bytes, or
    /// not inside the file.
    pub fn section_region(&self, name: &str, max: u64) -> Option<Region<'d>> {
        let extent = self.section_extent(name, max)?;
        Some(Region {
            vaddr: extent.vaddr,
            data: self.bytes_at(extent.offset, extent.size)?,
        })
    }

    /// Where [`Elf::section_region`] would read its bytes from (with the
    /// same refusals, but for a read that fails), without reading them.
    pub(crate) fn section_extent(&self, name: &str, max: u64) -> Option<Extent> {
        let section = self.file.section_by_name(name)?;
        let header = section.elf_section_header();
        let e = LittleEndian;
        if header.sh_type(e) == SHT_NOBITS || header.sh_flags(e) & u64::from(SHF_COMPRESSED) != 0 {
            return None;
        }
        let size = header.sh_size(e);
        let offset = header.sh_offset(e);
        if size > max || offset.checked_add(size)? > self.len() {
            return None;
        }
        Some(Extent {
            vaddr: header.sh_addr(e),
            offset,
            size,
        })
    }

    /// All program headers of type `kind`, in header order.
    pub(crate) fn segments(&self, kind: u32) -> impl Iterator<Item = Segment> + '_ {
        self.segments
            .iter()
            .filter(move |s| s.kind == kind)
            .copied()
    }

    /// The first `PT_LOAD` whose memory range holds `addr`, and the offset
    /// of `addr` in it.
    fn load_segment_at(&self, addr: u64) -> Option<(Segment, u64)> {
        self.segments(PT_LOAD)
            .find(|s| addr >= s.vaddr && addr - s.vaddr < s.memsz)
            .map(|s| (s, addr - s.vaddr))
    }

    /// `len` bytes at virtual address `addr`, as upstream's `VirtualMemory`
    /// reads them: from the first `PT_LOAD` whose memory range holds
    /// `addr`, zero-filled between its file and memory sizes; `None` if
    /// the range runs past the segment's memory size or the file.
    pub fn virtual_memory(&self, addr: u64, len: usize) -> Option<Cow<'d, [u8]>> {
        let (seg, offset) = self.load_segment_at(addr)?;
        let end = offset.checked_add(len as u64)?;
        if end <= seg.filesz {
            return self
                .bytes_at(seg.offset.checked_add(offset)?, len as u64)
                .map(Cow::Borrowed);
        }
        if end > seg.memsz {
            return None;
        }
        let mut out = vec![0; len];
        if offset < seg.filesz {
            let from_file = self.bytes_at(seg.offset.checked_add(offset)?, seg.filesz - offset)?;
            out.get_mut(..from_file.len())?.copy_from_slice(from_file);
        }
        Some(Cow::Owned(out))
    }

    /// Upstream's `EHFrame`: the memory from the start of `PT_GNU_EH_FRAME`
    /// to the end of the file part of the first `PT_LOAD` holding it.
    /// `Ok(None)` when there is no such pair; `Err` when the window is
    /// larger than `max` bytes or not inside the file.
    pub(crate) fn eh_frame_segment(&self, max: u64) -> Result<Option<Region<'d>>, &'static str> {
        let Some(hdr) = self.segments(PT_GNU_EH_FRAME).next() else {
            return Ok(None);
        };
        let Some(load) = self
            .segments(PT_LOAD)
            .find(|l| hdr.vaddr >= l.vaddr && hdr.vaddr < l.vaddr.wrapping_add(l.filesz))
        else {
            return Ok(None);
        };
        let skip = hdr.vaddr - load.vaddr;
        let size = load.filesz - skip;
        if size > max {
            return Err("segment is too large");
        }
        let data = load
            .offset
            .checked_add(skip)
            .and_then(|off| self.bytes_at(off, size))
            .ok_or("segment is not inside the file")?;
        Ok(Some(Region {
            vaddr: hdr.vaddr,
            data,
        }))
    }

    /// `DT_SONAME`, read through `DT_STRTAB` (both from `PT_DYNAMIC`).
    pub fn soname(&self) -> Option<Vec<u8>> {
        const DT_STRTAB: u64 = 5;
        const DT_SONAME: u64 = 14;
        const MAX_NAME: usize = 256;
        let dynamic = self.segments(PT_DYNAMIC).next()?;
        let entries = self.bytes_at(dynamic.offset, dynamic.filesz)?;
        let (mut strtab, mut soname) = (None, None);
        for entry in entries.chunks_exact(16) {
            let (tag, val) = entry.split_at(8);
            let tag = u64::from_le_bytes(tag.try_into().ok()?);
            let val = u64::from_le_bytes(val.try_into().ok()?);
            match tag {
                0 => break,
                DT_STRTAB => strtab = Some(val),
                DT_SONAME => soname = Some(val),
                _ => {}
            }
        }
        let addr = strtab?.checked_add(soname?)?;
        let (seg, offset) = self.load_segment_at(addr)?;
        let len = (seg.memsz - offset).min(MAX_NAME as u64) as usize;
        let bytes = self.virtual_memory(addr, len)?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Some(bytes.get(..end)?.to_vec())
    }

    /// Up to `max` bytes at virtual address `addr`: as many as the first
    /// `PT_LOAD` holding `addr` has from there (for strings of unknown length).
    pub(crate) fn virtual_memory_upto(&self, addr: u64, max: usize) -> Option<Cow<'d, [u8]>> {
        let (seg, offset) = self.load_segment_at(addr)?;
        let len = (seg.memsz - offset).min(max as u64) as usize;
        self.virtual_memory(addr, len)
    }

    /// The `DT_NEEDED` names, in order (at most `MAX_NEEDED`, each at most
    /// 256 bytes); empty when the file has no dynamic section.
    pub(crate) fn needed(&self) -> Vec<Vec<u8>> {
        const DT_NEEDED: u64 = 1;
        const DT_STRTAB: u64 = 5;
        const MAX_NEEDED: usize = 1024;
        const MAX_NAME: usize = 256;
        let Some(dynamic) = self.segments(PT_DYNAMIC).next() else {
            return Vec::new();
        };
        let Some(entries) = self.bytes_at(dynamic.offset, dynamic.filesz) else {
            return Vec::new();
        };
        let (mut strtab, mut offsets) = (None, Vec::new());
        for entry in entries.chunks_exact(16) {
            let tag = u64::from_le_bytes(entry[..8].try_into().unwrap_or([0; 8]));
            let val = u64::from_le_bytes(entry[8..].try_into().unwrap_or([0; 8]));
            match tag {
                0 => break,
                DT_STRTAB => strtab = Some(val),
                DT_NEEDED if offsets.len() < MAX_NEEDED => offsets.push(val),
                _ => {}
            }
        }
        let Some(strtab) = strtab else {
            return Vec::new();
        };
        offsets
            .into_iter()
            .filter_map(|off| {
                let bytes = self.virtual_memory_upto(strtab.checked_add(off)?, MAX_NAME)?;
                let end = bytes.iter().position(|&b| b == 0)?;
                Some(bytes.get(..end)?.to_vec())
            })
            .collect()
    }

    /// The `.gnu_debuglink` section, if present and well formed
    /// (`debuglink::parse`'s rules: a plain UTF-8 file name).
    pub fn debug_link(&self) -> Option<DebugLink> {
        let data = self.section_region(".gnu_debuglink", 1 << 20)?.data;
        debuglink::parse(data).ok()
    }
}
