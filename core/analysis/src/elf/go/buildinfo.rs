//! The Go toolchain version from a binary's build information, and Go's
//! version ordering (`go/version.Compare`), for the arm64 strategy rule
//! (spec 5.6: Go 1.21 fixed frame pointers on arm64).
//!
//! Build information is a 32-byte header at a 16-byte aligned offset of the
//! `.go.buildinfo` section (or, without that section, of the first writable,
//! non-executable loadable segment): the 14-byte magic `"\xff Go buildinf:"`,
//! the pointer size, a flags byte, then either (flags bit 1, Go 1.18+) the
//! version and module strings inline after the header, each a uvarint length
//! and its bytes, or two pointers to Go string headers (address, length)
//! elsewhere in memory; flags bit 0 means big-endian, which eim (like
//! upstream) does not read.

use std::cmp::Ordering;

use object::elf::{FileHeader64, PF_W, PF_X, PT_LOAD, PT_NOTE};
use object::read::elf::NoteIterator;

use super::super::Elf;
use super::locate::read_virtual;
use super::table::u64_at;

const MAGIC: &[u8; 14] = b"\xff Go buildinf:";
const ALIGN: usize = 16;
const HEADER_SIZE: usize = 32;
/// Longest version (or module) string accepted.
const MAX_STRING: u64 = 4 * 1024;
const FLAG_BIG_ENDIAN: u8 = 1;
const FLAG_INLINE_STRINGS: u8 = 2;
/// The owner and type of the note the Go linker writes into every ELF file
/// it links (`.note.go.buildid`).
const GO_NOTE_OWNER: &[u8] = b"Go";
const NT_GO_BUILD_ID: u32 = 4;
/// Note segments larger than this are not read: Go's holds one note of
/// about 100 bytes, and a hostile header must not make a check a big read.
const MAX_NOTE_SEGMENT: u64 = 64 * 1024;

/// Whether a `PT_NOTE` segment of the file holds Go's build-id note: the
/// evidence, besides its sections, that a file is Go's even when its
/// section headers are stripped. Every note segment is looked at, not only
/// the first, because a C linker puts notes of other alignments (such as
/// `.note.gnu.property`) in a segment of their own ahead of Go's.
pub(crate) fn has_build_id_note(elf: &Elf<'_>) -> bool {
    let endian = elf.file.endian();
    elf.segments(PT_NOTE)
        .filter(|ph| ph.filesz <= MAX_NOTE_SEGMENT)
        .any(|ph| {
            let Some(data) = elf.bytes_at(ph.offset, ph.filesz) else {
                return false;
            };
            let Ok(mut notes) = NoteIterator::<FileHeader64<_>>::new(endian, ph.align, data) else {
                return false;
            };
            // Each note takes at least its header: bounded by the segment.
            while let Ok(Some(note)) = notes.next() {
                if note.name() == GO_NOTE_OWNER && note.n_type(endian) == NT_GO_BUILD_ID {
                    return true;
                }
            }
            false
        })
}

/// The bytes build information is searched in.
fn region<'d>(elf: &Elf<'d>) -> Option<&'d [u8]> {
    if let Some(section) = elf.section(".go.buildinfo") {
        return Some(section.data);
    }
    let ph = elf
        .segments(PT_LOAD)
        .find(|ph| ph.flags & (PF_X | PF_W) == PF_W)?;
    elf.bytes_at(ph.offset, ph.filesz)
}

/// Go's `binary.Uvarint`: the value and the bytes used, `None` when cut
/// short or longer than 64 bits.
fn uvarint(data: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &byte) in data.iter().enumerate().take(10) {
        if i == 9 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The Go version string recorded in the file (for example `go1.23.5`), or
/// `None` if there is none or it cannot be read.
pub(crate) fn go_version<'d>(elf: &Elf<'d>) -> Option<&'d [u8]> {
    let data = region(elf)?;
    let at = (0..data.len())
        .step_by(ALIGN)
        .find(|&at| data.get(at..at + MAGIC.len()) == Some(&MAGIC[..]))?;
    let ptr_size = *data.get(at + 14)?;
    let flags = *data.get(at + 15)?;
    if flags & FLAG_INLINE_STRINGS != 0 {
        let rest = data.get(at + HEADER_SIZE..)?;
        let (len, used) = uvarint(rest)?;
        if len >= MAX_STRING {
            return None;
        }
        return rest.get(used..used + len as usize);
    }
    if ptr_size != 8 || flags & FLAG_BIG_ENDIAN != 0 {
        return None;
    }
    let version_ptr = u64_at(data, at + 16)?;
    let header = read_virtual(elf, version_ptr, 16).ok()?;
    let (addr, len) = (u64_at(header, 0)?, u64_at(header, 8)?);
    if len >= MAX_STRING {
        return None;
    }
    read_virtual(elf, addr, len).ok()
}

/// A parsed Go version (`internal/gover`): decimal fields as digit strings
/// without leading zeros, `kind` one of "", "alpha", "beta", "rc", ...;
/// all empty when the version is not valid.
#[derive(Default, Debug, PartialEq, Eq)]
struct GoVersion<'a> {
    major: &'a [u8],
    minor: &'a [u8],
    patch: &'a [u8],
    kind: &'a [u8],
    pre: &'a [u8],
}

/// A leading decimal number (no leading zeros) and the rest.
fn cut_int(x: &[u8]) -> Option<(&[u8], &[u8])> {
    let digits = x.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || (x[0] == b'0' && digits != 1) {
        return None;
    }
    Some(x.split_at(digits))
}

/// Compares decimal digit strings without leading zeros ("" is smallest).
fn cmp_int(x: &[u8], y: &[u8]) -> Ordering {
    x.len().cmp(&y.len()).then_with(|| x.cmp(y))
}

fn parse(x: &[u8]) -> GoVersion<'_> {
    parse_checked(x).unwrap_or_default()
}

fn parse_checked(x: &[u8]) -> Option<GoVersion<'_>> {
    let mut v = GoVersion::default();
    let (major, x) = cut_int(x)?;
    v.major = major;
    if x.is_empty() {
        // "1" means 1.0.0.
        v.minor = b"0";
        v.patch = b"0";
        return Some(v);
    }
    let x = x.strip_prefix(b".")?;
    let (minor, x) = cut_int(x)?;
    v.minor = minor;
    if x.is_empty() {
        // Before 1.21 a missing patch is ".0"; from 1.21 on "1.21" is the
        // language version, older than any 1.21 release.
        if cmp_int(minor, b"21") == Ordering::Less {
            v.patch = b"0";
        }
        return Some(v);
    }
    if let Some(x) = x.strip_prefix(b".") {
        let (patch, x) = cut_int(x)?;
        if !x.is_empty() {
            return None;
        }
        v.patch = patch;
        return Some(v);
    }
    let letters = x.iter().take_while(|b| !b.is_ascii_digit()).count();
    if letters == 0 || !x[..letters].iter().all(u8::is_ascii_lowercase) {
        return None;
    }
    let (kind, x) = x.split_at(letters);
    v.kind = kind;
    if x.is_empty() {
        return Some(v);
    }
    let (pre, x) = cut_int(x)?;
    if !x.is_empty() {
        return None;
    }
    v.pre = pre;
    Some(v)
}

/// `go/version`'s prefix handling: drop a `-suffix`, require and drop "go".
fn strip_go(v: &[u8]) -> &[u8] {
    let v = v.split(|&b| b == b'-').next().unwrap_or_default();
    v.strip_prefix(b"go").unwrap_or_default()
}

/// `go/version.Compare`: invalid versions (including "") are equal to each
/// other and older than every valid one.
pub(crate) fn compare(x: &[u8], y: &[u8]) -> Ordering {
    let (a, b) = (parse(strip_go(x)), parse(strip_go(y)));
    cmp_int(a.major, b.major)
        .then_with(|| cmp_int(a.minor, b.minor))
        .then_with(|| cmp_int(a.patch, b.patch))
        .then_with(|| a.kind.cmp(b.kind))
        .then_with(|| cmp_int(a.pre, b.pre))
}

/// Whether a Go version (or its absence) predates arm64 frame pointers
/// that can be trusted (`go1.21rc1`).
pub(crate) fn before_arm64_frame_pointers(version: Option<&[u8]>) -> bool {
    compare(version.unwrap_or_default(), b"go1.21rc1") == Ordering::Less
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(x: &str, y: &str) -> Ordering {
        compare(x.as_bytes(), y.as_bytes())
    }

    #[test]
    fn go_version_ordering() {
        use Ordering::*;
        for (x, y, want) in [
            ("go1.21rc1", "go1.21rc1", Equal),
            ("go1.21", "go1.21rc1", Less),
            ("go1.21rc1", "go1.21rc2", Less),
            ("go1.21rc2", "go1.21.0", Less),
            ("go1.21beta1", "go1.21rc1", Less),
            ("go1.20", "go1.20.0", Equal),
            ("go1.20.14", "go1.21rc1", Less),
            ("go1.23.5", "go1.21rc1", Greater),
            ("go1.100", "go1.21rc1", Greater),
            ("go1", "go1.0.0", Equal),
            ("go2", "go1.21rc1", Greater),
            ("go1.22.0-bigcorp", "go1.22.0", Equal),
            ("", "go1.21rc1", Less),
            ("devel go1.23-abc", "go1.21rc1", Less),
            ("go1.21.0 X:boringcrypto", "go1.21rc1", Less),
            ("go1.021", "go1", Less),
            ("go1.21.3rc1", "go1", Less),
            ("bad", "", Equal),
        ] {
            assert_eq!(cmp(x, y), want, "{x} vs {y}");
            assert_eq!(cmp(y, x), want.reverse(), "{y} vs {x}");
        }
    }

    #[test]
    fn the_arm64_threshold() {
        assert!(before_arm64_frame_pointers(None));
        assert!(before_arm64_frame_pointers(Some(b"go1.20.7")));
        assert!(before_arm64_frame_pointers(Some(b"go1.21")));
        assert!(!before_arm64_frame_pointers(Some(b"go1.21rc1")));
        assert!(!before_arm64_frame_pointers(Some(b"go1.21.0")));
        assert!(!before_arm64_frame_pointers(Some(b"go1.23.5")));
    }

    #[test]
    fn uvarint_like_go() {
        assert_eq!(uvarint(&[]), None);
        assert_eq!(uvarint(&[0x08]), Some((8, 1)));
        assert_eq!(uvarint(&[0x80, 0x01]), Some((128, 2)));
        assert_eq!(uvarint(&[0x80]), None);
        assert_eq!(uvarint(&[0xff; 10]), None);
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(uvarint(&max), Some((u64::MAX, 10)));
    }
}
