//! Every loaded file, for the summary: "is /usr/bin/sleep's table loaded,
//! under which file id, how big?" answered without reading the maps. The
//! ids are in `eim fileid`'s two forms, the extracted deltas are what
//! `eim deltas` counts, and the table's shape (size class, kernel deltas,
//! page entries, unwind slots) is what `eim tables` prints for the file
//! alone; the references are the processes holding the file now.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;

use serde::Serialize;

use eim_analysis::tsd::LibcInfo;
use eim_core::manager::StateView;
use eim_core::ExecutableInfo;
use eim_machine::FileId;

use crate::files::counting::ExtractionStats;
use crate::findings::FileRecord;
use crate::report::table::{grouped, Align, Table};

/// One loaded file.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LoadedFile {
    /// The 128-bit file id, as `eim fileid` prints it first.
    pub file_id: String,
    /// The 64-bit host file id (the maps' key), as `eim fileid` prints it
    /// second.
    pub host_file_id: String,
    /// Every path it was seen under, as the processes see it.
    pub paths: Vec<PathBuf>,
    /// Paths seen beyond those listed.
    pub more_paths: usize,
    /// Its size in bytes.
    pub size: u64,
    /// Stack deltas extracted (what `eim deltas` counts).
    pub deltas: Option<usize>,
    /// Its table in the kernel (`null` for a file without deltas).
    pub table: Option<TableFacts>,
    /// References the manager holds (one per process, or 0 while a file
    /// waits out a delayed unload).
    pub references: u64,
    /// The processes holding it, by pid.
    pub processes: Vec<i32>,
    /// Its C-library layouts (`null` unless it is a C library).
    pub c_library: Option<CLibrary>,
    /// Every interpreter loader that recognised it.
    pub interpreters: Vec<Interpreter>,
}

/// A loaded file's kernel table.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct TableFacts {
    /// The size class (upstream's map id): an array of `2^size_class`
    /// deltas.
    pub size_class: u16,
    /// Entries of the table (after merging).
    pub kernel_deltas: u32,
    /// `stack_delta_page_to_info` entries.
    pub page_entries: u32,
    /// Pages from the first delta to the last (dead pages included).
    pub pages_spanned: u32,
    /// Distinct `unwind_info_array` slots its deltas use.
    pub unwind_slots: usize,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct CLibrary {
    pub tsd: Option<Tsd>,
    pub dtv: Option<Dtv>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Tsd {
    pub offset: i16,
    pub multiplier: u8,
    pub indirect: u8,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Dtv {
    pub offset: i16,
    pub multiplier: u8,
}

/// A loader's answer for the file.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Interpreter {
    pub loader: String,
    /// The interpreter's version (`null` if the loader refused the file).
    pub version: Option<String>,
    /// The `interpreter_offsets` ranges (half-open, hexadecimal) and the
    /// program they dispatch to.
    pub ranges: Vec<String>,
    /// Why the loader refused the file, if it did.
    pub error: Option<String>,
}

/// Every file the manager holds, in path order.
pub fn list(
    state: &StateView,
    records: &std::collections::BTreeMap<FileId, FileRecord>,
    stats: &ExtractionStats,
    holders: &HashMap<FileId, Vec<i32>>,
) -> Vec<LoadedFile> {
    let mut out: Vec<LoadedFile> = state
        .files
        .iter()
        .map(|(id, entry)| {
            let record = records.get(id);
            let table = state.book.loaded().get(id).map(|t| TableFacts {
                size_class: t.map_ref.map_id,
                kernel_deltas: t.map_ref.deltas,
                page_entries: t.map_ref.page_entries,
                pages_spanned: t.map_ref.num_pages,
                unwind_slots: t.slots.len(),
            });
            let mut processes = holders.get(id).cloned().unwrap_or_default();
            processes.sort_unstable();
            LoadedFile {
                file_id: record.map_or_else(String::new, |r| r.id.to_string()),
                host_file_id: id.to_string(),
                paths: record.map(|r| r.paths.clone()).unwrap_or_default(),
                more_paths: record.map_or(0, |r| r.more_paths),
                size: record.map_or(0, |r| r.size),
                deltas: stats.of(*id).deltas,
                table,
                references: entry.rc,
                processes,
                c_library: c_library(&entry.info.libc),
                interpreters: interpreters(&entry.info),
            }
        })
        .collect();
    out.sort_by(|a, b| (a.paths.first(), &a.file_id).cmp(&(b.paths.first(), &b.file_id)));
    out
}

fn c_library(libc: &LibcInfo) -> Option<CLibrary> {
    if libc.is_empty() {
        return None;
    }
    Some(CLibrary {
        tsd: libc.tsd.map(|t| Tsd {
            offset: t.offset,
            multiplier: t.multiplier,
            indirect: t.indirect,
        }),
        dtv: libc.dtv.map(|d| Dtv {
            offset: d.offset,
            multiplier: d.multiplier,
        }),
    })
}

fn interpreters(info: &ExecutableInfo) -> Vec<Interpreter> {
    info.interpreters
        .iter()
        .map(|m| match &m.outcome {
            Ok(loaded) => Interpreter {
                loader: m.loader.to_string(),
                version: Some(loaded.data.version()),
                ranges: loaded.offsets.iter().flat_map(|o| o.described()).collect(),
                error: None,
            },
            Err(e) => Interpreter {
                loader: m.loader.to_string(),
                version: None,
                ranges: Vec::new(),
                error: Some(e.to_string()),
            },
        })
        .collect()
}

/// The files as a text table (`--files`): one row each.
pub fn render(files: &[LoadedFile]) -> String {
    let mut t = Table::new(&[
        ("loaded file", Align::Left),
        ("host file id", Align::Left),
        ("class", Align::Right),
        ("deltas", Align::Right),
        ("kernel deltas", Align::Right),
        ("pages", Align::Right),
        ("slots", Align::Right),
        ("refs", Align::Right),
        ("also", Align::Left),
    ]);
    for f in files {
        let path = f
            .paths
            .first()
            .map_or_else(String::new, |p| p.display().to_string());
        let table =
            |get: fn(&TableFacts) -> u64| f.table.as_ref().map_or("-".into(), |t| grouped(get(t)));
        let mut also = Vec::new();
        let other_paths = f.paths.len().saturating_sub(1) + f.more_paths;
        if other_paths > 0 {
            also.push(format!("{other_paths} other paths"));
        }
        if f.c_library.is_some() {
            also.push("C library".into());
        }
        for i in &f.interpreters {
            match &i.version {
                Some(v) => also.push(format!("{} {v}", i.loader)),
                None => also.push(format!("{} (refused)", i.loader)),
            }
        }
        t.row([
            path,
            f.host_file_id.clone(),
            table(|t| u64::from(t.size_class)),
            f.deltas.map_or("-".into(), |d| grouped(d as u64)),
            table(|t| u64::from(t.kernel_deltas)),
            table(|t| u64::from(t.page_entries)),
            table(|t| t.unwind_slots as u64),
            grouped(f.references),
            also.join(", "),
        ]);
    }
    let mut out = t.render();
    let _ = writeln!(
        out,
        "(class: the table's size class; deltas: extracted; kernel deltas: the table's entries after merging; pages: page entries; slots: unwind_info_array slots its deltas use; refs: processes holding it)"
    );
    out
}
