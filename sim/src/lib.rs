//! eim-sim: eim's kernel maps in memory, with the kernel's semantics.
//!
//! * [`maps`]: a generic BPF map (HASH, ARRAY, HASH_OF_MAPS) at the byte
//!   level, with the syscall's errnos, batch semantics and map-in-map
//!   reference counting.

pub mod maps;

pub use maps::{
    BatchError, BpfMap, MapId, MapRegistry, MapSpec, MapType, BPF_ANY, BPF_EXIST, BPF_F_LOCK,
    BPF_NOEXIST,
};
