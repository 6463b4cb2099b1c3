//! [`KernelMaps`]: eim's maps in the running kernel, and the [`Backend`]
//! that applies [`MapOp`]s to them.
//!
//! The maps come from the committed lookup object (`bpf/lookup.bpf.o`,
//! embedded): loading it with aya creates the 19 maps from their BTF
//! definitions (the outer maps with their inner templates, which aya cannot
//! create on its own) and the lookup program, which [`KernelMaps::lookup`]
//! runs with `BPF_PROG_TEST_RUN`.
//!
//! Every op is carried out exactly as `eim_sim::SimMaps` simulates it, with
//! the batch syscalls of [`crate::sys`]:
//!
//! * `PutUnwindInfos`: one `UPDATE_BATCH`; on failure `done` is the kernel's
//!   processed count.
//! * `PutDeltaTable`: create the inner ARRAY of 2^class entries
//!   (`BPF_F_MMAPABLE`, as the outer maps' templates say), fill it through
//!   a shared mapping of its values (one copy, no syscall per element: an
//!   `UPDATE_BATCH` copies and checks every element in the kernel, 0.5 us
//!   each), publish it with one `BPF_NOEXIST` update of the
//!   outer map. All or nothing: on any failure the new inner fd is closed
//!   (freeing the unpublished array) and `done` is 0. On success the fd is
//!   closed too: the outer map's reference keeps the array alive (see
//!   "Descriptors" below).
//! * `PutDeltaTables`: create and fill the inner ARRAY of every table (as
//!   above), then publish them all with ONE `UPDATE_BATCH` of
//!   the outer map whose values are the inner fds: one map-in-map RCU wait
//!   (about 8 ms) for the whole batch instead of one per table. A batch
//!   cannot ask for `BPF_NOEXIST`, so absence is checked against the tables
//!   this backend published; the absent prefix is published and `EEXIST`
//!   reported at the first present (or repeated) file id. `done` counts the
//!   tables published (a failed create or fill publishes nothing more); the
//!   fds of every array are closed once the outer map holds it, and those
//!   of unpublished arrays free them. An op of more tables than
//!   [`KernelConfig::arrays_in_flight`] is carried out in chunks of that
//!   many, each created, filled and published before the next is created
//!   (one outer update per chunk), so that one op never holds more
//!   descriptors than that, whatever the host: an op of at most that many
//!   tables behaves exactly as `eim_sim::SimMaps` models it; a longer one
//!   that fails in a later chunk reports the earlier chunks as `done`.
//! * `PutPages`: a batch cannot ask for `BPF_NOEXIST`, so absence is checked
//!   against the page keys this backend wrote (no syscall per key); the
//!   absent prefix is written with one `UPDATE_BATCH`, and `EEXIST` is
//!   reported at the first present (or repeated) key.
//! * `DeletePages`: one `DELETE_BATCH` (stops at the first missing key).
//! * `DeleteDeltaTable`, interpreter offsets: one single-element call.
//!
//! With [`KernelConfig::write_mode`] set to [`WriteMode::PerElement`],
//! every run above is written with one single-element call per element
//! instead (and a batch of tables is published one outer update per
//! table), with the same partial-failure counts: the baseline the batches
//! are measured against ([`crate::elements`]).
//!
//! The page-key set assumes this backend is the only writer of the page
//! map, which holds for maps it created itself.
//!
//! # Descriptors
//!
//! An inner array needs a descriptor only from its creation until the outer
//! map holds it (create, fill, publish): the outer map's entry is a
//! reference of its own, and readers (the BPF program) go through it. So
//! [`KernelMaps`] keeps no descriptor per loaded file: what it keeps per
//! table is its key, (size class, file id), the set of tables it published,
//! which is what a batch publish checks absence against and what the dump
//! checks each outer entry against ([`KernelError::Untracked`]). A host with
//! thousands of files then holds the same few dozen descriptors as an empty
//! one (the 19 maps, the program, the lock), and a process limit of 1,024
//! (a service's default soft limit) or less is no limit on the files it
//! loads. An array is opened again only where its contents are read, by
//! the id its outer map's value gives (`BPF_MAP_GET_FD_BY_ID`, read-only),
//! and closed right after: [`KernelMaps::dump`], [`KernelMaps::observed`],
//! [`KernelMaps::open_inner`]. Deleting a table is a delete of its outer
//! entry (the kernel frees the array once no reader holds it), publishing
//! needs only the creator's fd, and a warm restart adopts a table by its
//! key alone. The cost: reading a table back needs CAP_SYS_ADMIN (opening
//! a map by id), where holding the fd did not; eim runs as root, and the
//! restart's adoption already read the arrays that way. The alternative, an
//! fd per file, made a host of 2,394 files hold 2,394 descriptors and made
//! one batch fail whole with EMFILE under a soft limit of 1,024.
//!
//! `Dump::live_inner_maps` counts the inner arrays the outer maps keep
//! alive: each opened by the id its outer entry holds and read. This
//! backend holds none itself after an op, so an array it created cannot
//! outlive its publication through it; the simulator's count (arrays
//! alive, published or leaked) is the same number when nothing leaks.
//!
//! # Pinning
//!
//! With [`KernelConfig::pin_dir`] set, the 19 maps eim owns (the page map,
//! the unwind-info array, the interpreter offsets and the 16 outer maps;
//! not the lookup program's private result map) live pinned by name in that
//! directory. The pin directory has one owner: before anything in it is
//! created, mounted or read, the start takes an exclusive lock
//! ([`crate::lock`]) that the [`KernelMaps`] hold until they are dropped; a
//! second start is refused with the owner's pid. The directory must be on
//! a bpffs; eim mounts one only under `/sys/fs/bpf` or when
//! [`KernelConfig::mount_bpffs`] asks, and only on an empty directory
//! ([`crate::bpffs`]). Each pin found there is checked against the expected
//! type, key size, value size and max_entries, and a start over a pin of
//! another shape is refused unless [`KernelConfig::recreate_mismatched`]
//! asks to replace it ([`crate::pin::check_pins`]); the pin paths are then
//! given to aya with `EbpfLoader::map_pin_path`, which re-opens a pin that
//! exists and otherwise creates the map and pins it. Loading the object
//! that way (rather than loading it and then swapping in maps opened with
//! `MapData::from_pin`) is what makes the lookup program itself read the
//! pinned maps: aya relocates the program's map references to whatever
//! maps it loaded. [`KernelMaps::pin_report`] says where a bpffs was
//! mounted and, per map, whether it was created, re-opened or replaced
//! (and why).
//!
//! # Restarts: reconcile, clean only as a fallback
//!
//! eim's book (which file owns which slot, table and page) lives only in
//! the process; the maps alone cannot say which of their entries are
//! right. The files' deltas can: with [`KernelConfig::adopt_pins`] (what
//! `eim scan` and `eim watch` use), re-opened pins keep their entries (the
//! backend takes the key of every published table and the page keys, as
//! if it had written them), and the caller walks the host, extracts the
//! files mapped now and hands [`KernelMaps::observed`] to
//! [`eim_core::ExecutableInfoManager::restart`], which adopts every table
//! that is exactly what a fresh load would write, removes the rest
//! top-down and loads what is missing (`docs/ARCHITECTURE.md`, "Warm
//! restart: reconcile"). A file that stays mapped is never unresolvable.
//!
//! [`KernelMaps::observed`] adds to the dump the lock file's record of
//! when an earlier owner last zeroed an `unwind_info_array` slot
//! ([`crate::lock::SlotsZeroed`]): a rollback zeroes slots right after
//! unpublishing the table that used them, so zero slots may be handed out
//! again at once once a grace has passed since then. [`KernelMaps`]
//! writes that record before every write of a zero into a slot (and
//! "never" when a start creates the maps).
//!
//! When the reconcile refuses what it finds (shapes eim never writes), or
//! without `adopt_pins`, the fallback is to **clean**: every entry eim
//! owns is removed before the maps are used, in the order an unload uses,
//! so that a reader running meanwhile never follows a page to a missing
//! table or a table to a cleared slot it still reads:
//!
//! 1. every page entry (the keys read with `LOOKUP_BATCH`, removed with one
//!    `DELETE_BATCH`), and every interpreter-offsets entry;
//! 2. every outer-map entry of every size class (one `DELETE_BATCH` per
//!    class that has any, so one RCU wait each), which frees the inner
//!    arrays the dead process left referenced only by the outer maps;
//! 3. every non-zero `unwind_info_array` slot, zeroed with one
//!    `UPDATE_BATCH`.
//!
//! The counts removed are in [`PinReport::cleaned`]. Adopting and cleaning
//! are safe only because no other live process owns the directory: the
//! lock makes a second start fail before it reads a pin.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use aya::maps::{Map, MapData};
use aya::programs::{RawTracePoint, RawTracePointRunOptions, TestRun};
use aya::{Ebpf, EbpfLoader};
use eim_machine::abi::flatten;
use eim_machine::abi::{
    self, capacity, OffsetRange, ProcessMappings, StackDelta, StackDeltaPageInfo,
    StackDeltaPageKey, UnwindInfo, Wire, SIZE_CLASS_COUNT, SIZE_CLASS_MAX, SIZE_CLASS_MIN,
};
use eim_machine::ops::{self, Backend, Errno, MapOp, OpFailure, OpTarget};
use eim_machine::FileId;

use crate::bpffs;
use crate::elements::{self, WriteMode};
use crate::error::KernelError;
use crate::generation::{self, Generation};
use crate::lock::{self, PinLock};
use crate::lookup_record::{LookupResult, RESULT_SIZE};
use crate::pin::{self, MapShape, PinReport};
use crate::stats::MapStats;
use crate::sys::{self, SysError};

mod writes;

/// The compiled lookup program and map definitions (`bpf/build.sh`).
pub static LOOKUP_OBJECT: &[u8] = include_bytes!("../../bpf/lookup.bpf.o");

pub(crate) const PROGRAM: &str = "eim_lookup";
pub(crate) const RESULT_MAP: &str = "eim_lookup_result";

/// Capacities of the maps (the object's values are the defaults; tests use
/// tiny ones to reach the limits), and where to pin them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    pub unwind_info: u32,
    pub interpreter_offsets: u32,
    pub pages: u32,
    pub outer: u32,
    /// A directory to pin the maps in (for example `/sys/fs/bpf/eim`), or
    /// `None` for maps that live only as long as this process holds them.
    /// See the module documentation.
    pub pin_dir: Option<PathBuf>,
    /// With `pin_dir`: mount a bpffs on it if it is not on one (an empty
    /// directory only). Without this, eim mounts only under `/sys/fs/bpf`
    /// (see [`crate::bpffs`]).
    pub mount_bpffs: bool,
    /// With `pin_dir`: replace pins whose shape differs from the expected
    /// one, instead of refusing to start ([`crate::pin::check_pins`]).
    pub recreate_mismatched: bool,
    /// Batch calls (the default), or one call per element: the baseline
    /// the batches are measured against, and what a kernel older than 5.6
    /// supports for writes.
    pub write_mode: WriteMode,
    /// With `pin_dir`: keep the entries of re-opened pins instead of
    /// cleaning them, for a caller that reconciles them
    /// ([`eim_core::ExecutableInfoManager::restart`] over [`Dump::observed`])
    /// and cleans ([`KernelMaps::clean_pins`]) only if the reconcile does
    /// not trust what it finds. See "Restarts" above.
    pub adopt_pins: bool,
    /// The most inner arrays a `PutDeltaTables` holds open at once (created
    /// and filled, not yet published): each is a descriptor until the
    /// outer map holds it. A longer op is published in chunks of this many,
    /// one outer-map update (so one RCU wait) each. See "Descriptors".
    pub arrays_in_flight: usize,
}

/// [`KernelConfig::arrays_in_flight`] by default: a host batch of up to 256
/// files (`eim`'s default `batch_files`) publishes each size class with one
/// outer update, and 256 descriptors fit a soft limit of 1,024.
pub const DEFAULT_ARRAYS_IN_FLIGHT: usize = 256;

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            unwind_info: capacity::UNWIND_INFO,
            interpreter_offsets: capacity::INTERPRETER_OFFSETS,
            pages: capacity::PAGES,
            outer: capacity::OUTER,
            pin_dir: None,
            mount_bpffs: false,
            recreate_mismatched: false,
            write_mode: WriteMode::Batch,
            adopt_pins: false,
            arrays_in_flight: DEFAULT_ARRAYS_IN_FLIGHT,
        }
    }
}

impl KernelConfig {
    /// The maps eim owns, by name, with the shape each must have.
    pub fn owned_maps(&self) -> Vec<(String, MapShape)> {
        let shape = |map_type, key: usize, value: usize, max_entries| MapShape {
            map_type,
            key_size: key as u32,
            value_size: value as u32,
            max_entries,
            inner_entries: None,
            required_flags: 0,
        };
        let mut maps = vec![
            (
                abi::map_name::PAGES.to_string(),
                shape(
                    sys::map_type::HASH,
                    StackDeltaPageKey::SIZE,
                    StackDeltaPageInfo::SIZE,
                    self.pages,
                ),
            ),
            (
                abi::map_name::UNWIND_INFO.to_string(),
                shape(
                    sys::map_type::ARRAY,
                    u32::SIZE,
                    UnwindInfo::SIZE,
                    self.unwind_info,
                ),
            ),
            (
                abi::map_name::INTERPRETER_OFFSETS.to_string(),
                shape(
                    sys::map_type::HASH,
                    u64::SIZE,
                    OffsetRange::SIZE,
                    self.interpreter_offsets,
                ),
            ),
        ];
        maps.extend((SIZE_CLASS_MIN..=SIZE_CLASS_MAX).map(|class| {
            (
                abi::map_name::outer(class),
                MapShape {
                    inner_entries: abi::class_entries(class),
                    ..shape(
                        sys::map_type::HASH_OF_MAPS,
                        u64::SIZE,
                        u32::SIZE,
                        self.outer,
                    )
                },
            )
        }));
        // Last, after the outer maps (their position is relied on).
        maps.push((
            abi::map_name::PROCESS_MAPPINGS.to_string(),
            shape(
                sys::map_type::HASH,
                u32::SIZE,
                ProcessMappings::SIZE,
                abi::capacity::PROCESSES,
            ),
        ));
        maps
    }
}

/// Every map's contents, decoded into the shapes `eim_sim::SimMaps`
/// exposes, for differential tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    pub pages: BTreeMap<StackDeltaPageKey, StackDeltaPageInfo>,
    /// Published delta arrays by (class, file id): their capacity and their
    /// entries up to the last non-zero one (what `InnerTable::entries` gives).
    pub delta_tables: BTreeMap<(u16, FileId), (u32, Vec<StackDelta>)>,
    /// Every `unwind_info_array` slot.
    pub unwind_infos: Vec<UnwindInfo>,
    pub interpreter_offsets: BTreeMap<FileId, OffsetRange>,
    /// `eim_process_mappings` by pid.
    pub process_mappings: BTreeMap<u32, ProcessMappings>,
    /// Inner arrays the outer maps keep alive: each opened by the id its
    /// outer entry holds, and read (see "Descriptors" in the module docs).
    pub live_inner_maps: usize,
}

impl Dump {
    /// What a warm restart's reconcile reads (the tables without their
    /// capacity, which their size class says). A dump has no record of
    /// when a slot was last zeroed: [`KernelMaps::observed`] adds the pin
    /// directory's.
    pub fn observed(&self) -> eim_machine::machine::Observed {
        eim_machine::machine::Observed {
            pages: self.pages.clone(),
            delta_tables: self
                .delta_tables
                .iter()
                .map(|(key, (_, deltas))| (*key, deltas.clone()))
                .collect(),
            unwind_infos: self.unwind_infos.clone(),
            interpreter_offsets: self.interpreter_offsets.clone(),
            process_mappings: self.process_mappings.clone(),
            zeroed_ago: None,
        }
    }
}

/// The keys of every entry eim owns, as flat buffers per map.
struct Keys {
    pages: Vec<u8>,
    interpreter_offsets: Vec<u8>,
    /// The pids of `eim_process_mappings`.
    processes: Vec<u8>,
    /// Per size class with entries: the file ids.
    tables: Vec<(u16, Vec<u8>)>,
    /// Non-zero unwind slots.
    unwind_slots: Vec<u32>,
}

impl Keys {
    fn stats(&self) -> MapStats {
        MapStats {
            pages: self.pages.len() / StackDeltaPageKey::SIZE,
            tables: self
                .tables
                .iter()
                .map(|(class, keys)| (*class, keys.len() / u64::SIZE))
                .collect(),
            unwind_slots: self.unwind_slots.len(),
            interpreter_offsets: self.interpreter_offsets.len() / u64::SIZE,
            processes: self.processes.len() / u32::SIZE,
        }
    }
}

/// eim's maps in the kernel.
pub struct KernelMaps {
    config: KernelConfig,
    ebpf: Ebpf,
    pages: MapData,
    unwind_info: MapData,
    interpreter_offsets: MapData,
    outers: Vec<MapData>,
    process_mappings: MapData,
    result: MapData,
    /// The tables this backend published (or adopted), by (class, file
    /// id): their keys only, no descriptor (see "Descriptors").
    published: BTreeSet<(u16, FileId)>,
    /// The page keys present in the page map.
    page_keys: BTreeSet<StackDeltaPageKey>,
    pin_report: Option<PinReport>,
    /// Update calls (single or batch) issued on outer maps: each one waits
    /// for an RCU grace period.
    outer_updates: u64,
    /// The pin directory's generation counter ([`crate::generation`]),
    /// made odd around every run of writes; `None` without a pin directory
    /// (no other process reads the maps then).
    generation: Option<Generation>,
    /// The pin directory's lock: this process owns it until the maps are
    /// dropped. Last, so it is released after every map's fd is closed.
    owner: Option<PinLock>,
}

pub(crate) fn take(ebpf: &mut Ebpf, name: &str) -> Result<MapData, KernelError> {
    match ebpf.take_map(name) {
        Some(Map::HashMap(m) | Map::Array(m) | Map::HashOfMaps(m)) => Ok(m),
        _ => Err(KernelError::Missing(format!("map {name}"))),
    }
}

fn fd(map: &MapData) -> BorrowedFd<'_> {
    map.fd().as_fd()
}

impl KernelMaps {
    /// Creates fresh maps with the default capacities and loads the lookup
    /// program.
    pub fn new() -> Result<Self, KernelError> {
        Self::with_config(KernelConfig::default())
    }

    /// Creates the maps with the given capacities (fresh ones, or the ones
    /// pinned in `config.pin_dir`, see the module documentation).
    pub fn with_config(config: KernelConfig) -> Result<Self, KernelError> {
        let mut owner = None;
        let opened = Self::open(config, &mut owner);
        // Refused: everything `open` did is undone (a bpffs it mounted is
        // unmounted); the lock goes last, with its file if this start made
        // it (see "A refused directory leaves no lock file" in
        // [`crate::lock`]).
        if opened.is_err() {
            if let Some(lock) = owner.take() {
                lock.discard();
            }
        }
        opened
    }

    /// [`Self::with_config`], the lock taken into `owner` (and moved into
    /// the maps on success).
    fn open(mut config: KernelConfig, owner: &mut Option<PinLock>) -> Result<Self, KernelError> {
        let owned = config.owned_maps();
        // Locked before the directory is created, mounted or read (see
        // [`crate::lock`]); on any error below, released by the caller
        // after a bpffs this start mounted is unmounted.
        let mut counter = None;
        let mut mounted = None;
        let mut pin_report = None;
        if let Some(given) = &config.pin_dir {
            let dir = lock::resolve(given).map_err(|e| KernelError::Pin {
                path: given.clone(),
                what: "resolving the pin directory",
                cause: e,
            })?;
            let lock_file = owner.insert(PinLock::exclusive(&dir)?).path().to_path_buf();
            mounted = bpffs::prepare(&dir, config.mount_bpffs)?;
            let mut checked = owned.clone();
            checked.push((generation::NAME.to_string(), generation::shape()));
            let maps = pin::check_pins(&dir, &checked, config.recreate_mismatched)?;
            let mut opened = crate::generation::open_pinned(&dir, &maps)?;
            opened.yield_to_readers(lock::readers_file(&dir)?);
            counter = Some(opened);
            pin_report = Some(PinReport {
                dir: dir.clone(),
                mounted: None,
                lock_file,
                maps,
                cleaned: None,
            });
            config.pin_dir = Some(dir);
        }
        let mut loader = EbpfLoader::new();
        for (name, shape) in &owned {
            loader.map_max_entries(name, shape.max_entries);
            if let Some(dir) = &config.pin_dir {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let outer_names = &owned[3..3 + SIZE_CLASS_COUNT];
        let mut ebpf = loader.load(LOOKUP_OBJECT)?;
        let clean = pin_report.as_ref().is_some_and(PinReport::any_reopened);
        let program: &mut RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| KernelError::Missing(format!("program {PROGRAM}")))?
            .try_into()?;
        program.load()?;
        let pages = take(&mut ebpf, abi::map_name::PAGES)?;
        let unwind_info = take(&mut ebpf, abi::map_name::UNWIND_INFO)?;
        let interpreter_offsets = take(&mut ebpf, abi::map_name::INTERPRETER_OFFSETS)?;
        let result = take(&mut ebpf, RESULT_MAP)?;
        let process_mappings = take(&mut ebpf, abi::map_name::PROCESS_MAPPINGS)?;
        let outers = outer_names
            .iter()
            .map(|(name, _)| take(&mut ebpf, name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut maps = Self {
            config,
            ebpf,
            pages,
            unwind_info,
            interpreter_offsets,
            outers,
            process_mappings,
            result,
            published: BTreeSet::new(),
            page_keys: BTreeSet::new(),
            pin_report,
            outer_updates: 0,
            generation: counter,
            owner: None,
        };
        if !clean {
            if let Some(owner) = owner.as_mut() {
                let path = owner.path().to_path_buf();
                owner.record_fresh_maps().map_err(|e| KernelError::Pin {
                    path,
                    what: "recording fresh maps in the lock file",
                    cause: e,
                })?;
            }
        }
        if clean && maps.config.adopt_pins {
            maps.track_pinned()?;
        } else if clean {
            maps.clean_pins()?;
        }
        // Started: a bpffs mounted for the pins stays.
        if let (Some(report), Some(mounted)) = (&mut maps.pin_report, mounted) {
            report.mounted = Some(mounted.keep());
        }
        maps.owner = owner.take();
        Ok(maps)
    }

    /// Removes every entry of re-opened pins (see "Restarts"), says
    /// how many of each in the pin report, and returns the counts. The
    /// fallback of a start that was asked to adopt the pins
    /// ([`KernelConfig::adopt_pins`]) when the reconcile refuses them.
    pub fn clean_pins(&mut self) -> Result<MapStats, KernelError> {
        let cleaned = self.clean()?;
        if let Some(report) = &mut self.pin_report {
            report.cleaned = Some(cleaned.clone());
        }
        Ok(cleaned)
    }

    /// Takes over the entries of re-opened pins as if this backend had
    /// written them: the key of every published table (no descriptor: the
    /// outer map keeps each array alive) and the present page keys, so that
    /// the ops a reconcile plans (removals of tables and pages, new pages)
    /// apply exactly as on maps this process filled.
    fn track_pinned(&mut self) -> Result<(), KernelError> {
        self.page_keys = self
            .page_keys_raw()?
            .chunks(StackDeltaPageKey::SIZE)
            .filter_map(StackDeltaPageKey::read)
            .collect();
        for (class, outer) in (SIZE_CLASS_MIN..=SIZE_CLASS_MAX).zip(&self.outers) {
            let (keys, _) = sys::lookup_all(fd(outer), u64::SIZE, u32::SIZE, 1024)?;
            self.published.extend(
                keys.chunks(u64::SIZE)
                    .filter_map(u64::read)
                    .map(|file| (class, FileId(file))),
            );
        }
        Ok(())
    }

    /// Every key of the page map, as raw bytes (`LOOKUP_BATCH`es of 1024).
    fn page_keys_raw(&self) -> Result<Vec<u8>, KernelError> {
        let (keys, _) = sys::lookup_all(
            fd(&self.pages),
            StackDeltaPageKey::SIZE,
            StackDeltaPageInfo::SIZE,
            1024,
        )?;
        Ok(keys)
    }

    /// The keys of every entry eim owns (one `LOOKUP_BATCH` per map, more
    /// for big hashes).
    fn keys(&self) -> Result<Keys, KernelError> {
        let pages = self.page_keys_raw()?;
        let (interpreter_offsets, _) = sys::lookup_all(
            fd(&self.interpreter_offsets),
            u64::SIZE,
            OffsetRange::SIZE,
            64,
        )?;
        let (processes, _) = sys::lookup_all(
            fd(&self.process_mappings),
            u32::SIZE,
            ProcessMappings::SIZE,
            64,
        )?;
        let mut tables = Vec::new();
        for (class, outer) in (SIZE_CLASS_MIN..=SIZE_CLASS_MAX).zip(&self.outers) {
            let (keys, _) = sys::lookup_all(fd(outer), u64::SIZE, u32::SIZE, 1024)?;
            if !keys.is_empty() {
                tables.push((class, keys));
            }
        }
        let (slots, infos) = sys::lookup_all(
            fd(&self.unwind_info),
            u32::SIZE,
            UnwindInfo::SIZE,
            self.config.unwind_info as usize,
        )?;
        let unwind_slots = slots
            .chunks(u32::SIZE)
            .zip(infos.chunks(UnwindInfo::SIZE))
            .filter(|(_, info)| info.iter().any(|b| *b != 0))
            .filter_map(|(slot, _)| u32::read(slot))
            .collect();
        Ok(Keys {
            pages,
            interpreter_offsets,
            processes,
            tables,
            unwind_slots,
        })
    }

    /// How many entries each map holds, as the kernel says.
    pub fn stats(&self) -> Result<MapStats, KernelError> {
        Ok(self.keys()?.stats())
    }

    /// Removes every entry eim owns, top-down (see "Restarts" in the
    /// module documentation), and says how many of each.
    fn clean(&mut self) -> Result<MapStats, KernelError> {
        self.begin_writes();
        let cleaned = self.clean_bracketed();
        self.end_writes();
        cleaned
    }

    fn clean_bracketed(&mut self) -> Result<MapStats, KernelError> {
        let keys = self.keys()?;
        let stats = keys.stats();
        let mode = self.config.write_mode;
        elements::delete(mode, fd(&self.pages), &keys.pages, stats.pages)?;
        elements::delete(
            mode,
            fd(&self.interpreter_offsets),
            &keys.interpreter_offsets,
            stats.interpreter_offsets,
        )?;
        elements::delete(
            mode,
            fd(&self.process_mappings),
            &keys.processes,
            stats.processes,
        )?;
        for (class, files) in &keys.tables {
            if let Some(outer) = self.outer(*class) {
                elements::delete(mode, fd(outer), files, files.len() / u64::SIZE)?;
            }
        }
        let slots = flatten(keys.unwind_slots.iter().copied());
        let zeros = vec![0u8; keys.unwind_slots.len() * UnwindInfo::SIZE];
        elements::update(
            mode,
            fd(&self.unwind_info),
            &slots,
            &zeros,
            keys.unwind_slots.len(),
        )?;
        self.published.clear();
        self.page_keys.clear();
        Ok(stats)
    }

    pub fn config(&self) -> &KernelConfig {
        &self.config
    }

    /// Tells the readers of the pins the file-id collisions this owner
    /// has seen (the lock file's notes, [`lock::OwnerNotes`]); nothing
    /// without a pin directory.
    pub fn record_collisions(&mut self, total: u64, listed: &[String]) -> std::io::Result<()> {
        match &mut self.owner {
            Some(owner) => owner.record_collisions(total, listed),
            None => Ok(()),
        }
    }

    /// How the pinned maps were opened (`None` without a pin directory).
    pub fn pin_report(&self) -> Option<&PinReport> {
        self.pin_report.as_ref()
    }

    fn outer(&self, class: u16) -> Option<&MapData> {
        self.outers
            .get(usize::from(class.checked_sub(SIZE_CLASS_MIN)?))
    }

    /// A read-only fd of the inner array the outer map of `class` holds for
    /// `file_id` (opened by the id the outer map gives, which needs
    /// CAP_SYS_ADMIN), or `None` if it holds none. The backend keeps no
    /// descriptor of its own: the caller's is closed when it is dropped.
    pub fn open_inner(&self, class: u16, file_id: FileId) -> Result<Option<OwnedFd>, KernelError> {
        let Some(outer) = self.outer(class) else {
            return Ok(None);
        };
        let Some(value) = sys::lookup_elem(fd(outer), &file_id.0.to_bytes(), u32::SIZE)? else {
            return Ok(None);
        };
        let id = u32::read(&value).ok_or(KernelError::OuterValue {
            class,
            file_id,
            len: value.len(),
        })?;
        open_by_id(class, file_id, id).map(Some)
    }

    /// The pin directory's generation counter now (`None` without one).
    pub fn generation(&self) -> Option<u64> {
        self.generation.as_ref().map(Generation::value)
    }

    /// How many tables this backend published (or adopted) and has not
    /// deleted: what it keeps per table is its key, never a descriptor.
    pub fn published_tables(&self) -> usize {
        self.published.len()
    }

    /// The fds of eim's maps, for tests that poke at the kernel directly:
    /// pages, unwind infos, interpreter offsets, and the outer map of `class`.
    pub fn page_map_fd(&self) -> BorrowedFd<'_> {
        fd(&self.pages)
    }
    pub fn unwind_info_fd(&self) -> BorrowedFd<'_> {
        fd(&self.unwind_info)
    }
    pub fn interpreter_offsets_fd(&self) -> BorrowedFd<'_> {
        fd(&self.interpreter_offsets)
    }
    pub fn outer_fd(&self, class: u16) -> Option<BorrowedFd<'_>> {
        self.outer(class).map(fd)
    }

    /// What a warm restart's reconcile reads: the dump, with the pin
    /// directory's record of when an earlier owner last zeroed a slot
    /// ([`crate::lock::SlotsZeroed`]; unknown for maps that are not pinned).
    ///
    /// Each table is read only as far as its file's page entries reach:
    /// entries past that no reader can reach (so a reconcile need not know
    /// them), and reading whole arrays took 1.2 s for 1,000 libraries.
    pub fn observed(&self) -> Result<eim_machine::machine::Observed, KernelError> {
        let source = self.dump_source();
        let dump = dump_reaching(&source, |class, file_id, id, reached| {
            let inner = self.published_inner(class, file_id, id)?;
            read_deltas_below(inner.as_fd(), class, reached)
        })?;
        let mut observed = dump.observed();
        observed.zeroed_ago = self.owner.as_ref().and_then(PinLock::slots_zeroed_ago);
        Ok(observed)
    }

    /// Reads every map (several batch lookups per map; each inner array
    /// opened by id, read and closed in turn).
    pub fn dump(&self) -> Result<Dump, KernelError> {
        let source = self.dump_source();
        let mut arrays = 0;
        let mut dump = dump_from(&source, |class, file_id, id| {
            let inner = self.published_inner(class, file_id, id)?;
            arrays += 1;
            read_deltas(inner.as_fd(), class)
        })?;
        dump.live_inner_maps = arrays;
        Ok(dump)
    }

    fn dump_source(&self) -> DumpSource<'_> {
        DumpSource {
            pages: fd(&self.pages),
            unwind_info: fd(&self.unwind_info),
            unwind_entries: self.config.unwind_info,
            interpreter_offsets: fd(&self.interpreter_offsets),
            outers: self.outers.iter().map(fd).collect(),
            process_mappings: fd(&self.process_mappings),
        }
    }

    /// A read-only fd of the inner array the outer map of `class` holds
    /// for `file_id` under map id `id`, which must be a table this backend
    /// published (or adopted).
    fn published_inner(
        &self,
        class: u16,
        file_id: FileId,
        id: u32,
    ) -> Result<OwnedFd, KernelError> {
        if !self.published.contains(&(class, file_id)) {
            return Err(KernelError::Untracked { class, file_id, id });
        }
        open_by_id(class, file_id, id)
    }

    /// The loaded object: its programs, and the maps not taken out of it.
    pub(crate) fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    pub(crate) fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Runs the lookup program for `address` of `file_id`
    /// (`BPF_PROG_TEST_RUN`, then one lookup of the result map).
    pub fn lookup(&self, file_id: FileId, address: u64) -> Result<LookupResult, KernelError> {
        run_lookup(&self.ebpf, &self.result, file_id, address)
    }
}

/// Runs the lookup program of `ebpf` for `address` of `file_id` and reads
/// its record from `result`.
pub(crate) fn run_lookup(
    ebpf: &Ebpf,
    result: &MapData,
    file_id: FileId,
    address: u64,
) -> Result<LookupResult, KernelError> {
    let program: &RawTracePoint = ebpf
        .program(PROGRAM)
        .ok_or_else(|| KernelError::Missing(format!("program {PROGRAM}")))?
        .try_into()?;
    let mut opts = RawTracePointRunOptions::new();
    opts.args[0] = file_id.0;
    opts.args[1] = address;
    let run = program.test_run(opts)?;
    let bytes = sys::lookup_elem(fd(result), &0u32.to_le_bytes(), RESULT_SIZE)?
        .ok_or(KernelError::Result)?;
    LookupResult::decode(run.return_value, &bytes).ok_or(KernelError::Result)
}

/// A read-only fd of the inner array with map id `id`, which the outer map
/// of `class` holds for `file_id` (`BPF_MAP_GET_FD_BY_ID`, CAP_SYS_ADMIN).
pub(crate) fn open_by_id(class: u16, file_id: FileId, id: u32) -> Result<OwnedFd, KernelError> {
    sys::map_get_fd_by_id(id, sys::BPF_F_RDONLY).map_err(|cause| KernelError::InnerArray {
        class,
        file_id,
        id,
        cause,
    })
}

/// The maps a [`Dump`] reads.
pub(crate) struct DumpSource<'a> {
    pub pages: BorrowedFd<'a>,
    pub unwind_info: BorrowedFd<'a>,
    pub unwind_entries: u32,
    pub interpreter_offsets: BorrowedFd<'a>,
    /// The outer maps, smallest size class first.
    pub outers: Vec<BorrowedFd<'a>>,
    pub process_mappings: BorrowedFd<'a>,
}

/// Reads every map of `source`; `deltas_of(class, file_id, map_id)` reads
/// the inner array an outer map holds under `file_id`. `live_inner_maps`
/// is left 0 for the caller to say.
pub(crate) fn dump_from(
    source: &DumpSource<'_>,
    mut deltas_of: impl FnMut(u16, FileId, u32) -> Result<Vec<StackDelta>, KernelError>,
) -> Result<Dump, KernelError> {
    dump_reaching(source, |class, file_id, id, _| {
        deltas_of(class, file_id, id)
    })
}

/// [`dump_from`], with `deltas_of` also told how far into the table the
/// file's page entries reach: the end of the furthest range a page names
/// (`first_delta + num_deltas`; 0 for a table no page names). A reader
/// never reads an entry at or past it.
pub(crate) fn dump_reaching(
    source: &DumpSource<'_>,
    mut deltas_of: impl FnMut(u16, FileId, u32, u32) -> Result<Vec<StackDelta>, KernelError>,
) -> Result<Dump, KernelError> {
    let mut dump = Dump::default();
    let (k, v) = sys::lookup_all(
        source.pages,
        StackDeltaPageKey::SIZE,
        StackDeltaPageInfo::SIZE,
        1024,
    )?;
    for (k, v) in k
        .chunks(StackDeltaPageKey::SIZE)
        .zip(v.chunks(StackDeltaPageInfo::SIZE))
    {
        if let (Some(k), Some(v)) = (StackDeltaPageKey::read(k), StackDeltaPageInfo::read(v)) {
            dump.pages.insert(k, v);
        }
    }
    let (_, v) = sys::lookup_all(
        source.unwind_info,
        u32::SIZE,
        UnwindInfo::SIZE,
        source.unwind_entries as usize,
    )?;
    dump.unwind_infos = v
        .chunks(UnwindInfo::SIZE)
        .filter_map(UnwindInfo::read)
        .collect();
    let (k, v) = sys::lookup_all(source.interpreter_offsets, u64::SIZE, OffsetRange::SIZE, 64)?;
    for (k, v) in k.chunks(u64::SIZE).zip(v.chunks(OffsetRange::SIZE)) {
        if let (Some(k), Some(v)) = (u64::read(k), OffsetRange::read(v)) {
            dump.interpreter_offsets.insert(FileId(k), v);
        }
    }
    let (k, v) = sys::lookup_all(
        source.process_mappings,
        u32::SIZE,
        ProcessMappings::SIZE,
        64,
    )?;
    for (k, v) in k.chunks(u32::SIZE).zip(v.chunks(ProcessMappings::SIZE)) {
        if let (Some(k), Some(v)) = (u32::read(k), ProcessMappings::read(v)) {
            dump.process_mappings.insert(k, v);
        }
    }
    let mut reach: BTreeMap<u64, u32> = BTreeMap::new();
    for (key, info) in &dump.pages {
        let end = info.first_delta.saturating_add(u32::from(info.num_deltas));
        let r = reach.entry(key.file_id).or_insert(0);
        *r = (*r).max(end);
    }
    for (class, outer) in (SIZE_CLASS_MIN..=SIZE_CLASS_MAX).zip(&source.outers) {
        let (k, v) = sys::lookup_all(*outer, u64::SIZE, u32::SIZE, 1024)?;
        for (k, v) in k.chunks(u64::SIZE).zip(v.chunks(u32::SIZE)) {
            let (Some(file), Some(id)) = (u64::read(k), u32::read(v)) else {
                continue;
            };
            let file_id = FileId(file);
            let reached = reach.get(&file).copied().unwrap_or(0);
            let deltas = deltas_of(class, file_id, id, reached)?;
            let entries = abi::class_entries(class).unwrap_or(0);
            dump.delta_tables
                .insert((class, file_id), (entries, deltas));
        }
    }
    Ok(dump)
}

/// The entries of an inner delta array of size class `class`, up to the
/// last non-zero one (what `InnerTable::entries` gives).
pub(crate) fn read_deltas(
    inner: BorrowedFd<'_>,
    class: u16,
) -> Result<Vec<StackDelta>, KernelError> {
    read_deltas_below(inner, class, u32::MAX)
}

/// [`read_deltas`] of the first `end` entries only (one batch lookup of
/// that many): what a reader can reach, and all a reconcile needs, at a
/// cost that follows the table's length instead of its array's.
pub(crate) fn read_deltas_below(
    inner: BorrowedFd<'_>,
    class: u16,
    end: u32,
) -> Result<Vec<StackDelta>, KernelError> {
    let entries = abi::class_entries(class).unwrap_or(0).min(end);
    if entries == 0 {
        return Ok(Vec::new());
    }
    let (_, values) = sys::lookup_first(inner, u32::SIZE, StackDelta::SIZE, entries as usize)?;
    let mut deltas: Vec<StackDelta> = values
        .chunks(StackDelta::SIZE)
        .filter_map(StackDelta::read)
        .collect();
    while deltas.last() == Some(&StackDelta::default()) {
        deltas.pop();
    }
    Ok(deltas)
}
