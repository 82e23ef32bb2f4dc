//! `Int8Rows`: int8 weights with one f32 scale per row — the engine's precision for the token
//! embedding and the LM head (which are tied in BitNet b1.58 models).
//!
//! Values are stored as unsigned codes `w + 128`, so `vpdpbusd` can take them as its unsigned
//! operand; `Σ w·x = Σ (w + 128)·x − 128·Σ x`, the same trick the ternary formats use. Rows are
//! padded to a multiple of 256 columns with code 128 (weight 0) to match activation padding.

use crate::aligned::AlignedBytes;
use crate::error::{Error, Result};
use crate::formats::QK_K;

/// An int8 matrix with a scale per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Rows {
    rows: usize,
    cols: usize,
    /// Row stride: `cols` rounded up to 256.
    stride: usize,
    /// `[rows, stride]` codes `w + 128`.
    codes: AlignedBytes,
    /// `[rows]`: real value = w × scale.
    scales: Vec<f32>,
}

impl Int8Rows {
    /// Quantizes `values` (`[rows, cols]` f32) per row: scale = absmax / 127,
    /// w = round_half_even(v / scale).
    pub fn quantize(rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        if rows == 0 || cols == 0 || values.len() != rows * cols {
            return Err(Error::Shape(format!(
                "int8 rows: {rows}×{cols} needs {} values, got {}",
                rows * cols,
                values.len()
            )));
        }
        let mut m = Self::zeroed(rows, cols);
        for r in 0..rows {
            m.set_row(r, &values[r * cols..(r + 1) * cols]);
        }
        Ok(m)
    }

    /// All-zero weights of this shape (to be filled with [`Int8Rows::set_row`]).
    pub fn zeroed(rows: usize, cols: usize) -> Self {
        // Padded to whole blocks, as the activations are (`ACT_PAD`), so a row and a token line up.
        let stride = cols.div_ceil(QK_K) * QK_K;
        Self { rows, cols, stride, codes: AlignedBytes::filled(rows * stride, 128), scales: vec![0.0; rows] }
    }

    /// Quantizes one row from f32.
    pub fn set_row(&mut self, r: usize, v: &[f32]) {
        let absmax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let dst = &mut self.codes.as_mut_slice()[r * self.stride..r * self.stride + self.cols];
        if absmax > 0.0 && absmax.is_finite() {
            let inv = 127.0 / absmax;
            for (d, x) in dst.iter_mut().zip(v) {
                *d = (round_even(x * inv).clamp(-127.0, 127.0) as i32 + 128) as u8;
            }
            self.scales[r] = absmax / 127.0;
        } else {
            dst.fill(128);
            self.scales[r] = 0.0;
        }
    }

    /// Copies all rows of `src` (same column count) to rows `at..` of `self`, exactly.
    pub fn copy_rows_from(&mut self, at: usize, src: &Int8Rows) {
        assert_eq!(src.cols, self.cols, "copy_rows_from: column counts differ");
        let n = src.rows.min(self.rows - at);
        let st = self.stride;
        self.codes.as_mut_slice()[at * st..(at + n) * st].copy_from_slice(&src.codes.as_slice()[..n * st]);
        self.scales[at..at + n].copy_from_slice(&src.scales[..n]);
    }

    #[inline]
    pub fn get(&self, r: usize, c: usize) -> i8 {
        (self.codes.as_slice()[r * self.stride + c] as i32 - 128) as i8
    }

    /// Row `r` dequantized into `out` (`cols` floats): the embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let s = self.scales[r];
        for (o, c) in out.iter_mut().zip(&self.codes.as_slice()[r * self.stride..r * self.stride + self.cols]) {
            *o = (*c as i32 - 128) as f32 * s;
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn stride(&self) -> usize {
        self.stride
    }
    #[inline]
    pub fn scale(&self, r: usize) -> f32 {
        self.scales[r]
    }
    /// Row `r`'s codes, `stride` long.
    #[inline]
    pub fn row_codes(&self, r: usize) -> &[u8] {
        &self.codes.as_slice()[r * self.stride..(r + 1) * self.stride]
    }
    /// Bytes the kernels read to use every weight once: each row's codes at its stride (the
    /// kernels read whole 256-wide blocks, padding included: 4% more than the real columns for
    /// the 3B preset's 3200) and its scale.
    pub fn byte_len(&self) -> usize {
        self.rows * (self.stride + 4)
    }
}

/// Round-half-to-even of |v| < 2^22 with only adds (vectorizes on baseline SSE2), as
/// bitnet.cpp's `nearest_int` and PyTorch's `round` do. `f32::round_ties_even` gives the same
/// result but compiles to a libm call per value on baseline x86-64.
#[inline(always)]
pub(crate) fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 × 2^23
    (v + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_round_trip_within_half_a_step() {
        let v: Vec<f32> = (0..3 * 300).map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0).collect();
        let m = Int8Rows::quantize(3, 300, &v).unwrap();
        let mut row = vec![0f32; 300];
        for r in 0..3 {
            m.dequantize_row(r, &mut row);
            for c in 0..300 {
                assert!((row[c] - v[r * 300 + c]).abs() <= m.scale(r) * 0.5 + 1e-6);
                assert_eq!(row[c], m.get(r, c) as f32 * m.scale(r));
            }
        }
        assert!(m.row_codes(0)[300..].iter().all(|c| *c == 128));
        // The kernels read the padded rows (512 codes) and a 4-byte scale per row.
        assert_eq!(m.byte_len(), 3 * (512 + 4));
        assert!(Int8Rows::quantize(2, 3, &[0.0; 5]).is_err());
    }
}
