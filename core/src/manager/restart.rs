//! The warm restart: a manager started over the maps an earlier run left.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use super::{Clock, Config, ExecutableInfoManager};
use crate::error::Error;
use crate::info::ExecutableInfo;
use crate::provider::Provider;
use crate::sync::lock;
use crate::tracers::{self, Tracers};
use eim_machine::abi::OffsetRange;
use eim_machine::deltas::IntervalData;
use eim_machine::machine::{reconcile, Observed, ReconcileError, Wanted};
use eim_machine::ops::Backend;
use eim_machine::FileId;

/// What a warm restart ([`ExecutableInfoManager::restart`]) did.
#[derive(Debug, Default)]
pub struct RestartReport {
    /// Files whose kernel entries were kept as they were.
    pub adopted: Vec<FileId>,
    /// Files loaded again (their entries were missing or not trusted).
    pub loaded: Vec<FileId>,
    /// Files held by the caller that are not known after the restart (their
    /// extraction or their load failed): their references are gone.
    pub failed: Vec<(FileId, Error)>,
    /// Removal ops the reconcile planned (entries of files not mapped any
    /// more, or not right).
    pub removals: usize,
    /// Leftover ops still pending when the restart returns (removals that
    /// failed, and what failed loads could not undo); retried like any
    /// leftover.
    pub removals_pending: usize,
}

/// A warm restart the reconcile refused ([`ExecutableInfoManager::restart`]):
/// why, and the parts it was given, so that the caller can clean the maps
/// and start a manager afresh.
pub struct RestartRefused<P, B> {
    pub error: ReconcileError,
    pub provider: P,
    pub backend: B,
}

impl<P, B> std::fmt::Debug for RestartRefused<P, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestartRefused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<P: Provider, B: Backend> ExecutableInfoManager<P, B> {
    /// A manager started over maps an earlier run left (a warm restart):
    /// `observed` is what they hold, `held` every file mapped now with its
    /// reference count. Each held file is extracted, the book is rebuilt by
    /// [`reconcile`](fn@reconcile) (what is right is adopted untouched, the rest removed
    /// top-down), and the files whose entries were not adopted are loaded.
    /// A shape the reconcile does not trust is an error that hands the
    /// provider and the backend back, untouched: the caller cleans the maps
    /// and starts afresh instead.
    ///
    /// `held` is consumed one file at a time and each file is dropped once
    /// extracted, so a caller may open files as they are asked for and hold
    /// one descriptor at a time, however many files the host maps.
    pub fn restart<E: Borrow<P::Elf>>(
        provider: P,
        backend: B,
        tracers: Tracers,
        config: Config,
        clock: Box<dyn Clock>,
        observed: &Observed,
        held: impl IntoIterator<Item = (FileId, E, u64)>,
    ) -> Result<(Self, RestartReport), RestartRefused<P, B>> {
        let manager = Self::with_config(provider, backend, tracers, config, clock);
        let mut report = RestartReport::default();
        let mut extracted = BTreeMap::new();
        // Each file once (a repeated id keeps its first count); a file
        // nobody holds is not mapped, so the reconcile removes it.
        for (file_id, elf, rc) in held {
            if rc == 0 || extracted.contains_key(&file_id) {
                continue;
            }
            match manager
                .provider
                .extract_for(file_id, elf.borrow(), manager.tracers)
            {
                Ok(extraction) => {
                    manager.extracted.fetch_add(1, Ordering::Relaxed);
                    extracted.insert(file_id, (extraction, rc));
                }
                Err(source) => {
                    if !source.is_not_found() {
                        if !source.is_changed() {
                            manager.extraction_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        manager.defer(file_id);
                    }
                    report.failed.push((
                        file_id,
                        Error::Extraction {
                            file_id,
                            cause: source,
                        },
                    ));
                }
            }
        }
        let offsets: BTreeMap<FileId, Option<OffsetRange>> = extracted
            .iter()
            .map(|(id, (e, _))| (*id, tracers::offsets_of(&e.interpreters)))
            .collect();
        let wanted: Vec<Wanted<'_>> = extracted
            .iter()
            .map(|(id, (e, _))| Wanted {
                file_id: *id,
                deltas: &e.data,
                offsets: offsets[id],
            })
            .collect();
        let now = manager.clock.now();
        let reconciled =
            match reconcile(observed, &wanted, config.capacities, config.slot_grace, now) {
                Ok(reconciled) => reconciled,
                Err(error) => {
                    drop(wanted);
                    drop(extracted);
                    let (provider, backend) = manager.into_parts();
                    return Err(RestartRefused {
                        error,
                        provider,
                        backend,
                    });
                }
            };
        report.removals = reconciled.removals().count();
        report.adopted = reconciled.adopted.clone();
        let mut kernel = lock(&manager.kernel);
        kernel.book = reconciled.book;
        kernel.retry_leftovers(&*manager.clock);
        let batch: Vec<(FileId, &IntervalData, Option<OffsetRange>)> = reconciled
            .to_load
            .iter()
            .filter_map(|id| {
                let (e, _) = extracted.get(id)?;
                Some((*id, &e.data, offsets[id]))
            })
            .collect();
        let mut outcomes = if batch.is_empty() {
            BTreeMap::new()
        } else {
            kernel.load_many(&*manager.clock, &batch)
        };
        report.removals_pending = kernel.book.leftover_ops();
        drop(kernel);
        let adopted: BTreeSet<FileId> = report.adopted.iter().copied().collect();
        for (file_id, (extraction, rc)) in extracted {
            if !adopted.contains(&file_id) {
                match outcomes.remove(&file_id) {
                    Some(Ok(_)) => report.loaded.push(file_id),
                    Some(Err(e)) => {
                        manager.defer_load_failure(&e);
                        report.failed.push((file_id, e));
                        continue;
                    }
                    None => {
                        report
                            .failed
                            .push((file_id, Error::ExtractionAborted { file_id }));
                        continue;
                    }
                }
            }
            let info = ExecutableInfo {
                interpreters: std::sync::Arc::from(extraction.interpreters),
                libc: extraction.libc,
            };
            lock(manager.shard(file_id)).files.insert(file_id, info, rc);
        }
        Ok((manager, report))
    }
}
