//! How a step meets a new mapping: its file opened and identified, judged
//! against its id's owner ([`crate::host::claims`]), collisions noted,
//! files evicted when a trusted owner replaces them.

use super::*;
use crate::host::vdso::VdsoError;

impl<B: Inspect> Host<B> {
    /// Opens a mapping's file of the process being read, computes its id
    /// and judges it against the id's owner ([`Self::admit`]). The
    /// process's reference on a file it is to take goes into the batch
    /// with the file, open; the file is closed here if the process takes
    /// nothing of it, or the batch has its id already. A full batch is
    /// loaded before the file is opened, so the batch's size bounds the
    /// descriptors it holds and no file is closed for want of room and
    /// opened again.
    pub(super) fn resolve(
        &mut self,
        m: &ExecMapping,
        batch: &mut Batch,
        reading: &mut Reading,
        progress: &mut dyn Progress,
        report: &mut StepReport,
    ) -> Resolved {
        if batch.files.len() >= self.batch_limit() {
            self.flush(batch, progress, report, Some(reading));
        }
        let pid = reading.pid;
        let (id128, file, identity) = match self.identify(pid, m) {
            None => return Resolved::Gone,
            Some(Identified::Unusable) => return Resolved::Mapping(Resolution::Unusable),
            Some(Identified::File(id128, file, identity)) => (id128, file, identity),
        };
        let id = id128.host();
        match self.admit(pid, m, id, &file, identity, batch, reading) {
            Resolved::Mapping(Resolution::File(_)) => {}
            other => return other,
        }
        // Held already, deferred, or asked already by this read (a failed
        // load is not tried again before the next read): nothing to take.
        if !reading.entry.held.contains(&id)
            && !self.manager.is_deferred(id)
            && reading.asked.insert(id)
        {
            batch
                .files
                .entry(id)
                .or_insert_with(|| HostFile::new(id128, host_elf_ref(pid, m).with_file(file)));
            batch.refs.push((pid, id));
        }
        Resolved::Mapping(Resolution::File(id))
    }

    /// Whether a mapping of `entry` is resolved already: a file this
    /// process does not hold (its load failed) is judged again before it
    /// is taken, as its id may have another owner since.
    pub(super) fn is_resolved(&self, entry: &ProcessEntry, key: &MappingKey) -> bool {
        entry.mappings.get(key).is_some_and(|r| match r {
            Resolution::File(id) => entry.held.contains(id) || self.manager.is_deferred(*id),
            _ => true,
        })
    }

    /// At most how many files a read of process `pid` (started at
    /// `start_time`) opens: the distinct files (device, inode) of its
    /// mappings not resolved yet. An upper bound: a file may turn out to
    /// be in the batch already.
    pub(super) fn files_to_open(
        &self,
        pid: i32,
        start_time: u64,
        mappings: &[ExecMapping],
    ) -> usize {
        let entry = self
            .processes
            .get(pid)
            .filter(|e| e.start_time == start_time);
        let mut files = HashSet::new();
        for m in mappings {
            if !entry.is_some_and(|e| self.is_resolved(e, &MappingKey::of(m))) {
                files.insert((m.dev, m.inode));
            }
        }
        files.len()
    }

    /// Judges a file presenting `id` against the id's owner
    /// ([`crate::host::claims`]): the owner, or a file with its bytes, may
    /// be loaded; another file collides, unless it is trusted and the
    /// owner is not, in which case the owner is evicted first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &mut self,
        pid: i32,
        m: &ExecMapping,
        id: FileId,
        file: &std::fs::File,
        identity: Identity,
        batch: &mut Batch,
        reading: &mut Reading,
    ) -> Resolved {
        let key = FileKey {
            dev: identity.dev,
            inode: identity.inode,
        };
        if let Some(claim) = self.claims.get(id) {
            if claim.owner == key {
                return Resolved::Mapping(Resolution::File(id));
            }
            // Tables gone, or a failure no longer deferred: nothing to
            // defend, the next file owns the id.
            let stale = match claim.state {
                State::Loaded(_) => !self.manager.knows(id) && !batch.files.contains_key(&id),
                State::Failed => !self.manager.is_deferred(id),
                State::Pending => false,
            };
            if stale {
                self.claims.forget(id);
            }
        }
        // Only for a new id, or another file than its owner: a stat and
        // the directories up to the process's root.
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(e) => {
                let e = OpenError::Io {
                    pid,
                    path: m.path.clone(),
                    cause: e,
                };
                self.note_unopenable(m, &e);
                return Resolved::Mapping(Resolution::Unusable);
            }
        };
        let candidate = Candidate {
            stamp: collide::stamp_of(&meta),
            trusted: self.trusted(pid, m, &meta),
            path: m.path.clone(),
        };
        // A take-over compared nothing: the evicted owner's files are judged
        // against the new owner when their processes are read again, and
        // listed then if they differ.
        let mut compared = true;
        let verdict = match self.claims.admit(id, &candidate) {
            Admit::Owner | Admit::Same | Admit::Deferred => Verdict::Share,
            Admit::Collides => Verdict::Collision,
            Admit::Wait => return Resolved::Wait,
            Admit::TakeOver => {
                compared = false;
                Verdict::Replace
            }
            Admit::Check(digest) => {
                let same = match collide::same_bytes(file, meta.len(), &digest) {
                    Ok(same) => same,
                    Err(e) => {
                        tracing::debug!(pid, path = %m.path.display(), "cannot compare with the owner of {id}: {e}");
                        false
                    }
                };
                self.claims.judge(id, &candidate, same)
            }
        };
        match verdict {
            Verdict::Share => Resolved::Mapping(Resolution::File(id)),
            Verdict::Collision => {
                self.note_collision(id, &candidate, false);
                Resolved::Mapping(Resolution::Collision(id))
            }
            Verdict::Replace => {
                // Before the eviction, which may forget it with the tables.
                let old = self.claims.get(id).cloned();
                if !self.evict(id, batch, reading) {
                    // Something else still holds the owner's tables: they
                    // cannot be replaced now, so this file is not loaded.
                    self.note_collision(id, &candidate, false);
                    return Resolved::Mapping(Resolution::Collision(id));
                }
                self.claims.take_over(id, &candidate);
                if let Some(old) = old.filter(|_| compared) {
                    let loser = Candidate {
                        stamp: crate::host::claims::Stamp {
                            key: old.owner,
                            size: meta.len(),
                            mtime_ns: 0,
                            ctime_ns: 0,
                        },
                        trusted: old.trusted,
                        path: old.path,
                    };
                    self.note_collision(id, &loser, true);
                    self.counters.owners_replaced += 1;
                }
                Resolved::Mapping(Resolution::File(id))
            }
        }
    }

    /// Evicts `id`'s owner: every process's resolutions naming it are
    /// forgotten (each is read again at the end of the pass and judged
    /// against the new owner), their references released, the batch's
    /// references and file of it dropped, and its tables unloaded (the
    /// usual unload plan: pages first, then the table). False if the
    /// tables are still loaded afterwards (a reference the host does not
    /// track), so that nothing may be loaded under the id. `reading`: the
    /// process being read, whose later resolutions are its own.
    pub(super) fn evict(&mut self, id: FileId, batch: &mut Batch, reading: &mut Reading) -> bool {
        let mut release = 0;
        let pids: Vec<i32> = self.processes.pids_naming(id);
        for pid in pids {
            if let Some(entry) = self.processes.get_mut(pid) {
                let (forgot, held) = entry.forget_file(id);
                release += usize::from(held);
                if forgot || held {
                    self.revisit.insert(pid);
                    self.drop_process_mapping_of(pid, id);
                }
            }
        }
        let (_, held) = reading.entry.forget_file(id);
        release += usize::from(held);
        // Its reference on the new owner's file is asked anew.
        reading.asked.remove(&id);
        batch.refs.retain(|(pid, i)| {
            if *i == id && *pid != reading.pid {
                self.revisit.insert(*pid);
            }
            *i != id
        });
        batch.files.remove(&id);
        let before = batch.releases.len();
        batch.releases.retain(|i| *i != id);
        release += before - batch.releases.len();
        for _ in 0..release {
            self.release(id);
        }
        if let Err(e) = self.manager.unload_if_unused(id) {
            tracing::warn!("{e}");
        }
        self.manager.forgive(id);
        self.problems.remove(&id);
        !self.manager.knows(id)
    }

    /// Removes `id`'s mappings from process `pid`'s `eim_process_mappings`
    /// entry at once (not at its next read): no mapping of a file that
    /// lost its id may point at the id's next tables.
    pub(super) fn drop_process_mapping_of(&mut self, pid: i32, id: FileId) {
        let Some(now) = self.process_maps.get(pid as u32) else {
            return;
        };
        if !now.mappings.iter().any(|m| m.file_id == id.0) {
            return;
        }
        let kept: Vec<ProcessMapping> = now
            .mappings
            .iter()
            .filter(|m| m.file_id != id.0)
            .copied()
            .collect();
        if let Some(op) = self.process_maps.set(pid as u32, kept) {
            self.apply_process_op(op);
        }
    }

    /// Lists and counts a collision at `id`, once per file; logged once.
    pub(super) fn note_collision(&mut self, id: FileId, loser: &Candidate, replaced: bool) {
        let key = (id, loser.stamp.key);
        if self.collisions.contains_key(&key) {
            return;
        }
        self.counters.collisions += 1;
        let owner = self.claims.get(id);
        let owner_path = owner.map_or_else(PathBuf::new, |c| c.path.clone());
        let who = |trusted: bool| if trusted { "trusted" } else { "untrusted" };
        let cause = if replaced {
            format!(
                "it lost the file id (and any tables loaded from it) to {} ({}), which presents the same id with other bytes",
                owner_path.display(),
                who(owner.is_some_and(|c| c.trusted))
            )
        } else {
            format!(
                "it presents the file id of {} ({}) with other bytes: not loaded",
                owner_path.display(),
                who(owner.is_some_and(|c| c.trusted))
            )
        };
        let file_id = self.files.get(&id).map(|r| r.id.to_string());
        let reason = format!(
            "file {id}: {} ({}, device {} inode {}): {cause}",
            loser.path.display(),
            who(loser.trusted),
            loser.stamp.key.dev,
            loser.stamp.key.inode
        );
        tracing::warn!("file id collision: {reason}");
        if self.collisions.len() < MAX_COLLISIONS_LISTED {
            self.collisions.insert(
                key,
                Problem {
                    path: loser.path.clone(),
                    file_id,
                    kind: ProblemKind::Collision,
                    reason,
                    cause: "presents another file's id with other bytes (file id collision)".into(),
                },
            );
        }
    }

    /// Opens a mapping's file, computes its id and records the file. `None`
    /// if it has gone.
    pub(super) fn identify(&mut self, pid: i32, m: &ExecMapping) -> Option<Identified> {
        if m.is_vdso() {
            return self.identify_vdso(pid, m);
        }
        let opening = Instant::now();
        self.mapped_file_opens += 1;
        let opened = open::open_mapping(pid, m, self.config.strategy);
        self.clock.open += opening.elapsed();
        let opened = match opened {
            Ok(opened) => opened,
            Err(e) if e.is_vanished() => return None,
            Err(e) => {
                self.note_unopenable(m, &e);
                return Some(Identified::Unusable);
            }
        };
        let identifying = Instant::now();
        let id128 = self.ids.get(&opened.file, opened.identity);
        self.clock.file_ids += identifying.elapsed();
        let id128 = match id128 {
            Ok(id) => id,
            Err(e) => {
                let e = OpenError::Io {
                    pid,
                    path: m.path.clone(),
                    cause: e,
                };
                self.note_unopenable(m, &e);
                return Some(Identified::Unusable);
            }
        };
        tracing::trace!(pid, path = %m.path.display(), via = ?opened.via, "opened");
        self.record_file(pid, m, id128, &opened.file, opened.identity.size);
        Some(Identified::File(id128, opened.file, opened.identity))
    }

    /// Whether the file of mapping `m` of process `pid` is trusted: the
    /// vDSO's image if it is the kernel's (`host::vdso`), any other file
    /// by `host::collide`'s rule.
    pub(super) fn trusted(&self, pid: i32, m: &ExecMapping, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        if m.is_vdso() {
            return self.vdso.is_trusted(meta.dev(), meta.ino());
        }
        collide::trusted(pid, &m.path, meta)
    }

    /// The vDSO mapping's image, read from the process and identified
    /// ([`crate::host::vdso`]): one file for every process of the kernel.
    /// `None` if the process has gone (or went while it was read).
    fn identify_vdso(&mut self, pid: i32, m: &ExecMapping) -> Option<Identified> {
        let opening = Instant::now();
        let got = self.vdso.get(pid, m.start, m.end);
        self.clock.open += opening.elapsed();
        let vdso = match got {
            Ok(vdso) => vdso,
            Err(VdsoError::Vanished { .. } | VdsoError::Short { .. }) => return None,
            Err(e) => {
                let e = OpenError::Io {
                    pid,
                    path: m.path.clone(),
                    cause: std::io::Error::other(e.to_string()),
                };
                self.note_unopenable(m, &e);
                return Some(Identified::Unusable);
            }
        };
        let identity = match vdso.file.metadata() {
            Ok(meta) => Identity::of(&meta),
            Err(cause) => {
                let e = OpenError::Io {
                    pid,
                    path: m.path.clone(),
                    cause,
                };
                self.note_unopenable(m, &e);
                return Some(Identified::Unusable);
            }
        };
        self.record_file(pid, m, vdso.id, &vdso.file, identity.size);
        Some(Identified::File(vdso.id, vdso.file, identity))
    }

    /// Records the file `id128` a mapping of process `pid` opened to.
    fn record_file(
        &mut self,
        pid: i32,
        m: &ExecMapping,
        id128: FileId128,
        file: &std::fs::File,
        size: u64,
    ) {
        let record = self.files.entry(id128.host()).or_insert_with(|| {
            tracing::debug!(pid, path = %m.path.display(), file_id = %id128, "new file");
            FileRecord {
                id: id128,
                path: m.path.clone(),
                paths: Vec::new(),
                more_paths: 0,
                size,
                // A file whose headers cannot be read has no bias: its
                // mappings are left out of the unwinder's table.
                segments: segments::load_segments(file).unwrap_or_default(),
                info: None,
            }
        });
        record.saw(&m.path);
    }

    pub(super) fn note_unopenable(&mut self, m: &ExecMapping, e: &OpenError) {
        if matches!(e, OpenError::PermissionDenied { .. }) {
            self.counters.permission_denied += 1;
        } else {
            self.counters.unreadable += 1;
        }
        tracing::debug!("{e}");
        self.unopenable
            .entry(m.path.clone())
            .or_insert_with(|| Problem {
                path: m.path.clone(),
                file_id: None,
                kind: ProblemKind::Unopenable,
                reason: e.to_string(),
                cause: e.cause(),
            });
    }
}
