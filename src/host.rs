//! The live host: its processes, their executable mappings, the files
//! behind them and their ids, and the loop that keeps the manager's
//! references equal to what the processes map. [`procs`], [`open`] and
//! [`fileids`] read `/proc` and files; the decisions about references live
//! in [`mappings`], and which file owns an id that several present in
//! [`claims`] (with its I/O in [`collide`]); [`scan::Host`] is one walk of the host (and a warm
//! restart), [`crate::daemon`] steps it every interval; [`descriptors`] and [`heap`]
//! keep the process's descriptors and memory within bounds at host scale;
//! [`vdso`] makes each process's `[vdso]` mapping a file like the others.

pub mod claims;
pub mod collide;
pub mod descriptors;
pub mod events;
pub mod fileids;
pub mod heap;
pub mod mappings;
pub mod model;
pub mod open;
pub mod procs;
pub mod scan;
pub mod summarize;
pub mod vdso;
