//! eim-bpf: eim's backend on real kernel maps, through aya.
//!
//! * [`sys`]: the raw `bpf()` calls aya 0.14 lacks (batch update, delete
//!   and lookup; outer-map creation with `inner_map_fd`), each counted.
//! * [`KernelMaps`]: the maps and the lookup program of the committed
//!   `bpf/lookup.bpf.o`, and the [`eim_core::ops::Backend`] that applies map
//!   ops to them with batch syscalls, exactly as `eim_sim::SimMaps` models.
//! * [`elements`]: a run of elements written with one batch call, or
//!   with one call per element (the measured baseline).
//! * [`lock`]: one owner per pin directory (an exclusive `flock` on a lock
//!   file named after it, outside it); readers ask for a shared one.
//! * [`bpffs`]: when a bpffs is mounted for the pins, and when that is
//!   refused.
//! * [`pin`]: the check of every pin found against the expected shape
//!   (refused, or replaced when asked).
//! * [`pinned`]: the pinned maps read without owning them (dumped, and
//!   looked up by the lookup program over the pins: [`PinnedReader`]).
//! * [`lookup`]: the lookup program's codes and result record.
//! * [`events`]: host events from the kernel (exec, fork, exit, new
//!   executable mappings) through the events program's ring buffer, and
//!   [`tracefs`], which its tracepoints need.
//! * [`error`]: every error of the backend ([`KernelError`]); [`stats`]:
//!   how many entries the maps hold ([`MapStats`]).

pub mod bpffs;
pub mod elements;
pub mod error;
pub mod events;
pub mod lock;
pub mod lookup;
pub mod maps;
pub mod pin;
pub mod pinned;
pub mod probe;
pub mod stats;
pub mod sys;
pub mod tracefs;

pub use aya;
pub use elements::WriteMode;
pub use error::{KernelError, ShapeMismatch};
pub use lookup::{KernelResolved, LookupResult};
pub use maps::{Dump, KernelConfig, KernelMaps, DEFAULT_ARRAYS_IN_FLIGHT, LOOKUP_OBJECT};
pub use pin::{PinReport, PinState};
pub use pinned::PinnedReader;
pub use stats::MapStats;
