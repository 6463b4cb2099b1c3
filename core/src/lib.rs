//! eim-core: the pure heart of eim.
//!
//! What a profiler needs to keep the unwind tables of a host's executables
//! in the kernel maps its eBPF unwinder reads, byte-compatible with the
//! OpenTelemetry eBPF profiler's: the maps' ABI, the tables, and the
//! [`ExecutableInfoManager`], which counts references per file and turns
//! each first reference and each last release into map operations
//! ([`ops::MapOp`]) that a backend applies: real BPF maps (`eim-bpf`'s
//! `KernelMaps`) or simulated ones (`eim-sim`'s `SimMaps`). Most users
//! depend on the `eim` crate, which re-exports this one with both backends
//! and reads ELF files.
//!
//! * [`abi`]: the kernel structs and constants, byte for byte.
//! * [`deltas`]: stack deltas and upstream's de-duplicating append rules.
//! * [`encode`]: deltas to a kernel table (pages, merges, size class, gaps).
//! * [`ops`]: the map mutation commands and the [`ops::Backend`] trait.
//! * [`machine`]: the pure state machine (files, reference counts, unwind-info
//!   slots, page accounting, deferral, leftovers) that turns calls into plans.
//! * [`manager`]: [`ExecutableInfoManager`], the thread-safe facade.
//! * [`tsd`]: C-library introspection (TSD and DTV layouts from machine code).
//! * [`interp`]: the interpreter loaders (pure functions of a parsed ELF).
//! * [`tracking`]: host events (exec, fork, exit, new executable mappings)
//!   and the work a batch of them asks of the host side.
//!
//! Nothing in this crate performs I/O, reads a clock or spawns a thread;
//! the facade takes a [`manager::Clock`] and a backend from its caller.
//!
//! A backend is one method, [`ops::Backend::apply`]. This one records what
//! the manager asks of the kernel, which shows the order a reader relies
//! on: a new file's unwind rules and table exist before the pages that
//! lead to them, and go after them.
//!
//! ```
//! use eim_core::deltas::{hint, info, IntervalData, StackDelta};
//! use eim_core::ops::{Backend, MapOp, OpFailure};
//! use eim_core::provider::MemoryProvider;
//! use eim_core::{ExecutableInfoManager, FileId, Tracers};
//!
//! #[derive(Default)]
//! struct Recorder(Vec<&'static str>);
//!
//! impl Backend for Recorder {
//!     fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
//!         self.0.push(match op {
//!             MapOp::PutUnwindInfos(_) => "put unwind infos",
//!             MapOp::PutDeltaTable { .. } | MapOp::PutDeltaTables { .. } => "put table",
//!             MapOp::PutPages(_) => "put pages",
//!             MapOp::DeletePages(_) => "delete pages",
//!             MapOp::DeleteDeltaTable { .. } => "delete table",
//!             _ => "interpreter offsets",
//!         });
//!         Ok(())
//!     }
//! }
//!
//! // A function at 0x1000 whose frame is 16 bytes above the stack pointer.
//! let mut deltas = IntervalData::new();
//! deltas.add(StackDelta::new(0x1000, hint::KEEP, info::sp(16)));
//! deltas.add(StackDelta::new(0x1040, hint::GAP, info::INVALID));
//! let provider = MemoryProvider::new();
//! provider.insert(FileId(7), deltas);
//!
//! let manager = ExecutableInfoManager::new(provider, Recorder::default(), Tracers::none());
//! manager.add_or_inc_ref(FileId(7), &FileId(7))?; // a first process maps the file
//! manager.add_or_inc_ref(FileId(7), &FileId(7))?; // a second one: no kernel work
//! manager.remove_or_dec_ref(FileId(7))?;
//! manager.remove_or_dec_ref(FileId(7))?; // the last one exits
//! let ops = manager.with_backend(|r| std::mem::take(&mut r.0));
//! assert_eq!(
//!     ops,
//!     ["put unwind infos", "put table", "put pages", "delete pages", "delete table"]
//! );
//! # Ok::<(), eim_core::Error>(())
//! ```

pub mod abi;
pub mod deltas;
pub mod driver;
pub mod elf;
pub mod encode;
pub mod error;
pub mod fallible;
pub mod info;
pub mod interp;
pub mod machine;
pub mod manager;
pub mod metrics;
pub mod ops;
pub mod process_maps;
pub mod provider;
mod sync;
pub mod text;
pub mod text_input;
pub mod tracers;
pub mod tracking;
pub mod tsd;
pub mod unwind;

pub use error::Error;
pub use info::ExecutableInfo;
pub use interp::InterpreterData;
pub use manager::{Config, ExecutableInfoManager};
pub use tracers::Tracers;
pub use tsd::{DtvInfo, LibcInfo, TsdInfo};

use std::fmt;

/// The 64-bit host file id of an executable, as the BPF maps key it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u64);

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileId({:016x})", self.0)
    }
}
