//! eim-bpf: eim's backend on real kernel maps, through aya.
//!
//! * [`sys`]: the raw `bpf()` calls aya 0.14 lacks (batch update, delete
//!   and lookup; outer-map creation with `inner_map_fd`), each counted.
//! * [`KernelMaps`]: the maps and the lookup program of the committed
//!   `bpf/lookup.bpf.o`, and the [`eim_core::ops::Backend`] that applies map
//!   ops to them with batch syscalls, exactly as `eim_sim::SimMaps` models.
//! * [`elements`]: a run of elements written with one batch call, or
//!   with one call per element (the measured baseline).
//! * [`pin`]: the bpffs directory the maps can be pinned in, and the
//!   check of every re-opened pin.
//! * [`lookup`]: the lookup program's codes and result record.

pub mod elements;
pub mod lookup;
pub mod maps;
pub mod pin;
pub mod probe;
pub mod sys;

pub use aya;
pub use elements::WriteMode;
pub use lookup::{KernelResolved, LookupResult};
pub use maps::{Dump, KernelConfig, KernelError, KernelMaps, MapStats, LOOKUP_OBJECT};
pub use pin::{PinReport, PinState};
