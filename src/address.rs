//! `eim lookup`: what the unwinder would use at an address, answered by the
//! backend's reader (the simulated reader, or the kernel's own lookup
//! program under `--backend kernel`) after the files were loaded the way a
//! scan loads them.
//!
//! An address in a process is turned into the ELF virtual address the maps
//! are keyed by with its mapping's load bias, by the host's one rule
//! ([`bias`], over the file's `PT_LOAD` segments as the host reads them):
//! the bias the unwinder's process-mapping table holds for the mapping.
//! An address given with a file is an ELF virtual address already.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use eim_analysis::elf::fileid::FileId128;
use eim_machine::FileId;

use eim_bpf::PinnedReader;

use crate::files::counting::HostFile;
use crate::files::regular::open_regular;
use crate::files::segments::{bias, load_segments, Segment};
use crate::host::fileids;
use crate::host::open::{self, OpenStrategy};
use crate::host::procs::{self, ExecMapping, ListError, ProcessError};
use crate::host::scan::{Host, Quiet};
use crate::map_view::{pinned_lookup, Inspect, LookupAnswer};
use crate::ElfFileRef;

/// The answer for one address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AddressAnswer {
    /// The address as given.
    pub address: u64,
    pub path: Option<PathBuf>,
    /// The 128-bit file id.
    pub file_id: Option<String>,
    /// The 64-bit id the maps are keyed by.
    pub host_file_id: Option<String>,
    /// The ELF virtual address looked up.
    pub elf_address: Option<u64>,
    pub answer: Option<LookupAnswer>,
    /// Why there is no answer, if there is none.
    pub note: Option<String>,
}

impl AddressAnswer {
    fn unanswered(address: u64, note: impl Into<String>) -> Self {
        Self {
            address,
            path: None,
            file_id: None,
            host_file_id: None,
            elf_address: None,
            answer: None,
            note: Some(note.into()),
        }
    }
}

/// Why a lookup could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    List(#[from] ListError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("process {pid} does not exist")]
    NoProcess { pid: i32 },
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error(transparent)]
    Inspect(#[from] crate::map_view::InspectError),
}

/// The ELF virtual address of `address` in `mapping` of a file whose
/// `PT_LOAD` segments are `segments`: `address` less the mapping's bias
/// ([`bias`]); `None` when no segment holds the mapping's file offset.
pub fn elf_address(segments: &[Segment], mapping: &ExecMapping, address: u64) -> Option<u64> {
    let bias = bias(segments, mapping.start, mapping.offset)?;
    Some(address.wrapping_sub(bias))
}

/// Why a mapping has no bias.
fn no_bias(mapping: &ExecMapping) -> String {
    format!(
        "the mapping's file offset {:#x} is in no PT_LOAD segment",
        mapping.offset
    )
}

fn host_id(id: FileId) -> String {
    format!("{:016x}", id.0)
}

/// Answers each of `addresses` of process `pid`. `host` must have been
/// made with `only` holding `pid` (or none); its files are loaded first.
pub fn lookup_pid<B: Inspect>(
    host: &mut Host<B>,
    pid: i32,
    addresses: &[u64],
) -> Result<Vec<AddressAnswer>, LookupError> {
    // The scan step counts a process it may not read and goes on; a lookup
    // must say why it has no answer.
    match procs::exec_mappings(pid) {
        Err(ProcessError::Vanished { .. }) => return Err(LookupError::NoProcess { pid }),
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    host.step(&AtomicBool::new(false), &mut Quiet)?;
    if host.processes().get(pid).is_none() {
        return Err(LookupError::NoProcess { pid });
    }
    let mut out = Vec::with_capacity(addresses.len());
    for &address in addresses {
        let Some((mapping, id)) = host.mapping_at(pid, address)? else {
            out.push(AddressAnswer::unanswered(
                address,
                "not in an executable file mapping of the process",
            ));
            continue;
        };
        out.push(answer_in_mapping(host, &mapping, id, address));
    }
    Ok(out)
}

fn answer_in_mapping<B: Inspect>(
    host: &Host<B>,
    mapping: &ExecMapping,
    id: Option<FileId>,
    address: u64,
) -> AddressAnswer {
    let mut a = AddressAnswer::unanswered(address, "");
    a.path = Some(mapping.path.clone());
    let Some(id) = id else {
        a.note = Some("the mapped file could not be opened (see the scan's problems)".into());
        return a;
    };
    a.host_file_id = Some(host_id(id));
    // The file as the scan read it: its segments gave the mapping the bias
    // the unwinder's table holds.
    let Some(record) = host.files().get(&id) else {
        a.note = Some("the scan holds no record of the mapped file".into());
        return a;
    };
    a.file_id = Some(record.id.to_string());
    let Some(elf_address) = elf_address(&record.segments, mapping, address) else {
        a.note = Some(no_bias(mapping));
        return a;
    };
    a.elf_address = Some(elf_address);
    match host.with_backend(|b| b.lookup(id, elf_address)) {
        Ok(answer) => {
            a.answer = Some(answer);
            a.note = None;
        }
        Err(e) => a.note = Some(e.to_string()),
    }
    a
}

/// The file at `path`, opened as every command opens one, and its id.
fn open_file(path: &Path) -> Result<(std::fs::File, FileId128), LookupError> {
    let file_error = |message: String| LookupError::File {
        path: path.to_path_buf(),
        message,
    };
    let (file, meta) = open_regular(path).map_err(|e| file_error(e.to_string()))?;
    let id128 = fileids::compute(&file, meta.len()).map_err(|e| file_error(e.to_string()))?;
    Ok((file, id128))
}

/// One answer per address of the file `path` whose id is `id128`, each
/// an ELF address; `answer` fills in what the maps say.
fn file_answers(
    path: &Path,
    id128: FileId128,
    addresses: &[u64],
    mut answer: impl FnMut(&mut AddressAnswer, u64) -> Result<(), LookupError>,
) -> Result<Vec<AddressAnswer>, LookupError> {
    let mut out = Vec::with_capacity(addresses.len());
    for &address in addresses {
        let mut a = AddressAnswer::unanswered(address, "");
        a.path = Some(path.to_path_buf());
        a.file_id = Some(id128.to_string());
        a.host_file_id = Some(host_id(id128.host()));
        a.elf_address = Some(address);
        answer(&mut a, address)?;
        out.push(a);
    }
    Ok(out)
}

/// Loads `path` (as a scan would load it, with a reference held) and
/// answers each of `addresses` (ELF virtual addresses of the file).
pub fn lookup_file<B: Inspect>(
    host: &Host<B>,
    path: &Path,
    addresses: &[u64],
) -> Result<Vec<AddressAnswer>, LookupError> {
    let (file, id128) = open_file(path)?;
    let id = id128.host();
    let host_file = HostFile::new(id128, ElfFileRef::new(path).with_file(file));
    host.manager()
        .add_or_inc_ref(id, &host_file)
        .map_err(|e| LookupError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    file_answers(path, id128, addresses, |a, address| {
        a.answer = Some(host.with_backend(|b| b.lookup(id, address))?);
        a.note = None;
        Ok(())
    })
}

/// Answers each of `addresses` of process `pid` from live pinned maps:
/// nothing is loaded; each address's file is opened (as a scan opens it,
/// by `strategy`) for its file id and ELF address only.
pub fn lookup_pid_pinned(
    reader: &PinnedReader,
    pid: i32,
    addresses: &[u64],
    strategy: OpenStrategy,
) -> Result<Vec<AddressAnswer>, LookupError> {
    let mappings = match procs::exec_mappings(pid) {
        Err(ProcessError::Vanished { .. }) => return Err(LookupError::NoProcess { pid }),
        other => other?,
    };
    let mut out = Vec::with_capacity(addresses.len());
    for &address in addresses {
        let Some(mapping) = mappings.loadable().find(|m| m.contains(address)) else {
            out.push(AddressAnswer::unanswered(
                address,
                "not in an executable file mapping of the process",
            ));
            continue;
        };
        let mut a = AddressAnswer::unanswered(address, "");
        a.path = Some(mapping.path.clone());
        let opened = match open::open_mapping(pid, mapping, strategy) {
            Ok(opened) => opened,
            Err(e) => {
                a.note = Some(e.to_string());
                out.push(a);
                continue;
            }
        };
        let id128 = match fileids::compute(&opened.file, opened.identity.size) {
            Ok(id) => id,
            Err(e) => {
                a.note = Some(format!("reading its file id: {e}"));
                out.push(a);
                continue;
            }
        };
        a.file_id = Some(id128.to_string());
        a.host_file_id = Some(host_id(id128.host()));
        let segments = match load_segments(&opened.file) {
            Ok(segments) => segments,
            Err(e) => {
                a.note = Some(format!("reading its program headers: {e}"));
                out.push(a);
                continue;
            }
        };
        let Some(elf_address) = elf_address(&segments, mapping, address) else {
            a.note = Some(no_bias(mapping));
            out.push(a);
            continue;
        };
        a.elf_address = Some(elf_address);
        answer_pinned(&mut a, reader, id128.host(), elf_address);
        out.push(a);
    }
    Ok(out)
}

/// Answers each of `addresses` (ELF virtual addresses) of the file at
/// `path` from live pinned maps; nothing is loaded.
pub fn lookup_file_pinned(
    reader: &PinnedReader,
    path: &Path,
    addresses: &[u64],
) -> Result<Vec<AddressAnswer>, LookupError> {
    let (_, id128) = open_file(path)?;
    file_answers(path, id128, addresses, |a, address| {
        answer_pinned(a, reader, id128.host(), address);
        Ok(())
    })
}

/// Runs the pinned lookup into `a`; a file the maps hold no page of (not
/// loaded, or not at this address) says so.
fn answer_pinned(a: &mut AddressAnswer, reader: &PinnedReader, id: FileId, elf_address: u64) {
    match pinned_lookup(reader, id, elf_address) {
        Ok(answer) => {
            a.note = answer
                .page
                .is_none()
                .then(|| "the pinned maps hold no page entry of this file here".to_string());
            a.answer = Some(answer);
        }
        Err(e) => a.note = Some(e.to_string()),
    }
}

/// An answer as one line of text.
pub fn render_line(a: &AddressAnswer) -> String {
    use crate::map_view::Outcome;
    let mut line = format!("{:#x}", a.address);
    if let Some(p) = &a.path {
        line.push_str(&format!(" {}", p.display()));
    }
    if let Some(id) = &a.file_id {
        line.push_str(&format!(" file {id}"));
    }
    if let Some(v) = a.elf_address {
        line.push_str(&format!(" elf {v:#x}"));
    }
    if let Some(ans) = &a.answer {
        match ans.page {
            Some(p) => line.push_str(&format!(
                " page {:#x} (class {}, deltas {}..+{})",
                p.page, p.map_id, p.first_delta, p.num_deltas
            )),
            None => line.push_str(" no page"),
        }
        if let Some(i) = ans.delta_index {
            line.push_str(&format!(" delta {i}"));
        }
        match ans.outcome {
            Outcome::Stop => line.push_str(": STOP"),
            Outcome::Command { command } => line.push_str(&format!(
                ": {}",
                eim_machine::abi::command::name(i32::from(command))
            )),
            Outcome::Rule {
                slot,
                opcode,
                param,
                fp_opcode,
                fp_param,
            } => line.push_str(&format!(
                ": unwind info {slot} (cfa {} {param}, fp {} {fp_param})",
                eim_machine::abi::opcode::name(opcode),
                eim_machine::abi::opcode::name(fp_opcode)
            )),
            Outcome::Error { code } => line.push_str(&format!(": {code}")),
        }
    }
    if let Some(n) = &a.note {
        line.push_str(&format!(" ({n})"));
    }
    line
}
