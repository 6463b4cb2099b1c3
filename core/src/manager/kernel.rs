//! The kernel side: the book and the backend it describes, behind one lock.

use std::collections::BTreeMap;

use super::clock::Clock;
use crate::error::Error;
use eim_machine::abi::OffsetRange;
use eim_machine::deltas::IntervalData;
use eim_machine::driver::execute;
use eim_machine::machine::{KernelBook, MapRef, PlanError};
use eim_machine::ops::Backend;
use eim_machine::FileId;

/// The kernel side: the book and the backend it describes.
pub(super) struct KernelSide<B> {
    pub(super) book: KernelBook,
    pub(super) backend: B,
}

impl<B: Backend> KernelSide<B> {
    /// Runs `f`, whose ops a reader of the maps must see whole or not at
    /// all (a plan, and its rollback when it failed half-way), between
    /// the backend's [`Backend::begin_writes`] and [`Backend::end_writes`].
    pub(super) fn writing<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.backend.begin_writes();
        let result = f(self);
        self.backend.end_writes();
        result
    }

    /// Tells the book the time. Called before planning and again after the
    /// backend is done, so that a slot whose last table was just unpublished
    /// starts cooling no earlier than the unpublication.
    pub(super) fn tick(&mut self, clock: &dyn Clock) {
        self.book.advance_to(clock.now());
    }

    /// Retries the removal of leftover entries, oldest file first.
    pub(super) fn retry_leftovers(&mut self, clock: &dyn Clock) {
        self.tick(clock);
        for (file_id, op) in self.book.leftover_fronts() {
            let mut op = Some(op);
            // Each completed op pops one from the file's queue, so this ends.
            while let Some(current) = op.take() {
                let result =
                    self.writing(|k| eim_machine::driver::apply_one(&mut k.backend, &current));
                self.tick(clock);
                if self.book.leftover_result(file_id, result) {
                    op = self
                        .book
                        .leftovers()
                        .get(&file_id)
                        .and_then(|q| q.front().cloned());
                }
            }
        }
    }

    /// Loads a file's table and, if its loaders need them, its
    /// `interpreter_offsets` entry, all or nothing.
    pub(super) fn load_with(
        &mut self,
        clock: &dyn Clock,
        file_id: FileId,
        deltas: &IntervalData,
        offsets: Option<OffsetRange>,
    ) -> Result<MapRef, Error> {
        self.retry_leftovers(clock);
        let plan = self
            .book
            .plan_load(file_id, deltas, offsets)
            .map_err(|e| plan_error(file_id, e))?;
        self.backend.begin_writes();
        let Err(stopped) = execute(&mut self.backend, &plan.ops) else {
            self.backend.end_writes();
            // A batch of one: one outcome.
            let committed = self.book.commit_load(plan).into_iter().next();
            return Ok(committed.map(|(_, map_ref)| map_ref).unwrap_or_default());
        };
        let failed = &plan.ops[stopped.at];
        let (map, op, len) = (failed.map(), failed.name(), failed.len());
        let rollback = self.book.abort_load(&plan, stopped);
        let result = execute(&mut self.backend, &rollback.ops);
        self.backend.end_writes();
        self.tick(clock);
        let rolled_back = self.book.finish_rollback(rollback, result);
        Err(Error::Kernel {
            file_id,
            map,
            op,
            errno: stopped.failure.errno,
            done: stopped.failure.done,
            len,
            rolled_back,
        })
    }

    /// Loads several files with one batch plan (one outer-map publication
    /// per size class). One outcome per distinct file id. Files refused at
    /// planning get their own error and do not block the others. On a
    /// kernel failure every file of the batch is rolled back; if the errno
    /// may concern only part of it ([`Errno::may_pass_in_part`]: one
    /// element too big for a full map, memory or descriptors the whole
    /// batch needed at once), the halves are tried on their own, down to
    /// single files: everything that fits loads, and only what does not
    /// gets the error, each file its own. At most `2n - 1` attempts for `n`
    /// files.
    pub(super) fn load_many(
        &mut self,
        clock: &dyn Clock,
        files: &[(FileId, &IntervalData, Option<OffsetRange>)],
    ) -> BTreeMap<FileId, Result<MapRef, Error>> {
        self.retry_leftovers(clock);
        let mut out = BTreeMap::new();
        let mut pending = vec![files.to_vec()];
        while let Some(batch) = pending.pop() {
            let retry = self.load_batch(clock, &batch, &mut out);
            // Each part is smaller than the batch it came from, and a
            // single file is never split: this ends.
            match retry.len() {
                0 => {}
                1 => pending.push(retry),
                n => {
                    let (first, second) = retry.split_at(n / 2);
                    pending.push(second.to_vec());
                    pending.push(first.to_vec());
                }
            }
        }
        out
    }

    /// One attempt of [`Self::load_many`]: the outcome of every file in
    /// `out`, or, when the batch failed in a way a smaller one may not,
    /// the files to try again in smaller batches (those fully rolled back).
    pub(super) fn load_batch<'d>(
        &mut self,
        clock: &dyn Clock,
        files: &[(FileId, &'d IntervalData, Option<OffsetRange>)],
        out: &mut BTreeMap<FileId, Result<MapRef, Error>>,
    ) -> Vec<(FileId, &'d IntervalData, Option<OffsetRange>)> {
        let (plan, refused) = self.book.plan_load_many_with(files);
        for (file_id, e) in refused {
            out.insert(file_id, Err(plan_error(file_id, e)));
        }
        self.backend.begin_writes();
        let Some(stopped) = execute(&mut self.backend, &plan.ops).err() else {
            self.backend.end_writes();
            for (file_id, map_ref) in self.book.commit_load(plan) {
                out.insert(file_id, Ok(map_ref));
            }
            return Vec::new();
        };
        let failed = &plan.ops[stopped.at];
        let (map, op, len) = (failed.map(), failed.name(), failed.len());
        let rollback = self.book.abort_load(&plan, stopped);
        let result = execute(&mut self.backend, &rollback.ops);
        self.backend.end_writes();
        self.tick(clock);
        self.book.finish_rollback(rollback, result);
        let errno = stopped.failure.errno;
        let split = plan.files.len() > 1 && errno.may_pass_in_part();
        let by_id: BTreeMap<FileId, usize> =
            files.iter().enumerate().map(|(i, f)| (f.0, i)).collect();
        let mut retry = Vec::new();
        for file in &plan.files {
            let file_id = file.file_id;
            let rolled_back = !self.book.leftovers().contains_key(&file_id);
            // A file whose entries could not all be removed cannot be
            // planned again until they are: it keeps this error.
            if split && rolled_back {
                if let Some(&i) = by_id.get(&file_id) {
                    retry.push(files[i]);
                    continue;
                }
            }
            out.insert(
                file_id,
                Err(Error::Kernel {
                    file_id,
                    map,
                    op,
                    errno,
                    done: stopped.failure.done,
                    len,
                    rolled_back,
                }),
            );
        }
        retry
    }

    pub(super) fn unload(&mut self, clock: &dyn Clock, file_id: FileId) -> Result<(), Error> {
        self.retry_leftovers(clock);
        let Some(plan) = self.book.plan_unload(file_id) else {
            return Ok(());
        };
        let result = self.writing(|k| execute(&mut k.backend, &plan.ops));
        self.tick(clock);
        let failed = result
            .err()
            .map(|s| (plan.ops[s.at].map(), s.failure.errno));
        let entries = self.book.finish_unload(plan, result);
        match failed {
            None => Ok(()),
            Some((map, errno)) => Err(Error::UnloadIncomplete {
                file_id,
                map,
                errno,
                entries,
            }),
        }
    }
}

fn plan_error(file_id: FileId, e: PlanError) -> Error {
    match e {
        PlanError::Encode(cause) => Error::Encode { file_id, cause },
        PlanError::MapFull { map, capacity } => Error::MapFull {
            file_id,
            map,
            capacity,
        },
        PlanError::CleanupPending => Error::CleanupPending { file_id },
        PlanError::AlreadyLoaded => Error::AlreadyLoaded { file_id },
    }
}
