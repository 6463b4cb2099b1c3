//! What the manager hands back for a file: the C-library TSD layout and the
//! data of the interpreter loader that recognised it, if any.

use std::fmt;
use std::sync::Arc;

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

/// Per-file data of an interpreter loader.
pub trait InterpreterData: Send + Sync + fmt::Debug {
    /// The loader that produced it.
    fn loader(&self) -> &'static str;
}

/// A copy of what the manager knows about a file.
#[derive(Clone, Debug, Default)]
pub struct ExecutableInfo {
    pub interpreter: Option<Arc<dyn InterpreterData>>,
    pub tsd: Option<TsdInfo>,
}

impl PartialEq for ExecutableInfo {
    fn eq(&self, other: &Self) -> bool {
        let same_interpreter = match (&self.interpreter, &other.interpreter) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_interpreter && self.tsd == other.tsd
    }
}
