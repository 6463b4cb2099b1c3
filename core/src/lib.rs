//! eim-core: the pure heart of eim.
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

pub mod abi;
pub mod deltas;
pub mod driver;
pub mod elf;
pub mod encode;
pub mod error;
pub mod info;
pub mod interp;
pub mod machine;
pub mod manager;
pub mod metrics;
pub mod ops;
pub mod provider;
mod sync;
pub mod text;
pub mod text_input;
pub mod tracers;
pub mod tracking;
pub mod tsd;

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
