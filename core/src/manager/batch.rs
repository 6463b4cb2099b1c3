//! The batch load: extraction on a thread of its own, in parts that are
//! published while the next part is extracted.

use std::sync::atomic::Ordering;

use super::shard::{Flight, FlightGuard};
use super::ExecutableInfoManager;
use crate::error::Error;
use crate::info::ExecutableInfo;
use crate::provider::{ExtractError, Extraction, Provider};
use crate::sync::{beside, handoff, lock, Arc};
use crate::tracers;
use eim_machine::abi::OffsetRange;
use eim_machine::deltas::IntervalData;
use eim_machine::ops::Backend;
use eim_machine::FileId;

/// The stack of the extractor thread of [`ExecutableInfoManager::load_many`]:
/// twice std's default, for the file provider's code (loaders included),
/// which otherwise runs on the caller's thread; sized here rather than by
/// `RUST_MIN_STACK`, so that an address-space limit sees a known figure.
const EXTRACTOR_STACK_BYTES: usize = 4 << 20;

/// Files of a [`ExecutableInfoManager::load_many`] extracted together:
/// each one's index in the call's own files, and its extraction.
type Part = Vec<(usize, Result<Extraction, ExtractError>)>;

impl<P: Provider, B: Backend> ExecutableInfoManager<P, B> {
    /// Takes a reference on each file, like [`Self::add_or_inc_ref`] on each
    /// in turn, but loads all the new ones with ONE batch plan: their tables
    /// are published with one outer-map batch update per size class, so a
    /// batch pays one map-in-map RCU wait per class used instead of one per
    /// file. Known files take a reference on the fast path; deferred files
    /// are refused; a file being loaded by another caller is waited for
    /// (after this batch has landed). Extraction runs with no lock held; the
    /// new files are then planned, written and recorded in one kernel-lock
    /// session. If the kernel fails part way, every file of the batch is
    /// rolled back and gets the error (and is deferred); a file refused at
    /// planning gets its own error and does not block the others. Results
    /// are in the order of `files`; a file given twice gets two references.
    pub fn load_many(&self, files: &[(FileId, &P::Elf)]) -> Vec<Result<ExecutableInfo, Error>> {
        let mut results: Vec<Option<Result<ExecutableInfo, Error>>> = vec![None; files.len()];
        let mut mine: Vec<(usize, FlightGuard<'_>)> = Vec::new();
        let mut waits: Vec<(usize, Arc<Flight>)> = Vec::new();
        for (i, &(file_id, _)) in files.iter().enumerate() {
            let mut shard = lock(self.shard(file_id));
            if let Some(info) = shard.files.inc_ref(file_id) {
                results[i] = Some(Ok(info));
                continue;
            }
            if let Some((flight, waiters)) = shard.flights.get_mut(&file_id) {
                *waiters += 1;
                waits.push((i, flight.clone()));
                continue;
            }
            if lock(&self.deferred).contains(file_id, self.clock.now()) {
                results[i] = Some(Err(Error::Deferred { file_id }));
                continue;
            }
            let flight = Arc::new(Flight::new());
            shard.flights.insert(file_id, (flight.clone(), 0));
            drop(shard);
            mine.push((
                i,
                FlightGuard {
                    shard: self.shard(file_id),
                    file_id,
                    flight,
                    landed: false,
                },
            ));
        }
        // Extraction, no lock held, in parts of at most `batch_bytes` of
        // deltas; each part is published (and its deltas dropped) while the
        // next one is extracted on a thread of its own, so extraction
        // overlaps the kernel's writes and RCU waits.
        let mut outcomes: Vec<Option<Result<ExecutableInfo, Error>>> = vec![None; mine.len()];
        let jobs: Vec<(FileId, &P::Elf)> = mine
            .iter()
            .map(|(i, guard)| (guard.file_id, files[*i].1))
            .collect();
        let mut publish = |part: Part| {
            let mut extracted = Vec::with_capacity(part.len());
            for (n, result) in part {
                match result {
                    Ok(extraction) => extracted.push((n, extraction)),
                    Err(source) => {
                        let file_id = mine[n].1.file_id;
                        if !source.is_not_found() {
                            if !source.is_changed() {
                                self.extraction_errors.fetch_add(1, Ordering::Relaxed);
                            }
                            self.defer(file_id);
                        }
                        outcomes[n] = Some(Err(Error::Extraction {
                            file_id,
                            cause: source,
                        }));
                    }
                }
            }
            self.publish_part(&mine, extracted, &mut outcomes);
        };
        if jobs.len() < 2 {
            self.extract_parts(&jobs, |part| {
                publish(part);
                true
            });
        } else {
            // One part queued while one is extracted and one published:
            // at most three parts of deltas in memory.
            let (ready, parts) = handoff::<Part>();
            let jobs = &jobs;
            let extractor = beside(
                "eim-extract",
                EXTRACTOR_STACK_BYTES,
                move || self.extract_parts(jobs, |part| ready.send(part)),
                || {
                    for part in parts {
                        publish(part);
                    }
                },
            );
            // No thread to be had (the host out of processes): the same
            // parts, one after the other.
            if let Err(e) = extractor {
                tracing::warn!("extracting on this thread: no thread for it: {e}");
                self.extract_parts(jobs, |part| {
                    publish(part);
                    true
                });
            }
        }
        // Land every flight of the batch, then wait for the others' (never
        // before: two batches waiting on each other's flights would hang).
        for ((i, mut guard), outcome) in mine.into_iter().zip(outcomes) {
            let file_id = guard.file_id;
            let outcome = outcome.unwrap_or(Err(Error::ExtractionAborted { file_id }));
            results[i] = Some(guard.land(outcome));
        }
        for (i, flight) in waits {
            results[i] = Some(flight.wait());
        }
        results
            .into_iter()
            .zip(files)
            .map(|(r, (file_id, _))| {
                r.unwrap_or(Err(Error::ExtractionAborted { file_id: *file_id }))
            })
            .collect()
    }

    /// Extracts `jobs` in order, handing `part` each run of them whose
    /// deltas reach `batch_bytes` (and the rest at the end), with each
    /// job's index; stops when `part` returns false.
    fn extract_parts(&self, jobs: &[(FileId, &P::Elf)], mut part: impl FnMut(Part) -> bool) {
        let mut current: Part = Vec::new();
        let mut held = 0usize;
        for (n, &(file_id, elf)) in jobs.iter().enumerate() {
            let result = self.provider.extract_for(file_id, elf, self.tracers);
            if let Ok(extraction) = &result {
                self.extracted.fetch_add(1, Ordering::Relaxed);
                held = held.saturating_add(extraction.data.bytes());
            }
            current.push((n, result));
            if held >= self.batch_bytes {
                held = 0;
                if !part(std::mem::take(&mut current)) {
                    return;
                }
            }
        }
        if !current.is_empty() {
            part(current);
        }
    }

    /// One part of a [`Self::load_many`]: the extracted files `extracted`
    /// (by their index in `mine`) published with one kernel-lock session;
    /// their outcomes go to `outcomes`, and their deltas are dropped.
    fn publish_part(
        &self,
        mine: &[(usize, FlightGuard<'_>)],
        extracted: Vec<(usize, Extraction)>,
        outcomes: &mut [Option<Result<ExecutableInfo, Error>>],
    ) {
        if extracted.is_empty() {
            return;
        }
        let batch: Vec<(FileId, &IntervalData, Option<OffsetRange>)> = extracted
            .iter()
            .map(|(n, e)| {
                let offsets = tracers::offsets_of(&e.interpreters);
                (mine[*n].1.file_id, &e.data, offsets)
            })
            .collect();
        let mut loaded = lock(&self.kernel).load_many(&*self.clock, &batch);
        drop(batch);
        for (n, extraction) in extracted {
            let file_id = mine[n].1.file_id;
            let outcome = match loaded.remove(&file_id) {
                Some(Ok(_)) => Ok(ExecutableInfo {
                    interpreters: std::sync::Arc::from(extraction.interpreters),
                    libc: extraction.libc,
                }),
                Some(Err(e)) => {
                    self.defer_load_failure(&e);
                    Err(e)
                }
                None => Err(Error::ExtractionAborted { file_id }),
            };
            outcomes[n] = Some(outcome);
        }
    }
}
