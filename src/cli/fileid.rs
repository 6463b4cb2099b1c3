//! `eim fileid`: the 128-bit and 64-bit file ids of ELF files, one line
//! each, exactly as in the oracle's `.fileid` files.

use std::io::Write;
use std::path::{Path, PathBuf};

use eim::files::elf_file::DEFAULT_MAX_SIZE;
use eim::ElfFileRef;

use crate::each::{self, Failure, Outcome};

/// Options of `eim fileid`.
#[derive(Clone, Debug, clap::Args)]
pub struct FileidArgs {
    /// Refuse files larger than this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SIZE)]
    pub max_size: u64,
    /// ELF files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// `<hex128> <hex64> <path>` and a newline, the path as given.
pub fn line(path: &Path, max_size: u64) -> Result<String, Failure> {
    let file = ElfFileRef::new(path).with_max_size(max_size);
    let id = file.file_id().map_err(|e| Failure::message(e.message))?;
    Ok(format!("{id} {} {}\n", id.host(), path.display()))
}

pub fn run(args: &FileidArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    each::run(&args.files, out, |path| line(path, args.max_size))
}
