//! What the manager hands back for a file: the C-library layouts (TSD and
//! DTV) and what every interpreter loader that recognised it found (its
//! data, or its error: all matches are kept, upstream weakness 11).

use std::fmt;
use std::sync::Arc;

use crate::interp::LoaderMatch;

/// Where a C library keeps thread-specific data, as the BPF side reads it:
/// `addr = tp + offset; if indirect { addr = *addr }; value = *(addr + key * multiplier)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TsdInfo {
    pub offset: i16,
    pub multiplier: u8,
    pub indirect: u8,
}

/// Where a C library keeps a thread's dynamic thread vector (upstream's
/// HEAD `DTVInfo`): `dtv = *(tp + offset)`, entry `module` at
/// `dtv + module * multiplier`. Taken from `__tls_get_addr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DtvInfo {
    pub offset: i16,
    pub multiplier: u8,
}

/// What a C library tells the profiler (upstream HEAD's `LibcInfo`): each
/// layout is present only where its analysis succeeded, so a file with
/// neither is no C library to the profiler (upstream keeps no `LibcInfo`
/// for it). One file may well have only one: glibc's `libc.so.6` defines
/// `pthread_getspecific` but imports `__tls_get_addr` from the dynamic
/// loader, whose file has the DTV and no TSD. Combining the files of one
/// process is the process tracker's business, not the manager's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LibcInfo {
    pub tsd: Option<TsdInfo>,
    pub dtv: Option<DtvInfo>,
}

impl LibcInfo {
    /// Neither layout: upstream's "no `LibcInfo`".
    pub fn is_empty(&self) -> bool {
        self.tsd.is_none() && self.dtv.is_none()
    }
}

/// Per-file data of an interpreter loader. `Any` lets a caller that knows
/// the loader read its concrete data (`as &dyn Any`, then `downcast_ref`).
pub trait InterpreterData: std::any::Any + Send + Sync + fmt::Debug {
    /// The loader that produced it.
    fn loader(&self) -> &'static str;

    /// The interpreter's version, as the loader read it.
    fn version(&self) -> String {
        String::new()
    }
}

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
