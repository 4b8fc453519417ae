//! A tiny seeded random generator (xorshift64*), so simulated faults and property-style tests are
//! reproducible from a seed without a dependency. Not for anything that needs real randomness.

/// Deterministic pseudo-random numbers from a `u64` seed.
#[derive(Debug, Clone)]
pub(crate) struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    /// A generator for `seed`; every seed, including 0, gives a usable sequence.
    pub(crate) fn new(seed: u64) -> Self {
        // Spread the seed (splitmix64 step) so small seeds differ at once; the state must be
        // non-zero for xorshift.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift64 { state: if z == 0 { 1 } else { z } }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..bound`; 0 when `bound` is 0.
    pub(crate) fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            return 0;
        }
        // Modulo bias is irrelevant for test fault choices.
        (self.next_u64() % bound as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_bounds_hold() {
        let mut a = XorShift64::new(7);
        let mut b = XorShift64::new(7);
        for _ in 0..100 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            assert!(x < 10);
        }
        assert_ne!(XorShift64::new(1).next_u64(), XorShift64::new(2).next_u64());
        assert_eq!(XorShift64::new(3).below(0), 0);
    }
}
