//! `Q6kRowGroups`: a Q6_K LM head with 16 rows interleaved, for the AVX-512 VNNI kernel on
//! batches ([`crate::formats::Q6kRows::prepare_groups`]).
//!
//! The file's layout keeps a row's 16-weight sub-blocks side by side, so a kernel that gives
//! each i32 lane a sub-block must rearrange every block's codes in registers and reduce 16
//! lanes to one sum per row at the end (about 45% of the int8 peak at 8 tokens). Here lane l
//! of every vector is row l of a 16-row group: `vpdpbusd` adds 4 columns of 16 rows per token
//! with the token's 4 activations broadcast, a sub-block's scales are one `vpmulld` of 16
//! rows, and no reduction is left (about 65%). The bytes are the file's, rearranged; the
//! values, and so the logits, are the same.
//!
//! Group g (rows 16g..16g + 16; past the last row, rows of zero weights) is `3360·blocks` bytes:
//! for each 256-column block `blk`, 3328 bytes at `3328·blk`:
//! - 16 sub-blocks j of 192 bytes at `192·j`: three 64-byte vectors `A`, `B`, `H`. Byte
//!   `4l + i` of each holds row l's columns `c_k = 256·blk + 16j + 4k + i` (k < 4): `A` the
//!   low 4 bits of `c_0` (bits 0–3) and `c_1` (bits 4–7), `B` those of `c_2` and `c_3`, `H`
//!   the high 2 bits of `c_k` at bits `2k`.
//! - 256 bytes of sub-block scales at 3072: `16j + l` is row l's i8 scale of sub-block j.
//!
//! then the blocks' `d`, 32 bytes a block at `3328·blocks + 32·blk`: `2l` is row l's f16.
//! A group is the file's bytes of its 16 rows; the last group's rows past the matrix are zero
//! weights, which the kernel reads but writes nowhere.

use half::f16;

use crate::aligned::AlignedBytes;
use crate::formats::q6k::block_code;
use crate::formats::{Q6kRows, Q6K_BLOCK_BYTES, QK_K};

/// Rows of a group: the lanes of an i32 vector of 512 bits.
pub const Q6K_GROUP_ROWS: usize = 16;
/// Bytes of a block's codes and sub-block scales in a group (16 rows × 208).
const BLOCK_BYTES: usize = 16 * 192 + 256;

/// A `[rows, cols]` Q6_K matrix in groups of 16 interleaved rows (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Q6kRowGroups {
    rows: usize,
    cols: usize,
    data: AlignedBytes,
}

/// Bytes per group of `cols`-wide rows: 16 rows' bytes in the file, `3360 × blocks` (whole
/// cache lines when the rows have an even number of blocks, as every preset's do).
fn group_stride(cols: usize) -> usize {
    cols / QK_K * (BLOCK_BYTES + 32)
}

impl Q6kRowGroups {
    /// The same weights as `m`, regrouped on every core (2B4T's head is 270 MB).
    pub fn from_rows(m: &Q6kRows) -> Self {
        let (rows, cols, bytes) = (m.rows(), m.cols(), m.as_bytes());
        let row_bytes = cols / QK_K * Q6K_BLOCK_BYTES;
        let stride = group_stride(cols);
        let groups = rows.div_ceil(Q6K_GROUP_ROWS);
        let mut data = AlignedBytes::zeroed(groups * stride);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(groups);
        let per = groups.div_ceil(threads) * stride;
        std::thread::scope(|s| {
            for (t, part) in data.as_mut_slice().chunks_mut(per).enumerate() {
                s.spawn(move || {
                    for (i, dst) in part.chunks_exact_mut(stride).enumerate() {
                        let g = t * (per / stride) + i;
                        for l in 0..Q6K_GROUP_ROWS.min(rows - g * Q6K_GROUP_ROWS) {
                            let r = g * Q6K_GROUP_ROWS + l;
                            regroup_row(&bytes[r * row_bytes..(r + 1) * row_bytes], l, dst);
                        }
                    }
                });
            }
        });
        Self { rows, cols, data }
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
    /// Groups of [`Q6K_GROUP_ROWS`] rows (the last one padded with zero rows).
    pub fn groups(&self) -> usize {
        self.data.len() / group_stride(self.cols)
    }

    /// Group `g`'s bytes (see the module doc).
    #[inline]
    pub fn group(&self, g: usize) -> &[u8] {
        let stride = group_stride(self.cols);
        &self.data.as_slice()[g * stride..(g + 1) * stride]
    }

    /// Weight `(r, c)`'s 6-bit code q (the weight is `d × scale × (q − 32)`).
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let blk = c / QK_K;
        group_code(&self.group(r / Q6K_GROUP_ROWS)[blk * BLOCK_BYTES..], r % Q6K_GROUP_ROWS, c % QK_K)
    }

    /// The i8 scale of the 16 weights around column `c` of row `r`.
    pub fn sub_scale(&self, r: usize, c: usize) -> i8 {
        let (blk, j) = (c / QK_K, (c % QK_K) / 16);
        self.group(r / Q6K_GROUP_ROWS)[blk * BLOCK_BYTES + 3072 + 16 * j + r % Q6K_GROUP_ROWS] as i8
    }

    /// The f16 scale `d` of block `blk` of row `r`.
    pub fn block_scale(&self, r: usize, blk: usize) -> f16 {
        let p = self.blocks_per_row() * BLOCK_BYTES + 32 * blk + 2 * (r % Q6K_GROUP_ROWS);
        let g = self.group(r / Q6K_GROUP_ROWS);
        f16::from_bits(u16::from_le_bytes([g[p], g[p + 1]]))
    }

    /// Bytes read to use every weight once: every group, padding rows included.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// [`Self::byte_len`] of a `rows × cols` matrix, without making it.
    pub fn byte_len_for(rows: usize, cols: usize) -> usize {
        rows.div_ceil(Q6K_GROUP_ROWS) * group_stride(cols)
    }
}

/// The code of weight `w` (< 256) of lane `l` in a group's block `b` (its bytes from the block's
/// start): sub-block j = w / 16, columns 4k + i of it.
#[inline]
fn group_code(b: &[u8], l: usize, w: usize) -> u8 {
    let (j, k, i) = (w / 16, (w % 16) / 4, w % 4);
    let v = &b[192 * j..192 * (j + 1)];
    (v[64 * (k / 2) + 4 * l + i] >> (4 * (k % 2)) & 0xF) | (v[128 + 4 * l + i] >> (2 * k) & 3) << 4
}

/// Writes a row (`row`: its blocks as the file stores them) as lane `l` of its group's bytes
/// `dst` (zeroed before).
fn regroup_row(row: &[u8], l: usize, dst: &mut [u8]) {
    let nb = row.len() / Q6K_BLOCK_BYTES;
    let mut q = [0u8; QK_K];
    for (blk, src) in row.chunks_exact(Q6K_BLOCK_BYTES).enumerate() {
        for (w, q) in q.iter_mut().enumerate() {
            *q = block_code(src, w);
        }
        let b = &mut dst[blk * BLOCK_BYTES..(blk + 1) * BLOCK_BYTES];
        for j in 0..16 {
            let v = &mut b[192 * j..192 * (j + 1)];
            for k in 0..4 {
                for i in 0..4 {
                    let c = q[16 * j + 4 * k + i];
                    v[64 * (k / 2) + 4 * l + i] |= (c & 0xF) << (4 * (k % 2));
                    v[128 + 4 * l + i] |= (c >> 4) << (2 * k);
                }
            }
            b[3072 + 16 * j + l] = src[192 + j];
        }
        let d = nb * BLOCK_BYTES + 32 * blk + 2 * l;
        dst[d..d + 2].copy_from_slice(&src[208..210]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regrouping_keeps_every_code_scale_and_d() {
        // 37 rows: two whole groups and a padded one; 3 blocks: an odd count, so every other
        // group starts half a cache line in.
        let m = Q6kRows::random(37, 768, 0.01, 3).unwrap();
        let g = Q6kRowGroups::from_rows(&m);
        assert_eq!((g.rows(), g.cols(), g.groups()), (37, 768, 3));
        assert_eq!(g.byte_len(), 3 * 16 * 3 * Q6K_BLOCK_BYTES);
        assert_eq!(Q6kRowGroups::byte_len_for(37, 768), g.byte_len());
        for r in 0..37 {
            for c in 0..768 {
                assert_eq!(g.code(r, c), m.code(r, c), "code ({r}, {c})");
                assert_eq!(g.sub_scale(r, c), m.sub_scale(r, c), "scale ({r}, {c})");
            }
            for blk in 0..3 {
                assert_eq!(g.block_scale(r, blk), m.block_scale(r, blk));
            }
        }
        // The padding rows (lanes 5..16 of the last group) are zero codes, scales and d's.
        let last = g.group(2);
        assert!(last[..16 * 192].chunks(64).all(|v| v[4 * 5..].iter().all(|&b| b == 0)));
        assert!(last[3072 + 5..3072 + 16].iter().all(|&b| b == 0));
        assert!(last[3 * 3328 + 10..3 * 3328 + 32].iter().all(|&b| b == 0));
    }
}
