//! `eim loaders`: what every interpreter loader says about each ELF file,
//! one line per match: `<path> <loader> <version> [program <n> <ranges>]`,
//! or `<path> <loader> error: <why>`. A file no loader recognises prints
//! `<path> -`.

use std::io::Write;
use std::path::PathBuf;

use crate::each::{self, Failure, Outcome};

/// Options of `eim loaders`.
#[derive(Clone, Debug, clap::Args)]
pub struct LoadersArgs {
    /// ELF files (with the names they are mapped under: loaders go by name).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

pub fn run(args: &LoadersArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    each::run(&args.files, out, |path| {
        let matches =
            eim::files::loaders::inspect(path).map_err(|e| Failure::message(e.message))?;
        if matches.is_empty() {
            return Ok(format!("{} -\n", path.display()));
        }
        Ok(matches
            .iter()
            .map(|m| format!("{} {m}\n", path.display()))
            .collect())
    })
}
