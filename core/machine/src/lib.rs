//! eim-machine: the pure heart of eim.
//!
//! What decides every write eim makes to the kernel maps an eBPF unwinder
//! reads, byte-compatible with the OpenTelemetry eBPF profiler's, as pure
//! functions and data: no thread, no clock, no file, no socket, no process
//! (the tidy test checks the paths this crate names). Time is passed in as
//! a [`std::time::Duration`]; the map operations ([`ops::MapOp`]) go out to
//! a backend through [`driver::execute`]. `eim-analysis` turns files into
//! its inputs and `eim-core`'s manager runs it behind locks and threads.
//!
//! * [`abi`]: the kernel structs and constants, byte for byte.
//! * [`deltas`]: stack deltas and upstream's de-duplicating append rules.
//! * [`encode`]: deltas to a kernel table (pages, merges, size class, gaps).
//! * [`ops`]: the map mutation commands and the [`ops::Backend`] trait.
//! * [`machine`]: the state machine (files, reference counts, unwind-info
//!   slots, page accounting, deferral, leftovers) that turns calls into plans.
//! * [`process_maps`]: what `eim_process_mappings` holds per process.
//! * [`tracking`]: host events (exec, fork, exit, new executable mappings)
//!   and the work a batch of them asks of the host side.
//! * [`unwind`]: the native unwinder, over the maps behind traits.
//! * [`text`], [`text_input`]: the oracle's text formats.

// What other crates may use is `pub` and reachable; the rest is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod abi;
pub mod deltas;
pub mod driver;
pub mod encode;
pub mod fallible;
pub mod machine;
pub mod ops;
pub mod process_maps;
pub mod text;
pub mod text_input;
pub mod tracking;
pub mod unwind;

use std::fmt;

/// Whether the book's gauges are recounted at every commit and rollback
/// (debug builds with the `recount` feature; the simulator and the
/// fuzzers say so by a test).
pub const RECOUNTS_BOOK: bool = cfg!(all(debug_assertions, feature = "recount"));

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
