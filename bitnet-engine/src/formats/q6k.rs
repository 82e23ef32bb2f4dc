//! `Q6kRows`: a `[rows, cols]` matrix of llama.cpp Q6_K blocks, kept as the file stores them —
//! the type llama.cpp's quantizer gives BitNet embeddings (and so the tied LM head). Read as
//! stored, the LM head of 2B4T is 270 MB a token instead of the 329 MB of our int8 rows, and
//! its logits are the file's weights, not a requantization of them.
//!
//! A block (ggml `block_q6_K`, 210 bytes) holds 256 weights `d × scales[j] × (q − 32)`:
//! `ql[128]` (low 4 bits of q), `qh[64]` (high 2 bits), `scales[16]` (i8, one per 16 weights),
//! `d` (f16). Of each 128-weight half h, weight 32n + l (n < 4, l < 32) has its low bits in
//! `ql[64h + 32(n & 1) + l]` (the high nibble when n ≥ 2) and its high bits at shift 2n of
//! `qh[32h + l]`.

use std::sync::OnceLock;

use half::f16;

use crate::aligned::AlignedBytes;
use crate::error::{Error, Result};
use crate::formats::{Q6kRowGroups, QK_K};

/// Bytes of one Q6_K block of 256 weights.
pub const Q6K_BLOCK_BYTES: usize = 210;

/// Q6_K rows, block after block, each row `cols / 256` blocks; and, once asked for, the same
/// weights in 16-row groups for the AVX-512 kernel on batches.
#[derive(Debug, Clone)]
pub struct Q6kRows {
    rows: usize,
    cols: usize,
    data: AlignedBytes,
    groups: OnceLock<Q6kRowGroups>,
}

/// The weights, whether or not the groups were made.
impl PartialEq for Q6kRows {
    fn eq(&self, other: &Self) -> bool {
        (self.rows, self.cols, &self.data) == (other.rows, other.cols, &other.data)
    }
}

impl Q6kRows {
    /// `rows × cols` weights from `bytes`, the file's blocks row after row. Errors if `cols` is
    /// not a multiple of 256, the length is wrong, or a block's `d` is not finite (names the
    /// row and block).
    pub fn from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        if rows == 0 || cols == 0 || !cols.is_multiple_of(QK_K) {
            return Err(Error::Shape(format!("Q6_K needs whole 256-weight blocks per row, got {rows}×{cols}")));
        }
        let need = rows * cols / QK_K * Q6K_BLOCK_BYTES;
        if bytes.len() != need {
            return Err(Error::Shape(format!("Q6_K {rows}×{cols} needs {need} bytes, got {}", bytes.len())));
        }
        let mut data = AlignedBytes::zeroed(need);
        data.as_mut_slice().copy_from_slice(bytes);
        let m = Self { rows, cols, data, groups: OnceLock::new() };
        let per_row = m.blocks_per_row();
        for (i, b) in m.data.as_slice().chunks_exact(Q6K_BLOCK_BYTES).enumerate() {
            if !block_d(b).is_finite() {
                return Err(Error::Value(format!(
                    "Q6_K row {}, block {} has a non-finite scale d = {}",
                    i / per_row,
                    i % per_row,
                    block_d(b)
                )));
            }
        }
        Ok(m)
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

    /// Row `r`'s blocks, `blocks_per_row × 210` bytes.
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.blocks_per_row() * Q6K_BLOCK_BYTES;
        &self.data.as_slice()[r * n..(r + 1) * n]
    }

    /// Every block, row after row (the file's bytes).
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Weight `(r, c)`'s 6-bit code q (the weight is `d × scale × (q − 32)`).
    pub fn code(&self, r: usize, c: usize) -> u8 {
        block_code(&self.row(r)[c / QK_K * Q6K_BLOCK_BYTES..][..Q6K_BLOCK_BYTES], c % QK_K)
    }

    /// The i8 scale of the 16 weights around column `c` of row `r`.
    pub fn sub_scale(&self, r: usize, c: usize) -> i8 {
        self.row(r)[c / QK_K * Q6K_BLOCK_BYTES + 192 + (c % QK_K) / 16] as i8
    }

    /// The f16 scale `d` of block `blk` of row `r`.
    pub fn block_scale(&self, r: usize, blk: usize) -> f16 {
        block_d(&self.row(r)[blk * Q6K_BLOCK_BYTES..][..Q6K_BLOCK_BYTES])
    }

    /// Row `r` as f32 (`cols` values): the embedding lookup. Each value is
    /// `d × scale × (q − 32)` in f32, as ggml and the `gguf` package dequantize.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        for (b, o) in self.row(r).chunks_exact(Q6K_BLOCK_BYTES).zip(out.chunks_mut(QK_K)) {
            decode_q6k_block(b, o);
        }
    }

    /// Bytes read to use every weight once.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// The weights in 16-row groups ([`Q6kRowGroups`]), made on the first call (on every core;
    /// it costs time once and the head's size again in memory): what the AVX-512 kernel reads
    /// for two or more tokens, faster than the file layout's kernel at 8 tokens. One token
    /// keeps the file's layout, which its AVX2 kernel streams faster on Zen 4
    /// (docs/perf-notes.md). A model builds them when a batched state needs them.
    pub fn prepare_groups(&self) -> &Q6kRowGroups {
        self.groups.get_or_init(|| Q6kRowGroups::from_rows(self))
    }

    /// The 16-row groups, if [`Self::prepare_groups`] made them.
    pub fn groups(&self) -> Option<&Q6kRowGroups> {
        self.groups.get()
    }

    /// Random valid blocks (codes, sub-block scales over the whole i8 range, `d` up to
    /// `d_max`), for tests and benchmarks.
    pub fn random(rows: usize, cols: usize, d_max: f32, seed: u64) -> Result<Self> {
        let mut g = crate::rng::SplitMix64::new(seed);
        let n = rows * cols.div_ceil(QK_K);
        let mut bytes = vec![0u8; n * Q6K_BLOCK_BYTES];
        for b in bytes.chunks_exact_mut(Q6K_BLOCK_BYTES) {
            for v in b[..208].iter_mut() {
                *v = g.next_u64() as u8;
            }
            let d = f16::from_f32(d_max * (g.next_u64() % 1000 + 1) as f32 / 1000.0);
            b[208..].copy_from_slice(&d.to_bits().to_le_bytes());
        }
        Self::from_bytes(rows, cols, &bytes)
    }
}

/// The 6-bit code of weight `w` (< 256) of the Q6_K block `b` (see the module doc).
#[inline]
pub(crate) fn block_code(b: &[u8], w: usize) -> u8 {
    let (h, n, l) = (w / 128, (w % 128) / 32, w % 32);
    let low = b[64 * h + 32 * (n & 1) + l] >> (4 * (n / 2)) & 0xF;
    let high = b[128 + 32 * h + l] >> (2 * n) & 3;
    low | high << 4
}

fn block_d(b: &[u8]) -> f16 {
    f16::from_bits(u16::from_le_bytes([b[208], b[209]]))
}

/// One Q6_K block (ggml `block_q6_K`: `ql[128]`, `qh[64]`, `scales[16]` i8, `d` f16): 6-bit
/// values q − 32 (low 4 bits in ql, high 2 in qh) times d × the 16-value sub-block's scale.
pub fn decode_q6k_block(b: &[u8], out: &mut [f32]) {
    let (ql, rest) = b.split_at(128);
    let (qh, rest) = rest.split_at(64);
    let (sc, d) = rest.split_at(16);
    let d = f16::from_le_bytes([d[0], d[1]]).to_f32();
    for half in 0..2 {
        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
        let y = &mut out[128 * half..128 * (half + 1)];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_scales_are_the_dequantized_values() {
        let m = Q6kRows::random(3, 512, 0.01, 7).unwrap();
        let mut row = vec![0f32; 512];
        for r in 0..3 {
            m.dequantize_row(r, &mut row);
            for (c, v) in row.iter().enumerate() {
                let d = m.block_scale(r, c / 256).to_f32();
                let want = d * m.sub_scale(r, c) as f32 * (m.code(r, c) as i32 - 32) as f32;
                assert_eq!(v.to_bits(), want.to_bits(), "row {r} column {c}");
            }
        }
    }

    #[test]
    fn bad_shapes_and_scales_are_named() {
        assert!(Q6kRows::from_bytes(2, 300, &[0; 420]).unwrap_err().to_string().contains("256-weight blocks"));
        assert!(Q6kRows::from_bytes(2, 256, &[0; 419]).unwrap_err().to_string().contains("needs 420 bytes"));
        let mut bytes = vec![0u8; 420];
        bytes[210 + 208..210 + 210].copy_from_slice(&f16::NAN.to_bits().to_le_bytes());
        let e = Q6kRows::from_bytes(2, 256, &bytes).unwrap_err().to_string();
        assert!(e.contains("row 1, block 0") && e.contains("non-finite"), "{e}");
    }
}
