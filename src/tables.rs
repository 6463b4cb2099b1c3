//! `eim tables`: the kernel tables a fresh manager writes for each input, in
//! upstream's `.encoded` text format, so they can be diffed against the
//! oracle.

use std::io::Write;
use std::path::{Path, PathBuf};

use eim::machine::{Capacities, KernelBook};
use eim::text::Tables;
use eim::FileId;

use crate::input::read_input;

/// Options of `eim tables`.
#[derive(Clone, Debug, clap::Args)]
pub struct TablesArgs {
    /// Deltas files in the oracle's text format (`.xz`-compressed or plain).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// The `.encoded` text for one input, as a fresh manager would write it.
pub fn encode(path: &Path) -> anyhow::Result<String> {
    let input = read_input(path)?;
    // A fresh book per file: the oracle records each file loaded alone. The
    // file id does not appear in the output (page keys print only the page).
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(0x1234), &input.data.deltas)?;
    Ok(Tables::of_plan(&plan).render(&input.path, input.data.len()))
}

/// What became of a run over several files.
pub enum Outcome {
    /// Every file was rendered.
    Ok,
    /// Some files failed (each was reported on stderr).
    SomeFailed,
    /// Stdout was closed early (`eim tables ... | head`): stop quietly.
    Closed,
}

/// Renders every file to `out`, reporting bad ones on stderr and going on
/// with the rest.
pub fn run(args: &TablesArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    let mut failed = false;
    for path in &args.files {
        match encode(path) {
            Ok(text) => match out.write_all(text.as_bytes()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(Outcome::Closed),
                Err(e) => return Err(e),
            },
            Err(e) => {
                failed = true;
                tracing::debug!(path = %path.display(), "failed: {e:?}");
                eprintln!("eim: {}: {e:#}", path.display());
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
