//! Looking into a backend: what its maps hold and what the unwinder's
//! lookup answers, the same way for the simulated kernel and the real one
//! ([`inspect::Inspect`]), and the lookup of a process address through its
//! mapping to the file's address ([`lookup`]).

pub mod inspect;
pub mod lookup;
pub mod status;
