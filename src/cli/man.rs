//! `eim man [--out DIR]`: the manual pages, generated from the command
//! line's own definition (`clap_mangen`): `eim.1` on stdout, or `eim.1`
//! and one `eim-COMMAND.1` per command written into a directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap_mangen::Man;

use crate::out;

/// Options of `eim man`.
#[derive(Clone, Debug, clap::Args)]
pub struct ManArgs {
    /// Write `eim.1` and one page per command (`eim-scan.1`, ...) into this
    /// directory (created if missing) instead of printing `eim.1`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// A command's page, rendered; `source` is eim's name and version (a
/// command has no version of its own).
fn render(cmd: clap::Command, source: &str) -> anyhow::Result<(String, Vec<u8>)> {
    // Manual pages head themselves in capitals (`.TH EIM-SCAN 1`), as
    // man-pages(7) asks.
    let title = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_uppercase();
    let man = Man::new(cmd).title(title).source(source);
    let name = man.get_filename();
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("rendering the manual page {name}"))?;
    Ok((name, page))
}

/// Every page of `cli` and its commands: the root first.
fn pages(cli: clap::Command) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    // `help` is clap's, not a command of eim: it has no page of its own.
    let mut cli = cli.disable_help_subcommand(true);
    // Built, the commands carry their display names (`eim-scan`), which
    // name their pages and head them.
    cli.build();
    let source = format!(
        "{} {}",
        cli.get_name(),
        cli.get_version().unwrap_or_default()
    );
    let mut pages = vec![render(cli.clone(), &source)?];
    // eim's commands have no commands of their own: one level.
    for cmd in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        pages.push(render(cmd.clone(), &source)?);
    }
    Ok(pages)
}

fn write_pages(dir: &Path, pages: &[(String, Vec<u8>)]) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the directory {}", dir.display()))?;
    let mut written = String::new();
    for (name, page) in pages {
        let path = dir.join(name);
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
        written.push_str(&format!("{}\n", path.display()));
    }
    Ok(written)
}

/// Prints `eim.1`, or writes every page into `args.out` and prints their
/// paths. `cli` is the whole command line, handed in by `main`, which owns
/// its definition.
pub fn run(args: &ManArgs, cli: clap::Command) -> anyhow::Result<ExitCode> {
    let pages = pages(cli)?;
    match &args.out {
        Some(dir) => out::print(&write_pages(dir, &pages)?)?,
        None => {
            let root = pages.first().map(|(_, p)| p.as_slice()).unwrap_or_default();
            out::print(&String::from_utf8_lossy(root))?
        }
    }
    Ok(ExitCode::SUCCESS)
}
