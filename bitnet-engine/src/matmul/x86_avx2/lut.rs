//! The table-lookup TQ1 kernel at AVX2 (`lut` form): each weight group indexes the token's precomputed sums.

use super::*;

/// Spans summed in i16 lanes before they are widened: a lane takes one group per pair, eight
/// per span, each a looked-up sum or its complement in [−384 − 33, 384], so eight spans stay
/// within 64 · 417 = 26 688.
pub(super) const LUT_I16_SPANS: usize = 8;

/// The table-lookup TQ1 kernel (see `formats::tq1_lut`). One token: two 16-row tiles per pass
/// where the range has them, sharing each table load. More tokens: one tile against up to
/// [`LUT_TOKENS`] tokens per pass, sharing each pattern index and sign mask. Rows outside
/// `rows` of a tile the range only partly covers are computed and dropped. Shared with the
/// AVX-512 level (which implies AVX2) where the CPU lacks GFNI; with it, that level runs this
/// loop with [`LutSigns`] from AVX-512 masks.
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
pub(crate) unsafe fn tq1_lut(
    w: &Tq1LutMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    tq1_lut_with::<CompareSigns>(w, x, tables, rows, out)
}

/// How a table-lookup tile gets each pair's pattern indices and negates its negated groups:
/// the operations that differ between AVX2 ([`CompareSigns`]) and AVX-512 with GFNI
/// (`x86_avx512::MaskSigns`), which do them in fewer vector operations.
pub(crate) trait LutSigns {
    /// Which byte lanes of a pair are negated.
    type Neg: Copy;
    /// Pair `pair`'s negated lanes from the span's sign vector (`sign`: bit 7 − pair of each
    /// byte, see `formats::tq1_lut`; an implementation may shift it along, pair by pair).
    unsafe fn negated(sign: &mut __m256i, pair: usize) -> Self::Neg;
    /// `v` with the negated lanes complemented (`!v = −v − 1`).
    unsafe fn complement(v: __m256i, neg: Self::Neg) -> __m256i;
    /// The high nibble of every byte, in its low four bits.
    unsafe fn high_nibble(v: __m256i) -> __m256i;
}

/// AVX2: the pair's sign is bit 7, spread over the byte by `vpcmpgtb` against zero, and the
/// byte doubled for the next pair; negation is an XOR with that mask.
pub(crate) struct CompareSigns;

impl LutSigns for CompareSigns {
    type Neg = __m256i;
    #[inline(always)]
    unsafe fn negated(sign: &mut __m256i, _pair: usize) -> __m256i {
        let neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), *sign);
        *sign = _mm256_add_epi8(*sign, *sign);
        neg
    }
    #[inline(always)]
    unsafe fn complement(v: __m256i, neg: __m256i) -> __m256i {
        _mm256_xor_si256(v, neg)
    }
    #[inline(always)]
    unsafe fn high_nibble(v: __m256i) -> __m256i {
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), _mm256_set1_epi8(0x0f))
    }
}

/// [`tq1_lut`]'s loop, for the caller's target features and sign operations.
#[inline(always)]
pub(crate) unsafe fn tq1_lut_with<S: LutSigns>(
    w: &Tq1LutMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    let (first, end) = (rows.start / LUT_TILE_ROWS, rows.end.div_ceil(LUT_TILE_ROWS));
    let spans = w.spans();
    let lr = LookupRows { scales: w.row_scales(), negated: w.negated_counts() };
    let r0 = |t: usize| t * LUT_TILE_ROWS;
    let mut t = first;
    while t < end {
        if batch == 1 {
            let table = [tables.token(0).as_ptr()];
            if t + 2 <= end {
                let sums = lut_tiles::<S, 2, 1>([w.tile(t).as_ptr(), w.tile(t + 1).as_ptr()], table, spans, true);
                lut_emit(lr, x, &rows, out, r0(t), 0, &sums[0][0]);
                lut_emit(lr, x, &rows, out, r0(t + 1), 0, &sums[1][0]);
                t += 2;
            } else {
                let sums = lut_tiles::<S, 1, 1>([w.tile(t).as_ptr()], table, spans, true);
                lut_emit(lr, x, &rows, out, r0(t), 0, &sums[0][0]);
                t += 1;
            }
            continue;
        }
        let src = [w.tile(t).as_ptr()];
        let mut b0 = 0;
        while b0 < batch {
            let g = LUT_TOKENS.min(batch - b0);
            let tb = |i: usize| tables.token(b0 + i.min(g - 1)).as_ptr();
            // Only the first pass over a tile streams it from memory; later ones hit L1/L2.
            let prefetch = b0 == 0;
            let mut sums = [[_mm256_setzero_si256(); 2]; LUT_TOKENS];
            match g {
                1 => sums[..1].copy_from_slice(&lut_tiles::<S, 1, 1>(src, [tb(0)], spans, prefetch)[0]),
                2 => sums[..2].copy_from_slice(&lut_tiles::<S, 1, 2>(src, [tb(0), tb(1)], spans, prefetch)[0]),
                3 => sums[..3].copy_from_slice(&lut_tiles::<S, 1, 3>(src, [tb(0), tb(1), tb(2)], spans, prefetch)[0]),
                _ => sums = lut_tiles::<S, 1, LUT_TOKENS>(src, std::array::from_fn(tb), spans, prefetch)[0],
            }
            for (i, s) in sums[..g].iter().enumerate() {
                lut_emit(lr, x, &rows, out, r0(t), b0 + i, s);
            }
            b0 += g;
        }
        t += 1;
    }
}

/// Token b's outputs of tile `tile`'s rows that lie in `rows` ([`tq1_lut_with`]'s epilogue). A
/// function, not a closure in its caller: a closure does not take the target features of the
/// function it is inlined into, and `tq1_lut_with` has none of its own (its wrappers do), so
/// the intrinsics in a closure there were left as calls.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn lut_emit(
    w: LookupRows,
    x: &ActivationBatch,
    rows: &Range<usize>,
    out: &mut [f32],
    r0: usize,
    b: usize,
    sums: &[__m256i],
) {
    // Rows of the tile: 16 (`lut`) or 32 (`perm`).
    const MAX_ROWS: usize = 32;
    let n = 8 * sums.len();
    debug_assert!(n <= MAX_ROWS);
    let batch = x.batch();
    if rows.start <= r0 && r0 + n <= rows.end {
        if batch == 1 {
            let o = out[r0 - rows.start..r0 - rows.start + n].as_mut_ptr();
            for (h, v) in sums.iter().enumerate() {
                lut_finish8(w, r0 + 8 * h, *v, x.scale(0), o.add(8 * h));
            }
        } else {
            // Token b's outputs lie `batch` apart: made in vectors as for one token, then
            // stored one by one (the scalar epilogue cost 12–15% of a batched tile's time).
            let mut row_out = [0f32; MAX_ROWS];
            for (h, v) in sums.iter().enumerate() {
                lut_finish8(w, r0 + 8 * h, *v, x.scale(b), row_out.as_mut_ptr().add(8 * h));
            }
            for (o, v) in out[(r0 - rows.start) * batch + b..].iter_mut().step_by(batch).zip(&row_out[..n]) {
                *o = *v;
            }
        }
        return;
    }
    let mut s = [0i32; MAX_ROWS];
    for (h, v) in sums.iter().enumerate() {
        _mm256_storeu_si256(s.as_mut_ptr().add(8 * h) as *mut __m256i, *v);
    }
    for (j, &sum) in s[..n].iter().enumerate() {
        let r = r0 + j;
        if rows.contains(&r) {
            let dot = sum + LUT_NEGATION_BIAS * w.negated[r];
            out[(r - rows.start) * batch + b] = finish_blocks(f16_to_f64(w.scales[r]) * dot as f64, x.scale(b));
        }
    }
}

/// What a table-lookup kernel's epilogue reads of its repacked matrix: each row's scale and
/// count of negated groups (`Tq1LutMatrix` and `Tq1PermMatrix` alike).
#[derive(Clone, Copy)]
pub(crate) struct LookupRows<'a> {
    pub(crate) scales: &'a [half::f16],
    pub(crate) negated: &'a [i32],
}

/// One token's outputs of rows `r..r+8` (all in the caller's range) from their sums, in
/// vectors: the same operations as `finish_blocks(f16_to_f64(d) × (sum + 33·negated) as f64,
/// x_scale)` row by row (f16 → f32 → f64 exactly, one f64 product, one rounding to f32, one f32
/// product). Done one row at a time, this epilogue had cost about 10 cycles a row, 5–8% of a
/// 2560-wide row's lookups. The batched path runs it per token too, its caller storing the
/// 16 outputs `batch` apart.
#[inline(always)]
pub(super) unsafe fn lut_finish8(w: LookupRows, r: usize, sums: __m256i, x_scale: f32, out: *mut f32) {
    let negated = load(w.negated[r..r + 8].as_ptr() as *const u8);
    let dot = _mm256_add_epi32(sums, _mm256_mullo_epi32(negated, _mm256_set1_epi32(LUT_NEGATION_BIAS)));
    let d = _mm256_cvtph_ps(_mm_loadu_si128(w.scales[r..r + 8].as_ptr() as *const __m128i));
    let xs = _mm_set1_ps(x_scale);
    for h in 0..2 {
        let (dh, doth) = if h == 0 {
            (_mm256_castps256_ps128(d), _mm256_castsi256_si128(dot))
        } else {
            (_mm256_extractf128_ps::<1>(d), _mm256_extracti128_si256::<1>(dot))
        };
        let acc = _mm256_mul_pd(_mm256_cvtps_pd(dh), _mm256_cvtepi32_pd(doth));
        _mm_storeu_ps(out.add(4 * h), _mm_mul_ps(_mm256_cvtpd_ps(acc), xs));
    }
}

/// Tokens per pass of the batched table-lookup tile.
pub(super) const LUT_TOKENS: usize = 4;

/// Σ over every span of R tiles (`src[i]`: the tile's bytes) against G tokens' tables: for
/// each group pair, `vpshufb` looks up the 16 rows' patterns in the pair's l and h tables (lane
/// half h holds group 2P + h), the sign mask complements negated ones, and the bytes are added
/// in i8 lanes over the span's eight pairs (`tq1_lut`: both parts are small enough). Once per
/// span, unpacking l with h bytes and `vpmaddubsw` by (1, 32) give each lane's i16 sum (rows
/// 0–7 from the low halves of each lane, rows 8–15 from the high), added into two accumulators
/// per tile and token. Per pair this is 2 ops fewer than widening every lookup to i16. Returns
/// each tile's and token's row sums as i32 vectors (rows 0–7, rows 8–15), with every negated
/// group counted as −v − 33 (the caller adds `LUT_NEGATION_BIAS` × the row's negated count).
#[inline(always)]
pub(super) unsafe fn lut_tiles<S: LutSigns, const R: usize, const G: usize>(
    src: [*const u8; R],
    tables: [*const u8; G],
    spans: usize,
    prefetch: bool,
) -> [[[__m256i; 2]; G]; R] {
    let low4 = _mm256_set1_epi8(0x0f);
    let zero = _mm256_setzero_si256();
    // Per tile and token: even and odd i16 words of the rows-0–7 and rows-8–15 accumulators,
    // widened to i32.
    let mut wide = [[[zero; 4]; G]; R];
    let mut s = 0;
    while s < spans {
        let end = spans.min(s + LUT_I16_SPANS);
        let mut acc = [[[zero; 2]; G]; R];
        while s < end {
            let off = s * LUT_SPAN_BYTES;
            if prefetch && s % 2 == 0 {
                // Two spans are five cache lines. Into L2 only: the L1 requests of
                // `prefetch_stream` cost 1–2% here (in cache and streaming); the hardware
                // prefetcher brings the lines on into L1.
                for i in 0..R {
                    for l in 0..5 {
                        let p = src[i].wrapping_add(off + 64 * l + PREFETCH_L2_BYTES);
                        _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
                    }
                }
            }
            let toff = s * LUT_SPAN_GROUPS / 2 * LUT_PAIR_TABLE_BYTES;
            // Pair p's sign is bit 7 − p of each byte (`S::negated`): with AVX2 the signs are
            // doubled after each pair, so the current pair's is always bit 7, which `vpcmpgtb`
            // against zero spreads over the byte: two ops per pair. (Pairs in descending order
            // with bit p instead cost 40% at 4 tokens × 6912 columns: the tables, read
            // backwards, were not prefetched.)
            let mut sign = [zero; R];
            for i in 0..R {
                sign[i] = load(src[i].add(off + 128));
            }
            // Per tile and token: the span's l sums and h sums, in i8 lanes.
            let mut part = [[[zero; 2]; G]; R];
            for v in 0..4 {
                let mut nib = [zero; R];
                for i in 0..R {
                    nib[i] = load(src[i].add(off + 32 * v));
                }
                for half in 0..2 {
                    let pair = 2 * v + half;
                    let mut idx = [zero; R];
                    let mut neg = [S::negated(&mut sign[0], pair); R];
                    for i in 0..R {
                        idx[i] = if half == 0 { _mm256_and_si256(nib[i], low4) } else { S::high_nibble(nib[i]) };
                        if i > 0 {
                            neg[i] = S::negated(&mut sign[i], pair);
                        }
                    }
                    for g in 0..G {
                        let t_l = load(tables[g].add(toff + pair * LUT_PAIR_TABLE_BYTES));
                        let t_h = load(tables[g].add(toff + pair * LUT_PAIR_TABLE_BYTES + 32));
                        for i in 0..R {
                            let l = S::complement(_mm256_shuffle_epi8(t_l, idx[i]), neg[i]);
                            let h = S::complement(_mm256_shuffle_epi8(t_h, idx[i]), neg[i]);
                            part[i][g][0] = _mm256_add_epi8(part[i][g][0], l);
                            part[i][g][1] = _mm256_add_epi8(part[i][g][1], h);
                        }
                    }
                }
            }
            lut_widen_span(&part, &mut acc);
            s += 1;
        }
        for i in 0..R {
            for g in 0..G {
                for a in 0..2 {
                    let even = _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(acc[i][g][a]));
                    wide[i][g][2 * a] = _mm256_add_epi32(wide[i][g][2 * a], even);
                    let odd = _mm256_srai_epi32::<16>(acc[i][g][a]);
                    wide[i][g][2 * a + 1] = _mm256_add_epi32(wide[i][g][2 * a + 1], odd);
                }
            }
        }
    }
    // Word w of accumulator a (a = 0: rows 0–7, 1: rows 8–15) is row 8a + w % 8 of lane half
    // w / 8; its i32 lane e in `wide[2a + odd]` is word 2e + odd: row 8a + 2(e % 4) + odd, half
    // e / 4. A row's sum is its two halves; interleaving the even and odd rows' puts rows in order.
    let mut sums = [[[_mm256_setzero_si256(); 2]; G]; R];
    for i in 0..R {
        for g in 0..G {
            for a in 0..2 {
                let half_sum = |v: __m256i| _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                let (even, odd) = (half_sum(wide[i][g][2 * a]), half_sum(wide[i][g][2 * a + 1]));
                sums[i][g][a] = _mm256_set_m128i(_mm_unpackhi_epi32(even, odd), _mm_unpacklo_epi32(even, odd));
            }
        }
    }
    sums
}

/// Once per span of a lookup tile (`lut` and `perm`): each tile's and token's l and h sums in
/// i8 lanes, unpacked into (l, h) byte pairs, and `vpmaddubsw` by (1, 32) give i16 sums
/// `l + 32h`, added into the accumulators of the low and the high unpack halves.
#[inline(always)]
pub(crate) unsafe fn lut_widen_span<const R: usize, const G: usize>(
    part: &[[[__m256i; 2]; G]; R],
    acc: &mut [[[__m256i; 2]; G]; R],
) {
    // Bytes (1, LUT_H_WEIGHT) per word: `vpmaddubsw` of an unpacked (l, h) pair is l + 32h.
    let join = _mm256_set1_epi16((LUT_H_WEIGHT << 8) | 1);
    for i in 0..R {
        for g in 0..G {
            let [l, h] = part[i][g];
            let lo = _mm256_maddubs_epi16(join, _mm256_unpacklo_epi8(l, h));
            let hi = _mm256_maddubs_epi16(join, _mm256_unpackhi_epi8(l, h));
            acc[i][g][0] = _mm256_add_epi16(acc[i][g][0], lo);
            acc[i][g][1] = _mm256_add_epi16(acc[i][g][1], hi);
        }
    }
}
