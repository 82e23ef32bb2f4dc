//! The `perm` TQ1 kernel: `vpermb` looks up each weight group's sum in the token's tables.

use super::*;

/// The `perm` TQ1 kernel (see `formats::tq1_perm`): one token, two 32-row tiles per pass
/// where the range has them, sharing each table load; more tokens, two tiles against
/// [`PERM_TOKENS`] tokens per pass ([`perm_batched`]), sharing each table load and each span's
/// codes. Rows outside `rows` of a tile the range only partly covers are computed and dropped.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,gfni,avx2,fma,popcnt,f16c")]
pub(super) unsafe fn tq1_perm(
    w: &Tq1PermMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    let (first, end) = (rows.start / PERM_TILE_ROWS, rows.end.div_ceil(PERM_TILE_ROWS));
    let spans = w.spans();
    let lr = LookupRows { scales: w.row_scales(), negated: w.negated_counts() };
    let r0 = |t: usize| t * PERM_TILE_ROWS;
    // Prefetch distance: the same place in the tiles of the next pass. A fixed distance (the
    // `lut` kernel's PREFETCH_L2_BYTES) falls, for two 32-row tiles of 2560-wide rows (17 KB
    // each), into the second tile of the same pass, and streamed far slower than `lut`
    // (docs/perf-notes.md).
    let tile_bytes = w.tile(first).len();
    let mut t = first;
    while t < end {
        if batch == 1 {
            let table = [tables.token(0).as_ptr()];
            if t + 2 <= end {
                let sums =
                    perm_tiles::<2, 1>([w.tile(t).as_ptr(), w.tile(t + 1).as_ptr()], table, 0..spans, 2 * tile_bytes);
                lut_emit(lr, x, &rows, out, r0(t), 0, &sums[0][0]);
                lut_emit(lr, x, &rows, out, r0(t + 1), 0, &sums[1][0]);
                t += 2;
            } else {
                let sums = perm_tiles::<1, 1>([w.tile(t).as_ptr()], table, 0..spans, tile_bytes);
                lut_emit(lr, x, &rows, out, r0(t), 0, &sums[0][0]);
                t += 1;
            }
            continue;
        }
        // More tokens: two tiles per pass where the range has them, sharing each table load.
        if t + 2 <= end {
            perm_batched::<2>(w, x, tables, &rows, out, t, tile_bytes);
            t += 2;
        } else {
            perm_batched::<1>(w, x, tables, &rows, out, t, tile_bytes);
            t += 1;
        }
    }
}

/// [`tq1_perm`] for more than one token: R tiles from `t` against every token, in column
/// chunks whose tables for a block of tokens take [`PERM_TABLE_BUDGET`], each chunk against
/// every token of the block, [`PERM_TOKENS`] per pass. Every token's tables are read once per
/// pass over R tiles, which for eight tokens' 6912-wide rows (147 KB each) is more than L2
/// holds: two tiles per pass halve those reads.
#[inline(always)]
pub(super) unsafe fn perm_batched<const R: usize>(
    w: &Tq1PermMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: &Range<usize>,
    out: &mut [f32],
    t: usize,
    tile_bytes: usize,
) {
    let (batch, spans) = (x.batch(), w.spans());
    let lr = LookupRows { scales: w.row_scales(), negated: w.negated_counts() };
    let src: [*const u8; R] = std::array::from_fn(|i| w.tile(t + i).as_ptr());
    let zero = _mm256_setzero_si256();
    let mut first_token = 0;
    while first_token < batch {
        let tokens = (batch - first_token).min(PERM_BLOCK_TOKENS);
        let chunk = (PERM_TABLE_BUDGET / (tokens * PERM_SPAN_TABLE_BYTES)).max(1);
        let mut sums = [[[zero; 4]; PERM_BLOCK_TOKENS]; R];
        let mut c0 = 0;
        while c0 < spans {
            let cols = c0..spans.min(c0 + chunk);
            let mut b0 = 0;
            while b0 < tokens {
                let g = PERM_TOKENS.min(tokens - b0);
                let tb = |i: usize| tables.token(first_token + b0 + i.min(g - 1)).as_ptr();
                // Only the first pass over a chunk streams it from memory; later ones hit L1/L2.
                let ahead = if b0 == 0 { R * tile_bytes } else { 0 };
                let mut part = [[[zero; 4]; PERM_TOKENS]; R];
                match g {
                    1 => {
                        let one = perm_tiles::<R, 1>(src, [tb(0)], cols.clone(), ahead);
                        for i in 0..R {
                            part[i][0] = one[i][0];
                        }
                    }
                    _ => part = perm_tiles::<R, PERM_TOKENS>(src, std::array::from_fn(tb), cols.clone(), ahead),
                }
                for i in 0..R {
                    for (sum, p) in sums[i][b0..b0 + g].iter_mut().zip(&part[i]) {
                        for (s, v) in sum.iter_mut().zip(p) {
                            *s = _mm256_add_epi32(*s, *v);
                        }
                    }
                }
                b0 += g;
            }
            c0 = cols.end;
        }
        for (i, tile_sums) in sums.iter().enumerate() {
            for (b, s) in tile_sums[..tokens].iter().enumerate() {
                lut_emit(lr, x, rows, out, (t + i) * PERM_TILE_ROWS, first_token + b, s);
            }
        }
        first_token += tokens;
    }
}

/// Tokens whose row sums a batched `perm` tile keeps while it goes through the columns.
pub(super) const PERM_BLOCK_TOKENS: usize = crate::matmul::LUT_MAX_BATCH;

/// Bytes of tables a batched `perm` tile reads per column chunk (a quarter of Zen 4's L2).
pub(super) const PERM_TABLE_BUDGET: usize = 256 * 1024;

/// Bytes of one token's tables for one span.
pub(super) const PERM_SPAN_TABLE_BYTES: usize =
    crate::formats::tq1_perm::PERM_SPAN_GROUPS * crate::formats::tq1_perm::PERM_GROUP_TABLE_BYTES;

/// Tokens per pass of the batched `perm` tile.
pub(super) const PERM_TOKENS: usize = 2;

/// Spans summed in i16 lanes before they are widened: a lane takes one row's eight groups per
/// span, each a looked-up sum or its complement in [−384 − 33, 384], so eight spans stay within
/// 64 · 417 = 26 688.
pub(super) const PERM_I16_SPANS: usize = 8;

/// A span's eight code vectors from its five stored ones (`formats::tq1_perm`'s layout): codes
/// 0–4 as stored (`vpermb` reads bits 0–4 only), codes 5–7 gathered from bits 5–7 by
/// `vgf2p8affineqb` (one bit permutation within each byte) and OR-ed together. Bits 5–7 of
/// codes 5–7 are zero; those of 0–4 are other codes' bits, which `vpermb` ignores.
#[inline(always)]
pub(super) unsafe fn perm_codes(v: [__m256i; 5]) -> [__m256i; 8] {
    // Matrix byte 7 − i gives output bit i; these move input bits to outputs:
    // 5, 6, 7 → 0, 1, 2; 5, 6 → 3, 4; 7 → 3; 7 → 4.
    let bits_5_7_to_0 = _mm256_set1_epi64x(0x2040_8000_0000_0000);
    let bits_5_6_to_3 = _mm256_set1_epi64x(0x0000_0020_4000_0000);
    let bit_7_to_3 = _mm256_set1_epi64x(0x0000_0080_0000_0000);
    let bit_7_to_4 = _mm256_set1_epi64x(0x0000_0000_8000_0000);
    let gf = |a: __m256i, m: __m256i| _mm256_gf2p8affine_epi64_epi8::<0>(a, m);
    let c5 = _mm256_or_si256(gf(v[0], bits_5_7_to_0), gf(v[1], bits_5_6_to_3));
    let c6 = _mm256_or_si256(gf(v[2], bits_5_7_to_0), gf(v[3], bits_5_6_to_3));
    // a | b | c.
    let c7 = _mm256_ternarylogic_epi32::<0xFE>(gf(v[4], bits_5_7_to_0), gf(v[1], bit_7_to_3), gf(v[3], bit_7_to_4));
    [v[0], v[1], v[2], v[3], v[4], c5, c6, c7]
}

/// Σ over spans `spans` of R 32-row tiles (`src[i]`: the tile's bytes) against G tokens' `perm`
/// tables: per group, one `vpermb` each from its l and h tables for 32 rows, added in i8 lanes
/// over the span's eight groups; once per span, l and h unpacked into (l, h) byte pairs and
/// `vpmaddubsw` by (1, 32) give i16 row sums, widened to i32 every [`PERM_I16_SPANS`] spans.
/// Returns each tile's and token's row sums as i32 vectors of rows 0–7, 8–15, 16–23, 24–31,
/// with every negated group counted as −v − 33. Prefetches into L2 `ahead` bytes past what it
/// reads of each tile (0: none).
#[inline(always)]
pub(super) unsafe fn perm_tiles<const R: usize, const G: usize>(
    src: [*const u8; R],
    tables: [*const u8; G],
    spans: Range<usize>,
    ahead: usize,
) -> [[[__m256i; 4]; G]; R] {
    use crate::formats::tq1_perm::{PERM_GROUP_TABLE_BYTES, PERM_SPAN_BYTES, PERM_SPAN_GROUPS};
    let zero = _mm256_setzero_si256();
    let mut wide = [[[zero; 4]; G]; R];
    let mut s = spans.start;
    while s < spans.end {
        let end = spans.end.min(s + PERM_I16_SPANS);
        // Per tile and token: rows 0–7 and 16–23 (unpacked low halves), 8–15 and 24–31.
        let mut acc = [[[zero; 2]; G]; R];
        while s < end {
            let off = s * PERM_SPAN_BYTES;
            if ahead > 0 && s.is_multiple_of(2) {
                // Two spans are five cache lines, into L2 (as the `lut` kernel).
                for p in src {
                    for l in 0..5 {
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off + 64 * l + ahead) as *const i8);
                    }
                }
            }
            let mut codes = [[zero; PERM_SPAN_GROUPS]; R];
            for i in 0..R {
                let v = [0, 1, 2, 3, 4].map(|k| _mm256_loadu_si256(src[i].add(off + 32 * k) as *const __m256i));
                codes[i] = perm_codes(v);
            }
            let toff = s * PERM_SPAN_GROUPS * PERM_GROUP_TABLE_BYTES;
            let mut part = [[[zero; 2]; G]; R];
            for k in 0..PERM_SPAN_GROUPS {
                for g in 0..G {
                    let t = tables[g].add(toff + k * PERM_GROUP_TABLE_BYTES);
                    let t_l = _mm256_loadu_si256(t as *const __m256i);
                    let t_h = _mm256_loadu_si256(t.add(32) as *const __m256i);
                    for i in 0..R {
                        part[i][g][0] = _mm256_add_epi8(part[i][g][0], _mm256_permutexvar_epi8(codes[i][k], t_l));
                        part[i][g][1] = _mm256_add_epi8(part[i][g][1], _mm256_permutexvar_epi8(codes[i][k], t_h));
                    }
                }
            }
            lut_widen_span(&part, &mut acc);
            s += 1;
        }
        for i in 0..R {
            for g in 0..G {
                let [a, b] = acc[i][g];
                let parts = [
                    _mm256_castsi256_si128(a),
                    _mm256_castsi256_si128(b),
                    _mm256_extracti128_si256::<1>(a),
                    _mm256_extracti128_si256::<1>(b),
                ];
                for (wd, p) in wide[i][g].iter_mut().zip(parts) {
                    *wd = _mm256_add_epi32(*wd, _mm256_cvtepi16_epi32(p));
                }
            }
        }
    }
    wide
}
