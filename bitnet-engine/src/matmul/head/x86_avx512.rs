//! The LM head at AVX-512: int8 rows and Q6_K row groups with VNNI `vpdpbusd`.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::activations::ActivationBatch;
use crate::formats::QK_K;
use crate::matmul::{finish_blocks, finish_tensor};
use crate::simd::x86_avx2::{prefetch_rows_l2, prefetch_stream};
use crate::simd::x86_avx512::*;

/// Int8-row matmul (LM head): codes `w + 128` × int8 tokens with `vpdpbusd`, minus 128·Σx.
pub(crate) fn int8_rows(
    _t: Avx512,
    m: &crate::formats::Int8Rows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    // SAFETY: the token proves AVX-512 VNNI support; rows and out were bounds-checked by
    // `int8_rows_matmul`, and code rows and tokens are both `stride` = padded K long.
    unsafe { int8_rows_impl(m, x, rows, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn int8_rows_impl(m: &crate::formats::Int8Rows, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    super::int8_rows_tiled::<Int8Avx512>(m, x, rows, out)
}

/// [`int8_tile`] as the shared driver's tile, with the accumulators per row and token that hide
/// vpdpbusd's latency: four for one row and one token, two where the tile has one row or one
/// token, else one.
struct Int8Avx512;

impl super::Int8Tile for Int8Avx512 {
    #[inline(always)]
    unsafe fn tile<const R: usize, const G: usize, const STREAM: bool>(
        m: &crate::formats::Int8Rows,
        r: usize,
        x: &ActivationBatch,
        b0: usize,
        out: &mut [f32],
    ) {
        if R == 1 && G == 1 {
            int8_tile::<R, G, 4, STREAM>(m, r, x, b0, out)
        } else if R == 1 || G == 1 {
            int8_tile::<R, G, 2, STREAM>(m, r, x, b0, out)
        } else {
            int8_tile::<R, G, 1, STREAM>(m, r, x, b0, out)
        }
    }
}

/// Rows `r..r+R` × tokens `b0..b0+G` of an int8-row matrix; writes `out[i × batch + b]`.
/// `STREAM`: see [`super::Int8Tile`].
#[inline(always)]
unsafe fn int8_tile<const R: usize, const G: usize, const A: usize, const STREAM: bool>(
    m: &crate::formats::Int8Rows,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    out: &mut [f32],
) {
    let batch = x.batch();
    let codes: [*const u8; R] = std::array::from_fn(|i| m.row_codes(r + i).as_ptr());
    let xs: [*const u8; G] = std::array::from_fn(|g| x.token(b0 + g).as_ptr() as *const u8);
    let mut acc = [[[_mm512_setzero_si512(); A]; G]; R];
    for (step, off) in (0..m.stride()).step_by(64).enumerate() {
        if STREAM {
            prefetch_rows_l2::<R>(codes[0], off, 64);
        }
        let c: [__m512i; R] = std::array::from_fn(|i| {
            if !STREAM {
                prefetch_stream(codes[i].add(off));
            }
            load(codes[i].add(off))
        });
        for g in 0..G {
            let xv = load(xs[g].add(off));
            for i in 0..R {
                acc[i][g][step % A] = _mm512_dpbusd_epi32(acc[i][g][step % A], c[i], xv);
            }
        }
    }
    for i in 0..R {
        for g in 0..G {
            let b = b0 + g;
            let isum = reduce_acc(&acc[i][g]) - 128 * x.sum(b);
            out[i * batch + b] = finish_tensor(isum, m.scale(r + i), x.scale(b));
        }
    }
}

/// How far ahead [`q6k_groups`] streams a group into L2: twice the other kernels'
/// `PREFETCH_L2_BYTES`, chosen from a sweep of 8 to 128 KiB on Zen 4 with 8 tokens streamed
/// (docs/perf-notes.md).
const Q6K_GROUP_PREFETCH_BYTES: usize = 32 * 1024;

/// Q6_K LM head in 16-row groups ([`crate::formats::Q6kRowGroups`]) × any number of tokens,
/// with VNNI: lane l of every vector is row l of the group, so per sub-block and token four
/// `vpdpbusd` (the token's 4 activations broadcast; the accumulator starts at its −32 × the
/// sub-block's column sum) and one `vpmulld` by the 16 rows' scales leave each row's exact
/// `scale × Σ (q − 32)·x` in its lane, with no rearranging or reducing; the codes are
/// assembled once per sub-block for up to 8 tokens. Results are the portable ones bit for bit:
/// each block's exact i32 sum (at most 16 · 128 · 16 · 32 · 128 = 2²⁷ in magnitude), times `d`
/// in f64 (exact), added in block order. Needs the tokens' offsets
/// ([`ActivationBatch::build_q6k_offsets`]).
pub(crate) fn q6k_groups(
    _t: Avx512,
    m: &crate::formats::Q6kRowGroups,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    assert!(x.q6k_offsets_ready() && x.padded_cols() == m.cols() && rows.end <= m.rows());
    assert!(out.len() >= rows.len() * batch);
    // SAFETY: the token proves AVX-512 F/BW/VL/VNNI (and AVX2, F16C); the asserts above give
    // every group `cols / 256` whole blocks, every token `cols` values and `cols / 16`
    // offsets, and `out` one value per row and token.
    unsafe { q6k_groups_impl(m, x, rows, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,popcnt,f16c")]
unsafe fn q6k_groups_impl(m: &crate::formats::Q6kRowGroups, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    use crate::formats::Q6K_GROUP_ROWS as GR;
    let batch = x.batch();
    if rows.is_empty() {
        return;
    }
    for g in rows.start / GR..rows.end.div_ceil(GR) {
        let mut b0 = 0;
        // Eight tokens per pass where there are eight; the first pass streams the group in,
        // later ones read it from L2.
        while b0 < batch {
            let first = b0 == 0;
            b0 += match batch - b0 {
                1 => q6k_group_tile::<1>(m, g, x, b0, &rows, out, first),
                2..=3 => q6k_group_tile::<2>(m, g, x, b0, &rows, out, first),
                4..=7 => q6k_group_tile::<4>(m, g, x, b0, &rows, out, first),
                _ => q6k_group_tile::<8>(m, g, x, b0, &rows, out, first),
            };
        }
    }
}

/// Group `g` × tokens `b0..b0 + G` into `out[(r − rows.start) × batch + b]` for its rows r in
/// `rows`; returns G. `stream`: also prefetch the group into L2 ahead.
#[inline(always)]
unsafe fn q6k_group_tile<const G: usize>(
    m: &crate::formats::Q6kRowGroups,
    g: usize,
    x: &ActivationBatch,
    b0: usize,
    rows: &Range<usize>,
    out: &mut [f32],
    stream: bool,
) -> usize {
    const BLOCK: usize = 16 * 192 + 256;
    let batch = x.batch();
    let nb = m.blocks_per_row();
    let base = m.group(g).as_ptr();
    let (x0, o0, n) = (x.tokens(b0..b0 + G).as_ptr() as *const u8, x.q6k_offsets(b0..b0 + G).as_ptr(), x.padded_cols());
    let mut xs = [x0; G];
    let mut offs = [o0; G];
    for t in 0..G {
        xs[t] = x0.add(t * n);
        offs[t] = o0.add(t * n / 16);
    }
    let (low4, high2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    // Token t's rows 0..8 and 8..16: Σ over blocks of d × the block's integer sum.
    let mut acc = [[_mm512_setzero_pd(); 2]; G];
    for blk in 0..nb {
        let p = base.add(blk * BLOCK);
        let mut isum = [_mm512_setzero_si512(); G];
        for j in 0..16 {
            if stream {
                // The demand reads shifted `Q6K_GROUP_PREFETCH_BYTES` ahead, one prefetch a line: the sub-block's
                // three lines of codes, a line of scales every fourth sub-block, a line of d's
                // every second block.
                let ahead = p.wrapping_add(Q6K_GROUP_PREFETCH_BYTES);
                for line in 0..3 {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(192 * j + 64 * line) as *const i8);
                }
                if j % 4 == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(3072 + 16 * j) as *const i8);
                }
                if j == 0 && blk % 2 == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(
                        base.wrapping_add(Q6K_GROUP_PREFETCH_BYTES + nb * BLOCK + 32 * blk) as *const i8
                    );
                }
            }
            let v = p.add(192 * j);
            let (a, b, h) = (load(v), load(v.add(64)), load(v.add(128)));
            let scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(3072 + 16 * j) as *const __m128i));
            // Codes of columns 4k..4k + 4: (low nibble) | (high bits at 4..6).
            let codes = [
                _mm512_ternarylogic_epi32::<0xEC>(a, _mm512_and_si512(_mm512_slli_epi16::<4>(h), high2), low4),
                _mm512_ternarylogic_epi32::<0xEC>(
                    _mm512_srli_epi16::<4>(a),
                    _mm512_and_si512(_mm512_slli_epi16::<2>(h), high2),
                    low4,
                ),
                _mm512_ternarylogic_epi32::<0xEC>(b, _mm512_and_si512(h, high2), low4),
                _mm512_ternarylogic_epi32::<0xEC>(
                    _mm512_srli_epi16::<4>(b),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(h), high2),
                    low4,
                ),
            ];
            for t in 0..G {
                let xp = xs[t].add(QK_K * blk + 16 * j);
                let mut s = _mm512_set1_epi32(*offs[t].add(16 * blk + j));
                for (k, c) in codes.iter().enumerate() {
                    let xk = _mm512_set1_epi32(std::ptr::read_unaligned(xp.add(4 * k) as *const i32));
                    s = _mm512_dpbusd_epi32(s, *c, xk);
                }
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s, scales));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(nb * BLOCK + 32 * blk) as *const __m256i));
        let (d_lo, d_hi) =
            (_mm512_cvtps_pd(_mm512_castps512_ps256(d)), _mm512_cvtps_pd(_mm512_extractf32x8_ps::<1>(d)));
        for t in 0..G {
            let (lo, hi) = (_mm512_castsi512_si256(isum[t]), _mm512_extracti64x4_epi64::<1>(isum[t]));
            acc[t][0] = _mm512_add_pd(acc[t][0], _mm512_mul_pd(d_lo, _mm512_cvtepi32_pd(lo)));
            acc[t][1] = _mm512_add_pd(acc[t][1], _mm512_mul_pd(d_hi, _mm512_cvtepi32_pd(hi)));
        }
    }
    let first_row = g * crate::formats::Q6K_GROUP_ROWS;
    for t in 0..G {
        let sums: [f64; 16] = std::mem::transmute(acc[t]);
        let scale = x.scale(b0 + t);
        for (l, s) in sums.iter().enumerate() {
            let r = first_row + l;
            if rows.contains(&r) {
                out[(r - rows.start) * batch + b0 + t] = finish_blocks(*s, scale);
            }
        }
    }
    G
}
