//! Finding the `.gopclntab` bytes (spec 5.6): the section, else (for a file
//! with `.go.buildinfo`) the `runtime.pclntab` / `runtime.epclntab` symbols,
//! else a scan of the read-only segments for the header signature.

use object::elf::{PF_R, PF_X, PT_LOAD, SHF_COMPRESSED};
use object::{Object, ObjectSection, ObjectSymbol, SectionFlags};

use super::super::{Arch, Elf};
use super::error::GoError;
use super::table::{u32_at, Version, BASE_HEADER_SIZE};

/// The most table (or segment) bytes looked at.
pub(crate) const MAX_PCLNTAB_BYTES: u64 = 128 * 1024 * 1024;

fn load_error(message: String) -> GoError {
    GoError::Load(message)
}

/// The table bytes, or `None` when the file has no Go table.
pub(crate) fn pclntab_bytes<'d>(elf: &Elf<'d>) -> Result<Option<&'d [u8]>, GoError> {
    if let Some(section) = elf.file.section_by_name(".gopclntab") {
        if let SectionFlags::Elf { sh_flags } = section.flags() {
            if sh_flags & u64::from(SHF_COMPRESSED) != 0 {
                return Err(load_error(
                    "failed to load .gopclntab section: compressed sections not supported".into(),
                ));
            }
        }
        if section.kind() == object::SectionKind::UninitializedData {
            // No file bytes: the header check reports it as too short.
            return Ok(Some(&[]));
        }
        let size = section.size();
        if size > MAX_PCLNTAB_BYTES {
            return Err(load_error(format!(
                "failed to load .gopclntab section: section size {size} is too large"
            )));
        }
        return section
            .data()
            .map(Some)
            .map_err(|e| load_error(format!("failed to load .gopclntab section: {e}")));
    }
    if elf.file.section_by_name(".go.buildinfo").is_none() {
        return Ok(None);
    }
    let (start, end) = pclntab_symbols(elf);
    if start == 0 || end == 0 {
        // Stripped: look for the header instead.
        return search(elf).map_err(|e| load_error(format!("failed to search .gopclntab: {e}")));
    }
    if start >= end {
        return Err(load_error(format!(
            "invalid .gopclntab symbols: {start}-{end}"
        )));
    }
    read_virtual(elf, start, end - start)
        .map(Some)
        .map_err(|e| load_error(format!("failed to load .gopclntab via symbols: {e}")))
}

/// The values of `runtime.pclntab` and `runtime.epclntab` in the full
/// symbol table (0 when absent). Like upstream, the walk stops as soon as
/// both are non-zero; a later definition overrides an earlier one before.
fn pclntab_symbols(elf: &Elf<'_>) -> (u64, u64) {
    let (mut start, mut end) = (0, 0);
    for sym in elf.file.symbols() {
        match sym.name_bytes() {
            Ok(b"runtime.pclntab") => start = sym.address(),
            Ok(b"runtime.epclntab") => end = sym.address(),
            _ => {}
        }
        if start != 0 && end != 0 {
            break;
        }
    }
    (start, end)
}

/// `size` bytes at virtual address `addr`, from the file bytes of the
/// loadable segment whose memory image contains `addr`.
pub(crate) fn read_virtual<'d>(elf: &Elf<'d>, addr: u64, size: u64) -> Result<&'d [u8], String> {
    let Some(ph) = elf
        .segments(PT_LOAD)
        .find(|ph| addr >= ph.vaddr && addr - ph.vaddr < ph.memsz)
    else {
        return Err(format!("no matching segment for {addr:#x}"));
    };
    let offset = addr - ph.vaddr;
    if offset.checked_add(size).is_none_or(|e| e > ph.filesz) {
        return Err(format!(
            "{size} bytes at {addr:#x} are not all backed by the file"
        ));
    }
    if size > MAX_PCLNTAB_BYTES {
        return Err(format!("virtual memory area too large ({size}) to copy"));
    }
    match ph.offset.checked_add(offset) {
        Some(start) => elf
            .bytes_at(start, size)
            .ok_or_else(|| "segment data beyond the end of the file".to_string()),
        None => Err("segment offset overflows".to_string()),
    }
}

/// The header signature after the magic's first byte: the rest of the
/// magic, the zero pad, the architecture's quantum and pointer size 8.
fn signature(arch: Arch) -> [u8; 7] {
    let quantum = match arch {
        Arch::X86_64 => 1,
        Arch::Aarch64 => 4,
    };
    [0xff, 0xff, 0xff, 0x00, 0x00, quantum, 0x08]
}

fn find(haystack: &[u8], needle: &[u8; 7]) -> Option<usize> {
    let mut from = 0;
    while let Some(rel) = haystack.get(from..)?.iter().position(|&b| b == needle[0]) {
        let at = from + rel;
        match haystack.get(at..at + needle.len()) {
            Some(window) if window == needle => return Some(at),
            Some(_) => from = at + 1,
            None => return None,
        }
    }
    None
}

/// The heuristic: in each readable, non-executable loadable segment, the
/// first place (in upstream's stepping) where the signature follows a byte
/// that completes a known magic. Returns the bytes from there to the end of
/// the segment.
fn search<'d>(elf: &Elf<'d>) -> Result<Option<&'d [u8]>, String> {
    let sig = signature(elf.arch);
    for ph in elf.segments(PT_LOAD) {
        if ph.flags & PF_X != 0 || ph.flags & PF_R == 0 {
            continue;
        }
        let filesz = ph.filesz;
        if filesz < BASE_HEADER_SIZE as u64 {
            continue;
        }
        if filesz > MAX_PCLNTAB_BYTES {
            return Err(format!("segment size {filesz} is too large"));
        }
        let data = elf
            .bytes_at(ph.offset, filesz)
            .ok_or_else(|| "segment data beyond the end of the file".to_string())?;
        let limit = data.len() - BASE_HEADER_SIZE;
        // Upstream steps: search from i; the candidate header starts one
        // byte before the match; the next search starts 8 bytes after it.
        let mut i = 1;
        while i < limit {
            let Some(n) = find(&data[i..], &sig) else {
                break;
            };
            let candidate = i + n - 1;
            if u32_at(data, candidate)
                .and_then(Version::from_magic)
                .is_some()
            {
                return Ok(Some(&data[candidate..]));
            }
            i = candidate + 8;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_matches_like_a_substring_search() {
        let sig = signature(Arch::X86_64);
        assert_eq!(find(&[], &sig), None);
        assert_eq!(find(&sig, &sig), Some(0));
        let mut hay = vec![0xff, 0xff, 0x00];
        hay.extend_from_slice(&sig);
        assert_eq!(find(&hay, &sig), Some(3));
        assert_eq!(find(&hay[..hay.len() - 1], &sig), None);
    }
}
