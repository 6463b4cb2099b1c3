//! A small deterministic generator for tests (xorshift64): the seed is the
//! reproduction, and no dependency is needed. Not for anything that must
//! be unpredictable.

/// Xorshift64; a zero seed is replaced (zero is its fixed point).
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index below `n` (0 for `n` = 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_xorshift64() {
        let mut r = XorShift::new(1);
        // x ^= x << 13; x ^= x >> 7; x ^= x << 17, from 1.
        assert_eq!(r.next_u64(), 0x4082_2041);
        let mut z = XorShift::new(0);
        assert_ne!(z.next_u64(), 0, "a zero seed still moves");
        assert!((0..100).all(|_| r.below(7) < 7));
        assert_eq!(r.below(0), 0);
        assert!((0..100).all(|_| r.index(3) < 3));
    }
}
