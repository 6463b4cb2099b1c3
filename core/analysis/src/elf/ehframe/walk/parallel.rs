//! The parallel walk of a big search table: chunks walked from the back
//! by helper threads while the walk's own thread walks them from the
//! front, a helper's chunk taken over only where that gives exactly what
//! the sequential walk gives.

use std::collections::hash_map::Entry;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::record::FdeRange;
use super::super::CfiError;
use super::super::{ForkFilter, Parallelism};
use super::{
    is_sigreturn_trampoline, sigreturn_code, CieCache, Code, Emitter, Hdr, Table, Walker,
    MAX_PARALLEL_SECTION_BYTES,
};
use crate::elf::{Arch, Region};
use crate::sync::{
    lock, on_helpers, wait_until, Arc, AtomicBool, AtomicU8, AtomicUsize, Condvar, Job, Mutex,
};
use eim_machine::deltas::Detached;

/// Parts walked again (`[0]`) and taken over (`[1]`), for the tests.
#[cfg(test)]
pub(crate) static PARTS_TAKEN_OVER: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(0),
    std::sync::atomic::AtomicUsize::new(0),
];

/// What walking one part of the search table on its own thread gave.
struct PartResult<F> {
    /// The filter state the part was walked from (a guess).
    start: F,
    /// The filter state it ended in.
    end: F,
    result: Result<(), CfiError>,
    deltas: Detached,
    cies: CieCache,
    parsed: u64,
    /// FDE starts of a trampoline's length the helper could not check.
    trampolines: Vec<u64>,
}

/// A chunk's state in a parallel walk.
const FREE: u8 = 0;
const MAIN: u8 = 1;
const HELPER: u8 = 2;

/// What a helper left for a chunk it claimed.
enum Slot<F> {
    Pending,
    /// The helper stopped without walking it.
    Abandoned,
    Walked(Box<PartResult<F>>),
}

/// The chunks helpers walked, by chunk, and a signal for each one stored.
struct Mailbox<F> {
    slots: Mutex<Vec<Slot<F>>>,
    stored: Condvar,
}

impl<F> Mailbox<F> {
    fn put(&self, chunk: usize, slot: Slot<F>) {
        let mut slots = lock(&self.slots);
        if let Some(at) = slots.get_mut(chunk) {
            *at = slot;
        }
        self.stored.notify_all();
    }

    /// Waits, at most `patience`, for what the helper that claimed `chunk`
    /// leaves for it.
    fn take(&self, chunk: usize, patience: Duration) -> Option<PartResult<F>> {
        let deadline = Instant::now() + patience;
        let mut slots = lock(&self.slots);
        loop {
            match slots
                .get_mut(chunk)
                .map(|at| std::mem::replace(at, Slot::Pending))
            {
                None | Some(Slot::Abandoned) => return None,
                Some(Slot::Walked(part)) => return Some(*part),
                Some(Slot::Pending) => {}
            }
            slots = wait_until(&self.stored, slots, deadline)?;
        }
    }
}

/// Marks a claimed chunk abandoned if its helper stops (returns early or
/// unwinds) without storing it.
struct Promise<'m, F> {
    mailbox: &'m Mailbox<F>,
    chunk: usize,
    kept: bool,
}

impl<F> Promise<'_, F> {
    fn keep(mut self, part: PartResult<F>) {
        self.kept = true;
        self.mailbox.put(self.chunk, Slot::Walked(Box::new(part)));
    }
}

impl<F> Drop for Promise<'_, F> {
    fn drop(&mut self) {
        if !self.kept {
            self.mailbox.put(self.chunk, Slot::Abandoned);
        }
    }
}

/// What the helpers of one parallel walk share with it. Helpers are
/// long-lived threads ([`on_helpers`]), so they get owned copies of the two
/// sections, never a borrow: the walk can return without waiting for a
/// helper that has not started (a busy machine).
struct Shared<F> {
    eh: Vec<u8>,
    eh_vaddr: u64,
    hdr: Vec<u8>,
    hdr_vaddr: u64,
    bounds: Vec<u64>,
    held: u64,
    arch: Arch,
    allow_generic_regs: bool,
    budget: u64,
    capacity: usize,
    claims: Vec<AtomicU8>,
    next_from_back: AtomicUsize,
    /// The filter state guessed at the start of each chunk.
    guesses: Mutex<Vec<Option<F>>>,
    mailbox: Mailbox<F>,
    /// Set when the walk no longer needs the helpers.
    cancel: AtomicBool,
}

impl<F: ForkFilter> Shared<F> {
    /// A helper's side: chunks from the back, each into a detached run,
    /// until it meets the walk's own thread.
    fn help(&self) {
        let eh = Region {
            vaddr: self.eh_vaddr,
            data: &self.eh,
        };
        let hdr = Region {
            vaddr: self.hdr_vaddr,
            data: &self.hdr,
        };
        while let Ok(previous) =
            self.next_from_back
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
        {
            let chunk = previous - 1;
            let claimed = self.claims.get(chunk).is_some_and(|claim| {
                claim
                    .compare_exchange(FREE, HELPER, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
            if !claimed || self.cancel.load(Ordering::Relaxed) {
                return;
            }
            let promise = Promise {
                mailbox: &self.mailbox,
                chunk,
                kept: false,
            };
            let start = lock(&self.guesses).get_mut(chunk).and_then(Option::take);
            let (Some(start), Some(&from), Some(&to)) =
                (start, self.bounds.get(chunk), self.bounds.get(chunk + 1))
            else {
                return;
            };
            let mut filter = start.clone();
            let mut deltas = Detached::with_capacity(self.capacity);
            let mut walker = Walker {
                cies: CieCache::default(),
                out: Emitter {
                    arch: self.arch,
                    code: Code::Deferred {
                        arch: self.arch,
                        candidates: Vec::new(),
                    },
                    allow_generic_regs: self.allow_generic_regs,
                    filter: &mut filter,
                    deltas: &mut deltas,
                },
                parsed: 0,
                budget: self.budget,
            };
            let result = Table::new(&Hdr::Held(hdr)).and_then(|mut table| {
                table.seek(from);
                walker.walk_entries(&mut table, &eh, from..to, self.held, Some(&self.cancel))
            });
            let Walker {
                cies, parsed, out, ..
            } = walker;
            let trampolines = match out.code {
                Code::Deferred { candidates, .. } => candidates,
                Code::File(_) => Vec::new(),
            };
            promise.keep(PartResult {
                start,
                end: filter,
                result,
                deltas,
                cies,
                parsed,
                trampolines,
            });
        }
    }
}

impl<F: ForkFilter> Walker<'_, '_, F> {
    /// The search-table walk cut into chunks: this thread walks them in
    /// order from the front, into the real list; helper threads walk them
    /// from the back, each from a guessed filter state into a [`Detached`]
    /// run, until the two meet. A helper's chunk is taken over only where
    /// that gives exactly what walking it here gives (same filter state at
    /// its start, the run attaches, the same CIEs, the work budget holds,
    /// no signal trampoline among the FDEs it could not check); any other
    /// (a wrong guess, an error) is walked again here, which is the
    /// sequential walk by definition.
    pub(super) fn walk_table_parallel(
        &mut self,
        hdr: &Hdr<'_>,
        eh: &Region<'_>,
        parallelism: Parallelism,
        reserve: usize,
    ) -> Result<(), CfiError> {
        let mut table = Table::new(hdr)?;
        let (held, count) = (table.held(), table.count);
        // A table read a window at a time is too big to copy: walked here.
        let Hdr::Held(hdr) = hdr else {
            return self.walk_entries(&mut table, eh, 0..count, held, None);
        };
        let chunks = parallelism.chunks(count);
        let copies = eh.data.len().saturating_add(hdr.data.len());
        if chunks <= 1 || held < count || copies > MAX_PARALLEL_SECTION_BYTES {
            return self.walk_entries(&mut table, eh, 0..count, held, None);
        }
        // `count <= held` entries of 8 bytes: no overflow.
        let bounds: Vec<u64> = (0..=chunks).map(|i| count * i / chunks).collect();
        let chunks = chunks as usize;
        let mut guesses = Vec::with_capacity(chunks);
        guesses.push(None);
        for &from in &bounds[1..chunks] {
            table.seek(from - 1);
            let (last_ip, _) = table.next()?;
            guesses.push(Some(self.out.filter.fork(last_ip)));
        }
        let claims: Vec<AtomicU8> = (0..chunks).map(|_| AtomicU8::new(FREE)).collect();
        // Chunk 0 is always walked here.
        claims[0].store(MAIN, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            eh: eh.data.to_vec(),
            eh_vaddr: eh.vaddr,
            hdr: hdr.data.to_vec(),
            hdr_vaddr: hdr.vaddr,
            bounds,
            held,
            arch: self.out.arch,
            allow_generic_regs: self.out.allow_generic_regs,
            budget: self.budget,
            capacity: reserve / chunks,
            claims,
            next_from_back: AtomicUsize::new(chunks),
            guesses: Mutex::new(guesses),
            mailbox: Mailbox {
                slots: Mutex::new((0..chunks).map(|_| Slot::Pending).collect()),
                stored: Condvar::new(),
            },
            cancel: AtomicBool::new(false),
        });
        on_helpers((1..parallelism.threads).map(|_| {
            let shared = Arc::clone(&shared);
            Box::new(move || shared.help()) as Job
        }));
        let walked = self.walk_chunks(&mut table, eh, &shared);
        // Whatever a helper still walks is not needed any more.
        shared.cancel.store(true, Ordering::Relaxed);
        walked
    }

    /// This thread's side of [`Walker::walk_table_parallel`]: every chunk
    /// in order, walked here unless a helper has claimed it. A claimed
    /// chunk is waited for at most as long as walking one here takes: a
    /// helper slowed down by other work is overtaken (its chunk walked
    /// here too), so the walk is never much slower than a sequential one.
    fn walk_chunks(
        &mut self,
        table: &mut Table<'_>,
        eh: &Region<'_>,
        shared: &Shared<F>,
    ) -> Result<(), CfiError> {
        let bounds = &shared.bounds;
        let mut per_chunk = Duration::ZERO;
        for (chunk, claim) in shared.claims.iter().enumerate() {
            let mine = chunk == 0
                || claim
                    .compare_exchange(FREE, MAIN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
            if !mine {
                if let Some(part) = shared.mailbox.take(chunk, per_chunk) {
                    if self.take_over(part) {
                        continue;
                    }
                }
            }
            let started = Instant::now();
            table.seek(bounds[chunk]);
            self.walk_entries(
                table,
                eh,
                bounds[chunk]..bounds[chunk + 1],
                shared.held,
                None,
            )?;
            per_chunk = per_chunk.max(started.elapsed());
        }
        Ok(())
    }

    /// Adds a part walked on its own to this walk if that gives exactly
    /// what walking it here would; else changes nothing and says so.
    fn take_over(&mut self, part: PartResult<F>) -> bool {
        let taken = self.try_take_over(part);
        #[cfg(test)]
        PARTS_TAKEN_OVER[usize::from(taken)].fetch_add(1, Ordering::Relaxed);
        taken
    }

    fn try_take_over(&mut self, part: PartResult<F>) -> bool {
        if part.result.is_err() || !self.out.filter.same_state(&part.start) {
            return false;
        }
        if let Code::File(code) = self.out.code {
            let want = sigreturn_code(code.arch).len() as u64;
            let range = |start| FdeRange { start, len: want };
            if part
                .trampolines
                .iter()
                .any(|&start| is_sigreturn_trampoline(code, range(start)))
            {
                return false;
            }
        }
        // A CIE already parsed here must have parsed the same there (a
        // CIE read through a different FDE may differ in broken files);
        // the ones new here count towards the budget as they would have.
        let mut new_cie_bytes = 0u64;
        for (&pos, &at) in &part.cies.index {
            let theirs = part.cies.cies.get(at);
            match self.cies.index.get(&pos) {
                Some(&mine) if self.cies.cies.get(mine) != theirs => return false,
                Some(_) => {}
                None => new_cie_bytes += theirs.map_or(0, |c| c.size),
            }
        }
        let total = self
            .parsed
            .saturating_add(part.parsed)
            .saturating_add(self.cies.parsed)
            .saturating_add(new_cie_bytes);
        if total > self.budget || !part.deltas.attach_to(self.out.deltas) {
            return false;
        }
        self.out.filter.join(part.end);
        self.parsed = self.parsed.saturating_add(part.parsed);
        for (pos, at) in part.cies.index {
            if let (Entry::Vacant(slot), Some(cie)) =
                (self.cies.index.entry(pos), part.cies.cies.get(at))
            {
                self.cies.cies.push(*cie);
                slot.insert(self.cies.cies.len() - 1);
                self.cies.parsed = self.cies.parsed.saturating_add(cie.size);
            }
        }
        true
    }
}
