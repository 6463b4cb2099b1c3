//! `eim lookup`: what the unwinder's lookup answers for addresses of a
//! process or an ELF file, on a fresh load into either backend.

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

use anyhow::{bail, Context as _};

use eim::backends::inspect::Inspect;
use eim::backends::lookup;
use eim::host::scan::Host;

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
    /// `ADDR...` with `--pid`, else `FILE ADDR...`; addresses in hex (0x...) or decimal.
    /// (A file name need not be UTF-8.)
    #[arg(required = true)]
    pub args: Vec<OsString>,
    /// Print the answers as one JSON document.
    #[arg(long)]
    pub json: bool,
}

fn parse_address(arg: &OsStr) -> anyhow::Result<u64> {
    let s = arg
        .to_str()
        .with_context(|| format!("not an address: {arg:?}"))?;
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.with_context(|| format!("not an address: {s:?}"))
}

fn lookup_on<B: Inspect>(backend: B, args: &LookupArgs) -> anyhow::Result<ExitCode> {
    let mut config = host_config(&args.backend, &[]);
    let answers = match args.pid {
        Some(pid) => {
            let addresses: Vec<u64> = args
                .args
                .iter()
                .map(|a| parse_address(a))
                .collect::<anyhow::Result<_>>()?;
            config.only = Some([pid].into());
            let mut host = Host::new(backend, config);
            lookup::lookup_pid(&mut host, pid, &addresses)?
        }
        None => {
            let (file, rest) = args.args.split_first().context("FILE ADDR... expected")?;
            if rest.is_empty() {
                bail!("no address given for {}", file.to_string_lossy());
            }
            let addresses: Vec<u64> = rest
                .iter()
                .map(|a| parse_address(a))
                .collect::<anyhow::Result<_>>()?;
            let host = Host::new(backend, config);
            lookup::lookup_file(&host, std::path::Path::new(file), &addresses)?
        }
    };
    let text = if args.json {
        serde_json::to_string_pretty(&answers).context("encoding the answers")? + "\n"
    } else {
        answers
            .iter()
            .map(|a| lookup::render_line(a) + "\n")
            .collect()
    };
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: &LookupArgs) -> anyhow::Result<ExitCode> {
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
