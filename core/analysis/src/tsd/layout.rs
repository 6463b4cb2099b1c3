//! The C-library layouts the TSD and DTV analyses find, as the BPF side
//! reads them.

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
