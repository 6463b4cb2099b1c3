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

/// A file's output: text made whole, or data that writes its own text (a
/// big table is formatted straight into stdout's buffer rather than into a
/// string first).
pub trait Text {
    fn write_to<W: Write>(&self, out: &mut W) -> std::io::Result<()>;
}

impl Text for String {
    fn write_to<W: Write>(&self, out: &mut W) -> std::io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

/// Writes `text` to `out`; `Ok(false)` if the reader has gone.
fn write_text(out: &mut impl Write, text: &impl Text) -> std::io::Result<bool> {
    match text.write_to(out) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs `each` on every file in order. An `Err` is a failure to write
/// stdout.
pub fn run<T: Text>(
    files: &[PathBuf],
    out: &mut impl Write,
    mut each: impl FnMut(&Path) -> Result<T, Failure>,
) -> std::io::Result<Outcome> {
    let mut failed = false;
    for path in files {
        let written = match each(path) {
            Ok(text) => write_text(out, &text)?,
            Err(failure) => {
                failed = true;
                note!("eim: {}: {}", path.display(), failure.message);
                match failure.stdout {
                    Some(text) => write_text(out, &text)?,
                    None => true,
                }
            }
        };
        if !written {
            return Ok(Outcome::Closed);
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
