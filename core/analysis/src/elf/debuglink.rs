//! The one `.gnu_debuglink` parser: what extraction asks for and what the
//! debug-file search looks for are the same name.
//!
//! The section holds a file name, a NUL, padding to a multiple of 4 bytes,
//! then the CRC-32 of the debug file (little-endian: eim reads only
//! little-endian files). That is SEED's layout (`pfelf.ParseDebugLink`).
//! The name is then used as one component of a path opened as root on a
//! process's behalf, so it must be a plain file name: one that is empty,
//! `.`, `..`, holds a `/` or is not valid UTF-8 is refused. SEED dropped
//! invalid UTF-8 bytes and kept `/`, which let a file's link climb out of
//! the directories searched (`../../etc/shadow`); upstream's HEAD refuses
//! invalid UTF-8 and empty names too.

/// The contents of `.gnu_debuglink`: the debug file's name and the CRC-32
/// of its whole contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugLink {
    /// A plain file name: no `/`, not `.` or `..`, not empty, valid UTF-8.
    pub name: String,
    pub crc: u32,
}

/// Why a `.gnu_debuglink` section is not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DebugLinkError {
    #[error("malformed .gnu_debuglink: the name has no terminating NUL")]
    Unterminated,
    #[error("malformed .gnu_debuglink: no CRC-32 after the name ({len} bytes)")]
    NoCrc { len: usize },
    #[error(".gnu_debuglink names no file (an empty name)")]
    Empty,
    #[error(".gnu_debuglink name is not valid UTF-8")]
    NotUtf8,
    #[error(".gnu_debuglink name {name:?} is not a plain file name")]
    NotAFileName { name: String },
}

/// Parses a `.gnu_debuglink` section (see the module documentation).
pub(crate) fn parse(section: &[u8]) -> Result<DebugLink, DebugLinkError> {
    let nul = section
        .iter()
        .position(|&b| b == 0)
        .ok_or(DebugLinkError::Unterminated)?;
    let name = std::str::from_utf8(&section[..nul]).map_err(|_| DebugLinkError::NotUtf8)?;
    if name.is_empty() {
        return Err(DebugLinkError::Empty);
    }
    if name == "." || name == ".." || name.contains('/') {
        return Err(DebugLinkError::NotAFileName { name: name.into() });
    }
    // The CRC follows the name's NUL, aligned to 4 bytes.
    let crc_at = (nul + 1).next_multiple_of(4);
    let crc = crc_at
        .checked_add(4)
        .and_then(|end| section.get(crc_at..end))
        .ok_or(DebugLinkError::NoCrc { len: section.len() })?;
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    Ok(DebugLink {
        name: name.into(),
        crc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(name: &[u8], crc: u32) -> Vec<u8> {
        let mut v = name.to_vec();
        v.push(0);
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    #[test]
    fn names_parse_with_their_padding() {
        for name in ["a", "ab", "abc", "abcd", "libc.so.6.debug", "..x", "x.."] {
            let link = parse(&section(name.as_bytes(), 0xdead_beef)).expect(name);
            assert_eq!(link.name, name);
            assert_eq!(link.crc, 0xdead_beef);
        }
        // "abc\0" then the CRC; "abcd\0" then 3 bytes of padding.
        assert_eq!(section(b"abc", 1).len(), 8);
        assert_eq!(section(b"abcd", 1).len(), 12);
        // Bytes after the CRC are ignored (sections are often padded).
        let mut long = section(b"x", 7);
        long.extend_from_slice(&[0xff; 8]);
        assert_eq!(parse(&long).map(|l| l.crc), Ok(7));
    }

    #[test]
    fn anything_but_a_plain_utf8_file_name_is_refused() {
        use DebugLinkError::*;
        let cases: Vec<(Vec<u8>, DebugLinkError)> = vec![
            (b"abc".to_vec(), Unterminated),
            (b"abc\0".to_vec(), NoCrc { len: 4 }),
            (b"abc\0\x01\x02\x03".to_vec(), NoCrc { len: 7 }),
            (section(b"", 1), Empty),
            (section(b".", 1), NotAFileName { name: ".".into() }),
            (section(b"..", 1), NotAFileName { name: "..".into() }),
            (
                section(b"../x", 1),
                NotAFileName {
                    name: "../x".into(),
                },
            ),
            (section(b"a/b", 1), NotAFileName { name: "a/b".into() }),
            (
                section(b"/etc/shadow", 1),
                NotAFileName {
                    name: "/etc/shadow".into(),
                },
            ),
            (section(b"bad\xffname", 1), NotUtf8),
            (section(b"\xc3", 1), NotUtf8),
        ];
        for (bytes, want) in cases {
            assert_eq!(parse(&bytes), Err(want), "{bytes:?}");
        }
    }
}
