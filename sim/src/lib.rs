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
//! The machine in eim-machine talks to the kernel only through
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
//! * [`unwind`]: the simulated maps as the native unwinder's world.
//!
//! The checker, the checked worlds the tests drive and the seeded
//! simulator (binary `eim-sim`) are in `eim-sim-harness`, which the `eim`
//! package does not depend on.

pub mod faults;
pub mod kernel;
pub mod maps;
pub mod reader;
pub mod unwind;

pub use faults::{Fault, FaultPlan};
pub use kernel::{inner_spec, InnerTable, SimConfig, SimError, SimMaps};
pub use maps::{
    BatchError, BpfMap, MapId, MapRegistry, MapSpec, MapType, BPF_ANY, BPF_EXIST, BPF_F_LOCK,
    BPF_NOEXIST,
};
pub use reader::{
    answer_for, answer_of, expected, in_dead_page, Answer, DeltaHit, LookupError, Resolved,
    SimReader, MAX_SEARCH_STEPS,
};
