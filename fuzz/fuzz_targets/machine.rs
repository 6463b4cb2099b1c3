//! Fuzzes the manager as a whole: arbitrary sequences of public calls
//! (add, batch add, synthetic data, remove, dec-ref, delayed cleanup,
//! leftover retry, clock jumps, provider answers changing) with arbitrary
//! backend faults (an op failing with an errno, a batch stopping after n
//! elements, rollbacks failing in turn) over the simulated kernel.
//!
//! Properties, after every call:
//! * `eim_sim_harness::check_all`: projection, lookup equivalence, accounting;
//! * reader safety after every single op, also inside a plan (the
//!   `Observed` backend);
//! * reference counts equal a small model kept from the calls' results, and
//!   the delayed cleanup unloads exactly the files the model says are due;
//! * without a fault, retries leave nothing pending and cleanup reports no
//!   error.
//!
//! The reference counts are `eim_tests::refcount::RefCounts`, the model the
//! property test `tests/cross-crate/tests/model.rs` keeps too (which adds
//! deferral and expected errors); this target trades those for libFuzzer's
//! coverage guidance over much longer runs. `assert`/`panic` here mark the properties.

#![no_main]

use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use eim_analysis::LibcInfo;
use eim_core::manager::ManualClock;
use eim_core::provider::{ExtractError, ExtractErrorKind, Extraction, MemoryProvider};
use eim_core::{Config, Error, ExecutableInfoManager};
use eim_machine::deltas::info::sp;
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::Errno;
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};
use eim_sim_harness::{Observed, Sources};
use eim_tests::refcount::RefCounts;

const FILES: usize = 4;
const MAX_STEPS: usize = 48;
const MAX_FAULTS: usize = 3;
const MAX_BATCH: usize = 4;
const MAX_FUNCTIONS: usize = 6;
const MAX_ROWS: usize = 6;

#[derive(Arbitrary, Debug)]
struct Input {
    files: [FileShape; FILES],
    steps: Vec<Step>,
}

/// A file's deltas, built like extraction builds them: functions of a few
/// rows each, a gap marker at each end.
#[derive(Arbitrary, Debug)]
struct FileShape {
    start: u16,
    functions: Vec<Function>,
}

#[derive(Arbitrary, Debug)]
struct Function {
    /// From the previous function's end; up to 8 pages, so tables span
    /// several pages and some pages are empty.
    gap: u32,
    rows: Vec<(u8, RuleIn)>,
}

/// Few distinct rules, so files share unwind slots.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum RuleIn {
    Sp(u8),
    Invalid,
    Stop,
    FramePointer,
    Lr,
}

impl RuleIn {
    fn info(self) -> eim_machine::abi::UnwindInfo {
        match self {
            RuleIn::Sp(k) => sp(8 * i32::from(k % 6 + 1)),
            RuleIn::Invalid => info::INVALID,
            RuleIn::Stop => info::STOP,
            RuleIn::FramePointer => info::FRAME_POINTER,
            RuleIn::Lr => info::LR,
        }
    }
}

fn build(shape: &FileShape) -> IntervalData {
    let mut data = IntervalData::new();
    let mut addr = 0x1_0000 + (u64::from(shape.start) << 4);
    for f in shape.functions.iter().take(MAX_FUNCTIONS) {
        addr += u64::from(f.gap % (8 << 16)) + 1;
        for (i, (step, rule)) in f.rows.iter().take(MAX_ROWS).enumerate() {
            let hints = if i == 0 { hint::KEEP } else { hint::NONE };
            data.add(StackDelta::new(addr, hints, rule.info()));
            addr += u64::from(*step) + 1;
        }
        data.add(StackDelta::new(addr, hint::GAP, info::INVALID));
    }
    data
}

#[derive(Arbitrary, Debug)]
struct Step {
    call: Call,
    faults: Vec<FaultIn>,
}

#[derive(Arbitrary, Debug)]
enum Call {
    Add(u8),
    LoadMany(Vec<u8>),
    Synth(u8),
    Remove(u8),
    DecRef(u8),
    /// Cleanup of files unused for this many seconds.
    Cleanup(u8),
    /// Clock jump in seconds (the deferral TTL is 90 s).
    Advance(u8),
    Retry,
    Provider(u8, Mode),
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Data,
    /// NotFound: not deferred.
    Vanished,
    /// Invalid: deferred.
    Broken,
}

/// A fault for the k-th backend op from the start of the call.
#[derive(Arbitrary, Debug)]
enum FaultIn {
    Fail { k: u8, errno: ErrnoIn },
    Stop { k: u8, after: u8, errno: ErrnoIn },
}

/// Only errnos that say nothing about the maps' contents: an injected
/// ENOENT on a delete or EEXIST on a put would make a kernel that lies
/// (see `eim_sim::faults`).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum ErrnoIn {
    Nomem,
    TooBig,
    Busy,
    Fault,
    Inval,
    Perm,
}

impl ErrnoIn {
    fn errno(self) -> Errno {
        match self {
            ErrnoIn::Nomem => Errno::ENOMEM,
            ErrnoIn::TooBig => Errno::E2BIG,
            ErrnoIn::Busy => Errno::EBUSY,
            ErrnoIn::Fault => Errno::EFAULT,
            ErrnoIn::Inval => Errno::EINVAL,
            ErrnoIn::Perm => Errno::EPERM,
        }
    }
}

fn id(i: u8) -> FileId {
    FileId(0x100 + u64::from(i) % FILES as u64)
}

struct Harness {
    manager: ExecutableInfoManager<Arc<MemoryProvider>, Observed>,
    provider: Arc<MemoryProvider>,
    clock: Arc<ManualClock>,
    sources: Arc<Sources>,
    /// The reference counts the model-based property test keeps too.
    model: RefCounts,
}

impl Harness {
    fn new(input: &Input) -> Self {
        let sources: Sources = (0..FILES as u8)
            .map(|i| (id(i), build(&input.files[usize::from(i)])))
            .collect();
        let sources = Arc::new(sources);
        let provider = Arc::new(MemoryProvider::new());
        let clock = Arc::new(ManualClock::new());
        let maps = SimMaps::new(SimConfig::default()).expect("the default map set builds");
        let manager = ExecutableInfoManager::with_config(
            provider.clone(),
            Observed::new(maps, sources.clone(), 4),
            eim_core::Tracers::none(),
            Config {
                shards: 4,
                ..Config::default()
            },
            Box::new(clock.clone()),
        );
        let mut h = Self {
            manager,
            provider,
            clock,
            sources,
            model: RefCounts::new(),
        };
        for i in 0..FILES as u8 {
            h.set_mode(i, Mode::Data);
        }
        h
    }

    fn set_mode(&mut self, i: u8, mode: Mode) {
        let file = id(i);
        let result = match mode {
            Mode::Data => Ok(Extraction {
                data: self.sources[&file].clone(),
                libc: LibcInfo::default(),
                interpreters: Vec::new(),
            }),
            Mode::Vanished => Err(ExtractError::new(
                ExtractErrorKind::NotFound,
                file.to_string(),
                "no such file",
            )),
            Mode::Broken => Err(ExtractError::new(
                ExtractErrorKind::Invalid,
                file.to_string(),
                "not an ELF file",
            )),
        };
        self.provider.set(file, result);
    }

    /// An add's result against the model: a known file always gets a
    /// reference; a new one gets one when the load worked.
    fn added(&mut self, file: FileId, result: Result<(), Error>) {
        if !self.model.add_known(file, &result) && result.is_ok() {
            self.model.loaded(file);
        }
    }

    fn step(&mut self, step: &Step) {
        let armed = !step.faults.is_empty();
        self.manager.with_backend(|b| {
            for f in step.faults.iter().take(MAX_FAULTS) {
                match *f {
                    FaultIn::Fail { k, errno } => b.maps.fail_op(u64::from(k % 8), errno.errno()),
                    FaultIn::Stop { k, after, errno } => {
                        b.maps
                            .stop_batch(u64::from(k % 8), usize::from(after % 8), errno.errno())
                    }
                }
            }
        });
        match &step.call {
            Call::Add(i) => {
                let file = id(*i);
                let result = self.manager.add_or_inc_ref(file, &file).map(|_| ());
                self.added(file, result);
            }
            Call::LoadMany(is) => {
                let files: Vec<FileId> = is.iter().take(MAX_BATCH).map(|i| id(*i)).collect();
                let args: Vec<(FileId, &FileId)> = files.iter().map(|f| (*f, f)).collect();
                let results = self.manager.load_many(&args);
                assert_eq!(results.len(), files.len(), "one result per file");
                for (file, result) in files.into_iter().zip(results) {
                    self.added(file, result.map(|_| ()));
                }
            }
            Call::Synth(i) => {
                let file = id(*i);
                let result = self
                    .manager
                    .add_synth_interval_data(file, &self.sources[&file]);
                if self.model.knows(file) {
                    assert_eq!(result, Err(Error::AlreadyLoaded { file_id: file }));
                } else if result.is_ok() {
                    self.model.loaded(file);
                }
            }
            Call::Remove(i) => {
                let file = id(*i);
                let result = self.manager.remove_or_dec_ref(file);
                self.model.removed(file, result, armed);
            }
            Call::DecRef(i) => {
                let file = id(*i);
                self.model.dec_ref(file, self.manager.dec_ref(file));
            }
            Call::Cleanup(secs) => {
                let age = Duration::from_secs(u64::from(*secs));
                let report = self.manager.cleanup_unused(age);
                self.model.cleaned(age, &report, armed);
            }
            Call::Advance(secs) => {
                let by = Duration::from_secs(u64::from(*secs));
                self.clock.advance(by);
                self.model.now += by;
            }
            Call::Retry => RefCounts::retried(self.manager.retry_leftovers(), armed),
            Call::Provider(i, mode) => self.set_mode(*i, *mode),
        }
        self.manager.with_backend(|b| b.maps.clear_faults());
    }

    fn check(&self) {
        self.model.check(&self.manager, &self.sources);
    }
}

fuzz_target!(|input: Input| {
    let mut h = Harness::new(&input);
    for step in input.steps.iter().take(MAX_STEPS) {
        h.step(step);
        h.check();
    }
});
