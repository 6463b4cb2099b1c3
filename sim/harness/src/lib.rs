//! eim-sim-harness: what checks eim over the simulated kernel.
//!
//! The invariant checker, the checked worlds the fault, property and
//! checker tests drive, and the seeded simulator (binary `eim-sim`,
//! `docs/SIMULATOR.md`), over `eim-sim`'s [`SimMaps`](eim_sim::SimMaps).
//! The `eim` package does not depend on this crate: what ships is the
//! simulated kernel, not its harness.
//!
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
//! The seeded simulator:
//!
//! * [`rng`]: the platform-independent seeded generator;
//! * [`synth`], [`corpus`], [`pool`]: synthetic files of every shape, the
//!   real ELF files of the test data, the pool of a run and its provider;
//! * [`workload`], [`profile`]: steps (actions with their fault seeds),
//!   their text form and generator; the four profiles;
//! * [`faulty`]: [`FaultyBackend`](faulty::FaultyBackend), the maps with
//!   seeded faults and per-op checks;
//! * [`sampled`]: invariants 2 and 3 on chosen pages, with bounded lookups;
//! * [`run`], [`shrink`], [`trace`]: the run loop and its API model,
//!   delta debugging of a failing trace, the replayable trace file.

pub mod checker;
pub mod corpus;
pub mod faulty;
pub mod fixtures;
pub mod host_events;
pub mod observed;
pub mod pool;
pub mod profile;
pub mod rng;
pub mod run;
pub mod sampled;
pub mod shrink;
pub mod slot_watch;
pub mod synth;
pub mod trace;
pub mod workload;
pub mod world;

pub use checker::{
    check_accounting, check_all, check_lookup_equivalence, check_projection, check_reader_safety,
    check_rolled_back, Sources, Violation,
};
pub use observed::Observed;
pub use slot_watch::SlotWatch;
