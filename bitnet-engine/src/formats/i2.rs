//! `I2`: 2 bits per ternary weight with one f32 scale per tensor (bitnet.cpp's I2_S semantics),
//! in a layout chosen for 512-bit unpacking.
//!
//! Each row is packed on its own: `K / 256` full blocks of 64 bytes, then a tail of
//! `ceil((K % 256) / 4)` bytes. Inside a full block, weight `j` (0..256) is in byte `j % 64` at bit
//! shift `2 * (j / 64)`, so one 64-byte load and four shift-and-mask steps give four vectors of
//! codes that line up with four contiguous 64-byte chunks of activations. The tail uses the same
//! rule with lane width `L = ceil(t / 4)` instead of 64. Codes are `w + 1` ∈ {0, 1, 2}; tail
//! padding holds code 1 (weight 0).

use crate::aligned::AlignedBytes;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::ternary::TernaryMatrix;

/// Weights per full block.
pub const I2_BLOCK_WEIGHTS: usize = 256;
/// Bytes per full block.
pub const I2_BLOCK_BYTES: usize = 64;

/// One full I2 block: 256 weights, 2 bits each.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockI2 {
    /// Weight `j` at byte `j % 64`, shift `2 * (j / 64)`.
    pub qs: [u8; I2_BLOCK_BYTES],
}

const _: () = assert!(std::mem::size_of::<BlockI2>() == I2_BLOCK_BYTES);

/// Byte index and shift of weight `j` in a (sub-)block of lane width `lane` bytes.
#[inline]
pub fn i2_position(j: usize, lane: usize) -> (usize, u32) {
    (j % lane, 2 * (j / lane) as u32)
}

/// A ternary matrix in I2 layout.
#[derive(Debug, Clone, PartialEq)]
pub struct I2Matrix {
    rows: usize,
    cols: usize,
    /// Bytes per row: `64 * full_blocks + tail_bytes`.
    row_bytes: usize,
    /// `[rows, row_bytes]`.
    data: AlignedBytes,
    scale: f32,
}

impl I2Matrix {
    /// Bytes one row of `cols` weights takes.
    pub fn row_bytes_for(cols: usize) -> usize {
        (cols / I2_BLOCK_WEIGHTS) * I2_BLOCK_BYTES + (cols % I2_BLOCK_WEIGHTS).div_ceil(4)
    }

    fn empty(rows: usize, cols: usize, scale: f32) -> Result<Self> {
        if rows == 0 || cols == 0 {
            return Err(Error::Shape(format!("I2 matrix needs rows > 0 and cols > 0, got {rows}×{cols}")));
        }
        let row_bytes = Self::row_bytes_for(cols);
        // 0x55 = four codes of 1 = four zero weights, so padding is already right.
        Ok(Self { rows, cols, row_bytes, data: AlignedBytes::filled(rows * row_bytes, 0x55), scale })
    }

    pub fn pack(m: &TernaryMatrix) -> Result<Self> {
        let mut out = Self::empty(m.rows, m.cols, m.scale)?;
        let row_bytes = out.row_bytes;
        for (r, dst) in out.data.as_mut_slice().chunks_mut(row_bytes).enumerate() {
            pack_row(m.row(r), dst);
        }
        Ok(out)
    }

    /// Random packed weights (about a third zeros) written straight into the packed form, for
    /// benchmarks that need hundreds of MiB quickly.
    pub fn random(rows: usize, cols: usize, scale: f32, seed: u64) -> Result<Self> {
        let mut out = Self::empty(rows, cols, scale)?;
        let row_bytes = out.row_bytes;
        let mut row = vec![0i8; cols];
        for (r, dst) in out.data.as_mut_slice().chunks_mut(row_bytes).enumerate() {
            SplitMix64::stream(seed, r as u64).fill_ternary(&mut row);
            pack_row(&row, dst);
        }
        Ok(out)
    }

    pub fn unpack(&self) -> TernaryMatrix {
        super::unpack_by(self.rows, self.cols, self.scale, |r, k| self.get(r, k))
    }

    /// Weight at (row, col), decoded the plain way. The oracle kernel uses this.
    #[inline]
    pub fn get(&self, row: usize, col: usize) -> i8 {
        let full = (self.cols / I2_BLOCK_WEIGHTS) * I2_BLOCK_WEIGHTS;
        let row_data = self.row(row);
        let (byte, shift) = if col < full {
            let (b, s) = i2_position(col % I2_BLOCK_WEIGHTS, I2_BLOCK_BYTES);
            ((col / I2_BLOCK_WEIGHTS) * I2_BLOCK_BYTES + b, s)
        } else {
            let lane = (self.cols - full).div_ceil(4);
            let (b, s) = i2_position(col - full, lane);
            ((full / I2_BLOCK_WEIGHTS) * I2_BLOCK_BYTES + b, s)
        };
        ((row_data[byte] >> shift) & 3) as i8 - 1
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn scale(&self) -> f32 {
        self.scale
    }
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    /// Full 256-weight blocks per row.
    pub fn full_blocks(&self) -> usize {
        self.cols / I2_BLOCK_WEIGHTS
    }
    /// Weights in the tail of each row (0 when K is a multiple of 256).
    pub fn tail_weights(&self) -> usize {
        self.cols % I2_BLOCK_WEIGHTS
    }
    /// Packed bytes of one row.
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        &self.data.as_slice()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
    /// All packed bytes.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }
}

fn pack_row(row: &[i8], dst: &mut [u8]) {
    let full = row.len() / I2_BLOCK_WEIGHTS;
    for b in 0..full {
        let blk = &mut dst[b * I2_BLOCK_BYTES..(b + 1) * I2_BLOCK_BYTES];
        blk.fill(0);
        for (j, &w) in row[b * I2_BLOCK_WEIGHTS..(b + 1) * I2_BLOCK_WEIGHTS].iter().enumerate() {
            let (byte, shift) = i2_position(j, I2_BLOCK_BYTES);
            blk[byte] |= ((w + 1) as u8) << shift;
        }
    }
    let tail = &row[full * I2_BLOCK_WEIGHTS..];
    if !tail.is_empty() {
        let lane = tail.len().div_ceil(4);
        let dst = &mut dst[full * I2_BLOCK_BYTES..];
        dst.fill(0x55);
        for (j, &w) in tail.iter().enumerate() {
            let (byte, shift) = i2_position(j, lane);
            dst[byte] = (dst[byte] & !(3 << shift)) | (((w + 1) as u8) << shift);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_tail_length() {
        for cols in [1, 3, 4, 5, 63, 64, 255, 256, 257, 300, 511, 512, 544, 2560] {
            let m = TernaryMatrix::random(3, cols, 0.7, cols as u64);
            let p = I2Matrix::pack(&m).unwrap();
            assert_eq!(p.bytes().len(), 3 * I2Matrix::row_bytes_for(cols));
            assert_eq!(p.unpack(), m, "cols {cols}");
        }
    }

    #[test]
    fn layout_is_the_documented_one() {
        // Weight j of a block sits at byte j % 64, shift 2 * (j / 64).
        let mut v = vec![0i8; 256];
        v[0] = 1; // byte 0 bits 0-1 = code 2
        v[64] = -1; // byte 0 bits 2-3 = code 0
        v[255] = 1; // byte 63 bits 6-7 = code 2
        let p = I2Matrix::pack(&TernaryMatrix::new(1, 256, v, 1.0).unwrap()).unwrap();
        assert_eq!(p.bytes()[0], 0b01_01_00_10);
        assert_eq!(p.bytes()[63], 0b10_01_01_01);
        assert_eq!(p.bytes()[1], 0x55);
    }

    #[test]
    fn random_equals_pack_of_same_stream() {
        let p = I2Matrix::random(5, 300, 1.0, 9).unwrap();
        let again = I2Matrix::pack(&p.unpack()).unwrap();
        assert_eq!(p, again);
        assert!((p.unpack().zero_fraction() - 1.0 / 3.0).abs() < 0.05);
    }
}
