//! The live host: its processes, their executable mappings, the files
//! behind them and their ids. Everything here reads `/proc` and files; the
//! decisions about references live in [`mappings`].

pub mod fileids;
pub mod mappings;
pub mod open;
pub mod procs;
