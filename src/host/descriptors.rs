//! The process's descriptor budget: `eim` raises its soft `RLIMIT_NOFILE`
//! to the hard limit at start, and sizes what holds descriptors per file
//! from what the soft limit leaves.
//!
//! Why raise it: systemd gives a service a soft limit of 1,024 unless told
//! otherwise (its hard limit is far higher), and the soft limit exists only
//! for programs that still use `select()`; eim does not. Go programs, the
//! upstream profiler among them, get the raise from their runtime at start.
//!
//! What holds descriptors per file, and how it is bounded (nothing else
//! does: the kernel backend keeps none per loaded table, see
//! `eim_bpf::maps`, "Descriptors"):
//!
//! * a host batch ([`crate::host::scan::HostConfig::batch_files`]) holds each of
//!   its files open from its identification to the end of its load: the
//!   file id was computed from that open file, and opening it again by
//!   path could find another file;
//! * publishing the batch holds up to one inner array per table of a size
//!   class (`eim_bpf::KernelConfig::arrays_in_flight`), together with
//!   the batch's files;
//! * one extraction at a time holds its file's debug file, and the walk
//!   of `/proc` a few transient ones.
//!
//! So [`files_per_batch`] gives each of the first two a quarter of what
//! the soft limit leaves (at most 1,024, the batch size the host's
//! timings were measured with), and the other half stays for the rest: the maps,
//! the metrics server's connections, the transient ones.

use std::io;

use eim_core::error::Causes;
use rlimit::Resource;

/// The largest batch: what a soft limit of about 4,200 or more gives (a
/// quarter of what it leaves), and what the host's timings were measured
/// with (`docs/BENCHMARKS.md`): fewer batches, fewer outer-map
/// publications, each an RCU wait.
pub const MAX_FILES_PER_BATCH: usize = 1024;

/// Why the limit could not be read or raised, or the descriptors counted.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    #[error("reading RLIMIT_NOFILE: {0}")]
    Read(io::Error),
    #[error("raising the soft RLIMIT_NOFILE from {soft} to the hard limit {hard}: {cause}")]
    Raise {
        soft: u64,
        hard: u64,
        cause: io::Error,
    },
    #[error("counting the open descriptors in /proc/self/fd: {}", Causes(.0))]
    Count(procfs::ProcError),
}

/// What [`raise_soft_limit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit before.
    pub from: u64,
    /// The soft limit now: the hard limit.
    pub to: u64,
}

impl Raised {
    pub fn changed(&self) -> bool {
        self.from != self.to
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit.
pub fn raise_soft_limit() -> Result<Raised, DescriptorError> {
    let (soft, hard) = Resource::NOFILE.get().map_err(DescriptorError::Read)?;
    let to = rlimit::increase_nofile_limit(u64::MAX).map_err(|cause| DescriptorError::Raise {
        soft,
        hard,
        cause,
    })?;
    Ok(Raised { from: soft, to })
}

/// The soft `RLIMIT_NOFILE` now.
pub fn soft_limit() -> Result<u64, DescriptorError> {
    Resource::NOFILE
        .get()
        .map(|(soft, _)| soft)
        .map_err(DescriptorError::Read)
}

/// Descriptors this process has open now.
pub fn open_now() -> Result<usize, DescriptorError> {
    procfs::process::Process::myself()
        .and_then(|me| me.fd_count())
        .map_err(DescriptorError::Count)
}

/// The files a host batch may hold open (and the inner arrays a publish
/// may hold) when `open` of `soft` descriptors are in use: a quarter of
/// what is left each, between 1 and [`MAX_FILES_PER_BATCH`].
pub fn files_per_batch(soft: u64, open: usize) -> usize {
    let left = soft.saturating_sub(open as u64) / 4;
    usize::try_from(left)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_FILES_PER_BATCH)
}

/// [`files_per_batch`] for this process now.
pub fn files_per_batch_now() -> Result<usize, DescriptorError> {
    Ok(files_per_batch(soft_limit()?, open_now()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_a_quarter_of_what_the_soft_limit_leaves() {
        // A service's default soft limit, and what it leaves at start.
        assert_eq!(files_per_batch(1024, 30), 248);
        assert_eq!(files_per_batch(256, 30), 56);
        // Raised to a hard limit of a million: the cap.
        assert_eq!(files_per_batch(1 << 20, 30), MAX_FILES_PER_BATCH);
        assert_eq!(files_per_batch(u64::MAX, 0), MAX_FILES_PER_BATCH);
        // Nothing left: one file at a time still loads.
        assert_eq!(files_per_batch(32, 30), 1);
        assert_eq!(files_per_batch(16, 30), 1);
        // Two quarters of what is left, whatever it is, stay within it.
        for soft in [64u64, 100, 256, 1000, 1024, 4096] {
            let open = 20;
            let batch = files_per_batch(soft, open) as u64;
            assert!(2 * batch <= (soft - open as u64) / 2 + 1, "{soft}");
        }
    }

    #[test]
    fn the_count_and_the_limit_are_this_process_s() {
        let soft = soft_limit().expect("limit");
        let open = open_now().expect("count");
        // stdin, stdout, stderr at least; below the limit, or nothing
        // would run.
        assert!(open >= 3 && (open as u64) < soft, "{open} of {soft}");
    }
}
