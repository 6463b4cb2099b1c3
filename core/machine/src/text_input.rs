//! Reading a deltas input (the oracle's `.deltas` text, plain or
//! xz-compressed) from bytes nobody vouches for, as a stream.
//!
//! The bytes may be hostile or merely wrong: an endless stream, a sparse
//! file of gigabytes, an xz "bomb" that inflates a few kilobytes to
//! gigabytes, a single line of gigabytes. So:
//!
//! * the bytes are counted as they come, after decompression, and refused
//!   past the caller's limit (nothing is inflated first: the decoder is
//!   read a buffer at a time); the compressed bytes have the same bound;
//! * the xz decoder's memory is bounded ([`XZ_MEMORY_LIMIT_KIB`]);
//! * lines are read one at a time, each at most [`MAX_LINE`] bytes, and
//!   parsed as they come ([`DeltasParser`]): only the deltas parsed so far
//!   and one line are held;
//! * the first line must start with `# file: `, and is checked as soon as
//!   it arrives, so zeros, binaries and other text fail at their first
//!   bytes;
//! * error messages quote at most [`crate::text::QUOTE_MAX`] bytes.

use std::io::{self, BufRead, BufReader, Read};

use lzma_rust2::XzReader;

use crate::text::{quote, DeltasFile, DeltasParser, TextError};

/// The first bytes of an xz stream.
pub const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0];
/// The first bytes of an ELF file.
pub const ELF_MAGIC: &[u8] = b"\x7fELF";

/// The longest line read: a `# file:` line holds a path (at most
/// `PATH_MAX`, 4096 bytes, on Linux), a delta row under 100 bytes.
pub const MAX_LINE: usize = 16 * 1024;

/// The xz decoder's memory bound in KiB: `xz -9` (a 64 MiB dictionary)
/// needs 65 MiB to decode; a stream that asks for more is refused before
/// anything is allocated.
pub const XZ_MEMORY_LIMIT_KIB: u32 = 96 * 1024;

/// The first line's prefix.
const FILE_LINE: &[u8] = b"# file: ";

/// Why a deltas input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("not a deltas file ({0})")]
    NotDeltas(&'static str),
    #[error("an xz-compressed ELF file: decompress it first")]
    CompressedElf,
    #[error("larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("inflates to more than the limit of {limit} bytes")]
    InflatesTooLarge { limit: u64 },
    #[error("line {line} is longer than {MAX_LINE} bytes: {start}")]
    LongLine { line: usize, start: String },
    #[error("not a valid xz stream: {0}")]
    Xz(io::Error),
    #[error("cannot read: {0}")]
    Read(io::Error),
    #[error(transparent)]
    Text(#[from] TextError),
}

/// The error a [`Limited`] reader gives past its limit.
#[derive(Debug)]
struct OverLimit {
    /// Whether the bytes counted were the decompressed ones.
    inflated: bool,
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("over the size limit")
    }
}

impl std::error::Error for OverLimit {}

/// Passes at most `left` bytes through; one more is an error.
struct Limited<R> {
    inner: R,
    left: u64,
    inflated: bool,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            // One byte more tells an input that ends at the limit from one
            // that goes on.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::new(
                    io::ErrorKind::FileTooLarge,
                    OverLimit {
                        inflated: self.inflated,
                    },
                )),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Reads up to `buf.len()` bytes, fewer only at the end of the input.
fn read_head(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads a deltas file, xz-compressed or plain (recognised by its first
/// bytes), refusing it as soon as more than `limit` bytes come (counted
/// after decompression; the compressed bytes have the same bound).
pub fn read_deltas(mut reader: impl Read, limit: u64) -> Result<DeltasFile, InputError> {
    let mut head = [0u8; XZ_MAGIC.len()];
    let n = read_head(&mut reader, &mut head).map_err(InputError::Read)?;
    let head = &head[..n];
    let raw = Limited {
        inner: head.chain(reader),
        left: limit,
        inflated: false,
    };
    if head.starts_with(XZ_MAGIC) {
        let xz = XzReader::new_mem_limit(raw, true, XZ_MEMORY_LIMIT_KIB);
        let inflated = Limited {
            inner: xz,
            left: limit,
            inflated: true,
        };
        parse_lines(inflated, limit, true)
    } else {
        parse_lines(raw, limit, false)
    }
}

/// Checks the first line (or the first [`MAX_LINE`] bytes of it).
fn check_first_line(line: &[u8], xz: bool) -> Result<(), InputError> {
    if line.starts_with(ELF_MAGIC) {
        return Err(if xz {
            InputError::CompressedElf
        } else {
            InputError::NotDeltas("an ELF file")
        });
    }
    if line.starts_with(FILE_LINE) {
        return Ok(());
    }
    // A character cut at the end of the bytes read is not invalid UTF-8.
    let utf8 = match std::str::from_utf8(line) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    };
    Err(InputError::NotDeltas(if utf8 {
        "it does not start with a '# file:' line"
    } else {
        "not UTF-8 text"
    }))
}

fn parse_lines(source: impl Read, limit: u64, xz: bool) -> Result<DeltasFile, InputError> {
    let io_error = |e: io::Error| {
        let over = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<OverLimit>())
            .map(|o| o.inflated);
        match over {
            Some(true) => InputError::InflatesTooLarge { limit },
            Some(false) => InputError::TooLarge { limit },
            None if xz => InputError::Xz(e),
            None => InputError::Read(e),
        }
    };
    let mut lines = BufReader::with_capacity(64 * 1024, source);
    let mut parser = DeltasParser::new();
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        let n = (&mut lines)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(io_error)?;
        if n == 0 {
            break;
        }
        let line_no = parser.lines() + 1;
        if line_no == 1 {
            check_first_line(&buf, xz)?;
        }
        let line = match buf.strip_suffix(b"\n") {
            Some(line) => line,
            None if buf.len() > MAX_LINE => {
                return Err(InputError::LongLine {
                    line: line_no,
                    start: quote(&buf),
                })
            }
            None => &buf,
        };
        let text = std::str::from_utf8(line).map_err(|_| TextError {
            line: line_no,
            message: format!("not UTF-8 text: {}", quote(line)),
        })?;
        parser.line(text)?;
    }
    if parser.lines() == 0 {
        return Err(InputError::NotDeltas("it is empty"));
    }
    Ok(parser.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# file: /bin/x\n# deltas: 2\n850 1 2 16 0 0 0\n8d1 0 2 16 1 -16 0\n";

    #[test]
    fn reads_plain_text_like_parse_deltas() {
        let read = read_deltas(TEXT.as_bytes(), 1 << 20).expect("plain");
        assert_eq!(read, crate::text::parse_deltas(TEXT).expect("parse"));
        assert_eq!(read.path, "/bin/x");
        assert_eq!(read.data.len(), 2);
    }

    #[test]
    fn the_limit_is_exact() {
        let len = TEXT.len() as u64;
        assert!(read_deltas(TEXT.as_bytes(), len).is_ok());
        let e = read_deltas(TEXT.as_bytes(), len - 1).expect_err("one byte over");
        assert!(
            matches!(e, InputError::TooLarge { limit } if limit == len - 1),
            "{e}"
        );
    }

    #[test]
    fn an_endless_stream_is_refused_at_the_limit() {
        // Endless valid lines: only the limit can stop them.
        let endless = b"# file: /x\n".chain(io::repeat(b'\n'));
        let e = read_deltas(endless, 1 << 20).expect_err("endless");
        assert!(matches!(e, InputError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn zeros_fail_at_their_first_bytes() {
        let e = read_deltas(io::repeat(0), u64::MAX).expect_err("zeros");
        assert_eq!(
            e.to_string(),
            "not a deltas file (it does not start with a '# file:' line)"
        );
        let e = read_deltas(&[0xff, 0xfe, 0][..], 100).expect_err("binary");
        assert_eq!(e.to_string(), "not a deltas file (not UTF-8 text)");
        let e = read_deltas(&b"\x7fELF\x02\x01"[..], 100).expect_err("ELF");
        assert_eq!(e.to_string(), "not a deltas file (an ELF file)");
        let e = read_deltas(&b""[..], 100).expect_err("empty");
        assert_eq!(e.to_string(), "not a deltas file (it is empty)");
    }

    #[test]
    fn a_long_line_is_refused_with_a_short_message() {
        let mut text = b"# file: /x\n".to_vec();
        text.extend(std::iter::repeat_n(b'z', 10 << 20));
        let e = read_deltas(text.as_slice(), u64::MAX).expect_err("long line");
        let message = e.to_string();
        assert!(
            message.starts_with("line 2 is longer than 16384 bytes"),
            "{message}"
        );
        assert!(message.len() < 200, "{} bytes: {message}", message.len());
        // A line of exactly MAX_LINE bytes is fine.
        let mut text = b"# file: /x\n#".to_vec();
        text.extend(std::iter::repeat_n(b' ', MAX_LINE - 1));
        text.push(b'\n');
        assert!(read_deltas(text.as_slice(), u64::MAX).is_ok());
    }

    #[test]
    fn a_bad_token_is_quoted_short() {
        let mut text = b"# file: /x\n".to_vec();
        text.extend(std::iter::repeat_n(b'z', 10_000));
        text.extend(b" 1 2 3 4 5 6\n");
        let e = read_deltas(text.as_slice(), u64::MAX).expect_err("bad address");
        let message = e.to_string();
        assert!(
            message.starts_with("line 2: bad address \"zzz"),
            "{message}"
        );
        assert!(message.ends_with("... (10000 bytes)"), "{message}");
        assert!(message.len() < 200, "{message}");
    }

    #[test]
    fn invalid_utf8_after_the_first_line_names_the_line() {
        let e = read_deltas(&b"# file: /x\n85\xff 1 2 3 4 5 6\n"[..], 100).expect_err("bad");
        assert_eq!(
            e.to_string(),
            "line 2: not UTF-8 text: \"85\u{fffd} 1 2 3 4 5 6\""
        );
    }

    #[test]
    fn line_numbers_count_every_line_read_plain_or_xz() {
        // Blank and CRLF lines count: the number is the one an editor shows.
        let text = "# file: /x\r\n\r\n# deltas: 3\n850 1 2 16 0 0 0\r\n\n8d1 0 2 16 1 -16 0\n";
        for bytes in [text.as_bytes().to_vec(), xz(text.as_bytes())] {
            let e = read_deltas(bytes.as_slice(), 1 << 20).expect_err("too few");
            assert_eq!(
                e.to_string(),
                "line 3: declares 3 deltas but the file ends after 2 (at line 6)"
            );
        }
        let extra = "# file: /x\n\n850 1 2 16 0 0 0 junk\n";
        let e = read_deltas(extra.as_bytes(), 1 << 20).expect_err("extra field");
        assert_eq!(
            e.to_string(),
            "line 3: extra field \"junk\" after the merge opcode (a row has 7 fields)"
        );
    }

    fn xz(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let options = lzma_rust2::XzOptions::with_preset(6);
        let mut w = lzma_rust2::XzWriter::new(Vec::new(), options).expect("xz writer");
        w.write_all(bytes).expect("compress");
        w.finish().expect("finish")
    }

    #[test]
    fn reads_xz_like_plain_text() {
        let packed = xz(TEXT.as_bytes());
        let read = read_deltas(packed.as_slice(), 1 << 20).expect("xz");
        assert_eq!(read, read_deltas(TEXT.as_bytes(), 1 << 20).expect("plain"));
    }

    #[test]
    fn the_limit_counts_the_inflated_bytes() {
        let mut text = b"# file: /x\n".to_vec();
        text.extend(std::iter::repeat_n(b'\n', 1 << 20));
        let packed = xz(&text);
        let limit = packed.len() as u64 + 1000;
        assert!(limit < text.len() as u64);
        let e = read_deltas(packed.as_slice(), limit).expect_err("inflates past the limit");
        assert!(
            matches!(e, InputError::InflatesTooLarge { limit: l } if l == limit),
            "{e}"
        );
        assert!(read_deltas(packed.as_slice(), text.len() as u64).is_ok());
    }

    #[test]
    fn a_compressed_elf_or_a_broken_stream_is_refused() {
        let e = read_deltas(xz(b"\x7fELF\x02\x01\x01").as_slice(), 100).expect_err("ELF");
        assert_eq!(
            e.to_string(),
            "an xz-compressed ELF file: decompress it first"
        );
        let e = read_deltas(XZ_MAGIC, 100).expect_err("magic only");
        assert!(matches!(e, InputError::Xz(_)), "{e}");
        let mut packed = xz(TEXT.as_bytes());
        let last = packed.len() - 1;
        packed[last] ^= 0xff;
        let e = read_deltas(packed.as_slice(), 1 << 20).expect_err("bad footer");
        assert!(matches!(e, InputError::Xz(_)), "{e}");
    }
}
