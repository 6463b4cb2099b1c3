//! eim-bpf: eim's backend on real kernel maps, through aya.
//!
//! [`KernelMaps`] creates the maps an eBPF unwinder reads (or re-opens them
//! pinned by name in a directory, where the profiler's own BPF loader opens
//! them too) and applies the map operations the manager plans to them, with
//! a constant number of `bpf()` calls per file.
//!
//! The example needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) and a
//! bpffs on `/sys/fs/bpf`, so it is compiled but not run by `cargo test`;
//! `examples/profiler.rs` of the `eim` package does the same with a real
//! process, and its test runs it where BPF is allowed.
//!
//! ```no_run
//! use eim_bpf::{pinned, KernelConfig, KernelMaps};
//! use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
//! use eim_core::provider::MemoryProvider;
//! use eim_core::{ExecutableInfoManager, Tracers};
//! use eim_machine::FileId;
//!
//! let mut deltas = IntervalData::new();
//! deltas.add(StackDelta::new(0x1000, hint::KEEP, info::sp(8)));
//! deltas.add(StackDelta::new(0x1040, hint::GAP, info::INVALID));
//! let provider = MemoryProvider::new();
//! provider.insert(FileId(7), deltas);
//!
//! let dir = std::path::Path::new("/sys/fs/bpf/my-profiler");
//! let maps = KernelMaps::with_config(KernelConfig {
//!     pin_dir: Some(dir.into()),
//!     ..KernelConfig::default()
//! })?;
//! let manager = ExecutableInfoManager::new(provider, maps, Tracers::none());
//! manager.add_or_inc_ref(FileId(7), &FileId(7))?;
//!
//! // Any process reads the pins by name: here eim's own reader, which
//! // takes no lock and changes nothing.
//! let dump = pinned::dump_pinned(dir)?;
//! assert!(dump.pages.keys().any(|key| key.file_id == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! * [`sys`]: the raw `bpf()` calls aya 0.14 lacks (batch update, delete
//!   and lookup; outer-map creation with `inner_map_fd`), each counted.
//! * [`KernelMaps`]: the maps and the lookup program of the committed
//!   `bpf/lookup.bpf.o`, and the [`eim_machine::ops::Backend`] that applies map
//!   ops to them with batch syscalls, exactly as `eim_sim::SimMaps` models.
//! * [`elements`]: a run of elements written with one batch call, or
//!   with one call per element (the measured baseline).
//! * [`lock`]: one owner per pin directory (an exclusive `flock` on a lock
//!   file named after it, outside it); readers ask for a shared one.
//! * [`bpffs`]: when a bpffs is mounted for the pins, and when that is
//!   refused.
//! * [`pin`]: the check of every pin found against the expected shape
//!   (refused, or replaced when asked).
//! * [`generation`]: the pin directory's generation counter, a seqlock
//!   that lets readers in other processes take a consistent view of maps
//!   their owner writes.
//! * [`pinned`]: the pinned maps read without owning them (dumped, and
//!   looked up by the lookup program over the pins: [`PinnedReader`]).
//! * [`lookup_record`]: the lookup program's codes and result record.
//! * [`unwind`]: the native unwinder's records, run over captured memory
//!   and over a process's threads (task iterator); [`sampler`]: the same
//!   unwinder sampling user stacks on every CPU.
//! * [`events`]: host events from the kernel (exec, fork, exit, new
//!   executable mappings) through the events program's ring buffer, and
//!   [`tracefs`], which its tracepoints need.
//! * [`error`]: every error of the backend ([`KernelError`]); [`stats`]:
//!   how many entries the maps hold ([`MapStats`]).

pub mod bpffs;
#[cfg(test)]
mod c_header;
pub mod elements;
pub mod error;
pub mod events;
pub mod generation;
pub mod lock;
pub mod lookup_record;
pub mod maps;
pub mod path_io;
pub mod pin;
pub mod pinned;
pub mod probe;
pub mod sampler;
pub mod stats;
pub mod sys;
pub mod tracefs;
pub mod unwind;

pub use aya;
pub use elements::WriteMode;
pub use error::{KernelError, ShapeMismatch};
pub use lookup_record::LookupResult;
pub use maps::{Dump, KernelConfig, KernelMaps, DEFAULT_ARRAYS_IN_FLIGHT, LOOKUP_OBJECT};
pub use pin::{PinReport, PinState};
pub use pinned::PinnedReader;
pub use stats::MapStats;
