//! What the manager hands back for a file: the C-library layouts (TSD and
//! DTV, found by [`eim_analysis::tsd`]) and what every interpreter loader that
//! recognised it found (its data, or its error: all matches are kept,
//! upstream weakness 11). The machine stores it as an opaque payload.

use std::sync::Arc;

use crate::tracers::LoaderMatch;
use eim_analysis::interp::InterpreterData;
use eim_analysis::tsd::LibcInfo;

/// A copy of what the manager knows about a file.
#[derive(Clone, Debug, Default)]
pub struct ExecutableInfo {
    /// One entry per loader that recognised the file, in loader order; a
    /// shared slice so that the per-process fast path copies a pointer.
    pub interpreters: Arc<[LoaderMatch]>,
    /// Empty unless the file is a C library by name and at least one of
    /// its layouts was found.
    pub libc: LibcInfo,
}

impl ExecutableInfo {
    /// The data of the loaders that handle the file.
    pub fn interpreter_data(&self) -> impl Iterator<Item = &Arc<dyn InterpreterData>> {
        self.interpreters
            .iter()
            .filter_map(|m| m.outcome.as_ref().ok().map(|l| &l.data))
    }
}

impl PartialEq for ExecutableInfo {
    fn eq(&self, other: &Self) -> bool {
        let same_interpreter = self.interpreters[..] == other.interpreters[..];
        same_interpreter && self.libc == other.libc
    }
}
