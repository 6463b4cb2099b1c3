//! Opening a file named by a user or a process for reading its contents,
//! the one way every command does it.
//!
//! A path may name anything: a FIFO (a plain `open` blocks until a writer
//! comes, forever if none does), a terminal, a device (`/dev/zero` never
//! ends), a socket or a directory. Only regular files are read: the file is
//! opened `O_NONBLOCK | O_NOCTTY | O_CLOEXEC` (so opening a FIFO or a
//! terminal neither blocks nor makes it ours), checked with `fstat`, and
//! refused with [`NOT_REGULAR`] unless it is a regular file. Reads of a
//! regular file ignore `O_NONBLOCK`.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The message of the error for anything that is not a regular file.
pub const NOT_REGULAR: &str = "not a regular file";

/// What a non-regular file is, in a user's words.
fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file; the error for anything
/// else is `InvalidInput` and says what it is ("not a regular file: a FIFO").
pub fn open_regular(path: &Path) -> io::Result<(File, Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    check_regular(&meta)?;
    Ok((file, meta))
}

/// Refuses anything that is not a regular file, saying what it is.
pub fn check_regular(meta: &Metadata) -> io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let kind = kind_of(meta);
    let message = if kind == NOT_REGULAR {
        NOT_REGULAR.to_string()
    } else {
        format!("{NOT_REGULAR}: {kind}")
    };
    Err(io::Error::new(io::ErrorKind::InvalidInput, message))
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
