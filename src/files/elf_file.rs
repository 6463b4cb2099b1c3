//! The ELF file handle (upstream's `pfelf.Reference`) and the search for a
//! file's separate debug file (`.gnu_debuglink`).
//!
//! [`ElfFileRef`] names a file and opens it on first use: it checks that the
//! file is a regular file and a complete 64-bit little-endian ELF file of a
//! supported machine, parses it once and keeps the result until
//! [`ElfFileRef::close`] or drop. A failed open is not cached: the next use
//! tries again, as upstream's does.
//!
//! Every error names the file and has a kind ([`ExtractErrorKind`]): a file
//! (or directory, or process root) that does not exist is `NotFound`, so the
//! manager neither counts nor defers it; a file that is not a usable ELF
//! file is `Invalid`; one over the size limit is `TooLarge`; any other
//! failure to read is `Io`, and a file that changed while it was read is
//! `Changed`.
//!
//! # No memory maps
//!
//! Files are never mapped. Any process can map its own copy of an
//! executable, make eim analyse it, and truncate it: a shared map raises
//! `SIGBUS` on the next read past the new end, and kills eim (upstream
//! weakness 24). Instead the file is read with `pread`, range by range as
//! the analysis asks for them, into memory eim owns
//! ([`eim_analysis::elf::LazyFile`]): a truncated file gives a failed read, never
//! a signal, and only the parts the analysis touches are read (the headers,
//! `.eh_frame`, the symbol tables: a few percent of a large library).
//!
//! A file can still change while it is read (rewritten in place, or
//! truncated): then its pieces may come from two versions.
//! [`OpenElf::check_unchanged`] tells: any read that failed, or a size,
//! modification or change time different from when the file was opened,
//! makes the whole analysis an error ("changed while being read"), never
//! tables from a mix of versions. The file id is computed from the same
//! cached bytes ([`OpenElf::file_id`]), so the provider can refuse tables
//! for a file whose id is not the one it was asked to load.
//!
//! # Debug links
//!
//! [`ElfFileRef::find_debug_file`] reads `.gnu_debuglink` with core's one
//! parser (`eim_analysis::elf::debuglink`: a plain UTF-8 file name, NUL,
//! padding to a multiple of 4, then the CRC-32 of the debug file) and looks
//! for the debug file, in this order, in the file's directory, its `.debug/`
//! subdirectory, `/usr/lib/debug/<directory>/`, and
//! `/usr/lib/debug/.build-id/<xx>/<rest>.debug` named by the file's GNU
//! build-id note (gdb's places; SEED looks in `/usr/lib/debug/<directory>/`
//! only). Each candidate is resolved inside the file's root through root's
//! links only, and its type, owner and mode are checked before it is
//! opened ([`crate::files::opener`], [`crate::files::trust`]). A candidate
//! is used only if the trust rule allows it, its CRC-32 matches and it is
//! a 64-bit little-endian ELF file. Not finding one is normal (no debug
//! package installed) and gives `Ok(None)`, as upstream ignores it. The
//! symbolizer also looks for a file with no debug link by its build id
//! alone ([`ElfFileRef::find_debug_file_by`]), checking the build id of
//! what it finds itself. But if
//! the place the file was found in has gone (the process root, or the
//! file's directory), the search fails with `NotFound`: the file has gone
//! with its process, and that must not turn into a counted and deferred
//! extraction error (upstream weakness 13).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use eim_analysis::elf::fileid::{self, FileId128};
use eim_analysis::elf::header::{check_header, check_sections, HeaderError};
use eim_analysis::elf::ident::EHDR64_SIZE;
use eim_analysis::elf::{ByteSource, DebugLink, Elf, ElfError, FileView, LazyFile, SourceError};
use eim_core::provider::{ExtractError, ExtractErrorKind};
use object::Object;

use crate::files::opener::{Located, OpenerError, Root};
use crate::files::regular::{check_regular, open_regular};
use crate::files::trust;

/// The default size limit: 2 GiB.
pub const DEFAULT_MAX_SIZE: u64 = 2 << 30;

/// Where distributions install separate debug files.
const DEBUG_DIR: &str = "/usr/lib/debug";

/// The buffer a debug file's CRC is computed through.
const CRC_BUFFER: usize = 1 << 20;

/// A file read with `pread`.
struct Pread(Arc<File>);

impl ByteSource for Pread {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        let mut done = 0;
        while done < buf.len() {
            match self.0.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    return Err(SourceError::Truncated {
                        offset,
                        len: buf.len() as u64,
                        got: done as u64,
                    })
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(SourceError::Io {
                        offset,
                        len: buf.len() as u64,
                        message: e.to_string(),
                    })
                }
            }
        }
        Ok(())
    }
}

/// What changes when a file's contents change: compared after an analysis
/// with what it was when the file was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// A file opened for reading on demand, and its stamp at the open.
struct Opened {
    file: Arc<File>,
    lazy: LazyFile,
    stamp: Stamp,
    /// The file's owner: whose debug files it may use ([`trust`]).
    owner: u32,
}

impl Opened {
    fn new(file: Arc<File>, meta: &std::fs::Metadata) -> Self {
        let stamp = Stamp::of(meta);
        Self {
            lazy: LazyFile::new(Box::new(Pread(file.clone())), stamp.len),
            file,
            stamp,
            owner: meta.uid(),
        }
    }

    /// Why what was read may not be the file as it was opened, if it may not.
    fn changed(&self) -> Option<Unreliable> {
        if let Some(e) = self.lazy.failure() {
            return Some(Unreliable::from(e));
        }
        match self.file.metadata() {
            Ok(meta) if Stamp::of(&meta) == self.stamp => None,
            Ok(meta) => Some(Unreliable::changed(format!(
                "{} bytes and modified at {}.{:09} when opened, {} bytes and modified at \
                 {}.{:09} after",
                self.stamp.len,
                self.stamp.mtime.0,
                self.stamp.mtime.1,
                meta.len(),
                meta.mtime(),
                meta.mtime_nsec()
            ))),
            Err(e) => Some(Unreliable {
                kind: ExtractErrorKind::Io,
                message: format!("cannot stat after reading: {e}"),
            }),
        }
    }
}

/// Why what an analysis read of a file cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unreliable {
    /// `Changed` for a file that changed, `Io` for one that could not be
    /// read, `TooLarge` for
    /// one whose reads would pass the memory budget; a refused header's
    /// kind ([`HeaderError::kind`]).
    pub kind: ExtractErrorKind,
    pub message: String,
}

impl Unreliable {
    /// The file changed under the reads (`why` says how).
    pub fn changed(why: impl std::fmt::Display) -> Self {
        Self {
            kind: ExtractErrorKind::Changed,
            message: format!("changed while being read: {why}"),
        }
    }
}

impl From<SourceError> for Unreliable {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Truncated { .. } => Self::changed(e),
            SourceError::Io { .. } => Self {
                kind: ExtractErrorKind::Io,
                message: format!("cannot read: {e}"),
            },
            SourceError::OverBudget { .. } | SourceError::NoMemory { .. } => Self {
                kind: ExtractErrorKind::TooLarge,
                message: format!("refused: {e}"),
            },
        }
    }
}

impl From<Unreliable> for String {
    fn from(u: Unreliable) -> Self {
        u.message
    }
}

self_cell::self_cell!(
    /// A file read on demand and the ELF view parsed from it.
    struct ParsedElf {
        owner: Opened,
        #[covariant]
        dependent: Elf,
    }
);

/// An opened, checked and parsed ELF file.
pub struct OpenElf {
    parsed: ParsedElf,
}

impl std::fmt::Debug for OpenElf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenElf")
            .field("len", &self.len())
            .field("arch", &self.elf().arch)
            .field("read", &self.bytes_read())
            .finish()
    }
}

impl std::fmt::Debug for DebugFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugFile")
            .field("path", &self.path)
            .field("len", &self.opened.lazy.len())
            .field("crc", &self.crc)
            .finish()
    }
}

impl OpenElf {
    /// The parsed file.
    pub fn elf(&self) -> &Elf<'_> {
        self.parsed.borrow_dependent()
    }

    /// The file's size in bytes (when it was opened).
    pub fn len(&self) -> u64 {
        self.parsed.borrow_owner().lazy.len()
    }

    /// Always false: an ELF file has at least its header.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the file read into memory so far.
    pub fn bytes_read(&self) -> u64 {
        self.parsed.borrow_owner().lazy.held()
    }

    /// Reads made from the file so far.
    pub fn reads(&self) -> u64 {
        self.parsed.borrow_owner().lazy.reads()
    }

    /// The digest of every byte read so far (`None` if a range could not
    /// be read): see [`eim_analysis::elf::digest`].
    pub fn source_digest(&self) -> Option<eim_analysis::elf::digest::SourceDigest> {
        eim_analysis::elf::digest::SourceDigest::of(&self.parsed.borrow_owner().lazy)
    }

    /// The file's 128-bit id (its host id is `.host()`), from the same
    /// cached bytes the analysis reads; `Err` (why) if they cannot be read:
    /// the file was truncated.
    pub fn file_id(&self) -> Result<FileId128, Unreliable> {
        let view = self.elf().data;
        let size = view.size();
        let (head, tail) = (fileid::head_range(size), fileid::tail_range(size));
        let read = |r: std::ops::Range<u64>| view.bytes_at(r.start, r.end - r.start);
        match read(head).zip(read(tail)) {
            Some((head, tail)) => Ok(fileid::file_id(head, tail, size)),
            None => Err(self.check_unchanged().err().unwrap_or(Unreliable {
                kind: ExtractErrorKind::Io,
                message: "cannot read the bytes of its file id".into(),
            })),
        }
    }

    /// `Err` with the reason if anything read may not be the file as it was
    /// when opened (a failed read, or its size or times changed): then no
    /// conclusion drawn from it may be used.
    pub fn check_unchanged(&self) -> Result<(), Unreliable> {
        match self.parsed.borrow_owner().changed() {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }
}

/// A separate debug file found through `.gnu_debuglink`: read on demand,
/// like the file itself; its CRC-32 was computed through a bounded buffer.
pub struct DebugFile {
    /// Where it was found (inside the root, if the reference has one).
    pub path: PathBuf,
    opened: Opened,
    crc: u32,
}

impl eim_analysis::elf::extract::DebugFileBytes for DebugFile {
    fn view(&self) -> FileView<'_> {
        self.opened.lazy.view()
    }

    fn crc(&self) -> u32 {
        self.crc
    }
}

impl DebugFile {
    /// The debug file's size in bytes.
    pub fn len(&self) -> u64 {
        self.opened.lazy.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes at `offset..offset + len` (for tests and reports).
    pub fn bytes_at(&self, offset: u64, len: u64) -> Option<&[u8]> {
        self.opened.lazy.view().bytes_at(offset, len)
    }

    /// Why what was read may not be the debug file as it was opened.
    pub fn check_unchanged(&self) -> Result<(), Unreliable> {
        match self.opened.changed() {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }
}

/// The error kind of an I/O error: a missing file or path component is
/// `NotFound`, anything else `Io`.
pub fn io_kind(e: &io::Error) -> ExtractErrorKind {
    if is_not_found(e) {
        ExtractErrorKind::NotFound
    } else {
        ExtractErrorKind::Io
    }
}

fn is_not_found(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

impl From<HeaderError> for Unreliable {
    fn from(e: HeaderError) -> Self {
        Self {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// Checks and parses a file read on demand; the error's kind is `Invalid`
/// unless the reads failed.
fn parse(opened: Opened) -> Result<ParsedElf, Unreliable> {
    let invalid = |message: String| Unreliable {
        kind: ExtractErrorKind::Invalid,
        message,
    };
    let len = opened.lazy.len();
    let view = opened.lazy.view();
    let head = view.bytes_at(0, len.min(EHDR64_SIZE)).ok_or_else(|| {
        opened
            .changed()
            .unwrap_or(invalid("cannot read the header".into()))
    })?;
    check_header(head, len)?;
    let parsed = ParsedElf::try_new(opened, |o| {
        Elf::parse_lazy(&o.lazy).map_err(|e| match e {
            ElfError::UnsupportedMachine(m) => HeaderError::machine(m).into(),
            // A read that failed says more than the parser's complaint.
            other => o.changed().unwrap_or_else(|| invalid(other.to_string())),
        })
    })?;
    check_sections(parsed.borrow_dependent()).map_err(|e| invalid(e.to_string()))?;
    Ok(parsed)
}

/// A lazily opened, cached ELF file (upstream's `pfelf.Reference`).
///
/// Thread-safe: concurrent first uses open the file once. The cached file
/// is shared (`Arc`), so [`close`](Self::close) drops the handle's share at
/// once, and the map goes when the last user is done with it.
pub struct ElfFileRef {
    path: PathBuf,
    root: Option<PathBuf>,
    max_size: u64,
    /// A file the caller opened already (see [`ElfFileRef::with_file`]).
    preopened: Option<Arc<File>>,
    cached: Mutex<Option<Arc<OpenElf>>>,
}

impl std::fmt::Debug for ElfFileRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfFileRef")
            .field("path", &self.path)
            .field("root", &self.root)
            .field("max_size", &self.max_size)
            .field("preopened", &self.preopened.is_some())
            .field("open", &self.is_open())
            .finish()
    }
}

impl ElfFileRef {
    /// A reference to the file at `path`; nothing is opened yet.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            root: None,
            max_size: DEFAULT_MAX_SIZE,
            preopened: None,
            cached: Mutex::new(None),
        }
    }

    /// Reads the bytes from `file`, which the caller has opened already
    /// (a process's file through `/proc/PID/map_files/START-END`, checked
    /// to be the one mapped), instead of opening the path: a file replaced
    /// on disk, or one in another mount namespace, is then still the one
    /// the process maps. The path (inside the root, if any) still names the
    /// file in errors and guides the debug-file search.
    pub fn with_file(mut self, file: File) -> Self {
        self.preopened = Some(Arc::new(file));
        self
    }

    /// Resolves the path, and the debug-file search, inside `root` (for
    /// example `/proc/<pid>/root`, a process's view of the file system).
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    /// Refuses files (and skips debug files) larger than `bytes`.
    pub fn with_max_size(mut self, bytes: u64) -> Self {
        self.max_size = bytes;
        self
    }

    /// The path as given (the name errors and reports use).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn error(&self, kind: ExtractErrorKind, message: impl Into<String>) -> ExtractError {
        ExtractError::new(kind, self.name(), message)
    }

    /// Where a path (as seen inside the root) is on this file system.
    fn physical(&self, path: &Path) -> PathBuf {
        match &self.root {
            None => path.to_path_buf(),
            Some(root) => {
                // Lexically, so that `..` cannot climb out of the root.
                let mut inner = PathBuf::new();
                for c in path.components() {
                    match c {
                        Component::Normal(part) => inner.push(part),
                        Component::ParentDir => {
                            inner.pop();
                        }
                        _ => {}
                    }
                }
                root.join(inner)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<OpenElf>>> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the file is open (cached).
    pub fn is_open(&self) -> bool {
        self.lock().is_some()
    }

    /// The opened file, opening it on first use. Errors are not cached.
    pub fn get(&self) -> Result<Arc<OpenElf>, ExtractError> {
        let mut cached = self.lock();
        if let Some(open) = &*cached {
            return Ok(open.clone());
        }
        let open = Arc::new(self.open()?);
        *cached = Some(open.clone());
        Ok(open)
    }

    /// Drops the cached file. The next [`get`](Self::get) opens it again.
    pub fn close(&self) {
        let open = self.lock().take();
        drop(open);
    }

    /// The file's 128-bit id.
    pub fn file_id(&self) -> Result<FileId128, ExtractError> {
        self.get()?
            .file_id()
            .map_err(|u| self.error(u.kind, u.message))
    }

    fn open(&self) -> Result<OpenElf, ExtractError> {
        let io = |what: &str, e: io::Error| self.error(io_kind(&e), format!("{what}: {e}"));
        let file = match &self.preopened {
            // Read at offsets (`pread`): the file position does not matter.
            Some(file) => file.clone(),
            None => {
                let opened = match &self.root {
                    // A process's file: inside its root, through root's
                    // links only.
                    Some(root) => Root::open(root)
                        .and_then(|r| r.locate(&self.path))
                        .and_then(Located::open)
                        .map_err(io::Error::from),
                    None => open_regular(&self.path),
                };
                let (file, _) = opened.map_err(|e| {
                    if e.kind() == io::ErrorKind::InvalidInput {
                        self.error(ExtractErrorKind::Invalid, e.to_string())
                    } else {
                        io("cannot open", e)
                    }
                })?;
                Arc::new(file)
            }
        };
        let meta = file.metadata().map_err(|e| io("cannot stat", e))?;
        if let Err(e) = check_regular(&meta) {
            return Err(self.error(ExtractErrorKind::Invalid, e.to_string()));
        }
        let len = meta.len();
        if len > self.max_size {
            return Err(self.error(
                ExtractErrorKind::TooLarge,
                format!(
                    "{len} bytes, larger than the limit of {} bytes",
                    self.max_size
                ),
            ));
        }
        let parsed = parse(Opened::new(file, &meta)).map_err(|u| self.error(u.kind, u.message))?;
        tracing::trace!(path = %self.name(), len, "opened");
        Ok(OpenElf { parsed })
    }

    /// The debug-file candidates for `link`, as paths inside the root, in
    /// search order.
    fn debug_candidates(&self, link: Option<&DebugLink>, build_id: Option<&[u8]>) -> Vec<PathBuf> {
        let parent = self.path.parent().unwrap_or(Path::new(""));
        // The directory as an absolute path, lexically (symbolic links are
        // not resolved: inside a root they would point outside it).
        let dir = if self.root.is_some() {
            Path::new("/").join(parent)
        } else {
            std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf())
        };
        let under_debug = |p: &Path| -> PathBuf {
            let rel: PathBuf = p
                .components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect();
            Path::new(DEBUG_DIR).join(rel)
        };
        let mut out = match link {
            Some(link) => vec![
                dir.join(&link.name),
                dir.join(".debug").join(&link.name),
                under_debug(&dir).join(&link.name),
            ],
            None => Vec::new(),
        };
        if let Some(id) = build_id.filter(|id| id.len() >= 2) {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            out.push(
                Path::new(DEBUG_DIR)
                    .join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..])),
            );
        }
        out
    }

    /// Finds the separate debug file of `open` (this reference's file): see
    /// the module documentation. `Ok(None)` when the file has no debug link
    /// or no candidate matches; `Err` (kind `NotFound`) when the file's
    /// root or directory has gone.
    pub fn find_debug_file(&self, open: &OpenElf) -> Result<Option<DebugFile>, ExtractError> {
        match open.elf().debug_link() {
            Some(link) => self.find_debug_file_for(open, &link),
            None => Ok(None),
        }
    }

    /// Finds the debug file `link` names for `open` (this reference's
    /// file): what the analysis asks for ([`eim_analysis::analyse::DebugFiles`]).
    pub fn find_debug_file_for(
        &self,
        open: &OpenElf,
        link: &DebugLink,
    ) -> Result<Option<DebugFile>, ExtractError> {
        let owner = open.parsed.borrow_owner().owner;
        let build_id = open.elf().file.build_id().ok().flatten();
        self.find_debug_file_by(owner, Some(link), build_id)
    }

    /// Finds the debug file of this reference's file, owned by `owner`,
    /// without opening the file itself: through `link` (its CRC-32
    /// checked) in the places the module documentation lists, or, with no
    /// link, at `/usr/lib/debug/.build-id/<xx>/<rest>.debug` alone, where
    /// the caller must check that the file found has the same build id.
    /// The same trust rule and opening either way.
    pub fn find_debug_file_by(
        &self,
        owner: u32,
        link: Option<&DebugLink>,
        build_id: Option<&[u8]>,
    ) -> Result<Option<DebugFile>, ExtractError> {
        let wanted = link.map_or("by build id", |l| l.name.as_str());
        let gone = |anchor: &Path| {
            self.error(
                ExtractErrorKind::NotFound,
                format!(
                    "{} has gone while looking for the debug file {wanted}",
                    anchor.display(),
                ),
            )
        };
        // Candidates are resolved inside the process's root (or the host's
        // for an operator's file) through root's links only.
        let root_path = self.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        let root = match Root::open(&root_path) {
            Ok(root) => root,
            Err(e) if e.is_not_found() => return Err(gone(&root_path)),
            Err(e) => {
                tracing::debug!(path = %self.name(), "no debug-file search: {e}");
                return Ok(None);
            }
        };
        for candidate in self.debug_candidates(link, build_id) {
            let shown = self.physical(&candidate);
            match self.try_debug_candidate(&root, &candidate, link, owner) {
                Ok(Some((opened, crc))) => {
                    tracing::debug!(path = %self.name(), debug = %shown.display(), "found the debug file");
                    return Ok(Some(DebugFile {
                        path: shown,
                        opened,
                        crc,
                    }));
                }
                Ok(None) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::debug!(path = %self.name(), "debug file skipped: {e}");
                }
            }
        }
        // Nothing found. Normal, unless the file's whole world has gone.
        let anchor = match &self.root {
            Some(root) => root.clone(),
            None => self
                .path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        };
        match std::fs::metadata(&anchor) {
            Err(e) if is_not_found(&e) => Err(gone(&anchor)),
            _ => Ok(None),
        }
    }

    /// The candidate's bytes if it is the debug file `link` names and may
    /// serve a file owned by `owner` ([`trust`]). Its type, owner and mode
    /// are checked before it is opened: a FIFO, a device or a root-only
    /// file is never opened, let alone read.
    fn try_debug_candidate(
        &self,
        root: &Root,
        candidate: &Path,
        link: Option<&DebugLink>,
        owner: u32,
    ) -> Result<Option<(Opened, u32)>, OpenerError> {
        let located = match root.locate(candidate) {
            Ok(located) => located,
            Err(OpenerError::NotRegular { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let shown = root.shown(candidate);
        if let Some(why) = trust::debug_file_refusal(located.metadata(), owner) {
            tracing::debug!(path = %self.name(), debug = %shown.display(), "debug file not trusted: {why}");
            return Ok(None);
        }
        let len = located.metadata().len();
        if len > self.max_size {
            tracing::warn!(
                debug = %shown.display(),
                len,
                "debug file larger than the limit of {} bytes: not used",
                self.max_size
            );
            return Ok(None);
        }
        let (file, meta) = located.open()?;
        let crc = crc_of(&file, meta.len()).map_err(|cause| OpenerError::Io {
            path: shown.clone(),
            cause,
        })?;
        if let Some(link) = link.filter(|l| l.crc != crc) {
            tracing::debug!(debug = %shown.display(), "CRC-32 {crc:08x}, expected {:08x}", link.crc);
            return Ok(None);
        }
        let opened = Opened::new(Arc::new(file), &meta);
        let head = opened.lazy.view().bytes_at(0, meta.len().min(EHDR64_SIZE));
        if let Err(e) = head.map_or(
            Err(HeaderError::Invalid("cannot read the header".into())),
            |h| check_header(h, meta.len()),
        ) {
            tracing::debug!(debug = %shown.display(), "not usable: {e}");
            return Ok(None);
        }
        Ok(Some((opened, crc)))
    }
}

/// The CRC-32 of the first `len` bytes of `file`, read through a bounded
/// buffer; an error if the file is shorter.
fn crc_of(file: &File, len: u64) -> io::Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CRC_BUFFER.min(usize::try_from(len).unwrap_or(CRC_BUFFER))];
    let mut at = 0u64;
    while at < len {
        let n = buf
            .len()
            .min(usize::try_from(len - at).unwrap_or(buf.len()));
        file.read_exact_at(&mut buf[..n], at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hasher.finalize())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use eim_test_support::elf::{
        with_sections, CLASS32, EM_X86_64, MAGIC, MSB, SHT_NOTE, SHT_PROGBITS,
    };

    fn debuglink_section(name: &str, crc: u32) -> Vec<u8> {
        let mut v = name.as_bytes().to_vec();
        v.push(0);
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    fn build_id_note(id: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&4u32.to_le_bytes());
        v.extend_from_slice(&(id.len() as u32).to_le_bytes());
        v.extend_from_slice(&3u32.to_le_bytes()); // NT_GNU_BUILD_ID
        v.extend_from_slice(b"GNU\0");
        v.extend_from_slice(id);
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
        v
    }

    /// A debug file and an executable linking to it (with a build id).
    fn linked_pair(build_id: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let debug = with_sections(EM_X86_64, &[(".debug_frame", SHT_PROGBITS, b"frames")]);
        let crc = crc32fast::hash(&debug);
        let exe = with_sections(
            EM_X86_64,
            &[
                (".note.gnu.build-id", SHT_NOTE, &build_id_note(build_id)),
                (
                    ".gnu_debuglink",
                    SHT_PROGBITS,
                    &debuglink_section("exe.debug", crc),
                ),
            ],
        );
        (exe, debug)
    }

    pub(crate) fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    }

    pub(crate) use eim_test_support::testdata;

    #[test]
    fn opens_lazily_caches_and_closes() {
        let path = testdata().join("upstream/volname");
        let r = ElfFileRef::new(&path);
        assert!(!r.is_open());
        let a = r.get().expect("volname opens");
        assert!(r.is_open());
        let b = r.get().expect("cached");
        assert!(Arc::ptr_eq(&a, &b), "opened once");
        assert_eq!(a.len(), 6136);
        assert_eq!(a.bytes_read(), 6136, "a small file is one read");
        assert_eq!(a.elf().entry(), 0x9f0);
        assert_eq!(
            a.file_id().expect("id").to_string(),
            "9bb76b8b80cc90a1afc778507ac1d64c"
        );
        r.close();
        assert!(!r.is_open());
        let c = r.get().expect("opens again");
        assert!(!Arc::ptr_eq(&a, &c));

        let big = ElfFileRef::new(testdata().join("upstream/schrodinger-libpython3.8.so.1.0"));
        let open = big.get().expect("libpython opens");
        assert_eq!(
            open.file_id().expect("id").host().to_string(),
            "ea4fa5c64744b2ef"
        );
        // Opening and the file id read the headers, the section table and
        // the last 4 KiB: a small part of a large file.
        assert!(
            open.bytes_read() * 4 < open.len(),
            "{} of {} bytes read",
            open.bytes_read(),
            open.len()
        );
        open.check_unchanged().expect("nothing changed");
    }

    #[test]
    fn errors_are_not_cached() {
        let dir = tempdir();
        let path = dir.path().join("later");
        let r = ElfFileRef::new(&path);
        let e = r.get().expect_err("missing");
        assert_eq!(e.kind, ExtractErrorKind::NotFound);
        assert_eq!(e.path, path.display().to_string());
        write(&path, &with_sections(EM_X86_64, &[]));
        r.get().expect("now there");
    }

    #[test]
    fn refusals_say_why_and_have_a_kind() {
        use ExtractErrorKind::*;
        let dir = tempdir();
        let good = with_sections(EM_X86_64, &[(".text", SHT_PROGBITS, b"\xc3")]);
        let mut class32 = good.clone();
        class32[4] = CLASS32;
        let mut big_endian = good.clone();
        big_endian[5] = MSB;
        let mut bad_section = good.clone();
        // Section 1 (.text) claims 4096 bytes.
        let shoff = u64::from_le_bytes(good[0x28..0x30].try_into().expect("8 bytes")) as usize;
        bad_section[shoff + 64 + 0x20..shoff + 64 + 0x28].copy_from_slice(&4096u64.to_le_bytes());
        let cases: Vec<(&str, Vec<u8>, ExtractErrorKind, &str)> = vec![
            (
                "text",
                b"hello, world\n".to_vec(),
                Unsupported,
                "not an ELF file",
            ),
            ("empty", vec![], Unsupported, "not an ELF file"),
            (
                "magic-only",
                MAGIC.to_vec(),
                Invalid,
                "shorter than the 64-byte ELF header",
            ),
            (
                "header-cut",
                good[..40].to_vec(),
                Invalid,
                "shorter than the 64-byte ELF header",
            ),
            (
                "table-cut",
                good[..good.len() - 10].to_vec(),
                Invalid,
                "section header table",
            ),
            (
                "section-cut",
                bad_section,
                Invalid,
                "section 1 (.text) ends past the end",
            ),
            ("elf32", class32, Unsupported, "32-bit ELF file"),
            ("be", big_endian, Unsupported, "big-endian ELF file"),
            (
                "riscv",
                with_sections(243, &[]),
                Unsupported,
                "unsupported machine 0xf3",
            ),
        ];
        for (name, bytes, kind, says) in cases {
            let path = dir.path().join(name);
            write(&path, &bytes);
            let e = ElfFileRef::new(&path)
                .get()
                .err()
                .unwrap_or_else(|| panic!("{name} opened"));
            assert_eq!(e.kind, kind, "{name}: {e}");
            assert!(e.message.contains(says), "{name}: {e}");
            assert!(
                e.to_string().starts_with(&path.display().to_string()),
                "{name}: {e}"
            );
        }
        let e = ElfFileRef::new(dir.path()).get().expect_err("a directory");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (Invalid, "not a regular file: a directory")
        );
        let path = dir.path().join("good");
        write(&path, &good);
        let e = ElfFileRef::new(&path)
            .with_max_size(100)
            .get()
            .expect_err("too large");
        assert_eq!(e.kind, TooLarge, "{e}");
        assert!(
            e.message.contains("larger than the limit of 100 bytes"),
            "{e}"
        );
        ElfFileRef::new(&path)
            .with_max_size(good.len() as u64)
            .get()
            .expect("at the limit");
    }

    #[test]
    fn the_debug_file_is_found_in_every_place_and_checked() {
        let build_id = [0xab, 0xcd, 0xef, 0x01];
        let (exe, debug) = linked_pair(&build_id);
        let mut wrong = debug.clone();
        wrong.extend_from_slice(b"changed");
        let places = [
            "opt/app/exe.debug",
            "opt/app/.debug/exe.debug",
            "usr/lib/debug/opt/app/exe.debug",
            "usr/lib/debug/.build-id/ab/cdef01.debug",
        ];
        for (i, place) in places.iter().enumerate() {
            let root = tempdir();
            write(&root.path().join("opt/app/exe"), &exe);
            // Earlier places hold a file of the right name but another CRC.
            for earlier in &places[..i] {
                write(&root.path().join(earlier), &wrong);
            }
            write(&root.path().join(place), &debug);
            let r = ElfFileRef::new("/opt/app/exe").with_root(root.path());
            let open = r.get().expect("exe");
            let found = r.find_debug_file(&open).expect("no error").expect(place);
            assert_eq!(found.path, root.path().join(place));
            assert_eq!(found.bytes_at(0, found.len()), Some(&debug[..]));
        }
        // Only wrong candidates, or none: nothing, and no error.
        let root = tempdir();
        write(&root.path().join("opt/app/exe"), &exe);
        let r = ElfFileRef::new("/opt/app/exe").with_root(root.path());
        let open = r.get().expect("exe");
        assert!(r.find_debug_file(&open).expect("no error").is_none());
        write(&root.path().join(places[0]), &wrong);
        assert!(r.find_debug_file(&open).expect("no error").is_none());
        // A file without a debug link has no debug file.
        let plain = ElfFileRef::new(testdata().join("upstream/vdso.arch64.withframe"));
        assert!(plain
            .find_debug_file(&plain.get().expect("vdso"))
            .expect("ok")
            .is_none());
    }

    #[test]
    fn untrusted_debug_files_and_links_are_not_used() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eim_test_support::skip::skip_unless_required(
                "EIM_REQUIRE_BPF",
                "untrusted_debug_files_and_links_are_not_used: chown needs root",
            );
            return;
        }
        let chown = |p: &Path, uid: u32| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: a valid path; the result is checked.
            assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, uid) }, 0);
        };
        let (exe, debug) = linked_pair(&[7, 7]);
        let root = tempdir();
        write(&root.path().join("opt/app/exe"), &exe);
        chown(&root.path().join("opt/app/exe"), 1000);
        let r = ElfFileRef::new("/opt/app/exe").with_root(root.path());
        let open = r.get().expect("exe");
        let place = root.path().join("opt/app/exe.debug");
        // Another user's debug file: not used.
        write(&place, &debug);
        chown(&place, 65534);
        assert!(
            r.find_debug_file(&open).expect("ok").is_none(),
            "another user's"
        );
        // The file's owner's, writable by others: not used.
        chown(&place, 1000);
        std::fs::set_permissions(&place, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .expect("chmod");
        assert!(
            r.find_debug_file(&open).expect("ok").is_none(),
            "writable by others"
        );
        // The file's owner's, writable by them only: used.
        std::fs::set_permissions(&place, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod");
        assert!(
            r.find_debug_file(&open).expect("ok").is_some(),
            "the owner's"
        );
        // Reached through a link the user planted: not used, whoever owns
        // the target.
        std::fs::rename(&place, root.path().join("real.debug")).expect("move");
        chown(&root.path().join("real.debug"), 0);
        std::os::unix::fs::symlink("/real.debug", &place).expect("link");
        chown(&place, 1000);
        assert!(
            r.find_debug_file(&open).expect("ok").is_none(),
            "a user's link"
        );
        // The same link, root's: followed.
        chown(&place, 0);
        assert!(
            r.find_debug_file(&open).expect("ok").is_some(),
            "root's link"
        );
    }

    #[test]
    fn by_build_id_alone_through_root_links_only() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eim_test_support::skip::skip_unless_required(
                "EIM_REQUIRE_BPF",
                "by_build_id_alone_through_root_links_only: chown needs root",
            );
            return;
        }
        let chown = |p: &Path, uid: u32| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
            // SAFETY: a valid path; the result is checked.
            assert_eq!(unsafe { libc::lchown(c.as_ptr(), uid, uid) }, 0);
        };
        let id = [0x5a, 0x11, 0x22];
        let (_, debug) = linked_pair(&id);
        let root = tempdir();
        let r = ElfFileRef::new("/opt/app/exe").with_root(root.path());
        let place = root.path().join("usr/lib/debug/.build-id/5a/1122.debug");
        // No debug link: only the build-id path, and no CRC to check.
        write(&place, &debug);
        let found = r.find_debug_file_by(1000, None, Some(&id)).expect("ok");
        assert_eq!(found.expect("found").path, place);
        assert!(r
            .find_debug_file_by(1000, None, None)
            .expect("ok")
            .is_none());
        // A link a user planted there (to a root-only file, say): not
        // followed; the same link root's: followed.
        std::fs::rename(&place, root.path().join("real.debug")).expect("move");
        chown(&root.path().join("real.debug"), 0);
        std::os::unix::fs::symlink("../../../../../real.debug", &place).expect("link");
        chown(&place, 1000);
        assert!(
            r.find_debug_file_by(1000, None, Some(&id))
                .expect("ok")
                .is_none(),
            "a user's link"
        );
        chown(&place, 0);
        assert!(
            r.find_debug_file_by(1000, None, Some(&id))
                .expect("ok")
                .is_some(),
            "root's link"
        );
        // A user's directory on the way is fine, a user's link there not.
        let dir = root.path().join("usr/lib/debug/.build-id/5a");
        std::fs::rename(&dir, root.path().join("elsewhere")).expect("move dir");
        std::os::unix::fs::symlink("/elsewhere", &dir).expect("dir link");
        chown(&dir, 1000);
        assert!(
            r.find_debug_file_by(1000, None, Some(&id))
                .expect("ok")
                .is_none(),
            "a user's directory link"
        );
    }

    #[test]
    fn without_a_root_the_search_starts_in_the_files_directory() {
        let (exe, debug) = linked_pair(&[1, 2, 3]);
        let dir = tempdir();
        write(&dir.path().join("exe"), &exe);
        write(&dir.path().join(".debug/exe.debug"), &debug);
        let r = ElfFileRef::new(dir.path().join("exe"));
        let open = r.get().expect("exe");
        let found = r.find_debug_file(&open).expect("ok").expect("found");
        assert_eq!(found.path, dir.path().join(".debug/exe.debug"));
    }

    #[test]
    fn a_vanished_root_is_not_found_not_an_error() {
        // The process exits while its file is analysed: its root goes, the
        // mapped file stays readable, the debug-file lookup hits ENOENT.
        let (exe, _debug) = linked_pair(&[9, 9]);
        let root = tempdir();
        write(&root.path().join("bin/exe"), &exe);
        let r = ElfFileRef::new("/bin/exe").with_root(root.path());
        let open = r.get().expect("exe");
        let root_path = root.path().to_path_buf();
        root.close().expect("remove the root");
        let e = r.find_debug_file(&open).expect_err("NotFound");
        assert_eq!(e.kind, ExtractErrorKind::NotFound, "{e}");
        assert!(e.message.contains(&root_path.display().to_string()), "{e}");
        assert_eq!(e.path, "/bin/exe");
        // Without a root, the file's directory plays that part.
        let dir = tempdir();
        let path = dir.path().join("exe");
        write(&path, &exe);
        let r = ElfFileRef::new(&path);
        let open = r.get().expect("exe");
        std::fs::remove_dir_all(dir.path()).expect("remove");
        assert_eq!(
            r.find_debug_file(&open).err().map(|e| e.kind),
            Some(ExtractErrorKind::NotFound)
        );
    }

    #[test]
    fn references_are_shareable() {
        fn sync_send<T: Sync + Send>() {}
        sync_send::<ElfFileRef>();
        sync_send::<Arc<OpenElf>>();
    }
}
