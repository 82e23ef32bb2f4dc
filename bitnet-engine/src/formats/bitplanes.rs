//! Bit-plane weights for the XNOR/AND + popcount kernels.
//!
//! `BitPlanes` holds a ternary matrix as two 1-bit planes per row: a non-zero mask (bit set where
//! w ≠ 0) and a sign plane (bit set where w = −1; always a subset of the mask). `Binary` holds
//! sign-only ±1 weights (the "true 1-bit" models) as one plane. Bit `k % 64` of word `k / 64` is
//! weight `k`; unused bits of a row's last word are zero. Each `BitPlanes` row stores its mask
//! words then its sign words, so a kernel streams one contiguous run per row.

use crate::aligned::PageVec;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::ternary::TernaryMatrix;

/// 64-bit words needed for `cols` bits.
pub fn words_for(cols: usize) -> usize {
    cols.div_ceil(64)
}

/// Ternary weights as mask + sign planes.
#[derive(Debug, Clone, PartialEq)]
pub struct BitPlaneMatrix {
    rows: usize,
    cols: usize,
    /// Words per plane per row.
    words: usize,
    /// `[rows, 2 (mask, sign), words]`, in huge pages when large (see `aligned`).
    data: PageVec<u64>,
    scale: f32,
}

impl BitPlaneMatrix {
    fn zeroed(rows: usize, cols: usize, scale: f32) -> Result<Self> {
        if rows == 0 || cols == 0 {
            return Err(Error::Shape(format!("bit-plane matrix needs rows > 0 and cols > 0, got {rows}×{cols}")));
        }
        let words = words_for(cols);
        Ok(Self { rows, cols, words, data: PageVec::zeroed(rows * 2 * words), scale })
    }

    fn set_row(&mut self, r: usize, values: &[i8]) {
        let words = self.words;
        let dst = &mut self.data[r * 2 * words..(r + 1) * 2 * words];
        dst.fill(0);
        let (mask, sign) = dst.split_at_mut(words);
        for (k, &w) in values.iter().enumerate() {
            let bit = 1u64 << (k % 64);
            if w != 0 {
                mask[k / 64] |= bit;
            }
            if w < 0 {
                sign[k / 64] |= bit;
            }
        }
    }

    pub fn pack(m: &TernaryMatrix) -> Result<Self> {
        let mut out = Self::zeroed(m.rows, m.cols, m.scale)?;
        for r in 0..m.rows {
            out.set_row(r, m.row(r));
        }
        Ok(out)
    }

    /// Random ternary weights (about a third zeros), packed row by row.
    pub fn random(rows: usize, cols: usize, scale: f32, seed: u64) -> Result<Self> {
        let mut out = Self::zeroed(rows, cols, scale)?;
        let mut row = vec![0i8; cols];
        for r in 0..rows {
            SplitMix64::stream(seed, r as u64).fill_ternary(&mut row);
            out.set_row(r, &row);
        }
        Ok(out)
    }

    pub fn unpack(&self) -> TernaryMatrix {
        super::unpack_by(self.rows, self.cols, self.scale, |r, k| self.get(r, k))
    }

    #[inline]
    pub fn get(&self, row: usize, col: usize) -> i8 {
        let (mask, sign) = self.row_planes(row);
        let bit = 1u64 << (col % 64);
        match (mask[col / 64] & bit != 0, sign[col / 64] & bit != 0) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => -1,
        }
    }

    /// (mask words, sign words) of one row.
    #[inline]
    pub fn row_planes(&self, r: usize) -> (&[u64], &[u64]) {
        self.data[r * 2 * self.words..(r + 1) * 2 * self.words].split_at(self.words)
    }
    /// One row's words: mask then sign.
    #[inline]
    pub fn row_words(&self, r: usize) -> &[u64] {
        &self.data[r * 2 * self.words..(r + 1) * 2 * self.words]
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn words(&self) -> usize {
        self.words
    }
    pub fn scale(&self) -> f32 {
        self.scale
    }
    pub fn byte_len(&self) -> usize {
        self.data.len() * 8
    }
    /// Every row's words, row r at `r × 2 × words`.
    pub fn all_words(&self) -> &[u64] {
        &self.data
    }
}

/// Sign-only ±1 weights, one bit each (bit set = −1).
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryMatrix {
    rows: usize,
    cols: usize,
    words: usize,
    /// `[rows, words]`, in huge pages when large.
    data: PageVec<u64>,
    scale: f32,
}

impl BinaryMatrix {
    /// Packs a matrix whose every value is ±1; a zero is an error (binary weights have none).
    pub fn pack(m: &TernaryMatrix) -> Result<Self> {
        if m.rows == 0 || m.cols == 0 {
            return Err(Error::Shape(format!("binary matrix needs rows > 0 and cols > 0, got {}×{}", m.rows, m.cols)));
        }
        if let Some(i) = m.values.iter().position(|v| *v == 0) {
            return Err(Error::Value(format!(
                "binary weights must be ±1, but row {}, col {} is 0",
                i / m.cols,
                i % m.cols
            )));
        }
        let words = words_for(m.cols);
        let mut data = PageVec::<u64>::zeroed(m.rows * words);
        for (r, dst) in data.chunks_mut(words).enumerate() {
            for (k, &w) in m.row(r).iter().enumerate() {
                if w < 0 {
                    dst[k / 64] |= 1u64 << (k % 64);
                }
            }
        }
        Ok(Self { rows: m.rows, cols: m.cols, words, data, scale: m.scale })
    }

    /// Random ±1 weights (half each).
    pub fn random(rows: usize, cols: usize, scale: f32, seed: u64) -> Result<Self> {
        let mut values = vec![0i8; rows * cols];
        for (r, row) in values.chunks_mut(cols.max(1)).enumerate() {
            let mut g = SplitMix64::stream(seed, r as u64);
            for v in row {
                *v = if g.next_u64() >> 63 == 1 { -1 } else { 1 };
            }
        }
        Self::pack(&TernaryMatrix::new(rows, cols, values, scale)?)
    }

    pub fn unpack(&self) -> TernaryMatrix {
        super::unpack_by(self.rows, self.cols, self.scale, |r, k| self.get(r, k))
    }

    #[inline]
    pub fn get(&self, row: usize, col: usize) -> i8 {
        if self.row_words(row)[col / 64] >> (col % 64) & 1 == 1 {
            -1
        } else {
            1
        }
    }

    #[inline]
    pub fn row_words(&self, r: usize) -> &[u64] {
        &self.data[r * self.words..(r + 1) * self.words]
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn words(&self) -> usize {
        self.words
    }
    pub fn scale(&self) -> f32 {
        self.scale
    }
    pub fn byte_len(&self) -> usize {
        self.data.len() * 8
    }
    /// Every row's words, row r at `r × words`.
    pub fn all_words(&self) -> &[u64] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitplanes_round_trip_and_sign_within_mask() {
        for cols in [1, 63, 64, 65, 544] {
            let m = TernaryMatrix::random(3, cols, 0.3, cols as u64);
            let p = BitPlaneMatrix::pack(&m).unwrap();
            assert_eq!(p.unpack(), m);
            for r in 0..3 {
                let (mask, sign) = p.row_planes(r);
                assert!(mask.iter().zip(sign).all(|(m, s)| s & !m == 0));
            }
        }
        let r = BitPlaneMatrix::random(4, 100, 1.0, 2).unwrap();
        assert_eq!(BitPlaneMatrix::pack(&r.unpack()).unwrap(), r);
    }

    #[test]
    fn binary_round_trip_and_rejects_zero() {
        let b = BinaryMatrix::random(3, 130, 0.5, 4).unwrap();
        assert_eq!(BinaryMatrix::pack(&b.unpack()).unwrap(), b);
        let z = TernaryMatrix::new(1, 2, vec![1, 0], 1.0).unwrap();
        assert!(matches!(BinaryMatrix::pack(&z), Err(Error::Value(s)) if s.contains("col 1")));
    }
}
