//! The report of a scan (or of a watch when it stops): what the host maps,
//! what was loaded, what it costs in kernel memory, what failed and why,
//! and where the time went. `--json` prints the same [`Summary`].
//!
//! Kernel memory is computed from what the maps hold, with the kernel's own
//! element sizes:
//!
//! * a delta table of size class `c` is a BPF array of `2^c` elements of 4
//!   bytes, which the kernel rounds up to 8: `tables x 2^c x 8` bytes;
//! * a page entry is a 16-byte key and an 8-byte value: `pages x 24` bytes;
//! * an `unwind_info_array` slot in use is a 12-byte value rounded to 8:
//!   `slots x 16` bytes (the array itself is preallocated whole).
//!
//! The unwind slots in use are upstream's `UnwindInfoArraySize`, taken from
//! the metric itself so that the two cannot disagree: the slots some kernel
//! table references. Slots that keep the rule of a table unloaded since
//! (eim's cooling slots, reusable; upstream never frees a slot) are
//! counted apart, from the maps: `unwind_slots_holding_rules` is every
//! non-zero slot.
//!
//! Per-element overhead of the hash maps and the maps' fixed costs are not
//! counted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use eim_bpf::{PinReport, PinState};

use eim_analysis::tsd::LibcInfo;

use crate::findings::{Counters, EventStats, FileRecord, Problem};
use crate::report;
use crate::report::files::{self as loaded, LoadedFile};
use crate::report::metrics::Metric;
use crate::report::problems::{self, Group, Listing};
use crate::report::table::{grouped, Align, Table};

/// Bytes the kernel uses per element of a delta array (4-byte values are
/// stored in 8-byte slots).
pub const DELTA_ELEMENT_BYTES: u64 = 8;
/// Key and value of a page entry.
pub const PAGE_ENTRY_BYTES: u64 = 24;
/// An `unwind_info_array` element (12 bytes rounded up to 8).
pub const UNWIND_INFO_BYTES: u64 = 16;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    /// "simulated" or "kernel".
    pub backend: &'static str,
    /// The walk was stopped (Ctrl-C) before it saw every process.
    pub interrupted: bool,
    pub processes: Processes,
    pub mappings: Mappings,
    pub files: Files,
    pub extraction: Extraction,
    pub kernel: Kernel,
    /// With pinned kernel maps: what the start found in the pin directory
    /// (`null` otherwise).
    pub pins: Option<Pins>,
    /// Files (or mappings) that failed to load, with the reason
    /// (unsupported files are not here but in `unsupported`).
    pub problems: Vec<Problem>,
    /// Files of a kind eim does not extract (not ELF, 32-bit or big-endian
    /// ELF, another machine), by reason: not loaded, not failures.
    pub unsupported: Vec<Group>,
    /// Every loaded file: ids, paths, table, references, C-library and
    /// interpreter facts.
    pub loaded_files: Vec<LoadedFile>,
    /// The loaded files that are C libraries (their TSD and DTV layouts) or
    /// interpreters (each matching loader, its version and ranges).
    pub found: Vec<Found>,
    /// Upstream's five metrics (counters as totals).
    pub metrics: Vec<Metric>,
    pub counters: Counters,
    pub seconds: Seconds,
    /// With host events (`watch`): what the event path did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<EventStats>,
}

/// The line of a watch's summary that says what its host events did.
fn render_events(s: &EventStats) -> String {
    let events: Vec<String> = s.events.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let ms = |q| {
        s.latencies
            .quantile_ms(q)
            .map_or("-".to_string(), |v| format!("{v:.1} ms"))
    };
    format!(
        "host events: {} ({} batches, {} processes read); lost {}, resyncs {} ({} after a loss), corrections {}; event to tables p50 {}, p99 {}\n",
        if events.is_empty() { "none".to_string() } else { events.join(", ") },
        s.batches,
        s.processes_read,
        s.lost,
        s.resyncs,
        s.resyncs_after_loss,
        s.corrections,
        ms(0.5),
        ms(0.99),
    )
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Found {
    pub path: PathBuf,
    /// `c-library`, or the loader's name.
    pub kind: String,
    /// The interpreter's version, or the TSD and DTV layouts of a C library.
    pub detail: String,
    /// The `interpreter_offsets` ranges (half-open, hexadecimal) and the
    /// program they dispatch to.
    pub ranges: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Processes {
    /// Processes in `/proc` in the last step (kernel threads included).
    pub listed: usize,
    /// Processes with at least one executable file mapping.
    pub with_files: usize,
    /// Processes holding references now.
    pub tracked: usize,
    /// Processes whose mappings eim may not read (the first
    /// `findings::NOT_READABLE_KEPT` seen; `counters.permission_denied`
    /// counts them all).
    pub not_readable: Vec<NamedProcess>,
}

/// A process by pid and name (`/proc/PID/comm`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NamedProcess {
    pub pid: i32,
    pub name: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Mappings {
    /// Executable file mappings in the last step, the vDSO's among them
    /// (it is loaded as a file).
    pub file_mappings: usize,
    /// Executable mappings without a file, the vDSO aside (JIT code): not
    /// loaded.
    pub anonymous: usize,
    /// References held: (process, distinct file) pairs.
    pub references: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Files {
    /// Distinct files (by file id) seen.
    pub distinct: usize,
    /// Files whose tables are in the maps.
    pub loaded: usize,
    /// Loaded files with a C-library TSD or DTV layout.
    pub c_libraries: usize,
    /// Loaded files an interpreter loader recognised.
    pub interpreters: usize,
    pub deferred: usize,
    pub failed: usize,
    /// Mappings whose file could not be opened as the mapped one.
    pub unopenable: usize,
    /// Files eim does not extract (not failures; see `unsupported`).
    pub unsupported: usize,
    /// Files listed as presenting another file's id with other bytes
    /// (`host::claims`): not loaded.
    pub collisions: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Extraction {
    /// Extraction calls (every file extracted counts once per call).
    pub extractions: u64,
    /// Distinct files extracted at least once.
    pub files_extracted: usize,
    /// The most extractions of any one file.
    pub most_of_one_file: u32,
    /// Stack deltas extracted for the files loaded now.
    pub deltas: u64,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Kernel {
    pub page_entries: usize,
    /// `unwind_info_array` slots in use: referenced by a kernel table. The
    /// `UnwindInfoArraySize` metric's value (one source).
    pub unwind_infos: usize,
    /// Slots holding a rule, from the maps: those in use and those keeping
    /// the rule of an unloaded table for reuse.
    pub unwind_slots_holding_rules: usize,
    /// Delta tables (inner maps) by size class, with their memory.
    pub size_classes: Vec<ClassUsage>,
    pub bytes: Bytes,
    /// Time spent applying map ops (syscalls on the real kernel).
    pub seconds: f64,
    /// Map ops applied since the start (each one syscall or one batch):
    /// none for a warm restart over an unchanged host.
    pub ops: u64,
}

/// What a start found in the pin directory it owns.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Pins {
    pub dir: PathBuf,
    /// The lock file that makes this eim the directory's only owner.
    pub lock_file: PathBuf,
    /// Where this start mounted a bpffs for the pins, if it did.
    pub mounted: Option<PathBuf>,
    /// Maps pinned afresh (nothing was pinned under their names).
    pub created: usize,
    /// Maps re-opened from an earlier run.
    pub reopened: usize,
    /// Maps whose pins had another shape, replaced as asked.
    pub replaced: Vec<Replaced>,
    /// What the re-opened maps held and the start removed (`null` unless
    /// the start cleaned them: the maps were not eim's shape of state).
    pub cleaned: Option<Cleaned>,
    /// What the warm restart over the re-opened maps kept, loaded and
    /// removed (`null` when nothing was pinned with entries).
    pub reconciled: Option<crate::findings::Reconciled>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Replaced {
    pub map: String,
    pub why: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Cleaned {
    pub page_entries: usize,
    /// Delta tables by size class.
    pub tables: BTreeMap<u16, usize>,
    pub unwind_infos: usize,
    pub interpreter_offsets: usize,
}

impl Pins {
    pub(crate) fn of(report: &PinReport) -> Self {
        let count = |state: fn(&PinState) -> bool| report.count(state);
        Self {
            dir: report.dir.clone(),
            lock_file: report.lock_file.clone(),
            mounted: report.mounted.clone(),
            created: count(|s| matches!(s, PinState::Created)),
            reopened: count(|s| matches!(s, PinState::Reopened)),
            replaced: report
                .replaced()
                .map(|(map, why)| Replaced {
                    map: map.to_string(),
                    why: why.to_string(),
                })
                .collect(),
            cleaned: report.cleaned.as_ref().map(|c| Cleaned {
                page_entries: c.pages,
                tables: c.tables.clone(),
                unwind_infos: c.unwind_slots,
                interpreter_offsets: c.interpreter_offsets,
            }),
            reconciled: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClassUsage {
    pub class: u16,
    pub entries_per_table: u32,
    pub tables: usize,
    /// `tables x 2^class x 8`.
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Bytes {
    pub delta_tables: u64,
    /// `page_entries x 24`.
    pub page_entries: u64,
    /// `unwind_infos x 16` (the slots in use).
    pub unwind_infos: u64,
    pub total: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Seconds {
    /// The last step, all included.
    pub last_step: f64,
    pub extraction: f64,
    pub kernel: f64,
    /// Where the last step's time went (they add up to `last_step`).
    pub phases: PhaseSeconds,
}

/// [`crate::findings::Phases`] in seconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PhaseSeconds {
    pub walk: f64,
    pub open: f64,
    pub file_ids: f64,
    pub loading: f64,
    pub maps: f64,
    pub extraction: f64,
    pub loaders: f64,
}

impl PhaseSeconds {
    pub(crate) fn of(p: &crate::findings::Phases) -> Self {
        Self {
            walk: secs(p.walk),
            open: secs(p.open),
            file_ids: secs(p.file_ids),
            loading: secs(p.loading),
            maps: secs(p.maps),
            extraction: secs(p.extraction),
            loaders: secs(p.loaders),
        }
    }
}

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Summary {
    /// The summary as text tables, with a few example paths per reason a
    /// file was not loaded.
    pub fn render_text(&self) -> String {
        self.render_text_listing(Listing::Examples)
    }

    /// The summary as text tables; `listing` says whether every path of
    /// the files not loaded is shown (`--files`).
    pub fn render_text_listing(&self, listing: Listing) -> String {
        let mut out = format!(
            "eim scan: {} processes, {} distinct executable files, {} backend{}\n\n",
            grouped(self.processes.listed as u64),
            grouped(self.files.distinct as u64),
            self.backend,
            if self.interrupted {
                " (INTERRUPTED: not every process was read)"
            } else {
                ""
            }
        );
        let n = |v: usize| grouped(v as u64);
        let mut t = Table::new(&[("host", Align::Left), ("count", Align::Right)]);
        t.row(["processes".into(), n(self.processes.listed)]);
        t.row([
            "  with executable files".into(),
            n(self.processes.with_files),
        ]);
        t.row([
            "executable file mappings".into(),
            n(self.mappings.file_mappings),
        ]);
        t.row(["  anonymous (JIT)".into(), n(self.mappings.anonymous)]);
        t.row([
            "references (process, file)".into(),
            n(self.mappings.references),
        ]);
        t.row(["distinct files".into(), n(self.files.distinct)]);
        t.row(["  loaded".into(), n(self.files.loaded)]);
        t.row(["  C libraries (TSD, DTV)".into(), n(self.files.c_libraries)]);
        t.row(["  interpreters".into(), n(self.files.interpreters)]);
        t.row(["  deferred".into(), n(self.files.deferred)]);
        t.row(["  failed".into(), n(self.files.failed)]);
        t.row(["  not openable".into(), n(self.files.unopenable)]);
        t.row(["  unsupported".into(), n(self.files.unsupported)]);
        t.row(["  file id collisions".into(), n(self.files.collisions)]);
        t.row(["processes vanished".into(), grouped(self.counters.vanished)]);
        t.row([
            "processes not readable (privileges)".into(),
            grouped(self.counters.permission_denied),
        ]);
        out.push_str(&t.render());
        if !self.processes.not_readable.is_empty() {
            // A few by name in the text (the JSON has them all, up to
            // NOT_READABLE_KEPT); the count is the table's.
            const SHOWN: usize = 8;
            let all = &self.processes.not_readable;
            let mut named: Vec<String> = all
                .iter()
                .take(SHOWN)
                .map(|p| format!("{} ({})", p.pid, p.name))
                .collect();
            if all.len() >= crate::findings::NOT_READABLE_KEPT {
                named.push("and more".into());
            } else if all.len() > SHOWN {
                named.push(format!("and {} more", all.len() - SHOWN));
            }
            out.push_str(&format!("processes not readable: {}\n", named.join(", ")));
        }
        out.push('\n');

        let e = &self.extraction;
        let mut t = Table::new(&[("extraction", Align::Left), ("value", Align::Right)]);
        t.row(["extractions".into(), grouped(e.extractions)]);
        t.row(["files extracted".into(), n(e.files_extracted)]);
        t.row([
            "most extractions of one file".into(),
            grouped(u64::from(e.most_of_one_file)),
        ]);
        t.row(["stack deltas (files loaded)".into(), grouped(e.deltas)]);
        t.row(["seconds".into(), format!("{:.3}", e.seconds)]);
        out.push_str(&t.render());
        out.push('\n');

        let k = &self.kernel;
        let mut t = Table::new(&[
            (
                "kernel memory (BPF arrays: 8-byte slots, a 4-byte delta takes 8)",
                Align::Left,
            ),
            ("tables", Align::Right),
            ("entries each", Align::Right),
            ("bytes", Align::Right),
        ]);
        for c in &k.size_classes {
            t.row([
                format!("size class {}", c.class),
                n(c.tables),
                grouped(u64::from(c.entries_per_table)),
                grouped(c.bytes),
            ]);
        }
        t.row([
            "page entries".into(),
            String::new(),
            n(k.page_entries),
            grouped(k.bytes.page_entries),
        ]);
        t.row([
            "unwind slots in use (UnwindInfoArraySize)".into(),
            String::new(),
            n(k.unwind_infos),
            grouped(k.bytes.unwind_infos),
        ]);
        t.row([
            "  slots keeping an unloaded table's rule".into(),
            String::new(),
            n(k.unwind_slots_holding_rules.saturating_sub(k.unwind_infos)),
            String::new(),
        ]);
        t.row([
            "total".into(),
            n(k.size_classes.iter().map(|c| c.tables).sum()),
            String::new(),
            grouped(k.bytes.total),
        ]);
        out.push_str(&t.render());
        out.push_str(
            "(tables x 2^class x 8 bytes; page entries x 24 (16-byte key, 8-byte value); unwind slots in use x 16 (12-byte value, 8-byte slots); map overhead not counted)\n\n",
        );

        out.push_str(&report::metrics::table(&self.metrics));
        out.push('\n');

        out.push_str(&format!(
            "time: {:.3} s for the scan; {:.3} s extracting, {:.3} s in the {} maps\n",
            self.seconds.last_step, self.seconds.extraction, self.seconds.kernel, self.backend
        ));
        let p = &self.seconds.phases;
        out.push_str(&format!(
            "last step: walking /proc {:.3} s, opening files {:.3} s, file ids {:.3} s, \
             loading {:.3} s (in the maps {:.3} s); beside it, extraction {:.3} s, loaders {:.3} s\n",
            p.walk, p.open, p.file_ids, p.loading, p.maps, p.extraction, p.loaders
        ));
        if let Some(e) = &self.events {
            out.push_str(&render_events(e));
        }
        if let Some(p) = &self.pins {
            out.push_str(&format!(
                "pins: {} ({} created, {} re-opened, {} replaced{}{}{})\n",
                p.dir.display(),
                p.created,
                p.reopened,
                p.replaced.len(),
                match &p.reconciled {
                    Some(r) => format!(
                        "; reconciled in {:.3} s: {} files adopted, {} loaded, {} removals",
                        r.seconds, r.adopted, r.loaded, r.removals
                    ),
                    None => String::new(),
                },
                match &p.cleaned {
                    Some(c) => format!(
                        "; cleaned {} page entries, {} tables, {} unwind infos",
                        c.page_entries,
                        c.tables.values().sum::<usize>(),
                        c.unwind_infos
                    ),
                    None => String::new(),
                },
                match &p.mounted {
                    Some(at) => format!("; mounted a bpffs on {}", at.display()),
                    None => String::new(),
                }
            ));
        }
        if !self.found.is_empty() {
            out.push_str("\nC libraries and interpreters:\n");
            for f in &self.found {
                out.push_str(&format!(
                    "  {:<12} {} {}{}\n",
                    f.kind,
                    f.path.display(),
                    f.detail,
                    if f.ranges.is_empty() {
                        String::new()
                    } else {
                        format!(" interpreter_offsets {}", f.ranges.join(" "))
                    }
                ));
            }
        }
        if listing == Listing::All && !self.loaded_files.is_empty() {
            out.push('\n');
            out.push_str(&loaded::render(&self.loaded_files));
        }
        if !self.problems.is_empty() {
            out.push_str("\nfiles not loaded, by reason:\n");
            out.push_str(&problems::render(&problems::group(&self.problems), listing));
        }
        if !self.unsupported.is_empty() {
            out.push_str("\nunsupported files (not loaded, not failures), by reason:\n");
            out.push_str(&problems::render(&self.unsupported, listing));
        }
        out
    }
}

/// A C library's layouts, TSD first in the oracle's `.tsd` form; glibc has
/// one per file (TSD in libc, DTV in the dynamic loader), musl both.
fn libc_detail(libc: &LibcInfo) -> String {
    let tsd = libc.tsd.map(|t| {
        format!(
            "tsd offset={} multiplier={} indirect={}",
            t.offset, t.multiplier, t.indirect
        )
    });
    let dtv = libc
        .dtv
        .map(|d| format!("dtv offset={} multiplier={}", d.offset, d.multiplier));
    tsd.into_iter().chain(dtv).collect::<Vec<_>>().join(", ")
}

/// The C libraries and interpreters among `files`, in path order.
pub(crate) fn found<'a>(files: impl Iterator<Item = &'a FileRecord>) -> Vec<Found> {
    let mut out = Vec::new();
    for file in files {
        let Some(info) = &file.info else { continue };
        if !info.libc.is_empty() {
            out.push(Found {
                path: file.path.clone(),
                kind: "c-library".to_string(),
                detail: libc_detail(&info.libc),
                ranges: Vec::new(),
            });
        }
        for m in info.interpreters.iter() {
            let Ok(loaded) = &m.outcome else { continue };
            let ranges = loaded.offsets.iter().flat_map(|o| o.described()).collect();
            out.push(Found {
                path: file.path.clone(),
                kind: m.loader.to_string(),
                detail: format!("version {}", loaded.data.version()),
                ranges,
            });
        }
    }
    out.sort_by(|a, b| (&a.path, &a.kind).cmp(&(&b.path, &b.kind)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_analysis::tsd::{DtvInfo, TsdInfo};

    #[test]
    fn a_c_library_shows_each_layout_it_has() {
        let tsd = Some(TsdInfo {
            offset: 128,
            multiplier: 8,
            indirect: 1,
        });
        let dtv = Some(DtvInfo {
            offset: 8,
            multiplier: 8,
        });
        assert_eq!(
            libc_detail(&LibcInfo { tsd, dtv }),
            "tsd offset=128 multiplier=8 indirect=1, dtv offset=8 multiplier=8"
        );
        assert_eq!(
            libc_detail(&LibcInfo { tsd, dtv: None }),
            "tsd offset=128 multiplier=8 indirect=1"
        );
        assert_eq!(
            libc_detail(&LibcInfo { tsd: None, dtv }),
            "dtv offset=8 multiplier=8"
        );
    }
}
