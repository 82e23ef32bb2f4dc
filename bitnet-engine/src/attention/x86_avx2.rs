//! Attention kernels at AVX2 (8 lanes, FMA, F16C), and the encoded-row kernels as portable
//! code compiled for AVX2.

use std::arch::x86_64::*;

use super::KeyElem;
use crate::simd::x86_avx2::*;

/// Eight key or value elements as f32 from `p` (f32, or f16 through F16C).
pub(crate) trait Lanes8: Copy {
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Lanes8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
}

impl Lanes8 for half::f16 {
    #[inline(always)]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// Attention scores without AVX-512: [`scores_impl`].
pub(crate) fn attention_scores<K: KeyElem>(_t: Avx2, q: &[f32], keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
    // SAFETY: the token proves AVX2 and F16C; `keys` holds `out.len()` rows of `q.len()`
    // (checked inside), and every load is inside a row.
    unsafe { scores_impl(q, keys, scale, out, ahead) }
}

/// The attention's weighted sum without AVX-512: [`axpy_impl`].
pub(crate) fn attention_axpy<K: KeyElem>(_t: Avx2, w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
    // SAFETY: as for the scores; `values` holds `w.len()` rows of `o.len()`.
    unsafe { axpy_impl(w, values, o, ahead) }
}

/// `out[p] = attention_dot(q, k_p) × scale`, bit-identical to the portable `attention_dot`: its
/// 16 lanes are two registers (lanes 0–7 and 8–15), each chunk's products are added in order
/// (one fused multiply-add each), and [`reduce16`] is its reduction tree. Head sizes that are not a multiple of 16 take
/// the portable loop.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_impl<K: KeyElem>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
    let hd = q.len();
    assert!(keys.len() >= out.len() * hd, "attention: fewer keys than scores");
    if !hd.is_multiple_of(16) {
        return super::attention_scores_portable(q, keys, scale, out);
    }
    let shares = PrefetchShares::new(ahead, out.len());
    for (p, o) in out.iter_mut().enumerate() {
        shares.issue(p);
        let k = keys.as_ptr().add(p * hd);
        let (mut a, mut b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..hd).step_by(16) {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), K::load8(k.add(i)), a);
            b = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8)), K::load8(k.add(i + 8)), b);
        }
        *o = reduce16(a, b) * scale;
    }
}

/// The fixed tree of `ops::reduce_lanes` over lanes `a` = 0–7, `b` = 8–15: l + l+8, l + l+4,
/// l + l+2, l + l+1.
#[inline(always)]
unsafe fn reduce16(a: __m256, b: __m256) -> f32 {
    let t = _mm256_add_ps(a, b);
    let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
    let c = _mm_add_ps(u, _mm_movehl_ps(u, u));
    _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps::<0b01>(c, c)))
}

/// `o[d] = fma(w[p], v_p[d], o[d])` for every p in order, as the portable loop,
/// with up to 64 outputs held in registers while the positions stream past. Head sizes that are
/// not a multiple of 8 take the portable loop.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_impl<K: KeyElem>(w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
    let hd = o.len();
    assert!(values.len() >= w.len() * hd, "attention: fewer values than weights");
    if !hd.is_multiple_of(8) {
        return super::attention_weighted_sum_portable(w, values, o);
    }
    for d0 in (0..hd).step_by(64) {
        match (hd - d0).min(64) / 8 {
            1 => axpy_block::<K, 1>(w, values, hd, d0, o, d0 == 0, ahead),
            2 => axpy_block::<K, 2>(w, values, hd, d0, o, d0 == 0, ahead),
            3 => axpy_block::<K, 3>(w, values, hd, d0, o, d0 == 0, ahead),
            4 => axpy_block::<K, 4>(w, values, hd, d0, o, d0 == 0, ahead),
            5 => axpy_block::<K, 5>(w, values, hd, d0, o, d0 == 0, ahead),
            6 => axpy_block::<K, 6>(w, values, hd, d0, o, d0 == 0, ahead),
            7 => axpy_block::<K, 7>(w, values, hd, d0, o, d0 == 0, ahead),
            _ => axpy_block::<K, 8>(w, values, hd, d0, o, d0 == 0, ahead),
        }
    }
}

/// Outputs `d0..d0 + 8C` of [`axpy_impl`]; the first block also asks for `ahead`.
#[inline(always)]
unsafe fn axpy_block<K: Lanes8, const C: usize>(
    w: &[f32],
    values: &[K],
    hd: usize,
    d0: usize,
    o: &mut [f32],
    first: bool,
    ahead: &[K],
) {
    let out = o.as_mut_ptr().add(d0);
    let mut acc: [__m256; C] = std::array::from_fn(|c| _mm256_loadu_ps(out.add(8 * c)));
    let shares = PrefetchShares::new(if first { ahead } else { &[] }, w.len());
    for (p, wp) in w.iter().enumerate() {
        shares.issue(p);
        let wv = _mm256_set1_ps(*wp);
        let v = values.as_ptr().add(p * hd + d0);
        for (c, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(wv, K::load8(v.add(8 * c)), *a);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(out.add(8 * c), *a);
    }
}

/// Scores of a group of query heads over one KV head's keys, one pass: [`scores_group_impl`].
pub(crate) fn attention_scores_group<K: KeyElem>(
    _t: Avx2,
    qs: &[f32],
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    n: usize,
    ahead: &[K],
) {
    // SAFETY: the token proves AVX2 and F16C; the sizes are checked inside and every load is
    // inside a key row or a query.
    unsafe {
        match out.len().checked_div(n).unwrap_or(0) {
            2 => scores_group_impl::<K, 2>(qs, keys, scale, out, n, ahead),
            4 => scores_group_impl::<K, 4>(qs, keys, scale, out, n, ahead),
            _ => super::attention_scores_group_portable(qs, keys, scale, out, n),
        }
    }
}

/// The weighted sums of a group of query heads over one KV head's values, one pass:
/// [`axpy_group_impl`].
pub(crate) fn attention_axpy_group<K: KeyElem>(
    _t: Avx2,
    ws: &[f32],
    n: usize,
    values: &[K],
    os: &mut [f32],
    hd: usize,
    ahead: &[K],
) {
    // SAFETY: as for the scores; `values` holds `n` rows of `hd`.
    unsafe {
        match os.len() / hd.max(1) {
            2 => axpy_group_impl::<K, 2>(ws, n, values, os, hd, ahead),
            4 => axpy_group_impl::<K, 4>(ws, n, values, os, hd, ahead),
            _ => super::attention_weighted_sum_group_portable(ws, n, values, os, hd),
        }
    }
}

/// [`scores_impl`] for G query heads (`qs`: G rows of hd) over the same keys: each key chunk is
/// loaded (and converted from f16) once for all G, and each head's lanes are the same products
/// added in the same order as [`scores_impl`]'s, so `out[g·n + p]` is bit-identical to head g
/// alone. Grouped-query attention reads a KV head once per step instead of once per query head.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_group_impl<K: KeyElem, const G: usize>(
    qs: &[f32],
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    n: usize,
    ahead: &[K],
) {
    let hd = qs.len() / G;
    assert!(qs.len() == G * hd && out.len() == G * n && keys.len() >= n * hd, "attention group: sizes");
    if !hd.is_multiple_of(16) {
        return super::attention_scores_group_portable(qs, keys, scale, out, n);
    }
    let shares = PrefetchShares::new(ahead, n);
    let q = qs.as_ptr();
    for p in 0..n {
        shares.issue(p);
        let k = keys.as_ptr().add(p * hd);
        let mut a = [_mm256_setzero_ps(); G];
        let mut b = [_mm256_setzero_ps(); G];
        for i in (0..hd).step_by(16) {
            let (k0, k1) = (K::load8(k.add(i)), K::load8(k.add(i + 8)));
            for g in 0..G {
                a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(g * hd + i)), k0, a[g]);
                b[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(g * hd + i + 8)), k1, b[g]);
            }
        }
        for g in 0..G {
            out[g * n + p] = reduce16(a[g], b[g]) * scale;
        }
    }
}

/// Positions per pass of [`axpy_group_impl`]: its values (64 KiB of f16 rows at hd 128) stay
/// in L2 while the passes over output columns re-read them.
const AXPY_GROUP_POSITIONS: usize = 256;

/// [`axpy_impl`] for G heads' weights (`ws`: G rows of n) over the same values (`os`: G rows of
/// hd): each value chunk is loaded once for all G heads, and every output element still gets
/// `fma(w[p], v_p[d], ·)` for p in order, so each head's output is
/// bit-identical to [`axpy_impl`]'s. Sixteen outputs (two chunks) of each of up to four heads
/// are held in registers; positions go in blocks of [`AXPY_GROUP_POSITIONS`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_group_impl<K: KeyElem, const G: usize>(
    ws: &[f32],
    n: usize,
    values: &[K],
    os: &mut [f32],
    hd: usize,
    ahead: &[K],
) {
    assert!(ws.len() == G * n && os.len() == G * hd && values.len() >= n * hd, "attention group: sizes");
    if !hd.is_multiple_of(16) {
        return super::attention_weighted_sum_group_portable(ws, n, values, os, hd);
    }
    let shares = PrefetchShares::new(ahead, n);
    let (w, o) = (ws.as_ptr(), os.as_mut_ptr());
    let mut p0 = 0;
    while p0 < n {
        let p1 = n.min(p0 + AXPY_GROUP_POSITIONS);
        for d0 in (0..hd).step_by(16) {
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for g in 0..G {
                acc[g][0] = _mm256_loadu_ps(o.add(g * hd + d0));
                acc[g][1] = _mm256_loadu_ps(o.add(g * hd + d0 + 8));
            }
            for p in p0..p1 {
                if d0 == 0 {
                    shares.issue(p);
                }
                let v = values.as_ptr().add(p * hd + d0);
                let (v0, v1) = (K::load8(v), K::load8(v.add(8)));
                for g in 0..G {
                    let wv = _mm256_set1_ps(*w.add(g * n + p));
                    acc[g][0] = _mm256_fmadd_ps(wv, v0, acc[g][0]);
                    acc[g][1] = _mm256_fmadd_ps(wv, v1, acc[g][1]);
                }
            }
            for g in 0..G {
                _mm256_storeu_ps(o.add(g * hd + d0), acc[g][0]);
                _mm256_storeu_ps(o.add(g * hd + d0 + 8), acc[g][1]);
            }
        }
        p0 = p1;
    }
}

// The encoded-row attention's portable code at 8 lanes (see `widest_compiled!`).
compiled_for! {
    Avx2, "avx2,fma,f16c";
    attention_scores_encoded(precision: super::KvPrecision, q: &[f32], keys: &[u8], scale: f32, out: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_scores_encoded_portable;
    attention_weighted_sum_encoded(precision: super::KvPrecision, w: &[f32], values: &[u8], o: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_weighted_sum_encoded_portable;
    decode_kv_rows(precision: super::KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) =
        super::decode_kv_rows_portable;
}
