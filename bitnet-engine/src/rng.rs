//! A tiny deterministic generator for synthetic weights and activations.
//!
//! SplitMix64: statistically good enough for test data and synthetic models, seedable, and
//! splittable (one independent stream per row or per thread via [`SplitMix64::stream`]).

/// SplitMix64 (Steele, Lea, Flood 2014). Not cryptographic.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent stream for item `index` of a seed (e.g. one per matrix row).
    pub fn stream(seed: u64, index: u64) -> Self {
        let mut g = Self::new(seed ^ 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(index.wrapping_add(1)));
        g.next_u64();
        g
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift; bias below 2^-32 for the small n used here).
    #[inline]
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * n as u64) >> 32) as u32
    }

    /// Uniform f32 in [0, 1).
    #[inline]
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// A ternary value with P(0) = 1/3 and P(-1) = P(+1) = 1/3, the distribution of trained
    /// BitNet b1.58 weights (about a third zeros).
    #[inline]
    pub fn ternary(&mut self) -> i8 {
        self.below(3) as i8 - 1
    }

    /// Fill `out` with ternary values.
    pub fn fill_ternary(&mut self, out: &mut [i8]) {
        for v in out {
            *v = self.ternary();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ternary_distribution_is_about_a_third_each() {
        let mut g = SplitMix64::new(7);
        let mut counts = [0usize; 3];
        for _ in 0..300_000 {
            counts[(g.ternary() + 1) as usize] += 1;
        }
        for c in counts {
            assert!((c as f64 / 300_000.0 - 1.0 / 3.0).abs() < 0.01, "{counts:?}");
        }
    }

    #[test]
    fn streams_differ_and_repeat() {
        let a: Vec<u64> = (0..4).map(|_| SplitMix64::stream(1, 0).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(SplitMix64::stream(1, 0).next_u64(), SplitMix64::stream(1, 1).next_u64());
    }
}
