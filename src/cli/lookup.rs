//! `eim lookup`: what the unwinder's lookup answers for addresses of a
//! process or an ELF file, on a fresh load into either backend, or from
//! the live pinned maps (`--pinned`).

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

use anyhow::{bail, Context as _};

use eim::address;
use eim::host::scan::Host;
use eim::map_view::Inspect;

use crate::backend::{
    files_per_batch, host_config, kernel_maps, sim_maps, BackendArgs, BackendKind,
};
use crate::out;

/// Options of `eim lookup`.
#[derive(Clone, Debug, clap::Args)]
pub struct LookupArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Look up addresses of this process (otherwise the first argument is
    /// an ELF file and the addresses are its virtual addresses).
    #[arg(long)]
    pub pid: Option<i32>,
    /// `ADDR...` with `--pid`, else `FILE ADDR...`; addresses in hex, with
    /// or without 0x (as eim prints every address, and as addr2line reads
    /// them). (A file name need not be UTF-8.)
    #[arg(required = true)]
    pub args: Vec<OsString>,
    /// Print the answers as one JSON document.
    #[arg(long)]
    pub json: bool,
    /// Answer from the live maps pinned in --pin-dir (what the profiler
    /// reads now), through the lookup program loaded over them; nothing is
    /// loaded, and the owner's lock is never taken.
    #[arg(long, conflicts_with_all = ["backend", "no_pin", "mount_bpffs", "recreate_mismatched"])]
    pub pinned: bool,
}

/// An address in hex, `0x` or not: a bare `27234` is 0x27234, never
/// decimal, like every address eim prints.
fn parse_address(arg: &OsStr) -> anyhow::Result<u64> {
    let s = arg
        .to_str()
        .with_context(|| format!("not an address: {arg:?}"))?;
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(hex, 16).with_context(|| format!("not a hexadecimal address: {s:?}"))
}

fn addresses(args: &[OsString]) -> anyhow::Result<Vec<u64>> {
    args.iter().map(|a| parse_address(a)).collect()
}

fn file_and_addresses(args: &LookupArgs) -> anyhow::Result<(&OsString, Vec<u64>)> {
    let (file, rest) = args.args.split_first().context("FILE ADDR... expected")?;
    if rest.is_empty() {
        bail!("no address given for {}", file.to_string_lossy());
    }
    Ok((file, addresses(rest)?))
}

fn print_answers(answers: &[address::AddressAnswer], json: bool) -> anyhow::Result<ExitCode> {
    let text = if json {
        serde_json::to_string_pretty(answers).context("encoding the answers")? + "\n"
    } else {
        answers
            .iter()
            .map(|a| address::render_line(a) + "\n")
            .collect()
    };
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn lookup_on<B: Inspect>(backend: B, args: &LookupArgs) -> anyhow::Result<ExitCode> {
    let mut config = host_config(&args.backend, &[]);
    let answers = match args.pid {
        Some(pid) => {
            let addresses = addresses(&args.args)?;
            config.only = Some([pid].into());
            let mut host = Host::new(backend, config);
            address::lookup_pid(&mut host, pid, &addresses)?
        }
        None => {
            let (file, rest) = file_and_addresses(args)?;
            let host = Host::new(backend, config);
            address::lookup_file(&host, std::path::Path::new(file), &rest)?
        }
    };
    print_answers(&answers, args.json)
}

/// The answers from the live pinned maps.
fn lookup_pinned(args: &LookupArgs) -> anyhow::Result<ExitCode> {
    let reader = crate::status::open_reader(&args.backend.pin_dir())?;
    let strategy = host_config(&args.backend, &[]).strategy;
    let answers = match args.pid {
        Some(pid) => {
            let addresses = addresses(&args.args)?;
            address::lookup_pid_pinned(&reader, pid, &addresses, strategy)?
        }
        None => {
            let (file, rest) = file_and_addresses(args)?;
            address::lookup_file_pinned(&reader, std::path::Path::new(file), &rest)?
        }
    };
    // Answered: the shared lock and the pins go before anything is
    // printed (stdout may be a pipe nobody reads).
    reader.release();
    print_answers(&answers, args.json)
}

pub fn run(args: &LookupArgs) -> anyhow::Result<ExitCode> {
    if args.pinned {
        return lookup_pinned(args);
    }
    args.backend.refuse_unused_pin_options(
        false,
        "lookup loads into private maps (never the pinned ones); --pinned reads the pinned maps",
    )?;
    match args.backend.backend {
        BackendKind::Sim => lookup_on(sim_maps()?, args),
        // Private maps: a lookup must not clean the maps a running scan or
        // watch has pinned.
        BackendKind::Kernel => lookup_on(
            kernel_maps(&args.backend, false, false, files_per_batch())?,
            args,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_hex_with_or_without_0x() {
        let parse = |s: &str| parse_address(OsStr::new(s)).ok();
        assert_eq!(parse("27234"), Some(0x27234));
        assert_eq!(parse("0x27234"), Some(0x27234));
        assert_eq!(parse("0X7f12"), Some(0x7f12));
        assert_eq!(parse("7fabc0"), Some(0x7f_abc0));
        assert_eq!(parse("0x"), None);
        assert_eq!(parse("12z"), None);
        assert_eq!(parse("-1"), None);
    }
}
