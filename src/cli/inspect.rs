//! `eim inspect`: what eim knows about each ELF file: its file ids, how
//! many stack deltas it has, its C-library layouts (TSD as one line in the
//! oracle's `.tsd` form, and the DTV) and the interpreter loaders that
//! recognised it. `--json` prints the same as one JSON object per file
//! and line.

use std::io::Write;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use eim::deltas::IntervalData;
use eim::elf::Elf;
use eim::files::elf_file::{ElfFileRef, DEFAULT_MAX_SIZE};
use eim::tsd::{extract_dtv, extract_tsd, is_potential_libc_dso, is_potential_tsd_dso};
use eim::FileId;
use serde::Serialize;

use crate::each::{self, Failure, Outcome};

/// Options of `eim inspect`.
#[derive(Clone, Debug, clap::Args)]
pub struct InspectArgs {
    /// One JSON object per file and line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Analyse every file as a C library, whatever its name (the name
    /// check otherwise applies to the path as given, as upstream's does).
    #[arg(long)]
    pub force_libc: bool,
    /// Refuse files larger than this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SIZE)]
    pub max_size: u64,
    /// ELF files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// The TSD result, as the oracle's `.tsd` files state it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum TsdReport {
    Found {
        offset: i16,
        multiplier: u8,
        indirect: u8,
    },
    /// The name check rejected the file; nothing was analysed.
    NotATsdDso,
    Error {
        message: String,
    },
}

impl TsdReport {
    /// The oracle's line.
    pub fn line(&self) -> String {
        match self {
            TsdReport::Found {
                offset,
                multiplier,
                indirect,
            } => format!("tsd offset={offset} multiplier={multiplier} indirect={indirect}"),
            TsdReport::NotATsdDso => "# not-a-tsd-dso".to_string(),
            TsdReport::Error { message } => format!("# error: {message}"),
        }
    }
}

/// The DTV result (HEAD's analysis of `__tls_get_addr`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum DtvReport {
    Found {
        offset: i16,
        multiplier: u8,
    },
    /// The file defines no `__tls_get_addr` (not an error upstream).
    NoSymbol,
    /// HEAD's name check rejected the file.
    NotALibcDso,
    Error {
        message: String,
    },
}

impl DtvReport {
    pub fn line(&self) -> String {
        match self {
            DtvReport::Found { offset, multiplier } => {
                format!("dtv offset={offset} multiplier={multiplier}")
            }
            DtvReport::NoSymbol => "# dtv: no __tls_get_addr".to_string(),
            DtvReport::NotALibcDso => "# dtv: not-a-libc-dso".to_string(),
            DtvReport::Error { message } => format!("# dtv error: {message}"),
        }
    }
}

/// An address range of a loader's `interpreter_offsets` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OffsetRange {
    pub lower: u64,
    pub upper: u64,
}

/// One thing a loader found, for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fact {
    pub name: &'static str,
    pub value: String,
}

/// An interpreter loader that recognised the file (or that claims it by
/// name and refused it: then `error` says why and there are no facts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoaderMatch {
    pub loader: String,
    /// The name the loader recognised: empty for the path as given; when
    /// no loader claims that name, the path with its symbolic links
    /// resolved; when no loader claims either, the name the file's own
    /// symbols give it (`evidence` then says which).
    pub name: String,
    /// What in the file named it, when its names did not.
    pub evidence: Option<String>,
    /// The interpreter's version, if the loader read one.
    pub version: Option<String>,
    /// What it found (addresses in hex, tables by their size).
    pub facts: Vec<Fact>,
    pub error: Option<String>,
    /// The BPF program the ranges dispatch to, if it writes any, by name.
    pub program: Option<String>,
    pub interpreter_offsets: Vec<OffsetRange>,
    /// The ranges as every report writes them (`0x10..=0x1f (python)`).
    pub ranges: Vec<String>,
}

impl LoaderMatch {
    /// One line: `python 3.11.2 (tss key 0x..., ...) interpreter_offsets
    /// python 0x..=0x.. 0x..=0x..`.
    pub fn line(&self) -> String {
        let mut line = self.loader.clone();
        if let Some(v) = &self.version {
            line.push_str(&format!(" {v}"));
        }
        let facts: Vec<String> = self
            .facts
            .iter()
            .filter(|f| f.name != "version")
            .map(|f| format!("{} {}", f.name, f.value))
            .collect();
        if !facts.is_empty() {
            line.push_str(&format!(" ({})", facts.join(", ")));
        }
        if let Some(e) = &self.error {
            line.push_str(&format!(": error: {e}"));
        }
        if !self.ranges.is_empty() {
            line.push_str(&format!(" interpreter_offsets {}", self.ranges.join(" ")));
        }
        match (&self.evidence, self.name.is_empty()) {
            (_, true) => line,
            (None, false) => format!("{line} [as {}]", self.name),
            (Some(why), false) => format!("{line} [as {}: it {why}]", self.name),
        }
    }
}

/// Every enabled loader's answer for the file at `path` (all tracers;
/// the gaps come from `deltas`, empty when extraction failed). Loaders
/// that go by name see the path as given first; when none claims it, the
/// path with its symbolic links resolved (`/usr/bin/python3` is
/// `python3.11`), which `name` then records; when none claims either, the
/// name the file's symbols give it (`identity::by_evidence`).
pub fn loaders(
    file_id: FileId,
    path: &Path,
    elf: &Elf<'_>,
    deltas: &IntervalData,
) -> Vec<LoaderMatch> {
    let detect = |name: &str| {
        eim::files::loaders::detect(file_id, name, elf, deltas, eim::files::loaders::ALL_TRACERS)
    };
    let given = path.to_string_lossy();
    let mut matches = detect(&given);
    let mut as_name = String::new();
    if matches.is_empty() {
        if let Some(resolved) = resolved_name(path) {
            matches = detect(&resolved);
            as_name = resolved;
        }
    }
    let mut evidence = None;
    if matches.is_empty() {
        // Neither name is an interpreter's: what the file defines may say
        // it is one (a renamed copy).
        if let Some(identity) = eim_analysis::interp::identity::by_evidence(elf) {
            matches = detect(&identity.name);
            as_name = identity.name;
            evidence = Some(identity.evidence);
        }
    }
    matches
        .into_iter()
        .map(|m| {
            let (version, facts, error, offsets) = match &m.outcome {
                Ok(loaded) => (
                    Some(loaded.data.version()).filter(|v| !v.is_empty()),
                    loaded
                        .data
                        .facts()
                        .into_iter()
                        .map(|(name, value)| Fact { name, value })
                        .collect(),
                    None,
                    loaded.offsets.clone(),
                ),
                Err(e) => (None, Vec::new(), Some(e.to_string()), None),
            };
            LoaderMatch {
                loader: m.loader.to_string(),
                name: as_name.clone(),
                evidence: evidence.clone(),
                version,
                facts,
                error,
                program: offsets
                    .as_ref()
                    .map(|o| eim_machine::abi::program::name(o.program)),
                interpreter_offsets: offsets
                    .iter()
                    .flat_map(|o| std::iter::once(o.first.clone()).chain(o.second.clone()))
                    .map(|r| OffsetRange {
                        lower: r.start,
                        upper: r.end,
                    })
                    .collect(),
                ranges: offsets.iter().flat_map(|o| o.described()).collect(),
            }
        })
        .collect()
}

/// Everything `eim inspect` says about one file.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub file: String,
    pub fileid: String,
    pub fileid64: String,
    /// The number of stack deltas, unless extraction failed.
    pub deltas: Option<usize>,
    pub deltas_error: Option<String>,
    pub tsd: TsdReport,
    pub dtv: DtvReport,
    pub loaders: Vec<LoaderMatch>,
}

impl Report {
    pub fn text(&self) -> String {
        let deltas = match (&self.deltas, &self.deltas_error) {
            (Some(n), _) => n.to_string(),
            (None, Some(e)) => format!("# error: {e}"),
            (None, None) => "# error".to_string(),
        };
        let mut out = format!(
            "# file: {}\nfileid: {} {}\ndeltas: {deltas}\n{}\n{}\nloaders:\n",
            self.file,
            self.fileid,
            self.fileid64,
            self.tsd.line(),
            self.dtv.line()
        );
        for m in &self.loaders {
            out.push_str(&format!("  {}\n", m.line()));
        }
        out
    }
}

/// `path` with its symbolic links resolved, if that differs from `path`
/// (the operator's path: following its links is what they asked for).
fn resolved_name(path: &Path) -> Option<String> {
    let resolved = std::fs::canonicalize(path).ok()?;
    (resolved != path).then(|| resolved.to_string_lossy().into_owned())
}

/// Inspects the file at `path`.
pub fn inspect(path: &Path, force_libc: bool, max_size: u64) -> Result<Report, Failure> {
    let file = ElfFileRef::new(path).with_max_size(max_size);
    let open = file.get().map_err(|e| Failure::message(e.message))?;
    let id = open.file_id().map_err(Failure::message)?;
    let elf = open.elf();
    let mut debuglink = |link: &eim_analysis::elf::DebugLink| {
        let found = file.find_debug_file_for(&open, link).ok().flatten();
        found.map(|d| eim::files::elf_provider::SharedDebugFile(std::sync::Arc::new(d)))
    };
    let (data, deltas_error) = match eim::files::elf_provider::extract(elf, &mut debuglink) {
        Ok(data) => (Some(data), None),
        Err(e) => (None, Some(e)),
    };
    let deltas = data.as_ref().map(IntervalData::len);
    let name = path.as_os_str().as_bytes();
    let tsd = if force_libc || is_potential_tsd_dso(name) {
        match extract_tsd(elf) {
            Ok(t) => TsdReport::Found {
                offset: t.offset,
                multiplier: t.multiplier,
                indirect: t.indirect,
            },
            Err(e) => TsdReport::Error {
                message: e.to_string(),
            },
        }
    } else {
        TsdReport::NotATsdDso
    };
    let dtv = if force_libc || is_potential_libc_dso(name) {
        match extract_dtv(elf) {
            Ok(Some(d)) => DtvReport::Found {
                offset: d.offset,
                multiplier: d.multiplier,
            },
            Ok(None) => DtvReport::NoSymbol,
            Err(e) => DtvReport::Error {
                message: e.to_string(),
            },
        }
    } else {
        DtvReport::NotALibcDso
    };
    let loaders = loaders(id.host(), path, elf, &data.unwrap_or_default());
    // Conclusions drawn from a file that changed under the reads are void.
    open.check_unchanged().map_err(Failure::message)?;
    Ok(Report {
        file: path.display().to_string(),
        fileid: id.to_string(),
        fileid64: id.host().to_string(),
        deltas,
        deltas_error,
        tsd,
        dtv,
        loaders,
    })
}

/// Prints every file's report; a file whose stack deltas could not be
/// extracted fails the run as it fails `eim deltas` (its report is still
/// printed, with the error in it). A C-library analysis that finds no
/// layout does not: the oracle records such results as `# error` lines.
pub fn run(args: &InspectArgs, out: &mut impl Write) -> std::io::Result<Outcome> {
    each::run(&args.files, out, |path| {
        let report = inspect(path, args.force_libc, args.max_size)?;
        let text = if args.json {
            serde_json::to_string(&report)
                .map(|json| json + "\n")
                .map_err(|e| Failure::message(format!("cannot encode the report: {e}")))?
        } else {
            report.text()
        };
        match &report.deltas_error {
            Some(e) => Err(Failure {
                stdout: Some(text),
                message: format!("failed to extract stack deltas: {e}"),
            }),
            None => Ok(text),
        }
    })
}
