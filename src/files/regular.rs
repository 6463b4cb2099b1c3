//! Opening a file named by a user or a process for reading its contents,
//! the one way every command does it.
//!
//! A path may name anything: a FIFO (a plain `open` blocks until a writer
//! comes, forever if none does), a terminal, a device (`/dev/zero` never
//! ends), a socket or a directory. Only regular files are read: the path is
//! first opened `O_PATH` (which opens nothing: no device's `open` runs, no
//! FIFO blocks), checked with `fstat`, refused with [`NOT_REGULAR`] unless
//! it is a regular file, and only then opened `O_NONBLOCK | O_NOCTTY |
//! O_CLOEXEC` ([`super::opener`]). Reads of a regular file ignore
//! `O_NONBLOCK`.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::Path;

use super::opener::{self, kind_of};

/// The message of the error for anything that is not a regular file.
pub const NOT_REGULAR: &str = "not a regular file";

/// Opens `path` for reading if it is a regular file; the error for anything
/// else is `InvalidInput` and says what it is ("not a regular file: a FIFO").
/// The path is the operator's: links are followed, but its type is checked
/// on an `O_PATH` descriptor before it is opened ([`opener::locate`]).
pub fn open_regular(path: &Path) -> io::Result<(File, Metadata)> {
    Ok(opener::locate(path)?.open()?)
}

/// Refuses anything that is not a regular file, saying what it is.
pub fn check_regular(meta: &Metadata) -> io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{NOT_REGULAR}: {}", kind_of(meta)),
    ))
}

/// Reads all of `reader`, refusing it as soon as it has more than `limit`
/// bytes: never more than `limit + 1` bytes are held.
pub fn read_bounded(reader: impl Read, limit: u64, what: &str) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{what} is larger than the limit of {limit} bytes"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A FIFO with no writer: a blocking open would never return.
        let e = open_regular(&fifo).expect_err("a FIFO");
        assert_eq!(e.to_string(), "not a regular file: a FIFO");
        let e = open_regular(dir.path()).expect_err("a directory");
        assert_eq!(e.to_string(), "not a regular file: a directory");
        let e = open_regular(Path::new("/dev/zero")).expect_err("a device");
        assert_eq!(e.to_string(), "not a regular file: a character device");
        let file = dir.path().join("f");
        std::fs::write(&file, b"hello").expect("write");
        let (f, meta) = open_regular(&file).expect("a regular file");
        assert_eq!(meta.len(), 5);
        assert_eq!(read_bounded(&f, 5, "f").expect("at the limit"), b"hello");
    }

    #[test]
    fn bounded_reads_stop_at_the_limit() {
        let e = read_bounded(io::repeat(0), 1000, "the stream").expect_err("endless");
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("limit of 1000 bytes"), "{e}");
        assert_eq!(read_bounded(&b"abc"[..], 3, "x").expect("fits"), b"abc");
    }
}
