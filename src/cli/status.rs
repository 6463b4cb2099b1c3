//! `eim status`: a read-only look at the live pinned maps (what the
//! profiler reads right now), with their consistency checked from the maps
//! alone. Exits 1 on any violation.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use eim::bpf::generation::{Patience, Snapshot};
use eim::bpf::PinnedReader;
use eim::map_view::status;

use crate::backend::privileges_message;
use crate::out;

/// Options of `eim status`.
#[derive(Clone, Debug, clap::Args)]
pub struct StatusArgs {
    /// The pin directory an `eim scan`/`eim watch --backend kernel` owns.
    #[arg(long, default_value = crate::backend::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Print the status as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Opens the pins for reading, naming the privileges when they lack.
pub(crate) fn open_reader(pin_dir: &std::path::Path) -> anyhow::Result<PinnedReader> {
    let first = pin_dir.join(eim::abi::map_name::PAGES);
    if !first.exists() {
        anyhow::bail!(
            "{} holds no eim maps (no pin {}): `eim scan` or `eim watch` with --backend kernel --pin-dir {0} pins them",
            pin_dir.display(),
            eim::abi::map_name::PAGES
        );
    }
    match PinnedReader::open(pin_dir) {
        Ok(reader) => Ok(reader),
        Err(e) if !eim::bpf::probe::missing_capabilities().is_empty() => Err(anyhow::anyhow!(
            privileges_message(&format!("reading the pinned maps failed: {e}"))
        )),
        Err(e) => {
            Err(e).with_context(|| format!("reading the maps pinned in {}", pin_dir.display()))
        }
    }
}

pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let reader = open_reader(&args.pin_dir)?;
    let lock = reader.lock();
    let owner = lock.is_owned().then(|| lock.owner());
    let notes = lock.notes().cloned().unwrap_or_default();
    let dir = reader.dir().to_path_buf();
    let report = status::status(
        dir.clone(),
        owner,
        reader.unwind_slots(),
        || {
            let taken = reader.snapshot(Patience::READERS)?;
            let snapshot = match (&taken, reader.has_generation()) {
                (Snapshot::Consistent { .. }, _) => status::Snapshot::Consistent,
                (Snapshot::Torn { .. }, true) => status::Snapshot::Torn,
                (Snapshot::Torn { .. }, false) => status::Snapshot::Unsynchronized,
            };
            let attempts = taken.attempts();
            Ok::<_, eim::bpf::KernelError>(status::MapsRead {
                observed: taken.into_value().observed(),
                snapshot,
                attempts,
            })
        },
        status::REREAD_AFTER,
    )
    .with_context(|| format!("reading the maps pinned in {}", dir.display()))?
    .with_collisions(notes.collisions, notes.listed);
    // The report is taken: the shared lock and the pins go before a
    // single byte is written (stdout may be a pipe nobody reads).
    reader.release();
    let text = if args.json {
        serde_json::to_string_pretty(&report).context("encoding the status")? + "\n"
    } else {
        status::render_text(&report)
    };
    out::print(&text)?;
    Ok(if report.is_consistent() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
