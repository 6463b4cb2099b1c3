//! `eim completions SHELL`: the shell completion script, generated from
//! the command line's own definition so that it can never lag behind it.

use std::process::ExitCode;

use clap_complete::Shell;

use crate::out;

/// Options of `eim completions`.
#[derive(Clone, Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the script for `args.shell` completing `cli` (the whole command
/// line, handed in by `main`, which owns its definition).
pub fn run(args: &CompletionsArgs, mut cli: clap::Command) -> anyhow::Result<ExitCode> {
    let name = cli.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cli, name, &mut script);
    // The generators write identifiers and help text, all from the
    // definition, which is UTF-8.
    out::print(&String::from_utf8_lossy(&script))?;
    Ok(ExitCode::SUCCESS)
}
