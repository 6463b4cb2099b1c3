//! `eim stack`: every thread's stack of one process, like pstack, unwound
//! with eim's own tables. The process's files and its mappings are loaded
//! by a host scan of that process only, into the embedded simulated
//! kernel (`--backend sim`: the user-space twin of the native unwinder
//! walks the stopped threads' stacks over it) or into private kernel maps
//! (`--backend kernel`: the BPF unwinder walks them in the task iterator).

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use anyhow::Context as _;

use eim::host::scan::{Host, Quiet};
use eim::map_view::Inspect;
use eim::sim::SimReader;
use eim::stack::{self, kernel::KernelStacks, output, SimStacks};

use crate::backend::{
    files_per_batch, host_config, kernel_maps, sim_maps, BackendArgs, BackendKind,
};
use crate::out;

/// Options of `eim stack`.
#[derive(Clone, Debug, clap::Args)]
pub struct StackArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// The process whose threads to unwind.
    #[arg(long)]
    pub pid: i32,
    /// Print the stacks as one JSON document.
    #[arg(long)]
    pub json: bool,
}

fn print(stacks: &stack::ProcessStacks, json: bool) -> anyhow::Result<ExitCode> {
    let text = if json {
        serde_json::to_string_pretty(stacks).context("encoding the stacks")? + "\n"
    } else {
        output::render_text(stacks)
    };
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// A host over `maps` that has loaded the files and the mappings of the
/// process `args` names (a step of that process only).
fn loaded<B: Inspect>(maps: B, args: &StackArgs) -> anyhow::Result<Host<B>> {
    let pid = args.pid;
    let mut host = Host::new(maps, host_config(&args.backend, &[pid]));
    host.step(&AtomicBool::new(false), &mut Quiet)
        .with_context(|| format!("loading the files of process {pid}"))?;
    Ok(host)
}

fn stack_sim(args: &StackArgs) -> anyhow::Result<ExitCode> {
    let host = loaded(sim_maps()?, args)?;
    // The host wrote the process's eim_process_mappings entry with its
    // files: the simulated kernel's maps are all the twin reads.
    let stacks = host.with_backend(|maps| {
        stack::stacks(args.pid, &SimStacks::new(&SimReader::new(maps), maps))
    })?;
    print(&stacks, args.json)
}

fn stack_kernel(args: &StackArgs) -> anyhow::Result<ExitCode> {
    // Private maps: never the pinned ones a running watch owns.
    let host = loaded(
        kernel_maps(&args.backend, false, false, files_per_batch())?,
        args,
    )?;
    let stacks = stack::stacks(args.pid, &KernelStacks::new(host.manager()))?;
    print(&stacks, args.json)
}

pub fn run(args: &StackArgs) -> anyhow::Result<ExitCode> {
    args.backend.refuse_unused_pin_options(
        false,
        "stack loads into private maps (never the pinned ones)",
    )?;
    match args.backend.backend {
        BackendKind::Sim => stack_sim(args),
        BackendKind::Kernel => stack_kernel(args),
    }
}
