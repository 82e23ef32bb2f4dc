//! TQ1_0 weights repacked for table lookup (the `tq1 … lut` kernels): the same 1.67 bits per
//! weight, laid out so that a kernel looks sums up instead of decoding digits.
//!
//! The idea is T-MAC's and bitnet.cpp's TL2: three ternary weights take 27 values, which are 13
//! patterns and their negations plus zero. A group of three weights is stored as the index
//! `p = |t₀ + 3t₁ + 9t₂|` ∈ 0..=13 of its sign-normalized pattern (4 bits) and a sign (1 bit).
//! For each token, each group of three activations gets a 14-entry table of Σ tᵢxᵢ over the
//! patterns (see `build_token_tables_portable`), and a row's dot product is Σ over its groups
//! of ±table\[p\]. `vpshufb` then does the lookups of 16 rows (two groups each) in one instruction.
//!
//! A sum v (|v| ≤ 3·128) is held exactly as two signed bytes, `v = 32h + l` with l ∈ [−16, 15]
//! and h ∈ [−12, 12], in an l table and an h table: no table is requantized to int8 (T-MAC and
//! TL2 requantize them). Both parts are small, so a kernel adds a span's eight lookups per lane
//! in i8 lanes and widens once per span, not once per lookup. A kernel negates a group by
//! complementing both bytes, which gives `32(−h−1) + (−l−1) = −v − 33`; it adds
//! [`LUT_NEGATION_BIAS`] per negated group back at the end.
//!
//! ## Layout
//! Rows in tiles of [`LUT_TILE_ROWS`] (the last tile padded with zero rows); a row's K columns
//! in groups of 3 (group g = columns 3g, 3g+1, 3g+2; columns past K are zero), groups in spans
//! of [`LUT_SPAN_GROUPS`]. A tile stores its spans one after another, each in
//! [`LUT_SPAN_BYTES`] bytes, as five 32-byte vectors whose byte `16h + j` belongs to row j of the
//! tile and lane half h:
//! - vectors v = 0..4: low nibble = index of group 4v + h, high nibble = index of group 4v + 2 + h;
//! - vector 4: bit 7 − k = sign of group 2k + h (k = 0..8), 1 = negated: pair k's sign is
//!   bit 7 after the byte is doubled k times, where `vpcmpgtb` against zero reads it.
//!
//! So a span of a tile is 16 rows × 48 weights in 160 bytes, and a tile is one ascending stream.

use crate::aligned::PageVec;
use crate::formats::Tq1Matrix;

/// Rows per tile: 16 rows × 2 lane halves fill a 32-byte vector.
pub const LUT_TILE_ROWS: usize = 16;
/// Weights per group.
pub const LUT_GROUP: usize = 3;
/// Groups per span: four nibble vectors of four groups each, and one sign vector.
pub const LUT_SPAN_GROUPS: usize = 16;
/// Bytes of one span of one tile: 4 nibble vectors + 1 sign vector.
pub const LUT_SPAN_BYTES: usize = 160;
/// Bytes of one group pair's table for one token: the l bytes of groups 2P and 2P+1 (16 each),
/// then their h bytes.
pub const LUT_PAIR_TABLE_BYTES: usize = 64;
/// Weight of a table's h byte: `v = LUT_H_WEIGHT·h + l`.
pub const LUT_H_WEIGHT: i16 = 32;
const _: () = assert!(LUT_H_WEIGHT == 1 << 5, "lut_split and the SIMD builders shift by 5");
/// What complementing both bytes of a sum v adds beyond −v: `−(LUT_H_WEIGHT + 1)`. Kernels
/// that negate that way add this back once per negated group ([`Tq1LutMatrix::negated`]).
pub const LUT_NEGATION_BIAS: i32 = LUT_H_WEIGHT as i32 + 1;

/// The (l, h) bytes of a table sum v: `v = LUT_H_WEIGHT·h + l`, l ∈ [−16, 15].
#[inline]
pub const fn lut_split(v: i16) -> (i8, i8) {
    let h = (v + LUT_H_WEIGHT / 2) >> 5;
    ((v - LUT_H_WEIGHT * h) as i8, h as i8)
}

/// Groups of a row of `cols` weights, rounded up to whole spans.
pub fn lut_groups(cols: usize) -> usize {
    lookup_groups::<ShuffleLayout>(cols)
}

/// Bytes of one token's tables for rows of `cols` weights.
pub fn lut_table_bytes(cols: usize) -> usize {
    lut_groups(cols) / 2 * LUT_PAIR_TABLE_BYTES
}

/// Bytes of the repack of a `rows × cols` matrix.
pub fn lut_matrix_bytes(rows: usize, cols: usize) -> usize {
    lookup_matrix_bytes::<ShuffleLayout>(rows, cols)
}

/// The three weights of sign-normalized pattern `p` (balanced-ternary digits of p, least
/// significant first): `t₀ + 3t₁ + 9t₂ = p`.
pub const fn lut_pattern(p: usize) -> [i8; 3] {
    let mut t = [0i8; 3];
    let mut v = p as i32;
    let mut i = 0;
    while i < 3 {
        let mut d = v % 3;
        if d == 2 {
            d = -1;
        }
        t[i] = d as i8;
        v = (v - d) / 3;
        i += 1;
    }
    t
}

/// Index and sign of three weights: `(|t₀ + 3t₁ + 9t₂|, negative)`.
#[inline]
pub fn lut_encode(t: [i8; 3]) -> (u8, bool) {
    let v = t[0] as i32 + 3 * t[1] as i32 + 9 * t[2] as i32;
    (v.unsigned_abs() as u8, v < 0)
}

/// Writes one token's tables (`lut_table_bytes(x.len())` bytes; `x` is the token's K int8
/// values): for group g and pattern p, the sum `Σ tᵢ(p)·x[3g+i]` split by [`lut_split`], its l
/// byte at `64·(g/2) + 16·(g%2) + p` and its h byte 32 bytes further on. Entries 14 and 15 are 0.
/// The definition the SIMD builders are tested against.
pub(crate) fn build_token_tables_portable(x: &[i8], dst: &mut [u8]) {
    let groups = lut_groups(x.len());
    debug_assert_eq!(dst.len(), groups / 2 * LUT_PAIR_TABLE_BYTES);
    build_groups_portable(x, dst, 0..groups);
}

/// [`build_token_tables_portable`] for groups `groups` only (a SIMD builder's tail).
#[inline]
pub(crate) fn build_groups_portable(x: &[i8], dst: &mut [u8], groups: std::ops::Range<usize>) {
    let at = |k: usize| x.get(k).map_or(0i16, |&v| v as i16);
    for g in groups {
        let t = group_table(at(3 * g), at(3 * g + 1), at(3 * g + 2));
        let base = g / 2 * LUT_PAIR_TABLE_BYTES + 16 * (g % 2);
        let (ls, hs) = dst[base..base + 48].split_at_mut(32);
        for p in 0..16 {
            let (l, h) = lut_split(t[p]);
            ls[p] = l as u8;
            hs[p] = h as u8;
        }
    }
}

/// The 16 table entries of one group of activations (a, b, c): pattern p's sum at p, each from
/// an earlier one with one add; 14 and 15 are 0.
#[inline]
fn group_table(a: i16, b: i16, c: i16) -> [i16; 16] {
    let mut t = [0i16; 16];
    t[1] = a; // (1, 0, 0)
    t[3] = b; // (0, 1, 0)
    t[2] = b - a; // (−1, 1, 0)
    t[4] = b + a; // (1, 1, 0)
    t[9] = c; // (0, 0, 1)
    t[6] = c - b; // (0, −1, 1)
    t[5] = t[6] - a; // (−1, −1, 1)
    t[7] = t[6] + a; // (1, −1, 1)
    t[8] = c - a; // (−1, 0, 1)
    t[10] = c + a; // (1, 0, 1)
    t[12] = c + b; // (0, 1, 1)
    t[11] = t[12] - a; // (−1, 1, 1)
    t[13] = t[12] + a; // (1, 1, 1)
    t
}

/// Code bit of a negated group: a group's code is its pattern index `p`, plus this if the
/// group is stored negated (both lookup repacks hold these 5 bits per group, each its own way).
pub const LUT_NEGATED: u8 = 16;

/// The code of three weights: `|t₀ + 3t₁ + 9t₂|`, plus [`LUT_NEGATED`] if that sum is negative.
#[inline]
pub fn lut_code(t: [i8; 3]) -> u8 {
    // In i8 lanes (|t₀ + 3t₁ + 9t₂| ≤ 13), a form LLVM vectorizes over a row.
    let v = t[0] + 3 * t[1] + 9 * t[2];
    v.unsigned_abs() | ((v < 0) as u8) << 4
}

/// How a lookup repack lays out its tiles: what differs between the `lut` repack
/// ([`ShuffleLayout`], `vpshufb`) and the `perm` one (`tq1_perm::PermLayout`, `vpermb`). A tile
/// is `TILE_ROWS` rows; a row's groups go in spans of `SPAN_GROUPS`, each span of a tile in
/// `SPAN_BYTES` bytes, spans one after another.
pub trait LookupLayout {
    const TILE_ROWS: usize;
    const SPAN_GROUPS: usize;
    const SPAN_BYTES: usize;
    /// Writes the codes ([`lut_code`]) of row j of the tile for one span into its bytes.
    fn write_row(span: &mut [u8], j: usize, codes: &[u8]);
    /// The code of group g of the span, row j of the tile.
    fn read_code(span: &[u8], j: usize, g: usize) -> u8;
}

/// The `lut` repack's layout (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffleLayout;

impl LookupLayout for ShuffleLayout {
    const TILE_ROWS: usize = LUT_TILE_ROWS;
    const SPAN_GROUPS: usize = LUT_SPAN_GROUPS;
    const SPAN_BYTES: usize = LUT_SPAN_BYTES;

    #[inline]
    fn write_row(span: &mut [u8], j: usize, c: &[u8]) {
        let p = |g: usize| c[g] & (LUT_NEGATED - 1);
        for h in 0..2 {
            let lane = 16 * h + j;
            // Vector v: group 4v + h in the low nibble, 4v + 2 + h in the high one.
            for v in 0..4 {
                span[32 * v + lane] = p(4 * v + h) | p(4 * v + 2 + h) << 4;
            }
            // Bit 7 − k: the sign of group 2k + h.
            span[128 + lane] = (0..8).fold(0u8, |b, k| b | (c[2 * k + h] >> 4) << (7 - k));
        }
    }

    #[inline]
    fn read_code(span: &[u8], j: usize, g: usize) -> u8 {
        let (h, pair) = (g % 2, g / 2);
        let lane = 16 * h + j;
        let p = (span[32 * (pair / 2) + lane] >> (4 * (pair % 2))) & 15;
        p | (span[128 + lane] >> (7 - pair) & 1) << 4
    }
}

/// A TQ1_0 matrix repacked for table lookup in layout `L` (see the module docs and
/// `tq1_perm`'s). Built from a [`Tq1Matrix`] whose rows each have one scale for all their
/// blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct LookupRepack<L> {
    rows: usize,
    cols: usize,
    /// `[tiles, spans, L::SPAN_BYTES]`.
    data: PageVec<u8>,
    /// `[rows]`: the row's (uniform) block scale.
    scales: Vec<half::f16>,
    /// `[rows]`: groups stored negated: the kernels look up or make −v − 33 for them and add
    /// these back times [`LUT_NEGATION_BIAS`].
    negated: Vec<i32>,
    layout: std::marker::PhantomData<L>,
}

/// The `lut` form's repack.
pub type Tq1LutMatrix = LookupRepack<ShuffleLayout>;

/// Groups of a row of `cols` weights in layout `L`, rounded up to whole spans.
pub fn lookup_groups<L: LookupLayout>(cols: usize) -> usize {
    cols.div_ceil(LUT_GROUP).div_ceil(L::SPAN_GROUPS) * L::SPAN_GROUPS
}

/// Bytes of the repack of a `rows × cols` matrix in layout `L`.
pub fn lookup_matrix_bytes<L: LookupLayout>(rows: usize, cols: usize) -> usize {
    rows.div_ceil(L::TILE_ROWS) * lookup_groups::<L>(cols) / L::SPAN_GROUPS * L::SPAN_BYTES
}

impl<L: LookupLayout> LookupRepack<L> {
    /// The repack of `m`, or `None` when a row's blocks have different scales (the integer sum
    /// of a whole row would then be wrong; those matrices stay with the digit kernels).
    pub fn from_tq1(m: &Tq1Matrix) -> Option<Self> {
        if !(0..m.rows()).all(|r| m.row_has_uniform_scale(r)) {
            return None;
        }
        let (rows, cols) = (m.rows(), m.cols());
        let groups = lookup_groups::<L>(cols);
        let spans = groups / L::SPAN_GROUPS;
        let tiles = rows.div_ceil(L::TILE_ROWS);
        let mut data = PageVec::<u8>::zeroed(tiles * spans * L::SPAN_BYTES);
        let mut negated = vec![0i32; rows];
        // A row decoded at a time (zero beyond K), then encoded a group at a time, then each
        // span's bytes of the row written whole: a 2B4T TQ1 GGUF loads in 1.2–1.4 s with two
        // threads, where or-ing each group's nibble and sign bit into the span had taken 3.1–3.4.
        let mut row = vec![0i8; 3 * groups];
        let mut codes = vec![0u8; groups];
        for r in 0..rows {
            m.decode_row(r, &mut row[..cols]);
            for (c, t) in codes.iter_mut().zip(row.chunks_exact(3)) {
                *c = lut_code([t[0], t[1], t[2]]);
            }
            negated[r] = codes.iter().map(|&c| (c >> 4) as i32).sum();
            let (tile, j) = (r / L::TILE_ROWS, r % L::TILE_ROWS);
            let tile_spans =
                data[tile * spans * L::SPAN_BYTES..][..spans * L::SPAN_BYTES].chunks_exact_mut(L::SPAN_BYTES);
            for (span, c) in tile_spans.zip(codes.chunks_exact(L::SPAN_GROUPS)) {
                L::write_row(span, j, c);
            }
        }
        let scales = (0..rows).map(|r| m.row(r)[0].d).collect();
        Some(Self { rows, cols, data, scales, negated, layout: std::marker::PhantomData })
    }

    /// Group g's code in row `row` as stored ([`lut_code`]).
    #[inline]
    pub fn code(&self, row: usize, g: usize) -> u8 {
        L::read_code(self.span(row / L::TILE_ROWS, g / L::SPAN_GROUPS), row % L::TILE_ROWS, g % L::SPAN_GROUPS)
    }

    /// Ternary value at (row, col), decoded from the repacked bytes (the test oracle's view).
    pub fn get(&self, row: usize, col: usize) -> i8 {
        let c = self.code(row, col / LUT_GROUP);
        let t = lut_pattern((c & (LUT_NEGATED - 1)) as usize)[col % LUT_GROUP];
        if c & LUT_NEGATED != 0 {
            -t
        } else {
            t
        }
    }

    /// The `L::SPAN_BYTES` of span `s` of tile `tile`.
    #[inline]
    pub fn span(&self, tile: usize, s: usize) -> &[u8] {
        &self.data[(tile * self.spans() + s) * L::SPAN_BYTES..][..L::SPAN_BYTES]
    }

    /// Tile `tile`'s bytes: its spans back to back.
    #[inline]
    pub fn tile(&self, tile: usize) -> &[u8] {
        let n = self.spans() * L::SPAN_BYTES;
        &self.data[tile * n..(tile + 1) * n]
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(L::TILE_ROWS)
    }
    /// Where row `r`'s tile starts in [`Self::bytes`].
    pub fn tile_offset(&self, r: usize) -> usize {
        r / L::TILE_ROWS * self.spans() * L::SPAN_BYTES
    }
    pub fn spans(&self) -> usize {
        lookup_groups::<L>(self.cols) / L::SPAN_GROUPS
    }
    /// Row `r`'s block scale.
    #[inline]
    pub fn scale(&self, r: usize) -> half::f16 {
        self.scales[r]
    }
    /// Row `r`'s count of negated groups.
    #[inline]
    pub fn negated(&self, r: usize) -> i32 {
        self.negated[r]
    }
    /// Every row's scale, row r at index r.
    #[inline]
    pub fn row_scales(&self) -> &[half::f16] {
        &self.scales
    }
    /// Every row's count of negated groups, row r at index r.
    #[inline]
    pub fn negated_counts(&self) -> &[i32] {
        &self.negated
    }
    /// Bytes a kernel streams to use every weight once.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }
    /// Every tile's bytes, tile t at `t × spans × SPAN_BYTES`.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn patterns_are_the_thirteen_sign_normalized_triples_and_zero() {
        let mut seen = std::collections::HashSet::new();
        for p in 0..14 {
            let t = lut_pattern(p);
            assert!(t.iter().all(|v| (-1..=1).contains(v)));
            assert_eq!(lut_encode(t), (p as u8, false), "pattern {p}: {t:?}");
            seen.insert(t);
        }
        // Every triple is a pattern or a negated one.
        for v in 0..27 {
            let t = [(v % 3) as i8 - 1, (v / 3 % 3) as i8 - 1, (v / 9) as i8 - 1];
            let (p, neg) = lut_encode(t);
            let back = lut_pattern(p as usize).map(|w| if neg { -w } else { w });
            assert_eq!(back, t);
        }
        assert_eq!(seen.len(), 14);
    }

    #[test]
    fn tables_hold_every_pattern_sum_split_into_bytes() {
        for cols in [1usize, 3, 47, 48, 49, 256, 2560] {
            let mut g = SplitMix64::new(cols as u64);
            let mut x: Vec<i8> = (0..cols).map(|_| g.next_u64() as i8).collect();
            // Extremes too: the sums reach ±384.
            for (k, v) in x.iter_mut().enumerate().take(9) {
                *v = if k < 6 { -128 } else { 127 };
            }
            let mut t = vec![0xAAu8; lut_table_bytes(cols)];
            build_token_tables_portable(&x, &mut t);
            for grp in 0..lut_groups(cols) {
                for p in 0..16 {
                    let want: i16 = if p < 14 {
                        let w = lut_pattern(p);
                        (0..3).map(|i| w[i] as i16 * x.get(3 * grp + i).map_or(0, |&v| v as i16)).sum()
                    } else {
                        0
                    };
                    let base = grp / 2 * LUT_PAIR_TABLE_BYTES + 16 * (grp % 2) + p;
                    let (l, h) = (t[base] as i8, t[base + 32] as i8);
                    assert!((-16..=15).contains(&l) && (-12..=12).contains(&h), "{l}, {h}");
                    let got = l as i16 + LUT_H_WEIGHT * h as i16;
                    assert_eq!(got, want, "cols {cols}, group {grp}, pattern {p}");
                }
            }
        }
    }

    #[test]
    fn split_is_exact_and_complements_to_the_bias() {
        for v in -384i16..=384 {
            let (l, h) = lut_split(v);
            assert!((-16..=15).contains(&l) && (-12..=12).contains(&h), "{v}: {l}, {h}");
            assert_eq!(l as i16 + LUT_H_WEIGHT * h as i16, v);
            // Complemented bytes: −v − bias. Both forms lie in l ∈ [−16, 15], h ∈ [−13, 12], so
            // any eight of them sum within i8 ([−128, 120] and [−104, 96]).
            let (nl, nh) = (!l, !h);
            assert_eq!(nl as i32 + LUT_H_WEIGHT as i32 * nh as i32, -(v as i32) - LUT_NEGATION_BIAS);
            assert!((-16..=15).contains(&nl) && (-13..=12).contains(&nh), "{v}: {nl}, {nh}");
        }
    }

    #[test]
    fn repack_keeps_every_weight_and_counts_negated_groups() {
        for (rows, cols) in [(1, 256), (16, 256), (17, 512), (40, 2560)] {
            let m = Tq1Matrix::random(rows, cols, 0.5, rows as u64 * 7 + cols as u64).unwrap();
            let l = Tq1LutMatrix::from_tq1(&m).expect("uniform scales");
            for r in 0..rows {
                for k in 0..cols {
                    assert_eq!(l.get(r, k), m.get(r, k), "({r}, {k})");
                }
                // Padding columns are zero weights.
                for k in cols..3 * lut_groups(cols) {
                    assert_eq!(l.get(r, k), 0);
                }
                let neg = (0..lut_groups(cols))
                    .filter(|&g| {
                        let t = [0, 1, 2].map(|i| if 3 * g + i < cols { m.get(r, 3 * g + i) } else { 0 });
                        lut_encode(t).1
                    })
                    .count();
                assert_eq!(l.negated(r), neg as i32);
                assert_eq!(l.scale(r), m.row(r)[0].d);
            }
            // Padding rows are zero weights.
            for r in rows..l.tiles() * LUT_TILE_ROWS {
                assert!((0..cols).all(|k| l.get(r, k) == 0));
            }
            // 1.67 bits per weight, as TQ1_0's 1.69.
            assert_eq!(l.byte_len(), l.tiles() * LUT_TILE_ROWS * lut_groups(cols) * 5 / 8);
            assert_eq!(l.byte_len(), lut_matrix_bytes(rows, cols));
        }
    }

    #[test]
    fn rows_with_mixed_block_scales_are_not_repacked() {
        let m = Tq1Matrix::random(2, 512, 0.5, 1).unwrap();
        let mut blocks = m.blocks().to_vec();
        blocks[1].d = half::f16::from_f32(0.25);
        let mixed = Tq1Matrix::from_blocks(2, 512, blocks).unwrap();
        assert!(Tq1LutMatrix::from_tq1(&mixed).is_none());
        assert!(Tq1LutMatrix::from_tq1(&m).is_some());
        assert!(crate::formats::Tq1PermMatrix::from_tq1(&mixed).is_none());
        assert!(crate::formats::Tq1PermMatrix::from_tq1(&m).is_some());
    }
}
