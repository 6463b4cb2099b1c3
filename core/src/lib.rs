//! eim-core: the thread-safe manager of eim.
//!
//! What a profiler needs to keep the unwind tables of a host's executables
//! in the kernel maps its eBPF unwinder reads, byte-compatible with the
//! OpenTelemetry eBPF profiler's: the [`ExecutableInfoManager`], which
//! counts references per file and turns each first reference and each last
//! release into map operations ([`eim_machine::ops::MapOp`]) that a
//! backend applies: real BPF maps (`eim-bpf`'s `KernelMaps`) or simulated
//! ones (`eim-sim`'s `SimMaps`). Most users depend on the `eim` crate,
//! which re-exports this one with both backends and reads ELF files.
//!
//! It sits on two crates: `eim-machine`, the pure state machine that plans
//! every write (no thread, clock, file or socket), and `eim-analysis`, the
//! analysis of a file's bytes (stack deltas, C-library layouts, the
//! interpreter loaders). This crate adds what they leave out: locks and
//! sharding, single-flight extraction on its own thread, the kernel side
//! lock, and a [`manager::Clock`] (the real one reads the monotonic clock).
//!
//! * [`manager`]: [`ExecutableInfoManager`], [`Config`], the clocks.
//! * [`provider`]: where a file's deltas come from ([`provider::Provider`]).
//! * [`tracers`]: the tracer set and the loader registry.
//! * `info`: what the manager keeps per file ([`ExecutableInfo`]).
//! * [`error`], [`metrics`]: its errors and upstream's metric ids.
//!
//! A backend is one method, [`Backend::apply`](eim_machine::ops::Backend::apply). This one records what
//! the manager asks of the kernel, which shows the order a reader relies
//! on: a new file's unwind rules and table exist before the pages that
//! lead to them, and go after them.
//!
//! ```
//! use eim_core::provider::MemoryProvider;
//! use eim_core::{ExecutableInfoManager, Tracers};
//! use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
//! use eim_machine::ops::{Backend, MapOp, OpFailure};
//! use eim_machine::FileId;
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

// What other crates may use is `pub` and reachable; the rest is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod error;
pub(crate) mod info;
pub mod manager;
pub mod metrics;
pub mod provider;
mod sync;
pub mod tracers;

pub use error::Error;
pub use info::ExecutableInfo;
pub use manager::{Config, ExecutableInfoManager};
pub use tracers::Tracers;
