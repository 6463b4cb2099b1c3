//! One owner per pin directory: an exclusive `flock` on a lock file that
//! lives outside the pin directory, held for as long as the maps are.
//!
//! # Why a lock file elsewhere
//!
//! A lock on the pin directory itself would be taken on whatever inode the
//! path names at that moment: before a bpffs is mounted there, the
//! underlying directory; after, the bpffs root. Two racing starts could
//! then each lock a different inode and both go on. A bpffs cannot hold a
//! regular file either, so the lock cannot live inside it. The lock file is
//! therefore in [`LOCK_DIR`] (or [`FALLBACK_LOCK_DIR`] on a system without
//! `/run`), named after the pin directory's resolved absolute path
//! ([`lock_name`]), and it is locked **before** the pin directory is
//! created, mounted or read.
//!
//! # Who holds it
//!
//! A start that finds the lock taken names the holder's pid. The pid is
//! read from `/proc/locks` by the lock file's device and inode: the kernel
//! writes that line when the lock is taken and drops it when the holder's
//! last descriptor closes, so it cannot be stale or half-written, which the
//! pid the owner also writes into the file (for a person running `cat`) can
//! be while an owner is starting. Only when `/proc/locks` has no line (no
//! `/proc`) is the file's pid used. If the holder is gone between the
//! failed lock and the look-up, the lock is simply tried again.
//!
//! # Safety of the lock directory
//!
//! eim runs as root, and a file it creates by name in a directory another
//! user can write could be a symlink planted there. The lock directory is
//! therefore opened without following a symlink and used only if it is
//! owned by root (or by this user) and writable by no one else; the lock
//! file is opened under it with `O_NOFOLLOW | O_NONBLOCK` and must be a
//! regular file.
//!
//! # Readers
//!
//! A reader (`eim status`, `eim lookup --pinned`) never takes the owner's
//! lock for longer than a probe, and never makes a running owner wait:
//! [`read_lock`] asks for a **shared** lock on the lock file without
//! waiting and lets go of it at once. Refused, an owner holds the
//! directory, and the reader reads the live maps without a lock, within
//! one generation of the owner's writes ([`crate::generation`]), and names
//! the owner. Granted, no owner runs, and the reader takes a shared lock
//! on the directory's **readers' file** (the lock file's name with
//! `.readers` for `.lock`), which it holds while it reads and lets go of
//! before it prints ([`crate::pinned::PinnedReader::release`]).
//!
//! An owner that starts takes its exclusive lock (a reader's probe on it
//! lasts microseconds: the start tries again every [`READER_POLL`]), then
//! waits for the readers' file to be free, so that it does not clean or
//! replace maps under a reader's feet: it says so on stderr (`waiting for
//! reader pid N of DIR`) and waits at most [`READER_WAIT`]. A reader holds
//! that lock only while it reads, with bounded retries, so this is more
//! than a reader takes; a reader that holds it longer is stuck (stopped,
//! say), and the owner then starts anyway, saying so: a reader is never a
//! reason to refuse a start, and a reader still reading sees the owner's
//! writes change the generation and reads again. Only another owner
//! refuses a start. (A reader of an eim from before the readers' file held
//! the lock file itself, shared, while it read: a start waits for it as
//! long, then is refused as before.)
//!
//! Lock files and readers' files are made 0600: only root reads the maps,
//! and a file others can open is a lock any user could hold.
//!
//! # A refused directory leaves no lock file
//!
//! A start refused after it took the lock (a directory that is not a
//! bpffs and may not get one, say) removes the lock file if it was empty
//! when taken (so no earlier owner's record is lost), while it still holds
//! it and after everything else is undone: a start that had opened the
//! same file meanwhile finds it unlinked once it gets the lock, and tries
//! again with a new file (as it does whenever the file it locked is no
//! longer the one named).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::path_io::{io_error, PathIoError};

/// Where the lock files live.
pub const LOCK_DIR: &str = "/run/eim";
/// Where they live when `/run` is not a directory: a root-owned place that
/// exists on every Linux file-system layout (stale files there are
/// harmless: a lock lives in the kernel, not in the file).
pub const FALLBACK_LOCK_DIR: &str = "/var/lib/eim/locks";

/// How many times a start tries the lock when its holder turns out to be
/// gone before it could be named.
const ATTEMPTS: usize = 20;

/// How long a start waits for readers (see "Readers" in the module notes).
pub const READER_WAIT: Duration = Duration::from_secs(3);
/// How often it tries again meanwhile.
pub const READER_POLL: Duration = Duration::from_millis(20);
/// The mode of lock files and readers' files.
const LOCK_MODE: libc::mode_t = 0o600;

/// Why the pin directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("pin directory {} is in use by pid {pid} (lock file {})", dir.display(), lock_file.display())]
    InUse {
        dir: PathBuf,
        pid: i32,
        lock_file: PathBuf,
    },
    #[error("pin directory {} is in use by another process, whose pid is in neither /proc/locks nor the lock file {}", dir.display(), lock_file.display())]
    InUseUnknown { dir: PathBuf, lock_file: PathBuf },
    #[error("lock directory {}: {why}", path.display())]
    UnsafeDir { path: PathBuf, why: String },
    #[error("lock file {}: {why}", path.display())]
    NotAFile { path: PathBuf, why: String },
    #[error(transparent)]
    Io(#[from] PathIoError),
}

/// The exclusive lock on one pin directory; released when dropped (or
/// when the process ends, however it ends).
#[derive(Debug)]
pub struct PinLock {
    file: File,
    path: PathBuf,
    /// What the lock file said when this process took it.
    inherited: SlotsZeroed,
    /// What it says now.
    record: SlotsZeroed,
    /// Whether the file was empty when this process took it: no earlier
    /// owner wrote into it, so a refused start may remove it.
    fresh: bool,
    /// What this owner tells readers (see [`OwnerNotes`]).
    notes: OwnerNotes,
}

/// What a running owner tells the readers of its pins through its lock
/// file, after the pid and the slots-zeroed record: the file-id collisions
/// it has seen (`collisions N`, then at most [`MAX_NOTED_COLLISIONS`]
/// `collision ...` lines, each a one-line reason naming the files), which
/// the maps cannot say (a collision is a file that was *not* loaded).
/// `eim status` prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerNotes {
    /// Collisions seen since the owner started.
    pub collisions: u64,
    /// The first of them, one line each.
    pub listed: Vec<String>,
}

/// The most collision lines a lock file holds.
pub const MAX_NOTED_COLLISIONS: usize = 32;

/// The longest collision line kept (longer ones are cut).
const MAX_NOTE_BYTES: usize = 512;

/// The most of a lock file a reader reads.
const MAX_LOCK_FILE_BYTES: u64 = 64 << 10;

impl OwnerNotes {
    const COUNT: &'static str = "collisions";
    const LINE: &'static str = "collision";

    fn parse(text: &str) -> Self {
        let mut notes = Self::default();
        for line in text.lines() {
            if let Some(n) = line
                .strip_prefix(Self::COUNT)
                .and_then(|r| r.strip_prefix(' '))
            {
                notes.collisions = n.trim().parse().unwrap_or(0);
            } else if let Some(what) = line
                .strip_prefix(Self::LINE)
                .and_then(|r| r.strip_prefix(' '))
            {
                if notes.listed.len() < MAX_NOTED_COLLISIONS {
                    notes.listed.push(what.to_string());
                }
            }
        }
        notes
    }

    fn lines(&self) -> String {
        if self.collisions == 0 {
            return String::new();
        }
        let mut text = format!("{} {}\n", Self::COUNT, self.collisions);
        for what in self.listed.iter().take(MAX_NOTED_COLLISIONS) {
            text.push_str(&format!("{} {what}\n", Self::LINE));
        }
        text
    }
}

/// `line` as one line of at most [`MAX_NOTE_BYTES`] (a path may hold a
/// newline: it would start a record of its own).
fn one_line(line: &str) -> String {
    let mut out: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// When a zero was last written into an `unwind_info_array` slot of the
/// pinned maps, as their owners record it in the lock file (its second
/// line, `slots-zeroed never` or `slots-zeroed NS`, NS on `CLOCK_BOOTTIME`,
/// which runs on across processes and stops only with the machine, as the
/// pins and `/run` do).
///
/// Why: only a rollback zeroes slots, right after unpublishing the table
/// that referenced them, so a zero slot may be under a reader for a grace
/// after that write and never later. A warm restart that knows when the
/// dead owner last zeroed a slot may hand zero slots out at once once the
/// grace is over, instead of making every new rule wait a grace
/// (`eim_machine::machine::Observed::zeroed_ago`). The record is written
/// before the zeroing write, so a crash in between leaves it conservative,
/// and a lock file without a readable record is `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotsZeroed {
    Never,
    /// At this `CLOCK_BOOTTIME`.
    At(Duration),
    Unknown,
}

impl SlotsZeroed {
    const KEY: &'static str = "slots-zeroed";

    fn parse(text: &str) -> Self {
        let Some(rest) = text
            .lines()
            .find_map(|line| line.strip_prefix(Self::KEY)?.strip_prefix(' '))
        else {
            return Self::Unknown;
        };
        match rest.split_whitespace().next() {
            Some("never") => Self::Never,
            Some(ns) => ns
                .parse()
                .map_or(Self::Unknown, |ns| Self::At(Duration::from_nanos(ns))),
            None => Self::Unknown,
        }
    }

    fn line(self) -> String {
        match self {
            Self::Never => format!("{} never", Self::KEY),
            Self::At(t) => format!("{} {} (CLOCK_BOOTTIME ns)", Self::KEY, t.as_nanos()),
            Self::Unknown => format!("{} unknown", Self::KEY),
        }
    }
}

/// `CLOCK_BOOTTIME` now.
pub fn boottime() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

impl PinLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the exclusive lock on `dir` (an absolute, resolved path: see
    /// [`resolve`]) without waiting: [`LockError::InUse`] with the holder's
    /// pid if another open lock holds it, including one of this process.
    pub fn exclusive(dir: &Path) -> Result<Self, LockError> {
        let lock_dir = lock_dir();
        let dir_fd = open_lock_dir(&lock_dir)?;
        let name = lock_name(dir);
        let path = lock_dir.join(&name);
        let readers_deadline = std::time::Instant::now() + READER_WAIT;
        let mut attempts = 0;
        while attempts < ATTEMPTS {
            attempts += 1;
            let file = open_lock_file(&dir_fd, &name, &path)?;
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(io_error("locking", &path)(e).into());
                }
                match holder(&file) {
                    // A reader's probe (or an older eim's reader): it lets
                    // go soon.
                    Some(Holder { shared: true, .. })
                        if std::time::Instant::now() < readers_deadline =>
                    {
                        attempts -= 1;
                        std::thread::sleep(READER_POLL);
                        continue;
                    }
                    Some(Holder { pid, .. }) => {
                        return Err(LockError::InUse {
                            dir: dir.to_path_buf(),
                            pid,
                            lock_file: path,
                        })
                    }
                    // Released between the two: try again.
                    None => continue,
                }
            }
            // Someone removed or replaced the file after it was opened: a
            // lock on the old inode would exclude no one. Try again.
            if !same_file(&dir_fd, &name, &file) {
                continue;
            }
            let head = read_head(&file).unwrap_or_default();
            let inherited = SlotsZeroed::parse(&head);
            wait_for_readers(&dir_fd, &readers_name(&name), dir);
            let mut lock = Self {
                file,
                path,
                inherited,
                fresh: head.is_empty(),
                // Not knowing when the last owner zeroed a slot, this one
                // takes it as now: its own restart then waits a grace.
                record: match inherited {
                    SlotsZeroed::Unknown => SlotsZeroed::At(boottime()),
                    known => known,
                },
                notes: OwnerNotes::default(),
            };
            lock.write_pid()?;
            return Ok(lock);
        }
        let file = open_lock_file(&dir_fd, &name, &path)?;
        match written_pid(&file) {
            Some(pid) => Err(LockError::InUse {
                dir: dir.to_path_buf(),
                pid,
                lock_file: path,
            }),
            None => Err(LockError::InUseUnknown {
                dir: dir.to_path_buf(),
                lock_file: path,
            }),
        }
    }

    /// Lets go of the lock of a start that was refused, removing the lock
    /// file first if it was empty when taken (see "A refused directory
    /// leaves no lock file" in the module notes). Call it last, once
    /// everything the start did is undone.
    pub fn discard(self) {
        if self.fresh {
            let dir = self.path.parent().map(Path::to_path_buf);
            let name = self.path.file_name().map(|n| n.to_os_string());
            if let (Some(dir), Some(name)) = (dir, name) {
                if let (Ok(dir_fd), Some(name)) = (open_lock_dir(&dir), name.to_str()) {
                    // Still the file this process holds: unlinking it
                    // excludes no one, since every taker checks it locked
                    // the file the name gives.
                    if same_file(&dir_fd, name, &self.file) {
                        if let Ok(c) = CString::new(name) {
                            // SAFETY: a NUL-terminated name relative to an
                            // open directory.
                            unsafe { libc::unlinkat(dir_fd.as_raw_fd(), c.as_ptr(), 0) };
                        }
                    }
                }
            }
        }
        drop(self);
    }

    /// Writes this process's pid into the lock file, for a person reading
    /// it (eim itself asks `/proc/locks`), and the slots-zeroed record.
    fn write_pid(&mut self) -> Result<(), LockError> {
        let path = self.path.clone();
        self.rewrite()
            .map_err(io_error("writing the owner's pid into", &path))?;
        Ok(())
    }

    fn rewrite(&mut self) -> io::Result<()> {
        let text = format!(
            "{}\n{}\n{}",
            std::process::id(),
            self.record.line(),
            self.notes.lines()
        );
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(text.as_bytes())
    }

    /// Records that a zero is about to be written into a slot (see
    /// [`SlotsZeroed`]). Called before every such write.
    pub fn record_slots_zeroed(&mut self) -> io::Result<()> {
        self.record = SlotsZeroed::At(boottime());
        self.rewrite()
    }

    /// Records the file-id collisions this owner has seen, for readers
    /// ([`OwnerNotes`]): `total` of them, the first of `listed`.
    pub fn record_collisions(&mut self, total: u64, listed: &[String]) -> io::Result<()> {
        self.notes = OwnerNotes {
            collisions: total,
            listed: listed
                .iter()
                .take(MAX_NOTED_COLLISIONS)
                .map(|l| one_line(l))
                .collect(),
        };
        self.rewrite()
    }

    /// Records that no slot of these maps was ever zeroed: for maps this
    /// process has just created (no earlier owner's reader can be on them).
    pub fn record_fresh_maps(&mut self) -> io::Result<()> {
        self.record = SlotsZeroed::Never;
        self.rewrite()
    }

    /// How long ago, when this process took the lock, an earlier owner
    /// last zeroed a slot (`Duration::MAX`: never); `None` if unknown.
    pub fn slots_zeroed_ago(&self) -> Option<Duration> {
        match self.inherited {
            SlotsZeroed::Never => Some(Duration::MAX),
            SlotsZeroed::At(at) => boottime().checked_sub(at),
            SlotsZeroed::Unknown => None,
        }
    }
}

/// What a reader found when it asked for the shared lock ([`read_lock`]).
#[derive(Debug)]
pub enum ReadLock {
    /// No owner ran: the shared lock on the readers' file, held until
    /// dropped, makes an owner that starts meanwhile wait (bounded) before
    /// it cleans or replaces the maps.
    Held { file: File, path: PathBuf },
    /// An owner holds the exclusive lock: the maps are live.
    Owned {
        pid: Option<i32>,
        path: PathBuf,
        /// What the owner tells its readers.
        notes: OwnerNotes,
    },
}

impl ReadLock {
    /// The live owner's pid, if an owner runs and can be named.
    pub fn owner(&self) -> Option<i32> {
        match self {
            Self::Held { .. } => None,
            Self::Owned { pid, .. } => *pid,
        }
    }

    /// What the running owner tells its readers (`None`: no owner runs).
    pub fn notes(&self) -> Option<&OwnerNotes> {
        match self {
            Self::Held { .. } => None,
            Self::Owned { notes, .. } => Some(notes),
        }
    }

    /// Whether an owner runs (writes may happen while reading).
    pub fn is_owned(&self) -> bool {
        matches!(self, Self::Owned { .. })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        match self {
            Self::Held { path, .. } | Self::Owned { path, .. } => path,
        }
    }
}

/// Opens (creating it 0600 if needed) the readers' file of `dir` (an
/// absolute, resolved path): what a reader holds shared while it reads,
/// and an owner probes before each run of writes
/// ([`crate::generation::Generation::yield_to_readers`]).
pub fn readers_file(dir: &Path) -> Result<File, LockError> {
    let lock_dir = lock_dir();
    let dir_fd = open_lock_dir(&lock_dir)?;
    let name = readers_name(&lock_name(dir));
    let path = lock_dir.join(&name);
    open_lock_file(&dir_fd, &name, &path)
}

/// Takes `file` (a readers' file) shared, trying a few times over about a
/// millisecond (an owner holds it only for a probe); whether it did.
pub fn hold_shared(file: &File) -> bool {
    for _ in 0..10 {
        // SAFETY: flock on a descriptor the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    false
}

/// Lets go of a lock taken on `file`.
pub fn let_go(file: &File) {
    // SAFETY: flock on a descriptor the caller owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
}

/// The readers' file of the lock file `name`.
pub fn readers_name(name: &str) -> String {
    format!("{}.readers", name.strip_suffix(".lock").unwrap_or(name))
}

/// Who owns the lock file `file` now: probed with a shared lock, let go
/// of at once. `Ok(None)`: no owner; `Ok(Some(pid))` an owner, named if it
/// can be; `Err(())`: another reader's probe was in the way, try again.
fn probe_owner(file: &File, path: &Path) -> Result<Result<Option<Option<i32>>, ()>, LockError> {
    // SAFETY: flock on a descriptor the caller owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return Ok(Ok(None));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(io_error("locking (shared)", path)(e).into());
    }
    Ok(match holder(file) {
        Some(h) if !h.shared => Ok(Some(Some(h.pid))),
        _ => Err(()),
    })
}

/// Asks whether an owner holds `dir` (an absolute, resolved path) and, if
/// none does, takes the readers' shared lock (see "Readers" in the module
/// notes). Never waits for an owner, and holds the owner's lock itself
/// only for a probe.
pub fn read_lock(dir: &Path) -> Result<ReadLock, LockError> {
    let lock_dir = lock_dir();
    let dir_fd = open_lock_dir(&lock_dir)?;
    let name = lock_name(dir);
    let path = lock_dir.join(&name);
    let readers = readers_name(&name);
    let readers_path = lock_dir.join(&readers);
    for _ in 0..ATTEMPTS {
        let file = open_lock_file(&dir_fd, &name, &path)?;
        match probe_owner(&file, &path)? {
            Ok(Some(pid)) => {
                let notes = owner_notes(&file);
                return Ok(ReadLock::Owned { pid, path, notes });
            }
            Err(()) => continue,
            Ok(None) if !same_file(&dir_fd, &name, &file) => continue,
            Ok(None) => {}
        }
        let held = open_lock_file(&dir_fd, &readers, &readers_path)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io_error("locking (shared)", &readers_path)(e).into());
            }
            // An owner starting checks for readers: it lets go at once.
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if !same_file(&dir_fd, &readers, &held) {
            continue;
        }
        // An owner may have started between the probe and the readers'
        // lock: it then owns the maps (and waits for this reader).
        match probe_owner(&file, &path)? {
            Ok(Some(pid)) => {
                let notes = owner_notes(&file);
                return Ok(ReadLock::Owned { pid, path, notes });
            }
            Err(()) | Ok(None) => {
                return Ok(ReadLock::Held {
                    file: held,
                    path: readers_path,
                })
            }
        }
    }
    let notes = open_lock_file(&dir_fd, &name, &path)
        .map(|f| owner_notes(&f))
        .unwrap_or_default();
    Ok(ReadLock::Owned {
        pid: None,
        path,
        notes,
    })
}

/// What the owner wrote for readers into its lock file (bounded read).
fn owner_notes(file: &File) -> OwnerNotes {
    let mut text = String::new();
    let mut reader = file;
    if reader.rewind().is_err() {
        return OwnerNotes::default();
    }
    // A lock file is root's, 0600: still, read a bounded amount.
    let mut bytes = Vec::new();
    if reader
        .take(MAX_LOCK_FILE_BYTES)
        .read_to_end(&mut bytes)
        .is_err()
    {
        return OwnerNotes::default();
    }
    text.push_str(&String::from_utf8_lossy(&bytes));
    OwnerNotes::parse(&text)
}

/// Waits, at most [`READER_WAIT`], for the readers of `dir` to let go of
/// the readers' file `readers` (see "Readers" in the module notes), saying
/// so on stderr; then goes on whatever they do.
fn wait_for_readers(dir_fd: &OwnedFd, readers: &str, dir: &Path) {
    let Ok(c) = CString::new(readers) else {
        return;
    };
    // SAFETY: a NUL-terminated name relative to an open directory; never
    // created here (no reader ever came), never through a symlink.
    let fd = unsafe {
        libc::openat(
            dir_fd.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if !fstat(&file).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
        return;
    }
    let started = std::time::Instant::now();
    let mut said = None;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            // Let go at once: readers that come later find the owner's
            // lock taken and read the live maps.
            // SAFETY: as above.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
            return;
        }
        let pid = holder(&file).map(|h| h.pid);
        if said.is_none() || (pid.is_some() && said != Some(pid)) {
            say(&format!(
                "waiting for reader {} of {}",
                pid.map_or("(pid unknown)".to_string(), |p| format!("pid {p}")),
                dir.display()
            ));
            said = Some(pid);
        }
        if started.elapsed() >= READER_WAIT {
            say(&format!(
                "reader {} of {} still reading after {READER_WAIT:?}: starting anyway (its reads see the maps' generation change and are taken again)",
                pid.map_or("(pid unknown)".to_string(), |p| format!("pid {p}")),
                dir.display()
            ));
            return;
        }
        std::thread::sleep(READER_POLL);
    }
}

/// A line on stderr for the person who started eim; a closed stderr is
/// no reason to fail a start.
fn say(line: &str) {
    let _ = writeln!(io::stderr(), "eim: {line}");
}

/// The directory of the lock files.
pub fn lock_dir() -> PathBuf {
    if Path::new("/run").is_dir() {
        PathBuf::from(LOCK_DIR)
    } else {
        PathBuf::from(FALLBACK_LOCK_DIR)
    }
}

/// The lock file of pin directory `dir` (as given: it is resolved here).
pub fn lock_file_of(dir: &Path) -> io::Result<PathBuf> {
    Ok(lock_dir().join(lock_name(&resolve(dir)?)))
}

/// `dir` as an absolute path with every existing component resolved
/// (symlinks, `.` and `..`) and the rest (what does not exist yet) taken
/// as written: one name per directory, whichever way it is spelled, for
/// the lock file to be named after.
pub fn resolve(dir: &Path) -> io::Result<PathBuf> {
    let absolute = std::path::absolute(dir)?;
    let mut existing = absolute.as_path();
    let mut missing = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(mut resolved) => {
                for part in missing.iter().rev() {
                    match part {
                        Component::ParentDir => {
                            resolved.pop();
                        }
                        Component::Normal(name) => resolved.push(name),
                        _ => {}
                    }
                }
                return Ok(resolved);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(parent) = existing.parent() else {
                    return Err(e);
                };
                if let Some(last) = existing.components().next_back() {
                    missing.push(last);
                }
                existing = parent;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The lock file's name for pin directory `dir`: its path with `/` written
/// `-`, the bytes `[A-Za-z0-9_.]` as they are and every other byte as
/// `%XX` (so no two paths share a name), then `.lock`; a path too long
/// for one file name is named by its 64-bit FNV-1a hash instead.
pub fn lock_name(dir: &Path) -> String {
    let mut name = String::new();
    for &b in dir.as_os_str().as_bytes() {
        match b {
            b'/' => name.push('-'),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' => name.push(char::from(b)),
            _ => name.push_str(&format!("%{b:02X}")),
        }
    }
    if name.len() > 200 {
        // FNV-1a: stable across Rust releases, unlike std's hasher.
        let hash = dir
            .as_os_str()
            .as_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        name = format!("long-{hash:016x}");
    }
    name + ".lock"
}

fn c_path(path: &Path) -> Result<CString, LockError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io_error("a path with a NUL byte:", path)(io::Error::from_raw_os_error(libc::EINVAL)).into()
    })
}

/// Creates the lock directory (0755) if needed and opens it, refusing a
/// symlink or a directory another user could write into.
fn open_lock_dir(path: &Path) -> Result<OwnedFd, LockError> {
    // 0755 whatever the umask allows beyond it: a group- or
    // world-writable lock directory is refused below.
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path);
    match made {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error("creating the lock directory", path)(e).into()),
    }
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path; the fd returned is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(
            io_error("opening the lock directory", path)(io::Error::last_os_error()).into(),
        );
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(&fd).map_err(io_error("fstat of the lock directory", path))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let unsafe_dir = |why: String| LockError::UnsafeDir {
        path: path.to_path_buf(),
        why,
    };
    if st.st_uid != 0 && st.st_uid != me {
        return Err(unsafe_dir(format!(
            "is owned by uid {}, not by root or this user (uid {me})",
            st.st_uid
        )));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "is writable by its group or by others (mode {:o})",
            st.st_mode & 0o7777
        )));
    }
    Ok(fd)
}

/// Opens (creating it 0600 if needed) the lock file `name` in the lock
/// directory, never through a symlink and never blocking on a FIFO.
fn open_lock_file(dir: &OwnedFd, name: &str, path: &Path) -> Result<File, LockError> {
    let c = CString::new(name).map_err(|_| {
        io_error("a lock name with a NUL byte:", path)(io::Error::from_raw_os_error(libc::EINVAL))
    })?;
    // SAFETY: a NUL-terminated name relative to an open directory.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            LOCK_MODE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io_error("opening the lock file", path)(io::Error::last_os_error()).into());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let st = fstat(&file).map_err(io_error("fstat of the lock file", path))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(LockError::NotAFile {
            path: path.to_path_buf(),
            why: format!("is not a regular file (mode {:o})", st.st_mode),
        });
    }
    // One an older eim made 0644: anyone could open it and hold a lock.
    // SAFETY: geteuid has no preconditions.
    if st.st_mode & 0o077 != 0 && st.st_uid == unsafe { libc::geteuid() } {
        // SAFETY: fchmod on a descriptor this function owns.
        unsafe { libc::fchmod(file.as_raw_fd(), LOCK_MODE) };
    }
    Ok(file)
}

fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero bytes are a valid `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a writable `stat`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Whether `name` in `dir` still is the file `file` has open.
fn same_file(dir: &OwnedFd, name: &str, file: &File) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: all-zero bytes are a valid `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated name relative to an open directory.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    let Ok(open) = fstat(file) else {
        return false;
    };
    rc == 0 && st.st_dev == open.st_dev && st.st_ino == open.st_ino
}

/// Who holds a lock on a lock file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    /// A reader's shared lock (an owner's is exclusive).
    pub shared: bool,
}

/// Who holds a lock on `file`: from `/proc/locks`, else the pid the owner
/// wrote into it; `None` if neither names one.
fn holder(file: &File) -> Option<Holder> {
    let st = fstat(file).ok()?;
    match std::fs::read_to_string("/proc/locks") {
        Ok(locks) => holder_in(&locks, st.st_dev, st.st_ino),
        Err(_) => written_pid(file).map(|pid| Holder { pid, shared: false }),
    }
}

/// Who holds a lock on the inode (`dev`, `ino`) in the text of
/// `/proc/locks`: lines such as
/// `1: FLOCK  ADVISORY  WRITE 4242 fe:00:5915436 0 EOF` (`READ` for a
/// shared lock), the device's major and minor in hex. Waiters
/// (`1: -> FLOCK ...`) hold nothing.
pub fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<Holder> {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") {
            return None;
        }
        match fields.as_slice() {
            // A holder outside this pid namespace shows as pid 0.
            [_, "FLOCK", _, kind, pid, id, ..] if *id == want => pid
                .parse()
                .ok()
                .filter(|pid: &i32| *pid > 0)
                .map(|pid| Holder {
                    pid,
                    shared: *kind == "READ",
                }),
            _ => None,
        }
    })
}

/// The pid an owner wrote into the lock file, if it reads as one.
fn written_pid(file: &File) -> Option<i32> {
    let text = read_head(file)?;
    text.lines()
        .next()?
        .trim()
        .parse()
        .ok()
        .filter(|pid| *pid > 0)
}

/// The start of a lock file (at most 256 bytes: a pid and a record).
fn read_head(file: &File) -> Option<String> {
    let mut text = String::new();
    let mut reader = file;
    reader.rewind().ok()?;
    reader.take(256).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_notes_read_back_one_line_each_and_bounded() {
        let listed: Vec<String> = (0..40)
            .map(|i| format!("file {i}: /tmp/evil\ncollision forged {}", "x".repeat(600)))
            .collect();
        let notes = OwnerNotes {
            collisions: 41,
            listed: listed
                .iter()
                .take(MAX_NOTED_COLLISIONS)
                .map(|l| one_line(l))
                .collect(),
        };
        let text = format!("42\n{}\n{}", SlotsZeroed::Never.line(), notes.lines());
        let read = OwnerNotes::parse(&text);
        assert_eq!(read, notes);
        assert_eq!(read.listed.len(), MAX_NOTED_COLLISIONS);
        assert!(read
            .listed
            .iter()
            .all(|l| l.len() <= MAX_NOTE_BYTES && !l.contains('\n')));
        // The pid and the record still read as before.
        assert_eq!(SlotsZeroed::parse(&text), SlotsZeroed::Never);
        assert_eq!(
            OwnerNotes::parse("42\nslots-zeroed never\n"),
            OwnerNotes::default()
        );
    }

    #[test]
    fn the_slots_zeroed_record_reads_back_and_anything_else_is_unknown() {
        for record in [
            SlotsZeroed::Never,
            SlotsZeroed::At(Duration::from_nanos(123_456_789_012)),
        ] {
            let text = format!("42\n{}\n", record.line());
            assert_eq!(SlotsZeroed::parse(&text), record, "{text}");
        }
        for text in [
            "",
            "42\n",
            "42\nslots-zeroed\n",
            "42\nslots-zeroed soon\n",
            "42\nslots-zeroed -5\n",
            "42\nslots-zeroed unknown\n",
            "42\nslots-zeroed 99999999999999999999999\n",
        ] {
            assert_eq!(SlotsZeroed::parse(text), SlotsZeroed::Unknown, "{text:?}");
        }
    }

    #[test]
    fn a_discarded_lock_removes_the_file_it_found_empty_and_keeps_an_earlier_owners() {
        let dir = std::env::temp_dir().join(format!("eim-discard-{}", std::process::id()));
        let dir = resolve(&dir).expect("resolve");
        let lock = match PinLock::exclusive(&dir) {
            Ok(lock) => lock,
            Err(e) => {
                eprintln!("SKIPPED: the lock directory is not writable here ({e})");
                return;
            }
        };
        let path = lock.path().to_path_buf();
        assert!(path.exists());
        let mode = std::fs::metadata(&path).expect("stat").permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        // A refused start that made the file leaves none.
        lock.discard();
        assert!(!path.exists(), "{}", path.display());
        // An owner that started wrote its record: a later refused start
        // keeps it.
        drop(PinLock::exclusive(&dir).expect("an owner"));
        PinLock::exclusive(&dir).expect("a refused start").discard();
        assert!(path.exists(), "an earlier owner's record was removed");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn the_readers_file_is_named_beside_the_lock_file() {
        assert_eq!(
            readers_name(&lock_name(Path::new("/sys/fs/bpf/eim"))),
            "-sys-fs-bpf-eim.readers"
        );
    }

    #[test]
    fn lock_names_are_readable_and_distinct() {
        assert_eq!(
            lock_name(Path::new("/sys/fs/bpf/eim")),
            "-sys-fs-bpf-eim.lock"
        );
        // `-` and `/` must not meet in one name.
        assert_ne!(lock_name(Path::new("/a-b")), lock_name(Path::new("/a/b")));
        assert_eq!(lock_name(Path::new("/a-b")), "-a%2Db.lock");
        assert_eq!(lock_name(Path::new("/a b")), "-a%20b.lock");
        let long = PathBuf::from(format!("/{}", "x".repeat(300)));
        let other = PathBuf::from(format!("/{}y", "x".repeat(299)));
        assert!(lock_name(&long).starts_with("long-"));
        assert!(lock_name(&long).len() < 255);
        assert_ne!(lock_name(&long), lock_name(&other));
    }

    #[test]
    fn the_holder_is_found_by_device_and_inode() {
        let dev = libc::makedev(0xfe, 0) as u64;
        let locks = "1: POSIX  ADVISORY  WRITE 11 fe:00:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 22 fe:01:77 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 33 fe:00:77 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 44 fe:00:77 0 EOF\n";
        let owner = |pid| Holder { pid, shared: false };
        assert_eq!(holder_in(locks, dev, 77), Some(owner(44)));
        assert_eq!(holder_in(locks, dev, 78), None);
        let big = libc::makedev(259, 3) as u64;
        assert_eq!(
            holder_in("9: FLOCK  ADVISORY  WRITE 5 103:03:12 0 EOF", big, 12),
            Some(owner(5))
        );
        assert_eq!(
            holder_in("9: FLOCK  ADVISORY  READ 6 103:03:12 0 EOF", big, 12),
            Some(Holder {
                pid: 6,
                shared: true
            })
        );
    }

    #[test]
    fn resolve_takes_existing_parts_through_symlinks_and_the_rest_as_written() {
        let tmp = std::env::temp_dir().join(format!("eim-resolve-{}", std::process::id()));
        let real = tmp.join("real");
        std::fs::create_dir_all(&real).expect("mkdir");
        let link = tmp.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let canon = std::fs::canonicalize(&real).expect("canonicalize");
        assert_eq!(
            resolve(&link.join("pins")).expect("resolve"),
            canon.join("pins")
        );
        assert_eq!(
            resolve(&link.join("a/../pins")).expect("resolve"),
            canon.join("pins")
        );
        assert_eq!(resolve(&real).expect("resolve"), canon);
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
