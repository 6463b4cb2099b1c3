//! The simulator's only source of randomness.
//!
//! A seed must mean the same run on every machine and with every version of
//! every crate, or a failure found in CI could not be replayed anywhere
//! else. ChaCha8's output stream is fixed by its specification, and every
//! mapping from that stream to a choice (a range, a probability, a pick) is
//! written here rather than taken from `rand`, whose distributions have
//! changed between versions.

use chacha20::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng as _};

/// Independent streams derived from one run seed, so that (for example)
/// the file pool does not change when the workload draws one more number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    Pool = 1,
    Workload = 2,
    Faults = 3,
    Config = 4,
}

/// A seeded, platform-independent random number generator.
#[derive(Debug)]
pub struct SimRng(ChaCha8Rng);

impl SimRng {
    /// The generator of `stream` for run `seed`: the 32-byte ChaCha key is
    /// the seed and the stream number, little endian.
    pub fn new(seed: u64, stream: Stream) -> Self {
        Self::from_parts(seed, stream as u64)
    }

    /// A generator for a 64-bit sub-seed (each action's faults).
    pub fn from_parts(seed: u64, stream: u64) -> Self {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&stream.to_le_bytes());
        Self(ChaCha8Rng::from_seed(key))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform-enough in `0..n` (0 when `n == 0`): the high half of a
    /// 64x64-bit product. The bias is below 2^-32 for the ranges used here,
    /// and the mapping never changes.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// An index below `n`, as usize.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// True with probability `p` (in steps of 2^-53).
    pub fn chance(&mut self, p: f64) -> bool {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit < p
    }

    /// An index chosen with the given weights (the last one if all are 0).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < u64::from(*w) {
                return i;
            }
            x -= u64::from(*w);
        }
        weights.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_of_a_seed_is_fixed() {
        // Recorded once from ChaCha8 with this key layout (a regression
        // guard, not a specification vector). If this changes, seeds
        // recorded in CI and in bug reports no longer mean the runs they
        // named: find out why before updating it.
        let mut rng = SimRng::new(1, Stream::Workload);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        let mut again = SimRng::new(1, Stream::Workload);
        let second: Vec<u64> = (0..3).map(|_| again.next_u64()).collect();
        assert_eq!(first, second);
        assert_eq!(first, RECORDED.to_vec());
    }

    const RECORDED: [u64; 3] = [
        6082804599785255738,
        5100844500663306037,
        8813305699299128348,
    ];

    #[test]
    fn streams_and_seeds_differ() {
        let a = SimRng::new(1, Stream::Workload).next_u64();
        let b = SimRng::new(1, Stream::Pool).next_u64();
        let c = SimRng::new(2, Stream::Workload).next_u64();
        assert!(a != b && a != c && b != c);
    }

    #[test]
    fn mappings_stay_in_range_and_reach_both_ends() {
        let mut rng = SimRng::new(7, Stream::Config);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = rng.range(3, 7);
            assert!((3..=7).contains(&x));
            seen[(x - 3) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.range(5, 2), 5);
        assert!(!rng.chance(0.0));
        assert!(rng.chance(1.0));
        for _ in 0..100 {
            assert_eq!(rng.weighted(&[0, 5, 0]), 1);
        }
    }
}
