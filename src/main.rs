//! `eim`: the command line of the executable-info manager.
//!
//! Logs go to stderr (`-v`, `-vv`, `-vvv`, or `RUST_LOG` for full control);
//! results go to stdout, so they can be piped and diffed.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod deltas;
mod demo;
mod each;
mod fileid;
mod host_cli;
mod input;
mod inspect;
mod loaders_cmd;
mod synth;
mod tables;

// The text tables live in the library (the scan summary uses them too).
use eim::table;

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
    Scan(host_cli::ScanArgs),
    /// Keep the maps in step with the host: load new processes' files,
    /// release those of exited processes, every interval, until Ctrl-C.
    Watch(host_cli::WatchArgs),
    /// Which file, file id, page and unwind info the unwinder uses at each
    /// address (of a process with --pid, else of an ELF file).
    Lookup(host_cli::LookupArgs),
    /// Print what eim knows about each ELF file: file ids, delta count,
    /// C-library TSD (the oracle's `.tsd` line) and DTV layouts, and the
    /// interpreter loaders that recognise it.
    Inspect(inspect::InspectArgs),
    /// Print what every interpreter loader says about each ELF file: the
    /// loader, the interpreter version and the interpreter_offsets ranges.
    Loaders(loaders_cmd::LoadersArgs),
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
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Writes a report to stdout; a closed pipe is not an error.
fn print(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eim: stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo(args: &demo::DemoArgs) -> ExitCode {
    let report = match demo::run(args) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("eim: demo: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let text = if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => json + "\n",
            Err(e) => {
                eprintln!("eim: demo: cannot encode the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        demo::render_text(&report)
    };
    let code = print(&text);
    if report.book_matches_kernel {
        code
    } else {
        // The report says so too; a disagreement is a bug in eim.
        eprintln!("eim: demo: the manager's book and the kernel maps disagree");
        ExitCode::FAILURE
    }
}

/// Runs a subcommand over files, writing to stdout.
fn each(
    run: impl FnOnce(
        &mut std::io::BufWriter<std::io::StdoutLock<'static>>,
    ) -> std::io::Result<each::Outcome>,
) -> ExitCode {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match run(&mut out) {
        Ok(outcome) => outcome.exit_code(),
        Err(e) => {
            eprintln!("eim: stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit code of a host command, its error printed.
fn host_command(name: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("eim: {name}: {e:#}");
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match &cli.command {
        Command::Demo(args) => demo(args),
        Command::Tables(args) => each(|out| tables::run(args, out)),
        Command::Deltas(args) => each(|out| deltas::run(args, out)),
        Command::Fileid(args) => each(|out| fileid::run(args, out)),
        Command::Scan(args) => host_command("scan", host_cli::scan(args)),
        Command::Watch(args) => host_command("watch", host_cli::watch(args)),
        Command::Lookup(args) => host_command("lookup", host_cli::lookup(args)),
        Command::Inspect(args) => each(|out| inspect::run(args, out)),
        Command::Loaders(args) => each(|out| loaders_cmd::run(args, out)),
    }
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
