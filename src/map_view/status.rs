//! `eim status`: what live pinned maps hold, per file and in all, and
//! whether they are consistent, read from the maps alone
//! ([`eim_machine::machine::audit`]) without ever owning them
//! ([`eim_bpf::PinnedReader`]).
//!
//! Maps read while their owner writes could be caught between two ops of a
//! plan: a table published a moment before its pages, or left a moment
//! after them, is an orphan only for that moment. A read is therefore
//! taken within one generation of the owner's writes
//! ([`eim_bpf::generation`]): such a read is a snapshot, and what it finds
//! is reported as it is. Only a read that is not (pins of an eim from
//! before the generation counter, or an owner that kept writing through
//! every attempt) falls back to reading again when it finds violations
//! (up to [`READS_WHILE_OWNED`] reads, [`REREAD_AFTER`] apart), reporting
//! only what every read found.

use std::time::Duration;

use serde::Serialize;

use eim_machine::abi::{self, OffsetRange};
use eim_machine::machine::audit::{self, MapViolation, MapsAudit};
use eim_machine::machine::Observed;

use crate::report::summary::{DELTA_ELEMENT_BYTES, PAGE_ENTRY_BYTES, UNWIND_INFO_BYTES};

/// How many reads a status makes of maps whose owner runs, at most.
pub const READS_WHILE_OWNED: usize = 3;
/// The pause between them (far longer than one op).
pub const REREAD_AFTER: Duration = Duration::from_millis(200);

/// One file id's entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileStatus {
    /// The 64-bit id the maps are keyed by.
    pub host_file_id: String,
    /// The size class of its table (none: interpreter offsets only; more
    /// than one is a shape eim never writes).
    pub classes: Vec<u16>,
    pub pages: usize,
    /// The deltas its pages reach.
    pub deltas: u64,
    /// Distinct `unwind_info_array` slots its deltas name.
    pub unwind_slots: usize,
    pub interpreter_offsets: Option<Offsets>,
    /// Its table arrays and page entries, in kernel bytes.
    pub bytes: u64,
}

/// An `interpreter_offsets` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Offsets {
    pub program: u16,
    pub ranges: [(u64, u64); 2],
}

impl From<OffsetRange> for Offsets {
    fn from(r: OffsetRange) -> Self {
        Self {
            program: r.program_index,
            ranges: [
                (r.lower_offset1, r.upper_offset1),
                (r.lower_offset2, r.upper_offset2),
            ],
        }
    }
}

/// Kernel memory the entries take (map overhead not counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Inner arrays: `2^class` slots of 8 bytes (4-byte deltas, which the
    /// kernel stores in 8-byte array slots).
    pub delta_tables: u64,
    pub page_entries: u64,
    pub unwind_infos: u64,
    pub total: u64,
}

/// One violation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub kind: &'static str,
    pub host_file_id: Option<String>,
    pub message: String,
}

impl From<&MapViolation> for Violation {
    fn from(v: &MapViolation) -> Self {
        Self {
            kind: v.kind(),
            host_file_id: v.file_id().map(|id| id.to_string()),
            message: v.to_string(),
        }
    }
}

/// How the maps were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Snapshot {
    /// Within one even generation of the owner's writes: no write between
    /// its first and last map read.
    Consistent,
    /// Every attempt overlapped the owner's writes (or the last owner
    /// stopped mid-write): the last read, which may span a change.
    Torn,
    /// The pins have no generation counter (an eim from before it owns or
    /// owned them): read as they were, which may span a change.
    Unsynchronized,
}

/// One read of the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsRead {
    pub observed: Observed,
    pub snapshot: Snapshot,
    /// Attempts it took (retries after a change included).
    pub attempts: u32,
}

/// What `eim status` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Status {
    pub pin_dir: std::path::PathBuf,
    /// Whether an owner holds the pin directory now.
    pub owned: bool,
    /// Its pid, when it can be named.
    pub owner_pid: Option<i32>,
    pub files: Vec<FileStatus>,
    pub pages: usize,
    pub delta_tables: usize,
    pub unwind_slots_capacity: u32,
    /// `unwind_info_array` slots holding a rule.
    pub unwind_slots_in_use: usize,
    /// Of those, the ones some page's deltas name (the rest are cooling or
    /// free after an unload: slots are zeroed only by a rollback).
    pub unwind_slots_referenced: usize,
    /// `eim_process_mappings`: the processes with an entry, and the
    /// mappings their entries hold in all.
    pub processes: usize,
    pub process_mappings: usize,
    pub memory: Memory,
    /// How the last read was taken.
    pub snapshot: Snapshot,
    /// The attempts the last read took.
    pub attempts: u32,
    /// How many times the maps were read (more than one only when an owner
    /// runs and a read that was not a snapshot found violations).
    pub reads: usize,
    pub violations: Vec<Violation>,
    /// File-id collisions the running owner has seen (files that present
    /// a loaded file's id with other bytes, not loaded), as it tells its
    /// readers through its lock file: the maps cannot show a file that
    /// was kept out.
    pub collisions: u64,
    /// The first of them, one reason each.
    pub collisions_listed: Vec<String>,
}

impl Status {
    pub fn is_consistent(&self) -> bool {
        self.violations.is_empty()
    }

    /// With what the running owner says of collisions.
    pub fn with_collisions(mut self, total: u64, listed: Vec<String>) -> Self {
        self.collisions = total;
        self.collisions_listed = listed;
        self
    }
}

fn table_bytes(class: u16) -> u64 {
    u64::from(abi::class_entries(class).unwrap_or(0)) * DELTA_ELEMENT_BYTES
}

/// The status of maps read `reads` times: `last` is the last read's audit,
/// `violations` what every read found.
fn status_of(
    pin_dir: std::path::PathBuf,
    owner: Option<Option<i32>>,
    read: &MapsRead,
    last: &MapsAudit,
    violations: &[MapViolation],
    unwind_slots: u32,
    reads: usize,
) -> Status {
    let observed = &read.observed;
    let files: Vec<FileStatus> = last
        .files
        .iter()
        .map(|f| FileStatus {
            host_file_id: f.file_id.to_string(),
            classes: f.classes.clone(),
            pages: f.pages,
            deltas: f.deltas,
            unwind_slots: f.slots.len(),
            interpreter_offsets: f.interpreter_offsets.map(Offsets::from),
            bytes: f.classes.iter().map(|c| table_bytes(*c)).sum::<u64>()
                + f.pages as u64 * PAGE_ENTRY_BYTES,
        })
        .collect();
    let delta_tables = observed
        .delta_tables
        .keys()
        .map(|(class, _)| table_bytes(*class))
        .sum();
    let page_entries = observed.pages.len() as u64 * PAGE_ENTRY_BYTES;
    let unwind_infos = last.slots_holding_rules as u64 * UNWIND_INFO_BYTES;
    Status {
        pin_dir,
        owned: owner.is_some(),
        owner_pid: owner.flatten(),
        files,
        pages: observed.pages.len(),
        delta_tables: observed.delta_tables.len(),
        unwind_slots_capacity: unwind_slots,
        unwind_slots_in_use: last.slots_holding_rules,
        unwind_slots_referenced: last.slots_referenced,
        processes: observed.process_mappings.len(),
        process_mappings: observed
            .process_mappings
            .values()
            .map(|p| p.mappings.len())
            .sum(),
        memory: Memory {
            delta_tables,
            page_entries,
            unwind_infos,
            total: delta_tables + page_entries + unwind_infos,
        },
        snapshot: read.snapshot,
        attempts: read.attempts,
        reads,
        violations: violations.iter().map(Violation::from).collect(),
        collisions: 0,
        collisions_listed: Vec::new(),
    }
}

/// Reads the maps through `read` (once; or, while an owner runs and a
/// read that is not a snapshot finds violations, up to
/// [`READS_WHILE_OWNED`] times) and audits them. `owner`: `None` when no
/// owner runs, else its pid if known.
pub fn status<E>(
    pin_dir: std::path::PathBuf,
    owner: Option<Option<i32>>,
    unwind_slots: u32,
    mut read: impl FnMut() -> Result<MapsRead, E>,
    pause: Duration,
) -> Result<Status, E> {
    let mut taken = read()?;
    let mut last = audit::audit(&taken.observed, unwind_slots);
    let mut persistent = last.violations.clone();
    let mut reads = 1;
    while owner.is_some()
        && taken.snapshot != Snapshot::Consistent
        && !persistent.is_empty()
        && reads < READS_WHILE_OWNED
    {
        std::thread::sleep(pause);
        taken = read()?;
        last = audit::audit(&taken.observed, unwind_slots);
        if taken.snapshot == Snapshot::Consistent {
            persistent = last.violations.clone();
        } else {
            persistent.retain(|v| last.violations.contains(v));
        }
        reads += 1;
    }
    Ok(status_of(
        pin_dir,
        owner,
        &taken,
        &last,
        &persistent,
        unwind_slots,
        reads,
    ))
}

/// The status as text: a line on the directory and its owner, a table of
/// files, the totals, and every violation.
pub fn render_text(s: &Status) -> String {
    use crate::report::table::{grouped, Align, Table};
    let mut out = format!("pin directory {}: ", s.pin_dir.display());
    out.push_str(&match (s.owned, s.owner_pid) {
        (true, Some(pid)) => format!("owned by pid {pid} (live maps)\n"),
        (true, None) => "owned by a running process (live maps)\n".to_string(),
        (false, _) => "no owner runs (what the last owner left)\n".to_string(),
    });
    match s.snapshot {
        Snapshot::Consistent if s.attempts > 1 => out.push_str(&format!(
            "a snapshot: read between two of the owner's writes (attempt {})\n",
            s.attempts
        )),
        Snapshot::Consistent => {}
        Snapshot::Torn => out.push_str(
            "NOT a snapshot: the owner wrote during every attempt (or the last owner stopped mid-write); the read may span a change\n",
        ),
        Snapshot::Unsynchronized => out.push_str(
            "NOT a snapshot: these pins have no generation counter (an older eim); the read may span a change\n",
        ),
    }
    out.push('\n');
    let mut t = Table::new(&[
        ("file id", Align::Left),
        ("class", Align::Right),
        ("pages", Align::Right),
        ("deltas", Align::Right),
        ("slots", Align::Right),
        ("interpreter", Align::Left),
        ("bytes", Align::Right),
    ]);
    for f in &s.files {
        let classes: Vec<String> = f.classes.iter().map(u16::to_string).collect();
        let interp = f.interpreter_offsets.map_or(String::new(), |o| {
            o.ranges
                .iter()
                .filter(|r| **r != (0, 0))
                .map(|r| eim_machine::abi::interpreter_range(r.0, r.1, o.program))
                .collect::<Vec<_>>()
                .join(" ")
        });
        t.row([
            f.host_file_id.clone(),
            classes.join(","),
            grouped(f.pages as u64),
            grouped(f.deltas),
            grouped(f.unwind_slots as u64),
            interp,
            grouped(f.bytes),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n{} files, {} delta tables, {} page entries; unwind_info_array: {} of {} slots hold a rule, {} of them named by a table\n",
        grouped(s.files.len() as u64),
        grouped(s.delta_tables as u64),
        grouped(s.pages as u64),
        grouped(s.unwind_slots_in_use as u64),
        grouped(u64::from(s.unwind_slots_capacity)),
        grouped(s.unwind_slots_referenced as u64),
    ));
    out.push_str(&format!(
        "eim_process_mappings: {} processes, {} executable file mappings\n",
        grouped(s.processes as u64),
        grouped(s.process_mappings as u64),
    ));
    out.push_str(&format!(
        "memory: {} bytes (delta tables {} as 8-byte kernel array slots per 4-byte delta, page entries {} at 24 bytes, unwind infos {} at 16 bytes; map overhead not counted)\n",
        grouped(s.memory.total),
        grouped(s.memory.delta_tables),
        grouped(s.memory.page_entries),
        grouped(s.memory.unwind_infos),
    ));
    if s.collisions > 0 {
        out.push_str(&format!(
            "file id collisions (the owner's): {} files presented a loaded file's id with other bytes and were not loaded{}\n",
            grouped(s.collisions),
            if s.collisions_listed.len() as u64 == s.collisions {
                String::new()
            } else {
                format!(", the first {} listed", s.collisions_listed.len())
            }
        ));
        for c in &s.collisions_listed {
            out.push_str(&format!("  {c}\n"));
        }
    }
    if s.violations.is_empty() {
        out.push_str("consistent: every page leads to a published table of its class, every slice is inside its table, every named slot holds a rule, no orphan table, every process's mappings sorted and disjoint\n");
    } else {
        out.push_str(&format!(
            "INCONSISTENT: {} violations{}\n",
            s.violations.len(),
            if s.reads > 1 {
                format!(" (found in each of {} reads)", s.reads)
            } else {
                String::new()
            }
        ));
        for v in &s.violations {
            out.push_str(&format!("  {}: {}\n", v.kind, v.message));
        }
    }
    out
}

#[cfg(test)]
mod tests;
