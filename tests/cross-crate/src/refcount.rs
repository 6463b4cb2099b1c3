//! The reference-count model both call-sequence tests keep: the
//! model-based property test (`tests/model.rs`) and the fuzz target
//! `machine` (`fuzz/fuzz_targets/machine.rs`). It says what the public API
//! promises about reference counts and delayed unloading, and checks each
//! call's result against it; each test adds what only it models (deferral
//! and provider modes in the property test).
//!
//! A scheduled fault may land inside any call (the machine may first retry
//! leftovers), so where a kernel error is possible the callers pass
//! `armed` (a fault was scheduled) and the model accepts the error only
//! then.

use std::collections::BTreeMap;
use std::time::Duration;

use eim_core::manager::CleanupReport;
use eim_core::provider::Provider;
use eim_core::{Error, ExecutableInfoManager};
use eim_machine::FileId;
use eim_sim_harness::{check_all, Observed, Sources};

/// Known files: references and, at zero references under delayed
/// unloading, since when the file is unused; and the model's clock.
#[derive(Clone, Debug, Default)]
pub struct RefCounts {
    files: BTreeMap<FileId, (u64, Option<Duration>)>,
    /// Time since the manager's clock started, as the test advanced it.
    pub now: Duration,
}

impl RefCounts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the manager knows `file` (loaded, maybe unused).
    pub fn knows(&self, file: FileId) -> bool {
        self.files.contains_key(&file)
    }

    /// Every known file, in id order.
    pub fn files(&self) -> impl Iterator<Item = FileId> + '_ {
        self.files.keys().copied()
    }

    /// A new file loaded with one reference.
    pub fn loaded(&mut self, file: FileId) {
        self.files.insert(file, (1, None));
    }

    /// An add of a known file: it always gets one more reference, and is
    /// used again. `false` (nothing changed) for an unknown file.
    pub fn add_known(&mut self, file: FileId, result: &Result<(), Error>) -> bool {
        let Some((rc, since)) = self.files.get_mut(&file) else {
            return false;
        };
        assert!(result.is_ok(), "known file {file}: {result:?}");
        *rc += 1;
        *since = None;
        true
    }

    /// `remove_or_dec_ref(file)` returned `result`.
    pub fn removed(&mut self, file: FileId, result: Result<(), Error>, armed: bool) {
        match self.files.get(&file).copied() {
            None => assert_eq!(result, Err(Error::Unknown { file_id: file })),
            Some((0, _)) => assert_eq!(result, Err(Error::NoReference { file_id: file })),
            Some((1, _)) => {
                match result {
                    Ok(()) => {}
                    Err(Error::UnloadIncomplete { .. }) if armed => {}
                    Err(e) => panic!("last release of {file}: {e}"),
                }
                self.files.remove(&file);
            }
            Some((rc, _)) => {
                assert_eq!(result, Ok(()), "release of {file}");
                self.files.insert(file, (rc - 1, None));
            }
        }
    }

    /// `dec_ref(file)` returned `result`: the last reference leaves the
    /// file unused from now on.
    pub fn dec_ref(&mut self, file: FileId, result: Result<(), Error>) {
        match self.files.get_mut(&file) {
            None => assert_eq!(result, Err(Error::Unknown { file_id: file })),
            Some((0, _)) => assert_eq!(result, Err(Error::NoReference { file_id: file })),
            Some((rc, since)) => {
                assert_eq!(result, Ok(()), "dec_ref of {file}");
                *rc -= 1;
                if *rc == 0 {
                    *since = Some(self.now);
                }
            }
        }
    }

    /// `cleanup_unused(age)` reported `report`: it unloaded exactly the
    /// unused files whose time is due, and failed only under a fault.
    pub fn cleaned(&mut self, age: Duration, report: &CleanupReport, armed: bool) {
        let cutoff = self.now.checked_sub(age);
        let due: Vec<FileId> = self
            .files
            .iter()
            .filter(|(_, (rc, since))| {
                *rc == 0 && matches!((since, cutoff), (Some(s), Some(c)) if *s <= c)
            })
            .map(|(f, _)| *f)
            .collect();
        assert_eq!(report.unloaded, due.len(), "files due for cleanup");
        assert!(armed || report.errors.is_empty(), "{:?}", report.errors);
        for f in due {
            self.files.remove(&f);
        }
    }

    /// `retry_leftovers()` left `pending` ops: none without a fault.
    pub fn retried(pending: usize, armed: bool) {
        assert!(
            armed || pending == 0,
            "{pending} leftover ops after a fault-free retry"
        );
    }

    /// The manager's state against the model after a call: no violation
    /// seen during it (reader safety after every op), none now
    /// (`check_all`), and the same reference counts and unused files.
    pub fn check<P: Provider>(
        &self,
        manager: &ExecutableInfoManager<P, Observed>,
        sources: &Sources,
    ) {
        let state = manager.state();
        let violation = manager.with_backend(|b| {
            if let Some((op, v)) = &b.violation {
                return Some(format!("during {op:?}: {v}"));
            }
            check_all(&state, &b.maps, sources)
                .err()
                .map(|v| v.to_string())
        });
        assert_eq!(violation, None);
        let counts: BTreeMap<FileId, (u64, bool)> = state
            .files
            .iter()
            .map(|(id, e)| (*id, (e.rc, e.unused_since.is_some())))
            .collect();
        let want: BTreeMap<FileId, (u64, bool)> = self
            .files
            .iter()
            .map(|(id, (rc, since))| (*id, (*rc, since.is_some())))
            .collect();
        assert_eq!(counts, want, "reference counts");
    }
}
