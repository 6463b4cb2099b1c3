//! A warm restart: a [`Host`] started over maps an earlier run left
//! (pinned kernel maps), that keeps what they hold right instead of
//! wiping it (`docs/ARCHITECTURE.md`, "Warm restart: reconcile").
//!
//! 1. The host is walked as a step walks it, but nothing is loaded: every
//!    executable mapping is opened and identified, and each process's
//!    files are noted, with the mappings a file can be opened through
//!    again. No file stays open: a host mapping thousands of files needs
//!    no more descriptors than a step does.
//! 2. [`ExecutableInfoManager::restart`] extracts each distinct file
//!    (opened again one at a time: of the files presenting an id, a
//!    trusted one if any, else the first that still opens; that file owns
//!    the id, `host::claims`), adopts every pinned table that is exactly what a fresh
//!    load would write, removes the rest top-down and loads what is
//!    missing.
//! 3. Each process then holds the files the manager knows, so the next
//!    step finds nothing to take: an unchanged host writes nothing. A
//!    process mapping another file than the owner under its id holds
//!    nothing of it: the next step judges that mapping as a new one.
//!
//! Until step 2 removes anything, the maps are as the earlier run left
//! them: readers keep resolving every file that was loaded, and an adopted
//! file's entries are never touched. A stop signal during the walk ends
//! the restart with the maps untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use eim_analysis::elf::digest::SourceDigest;
use eim_core::manager::{MonotonicClock, RestartRefused};
use eim_core::ExecutableInfoManager;
use eim_machine::machine::{Observed, ReconcileError};
use eim_machine::ops::MapKind;
use eim_machine::process_maps::ProcessMapTable;
use eim_machine::FileId;

use super::{host_elf_ref, Host, Identified, StepReport};
use crate::files::counting::HostFile;
use crate::findings::{cause_of, Problem, ProblemKind, Reconciled};
use crate::host::claims::Candidate;
use crate::host::collide;
use crate::host::mappings::{MappingKey, ProcessEntry, Resolution};
use crate::host::open;
use crate::host::procs::{self, ExecMapping, ListError, ProcessError};
use crate::host::vdso::VdsoImages;
use crate::map_view::Inspect;

/// Why a restart did not happen.
#[derive(Debug, thiserror::Error)]
pub enum NotRestarted {
    #[error("stopped during the walk; the pinned maps are as they were")]
    Stopped,
    #[error(transparent)]
    List(#[from] ListError),
    #[error("the pinned maps hold what eim never writes ({0}); they must be cleaned")]
    Refused(ReconcileError),
}

/// A restart that did not happen, with the backend it was given. Only a
/// [`NotRestarted::Refused`] one may have run the extraction; none wrote
/// to the maps.
#[derive(Debug)]
pub struct RestartFailed<B> {
    pub why: NotRestarted,
    pub backend: B,
}

/// The file a restart extracted an id from: its mapping's device and
/// inode (as `/proc/PID/maps` gives them), the claim it makes, and the
/// digest its extraction leaves.
struct RestartOwner {
    mapping: ((u32, u32), u64),
    candidate: Candidate,
    source: Arc<OnceLock<Option<Arc<SourceDigest>>>>,
}

/// Of the mappings of one id (`(pid, mapping)`, in walk order), the file
/// to extract it from: the first trusted file that opens, else the first
/// file that opens; opened, with its claim. Each distinct file (device,
/// inode) is opened and judged once.
fn choose_owner(
    mappers: &[(i32, ExecMapping)],
    strategy: open::OpenStrategy,
    vdso: &mut VdsoImages,
) -> Option<(i32, ExecMapping, File, Candidate)> {
    let mut first: Option<(i32, ExecMapping, File, Candidate)> = None;
    let mut tried: BTreeSet<((u32, u32), u64)> = BTreeSet::new();
    let several = mappers
        .iter()
        .any(|(_, m)| (m.dev, m.inode) != (mappers[0].1.dev, mappers[0].1.inode));
    for (pid, m) in mappers {
        let key = (m.dev, m.inode);
        if tried.contains(&key) {
            continue;
        }
        // The vDSO read again from the process: the image kept for its
        // bytes, trusted if it is the kernel's.
        let opened = if m.is_vdso() {
            vdso.get(*pid, m.start, m.end)
                .map(|v| (v.file, Some(v.trusted)))
                .ok()
        } else {
            open::open_mapping(*pid, m, strategy)
                .map(|o| (o.file, None))
                .ok()
        };
        let Some((file, vdso_trusted)) = opened else {
            continue;
        };
        tried.insert(key);
        let Ok(meta) = file.metadata() else {
            continue;
        };
        let candidate = Candidate {
            stamp: collide::stamp_of(&meta),
            trusted: vdso_trusted.unwrap_or_else(|| collide::trusted(*pid, &m.path, &meta)),
            path: m.path.clone(),
        };
        let trusted = candidate.trusted;
        let found = (*pid, m.clone(), file, candidate);
        if trusted || !several {
            return Some(found);
        }
        first.get_or_insert(found);
    }
    first
}

/// A file mapped now, and the mappings it can be opened through.
struct Mapped {
    id: FileId,
    mappers: Vec<(i32, ExecMapping)>,
}

impl<B: Inspect> Host<B> {
    /// A host over `backend`, whose maps hold `observed` from an earlier
    /// run: reconciled instead of cleaned (see the module documentation).
    pub fn restart(
        backend: B,
        config: super::HostConfig,
        observed: &Observed,
        stop: &AtomicBool,
    ) -> Result<Self, RestartFailed<B>> {
        let started = Instant::now();
        let mut host = Self::new(backend, config);
        // Rewritten by the first full step, or deleted by it.
        let mut process_maps = ProcessMapTable::new();
        process_maps.adopt(observed.process_mappings.clone());
        let mapped = match host.walk_for_restart(stop) {
            Ok(mapped) => mapped,
            Err(why) => {
                let (_, backend) = host.manager.into_parts();
                return Err(RestartFailed {
                    why,
                    backend: backend.inner,
                });
            }
        };
        let walk_seconds = started.elapsed().as_secs_f64();
        let Host {
            manager,
            stats,
            config,
            mut processes,
            ids,
            mut files,
            mut problems,
            unopenable,
            not_readable,
            mut counters,
            last,
            metric_totals,
            restarted: _,
            clock,
            process_maps: _,
            claims: _,
            collisions,
            collisions_told: _,
            revisit: _,
            mapped_file_opens,
            mut vdso,
        } = host;
        let (provider, backend) = manager.into_parts();
        let strategy = config.strategy;
        let mut reopen_failed = 0;
        // Which file of each id is extracted, and owns the id afterwards:
        // of the files (device, inode) presenting it, a trusted one if any
        // (its tables replace whatever an untrusted copy left pinned),
        // else the first that opens (host::claims, docs/THREAT_MODEL.md,
        // "File ids").
        let mut owners: BTreeMap<FileId, RestartOwner> = BTreeMap::new();
        let held = mapped.iter().filter_map(|file| {
            let id128 = files.get(&file.id)?.id;
            let chosen = choose_owner(&file.mappers, strategy, &mut vdso);
            let Some((pid, m, opened, candidate)) = chosen else {
                reopen_failed += 1;
                return None;
            };
            let host_file = HostFile::new(id128, host_elf_ref(pid, &m).with_file(opened));
            owners.insert(
                file.id,
                RestartOwner {
                    mapping: (m.dev, m.inode),
                    candidate,
                    source: host_file.source.clone(),
                },
            );
            Some((file.id, host_file, file.mappers.len() as u64))
        });
        let outcome = ExecutableInfoManager::restart(
            provider,
            backend,
            config.tracers,
            eim_core::manager::Config::default(),
            Box::new(MonotonicClock::default()),
            observed,
            held,
        );
        let (manager, report) = match outcome {
            Ok(restarted) => restarted,
            Err(RestartRefused { error, backend, .. }) => {
                return Err(RestartFailed {
                    why: NotRestarted::Refused(error),
                    backend: backend.inner,
                })
            }
        };
        let cooling = manager.slots_cooling_for();
        let mut waiting = 0;
        for (id, e) in &report.failed {
            let path = files.get(id).map(|r| r.path.clone()).unwrap_or_default();
            let (kind, reason, cause) = match (e, cooling) {
                // Expected: a rule no slot holds, while every slot cools.
                (
                    eim_core::Error::MapFull {
                        map: MapKind::UnwindInfo,
                        ..
                    },
                    Some(wait),
                ) => {
                    waiting += 1;
                    tracing::debug!(path = %path.display(), "{e}");
                    let why = format!(
                        "it needs an unwind rule no slot holds, and after a restart every free slot cools for {:.1} s more",
                        wait.as_secs_f64()
                    );
                    (
                        ProblemKind::Deferred,
                        format!("{e}: {why}"),
                        format!("{}: {why}", cause_of(e)),
                    )
                }
                _ => {
                    tracing::warn!(path = %path.display(), "{e}");
                    (
                        ProblemKind::of(e).unwrap_or(ProblemKind::Failed),
                        e.to_string(),
                        cause_of(e),
                    )
                }
            };
            problems.insert(
                *id,
                Problem {
                    path,
                    file_id: files.get(id).map(|r| r.id.to_string()),
                    kind,
                    cause,
                    reason,
                },
            );
        }
        let state = manager.state();
        for (id, entry) in &state.files {
            if let Some(record) = files.get_mut(id) {
                record.info = Some(entry.info.clone());
            }
        }
        let mut claims = super::Claims::new();
        for file in &mapped {
            if !state.files.contains_key(&file.id) {
                continue;
            }
            let owner = owners.get(&file.id);
            if let Some(owner) = owner {
                claims.take_over(file.id, &owner.candidate);
                claims.loaded(file.id, owner.source.get().cloned().flatten());
            }
            for (pid, m) in &file.mappers {
                let Some(entry) = processes.get_mut(*pid) else {
                    continue;
                };
                if owner.is_some_and(|o| o.mapping != (m.dev, m.inode)) {
                    // Another file with the owner's id: not held, and its
                    // mappings unresolved, so that the first step judges
                    // it against the owner as any new mapping is judged.
                    entry
                        .mappings
                        .retain(|_, r| *r != Resolution::File(file.id));
                    continue;
                }
                entry.held.insert(file.id);
                counters.references_taken += 1;
            }
        }
        let reconciled = Reconciled {
            processes: last.with_files,
            files: mapped.len(),
            adopted: report.adopted.len(),
            loaded: report.loaded.len(),
            failed: report.failed.len() - waiting,
            waiting_for_slots: waiting,
            reopen_failed,
            removals: report.removals,
            removals_pending: report.removals_pending,
            seconds: started.elapsed().as_secs_f64(),
            walk_seconds,
        };
        Ok(Self {
            manager,
            stats,
            config,
            processes,
            ids,
            files,
            problems,
            unopenable,
            not_readable,
            counters,
            last,
            metric_totals,
            restarted: Some(reconciled),
            clock,
            process_maps,
            claims,
            collisions,
            // The new owner's lock file starts without notes.
            collisions_told: 0,
            revisit: Default::default(),
            mapped_file_opens,
            vdso,
        })
    }

    /// What the restart did, if this host was started by one.
    pub fn restarted(&self) -> Option<&Reconciled> {
        self.restarted.as_ref()
    }

    /// Step 1: every process's files, identified, none loaded or held open.
    fn walk_for_restart(&mut self, stop: &AtomicBool) -> Result<Vec<Mapped>, NotRestarted> {
        let started = Instant::now();
        let pids = self.followed_pids()?;
        let mut report = StepReport {
            processes: pids.len(),
            ..StepReport::default()
        };
        let mut mapped: BTreeMap<FileId, Vec<(i32, ExecMapping)>> = BTreeMap::new();
        for pid in pids {
            if stop.load(Ordering::Relaxed) {
                return Err(NotRestarted::Stopped);
            }
            self.counters.processes_read += 1;
            match self.walk_process(pid, &mut report) {
                Ok(files) => {
                    for (id, m) in files {
                        mapped.entry(id).or_default().push((pid, m));
                    }
                }
                Err(ProcessError::Vanished { .. }) => self.counters.vanished += 1,
                Err(e @ ProcessError::PermissionDenied { .. }) => {
                    tracing::debug!("{e}");
                    self.note_not_readable(pid);
                }
                Err(e @ ProcessError::Io { .. }) => {
                    tracing::warn!("{e}");
                    self.counters.unreadable += 1;
                }
            }
        }
        report.new_processes = self.processes.len();
        report.elapsed = started.elapsed();
        self.last = report;
        Ok(mapped
            .into_iter()
            .map(|(id, mappers)| Mapped { id, mappers })
            .collect())
    }

    /// One process of the walk: its entry (mappings resolved, nothing held
    /// yet) and each distinct file it maps, with the first mapping of it.
    fn walk_process(
        &mut self,
        pid: i32,
        report: &mut StepReport,
    ) -> Result<Vec<(FileId, ExecMapping)>, ProcessError> {
        let start_time = procs::start_time(pid)?;
        let mappings = procs::exec_mappings(pid)?;
        report.file_mappings += mappings.loadable().count();
        report.anonymous_mappings += mappings.anonymous;
        if !mappings.files.is_empty() {
            report.with_files += 1;
        }
        let mut entry = ProcessEntry::new(start_time);
        let mut firsts: BTreeMap<FileId, ExecMapping> = BTreeMap::new();
        // The vDSO as a file (`host::vdso`): its pinned table is adopted
        // like any other file's.
        let loadable: Vec<ExecMapping> = mappings.loadable().cloned().collect();
        for m in loadable {
            let resolution = match self.identify(pid, &m) {
                Some(Identified::File(id128, _file, _)) => {
                    let id = id128.host();
                    firsts.entry(id).or_insert_with(|| m.clone());
                    Resolution::File(id)
                }
                Some(Identified::Unusable) => Resolution::Unusable,
                None => {
                    self.counters.files_vanished += 1;
                    continue;
                }
            };
            entry.mappings.insert(MappingKey::of(&m), resolution);
        }
        self.processes.put(pid, entry);
        Ok(firsts.into_iter().collect())
    }
}
