//! eim-bpf: eim's backend on real kernel maps, through aya.
//!
//! * [`sys`]: the raw `bpf()` calls aya 0.14 lacks (batch update, delete
//!   and lookup; outer-map creation with `inner_map_fd`), each counted.

pub mod sys;

pub use aya;
