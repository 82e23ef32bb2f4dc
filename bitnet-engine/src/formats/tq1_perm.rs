//! TQ1_0 weights repacked for 32-entry table lookup with `vpermb` (the `tq1 … perm` kernel,
//! AVX-512 VBMI): the same 1.67 bits per weight as [`super::tq1_lut`], but each group of
//! three weights stored as one 5-bit code, pattern index and sign together, so that one
//! lookup gives the signed sum and a kernel spends no operation on the sign.
//!
//! The sums are those of `tq1_lut` (pattern p of a group of three activations, split into an
//! l and an h byte by [`lut_split`]); a group's table has 32 entries: entry c < 16 is pattern
//! c's sum (entries 14 and 15 are zero), entry 16 + c its complement (`−v − 33` in the two
//! bytes, as the `lut` kernels' negation; the kernel adds [`LUT_NEGATION_BIAS`] per negated
//! group back at the end). `vpermb` on a 32-byte vector reads the low five bits of each index
//! byte and ignores the other three, which is what the layout below uses.
//!
//! Why a second layout: with the 16-entry `vpshufb` tables of `tq1_lut`, a lookup costs a
//! shuffle, a sign operation and an add per 32 bytes, and a span's pattern indices must be cut
//! out of nibbles. Here a lookup is a `vpermb` and an add, five of a span's eight codes are
//! used as stored and three are put together from the spare bits in three or four operations.
//! A C model of both inner loops on Zen 4 predicted more lookups per second than the `vpshufb`
//! loop, and the kernel confirmed it (docs/perf-notes.md).
//!
//! ## Layout
//! Rows in tiles of [`PERM_TILE_ROWS`] (the last tile padded with zero rows); a row's K columns
//! in groups of 3 (columns past K are zero weights), groups in spans of [`PERM_SPAN_GROUPS`].
//! A tile stores its spans one after another, each as five 32-byte vectors V0–V4 whose byte j
//! belongs to row j. A group's code is `p | 16·negated`
//! ([`lut_code`](super::tq1_lut::lut_code)); in a span:
//! - bits 0–4 of Vk: the code of group k (k = 0..5);
//! - group 5: bits 0–2 in bits 5–7 of V0, bits 3–4 in bits 5–6 of V1;
//! - group 6: bits 0–2 in bits 5–7 of V2, bits 3–4 in bits 5–6 of V3;
//! - group 7: bits 0–2 in bits 5–7 of V4, bit 3 in bit 7 of V1, bit 4 in bit 7 of V3.
//!
//! So a span of a tile is 32 rows × 24 weights in 160 bytes, and a tile is one ascending stream.

use crate::formats::tq1_lut::{
    lookup_groups, lookup_matrix_bytes, lut_pattern, lut_split, LookupLayout, LookupRepack, LUT_H_WEIGHT,
    LUT_NEGATION_BIAS,
};

/// Rows per tile: one byte per row fills a 32-byte vector.
pub const PERM_TILE_ROWS: usize = 32;
/// Groups of three weights per span: five codes stored whole and three from spare bits.
pub const PERM_SPAN_GROUPS: usize = 8;
/// Bytes of one span of one tile: 5 vectors.
pub const PERM_SPAN_BYTES: usize = 160;
/// Bytes of one group's table for one token: 32 l bytes, then 32 h bytes.
pub const PERM_GROUP_TABLE_BYTES: usize = 64;

/// Groups of a row of `cols` weights, rounded up to whole spans.
pub fn perm_groups(cols: usize) -> usize {
    lookup_groups::<PermLayout>(cols)
}

/// Bytes of one token's tables for rows of `cols` weights.
pub fn perm_table_bytes(cols: usize) -> usize {
    perm_groups(cols) * PERM_GROUP_TABLE_BYTES
}

/// Bytes of the repack of a `rows × cols` matrix.
pub fn perm_matrix_bytes(rows: usize, cols: usize) -> usize {
    lookup_matrix_bytes::<PermLayout>(rows, cols)
}

/// Writes one token's tables (`perm_table_bytes(x.len())` bytes; `x` is the token's K int8
/// values): for group g and code c, l byte at `64g + c` and h byte at `64g + 32 + c`, of the
/// sum `Σ tᵢ(p)·x[3g+i]` for c = p < 16 (zero for p ≥ 14) and of its complement for
/// c = 16 + p. The definition the SIMD builder is tested against.
pub(crate) fn build_perm_tables_portable(x: &[i8], dst: &mut [u8]) {
    let groups = perm_groups(x.len());
    assert_eq!(dst.len(), groups * PERM_GROUP_TABLE_BYTES, "build_perm_tables: table size");
    build_perm_groups_portable(x, dst, 0..groups);
}

/// [`build_perm_tables_portable`] for groups `groups` only (a SIMD builder's tail).
pub(crate) fn build_perm_groups_portable(x: &[i8], dst: &mut [u8], groups: std::ops::Range<usize>) {
    let at = |k: usize| x.get(k).map_or(0i16, |&v| v as i16);
    for g in groups {
        let table = &mut dst[g * PERM_GROUP_TABLE_BYTES..][..PERM_GROUP_TABLE_BYTES];
        for p in 0..16 {
            let v = if p < 14 {
                let t = lut_pattern(p);
                (0..3).map(|i| t[i] as i16 * at(3 * g + i)).sum()
            } else {
                0
            };
            let (l, h) = lut_split(v);
            table[p] = l as u8;
            table[16 + p] = !l as u8;
            table[32 + p] = h as u8;
            table[48 + p] = !h as u8;
        }
    }
}

/// The `perm` repack's layout (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PermLayout;

impl LookupLayout for PermLayout {
    const TILE_ROWS: usize = PERM_TILE_ROWS;
    const SPAN_GROUPS: usize = PERM_SPAN_GROUPS;
    const SPAN_BYTES: usize = PERM_SPAN_BYTES;

    #[inline]
    fn write_row(span: &mut [u8], j: usize, codes: &[u8]) {
        for (k, b) in span_bytes(codes.try_into().expect("a span's codes")).iter().enumerate() {
            span[32 * k + j] = *b;
        }
    }

    #[inline]
    fn read_code(span: &[u8], j: usize, g: usize) -> u8 {
        span_codes(std::array::from_fn(|k| span[32 * k + j]))[g]
    }
}

/// The `perm` form's repack: a TQ1_0 matrix for 32-entry table lookup (see the module docs).
pub type Tq1PermMatrix = LookupRepack<PermLayout>;

impl Tq1PermMatrix {
    /// Row `row`'s dot product with one token's tables (`build_perm_tables_portable`), before
    /// scales: the portable definition of what the SIMD kernel sums.
    pub fn dot_portable(&self, row: usize, tables: &[u8]) -> i32 {
        let sum: i32 = (0..perm_groups(self.cols()))
            .map(|g| {
                let c = self.code(row, g) as usize;
                let t = &tables[g * PERM_GROUP_TABLE_BYTES..];
                t[c] as i8 as i32 + LUT_H_WEIGHT as i32 * t[32 + c] as i8 as i32
            })
            .sum();
        sum + LUT_NEGATION_BIAS * self.negated(row)
    }
}

/// One row's five span bytes (V0–V4) holding the eight codes `c` (see the module docs).
fn span_bytes(c: [u8; PERM_SPAN_GROUPS]) -> [u8; 5] {
    debug_assert!(c.iter().all(|&c| c < 32));
    [
        c[0] | (c[5] & 7) << 5,
        c[1] | (c[5] >> 3) << 5 | (c[7] >> 3 & 1) << 7,
        c[2] | (c[6] & 7) << 5,
        c[3] | (c[6] >> 3) << 5 | (c[7] >> 4) << 7,
        c[4] | (c[7] & 7) << 5,
    ]
}

/// The eight codes in one row's five span bytes: the inverse of [`span_bytes`].
fn span_codes(v: [u8; 5]) -> [u8; PERM_SPAN_GROUPS] {
    let low = |b: u8| b & 31;
    [
        low(v[0]),
        low(v[1]),
        low(v[2]),
        low(v[3]),
        low(v[4]),
        v[0] >> 5 | (v[1] >> 5 & 3) << 3,
        v[2] >> 5 | (v[3] >> 5 & 3) << 3,
        v[4] >> 5 | (v[1] >> 7) << 3 | (v[3] >> 7) << 4,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::tq1_lut::LUT_NEGATED;
    use crate::formats::Tq1Matrix;
    use crate::rng::SplitMix64;

    #[test]
    fn span_bytes_hold_eight_five_bit_codes() {
        let mut g = SplitMix64::new(5);
        for _ in 0..10_000 {
            let c: [u8; 8] = std::array::from_fn(|_| (g.next_u64() % 32) as u8);
            assert_eq!(span_codes(span_bytes(c)), c);
        }
    }

    #[test]
    fn tables_hold_every_signed_pattern_sum() {
        for cols in [1usize, 3, 23, 24, 25, 256, 2560] {
            let mut g = SplitMix64::new(cols as u64);
            let mut x: Vec<i8> = (0..cols).map(|_| g.next_u64() as i8).collect();
            // Extremes too: the sums reach ±384.
            for (k, v) in x.iter_mut().enumerate().take(9) {
                *v = if k < 6 { -128 } else { 127 };
            }
            let mut t = vec![0xAAu8; perm_table_bytes(cols)];
            build_perm_tables_portable(&x, &mut t);
            for grp in 0..perm_groups(cols) {
                for c in 0..32 {
                    let p = c % 16;
                    let v: i32 = if p < 14 {
                        let w = lut_pattern(p);
                        (0..3).map(|i| w[i] as i32 * x.get(3 * grp + i).map_or(0, |&v| v as i32)).sum()
                    } else {
                        0
                    };
                    let want = if c < 16 { v } else { -v - LUT_NEGATION_BIAS };
                    let base = grp * PERM_GROUP_TABLE_BYTES + c;
                    let (l, h) = (t[base] as i8, t[base + 32] as i8);
                    // Any eight entries sum within i8.
                    assert!((-16..=15).contains(&l) && (-13..=12).contains(&h), "{l}, {h}");
                    assert_eq!(l as i32 + LUT_H_WEIGHT as i32 * h as i32, want, "cols {cols}, group {grp}, code {c}");
                }
            }
        }
    }

    #[test]
    fn repack_keeps_every_weight_and_dots_match_the_decoded_rows() {
        for (rows, cols) in [(1, 256), (32, 256), (33, 512), (70, 2560)] {
            let m = Tq1Matrix::random(rows, cols, 0.5, rows as u64 * 7 + cols as u64).unwrap();
            let p = Tq1PermMatrix::from_tq1(&m).expect("uniform scales");
            let mut g = SplitMix64::new(cols as u64);
            let x: Vec<i8> = (0..cols).map(|_| g.next_u64() as i8).collect();
            let mut t = vec![0u8; perm_table_bytes(cols)];
            build_perm_tables_portable(&x, &mut t);
            for r in 0..rows {
                for k in 0..cols {
                    assert_eq!(p.get(r, k), m.get(r, k), "({r}, {k})");
                }
                // Padding columns are zero weights.
                for k in cols..3 * perm_groups(cols) {
                    assert_eq!(p.get(r, k), 0);
                }
                let neg = (0..perm_groups(cols)).filter(|&g| p.code(r, g) & LUT_NEGATED != 0).count();
                assert_eq!(p.negated(r), neg as i32);
                assert_eq!(p.scale(r), m.row(r)[0].d);
                let want: i32 = (0..cols).map(|k| m.get(r, k) as i32 * x[k] as i32).sum();
                assert_eq!(p.dot_portable(r, &t), want, "row {r}");
            }
            // Padding rows are zero weights.
            for r in rows..p.tiles() * PERM_TILE_ROWS {
                assert!((0..cols).all(|k| p.get(r, k) == 0));
            }
            // 1.67 bits per weight, as TQ1_0's 1.69.
            assert_eq!(p.byte_len(), p.tiles() * PERM_TILE_ROWS * perm_groups(cols) * 5 / 8);
            assert_eq!(p.byte_len(), perm_matrix_bytes(rows, cols));
        }
    }
}
