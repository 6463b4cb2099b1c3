//! `eim deltas`: the stack deltas extracted from ELF files, in the
//! oracle's text format (`# error:` form for a file that fails).

use std::io::Write;
use std::path::{Path, PathBuf};

use eim::files::elf_file::{ElfFileRef, DEFAULT_MAX_SIZE};
use eim::text::{render_deltas, render_deltas_error};
use eim::ElfProvider;

use crate::each::{self, Failure, Outcome};
use crate::input::read_elf;

/// Options of `eim deltas`.
#[derive(Clone, Debug, clap::Args)]
pub struct DeltasArgs {
    /// Refuse files larger than this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SIZE)]
    pub max_size: u64,
    /// Print the synthetic deltas of an arm64 vDSO image (what a profiler
    /// loads with `add_synth_interval_data`) instead of extracting.
    #[arg(long)]
    pub vdso: bool,
    /// ELF files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// The deltas text of one file, or its error text.
pub fn text(path: &Path, provider: &ElfProvider) -> Result<String, Failure> {
    match read_elf(path, provider) {
        Ok(input) => Ok(render_deltas(&input.path, &input.data)),
        Err(e) => {
            let message = format!("{e:#}");
            Err(Failure {
                stdout: Some(render_deltas_error(&path.display().to_string(), &message)),
                message,
            })
        }
    }
}

/// The synthetic vDSO deltas of one file, or why there are none.
pub fn vdso_text(path: &Path, max_size: u64) -> Result<String, Failure> {
    let shown = path.display().to_string();
    let fail = |message: String| Failure {
        stdout: Some(render_deltas_error(&shown, &message)),
        message,
    };
    let file = ElfFileRef::new(path).with_max_size(max_size);
    let open = file.get().map_err(|e| fail(e.to_string()))?;
    match eim::elf::vdso::synthesize(open.elf()) {
        Some(data) => Ok(render_deltas(&shown, &data)),
        None => Err(fail("not an arm64 vDSO image".to_string())),
    }
}

pub fn run(args: &DeltasArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    if args.vdso {
        return each::run(&args.files, out, |path| vdso_text(path, args.max_size));
    }
    let provider = ElfProvider::new().with_max_size(args.max_size);
    each::run(&args.files, out, |path| text(path, &provider))
}
