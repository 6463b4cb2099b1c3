//! The set-up every test that drives the manager through faults shares: a
//! manager over simulated maps checked after every op ([`Observed`]:
//! reader safety, and slot reuse when asked), serving a set of files from
//! a memory provider, on a manual clock. One place, so that the fault,
//! double-fault, property, slot-reuse and checker tests cannot drift apart
//! in how they build it.

use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::ManualClock;
use eim_core::provider::MemoryProvider;
use eim_core::{Config, ExecutableInfoManager, Tracers};
use eim_machine::deltas::IntervalData;
use eim_machine::machine::Capacities;
use eim_machine::FileId;

use crate::checker::Sources;
use crate::observed::Observed;
use eim_sim::kernel::{SimConfig, SimMaps};

/// The manager of a [`CheckedWorld`].
pub type CheckedManager = ExecutableInfoManager<Arc<MemoryProvider>, Observed>;

/// What differs between the tests' worlds.
#[derive(Clone, Debug)]
pub struct WorldSpec {
    /// `unwind_info_array` slots, in the maps and in the book alike.
    pub unwind_slots: u32,
    /// `interpreter_offsets` entries, in the maps and in the book alike.
    pub interpreter_offsets: u32,
    /// How long the book lets a freed slot cool.
    pub slot_grace: Duration,
    /// Reader safety's sample spread ([`Observed::new`]).
    pub spread: u64,
    /// Watch slot reuse against readers that may hold a slot this long
    /// ([`Observed::watch_slots`]); `None`: no watch.
    pub watch_slots: Option<Duration>,
}

impl Default for WorldSpec {
    fn default() -> Self {
        let config = Config::default();
        Self {
            unwind_slots: config.capacities.unwind_slots,
            interpreter_offsets: config.capacities.interpreter_offsets,
            slot_grace: config.slot_grace,
            spread: 64,
            watch_slots: None,
        }
    }
}

/// A manager over checked simulated maps, and what a test needs to drive
/// and judge it.
pub struct CheckedWorld {
    pub manager: CheckedManager,
    pub provider: Arc<MemoryProvider>,
    pub clock: Arc<ManualClock>,
    pub sources: Arc<Sources>,
}

impl CheckedWorld {
    /// A manager that knows `files` (the provider serves each), none
    /// loaded yet.
    pub fn new(files: impl IntoIterator<Item = (FileId, IntervalData)>, spec: &WorldSpec) -> Self {
        let sources: Arc<Sources> = Arc::new(files.into_iter().collect());
        let provider = Arc::new(MemoryProvider::new());
        for (id, data) in sources.iter() {
            provider.insert(*id, data.clone());
        }
        let clock = Arc::new(ManualClock::new());
        let maps = SimMaps::new(SimConfig {
            unwind_info: spec.unwind_slots,
            interpreter_offsets: spec.interpreter_offsets,
            ..SimConfig::default()
        })
        .expect("the simulated maps build");
        let mut backend = Observed::new(maps, sources.clone(), spec.spread);
        if let Some(grace) = spec.watch_slots {
            backend = backend.watch_slots(clock.clone(), grace);
        }
        let config = Config {
            capacities: Capacities {
                unwind_slots: spec.unwind_slots,
                interpreter_offsets: spec.interpreter_offsets,
                ..Capacities::default()
            },
            slot_grace: spec.slot_grace,
            ..Config::default()
        };
        let manager = ExecutableInfoManager::with_config(
            provider.clone(),
            backend,
            Tracers::none(),
            config,
            Box::new(clock.clone()),
        );
        Self {
            manager,
            provider,
            clock,
            sources,
        }
    }
}
