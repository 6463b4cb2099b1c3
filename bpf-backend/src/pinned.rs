//! The pinned maps read without owning them: what an owner left (or is
//! writing) in a pin directory, as a [`Dump`], and the lookup program run
//! over them ([`PinnedReader`]).
//!
//! A reader never takes the owner's exclusive lock: it probes it
//! ([`crate::lock::read_lock`]), so it can neither block a running owner
//! nor be refused by one, and it changes nothing. Every pin is first
//! opened read-only and checked; inner arrays are opened by the ids the
//! outer maps hold, which needs CAP_SYS_ADMIN. Read while an owner writes,
//! the maps are read within one generation of its writes
//! ([`crate::generation`], [`PinnedReader::snapshot`]); read after it
//! exited, they are what it left. A reader lets go of everything
//! ([`PinnedReader::release`]) before it prints.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::maps::MapData;
use aya::{Ebpf, EbpfLoader};
use eim_machine::FileId;

use eim_machine::abi::StackDelta;

use crate::error::KernelError;
use crate::generation::{self, Attempt, Patience, ReadError, Snapshot};
use crate::lock::{self, ReadLock};
use crate::lookup_record::LookupResult;
use crate::maps::{
    dump_from, open_by_id, read_deltas, run_lookup, take, Dump, DumpSource, KernelConfig,
    LOOKUP_OBJECT, PROGRAM, RESULT_MAP,
};
use crate::sys;

/// One pin, opened read-only and checked.
struct Pin {
    name: String,
    fd: OwnedFd,
    max_entries: u32,
}

/// Opens every map eim pins in `dir` read-only. A pin missing, not a map,
/// or of another type, key size or value size than eim's is an error (its
/// capacity may be any: the maps of a start with other capacities read the
/// same way).
fn open_pins(dir: &Path) -> Result<Vec<Pin>, KernelError> {
    let mut pins = Vec::new();
    for (name, want) in KernelConfig::default().owned_maps() {
        let path = dir.join(&name);
        let pin_error = |errno: i32, what| KernelError::Pin {
            path: path.clone(),
            what,
            cause: std::io::Error::from_raw_os_error(errno),
        };
        let fd = sys::obj_get_with(&path, sys::BPF_F_RDONLY)
            .map_err(|e| pin_error(e.errno, "opening the pin read-only"))?;
        let info =
            sys::map_info(fd.as_fd()).map_err(|e| pin_error(e.errno, "reading the map info of"))?;
        let shape = crate::pin::MapShape {
            max_entries: info.max_entries,
            ..want
        };
        if let Some(why) = shape.mismatch(&info) {
            return Err(crate::error::ShapeMismatch {
                dir: dir.to_path_buf(),
                maps: vec![(name, why)],
            }
            .into());
        }
        pins.push(Pin {
            name,
            fd,
            max_entries: info.max_entries,
        });
    }
    Ok(pins)
}

/// Opens the owner's generation counter of `dir` read-only
/// ([`crate::generation`]); `None` if there is none (pins of an eim from
/// before it: read unsynchronized, as that eim's readers did).
fn open_generation(dir: &Path) -> Result<Option<OwnedFd>, KernelError> {
    let path = dir.join(generation::NAME);
    let pin_error = |errno: i32, what| KernelError::Pin {
        path: path.clone(),
        what,
        cause: std::io::Error::from_raw_os_error(errno),
    };
    let fd = match sys::obj_get_with(&path, sys::BPF_F_RDONLY) {
        Ok(fd) => fd,
        Err(e) if e.is(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(pin_error(e.errno, "opening the pin read-only")),
    };
    let info =
        sys::map_info(fd.as_fd()).map_err(|e| pin_error(e.errno, "reading the map info of"))?;
    if let Some(why) = generation::shape().mismatch(&info) {
        return Err(crate::error::ShapeMismatch {
            dir: dir.to_path_buf(),
            maps: vec![(generation::NAME.to_string(), why)],
        }
        .into());
    }
    Ok(Some(fd))
}

/// Reads every map eim pins in `dir` (see `open_pins` for what is
/// refused), once, without the generation counter: a view that may span
/// the owner's writes (tests of maps no owner writes).
pub fn dump_pinned(dir: &Path) -> Result<Dump, KernelError> {
    match dump_pins(&open_pins(dir)?, &mut BTreeMap::new())? {
        Attempt::Read(dump) => Ok(dump),
        Attempt::Changed => Err(KernelError::Busy {
            dir: dir.to_path_buf(),
            owner: None,
            attempts: 1,
            waited: Duration::ZERO,
        }),
    }
}

/// Reads every map; [`Attempt::Changed`] if an inner array an outer map
/// named was gone by the time it was opened. `arrays`: see [`fill`].
fn dump_pins(
    pins: &[Pin],
    arrays: &mut BTreeMap<u32, Vec<StackDelta>>,
) -> Result<Attempt<Dump>, KernelError> {
    let (mut dump, tables) = listing(pins)?;
    Ok(if fill(&mut dump, &tables, arrays)? {
        Attempt::Read(dump)
    } else {
        Attempt::Changed
    })
}

/// One published table: its size class, file, and inner array's map id.
type Table = (u16, FileId, u32);

/// Every map but the inner arrays' contents (batch lookups only: the part
/// of a read that must fall within one generation), and the tables the
/// outer maps name.
fn listing(pins: &[Pin]) -> Result<(Dump, Vec<Table>), KernelError> {
    let [pages, unwind_info, interpreter_offsets, outers @ .., process_mappings] = pins else {
        return Err(KernelError::Missing("the pinned maps".into()));
    };
    let source = DumpSource {
        pages: pages.fd.as_fd(),
        unwind_info: unwind_info.fd.as_fd(),
        unwind_entries: unwind_info.max_entries,
        interpreter_offsets: interpreter_offsets.fd.as_fd(),
        outers: outers.iter().map(|pin| pin.fd.as_fd()).collect(),
        process_mappings: process_mappings.fd.as_fd(),
    };
    let mut tables = Vec::new();
    let dump = dump_from(&source, |class, file_id, id| {
        tables.push((class, file_id, id));
        Ok(Vec::new())
    })?;
    Ok((dump, tables))
}

/// Fills in the deltas of every table of `tables` (each named by the
/// listing `dump` came from); `false` if an inner array was gone by the
/// time it was opened (the table was removed since: a change). `arrays`
/// holds what earlier attempts read, by map id: a published array is never
/// written, so only arrays not read yet are read (see
/// [`crate::generation`]).
fn fill(
    dump: &mut Dump,
    tables: &[Table],
    arrays: &mut BTreeMap<u32, Vec<StackDelta>>,
) -> Result<bool, KernelError> {
    let named: BTreeSet<u32> = tables.iter().map(|(_, _, id)| *id).collect();
    // Arrays no longer published are of no later attempt.
    arrays.retain(|id, _| named.contains(id));
    for &(class, file_id, id) in tables {
        let deltas = match arrays.get(&id) {
            Some(deltas) => deltas.clone(),
            None => {
                let inner = match open_by_id(class, file_id, id) {
                    Ok(inner) => inner,
                    Err(KernelError::InnerArray { cause, .. }) if cause.is(libc::ENOENT) => {
                        return Ok(false)
                    }
                    Err(e) => return Err(e),
                };
                let deltas = read_deltas(inner.as_fd(), class)?;
                arrays.insert(id, deltas.clone());
                deltas
            }
        };
        if let Some((_, table)) = dump.delta_tables.get_mut(&(class, file_id)) {
            *table = deltas;
        }
    }
    dump.live_inner_maps = tables.len();
    Ok(true)
}

/// How many snapshots [`PinnedReader::snapshot`] takes at most when
/// tables it named are removed before their arrays are read.
pub const SNAPSHOTS: usize = 20;

/// The pinned maps of a directory, read as the profiler's BPF program
/// reads them: dumped, and looked up through eim's lookup program loaded
/// over the pins themselves.
pub struct PinnedReader {
    dir: PathBuf,
    pins: Vec<Pin>,
    /// The owner's generation counter, read-only (`None`: pins of an eim
    /// from before it).
    generation: Option<OwnedFd>,
    ebpf: Ebpf,
    result: MapData,
    /// Last: released after every map's fd is closed.
    lock: ReadLock,
}

impl PinnedReader {
    /// Opens the maps pinned in `dir` (resolved as an owner resolves it, so
    /// that both find the same lock), after asking for the shared lock.
    pub fn open(dir: &Path) -> Result<Self, KernelError> {
        let dir = lock::resolve(dir).map_err(|e| KernelError::Pin {
            path: dir.to_path_buf(),
            what: "resolving the pin directory",
            cause: e,
        })?;
        let lock = lock::read_lock(&dir)?;
        let pins = open_pins(&dir)?;
        let generation = open_generation(&dir)?;
        // The program's map references are relocated to the pins: aya
        // re-opens a pin that exists. Every pin was just seen to exist,
        // and while this reader holds the shared lock no owner can start
        // and replace one (an owner never removes its pins).
        let mut loader = EbpfLoader::new();
        for pin in &pins {
            loader.map_max_entries(&pin.name, pin.max_entries);
            loader.map_pin_path(&pin.name, dir.join(&pin.name));
        }
        let mut ebpf = loader.load(LOOKUP_OBJECT)?;
        let program: &mut aya::programs::RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| KernelError::Missing(format!("program {PROGRAM}")))?
            .try_into()?;
        program.load()?;
        let result = take(&mut ebpf, RESULT_MAP)?;
        Ok(Self {
            dir,
            pins,
            generation,
            ebpf,
            result,
            lock,
        })
    }

    /// The pin directory, resolved.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the shared lock said: whether an owner runs, and who.
    pub fn lock(&self) -> &ReadLock {
        &self.lock
    }

    /// The capacity of `unwind_info_array` as pinned.
    pub fn unwind_slots(&self) -> u32 {
        self.pins.get(1).map_or(0, |pin| pin.max_entries)
    }

    /// Whether the pins have a generation counter (pins of an eim from
    /// before it have none, and are read unsynchronized).
    pub fn has_generation(&self) -> bool {
        self.generation.is_some()
    }

    /// The owner's generation counter now (`None`: no counter).
    pub fn generation(&self) -> Result<Option<u64>, KernelError> {
        self.generation
            .as_ref()
            .map(|fd| generation::read(fd.as_fd()))
            .transpose()
            .map_err(KernelError::from)
    }

    /// Runs `read` within one even generation ([`crate::generation`]):
    /// retried as `patience` says while an owner runs; once when none
    /// does, or the pins have no counter (a counter left odd then is an
    /// owner that stopped mid-write: the read is marked torn).
    pub fn consistent<T>(
        &self,
        patience: Patience,
        mut read: impl FnMut() -> Result<Attempt<T>, KernelError>,
    ) -> Result<Snapshot<T>, KernelError> {
        let Some(counter) = &self.generation else {
            return match read()? {
                Attempt::Read(value) => Ok(Snapshot::Torn { value, attempts: 1 }),
                Attempt::Changed => Err(self.busy(1, Duration::ZERO)),
            };
        };
        let patience = if self.lock.is_owned() {
            patience
        } else {
            Patience {
                attempts: 1,
                ..patience
            }
        };
        // Asking the owner for a window: the readers' file held shared
        // around each attempt (see [`crate::generation`]).
        let readers = lock::readers_file(&self.dir).ok();
        let out = generation::read_consistent(
            || generation::read(counter.as_fd()).map_err(KernelError::from),
            &mut read,
            patience,
            std::thread::sleep,
            |open| match (&readers, open, &self.lock) {
                // Holding it for the whole read already.
                (_, _, ReadLock::Held { .. }) | (None, ..) => {}
                (Some(file), true, _) => {
                    lock::hold_shared(file);
                }
                (Some(file), false, _) => lock::let_go(file),
            },
        );
        match out {
            Ok(snapshot) => Ok(snapshot),
            Err(ReadError::Failed(e)) => Err(e),
            // No owner runs and the counter is odd: the last owner stopped
            // mid-write, and nothing will change it until the next starts.
            Err(ReadError::NoRead { .. }) if !self.lock.is_owned() => match read()? {
                Attempt::Read(value) => Ok(Snapshot::Torn { value, attempts: 1 }),
                Attempt::Changed => Err(self.busy(1, Duration::ZERO)),
            },
            Err(ReadError::NoRead { attempts, waited }) => Err(self.busy(attempts, waited)),
        }
    }

    fn busy(&self, attempts: u32, waited: Duration) -> KernelError {
        KernelError::Busy {
            dir: self.dir.clone(),
            owner: self.lock.owner(),
            attempts,
            waited,
        }
    }

    /// Reads every map, within one generation of the owner's writes (see
    /// [`Self::consistent`]).
    ///
    /// Only the batch lookups need fall within one generation: the inner
    /// arrays the snapshot names are read after it (a published array is
    /// never written). One that is gone by then was removed since: another
    /// snapshot is taken (at most [`SNAPSHOTS`]), reading again only the
    /// arrays it has not read yet.
    pub fn snapshot(&self, patience: Patience) -> Result<Snapshot<Dump>, KernelError> {
        let mut arrays = BTreeMap::new();
        let mut attempts = 0;
        for _ in 0..SNAPSHOTS {
            let taken = self.consistent(patience, || listing(&self.pins).map(Attempt::Read))?;
            attempts += taken.attempts();
            let (generation, consistent) = match &taken {
                Snapshot::Consistent { generation, .. } => (*generation, true),
                Snapshot::Torn { .. } => (0, false),
            };
            let (mut dump, tables) = taken.into_value();
            if !fill(&mut dump, &tables, &mut arrays)? {
                continue;
            }
            return Ok(if consistent {
                Snapshot::Consistent {
                    value: dump,
                    generation,
                    attempts,
                }
            } else {
                Snapshot::Torn {
                    value: dump,
                    attempts,
                }
            });
        }
        Err(self.busy(attempts, Duration::ZERO))
    }

    /// Reads every map once, whatever the owner does meanwhile.
    pub fn dump(&self) -> Result<Dump, KernelError> {
        match dump_pins(&self.pins, &mut BTreeMap::new())? {
            Attempt::Read(dump) => Ok(dump),
            Attempt::Changed => Err(self.busy(1, Duration::ZERO)),
        }
    }

    /// Runs the lookup program over the pins for `address` of `file_id`.
    pub fn lookup(&self, file_id: FileId, address: u64) -> Result<LookupResult, KernelError> {
        run_lookup(&self.ebpf, &self.result, file_id, address)
    }

    /// [`Self::lookup`] within one generation of the owner's writes.
    pub fn lookup_consistent(
        &self,
        file_id: FileId,
        address: u64,
    ) -> Result<Snapshot<LookupResult>, KernelError> {
        self.consistent(Patience::READERS, || {
            self.lookup(file_id, address).map(Attempt::Read)
        })
    }

    /// Lets go of the shared lock and closes every pin: what a reader does
    /// once it has its snapshot, before it prints (a reader blocked on its
    /// output must not keep an owner from starting).
    pub fn release(self) {
        drop(self);
    }

    /// Runs the unwinder over the pins and `capture`
    /// ([`KernelMaps::unwind_capture`](crate::KernelMaps::unwind_capture)).
    pub fn unwind_capture(
        &mut self,
        capture: &eim_machine::unwind::Capture,
    ) -> Result<eim_machine::unwind::Stack, KernelError> {
        crate::unwind::run_capture(&mut self.ebpf, capture)
    }

    /// The stack of every thread of `pid`, walked over the pins
    /// ([`KernelMaps::task_stacks`](crate::KernelMaps::task_stacks)).
    pub fn task_stacks(
        &mut self,
        pid: u32,
    ) -> Result<Vec<eim_machine::unwind::Stack>, KernelError> {
        crate::unwind::task_stacks(&mut self.ebpf, pid)
    }
}
