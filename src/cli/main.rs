//! `eim`: the command line of the executable-info manager.
//!
//! Logs go to stderr (`-v`, `-vv`, `-vvv`, or `RUST_LOG` for full control);
//! results go to stdout, so they can be piped and diffed. Both go through
//! [`out`]: a failing stdout or stderr never panics.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand};

mod backend;
mod completions;
mod deltas;
mod demo;
#[cfg(test)]
mod deploy_tests;
mod each;
mod fileid;
mod input;
mod inspect;
mod loaders;
mod lookup;
mod man;
mod memory;
mod out;
mod profile;
mod scan;
mod stack;
mod status;
mod stop;
mod synth;
mod tables;
mod watch;

/// An allocation that fails ends eim with one line, not an abort
/// ([`memory`]).
#[global_allocator]
static ALLOCATOR: memory::ExitOnFailure = memory::ExitOnFailure;

// The text tables live in the library (the scan summary uses them too).
use eim::report::table;

#[derive(Debug, Parser)]
#[command(
    name = "eim",
    version,
    about = "Executable-info manager for eBPF native unwinding",
    long_about = "Executable-info manager for eBPF native unwinding: loads per-executable \
                  stack-delta tables into the kernel maps a BPF unwinder reads."
)]
struct Cli {
    /// More logging on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load synthetic executables for simulated processes into a simulated
    /// kernel, let half of the processes exit, and report what the maps hold.
    Demo(demo::DemoArgs),
    /// Print the kernel tables a fresh manager writes for each ELF file (or
    /// deltas file), in upstream's `.encoded` format.
    Tables(tables::TablesArgs),
    /// Print the stack deltas extracted from each ELF file, in the oracle's
    /// `.deltas` format.
    Deltas(deltas::DeltasArgs),
    /// Print the file ids of each ELF file: `<128-bit id> <64-bit host id> <path>`.
    Fileid(fileid::FileidArgs),
    /// Load every executable file mapped by a process of this host, then
    /// print what the maps hold, what it costs and what failed.
    Scan(scan::ScanArgs),
    /// Keep the maps in step with the host: load new processes' files,
    /// release those of exited processes, every interval, until Ctrl-C.
    Watch(watch::WatchArgs),
    /// Which file, file id, page and unwind info the unwinder uses at each
    /// address (of a process with --pid, else of an ELF file).
    Lookup(lookup::LookupArgs),
    /// Print every thread's stack of a process (like pstack), unwound with
    /// eim's tables: the process's files are loaded, its threads stopped
    /// for the walk, and the frames symbolized from the files' symbols.
    Stack(stack::StackArgs),
    /// Sample user stacks with the BPF unwinder over eim's maps (the
    /// profiled processes' files loaded and kept loaded as they change),
    /// written as folded stacks and optionally as a pprof profile.
    Profile(profile::ProfileArgs),
    /// Print what eim knows about each ELF file: file ids, delta count,
    /// C-library TSD (the oracle's `.tsd` line) and DTV layouts, and the
    /// interpreter loaders that recognise it.
    Inspect(inspect::InspectArgs),
    /// Print what every interpreter loader says about each ELF file: the
    /// loader, the interpreter version and the interpreter_offsets ranges.
    Loaders(loaders::LoadersArgs),
    /// Show what the live pinned maps hold (per file id: class, pages,
    /// deltas, slots, interpreter offsets; memory) and check their
    /// consistency from the maps alone; exits 1 on any violation. Read-only:
    /// never takes the owner's lock.
    Status(status::StatusArgs),
    /// Print the completion script of a shell for eim
    /// (`eim completions bash > /etc/bash_completion.d/eim`).
    Completions(completions::CompletionsArgs),
    /// Print eim's manual page, or with --out write one page per command
    /// (`eim man --out /usr/local/share/man/man1`).
    Man(man::ManArgs),
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| out::LogWriter)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn demo(args: &demo::DemoArgs) -> anyhow::Result<ExitCode> {
    let report = demo::run(args)?;
    let text = if args.json {
        serde_json::to_string_pretty(&report).context("cannot encode the report")? + "\n"
    } else {
        demo::render_text(&report)
    };
    out::print(&text)?;
    if report.book_matches_kernel {
        Ok(ExitCode::SUCCESS)
    } else {
        // The report says so too; a disagreement is a bug in eim.
        out::note!("eim: demo: the manager's book and the kernel maps disagree");
        Ok(ExitCode::FAILURE)
    }
}

/// Runs a subcommand over files, writing to stdout.
fn each(
    run: impl FnOnce(
        &mut std::io::BufWriter<std::io::StdoutLock<'static>>,
    ) -> std::io::Result<each::Outcome>,
) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let outcome = run(&mut stdout).map_err(out::StdoutError)?;
    Ok(outcome.exit_code())
}

/// Raises the soft limit of open files to the hard limit
/// ([`eim::host::descriptors`]), saying so at `-v`; a failure is a warning, not
/// an error: eim then works within the soft limit.
fn raise_descriptor_limit() {
    match eim::host::descriptors::raise_soft_limit() {
        Ok(r) if r.changed() => tracing::info!(
            "raised the soft limit of open files (RLIMIT_NOFILE) from {} to the hard limit {}",
            r.from,
            r.to
        ),
        Ok(r) => tracing::info!(
            "the soft limit of open files (RLIMIT_NOFILE) is already the hard limit {}",
            r.to
        ),
        Err(e) => tracing::warn!("{e}; working within the soft limit"),
    }
}

fn main() -> ExitCode {
    memory::configure();
    let cli = Cli::parse();
    init_logging(cli.verbose);
    raise_descriptor_limit();
    let (name, result) = match &cli.command {
        Command::Demo(args) => ("demo", demo(args)),
        Command::Tables(args) => ("tables", each(|out| tables::run(args, out))),
        Command::Deltas(args) => ("deltas", each(|out| deltas::run(args, out))),
        Command::Fileid(args) => ("fileid", each(|out| fileid::run(args, out))),
        Command::Scan(args) => ("scan", scan::run(args)),
        Command::Watch(args) => ("watch", watch::run(args)),
        Command::Lookup(args) => ("lookup", lookup::run(args)),
        Command::Stack(args) => ("stack", stack::run(args)),
        Command::Profile(args) => ("profile", profile::run(args)),
        Command::Inspect(args) => ("inspect", each(|out| inspect::run(args, out))),
        Command::Loaders(args) => ("loaders", each(|out| loaders::run(args, out))),
        Command::Status(args) => ("status", status::run(args)),
        Command::Completions(args) => ("completions", completions::run(args, Cli::command())),
        Command::Man(args) => ("man", man::run(args, Cli::command())),
    };
    out::exit_code(name, result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
