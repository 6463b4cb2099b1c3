//! eim-bpf: eim's backend on real kernel maps, through aya.
//!
//! The `KernelMaps` backend (map creation and pinning, batched writes,
//! crash recovery, and the kernel lookup program as a test oracle) is the
//! subject of the kernel-backend issue. Until then this crate only pins the
//! dependency on aya 0.14.0, the newest release that builds on Rust 1.95.

pub use aya;
