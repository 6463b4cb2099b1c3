//! eim's two output streams, neither of which may crash it (`println!` and
//! `eprintln!` panic when a write fails).
//!
//! * stdout carries results. A reader that goes away (`eim deltas ... |
//!   head -1`) ends the command quietly with exit 0: it got what it asked
//!   for. Any other failure (a full disk) is a [`StdoutError`], reported on
//!   stderr with exit 1.
//! * stderr carries notes and logs. A line that cannot be written (stderr a
//!   full disk, a closed pipe, a terminal that hung up) is dropped: there is
//!   nowhere left to report it, and losing a log line must not stop a scan.

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

/// Writing the results to stdout failed.
#[derive(Debug, thiserror::Error)]
#[error("stdout: {0}")]
pub struct StdoutError(pub io::Error);

// By hand, not `#[from]`: the message prints the cause, so it is not also
// the `source()` (`eim_core::error`'s convention).
impl From<io::Error> for StdoutError {
    fn from(e: io::Error) -> Self {
        Self(e)
    }
}

impl StdoutError {
    /// The reader went away before reading everything: not eim's failure.
    pub fn reader_gone(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to stdout and flushes it.
pub fn print(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes one line to stderr, or drops it if stderr cannot take it.
pub fn write_note(args: fmt::Arguments<'_>) {
    // One write for the whole line: stderr is unbuffered, and a line
    // written piece by piece could be cut short when another thread ends
    // the process between the pieces (a stop note and the exit it allows).
    let mut line = fmt::format(args);
    line.push('\n');
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// `note!("eim: ...")`: [`write_note`] with `format!` arguments, for what
/// `eprintln!` would print.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::out::write_note(format_args!($($arg)*))
    };
}
pub(crate) use note;

/// The exit code of a command, its error reported on stderr. A stdout
/// whose reader went away is a quiet success.
pub fn exit_code(command: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    let error = match result {
        Ok(code) => return code,
        Err(error) => error,
    };
    match error.downcast_ref::<StdoutError>() {
        Some(out) if out.reader_gone() => ExitCode::SUCCESS,
        Some(out) => {
            note!("eim: {out}");
            ExitCode::FAILURE
        }
        None => {
            note!("eim: {command}: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The log writer: stderr, with write errors swallowed so that
/// `tracing-subscriber` neither fails nor reports them (its report is an
/// `eprintln!`, which panics on the same broken stderr).
#[derive(Clone, Copy, Debug, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().lock().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_pipe_is_a_reader_gone() {
        let gone = StdoutError(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(gone.reader_gone());
        let full = StdoutError(io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(!full.reader_gone());
    }

    #[test]
    fn a_stdout_error_under_context_is_still_found() {
        let gone: anyhow::Result<ExitCode> = Err(anyhow::Error::from(StdoutError(
            io::Error::from(io::ErrorKind::BrokenPipe),
        ))
        .context("printing the summary"));
        assert_eq!(exit_code("scan", gone), ExitCode::SUCCESS);
        let full: anyhow::Result<ExitCode> = Err(anyhow::Error::from(StdoutError(
            io::Error::from_raw_os_error(libc::ENOSPC),
        ))
        .context("printing the summary"));
        assert_eq!(exit_code("scan", full), ExitCode::FAILURE);
    }
}
