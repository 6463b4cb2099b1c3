//! eim-sim: eim's kernel maps in memory, with the kernel's semantics.
//!
//! For running eim without privileges (`eim --backend sim`, the demo) and
//! for testing it: [`SimMaps`] holds the same maps as the kernel, byte for
//! byte, and [`SimReader`] looks an address up in them exactly as the BPF
//! unwinder does.
//!
//! ```
//! use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
//! use eim_core::provider::MemoryProvider;
//! use eim_core::{ExecutableInfoManager, Tracers};
//! use eim_machine::FileId;
//! use eim_sim::reader::Answer;
//! use eim_sim::{SimConfig, SimMaps, SimReader};
//!
//! // A function at 0x1000: CFA = SP + 8 on entry, SP + 16 after its push.
//! let mut deltas = IntervalData::new();
//! deltas.add(StackDelta::new(0x1000, hint::KEEP, info::sp(8)));
//! deltas.add(StackDelta::new(0x1001, hint::NONE, info::sp(16)));
//! deltas.add(StackDelta::new(0x1040, hint::GAP, info::INVALID));
//! let provider = MemoryProvider::new();
//! provider.insert(FileId(7), deltas);
//!
//! let maps = SimMaps::new(SimConfig::default())?;
//! let manager = ExecutableInfoManager::new(provider, maps, Tracers::none());
//! manager.add_or_inc_ref(FileId(7), &FileId(7))?;
//!
//! // What the unwinder finds at three addresses of the file.
//! manager.with_backend(|maps| {
//!     let reader = SimReader::new(maps);
//!     assert_eq!(reader.answer(FileId(7), 0x1000), Some(Answer::Rule(info::sp(8))));
//!     assert_eq!(reader.answer(FileId(7), 0x1020), Some(Answer::Rule(info::sp(16))));
//!     assert_eq!(reader.answer(FileId(7), 0x1040), Some(Answer::Invalid));
//! });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The machine in eim-core talks to the kernel only through
//! [`eim_machine::ops::Backend`]. This crate provides a backend that needs no
//! privileges and fails on demand, so that every plan, every partial failure
//! and every reader-visible intermediate state can be tested:
//!
//! * [`maps`]: a generic BPF map (HASH, ARRAY, HASH_OF_MAPS) at the byte
//!   level, with the syscall's errnos, batch semantics and map-in-map
//!   reference counting.
//! * [`kernel`]: [`SimMaps`], eim's map set built from a [`SimConfig`], the
//!   [`Backend`](eim_machine::ops::Backend) implementation, and typed views of
//!   the contents for tests and the invariant checker.
//! * [`faults`]: deterministic fault injection by op number.
//! * [`reader`]: [`SimReader`], SEED's BPF stack-delta lookup against the
//!   simulated maps, and [`expected`], the direct search it must agree with.
//! * [`checker`]: design invariants 1-4 (projection, reader safety, lookup
//!   equivalence, accounting) against a manager's state and the maps.
//! * [`observed`]: a backend that checks reader safety after every op.
//! * [`slot_watch`]: reader safety across time for `unwind_info_array`: no
//!   slot gets a different rule while a reader may still reach it.
//! * [`host_events`]: the event path of host tracking as a workload
//!   (reordered, duplicated and dropped events, resyncs).
//! * [`world`]: the manager over checked maps that the fault, property and
//!   checker tests drive; [`fixtures`]: small hand-written inputs for them.
//!
//! The seeded simulator (binary `eim-sim`, `docs/SIMULATOR.md`):
//!
//! * [`rng`]: the platform-independent seeded generator;
//! * [`synth`], [`corpus`], [`pool`]: synthetic files of every shape, the
//!   real ELF files of the test data, the pool of a run and its provider;
//! * [`workload`], [`profile`]: steps (actions with their fault seeds),
//!   their text form and generator; the four profiles;
//! * [`watch`]: the backend with seeded faults and per-op checks;
//! * [`sampled`]: invariants 2 and 3 on chosen pages, with bounded lookups;
//! * [`run`], [`shrink`], [`trace`]: the run loop and its API model,
//!   delta debugging of a failing trace, the replayable trace file.

pub mod checker;
pub mod corpus;
pub mod faults;
pub mod fixtures;
pub mod host_events;
pub mod kernel;
pub mod maps;
pub mod observed;
pub mod pool;
pub mod profile;
pub mod reader;
pub mod rng;
pub mod run;
pub mod sampled;
pub mod shrink;
pub mod slot_watch;
pub mod synth;
pub mod trace;
pub mod unwind;
pub mod watch;
pub mod workload;
pub mod world;

pub use checker::{
    check_accounting, check_all, check_lookup_equivalence, check_projection, check_reader_safety,
    check_rolled_back, Sources, Violation,
};
pub use faults::{Fault, FaultPlan};
pub use kernel::{inner_spec, InnerTable, SimConfig, SimError, SimMaps};
pub use maps::{
    BatchError, BpfMap, MapId, MapRegistry, MapSpec, MapType, BPF_ANY, BPF_EXIST, BPF_F_LOCK,
    BPF_NOEXIST,
};
pub use observed::Observed;
pub use reader::{
    answer_for, answer_of, expected, in_dead_page, Answer, DeltaHit, LookupError, Resolved,
    SimReader, MAX_SEARCH_STEPS,
};
pub use slot_watch::SlotWatch;
