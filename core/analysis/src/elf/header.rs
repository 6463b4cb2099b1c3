//! What makes a file one eim analyses, checked before (and after)
//! `object` parses it: the identification bytes, the header's length, and
//! that the header tables and the sections lie inside the file. The one
//! place that decides which files are *unsupported* and which *invalid*,
//! for the files extraction opens and the debug files it is offered.

use object::{Object as _, ObjectSection as _};

use super::extract::ExtractErrorKind;
use super::ident::{EHDR64_SIZE, MAGIC};
use super::Elf;

/// The little-endian field at `at` (0 past the end: the callers have
/// checked the header's length).
fn u16_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 2)
        .and_then(|f| f.try_into().ok())
        .map_or(0, |f| u64::from(u16::from_le_bytes(f)))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|f| f.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Why a file's header makes it unusable. This is the one place that
/// decides which files are *unsupported* (not ELF, 32-bit, big-endian,
/// another machine: files eim does not extract by design, which reports
/// list apart from failures) and which are *invalid* (an ELF file of a
/// supported kind that is broken).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
}

impl HeaderError {
    pub fn kind(&self) -> ExtractErrorKind {
        match self {
            Self::Unsupported(_) => ExtractErrorKind::Unsupported,
            Self::Invalid(_) => ExtractErrorKind::Invalid,
        }
    }

    /// A file whose machine eim has no unwinder for.
    pub fn machine(machine: u16) -> Self {
        Self::Unsupported(format!(
            "unsupported machine {machine:#x}: only x86-64 and arm64 ELF files are supported"
        ))
    }
}

/// Checks what `Elf::parse` takes for granted or reports tersely: the
/// identification bytes, the header's length, and that the program and
/// section header tables lie inside the file. `head` is the file's first
/// bytes (its first 64, or all of a shorter file), `len` its length.
/// Messages say what is wrong in a user's terms.
pub fn check_header(head: &[u8], len: u64) -> Result<(), HeaderError> {
    use HeaderError::{Invalid, Unsupported};
    let b = head;
    if b.get(..4) != Some(&MAGIC[..]) {
        return Err(Unsupported("not an ELF file".into()));
    }
    let truncated_header = || {
        Invalid(format!(
            "truncated ELF file: {len} bytes, shorter than the {EHDR64_SIZE}-byte ELF header"
        ))
    };
    match b.get(4) {
        None => return Err(truncated_header()),
        Some(2) => {}
        Some(1) => {
            return Err(Unsupported(
                "a 32-bit ELF file: only 64-bit little-endian ELF files are supported".into(),
            ))
        }
        Some(c) => return Err(Invalid(format!("not a valid ELF file: unknown class {c}"))),
    }
    match b.get(5) {
        None => return Err(truncated_header()),
        Some(1) => {}
        Some(2) => {
            return Err(Unsupported(
                "a big-endian ELF file: only 64-bit little-endian ELF files are supported".into(),
            ))
        }
        Some(d) => {
            return Err(Invalid(format!(
                "not a valid ELF file: unknown data encoding {d}"
            )))
        }
    }
    if len < EHDR64_SIZE || (b.len() as u64) < EHDR64_SIZE {
        return Err(truncated_header());
    }
    let tables = [
        ("program", u64_at(b, 0x20), u16_at(b, 0x36), u16_at(b, 0x38)),
        // With 0 sections but a table offset, the count is in entry 0.
        (
            "section",
            u64_at(b, 0x28),
            u16_at(b, 0x3a),
            u16_at(b, 0x3c).max(1),
        ),
    ];
    for (what, offset, entry_size, count) in tables {
        if offset == 0 {
            continue;
        }
        match offset.checked_add(entry_size * count) {
            Some(end) if end <= len => {}
            _ => {
                return Err(Invalid(format!(
                    "truncated ELF file: the {what} header table ({count} entries of \
                     {entry_size} bytes at offset {offset}) ends past the end of the file \
                     ({len} bytes)"
                )))
            }
        }
    }
    Ok(())
}

/// Checks that every section with file contents lies inside the file (a
/// truncated file whose headers survived): `Invalid`, naming the section.
pub fn check_sections(elf: &Elf<'_>) -> Result<(), HeaderError> {
    let len = elf.len();
    for section in elf.file.sections() {
        let index = section.index().0;
        if let Some((offset, size)) = section.file_range() {
            if offset.checked_add(size).is_none_or(|end| end > len) {
                return Err(HeaderError::Invalid(format!(
                    "truncated ELF file: section {index} ({}) ends past the end of the file \
                     ({len} bytes)",
                    section.name().unwrap_or("?")
                )));
            }
        }
    }
    Ok(())
}
