//! Dense ternary matrices: the plain form every packed format is made from and checked against.

use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// A dense `rows × cols` matrix of weights in {-1, 0, +1}, row-major, one row per output,
/// with one f32 scale for the whole tensor (BitNet b1.58's absmean scale `β`).
#[derive(Debug, Clone, PartialEq)]
pub struct TernaryMatrix {
    /// Number of outputs (N).
    pub rows: usize,
    /// Number of inputs (K).
    pub cols: usize,
    /// `[rows, cols]`, each in {-1, 0, +1}.
    pub values: Vec<i8>,
    /// Dequantized weight = value × scale.
    pub scale: f32,
}

impl TernaryMatrix {
    /// Checks shape and that every value is ternary.
    pub fn new(rows: usize, cols: usize, values: Vec<i8>, scale: f32) -> Result<Self> {
        if rows == 0 || cols == 0 {
            return Err(Error::Shape(format!("ternary matrix needs rows > 0 and cols > 0, got {rows}×{cols}")));
        }
        if values.len() != rows * cols {
            return Err(Error::Shape(format!(
                "ternary matrix {rows}×{cols} needs {} values, got {}",
                rows * cols,
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !(-1..=1).contains(v)) {
            return Err(Error::Value(format!(
                "weight at row {}, col {} is {}; expected -1, 0 or +1",
                i / cols,
                i % cols,
                values[i]
            )));
        }
        if !scale.is_finite() {
            return Err(Error::Value(format!("weight scale is {scale}; expected a finite number")));
        }
        Ok(Self { rows, cols, values, scale })
    }

    /// Deterministic random weights, about a third zeros, from `seed`.
    pub fn random(rows: usize, cols: usize, scale: f32, seed: u64) -> Self {
        let mut values = vec![0i8; rows * cols];
        for (r, row) in values.chunks_mut(cols.max(1)).enumerate() {
            SplitMix64::stream(seed, r as u64).fill_ternary(row);
        }
        Self { rows, cols, values, scale }
    }

    /// Ternarize real weights the BitNet b1.58 way: scale = mean |w|, value = round(w / scale)
    /// clipped to [-1, 1].
    pub fn from_f32_absmean(rows: usize, cols: usize, w: &[f32]) -> Result<Self> {
        if w.len() != rows * cols {
            return Err(Error::Shape(format!("{rows}×{cols} matrix needs {} floats, got {}", rows * cols, w.len())));
        }
        let mean = w.iter().map(|v| v.abs() as f64).sum::<f64>() / w.len().max(1) as f64;
        let scale = mean.max(1e-8) as f32;
        let values = w.iter().map(|v| (v / scale).round().clamp(-1.0, 1.0) as i8).collect();
        Self::new(rows, cols, values, scale)
    }

    /// One row's values.
    pub fn row(&self, r: usize) -> &[i8] {
        &self.values[r * self.cols..(r + 1) * self.cols]
    }

    /// Fraction of zero weights.
    pub fn zero_fraction(&self) -> f64 {
        self.values.iter().filter(|v| **v == 0).count() as f64 / self.values.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_ternary_and_bad_shapes() {
        assert!(matches!(TernaryMatrix::new(1, 2, vec![0, 2], 1.0), Err(Error::Value(m)) if m.contains("col 1")));
        assert!(matches!(TernaryMatrix::new(2, 2, vec![0; 3], 1.0), Err(Error::Shape(_))));
        assert!(matches!(TernaryMatrix::new(0, 2, vec![], 1.0), Err(Error::Shape(_))));
    }

    #[test]
    fn absmean_ternarization() {
        let m = TernaryMatrix::from_f32_absmean(1, 4, &[0.9, -1.1, 0.1, -0.05]).unwrap();
        // mean |w| = 0.5375 → 0.9/0.5375 = 1.67 → 1; -2.05 → -1; 0.19 → 0; -0.09 → 0
        assert_eq!(m.values, vec![1, -1, 0, 0]);
        assert!((m.scale - 0.5375).abs() < 1e-6);
    }

    #[test]
    fn random_has_about_a_third_zeros() {
        let m = TernaryMatrix::random(64, 1000, 1.0, 3);
        assert!((m.zero_fraction() - 1.0 / 3.0).abs() < 0.02);
    }
}
