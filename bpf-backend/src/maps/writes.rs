//! How [`KernelMaps`] writes each [`MapOp`] (the module documentation of
//! [`crate::maps`] says what each op costs): the [`Backend`] and
//! [`OpTarget`] implementations, inner arrays created, filled through
//! their mapping and published in chunks.

use super::*;

fn failure(e: SysError) -> OpFailure {
    OpFailure::new(Errno(e.errno), e.processed)
}

/// Writes `deltas` into a new, mappable ARRAY as its mapping lays them
/// out: each value in a slot of its size rounded up to 8 bytes (the
/// kernel's `elem_size`), straight into the mapping, a window at a time.
fn write_mapped_values(fd: BorrowedFd<'_>, deltas: &[StackDelta]) -> Result<(), i32> {
    let stride = StackDelta::SIZE.next_multiple_of(8);
    // Windows are whole pages: a multiple of the 8-byte slots.
    sys::write_mapped(fd, deltas.len() * stride, |at, window| {
        let from = deltas.get(at / stride..).unwrap_or_default();
        for (slot, delta) in window.chunks_exact_mut(stride).zip(from) {
            delta.write(&mut slot[..StackDelta::SIZE]);
        }
    })
}

/// Every op is a run of writes of its own as well (so that an op applied
/// outside a plan, such as a process's mappings, is bracketed too); within
/// a plan's run the counter moves only at the plan's ends.
impl Backend for KernelMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        self.begin_writes();
        let result = ops::apply_to(self, op);
        self.end_writes();
        result
    }

    fn begin_writes(&mut self) {
        if let Some(counter) = &mut self.generation {
            counter.begin();
        }
    }

    fn end_writes(&mut self) {
        if let Some(counter) = &mut self.generation {
            counter.end();
        }
    }
}

/// Each kind of op as the syscalls on the real maps.
impl OpTarget for KernelMaps {
    fn put_unwind_infos(&mut self, infos: &[(u16, UnwindInfo)]) -> Result<(), OpFailure> {
        // The next owner's restart trusts this record to hand out zero
        // slots: it is written first, and without it the zeroing is not done
        // (the slot keeps its rule, which a restart treats as a rule to cool).
        if let Some(owner) = &mut self.owner {
            if infos.iter().any(|(_, info)| *info == UnwindInfo::default()) {
                owner
                    .record_slots_zeroed()
                    .map_err(|e| OpFailure::new(Errno(e.raw_os_error().unwrap_or(libc::EIO)), 0))?;
            }
        }
        let (keys, values) = ops::slot_buffers(infos);
        elements::update(
            self.config.write_mode,
            fd(&self.unwind_info),
            &keys,
            &values,
            infos.len(),
        )
        .map_err(failure)
    }

    fn put_delta_table(
        &mut self,
        file_id: FileId,
        class: u16,
        deltas: &[StackDelta],
    ) -> Result<(), OpFailure> {
        let fail = |errno: i32| OpFailure::new(Errno(errno), 0);
        let outer = self.outer(class).ok_or(fail(libc::EINVAL))?;
        let entries = abi::class_entries(class).ok_or(fail(libc::EINVAL))?;
        // `inner` is dropped on every path below: its fd closes, freeing
        // the array if it was not published.
        let inner = self.filled_array(entries, deltas).map_err(fail)?;
        let inner_id = (std::os::fd::AsRawFd::as_raw_fd(&inner) as u32).to_le_bytes();
        let published = sys::update_elem(
            fd(outer),
            &file_id.0.to_bytes(),
            &inner_id,
            sys::BPF_NOEXIST,
        );
        self.outer_updates += 1;
        published.map_err(|e| fail(e.errno))?;
        self.published.insert((class, file_id));
        Ok(())
    }

    fn put_delta_tables(
        &mut self,
        class: u16,
        tables: &[(FileId, std::sync::Arc<[StackDelta]>)],
    ) -> Result<(), OpFailure> {
        let fail = |errno: i32| OpFailure::new(Errno(errno), 0);
        let at = usize::from(
            class
                .checked_sub(SIZE_CLASS_MIN)
                .ok_or(fail(libc::EINVAL))?,
        );
        if at >= self.outers.len() {
            return Err(fail(libc::EINVAL));
        }
        let entries = abi::class_entries(class).ok_or(fail(libc::EINVAL))?;
        let absent = ops::noexist_prefix(tables.iter().map(|(id, _)| *id), |id| {
            self.published.contains(&(class, *id))
        });
        let mut done = 0;
        for chunk in tables.chunks(self.config.arrays_in_flight.max(1)) {
            self.publish_chunk(at, entries, chunk, absent - done)
                .map_err(|e| OpFailure::new(e.errno, done + e.done))?;
            done += chunk.len();
            if done >= absent {
                break;
            }
        }
        if absent < tables.len() {
            return Err(OpFailure::new(Errno::EEXIST, absent));
        }
        Ok(())
    }

    fn put_pages(
        &mut self,
        pages: &[(StackDeltaPageKey, StackDeltaPageInfo)],
    ) -> Result<(), OpFailure> {
        let absent = ops::noexist_prefix(pages.iter().map(|(k, _)| *k), |key| {
            self.page_keys.contains(key)
        });
        let prefix = &pages[..absent];
        let (keys, values) = ops::page_buffers(prefix);
        let written = elements::update(
            self.config.write_mode,
            fd(&self.pages),
            &keys,
            &values,
            prefix.len(),
        );
        let done = match &written {
            Ok(()) => prefix.len(),
            Err(e) => e.processed.min(prefix.len()),
        };
        self.page_keys
            .extend(prefix[..done].iter().map(|(k, _)| *k));
        written.map_err(failure)?;
        if absent < pages.len() {
            return Err(OpFailure::new(Errno::EEXIST, absent));
        }
        Ok(())
    }

    fn delete_pages(&mut self, keys: &[StackDeltaPageKey]) -> Result<(), OpFailure> {
        let flat = flatten(keys.iter().copied());
        let deleted = elements::delete(self.config.write_mode, fd(&self.pages), &flat, keys.len());
        let done = match &deleted {
            Ok(()) => keys.len(),
            Err(e) => e.processed.min(keys.len()),
        };
        for key in &keys[..done] {
            self.page_keys.remove(key);
        }
        deleted.map_err(failure)
    }

    fn delete_delta_table(&mut self, file_id: FileId, class: u16) -> Result<(), OpFailure> {
        let outer = self.outer(class).ok_or(OpFailure::new(Errno::EINVAL, 0))?;
        sys::delete_elem(fd(outer), &file_id.0.to_bytes())
            .map_err(|e| OpFailure::new(Errno(e.errno), 0))?;
        self.published.remove(&(class, file_id));
        Ok(())
    }

    fn put_interpreter_offsets(
        &mut self,
        file_id: FileId,
        range: &OffsetRange,
    ) -> Result<(), OpFailure> {
        sys::update_elem(
            fd(&self.interpreter_offsets),
            &file_id.0.to_bytes(),
            &range.to_bytes(),
            sys::BPF_ANY,
        )
        .map_err(|e| OpFailure::new(Errno(e.errno), 0))
    }

    fn delete_interpreter_offsets(&mut self, file_id: FileId) -> Result<(), OpFailure> {
        sys::delete_elem(fd(&self.interpreter_offsets), &file_id.0.to_bytes())
            .map_err(|e| OpFailure::new(Errno(e.errno), 0))
    }

    fn put_process_mappings(
        &mut self,
        pid: u32,
        mappings: &ProcessMappings,
    ) -> Result<(), OpFailure> {
        sys::update_elem(
            fd(&self.process_mappings),
            &pid.to_bytes(),
            &mappings.to_bytes(),
            sys::BPF_ANY,
        )
        .map_err(|e| OpFailure::new(Errno(e.errno), 0))
    }

    fn delete_process_mappings(&mut self, pid: u32) -> Result<(), OpFailure> {
        sys::delete_elem(fd(&self.process_mappings), &pid.to_bytes())
            .map_err(|e| OpFailure::new(Errno(e.errno), 0))
    }
}

impl KernelMaps {
    /// A new inner ARRAY of `entries` elements holding `deltas` from index
    /// 0, not yet published; `Err(errno)` if it cannot be created or
    /// filled (the array is then freed with its fd).
    fn filled_array(&self, entries: u32, deltas: &[StackDelta]) -> Result<OwnedFd, i32> {
        let count = u32::try_from(deltas.len()).map_err(|_| libc::E2BIG)?;
        if count > entries {
            return Err(libc::E2BIG);
        }
        let inner = sys::map_create(&sys::MapSpec {
            map_type: sys::map_type::ARRAY,
            key_size: u32::SIZE as u32,
            value_size: StackDelta::SIZE as u32,
            max_entries: entries,
            // The outer maps' templates are mappable (bpf/eim_maps.h).
            map_flags: sys::BPF_F_MMAPABLE,
            inner_map: None,
            name: "eim_deltas",
        })
        .map_err(|e| e.errno)?;
        match self.config.write_mode {
            // Not yet published: no reader sees the array while it fills.
            WriteMode::Batch => write_mapped_values(inner.as_fd(), deltas)?,
            WriteMode::PerElement => {
                let keys = flatten(0..count);
                let values = flatten(deltas.iter().copied());
                elements::update(
                    WriteMode::PerElement,
                    inner.as_fd(),
                    &keys,
                    &values,
                    deltas.len(),
                )
                .map_err(|e| e.errno)?;
            }
        }
        Ok(inner)
    }

    /// Update calls issued on outer maps so far (single or batch; each
    /// waits for one RCU grace period).
    pub fn outer_updates(&self) -> u64 {
        self.outer_updates
    }

    /// Creates and fills the inner array of every table of `chunk`, then
    /// publishes the first `absent` (at most all) with one update of the
    /// outer map `at`, and closes every array's fd: the published ones live
    /// on through the outer map, the others are freed. A failed create or
    /// fill publishes nothing; `done` of a failed publish is the kernel's
    /// processed count.
    fn publish_chunk(
        &mut self,
        at: usize,
        entries: u32,
        chunk: &[(FileId, std::sync::Arc<[StackDelta]>)],
        absent: usize,
    ) -> Result<(), OpFailure> {
        let fail = |errno: i32| OpFailure::new(Errno(errno), 0);
        let class = SIZE_CLASS_MIN + at as u16;
        // On any failure the arrays created so far are dropped: their fds
        // close and they are freed.
        let mut created = Vec::with_capacity(chunk.len());
        for (_, deltas) in chunk {
            created.push(self.filled_array(entries, deltas).map_err(fail)?);
        }
        let absent = absent.min(chunk.len());
        let keys = flatten(chunk[..absent].iter().map(|(id, _)| id.0));
        let values = flatten(
            created[..absent]
                .iter()
                .map(|inner| std::os::fd::AsRawFd::as_raw_fd(inner) as u32),
        );
        self.outer_updates += match self.config.write_mode {
            WriteMode::Batch => u64::from(absent > 0),
            WriteMode::PerElement => absent as u64,
        };
        let published = elements::update(
            self.config.write_mode,
            fd(&self.outers[at]),
            &keys,
            &values,
            absent,
        );
        let done = match &published {
            Ok(()) => absent,
            Err(e) => e.processed.min(absent),
        };
        self.published
            .extend(chunk[..done].iter().map(|(file_id, _)| (class, *file_id)));
        // `created` drops here: no descriptor outlives the publication.
        published.map_err(failure)
    }
}
