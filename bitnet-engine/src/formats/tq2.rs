//! `TQ2_0`: llama.cpp's 2-bit ternary block layout, byte for byte (ggml `block_tq2_0`).
//!
//! 256 weights per block: `qs[64]` then an f16 scale `d`. Weight `i` is in byte
//! `32 * (i / 128) + i % 32` at shift `2 * ((i % 128) / 32)`, as code `t + 1`. Dequantized weight is
//! `d * (code - 1)`. llama.cpp requires K to be a multiple of 256 and so do we.

use half::f16;

use crate::aligned::PageVec;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::ternary::TernaryMatrix;

/// Weights per block (ggml's QK_K).
pub const QK_K: usize = 256;

/// Code bytes of a block: `qs` (its 256 weights at 2 bits).
pub const CODE_BYTES: usize = QK_K / 4;

/// ggml's `block_tq2_0`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockTq2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);

// SAFETY: byte arrays and an f16 (a u16): every bit pattern is a valid block, no padding.
unsafe impl crate::aligned::Pod for BlockTq2_0 {}

/// Byte and shift of weight `i` (0..256) of a TQ2_0 block.
#[inline]
pub fn tq2_position(i: usize) -> (usize, u32) {
    (32 * (i / 128) + i % 32, 2 * ((i % 128) / 32) as u32)
}

/// Checks that K fits the 256-weight block formats.
pub(crate) fn check_qk(format: &str, rows: usize, cols: usize) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(Error::Shape(format!("{format} matrix needs rows > 0 and cols > 0, got {rows}×{cols}")));
    }
    if !cols.is_multiple_of(QK_K) {
        return Err(Error::Shape(format!(
            "{format} needs K (columns) to be a multiple of {QK_K}, as in llama.cpp; got K = {cols}"
        )));
    }
    Ok(())
}

/// The f16 block scale llama.cpp's quantizer stores for a block of ternary × `scale`:
/// the block's absmax, so 0 for an all-zero block.
pub(crate) fn block_scale(block: &[i8], scale: f32) -> f16 {
    if block.iter().any(|v| *v != 0) {
        f16::from_f32(scale.abs())
    } else {
        f16::ZERO
    }
}

/// A ternary matrix in TQ2_0 blocks, `[rows, cols / 256]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tq2Matrix {
    rows: usize,
    cols: usize,
    /// In huge pages when large (see `aligned`): decode streams it once per token.
    blocks: PageVec<BlockTq2_0>,
    /// `[rows]`: whether every block of the row has the same scale bits. BitNet tensors have one
    /// scale, so quantizer output is uniform except for all-zero blocks; kernels then sum the
    /// whole row in integers and scale once, which is exactly equal to scaling per block.
    uniform: Vec<bool>,
    /// `[rows]`: each row's first block scale as f32 (exact), the row's one scale where it is
    /// uniform: a kernel finishing four rows at once loads their scales as one vector.
    row_scale: Vec<f32>,
    /// Whether every row is uniform: kernels then take whole row ranges without checking rows.
    all_uniform: bool,
    /// How many rows are uniform.
    uniform_count: usize,
    /// The blocks' code bytes alone, 64 per block (see [`Tq2Matrix::codes`]), made on first use.
    codes: super::Cache<Option<PageVec<u8>>>,
}

/// Per row: do all of its blocks carry bit-identical scales? (Shared with TQ1_0.)
pub(crate) fn uniform_rows<B>(blocks: &[B], per_row: usize, d: impl Fn(&B) -> f16) -> Vec<bool> {
    blocks.chunks(per_row.max(1)).map(|row| row.iter().all(|b| d(b).to_bits() == d(&row[0]).to_bits())).collect()
}

impl Tq2Matrix {
    /// Packs as llama.cpp's `quantize_row_tq2_0_ref` would pack `values × scale` (scale ≥ 0;
    /// a negative scale is stored as its absolute value, llama.cpp's absmax).
    pub fn pack(m: &TernaryMatrix) -> Result<Self> {
        check_qk("TQ2_0", m.rows, m.cols)?;
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
        check_qk("TQ2_0", rows, cols)?;
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

    /// Wraps blocks read from a file (e.g. a GGUF tensor).
    pub fn from_blocks(rows: usize, cols: usize, blocks: Vec<BlockTq2_0>) -> Result<Self> {
        Self::from_page_vec(rows, cols, PageVec::from_slice(&blocks))
    }

    fn from_page_vec(rows: usize, cols: usize, blocks: PageVec<BlockTq2_0>) -> Result<Self> {
        check_qk("TQ2_0", rows, cols)?;
        if blocks.len() != rows * cols / QK_K {
            return Err(Error::Shape(format!(
                "TQ2_0 {rows}×{cols} needs {} blocks, got {}",
                rows * cols / QK_K,
                blocks.len()
            )));
        }
        if let Some(i) = blocks.iter().position(holds_code_three) {
            return Err(Error::Value(format!("TQ2_0 block {i} holds code 3, which is not a ternary code")));
        }
        let uniform = uniform_rows(&blocks, cols / QK_K, |b| b.d);
        let row_scale = blocks.chunks(cols / QK_K).map(|row| row[0].d.to_f32()).collect();
        let uniform_count = uniform.iter().filter(|&&u| u).count();
        let all_uniform = uniform_count == rows;
        Ok(Self { rows, cols, blocks, uniform, row_scale, all_uniform, uniform_count, codes: Default::default() })
    }

    /// The ternary values and the largest block scale (exact when all non-zero blocks share it).
    pub fn unpack(&self) -> TernaryMatrix {
        let scale = self.blocks.iter().map(|b| b.d.to_f32().abs()).fold(0.0, f32::max);
        super::unpack_by(self.rows, self.cols, scale, |r, k| self.get(r, k))
    }

    /// Ternary value at (row, col), decoded the plain way (the oracle's accessor).
    #[inline]
    pub fn get(&self, row: usize, col: usize) -> i8 {
        let b = &self.blocks[row * self.blocks_per_row() + col / QK_K];
        let (byte, shift) = tq2_position(col % QK_K);
        ((b.qs[byte] >> shift) & 3) as i8 - 1
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
    /// Whether every block of row `r` has the same scale (see the field's docs).
    #[inline]
    pub fn row_has_uniform_scale(&self, r: usize) -> bool {
        self.uniform[r]
    }
    /// Whether every row has one scale for all its blocks (as BitNet tensors do).
    #[inline]
    pub fn all_rows_uniform(&self) -> bool {
        self.all_uniform
    }
    /// How many rows have one scale for all their blocks.
    #[inline]
    pub fn uniform_row_count(&self) -> usize {
        self.uniform_count
    }
    /// Each row's first block scale (the row's one scale where [`Self::row_has_uniform_scale`]).
    #[inline]
    pub fn row_scales(&self) -> &[f32] {
        &self.row_scale
    }
    pub fn row(&self, r: usize) -> &[BlockTq2_0] {
        let n = self.blocks_per_row();
        &self.blocks[r * n..(r + 1) * n]
    }
    pub fn blocks(&self) -> &[BlockTq2_0] {
        &self.blocks
    }
    /// Packed bytes (66 per block).
    pub fn byte_len(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<BlockTq2_0>()
    }

    /// Every block's 64 code bytes (`qs`) without its scale, row-major, block `b` of row `r` at
    /// byte `64 × (r × blocks_per_row + b)`; made on the first call, or up front by
    /// [`crate::model::Weights::prepare_repacks`]. Why: 66-byte blocks drift across cache lines (in
    /// all but two blocks of 32, one of a block's two 32-byte loads straddles two lines), and
    /// the stream is 3% longer.
    /// Rows of one scale ([`Self::row_has_uniform_scale`]) need nothing else; the AVX2 kernel
    /// reads these instead of the blocks (measured faster in TQ2_0 decode on Zen 3:
    /// docs/perf-notes.md). `None` when no row has one scale: nothing would read it.
    pub fn codes(&self) -> Option<&[u8]> {
        let made = self.codes.0.get_or_init(|| {
            (self.uniform_count > 0).then(|| {
                let mut codes = PageVec::<u8>::zeroed(self.blocks.len() * CODE_BYTES);
                for (dst, b) in codes.chunks_exact_mut(CODE_BYTES).zip(self.blocks.iter()) {
                    dst.copy_from_slice(&b.qs);
                }
                codes
            })
        });
        made.as_deref()
    }

    /// Whether [`Self::codes`] has been made (or found needless) already.
    pub fn codes_made(&self) -> bool {
        self.codes.0.get().is_some()
    }

    /// Bytes of [`Self::codes`] (made or not; 0 where it is `None`).
    pub fn codes_byte_len(&self) -> usize {
        if self.uniform_count > 0 {
            self.blocks.len() * CODE_BYTES
        } else {
            0
        }
    }
    /// The blocks' bytes exactly as they sit in a GGUF file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.byte_len());
        for b in self.blocks.iter() {
            out.extend_from_slice(&b.qs);
            out.extend_from_slice(&b.d.to_bits().to_le_bytes());
        }
        out
    }
    /// Parses GGUF bytes (66 per block, row-major).
    pub fn from_bytes(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self> {
        check_qk("TQ2_0", rows, cols)?;
        let need = rows * cols / QK_K * 66;
        if bytes.len() != need {
            return Err(Error::Shape(format!("TQ2_0 {rows}×{cols} needs {need} bytes, got {}", bytes.len())));
        }
        // The file's bytes are `BlockTq2_0`s as this (little-endian) host lays them out: copied
        // straight into place, a 2B4T load's largest cost when built as a Vec and copied again.
        if cfg!(target_endian = "little") {
            let blocks = PageVec::from_raw_bytes(bytes).expect("a whole number of 66-byte blocks");
            return Self::from_page_vec(rows, cols, blocks);
        }
        let blocks = bytes
            .chunks_exact(66)
            .map(|c| BlockTq2_0 {
                qs: c[..64].try_into().expect("64-byte chunk"),
                d: f16::from_bits(u16::from_le_bytes([c[64], c[65]])),
            })
            .collect();
        Self::from_blocks(rows, cols, blocks)
    }
}

/// Whether any of a block's 2-bit codes is 3 (both bits of a field set), eight bytes at a time.
fn holds_code_three(b: &BlockTq2_0) -> bool {
    b.qs.chunks_exact(8).any(|c| {
        let w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        w & (w >> 1) & 0x5555_5555_5555_5555 != 0
    })
}

fn pack_block(src: &[i8], d: f16) -> BlockTq2_0 {
    let mut qs = [0u8; QK_K / 4];
    for (i, &w) in src.iter().enumerate() {
        let (byte, shift) = tq2_position(i);
        qs[byte] |= ((w + 1) as u8) << shift;
    }
    BlockTq2_0 { qs, d }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_scale() {
        let m = TernaryMatrix::random(4, 768, 0.25, 5);
        let p = Tq2Matrix::pack(&m).unwrap();
        assert_eq!(p.byte_len(), 4 * 3 * 66);
        assert_eq!(p.unpack(), m);
        let again = Tq2Matrix::from_bytes(4, 768, &p.to_bytes()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn k_must_be_multiple_of_256() {
        let m = TernaryMatrix::random(1, 544, 1.0, 1);
        assert!(
            matches!(Tq2Matrix::pack(&m), Err(Error::Shape(s)) if s.contains("multiple of 256") && s.contains("544"))
        );
    }

    #[test]
    fn uniform_rows_are_detected() {
        let m = TernaryMatrix::random(2, 512, 0.25, 5);
        let p = Tq2Matrix::pack(&m).unwrap();
        assert!(p.row_has_uniform_scale(0) && p.row_has_uniform_scale(1) && p.all_rows_uniform());
        let mut blocks = p.blocks().to_vec();
        blocks[3].d = f16::from_f32(0.5);
        let q = Tq2Matrix::from_blocks(2, 512, blocks).unwrap();
        assert!(q.row_has_uniform_scale(0) && !q.row_has_uniform_scale(1) && !q.all_rows_uniform());
    }

    #[test]
    fn codes_are_each_blocks_qs_in_order() {
        let m = TernaryMatrix::random(3, 512, 0.25, 7);
        let p = Tq2Matrix::pack(&m).unwrap();
        assert!(!p.codes_made());
        let codes = p.codes().unwrap();
        assert!(p.codes_made());
        assert_eq!(codes.len(), p.codes_byte_len());
        assert_eq!(codes.len(), 3 * 2 * 64);
        for (i, b) in p.blocks().iter().enumerate() {
            assert_eq!(&codes[64 * i..64 * (i + 1)], &b.qs[..], "block {i}");
        }
        // A cache: equal to a matrix that has not made it.
        assert_eq!(p, Tq2Matrix::pack(&m).unwrap());
    }

    #[test]
    fn code_three_is_rejected() {
        let mut b = BlockTq2_0 { qs: [0x55; 64], d: f16::ONE };
        b.qs[10] = 0xFF;
        assert!(matches!(Tq2Matrix::from_blocks(1, 256, vec![b]), Err(Error::Value(s)) if s.contains("block 0")));
        // Every field of every byte, against the plain test, and from file bytes too.
        let plain = |b: &BlockTq2_0| b.qs.iter().any(|q| (0..4).any(|n| (q >> (2 * n)) & 3 == 3));
        for byte in 0..64 {
            for q in 0..=255u8 {
                let mut b = BlockTq2_0 { qs: [0x26; 64], d: f16::ONE };
                b.qs[byte] = q;
                assert_eq!(holds_code_three(&b), plain(&b), "byte {byte} = {q:#x}");
            }
        }
        let ok = BlockTq2_0 { qs: [0x26; 64], d: f16::ONE };
        let mut bytes = Vec::new();
        for blk in [ok, ok, ok, b] {
            bytes.extend_from_slice(&blk.qs);
            bytes.extend_from_slice(&blk.d.to_bits().to_le_bytes());
        }
        assert!(matches!(Tq2Matrix::from_bytes(2, 512, &bytes), Err(Error::Value(s)) if s.contains("block 3")));
    }
}
