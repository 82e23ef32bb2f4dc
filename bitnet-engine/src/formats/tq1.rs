//! `TQ1_0`: llama.cpp's base-3 ternary block layout, byte for byte (ggml `block_tq1_0`).
//!
//! 256 weights in 54 bytes (1.6875 bits per weight): `qs[48]`, `qh[4]`, f16 `d`. A byte holds up
//! to five base-3 digits `q = t + 1`, most significant first, stored as `ceil(v * 256 / 243)` so
//! that digit `n` comes back as `((byte * 3^n mod 256) * 3) >> 8` with no division.
//!
//! | bytes       | digit n of byte m holds weight |
//! |-------------|--------------------------------|
//! | `qs[0..32]`  | `m + 32 n`, n = 0..5          |
//! | `qs[32..48]` | `160 + m + 16 n`, n = 0..5    |
//! | `qh[0..4]`   | `240 + m + 4 n`, n = 0..4     |

use half::f16;

use crate::aligned::PageVec;
use crate::error::{Error, Result};
use crate::formats::tq1_lut::Tq1LutMatrix;
use crate::formats::tq1_perm::Tq1PermMatrix;
use crate::formats::tq2::{block_scale, check_qk, uniform_rows, QK_K};
use crate::rng::SplitMix64;
use crate::ternary::TernaryMatrix;

/// ggml's `block_tq1_0`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockTq1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);

// SAFETY: byte arrays and an f16 (a u16): every bit pattern is a valid block, no padding.
unsafe impl crate::aligned::Pod for BlockTq1_0 {}

/// Powers of three, the digit multipliers of the decode trick.
pub const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Where weight `i` (0..256) of a block lives: byte index into the 52 code bytes (`qs` then
/// `qh`) and base-3 digit position n (0 = most significant).
#[inline]
pub fn tq1_position(i: usize) -> (usize, usize) {
    if i < 160 {
        (i % 32, i / 32)
    } else if i < 240 {
        (32 + (i - 160) % 16, (i - 160) / 16)
    } else {
        (48 + (i - 240) % 4, (i - 240) / 4)
    }
}

/// Digit `n` of a packed byte, as llama.cpp decodes it.
#[inline]
pub const fn tq1_digit(byte: u8, n: usize) -> u8 {
    ((byte.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as u8
}

/// A ternary matrix in TQ1_0 blocks, `[rows, cols / 256]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tq1Matrix {
    rows: usize,
    cols: usize,
    /// In huge pages when large (see `aligned`): decode streams it once per token.
    blocks: PageVec<BlockTq1_0>,
    /// `[rows]`: whether every block of the row has the same scale bits (see `Tq2Matrix`).
    uniform: Vec<bool>,
    /// `[rows]`: the sum of the row's base-3 digits (weight + 1 summed over the row), for kernels
    /// that multiply digits by activations offset to unsigned bytes and take the offset back.
    digit_sums: Vec<i32>,
    /// The table-lookup repack, made on first use (see [`Tq1Matrix::lut`]).
    lut: super::Cache<Option<Tq1LutMatrix>>,
    /// The 32-entry table-lookup repack, made on first use (see [`Tq1Matrix::perm`]).
    perm: super::Cache<Option<Tq1PermMatrix>>,
}

impl Tq1Matrix {
    /// Packs as llama.cpp's `quantize_row_tq1_0_ref` would pack `values × scale`.
    pub fn pack(m: &TernaryMatrix) -> Result<Self> {
        check_qk("TQ1_0", m.rows, m.cols)?;
        let mut blocks = Vec::with_capacity(m.rows * m.cols / QK_K);
        for r in 0..m.rows {
            for src in m.row(r).chunks(QK_K) {
                blocks.push(pack_block(src, block_scale(src, m.scale)));
            }
        }
        Self::from_blocks(m.rows, m.cols, blocks)
    }

    /// Random weights straight into blocks, every block with scale `scale`.
    pub fn random(rows: usize, cols: usize, scale: f32, seed: u64) -> Result<Self> {
        check_qk("TQ1_0", rows, cols)?;
        let mut blocks = Vec::with_capacity(rows * cols / QK_K);
        let mut src = [0i8; QK_K];
        for r in 0..rows {
            let mut g = SplitMix64::stream(seed, r as u64);
            for _ in 0..cols / QK_K {
                g.fill_ternary(&mut src);
                blocks.push(pack_block(&src, f16::from_f32(scale)));
            }
        }
        Self::from_blocks(rows, cols, blocks)
    }

    pub fn from_blocks(rows: usize, cols: usize, blocks: Vec<BlockTq1_0>) -> Result<Self> {
        Self::from_page_vec(rows, cols, PageVec::from_slice(&blocks))
    }

    fn from_page_vec(rows: usize, cols: usize, blocks: PageVec<BlockTq1_0>) -> Result<Self> {
        check_qk("TQ1_0", rows, cols)?;
        if blocks.len() != rows * cols / QK_K {
            return Err(Error::Shape(format!(
                "TQ1_0 {rows}×{cols} needs {} blocks, got {}",
                rows * cols / QK_K,
                blocks.len()
            )));
        }
        let uniform = uniform_rows(&blocks, cols / QK_K, |b| b.d);
        let digit_sums = row_digit_sums(&blocks, cols / QK_K);
        Ok(Self { rows, cols, blocks, uniform, digit_sums, lut: Default::default(), perm: Default::default() })
    }

    /// Parses GGUF bytes (54 per block, row-major).
    pub fn from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        check_qk("TQ1_0", rows, cols)?;
        let need = rows * cols / QK_K * 54;
        if bytes.len() != need {
            return Err(Error::Shape(format!("TQ1_0 {rows}×{cols} needs {need} bytes, got {}", bytes.len())));
        }
        // Copied straight into place, as TQ2_0's (see `Tq2Matrix::from_bytes`).
        if cfg!(target_endian = "little") {
            let blocks = PageVec::from_raw_bytes(bytes).expect("a whole number of 54-byte blocks");
            return Self::from_page_vec(rows, cols, blocks);
        }
        let blocks = bytes
            .chunks_exact(54)
            .map(|c| BlockTq1_0 {
                qs: c[..48].try_into().expect("48-byte chunk"),
                qh: c[48..52].try_into().expect("4-byte chunk"),
                d: f16::from_bits(u16::from_le_bytes([c[52], c[53]])),
            })
            .collect();
        Self::from_blocks(rows, cols, blocks)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.byte_len());
        for b in self.blocks.iter() {
            out.extend_from_slice(&b.qs);
            out.extend_from_slice(&b.qh);
            out.extend_from_slice(&b.d.to_bits().to_le_bytes());
        }
        out
    }

    pub fn unpack(&self) -> TernaryMatrix {
        let scale = self.blocks.iter().map(|b| b.d.to_f32().abs()).fold(0.0, f32::max);
        super::unpack_by(self.rows, self.cols, scale, |r, k| self.get(r, k))
    }

    /// Ternary value at (row, col), decoded the plain way (the oracle's accessor). Every byte
    /// value decodes to digits in 0..=2 (⌊255 × 3 / 256⌋ = 2), so any bytes are a valid matrix,
    /// even ones the quantizer would never write.
    #[inline]
    pub fn get(&self, row: usize, col: usize) -> i8 {
        let b = &self.blocks[row * self.blocks_per_row() + col / QK_K];
        let (byte, n) = tq1_position(col % QK_K);
        let packed = if byte < 48 { b.qs[byte] } else { b.qh[byte - 48] };
        tq1_digit(packed, n) as i8 - 1
    }

    /// Row `r`'s ternary values into `dst` (`cols` long), block by block through the byte
    /// positions of [`tq1_position`]: the plain decode, without a position lookup per weight.
    pub fn decode_row(&self, r: usize, dst: &mut [i8]) {
        assert_eq!(dst.len(), self.cols, "decode_row: destination must hold one row");
        for (b, out) in self.row(r).iter().zip(dst.chunks_exact_mut(QK_K)) {
            for (m, &q) in b.qs[..32].iter().enumerate() {
                for n in 0..5 {
                    out[m + 32 * n] = tq1_digit(q, n) as i8 - 1;
                }
            }
            for (m, &q) in b.qs[32..].iter().enumerate() {
                for n in 0..5 {
                    out[160 + m + 16 * n] = tq1_digit(q, n) as i8 - 1;
                }
            }
            for (m, &q) in b.qh.iter().enumerate() {
                for n in 0..4 {
                    out[240 + m + 4 * n] = tq1_digit(q, n) as i8 - 1;
                }
            }
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK_K
    }
    /// Whether every block of row `r` has the same scale (kernels then sum the row in integers).
    #[inline]
    pub fn row_has_uniform_scale(&self, r: usize) -> bool {
        self.uniform[r]
    }
    /// Σ of row `r`'s digits (each weight + 1), whatever the blocks' scales.
    #[inline]
    pub fn row_digit_sum(&self, r: usize) -> i32 {
        self.digit_sums[r]
    }
    pub fn row(&self, r: usize) -> &[BlockTq1_0] {
        let n = self.blocks_per_row();
        &self.blocks[r * n..(r + 1) * n]
    }
    pub fn blocks(&self) -> &[BlockTq1_0] {
        &self.blocks
    }
    pub fn byte_len(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<BlockTq1_0>()
    }

    /// The table-lookup repack of this matrix (made on the first call, which may take a while
    /// for a large matrix; [`crate::model::Weights::prepare_repacks`] makes them all up front), or
    /// `None` when a row's blocks have different scales.
    pub fn lut(&self) -> Option<&Tq1LutMatrix> {
        self.lut.0.get_or_init(|| Tq1LutMatrix::from_tq1(self)).as_ref()
    }

    /// Whether the repack has been made (or found impossible) already.
    pub fn lut_made(&self) -> bool {
        self.lut.0.get().is_some()
    }

    /// The 32-entry table-lookup repack of this matrix (for the `perm` form; made as
    /// [`Tq1Matrix::lut`] is), or `None` when a row's blocks have different scales.
    pub fn perm(&self) -> Option<&Tq1PermMatrix> {
        self.perm.0.get_or_init(|| Tq1PermMatrix::from_tq1(self)).as_ref()
    }

    /// Whether the `perm` repack has been made (or found impossible) already.
    pub fn perm_made(&self) -> bool {
        self.perm.0.get().is_some()
    }
}

/// Each row's sum of digits, through tables of a byte's digit sum (five digits for `qs`, four
/// for `qh`, whose fifth is no weight): two lookups per byte keep a 2B4T-sized load quick.
fn row_digit_sums(blocks: &[BlockTq1_0], per_row: usize) -> Vec<i32> {
    let table =
        |digits: usize| -> [u8; 256] { std::array::from_fn(|b| (0..digits).map(|n| tq1_digit(b as u8, n)).sum()) };
    let (qs_sums, qh_sums) = (table(5), table(4));
    blocks
        .chunks(per_row.max(1))
        .map(|row| {
            row.iter()
                .map(|b| {
                    let qs: i32 = b.qs.iter().map(|&q| qs_sums[q as usize] as i32).sum();
                    qs + b.qh.iter().map(|&q| qh_sums[q as usize] as i32).sum::<i32>()
                })
                .sum()
        })
        .collect()
}

fn pack_block(src: &[i8], d: f16) -> BlockTq1_0 {
    let mut v = [0u16; 52];
    for (i, &w) in src.iter().enumerate() {
        let (byte, n) = tq1_position(i);
        // Digit n of 5 (most significant first); qh bytes use only 4 digits, the 5th stays 0.
        v[byte] += (w + 1) as u16 * 3u16.pow(4 - n as u32);
    }
    // ceil(v × 256 / 243), as llama.cpp writes it: (v * 256 + 242) / 243.
    let enc = |v: u16| (v * 256).div_ceil(243) as u8;
    let mut qs = [0u8; 48];
    let mut qh = [0u8; 4];
    for (i, q) in qs.iter_mut().enumerate() {
        *q = enc(v[i]);
    }
    for (i, q) in qh.iter_mut().enumerate() {
        *q = enc(v[48 + i]);
    }
    BlockTq1_0 { qs, qh, d }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_position_is_used_once() {
        let mut seen = [[false; 5]; 52];
        for i in 0..256 {
            let (b, n) = tq1_position(i);
            assert!(!seen[b][n]);
            seen[b][n] = true;
        }
    }

    #[test]
    fn digit_decode_inverts_encode_for_all_values() {
        for v in 0u16..243 {
            let byte = (v * 256).div_ceil(243) as u8;
            let digits: Vec<u8> = (0..5).map(|n| tq1_digit(byte, n)).collect();
            let back = digits.iter().fold(0u16, |acc, d| acc * 3 + *d as u16);
            assert_eq!(back, v, "v {v} byte {byte} digits {digits:?}");
        }
    }

    #[test]
    fn decode_row_equals_get_for_every_weight_and_any_bytes() {
        let m = Tq1Matrix::random(3, 512, 0.5, 9).unwrap();
        // Arbitrary bytes too (a quantizer never writes some of them).
        let bytes: Vec<u8> = (0..3 * 2 * 54).map(|i| (i * 97 % 256) as u8).collect();
        let any = Tq1Matrix::from_bytes(3, 512, &bytes).unwrap();
        for m in [m, any] {
            let mut row = vec![0i8; 512];
            for r in 0..3 {
                m.decode_row(r, &mut row);
                assert!(row.iter().enumerate().all(|(k, &v)| v == m.get(r, k)), "row {r}");
            }
        }
    }

    #[test]
    fn round_trip() {
        let m = TernaryMatrix::random(3, 512, 0.5, 11);
        let p = Tq1Matrix::pack(&m).unwrap();
        assert_eq!(p.byte_len(), 3 * 2 * 54);
        assert_eq!(p.unpack(), m);
        assert_eq!(Tq1Matrix::from_bytes(3, 512, &p.to_bytes()).unwrap(), p);
    }

    #[test]
    fn row_digit_sums_count_every_weight_plus_one() {
        // Arbitrary bytes too: every byte decodes, and qh's fifth digit is no weight.
        let mut g = SplitMix64::stream(5, 0);
        let mut bytes = vec![0u8; 4 * 3 * 54];
        for b in bytes.iter_mut() {
            *b = g.next_u64() as u8;
        }
        for block in bytes.chunks_exact_mut(54) {
            block[52..].copy_from_slice(&f16::from_f32(0.25).to_bits().to_le_bytes());
        }
        let random = Tq1Matrix::from_bytes(4, 768, &bytes).unwrap();
        let packed = Tq1Matrix::pack(&TernaryMatrix::random(3, 512, 0.5, 11)).unwrap();
        for m in [random, packed] {
            for r in 0..m.rows() {
                let want: i32 = (0..m.cols()).map(|k| m.get(r, k) as i32 + 1).sum();
                assert_eq!(m.row_digit_sum(r), want, "row {r}");
            }
        }
    }
}
