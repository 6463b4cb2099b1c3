//! The pin directory's generation counter: a seqlock between the owner,
//! which writes the maps, and readers in other processes (`eim status`,
//! `eim lookup --pinned`), which must not take a view that spans a change.
//!
//! # Protocol
//!
//! The counter is the one u64 of a one-element, mappable ARRAY pinned as
//! [`NAME`] beside the maps (`docs/MAP_ABI.md`). The owner maps it and
//! stores to it directly (no syscall, so the counted `bpf()` calls of an
//! op are what they were):
//!
//! * before a run of writes that a reader must see whole or not at all (a
//!   plan and, when it failed half-way, its rollback; a single op of the
//!   host's process mappings; a start's cleaning) it makes the counter odd
//!   ([`next_odd`]: `+1` from even, `+2` from odd, so that a counter left
//!   odd by an owner that died mid-write still changes);
//! * after it, whatever the writes gave, it makes it even (`+1`).
//!
//! Runs do not interleave: the owner is one process, and its map writes
//! hold the manager's kernel lock. A reader ([`read_consistent`]) reads the
//! counter, reads the maps, and reads the counter again: the view is
//! consistent only if both were the same even value. Otherwise (odd: a run
//! is in progress; changed; or a map that vanished mid-read, which only a
//! change can do) it pauses and tries again, a bounded number of times,
//! and then says what it has: the last whole read marked torn, or nothing.
//!
//! An owner that writes back to back (one unload after another, each an
//! RCU wait long) leaves even windows of microseconds, shorter than any
//! read. So a reader asks for a window: it holds the pin directory's
//! readers' file ([`crate::lock::readers_file`]) shared around each
//! attempt, and the owner, before each run, waits while it is held, at
//! most [`READER_WINDOW`]; a reader that overstays it is not waited for
//! again for [`READER_COOLDOWN`], so a stuck reader slows the owner by at
//! most 5 %.
//!
//! A published inner array is never written (eim fills an array before it
//! publishes it), so what a reader read of one, by its map id, stays true
//! as long as that id is published: the readers keep it across attempts
//! and a retry reads only arrays published since.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

use std::io;
use std::path::Path;

use crate::error::KernelError;
use crate::pin::{MapShape, PinState};
use crate::sys::{self, SysError};

/// The pin's name.
pub const NAME: &str = eim_machine::abi::map_name::GENERATION;

/// The counter's map: a one-element ARRAY of one u64, mappable.
pub fn shape() -> MapShape {
    MapShape {
        map_type: sys::map_type::ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: 1,
        inner_entries: None,
        required_flags: sys::BPF_F_MMAPABLE,
    }
}

/// The odd value that starts a run of writes after `current`.
pub fn next_odd(current: u64) -> u64 {
    if current.is_multiple_of(2) {
        current.wrapping_add(1)
    } else {
        current.wrapping_add(2)
    }
}

/// The owner's counter: the map, and its value mapped writable.
#[derive(Debug)]
pub struct Generation {
    fd: OwnedFd,
    value: NonNull<AtomicU64>,
    mapped: usize,
    /// Runs begun and not ended (nested runs bump the counter once).
    depth: u32,
    /// The pin directory's readers' file ([`crate::lock`]): a reader that
    /// holds it shared is asking for a window between two runs.
    readers: Option<std::fs::File>,
    /// After a reader kept the window longer than [`READER_WINDOW`], runs
    /// do not wait for readers again until then.
    ignore_readers_until: Option<std::time::Instant>,
}

/// The longest a run waits for a reader that asked for a window.
pub const READER_WINDOW: Duration = Duration::from_millis(50);
/// How long runs go on without waiting after a reader overstayed.
pub const READER_COOLDOWN: Duration = Duration::from_secs(1);

// SAFETY: the mapping is owned by this value alone (unmapped on drop) and
// only touched through atomics.
unsafe impl Send for Generation {}

impl Generation {
    /// A fresh counter (0), not pinned.
    pub fn create() -> Result<Self, SysError> {
        let spec = shape();
        let fd = sys::map_create(&sys::MapSpec {
            map_type: spec.map_type,
            key_size: spec.key_size,
            value_size: spec.value_size,
            max_entries: spec.max_entries,
            map_flags: spec.required_flags,
            inner_map: None,
            name: "eim_generation",
        })?;
        Self::adopt(fd)
    }

    /// The counter of an existing map of [`shape`] (a pin re-opened), its
    /// value kept.
    pub fn adopt(fd: OwnedFd) -> Result<Self, SysError> {
        let fail = |errno| SysError {
            cmd: sys::Cmd::MapUpdateElem,
            errno,
            processed: 0,
        };
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // SAFETY: a new shared mapping of the array's first value page,
        // which the kernel checks against the array's size; only this
        // value uses it, and unmaps it on drop.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(fail(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            ));
        }
        let value = NonNull::new(at.cast::<AtomicU64>()).ok_or_else(|| fail(libc::EFAULT))?;
        Ok(Self {
            fd,
            value,
            mapped: page,
            depth: 0,
            readers: None,
            ignore_readers_until: None,
        })
    }

    fn cell(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page-aligned, at least 8 bytes, and lives
        // as long as `self`.
        unsafe { self.value.as_ref() }
    }

    /// The counter now.
    pub fn value(&self) -> u64 {
        self.cell().load(Ordering::SeqCst)
    }

    /// The map, to pin it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Gives readers who ask for a window (a shared lock on `readers`)
    /// one before each run, at most [`READER_WINDOW`].
    pub fn yield_to_readers(&mut self, readers: std::fs::File) {
        self.readers = Some(readers);
    }

    /// Waits while a reader holds the window, at most [`READER_WINDOW`]
    /// (and not at all during a cooldown after a reader overstayed).
    fn wait_for_window(&mut self) {
        let Some(readers) = &self.readers else {
            return;
        };
        let started = std::time::Instant::now();
        if self.ignore_readers_until.is_some_and(|t| started < t) {
            return;
        }
        loop {
            // SAFETY: flock on a descriptor this value owns.
            if unsafe { libc::flock(readers.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                // SAFETY: as above.
                unsafe { libc::flock(readers.as_raw_fd(), libc::LOCK_UN) };
                return;
            }
            if started.elapsed() >= READER_WINDOW {
                self.ignore_readers_until = Some(started + READER_COOLDOWN);
                return;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// A run of writes starts (see the module notes).
    pub fn begin(&mut self) {
        if self.depth == 0 {
            self.wait_for_window();
            let cell = self.cell();
            cell.store(next_odd(cell.load(Ordering::SeqCst)), Ordering::SeqCst);
            // The odd value is visible before any write of the run.
            fence(Ordering::SeqCst);
        }
        self.depth = self.depth.saturating_add(1);
    }

    /// The run ends.
    pub fn end(&mut self) {
        match self.depth {
            0 => {}
            1 => {
                self.depth = 0;
                // Every write of the run is visible before the even value.
                fence(Ordering::SeqCst);
                let cell = self.cell();
                let now = cell.load(Ordering::SeqCst);
                if !now.is_multiple_of(2) {
                    cell.store(now.wrapping_add(1), Ordering::SeqCst);
                }
            }
            _ => self.depth -= 1,
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once.
        unsafe { libc::munmap(self.value.as_ptr().cast(), self.mapped) };
    }
}

/// The counter's value, read through `fd` (a reader's read-only fd of the
/// pin): one lookup.
pub fn read(fd: BorrowedFd<'_>) -> Result<u64, SysError> {
    let value = sys::lookup_elem(fd, &0u32.to_le_bytes(), 8)?.unwrap_or_default();
    let bytes: [u8; 8] = value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; 8]);
    Ok(u64::from_le_bytes(bytes))
}

/// How long a reader keeps trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patience {
    pub attempts: u32,
    /// The pause after the first failed attempt, doubled after each
    /// other, up to `longest_pause`.
    pub first_pause: Duration,
    pub longest_pause: Duration,
    /// While the counter is odd at an attempt's start, how many times it
    /// is read again, [`EVEN_POLL`] apart, before the attempt counts as
    /// failed (the run in progress ends; with the window taken, no other
    /// starts meanwhile).
    pub even_polls: u32,
}

/// The pause between two reads of an odd counter.
pub const EVEN_POLL: Duration = Duration::from_millis(1);

impl Patience {
    /// What `eim status` and `eim lookup --pinned` use: 60 attempts, 1 ms
    /// then doubling up to 100 ms (about 5.4 s of pauses in all).
    pub const READERS: Self = Self {
        attempts: 60,
        first_pause: Duration::from_millis(1),
        longest_pause: Duration::from_millis(100),
        even_polls: 200,
    };

    /// The pause after failed attempt `n` (from 1).
    pub fn pause(&self, n: u32) -> Duration {
        let doubled = self
            .first_pause
            .checked_mul(1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX))
            .unwrap_or(self.longest_pause);
        doubled.min(self.longest_pause)
    }
}

/// What one attempt of a read gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt<T> {
    Read(T),
    /// Something vanished under the read (an inner array's id, a key
    /// between listing and lookup): a change.
    Changed,
}

/// What [`read_consistent`] gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Snapshot<T> {
    /// Read entirely within one even generation.
    Consistent {
        value: T,
        generation: u64,
        attempts: u32,
    },
    /// Every attempt overlapped a change: the last whole read.
    Torn { value: T, attempts: u32 },
}

impl<T> Snapshot<T> {
    pub fn value(&self) -> &T {
        match self {
            Self::Consistent { value, .. } | Self::Torn { value, .. } => value,
        }
    }

    pub fn into_value(self) -> T {
        match self {
            Self::Consistent { value, .. } | Self::Torn { value, .. } => value,
        }
    }

    pub fn attempts(&self) -> u32 {
        match self {
            Self::Consistent { attempts, .. } | Self::Torn { attempts, .. } => *attempts,
        }
    }

    pub fn is_consistent(&self) -> bool {
        matches!(self, Self::Consistent { .. })
    }
}

/// Why [`read_consistent`] has nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError<E> {
    /// `generation` or `read` failed.
    Failed(E),
    /// No attempt got a whole read: the owner was writing, or maps
    /// vanished, every time.
    NoRead { attempts: u32, waited: Duration },
}

/// Reads through `read` until a read falls within one even value of
/// `generation` (see the module notes), pausing with `pause` between
/// attempts as `patience` says.
/// `window(true)` is called before each attempt and `window(false)` after
/// it: the reader asks the owner for a window there ([`Generation`]
/// waits, bounded, before its next run while one is asked for).
pub fn read_consistent<T, E>(
    mut generation: impl FnMut() -> Result<u64, E>,
    mut read: impl FnMut() -> Result<Attempt<T>, E>,
    patience: Patience,
    mut pause: impl FnMut(Duration),
    mut window: impl FnMut(bool),
) -> Result<Snapshot<T>, ReadError<E>> {
    let mut last = None;
    let mut waited = Duration::ZERO;
    for n in 1..=patience.attempts.max(1) {
        if n > 1 {
            let p = patience.pause(n - 1);
            waited += p;
            pause(p);
        }
        window(true);
        let attempt = (|| {
            let mut before = generation()?;
            for _ in 0..patience.even_polls {
                if before.is_multiple_of(2) {
                    break;
                }
                pause(EVEN_POLL);
                before = generation()?;
            }
            if !before.is_multiple_of(2) {
                return Ok(None);
            }
            let Attempt::Read(value) = read()? else {
                return Ok(None);
            };
            Ok(Some((value, before, generation()?)))
        })();
        window(false);
        match attempt.map_err(ReadError::Failed)? {
            Some((value, before, after)) if after == before => {
                return Ok(Snapshot::Consistent {
                    value,
                    generation: before,
                    attempts: n,
                })
            }
            Some((value, _, _)) => last = Some(value),
            None => {}
        }
    }
    let attempts = patience.attempts.max(1);
    match last {
        Some(value) => Ok(Snapshot::Torn { value, attempts }),
        None => Err(ReadError::NoRead { attempts, waited }),
    }
}

/// The owner's generation counter of `dir` (this module), as
/// [`crate::pin::check_pins`] found its pin (in `states`): re-opened with its value
/// kept, or created afresh and pinned (nothing there, or unpinned for
/// another shape). A directory an older eim pinned has no counter: it gets
/// one, and the other pins are untouched.
pub fn open_pinned(dir: &Path, states: &[(String, PinState)]) -> Result<Generation, KernelError> {
    let path = dir.join(NAME);
    let errno = |what, e: sys::SysError| {
        crate::pin::pin_error(&path, what, io::Error::from_raw_os_error(e.errno))
    };
    let reopened = states
        .iter()
        .any(|(name, state)| name == NAME && *state == PinState::Reopened);
    if reopened {
        let fd = sys::obj_get(&path).map_err(|e| errno("opening the pin", e))?;
        return Generation::adopt(fd).map_err(|e| errno("mapping the generation counter of", e));
    }
    let counter =
        Generation::create().map_err(|e| errno("creating the generation counter for", e))?;
    sys::obj_pin(counter.fd(), &path).map_err(|e| errno("pinning", e))?;
    Ok(counter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    const QUICK: Patience = Patience {
        attempts: 5,
        first_pause: Duration::from_millis(1),
        longest_pause: Duration::from_millis(3),
        even_polls: 0,
    };

    /// A reader against a scripted counter: each call of `generation` gives
    /// the next value of `counter`, each read the next of `reads`.
    fn scripted(
        counter: &[u64],
        reads: &[Attempt<&'static str>],
    ) -> (Result<Snapshot<&'static str>, ReadError<()>>, Vec<Duration>) {
        let at = Cell::new(0);
        let r = Cell::new(0);
        let pauses = RefCell::new(Vec::new());
        let out = read_consistent(
            || {
                let v = counter.get(at.get()).copied().ok_or(())?;
                at.set(at.get() + 1);
                Ok(v)
            },
            || {
                let v = reads.get(r.get()).cloned().ok_or(())?;
                r.set(r.get() + 1);
                Ok(v)
            },
            QUICK,
            |p| pauses.borrow_mut().push(p),
            |_| {},
        );
        (out, pauses.into_inner())
    }

    #[test]
    fn a_read_within_one_even_generation_is_consistent_at_once() {
        let (out, pauses) = scripted(&[4, 4], &[Attempt::Read("a")]);
        assert_eq!(
            out,
            Ok(Snapshot::Consistent {
                value: "a",
                generation: 4,
                attempts: 1
            })
        );
        assert!(pauses.is_empty());
    }

    #[test]
    fn a_read_that_spans_a_change_or_starts_odd_or_meets_a_vanished_map_is_retried() {
        // Changed under the first read; odd at the second; a vanished map
        // at the third; the fourth is whole.
        let (out, pauses) = scripted(
            &[4, 6, 7, 8, 8, 8],
            &[Attempt::Read("torn"), Attempt::Changed, Attempt::Read("b")],
        );
        assert_eq!(
            out,
            Ok(Snapshot::Consistent {
                value: "b",
                generation: 8,
                attempts: 4
            })
        );
        assert_eq!(
            pauses,
            [1, 2, 3].map(Duration::from_millis),
            "doubling, capped"
        );
    }

    #[test]
    fn when_every_attempt_spans_a_change_the_last_whole_read_is_marked_torn() {
        let (out, pauses) = scripted(
            &[0, 2, 2, 4, 4, 6, 6, 8, 8, 10],
            &[
                Attempt::Read("1"),
                Attempt::Read("2"),
                Attempt::Read("3"),
                Attempt::Read("4"),
                Attempt::Read("5"),
            ],
        );
        assert_eq!(
            out,
            Ok(Snapshot::Torn {
                value: "5",
                attempts: 5
            })
        );
        assert_eq!(pauses.len(), 4);
    }

    #[test]
    fn an_owner_writing_throughout_gives_no_read_and_says_how_long_it_waited() {
        let (out, _) = scripted(&[1, 3, 5, 7, 9], &[]);
        assert_eq!(
            out,
            Err(ReadError::NoRead {
                attempts: 5,
                waited: Duration::from_millis(1 + 2 + 3 + 3)
            })
        );
    }

    #[test]
    fn a_failing_counter_or_read_is_an_error_not_a_retry() {
        let (out, _) = scripted(&[], &[]);
        assert_eq!(out, Err(ReadError::Failed(())));
        let (out, _) = scripted(&[2], &[]);
        assert_eq!(out, Err(ReadError::Failed(())));
    }

    #[test]
    fn runs_start_odd_and_end_even_and_a_counter_left_odd_still_changes() {
        assert_eq!(next_odd(0), 1);
        assert_eq!(next_odd(6), 7);
        // An owner died mid-write: the next run's start is another value.
        assert_eq!(next_odd(7), 9);
        assert_eq!(next_odd(u64::MAX - 1), u64::MAX);
    }

    #[test]
    fn pauses_double_up_to_the_longest() {
        let p = Patience::READERS;
        assert_eq!(p.pause(1), Duration::from_millis(1));
        assert_eq!(p.pause(4), Duration::from_millis(8));
        assert_eq!(p.pause(8), Duration::from_millis(100));
        assert_eq!(p.pause(200), Duration::from_millis(100));
    }
}
