//! Model-based property test: random sequences of public calls, with
//! provider errors, clock jumps and backend faults (whole ops failing,
//! batches stopping part way, rollbacks failing in turn), against a small
//! reference model of reference counts and deferral. After every step the
//! checker verifies projection, lookup equivalence and accounting; during
//! every step the observed backend verifies reader safety after each op.
//!
//! The model cannot know whether a scheduled fault lands inside a call (the
//! machine may first retry leftovers), so it accepts a kernel error only
//! when a fault was scheduled, and then follows what the manager reported.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use eim_analysis::LibcInfo;
use eim_core::manager::ManualClock;
use eim_core::metrics;
use eim_core::provider::{ExtractError, ExtractErrorKind, Extraction, MemoryProvider};
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::deltas::IntervalData;
use eim_machine::ops::Errno;
use eim_machine::FileId;
use eim_sim::{Fault, SimConfig, SimMaps};
use eim_sim_harness::{check_rolled_back, Observed, Sources};
use eim_tests::gen::arb_interval_data;
use eim_tests::refcount::RefCounts;
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};

const POOL: usize = 6;
const TTL: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Data,
    Vanished,
    Broken,
}

#[derive(Clone, Debug)]
enum Call {
    Add(usize),
    Remove(usize),
    DecRef(usize),
    Cleanup(u64),
    Synth(usize),
    Advance(u64),
    Provider(usize, Mode),
    Retry,
}

#[derive(Clone, Debug)]
struct Step {
    call: Call,
    /// (k-th backend op from now, fault)
    faults: Vec<(u64, Fault)>,
}

#[derive(Clone, Debug)]
struct Pool {
    files: Vec<IntervalData>,
}

struct Reference;

fn arb_errno() -> impl Strategy<Value = Errno> {
    // Errnos that say nothing about map contents (see eim_sim::faults).
    prop::sample::select(vec![
        Errno::ENOMEM,
        Errno::E2BIG,
        Errno::EBUSY,
        Errno::EFAULT,
        Errno::EINVAL,
        Errno::EPERM,
    ])
}

fn arb_fault() -> impl Strategy<Value = (u64, Fault)> {
    (
        0..6u64,
        prop_oneof![
            arb_errno().prop_map(Fault::Fail),
            (0..4usize, arb_errno()).prop_map(|(after, errno)| Fault::StopAfter { after, errno }),
        ],
    )
}

impl ReferenceStateMachine for Reference {
    type State = Pool;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Pool> {
        prop::collection::vec(arb_interval_data(5), POOL)
            .prop_map(|files| Pool { files })
            .boxed()
    }

    fn transitions(_: &Pool) -> BoxedStrategy<Step> {
        let f = 0..POOL;
        let call = prop_oneof![
            6 => f.clone().prop_map(Call::Add),
            4 => f.clone().prop_map(Call::Remove),
            2 => f.clone().prop_map(Call::DecRef),
            1 => (0..400u64).prop_map(Call::Cleanup),
            1 => f.clone().prop_map(Call::Synth),
            1 => prop_oneof![0..10u64, 80..200u64].prop_map(Call::Advance),
            1 => (f, prop::sample::select(vec![Mode::Data, Mode::Vanished, Mode::Broken]))
                .prop_map(|(i, m)| Call::Provider(i, m)),
            1 => Just(Call::Retry),
        ];
        let faults = prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec(arb_fault(), 1..3),
        ];
        (call, faults)
            .prop_map(|(call, faults)| Step { call, faults })
            .boxed()
    }

    fn apply(state: Pool, _: &Step) -> Pool {
        state
    }
}

/// The reference model: the reference counts both call-sequence tests
/// keep ([`RefCounts`]), and what only this one models: deferral and the
/// provider's answers.
#[derive(Default, Debug)]
struct Model {
    refs: RefCounts,
    /// file -> deferred until
    deferred: BTreeMap<FileId, Duration>,
    modes: BTreeMap<FileId, Mode>,
}

impl Model {
    fn deferred(&self, id: FileId) -> bool {
        self.deferred
            .get(&id)
            .is_some_and(|until| self.refs.now < *until)
    }
}

struct Harness {
    manager: ExecutableInfoManager<Arc<MemoryProvider>, Observed>,
    provider: Arc<MemoryProvider>,
    clock: Arc<ManualClock>,
    sources: Arc<Sources>,
    model: Model,
}

fn id(i: usize) -> FileId {
    FileId(0x100 + i as u64)
}

fn broken(i: usize) -> ExtractError {
    ExtractError::new(
        ExtractErrorKind::Invalid,
        format!("/pool/{i}"),
        "not an ELF file",
    )
}

fn vanished(i: usize) -> ExtractError {
    ExtractError::new(
        ExtractErrorKind::NotFound,
        format!("/pool/{i}"),
        "no such file",
    )
}

impl Harness {
    fn set_mode(&mut self, i: usize, mode: Mode) {
        let result = match mode {
            Mode::Data => Ok(Extraction {
                data: self.sources[&id(i)].clone(),
                libc: LibcInfo::default(),
                interpreters: Vec::new(),
            }),
            Mode::Vanished => Err(vanished(i)),
            Mode::Broken => Err(broken(i)),
        };
        self.provider.set(id(i), result);
        self.model.modes.insert(id(i), mode);
    }

    /// Expected outcome of a load attempt that may hit a scheduled fault.
    fn loaded_or_faulted(
        &mut self,
        file: FileId,
        result: Result<(), Error>,
        armed: bool,
        defers: bool,
    ) {
        match result {
            Ok(()) => self.model.refs.loaded(file),
            Err(Error::Kernel { .. }) if armed => {
                if defers {
                    self.model.deferred.insert(file, self.model.refs.now + TTL);
                }
            }
            Err(Error::CleanupPending { .. }) if armed => {}
            Err(e) => panic!("file {file}: unexpected {e}"),
        }
    }

    fn step(&mut self, step: Step) {
        let armed = !step.faults.is_empty();
        self.manager.with_backend(|b| {
            for (k, fault) in &step.faults {
                match *fault {
                    Fault::Fail(errno) => b.maps.fail_op(*k, errno),
                    Fault::StopAfter { after, errno } => b.maps.stop_batch(*k, after, errno),
                }
            }
        });
        let leftovers_before = self.manager.state().book.leftover_ops();
        // Only a faulted load is compared with the maps before it.
        let maps_before = armed.then(|| self.manager.with_backend(|b| b.maps.clone()));
        let m = &self.manager;
        match step.call {
            Call::Add(i) => {
                let file = id(i);
                let result = m.add_or_inc_ref(file, &file);
                let outcome = result.as_ref().map(|_| ()).map_err(Clone::clone);
                if self.model.refs.add_known(file, &outcome) {
                    // A known file: one more reference, whatever the
                    // provider would say now.
                } else if self.model.deferred(file) {
                    assert_eq!(result.unwrap_err(), Error::Deferred { file_id: file });
                } else {
                    match self.model.modes.get(&file).copied().unwrap_or(Mode::Data) {
                        Mode::Vanished => {
                            assert!(
                                matches!(result, Err(Error::Extraction { ref cause, .. }) if cause.is_not_found())
                            );
                        }
                        Mode::Broken => {
                            assert!(matches!(result, Err(Error::Extraction { .. })));
                            self.model.deferred.insert(file, self.model.refs.now + TTL);
                        }
                        Mode::Data => {
                            if let Err(Error::Kernel {
                                rolled_back: true, ..
                            }) = &result
                            {
                                if let (0, Some(before)) = (leftovers_before, &maps_before) {
                                    let book = m.state().book;
                                    self.manager
                                        .with_backend(|b| check_rolled_back(before, &b.maps, &book))
                                        .unwrap_or_else(|v| panic!("{v}"));
                                }
                            }
                            self.loaded_or_faulted(file, result.map(|_| ()), armed, true);
                        }
                    }
                }
            }
            Call::Synth(i) => {
                let file = id(i);
                let result = m.add_synth_interval_data(file, &self.sources[&file]);
                if self.model.refs.knows(file) {
                    assert_eq!(result.unwrap_err(), Error::AlreadyLoaded { file_id: file });
                } else {
                    self.loaded_or_faulted(file, result, armed, false);
                }
            }
            Call::Remove(i) => {
                let file = id(i);
                self.model
                    .refs
                    .removed(file, m.remove_or_dec_ref(file), armed);
            }
            Call::DecRef(i) => {
                let file = id(i);
                self.model.refs.dec_ref(file, m.dec_ref(file));
            }
            Call::Cleanup(secs) => {
                let age = Duration::from_secs(secs);
                self.model.refs.cleaned(age, &m.cleanup_unused(age), armed);
            }
            Call::Advance(secs) => {
                self.clock.advance(Duration::from_secs(secs));
                self.model.refs.now += Duration::from_secs(secs);
            }
            Call::Provider(i, mode) => self.set_mode(i, mode),
            Call::Retry => RefCounts::retried(m.retry_leftovers(), armed),
        }
        self.manager.with_backend(|b| b.maps.clear_faults());
    }

    fn check(&self) {
        self.model.refs.check(&self.manager, &self.sources);
        for i in 0..POOL {
            assert_eq!(
                self.manager.is_deferred(id(i)),
                self.model.deferred(id(i)),
                "deferral of {}",
                id(i)
            );
        }
        // Gauges recounted from the source deltas, not from the book.
        let mut summary = metrics::Summary::new();
        self.manager.update_metric_summary(&mut summary);
        let with_tables: Vec<&IntervalData> = self
            .model
            .refs
            .files()
            .map(|f| &self.sources[&f])
            .filter(|d| !d.is_empty())
            .collect();
        // Every page of each span except the dead ones (weakness 14),
        // worked out from the sources.
        let pages: u64 = with_tables
            .iter()
            .map(|d| {
                ((d.get(0).unwrap().address >> 16)..=(d.last().unwrap().address >> 16))
                    .filter(|p| !eim_sim::in_dead_page(d, p << 16))
                    .count() as u64
            })
            .sum();
        assert_eq!(
            summary[&metrics::NUM_EXE_ID_LOADED_TO_EBPF],
            with_tables.len() as u64
        );
        assert_eq!(summary[&metrics::HASHMAP_NUM_STACK_DELTA_PAGES], pages);
    }
}

struct ManagerTest;

impl StateMachineTest for ManagerTest {
    type SystemUnderTest = Harness;
    type Reference = Reference;

    fn init_test(pool: &Pool) -> Harness {
        let sources: Sources = pool
            .files
            .iter()
            .enumerate()
            .map(|(i, d)| (id(i), d.clone()))
            .collect();
        let sources = Arc::new(sources);
        let maps = SimMaps::new(SimConfig::default()).expect("sim maps");
        let provider = Arc::new(MemoryProvider::new());
        let clock = Arc::new(ManualClock::new());
        let manager = ExecutableInfoManager::with_config(
            provider.clone(),
            Observed::new(maps, sources.clone(), 4).watch_slots(
                clock.clone(),
                eim_machine::machine::slots::DEFAULT_SLOT_GRACE,
            ),
            Tracers::none(),
            Config::default(),
            Box::new(clock.clone()),
        );
        let mut h = Harness {
            manager,
            provider,
            clock,
            sources,
            model: Model::default(),
        };
        for i in 0..POOL {
            h.set_mode(i, Mode::Data);
        }
        h
    }

    fn apply(mut h: Harness, _: &Pool, step: Step) -> Harness {
        h.step(step);
        h
    }

    fn check_invariants(h: &Harness, _: &Pool) {
        h.check();
    }
}

fn cases() -> u32 {
    std::env::var("EIM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 4096,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn random_calls_with_faults_keep_every_invariant(sequential 1..40 => ManagerTest);
}
