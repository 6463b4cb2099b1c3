//! The manager's tunables.

use std::time::Duration;

use eim_machine::machine::{deferred, Capacities};

#[cfg(doc)]
use super::ExecutableInfoManager;
#[cfg(doc)]
use eim_machine::deltas::IntervalData;

/// Tunables, with upstream's defaults.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub capacities: Capacities,
    pub deferred_capacity: usize,
    pub deferred_ttl: Duration,
    /// Shards of the file table (rounded up to a power of two).
    pub shards: usize,
    /// How long an `unwind_info_array` slot no table references any more
    /// keeps its rule before another rule may be written to it (see
    /// [`eim_machine::machine::slots::DEFAULT_SLOT_GRACE`] for why this is safe).
    pub slot_grace: Duration,
    /// How many bytes of extracted stack deltas a [`ExecutableInfoManager::load_many`]
    /// holds before it publishes them: the batch is written to the kernel
    /// in parts that end with the file whose deltas reach this size, so
    /// its peak memory follows this bound (plus one file), not the
    /// batch's file count.
    pub batch_bytes: usize,
}

/// The default [`Config::batch_bytes`]: a host's first step holds at most
/// three parts of this many bytes of deltas (one extracted, one queued,
/// one published), and each part costs one outer-map publication (an RCU
/// wait) per size class it uses; measured on a 2,657-file host
/// (docs/BENCHMARKS.md), 64 MiB kept the peak under 256 MB and the scan
/// under 3 s, where 32 MiB cost 1 s more in RCU waits and 128 MiB went
/// over the peak. Those were 64 MiB of 24-byte deltas; packed
/// ([`IntervalData`] holds 8 bytes a delta) the same 2.8 million deltas a
/// part take a third of that.
pub(crate) const DEFAULT_BATCH_BYTES: usize = (64 << 20) / 3;

impl Default for Config {
    fn default() -> Self {
        Self {
            capacities: Capacities::default(),
            deferred_capacity: deferred::DEFAULT_CAPACITY,
            deferred_ttl: deferred::DEFAULT_TTL,
            shards: 64,
            slot_grace: eim_machine::machine::slots::DEFAULT_SLOT_GRACE,
            batch_bytes: DEFAULT_BATCH_BYTES,
        }
    }
}
