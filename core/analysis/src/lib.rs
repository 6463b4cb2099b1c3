//! eim-analysis: what eim learns from an executable's bytes.
//!
//! Pure functions of a file's contents, read through a [`elf::FileView`]
//! (a slice, or a file its caller reads on demand): the stack deltas of
//! its `.eh_frame`, `.debug_frame` and `.gopclntab` ([`elf::extract()`]),
//! the C library's TSD and DTV layouts ([`tsd`]) and what each
//! interpreter's loader needs ([`interp`]). The only things it keeps of
//! the world are a thread pool for large CFI walks and their deadlines
//! (`elf::ehframe::walk`); it opens no file (a debug-link file comes
//! through its caller's opener). Its output is `eim-machine`'s types.
//!
//! * [`analyse`](mod@analyse): one file's analysis (deltas, loaders, C-library
//!   layouts), the debug file asked of the edge ([`analyse::DebugFiles`]).
//! * [`elf`]: the ELF reader, the CFI and Go table walks, the file id.
//! * [`tsd`]: C-library introspection (TSD and DTV layouts from machine code).
//! * [`interp`]: the interpreter loaders (pure functions of a parsed ELF).

// What other crates may use is `pub` and reachable; the rest is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod analyse;
pub mod elf;
pub mod interp;
mod sync;
pub mod tsd;

pub use interp::InterpreterData;
pub use tsd::{DtvInfo, LibcInfo, TsdInfo};
