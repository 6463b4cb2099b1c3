//! `eim deltas`: the stack deltas extracted from ELF files, in the
//! oracle's text format (`# error:` form for a file that fails).

use std::io::Write;
use std::path::{Path, PathBuf};

use eim::deltas::IntervalData;
use eim::files::elf_file::{ElfFileRef, DEFAULT_MAX_SIZE};
use eim::text::{render_deltas_error, write_deltas};
use eim::ElfProvider;

use crate::each::{self, Failure, Outcome, Text};
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

/// One file's deltas, printed in the oracle's format.
pub struct Deltas {
    pub path: String,
    pub data: IntervalData,
}

impl Text for Deltas {
    fn write_to<W: Write>(&self, out: &mut W) -> std::io::Result<()> {
        write_deltas(out, &self.path, &self.data)
    }
}

/// The deltas of one file, or its error text.
pub fn text(path: &Path, provider: &ElfProvider) -> Result<Deltas, Failure> {
    match read_elf(path, provider) {
        Ok(input) => Ok(Deltas {
            path: input.path,
            data: input.data,
        }),
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
pub fn vdso_text(path: &Path, max_size: u64) -> Result<Deltas, Failure> {
    let shown = path.display().to_string();
    let fail = |message: String| Failure {
        stdout: Some(render_deltas_error(&shown, &message)),
        message,
    };
    let file = ElfFileRef::new(path).with_max_size(max_size);
    let open = file.get().map_err(|e| fail(e.to_string()))?;
    match eim::elf::vdso::synthesize(open.elf()) {
        Some(data) => Ok(Deltas { path: shown, data }),
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
