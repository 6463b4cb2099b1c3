//! Running a subcommand over several files: each file's text goes to
//! stdout in order, each failure is reported on stderr (naming the file)
//! and the run goes on with the next file.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::out::note;

/// A file that could not be handled.
pub struct Failure {
    /// What to write to stdout instead of the file's text, if anything
    /// (`eim deltas` writes the oracle's `# error:` form).
    pub stdout: Option<String>,
    /// What went wrong, without the file name: stderr gets
    /// `eim: <file>: <message>`.
    pub message: String,
}

impl Failure {
    pub fn message(message: impl Into<String>) -> Self {
        Self {
            stdout: None,
            message: message.into(),
        }
    }
}

/// What became of a run over several files.
pub enum Outcome {
    /// Every file was handled.
    Ok,
    /// Some files failed (each was reported on stderr).
    SomeFailed,
    /// Stdout was closed early (`eim ... | head`): stop quietly.
    Closed,
}

impl Outcome {
    pub fn exit_code(self) -> std::process::ExitCode {
        match self {
            Outcome::Ok | Outcome::Closed => std::process::ExitCode::SUCCESS,
            Outcome::SomeFailed => std::process::ExitCode::FAILURE,
        }
    }
}

/// Writes `text` to `out`; `Ok(false)` if the reader has gone.
fn write_text(out: &mut impl Write, text: &str) -> std::io::Result<bool> {
    match out.write_all(text.as_bytes()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs `each` on every file in order. An `Err` is a failure to write
/// stdout.
pub fn run(
    files: &[PathBuf],
    out: &mut impl Write,
    mut each: impl FnMut(&Path) -> Result<String, Failure>,
) -> std::io::Result<Outcome> {
    let mut failed = false;
    for path in files {
        let text = match each(path) {
            Ok(text) => Some(text),
            Err(failure) => {
                failed = true;
                note!("eim: {}: {}", path.display(), failure.message);
                failure.stdout
            }
        };
        if let Some(text) = text {
            if !write_text(out, &text)? {
                return Ok(Outcome::Closed);
            }
        }
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(Outcome::Closed),
        r => r?,
    }
    Ok(if failed {
        Outcome::SomeFailed
    } else {
        Outcome::Ok
    })
}
