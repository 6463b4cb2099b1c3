//! `eim deltas`: the stack deltas extracted from ELF files, in the
//! oracle's text format (`# error:` form for a file that fails).

use std::io::Write;
use std::path::{Path, PathBuf};

use eim::elf_file::DEFAULT_MAX_SIZE;
use eim::text::{render_deltas, render_deltas_error};
use eim::ElfProvider;

use crate::each::{self, Failure, Outcome};
use crate::input::read_elf;

/// Options of `eim deltas`.
#[derive(Clone, Debug, clap::Args)]
pub struct DeltasArgs {
    /// Refuse files larger than this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SIZE)]
    pub max_size: u64,
    /// ELF files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// The deltas text of one file, or its error text.
pub fn text(path: &Path, provider: &ElfProvider) -> Result<String, Failure> {
    match read_elf(path, provider) {
        Ok(input) => Ok(render_deltas(&input.path, &input.data)),
        Err(e) => {
            let message = format!("{e:#}");
            Err(Failure {
                stdout: Some(render_deltas_error(&path.display().to_string(), &message)),
                message,
            })
        }
    }
}

pub fn run(args: &DeltasArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    let provider = ElfProvider::new().with_max_size(args.max_size);
    each::run(&args.files, out, |path| text(path, &provider))
}
