//! Choosing the next token: greedy, or temperature / top-k / top-p (nucleus) sampling from a
//! seeded generator. The sampler owns its buffers, so sampling allocates nothing.

use crate::error::{Error, Result};
use crate::model::forward::argmax;
use crate::rng::SplitMix64;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1 = all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

/// A sampler for a vocabulary of fixed size.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    /// `[vocab]` (token, probability) candidates.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams, vocab: usize) -> Result<Self> {
        if !(params.temperature >= 0.0 && params.temperature.is_finite()) {
            return Err(Error::Value(format!("temperature must be ≥ 0, got {}", params.temperature)));
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            return Err(Error::Value(format!("top-p must be in (0, 1], got {}", params.top_p)));
        }
        Ok(Self { params, rng: SplitMix64::new(params.seed), candidates: Vec::with_capacity(vocab) })
    }

    /// The next token for `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, l)| (i as u32, l / p.temperature)));
        // Most likely first (ties: lower token id first, so results do not depend on sort details).
        let by_prob = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_prob);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(by_prob);
        let max = c[0].1;
        let mut sum = 0.0f32;
        for e in c.iter_mut() {
            e.1 = (e.1 - max).exp();
            sum += e.1;
        }
        let mut cum = 0.0f32;
        let mut keep = c.len();
        for (i, e) in c.iter_mut().enumerate() {
            e.1 /= sum;
            cum += e.1;
            if cum >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep);
        let total: f32 = c.iter().map(|e| e.1).sum();
        let mut r = self.rng.unit_f32() * total;
        for e in c.iter() {
            r -= e.1;
            if r < 0.0 {
                return e.0;
            }
        }
        c[c.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(params: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(params, logits.len()).unwrap();
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            counts[s.sample(logits) as usize] += 1;
        }
        counts
    }

    #[test]
    fn greedy_is_argmax() {
        assert_eq!(Sampler::new(SamplingParams::default(), 3).unwrap().sample(&[0.1, 2.0, 1.0]), 1);
    }

    #[test]
    fn temperature_one_follows_the_softmax() {
        let logits = [0.0f32, (2.0f32).ln(), (5.0f32).ln()]; // probabilities 1/8, 2/8, 5/8
        let c = draw(SamplingParams { temperature: 1.0, seed: 3, ..Default::default() }, &logits, 80_000);
        for (i, want) in [1.0 / 8.0, 2.0 / 8.0, 5.0 / 8.0].iter().enumerate() {
            assert!((c[i] as f64 / 80_000.0 - want).abs() < 0.01, "{c:?}");
        }
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
        let c = draw(SamplingParams { temperature: 1.0, top_k: 2, seed: 1, ..Default::default() }, &logits, 5000);
        assert!(c[2..].iter().all(|n| *n == 0) && c[0] > c[1] && c[1] > 0, "{c:?}");
        // p(0) ≈ 0.64, p(1) ≈ 0.24: top-p 0.8 keeps exactly tokens 0 and 1.
        let c = draw(SamplingParams { temperature: 1.0, top_p: 0.8, seed: 2, ..Default::default() }, &logits, 5000);
        assert!(c[2..].iter().all(|n| *n == 0) && c[1] > 0, "{c:?}");
    }

    #[test]
    fn same_seed_same_tokens_and_bad_params_are_errors() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32).collect();
        let p = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 9 };
        let a: Vec<u32> = (0..50).scan(Sampler::new(p, 100).unwrap(), |s, _| Some(s.sample(&logits))).collect();
        let b: Vec<u32> = (0..50).scan(Sampler::new(p, 100).unwrap(), |s, _| Some(s.sample(&logits))).collect();
        assert_eq!(a, b);
        assert!(Sampler::new(SamplingParams { temperature: -1.0, ..p }, 10).is_err());
        assert!(Sampler::new(SamplingParams { top_p: 0.0, ..p }, 10).is_err());
    }
}
