//! What a host walk finds, as data: its files and the ones it could not
//! load, its counters, where a step's time went, what a warm restart did,
//! what the event path saw. The host ([`crate::host`]) makes them and the
//! reports ([`crate::report`], [`crate::metrics_http`]) render them; they
//! live below both so that neither reaches into the other.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use eim_analysis::elf::fileid::FileId128;
use eim_core::provider::ExtractErrorKind;
use eim_core::{Error, ExecutableInfo};

use crate::files::segments::Segment;

/// Whether a file is waiting out upstream's deferral or failed outright.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// It failed recently and is not tried again before the deferral
    /// timeout (90 s): upstream's `ErrDeferredFileID`.
    Deferred,
    /// It could not be loaded (not ELF, malformed unwind data, too large,
    /// the kernel refused, ...).
    Failed,
    /// It could not be opened as the file the process maps.
    Unopenable,
    /// It is of a kind eim does not extract (not ELF, 32-bit or big-endian
    /// ELF, another machine: [`eim_analysis::elf::header::HeaderError`]
    /// decides): not a failure, but not loaded either.
    Unsupported,
    /// It presents the id of another file with other bytes where that
    /// file's tables were read from (`host::claims`): not loaded, so that
    /// neither can be served the other's tables.
    Collision,
}

impl ProblemKind {
    /// What a load's error makes of the file; `None` for a file that has
    /// gone (not a problem: the process let go of it).
    pub fn of(e: &Error) -> Option<Self> {
        match e {
            Error::Deferred { .. } => Some(Self::Deferred),
            Error::Extraction { cause, .. } => match cause.kind {
                ExtractErrorKind::NotFound => None,
                ExtractErrorKind::Unsupported => Some(Self::Unsupported),
                _ => Some(Self::Failed),
            },
            _ => Some(Self::Failed),
        }
    }
}

/// A file that is not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub path: PathBuf,
    /// The 128-bit file id, when the file could be read.
    pub file_id: Option<String>,
    pub kind: ProblemKind,
    /// The whole error, naming the file.
    pub reason: String,
    /// The reason without what names the file (its id and path), the same
    /// for every file that failed the same way: the summary groups by it.
    pub cause: String,
}

/// `e`'s message without the file id and path it starts with.
pub fn cause_of(e: &Error) -> String {
    match e {
        Error::Extraction { cause, .. } => cause.message.clone(),
        other => {
            let text = other.to_string();
            let prefix = format!("file {}: ", other.file_id());
            text.strip_prefix(&prefix)
                .map_or_else(|| text.clone(), str::to_string)
        }
    }
}

/// The most paths a file's record keeps: one file can be seen under a
/// path per container root, and a report needs only a few.
pub const MAX_PATHS: usize = 32;

/// What the host knows of one distinct file.
#[derive(Clone, Debug)]
pub struct FileRecord {
    pub id: FileId128,
    /// The path of its first mapping seen (as that process sees it).
    pub path: PathBuf,
    /// Every path it was seen under (as each process sees it), first seen
    /// first, at most [`MAX_PATHS`].
    pub paths: Vec<PathBuf>,
    /// Paths seen beyond [`MAX_PATHS`] (not kept).
    pub more_paths: usize,
    pub size: u64,
    /// Its loadable segments, which give each mapping of it its bias.
    pub segments: Vec<Segment>,
    /// What the manager reported when it was last loaded.
    pub info: Option<ExecutableInfo>,
}

impl FileRecord {
    /// Notes that a process maps it under `path`.
    pub(crate) fn saw(&mut self, path: &std::path::Path) {
        if self.paths.iter().any(|p| p == path) {
            return;
        }
        if self.paths.len() < MAX_PATHS {
            self.paths.push(path.to_path_buf());
        } else {
            self.more_paths += 1;
        }
    }
}

/// Counts since the host was made (steps add up).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub steps: u64,
    /// Processes read (with or without executable files; every step).
    pub processes_read: u64,
    /// Processes that exited while being read, or whose files vanished.
    pub vanished: u64,
    /// Processes whose mappings could not be read for lack of privilege.
    pub permission_denied: u64,
    /// Processes or files that could not be read for another reason.
    pub unreadable: u64,
    /// Mappings whose file had gone by the time it was opened.
    pub files_vanished: u64,
    /// References taken and released.
    pub references_taken: u64,
    pub references_released: u64,
    /// Releases the manager refused (a bug if ever non-zero) or whose
    /// kernel entries are still being removed.
    pub release_errors: u64,
    /// Processes seen exit (or replaced by another with the same pid).
    pub exited: u64,
    /// Files unloaded by the delayed-unload cleanup.
    pub unloaded_after_delay: u64,
    /// `eim_process_mappings` entries written (put or deleted), and the
    /// writes the kernel refused (retried at the process's next read).
    pub process_mappings_written: u64,
    pub process_mapping_errors: u64,
    /// Files found presenting the id of another file with other bytes
    /// (each file once per id), and of them, loaded owners a trusted file
    /// replaced after comparing their bytes.
    pub collisions: u64,
    pub owners_replaced: u64,
}

/// Where a step's time went. `walk`, `open`, `file_ids` and `loading` add
/// up to the step's time; extraction and the loaders run on a thread of
/// their own beside `loading` (the next part of a batch is extracted while
/// the last one is written), so they are that thread's time, not a share.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Phases {
    /// Listing `/proc`, reading each process's mappings, and the step's
    /// own bookkeeping.
    pub walk: Duration,
    /// Opening mapped files (`/proc/PID/map_files` or the path).
    pub open: Duration,
    /// Computing file ids (hashing the head and tail of new files).
    pub file_ids: Duration,
    /// Loading batches and releasing references: waiting for extraction,
    /// the manager's planning and encoding, the maps, giving freed memory
    /// back.
    pub loading: Duration,
    /// Of `loading`, applying map ops to the backend (kernel or simulated
    /// maps).
    pub maps: Duration,
    /// Extracting stack deltas (and reading what they need), beside
    /// `loading`.
    pub extraction: Duration,
    /// The interpreter loaders, beside `loading`.
    pub loaders: Duration,
}

/// Processes not readable that the summary names, at most.
pub const NOT_READABLE_KEPT: usize = 32;

/// What a warm restart did, for the summary and the log.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Reconciled {
    /// Processes walked that map executable files.
    pub processes: usize,
    /// Distinct files mapped now.
    pub files: usize,
    /// Files whose pinned entries were kept as they were.
    pub adopted: usize,
    /// Files loaded (nothing right of theirs was pinned).
    pub loaded: usize,
    /// Files that could not be extracted or loaded (in the problems).
    pub failed: usize,
    /// Files refused because they need a rule no slot holds while every
    /// free slot cools after the restart: loaded once the grace is over.
    pub waiting_for_slots: usize,
    /// Files that could not be opened again for the extraction (their
    /// processes exited meanwhile); the next step loads them if mapped.
    pub reopen_failed: usize,
    /// Removal ops planned (entries of files no longer mapped, or wrong).
    pub removals: usize,
    /// Removals still pending (retried like any leftover).
    pub removals_pending: usize,
    /// From the start of the walk to the maps reconciled.
    pub seconds: f64,
    /// Of which the walk (opening and identifying every mapped file).
    pub walk_seconds: f64,
}

/// How many event latencies [`EventStats`] keeps for its quantiles.
pub const LATENCIES_KEPT: usize = 8192;

/// What the event path saw since the watch started; `eim watch`'s summary
/// reports it as is (`--json`: these fields, the latencies as two
/// quantiles).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct EventStats {
    /// Events by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Events the kernel could not deliver (a full ring).
    pub lost: u64,
    /// Full walks of `/proc` after the first: periodic, or after a loss.
    pub resyncs: u64,
    /// Resyncs forced by a loss.
    pub resyncs_after_loss: u64,
    /// What the resyncs corrected (processes events had not reported as
    /// new, exited or with new executable mappings): 0 when nothing is lost.
    pub corrections: u64,
    /// Batches of events followed.
    pub batches: u64,
    /// Processes read because events named them.
    pub processes_read: u64,
    /// From each followed event to the end of the pass that read its
    /// process (its tables published).
    #[serde(flatten)]
    pub latencies: Latencies,
}

impl EventStats {
    pub fn note_latency(&mut self, d: Duration) {
        self.latencies.note(d);
    }

    /// The `q` quantile (0..=1) of the kept latencies.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        self.latencies.quantile(q)
    }
}

/// The last [`LATENCIES_KEPT`] event latencies. Serialized as what a
/// report shows of them: `latency_ms_p50` and `latency_ms_p99`
/// (milliseconds, `null` before the first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Latencies {
    kept: Vec<Duration>,
    /// Where the next one goes once the window is full.
    next: usize,
}

impl Latencies {
    pub fn note(&mut self, d: Duration) {
        if self.kept.len() < LATENCIES_KEPT {
            self.kept.push(d);
        } else if let Some(slot) = self.kept.get_mut(self.next) {
            *slot = d;
            self.next = (self.next + 1) % LATENCIES_KEPT;
        }
    }

    /// The `q` quantile (0..=1) of the kept latencies.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let mut sorted = self.kept.clone();
        sorted.sort_unstable();
        let last = sorted.len().checked_sub(1)?;
        let at = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
        sorted.get(at).copied()
    }

    /// The `q` quantile in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        self.quantile(q).map(|d| d.as_secs_f64() * 1e3)
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

impl serde::Serialize for Latencies {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Latencies", 2)?;
        s.serialize_field("latency_ms_p50", &self.quantile_ms(0.5))?;
        s.serialize_field("latency_ms_p99", &self.quantile_ms(0.99))?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary's `events` object: the counters, then the two
    /// quantiles in milliseconds (`null` before the first latency), and
    /// nothing of the window itself.
    #[test]
    fn the_json_has_the_counters_then_two_quantiles() {
        let mut s = EventStats::default();
        s.events.insert("exec", 2);
        s.lost = 1;
        s.batches = 3;
        let json = serde_json::to_string(&s).expect("JSON");
        assert_eq!(
            json,
            "{\"events\":{\"exec\":2},\"lost\":1,\"resyncs\":0,\"resyncs_after_loss\":0,\
             \"corrections\":0,\"batches\":3,\"processes_read\":0,\
             \"latency_ms_p50\":null,\"latency_ms_p99\":null}"
        );
        s.note_latency(Duration::from_millis(4));
        let json = serde_json::to_string(&s).expect("JSON");
        assert!(
            json.ends_with("\"latency_ms_p50\":4.0,\"latency_ms_p99\":4.0}"),
            "{json}"
        );
    }

    #[test]
    fn latency_quantiles_come_from_the_kept_window() {
        let mut s = EventStats::default();
        assert_eq!(s.latency_quantile(0.5), None);
        for ms in 1..=100 {
            s.note_latency(Duration::from_millis(ms));
        }
        assert_eq!(s.latency_quantile(0.0), Some(Duration::from_millis(1)));
        assert_eq!(s.latency_quantile(0.5), Some(Duration::from_millis(51)));
        assert_eq!(s.latency_quantile(1.0), Some(Duration::from_millis(100)));
        // The window keeps the newest.
        for _ in 0..LATENCIES_KEPT {
            s.note_latency(Duration::from_secs(1));
        }
        assert_eq!(s.latencies.len(), LATENCIES_KEPT);
        assert_eq!(s.latency_quantile(0.0), Some(Duration::from_secs(1)));
    }
}
