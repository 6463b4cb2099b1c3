//! `eim tables`: the kernel tables a fresh manager writes for each input (an
//! ELF file or its deltas), in upstream's `.encoded` text format, so they
//! can be diffed against the oracle.

use std::io::Write;
use std::path::{Path, PathBuf};

use eim::files::elf_file::DEFAULT_MAX_SIZE;
use eim::machine::{Capacities, KernelBook};
use eim::text::Tables;
use eim::FileId;

use crate::each::{self, Failure, Outcome, Text};
use crate::input::read_input;

/// Options of `eim tables`.
#[derive(Clone, Debug, clap::Args)]
pub struct TablesArgs {
    /// Refuse files larger than this many bytes (a deltas file's bytes are
    /// also counted after decompression).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SIZE)]
    pub max_size: u64,
    /// ELF executables (their deltas are extracted), or deltas files in the
    /// oracle's text format (`.xz`-compressed or plain).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// One input's tables, printed in the `.encoded` format.
pub struct Encoded {
    pub path: String,
    pub deltas_in: usize,
    pub tables: Tables,
}

impl Text for Encoded {
    fn write_to<W: Write>(&self, out: &mut W) -> std::io::Result<()> {
        self.tables.write(out, &self.path, self.deltas_in)
    }
}

/// The tables a fresh manager would write for one input.
pub fn encode(path: &Path, max_size: u64) -> anyhow::Result<Encoded> {
    let input = read_input(path, max_size)?;
    // A fresh book per file: the oracle records each file loaded alone. The
    // file id does not appear in the output (page keys print only the page).
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(0x1234), &input.data, None)?;
    Ok(Encoded {
        tables: Tables::of_plan(&plan),
        path: input.path,
        deltas_in: input.data.len(),
    })
}

/// Renders every file to `out`, reporting bad ones on stderr and going on
/// with the rest.
pub fn run(args: &TablesArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    each::run(&args.files, out, |path| {
        encode(path, args.max_size).map_err(|e| {
            tracing::debug!(path = %path.display(), "failed: {e:?}");
            Failure::message(format!("{e:#}"))
        })
    })
}
