//! Attention over the KV cache: the precisions its rows are stored in ([`KvPrecision`]) and
//! the score and weighted-sum kernels over f32, f16 and encoded rows, one head or a
//! grouped-query group at a time, at the widest ISA the CPU has. Every path computes the
//! forward pass's fixed-order float arithmetic (`ops::portable::attention_dot`), so results are
//! identical at every level.

mod precision;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

pub use precision::KvPrecision;

use crate::simd::prefetch_l2;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx512::Avx512;

/// Attention scores `out[p] = attention_dot(q, k_p) × scale` for `out.len()` keys stored as
/// rows of `q.len()` (f32 or f16). `attention_dot` is the fixed-order dot product of the
/// forward pass (16 lanes, a correctly rounded fused multiply-add per product, a fixed reduction
/// tree), so every ISA gives identical results.
/// `ahead` (the rows the next step reads; may be empty) is asked for in L2 a share at a time
/// while the keys are read, so that the memory keeps streaming under the arithmetic.
pub(crate) fn attention_scores<K: KeyElem>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        return x86_avx512::attention_scores(t, q, keys, scale, out, ahead);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx2::new() {
        return x86_avx2::attention_scores(t, q, keys, scale, out, ahead);
    }
    let _ = ahead;
    attention_scores_portable(q, keys, scale, out)
}

/// The portable scores: each key row converted to f32 as a whole (f16 with the slice
/// conversion, vectorized where the CPU has F16C; one value at a time, this loop had run far
/// slower than the AVX-512 kernel), then `attention_dot`.
fn attention_scores_portable<K: KeyElem>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let mut row = [0f32; MAX_HEAD_DIM];
    for (p, o) in out.iter_mut().enumerate() {
        let kf = &mut row[..hd];
        K::row_to_f32(&keys[p * hd..(p + 1) * hd], kf);
        *o = crate::ops::portable::attention_dot(q, kf) * scale;
    }
}

/// Scores of the `heads` query heads of one grouped-query group (`qs`: `heads` rows of hd) over
/// their shared keys: `out[g·n + p]` = [`attention_scores`] of head g (n = `out.len() / heads`),
/// bit for bit. With AVX-512 or AVX2 one pass over the keys serves up to four heads of the
/// group, so a KV head is read (and converted from f16) once per step instead of once per query
/// head.
pub(crate) fn attention_scores_group<K: KeyElem>(
    qs: &[f32],
    heads: usize,
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    ahead: &[K],
) {
    let (hd, n) = (qs.len() / heads, out.len() / heads);
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        return x86_avx512::attention_scores_group(t, qs, heads, keys, scale, out, ahead);
    } else if let Some(t) = Avx2::new() {
        return x86_avx2::attention_scores_group(t, qs, keys, scale, out, n, ahead);
    }
    // n.max(1): no positions is no scores to write (chunks of 0 would panic).
    for (g, (q, o)) in qs.chunks_exact(hd).zip(out.chunks_exact_mut(n.max(1))).enumerate() {
        attention_scores(q, keys, scale, o, if g == 0 { ahead } else { &[] });
    }
}

/// The definition of [`attention_scores_group`]: each head on its own.
pub(crate) fn attention_scores_group_portable<K: KeyElem>(
    qs: &[f32],
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    n: usize,
) {
    if n == 0 {
        return;
    }
    let hd = qs.len() / (out.len() / n);
    for (q, o) in qs.chunks_exact(hd).zip(out.chunks_exact_mut(n)) {
        attention_scores_portable(q, keys, scale, o);
    }
}

/// The weighted sums of the `heads` heads of one group over their shared values (`ws`: `heads`
/// rows of n weights; `os`: `heads` rows of hd): each head's `os` row as
/// [`attention_weighted_sum`] leaves it, bit for bit, in one pass over the values (AVX-512 and
/// AVX2; see [`attention_scores_group`]).
pub(crate) fn attention_weighted_sum_group<K: KeyElem>(
    ws: &[f32],
    heads: usize,
    values: &[K],
    os: &mut [f32],
    ahead: &[K],
) {
    let (n, hd) = (ws.len() / heads, os.len() / heads);
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        return x86_avx512::attention_axpy_group(t, ws, heads, values, os, ahead);
    } else if let Some(t) = Avx2::new() {
        return x86_avx2::attention_axpy_group(t, ws, n, values, os, hd, ahead);
    }
    for (g, (w, o)) in ws.chunks_exact(n.max(1)).zip(os.chunks_exact_mut(hd)).enumerate() {
        attention_weighted_sum(&w[..n], values, o, if g == 0 { ahead } else { &[] });
    }
}

/// The definition of [`attention_weighted_sum_group`]: each head on its own.
pub(crate) fn attention_weighted_sum_group_portable<K: KeyElem>(
    ws: &[f32],
    n: usize,
    values: &[K],
    os: &mut [f32],
    hd: usize,
) {
    if hd == 0 {
        return;
    }
    for (g, o) in os.chunks_exact_mut(hd).enumerate() {
        attention_weighted_sum_portable(&ws[g * n..(g + 1) * n], values, o);
    }
}

/// The largest head size the portable attention's stack row holds (a model config above it is
/// rejected when loaded).
pub(crate) const MAX_HEAD_DIM: usize = 512;

/// `o[d] = fma(w[p], v_p[d], o[d])` for every position p in order: the attention
/// output, identical at every ISA level. `ahead` as in [`attention_scores`].
pub(crate) fn attention_weighted_sum<K: KeyElem>(w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        return x86_avx512::attention_axpy(t, w, values, o, ahead);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx2::new() {
        return x86_avx2::attention_axpy(t, w, values, o, ahead);
    }
    let _ = ahead;
    attention_weighted_sum_portable(w, values, o)
}

/// The portable weighted sum, each value row converted as a whole first (see
/// [`attention_scores_portable`]); one fused multiply-add per element, as the SIMD kernels.
fn attention_weighted_sum_portable<K: KeyElem>(w: &[f32], values: &[K], o: &mut [f32]) {
    let hd = o.len();
    let mut row = [0f32; MAX_HEAD_DIM];
    for (p, wp) in w.iter().enumerate() {
        let vf = &mut row[..hd];
        K::row_to_f32(&values[p * hd..(p + 1) * hd], vf);
        for (a, v) in o.iter_mut().zip(vf.iter()) {
            *a = wp.mul_add(*v, *a);
        }
    }
}

/// Attention scores over keys stored encoded (`KvRows::Encoded`: `precision.bytes_per_vector(
/// q.len())` bytes each): `out[p] = attention_dot(q, decode(k_p)) × scale`, the decode of
/// [`KvPrecision::decode`] and the `attention_dot` of the forward pass, so the same floats as decoding
/// position by position; one call per head, compiled for the widest ISA the CPU has: rows are
/// decoded a chunk at a time into `buf` ([`ENCODED_CHUNK_VALUES`] long), then go through the f32
/// kernel. Decoded one vector per call through the dispatching `decode` at baseline x86-64, with
/// nothing prefetched, quantized caches had decoded several times slower than f16 (Zen 3 and
/// Zen 5: docs/perf-notes.md). `ahead` (encoded rows read next; may be empty) is asked for in
/// L2 a vector's share per position.
pub(crate) fn attention_scores_encoded(
    precision: KvPrecision,
    q: &[f32],
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    widest_compiled!(
        attention_scores_encoded,
        attention_scores_encoded_portable,
        precision,
        q,
        keys,
        scale,
        out,
        ahead,
        buf
    )
}

/// `o[d] += w[p] × decode(v_p)[d]` for every position p in order over values stored encoded
/// (see [`attention_scores_encoded`]): the multiply-then-add of [`attention_weighted_sum`].
pub(crate) fn attention_weighted_sum_encoded(
    precision: KvPrecision,
    w: &[f32],
    values: &[u8],
    o: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    widest_compiled!(
        attention_weighted_sum_encoded,
        attention_weighted_sum_encoded_portable,
        precision,
        w,
        values,
        o,
        ahead,
        buf
    )
}

/// Whether [`attention_scores_group_encoded`] and [`attention_weighted_sum_group_encoded`] read
/// each row once for the whole group on this CPU (AVX-512's row readers), rather than head by
/// head: where they do not, grouping the heads saves nothing.
pub(crate) fn encoded_groups_read_once() -> bool {
    #[cfg(target_arch = "x86_64")]
    if Avx512::new().is_some() {
        return true;
    }
    false
}

/// The scores of the `heads` query heads of one grouped-query group (`qs`: `heads` rows of hd)
/// over their shared encoded keys (`n` rows of `precision.bytes_per_vector(hd)` bytes) into
/// `out` (`heads` rows of n): each head's row as [`attention_scores_encoded`] makes it, bit for
/// bit. On AVX-512 the rows are read and decoded once for the group (2B4T: four heads a KV
/// head); elsewhere head by head.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_scores_group_encoded(
    precision: KvPrecision,
    qs: &[f32],
    heads: usize,
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        if x86_avx512::attention_scores_group_encoded(t, precision, qs, heads, keys, scale, out, ahead).is_some() {
            return;
        }
    }
    let (hd, n) = (qs.len() / heads, out.len() / heads);
    // n.max(1): no positions is no scores to write (chunks of 0 would panic).
    for (g, (q, o)) in qs.chunks_exact(hd.max(1)).zip(out.chunks_exact_mut(n.max(1))).enumerate() {
        attention_scores_encoded(precision, q, keys, scale, o, if g == 0 { ahead } else { &[] }, buf);
    }
}

/// The weighted sums of the `heads` heads of one group over their shared encoded values (`ws`:
/// `heads` rows of n; `os`: `heads` rows of hd), each as [`attention_weighted_sum_encoded`]
/// leaves it, bit for bit (see [`attention_scores_group_encoded`]).
pub(crate) fn attention_weighted_sum_group_encoded(
    precision: KvPrecision,
    ws: &[f32],
    heads: usize,
    values: &[u8],
    os: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        if x86_avx512::attention_weighted_sum_group_encoded(t, precision, ws, heads, values, os, ahead).is_some() {
            return;
        }
    }
    let (n, hd) = (ws.len() / heads, os.len() / heads);
    for (g, (w, o)) in ws.chunks_exact(n.max(1)).zip(os.chunks_exact_mut(hd.max(1))).enumerate() {
        attention_weighted_sum_encoded(precision, w, values, o, if g == 0 { ahead } else { &[] }, buf);
    }
}

/// Calls `$f` with the precision as a constant, so that the inlined `decode` keeps one arm.
macro_rules! with_const_precision {
    ($p:expr, $f:ident($($arg:expr),*)) => {
        match $p {
            KvPrecision::F32 => $f(KvPrecision::F32, $($arg),*),
            KvPrecision::F16 => $f(KvPrecision::F16, $($arg),*),
            KvPrecision::Bf16 => $f(KvPrecision::Bf16, $($arg),*),
            KvPrecision::Fp8 => $f(KvPrecision::Fp8, $($arg),*),
            KvPrecision::Int8 => $f(KvPrecision::Int8, $($arg),*),
            KvPrecision::Int4 => $f(KvPrecision::Int4, $($arg),*),
            KvPrecision::Int2 => $f(KvPrecision::Int2, $($arg),*),
        }
    };
}

/// f32 values the encoded attention decodes before it runs the f32 kernel over them: the length
/// of the `buf` it is given (16 KiB: in L1 beside the keys' lines; the caller's, so that no call
/// zeroes a stack array of that size).
pub(crate) const ENCODED_CHUNK_VALUES: usize = 4096;
const _: () = assert!(ENCODED_CHUNK_VALUES >= MAX_HEAD_DIM);

/// Decodes the vectors of `rows` (`vb` bytes each) into `buf` (one `hd` row each), asking for
/// `ahead`'s share of each vector in L2 as it goes.
#[inline(always)]
fn decode_rows(p: KvPrecision, rows: &[u8], vb: usize, hd: usize, buf: &mut [f32], ahead: &[u8], first: usize) {
    for (i, (r, f)) in rows.chunks_exact(vb).zip(buf.chunks_exact_mut(hd)).enumerate() {
        if let Some(a) = ahead.get((first + i) * vb..(first + i + 1) * vb) {
            prefetch_l2(a);
        }
        p.decode(r, f);
    }
}

/// Decodes encoded KV vectors (`precision.bytes_per_vector(hd)` bytes each) into `dst` (one `hd`
/// row each), as [`KvPrecision::decode`] would one at a time, compiled for the widest ISA the
/// CPU has: for a prompt's attention, which decodes each head's rows once for all its query rows.
pub(crate) fn decode_kv_rows(precision: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) {
    widest_compiled!(decode_kv_rows, decode_kv_rows_portable, precision, bytes, hd, dst)
}

#[inline(always)]
pub(crate) fn decode_kv_rows_portable(precision: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) {
    #[inline(always)]
    fn each(p: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) {
        decode_rows(p, bytes, p.bytes_per_vector(hd), hd, dst, &[], 0);
    }
    with_const_precision!(precision, each(bytes, hd, dst))
}

#[inline(always)]
pub(crate) fn attention_scores_encoded_portable(
    precision: KvPrecision,
    q: &[f32],
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    // Decoded in chunks of rows (the decode vectorizes for a constant precision), then the f32
    // scores kernel over each chunk: the same floats as one key at a time.
    #[inline(always)]
    fn each(p: KvPrecision, q: &[f32], keys: &[u8], scale: f32, out: &mut [f32], ahead: &[u8], buf: &mut [f32]) {
        let hd = q.len();
        let (vb, per) = (p.bytes_per_vector(hd), buf.len() / hd);
        for (c, o) in out.chunks_mut(per).enumerate() {
            let rows = &keys[c * per * vb..(c * per + o.len()) * vb];
            let kf = &mut buf[..o.len() * hd];
            decode_rows(p, rows, vb, hd, kf, ahead, c * per);
            attention_scores::<f32>(q, kf, scale, o, &[]);
        }
    }
    with_const_precision!(precision, each(q, keys, scale, out, ahead, buf))
}

#[inline(always)]
pub(crate) fn attention_weighted_sum_encoded_portable(
    precision: KvPrecision,
    w: &[f32],
    values: &[u8],
    o: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    // As the scores: chunks of decoded rows through the f32 weighted sum, in position order.
    #[inline(always)]
    fn each(p: KvPrecision, w: &[f32], values: &[u8], o: &mut [f32], ahead: &[u8], buf: &mut [f32]) {
        let hd = o.len();
        let (vb, per) = (p.bytes_per_vector(hd), buf.len() / hd);
        for (c, wc) in w.chunks(per).enumerate() {
            let rows = &values[c * per * vb..(c * per + wc.len()) * vb];
            let vf = &mut buf[..wc.len() * hd];
            decode_rows(p, rows, vb, hd, vf, ahead, c * per);
            attention_weighted_sum::<f32>(wc, vf, o, &[]);
        }
    }
    with_const_precision!(precision, each(w, values, o, ahead, buf))
}

/// The register loads every compiled ISA's kernels need from a KV element type (each ISA file
/// defines its own: `x86_avx2::Lanes8`, `x86_avx512::Lanes16`).
#[cfg(target_arch = "x86_64")]
pub(crate) trait SimdLanes: x86_avx2::Lanes8 + x86_avx512::Lanes16 {}
#[cfg(target_arch = "x86_64")]
impl<T: x86_avx2::Lanes8 + x86_avx512::Lanes16> SimdLanes for T {}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait SimdLanes {}
#[cfg(not(target_arch = "x86_64"))]
impl<T> SimdLanes for T {}

/// Element types of cached keys and values that attention reads in place (f32, f16): the
/// kernels are generic over it, through each ISA's loads ([`SimdLanes`]) and, for the portable
/// path, a row's conversion to f32.
pub(crate) trait KeyElem: Copy + SimdLanes {
    /// `dst[i] = src[i]` as f32, exactly (`dst.len() == src.len()`).
    fn row_to_f32(src: &[Self], dst: &mut [f32]);
}

impl KeyElem for f32 {
    #[inline(always)]
    fn row_to_f32(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KeyElem for half::f16 {
    #[inline(always)]
    fn row_to_f32(src: &[half::f16], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn encoded_attention_reads_every_code_as_the_decode_does() {
        // Arbitrary code bytes (fp8's NaN code, bf16's NaNs and infinities, every nibble and
        // crumb) with finite scales: each ISA's entry point against the portable one, bit for
        // bit (a NaN only as a NaN).
        use crate::attention::KvPrecision;
        let same = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
        };
        let mut g = crate::rng::SplitMix64::new(31);
        let mut buf = vec![0f32; super::ENCODED_CHUNK_VALUES];
        for p in [KvPrecision::Bf16, KvPrecision::Fp8, KvPrecision::Int8, KvPrecision::Int4, KvPrecision::Int2] {
            for hd in [16usize, 40, 96, 128] {
                let (vb, n) = (p.bytes_per_vector(hd), 300);
                let mut rows: Vec<u8> = (0..n * vb).map(|_| g.next_u64() as u8).collect();
                // Each row's f16 parameters (after its codes) finite: 0.5 to 2 times ±2^(0..3).
                let codes = match p {
                    KvPrecision::Bf16 => 2 * hd,
                    KvPrecision::Fp8 | KvPrecision::Int8 => hd,
                    KvPrecision::Int4 => hd.div_ceil(2),
                    _ => hd.div_ceil(4),
                };
                for r in rows.chunks_exact_mut(vb) {
                    for f in r[codes..].chunks_exact_mut(2) {
                        let v = half::f16::from_f32((g.unit_f32() * 1.5 + 0.5) * (1 << (g.next_u64() % 4)) as f32);
                        f.copy_from_slice(&v.to_le_bytes());
                    }
                }
                let q: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
                let w: Vec<f32> = (0..n).map(|_| g.unit_f32()).collect();
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                super::attention_scores_encoded(p, &q, &rows, 0.125, &mut a, &[], &mut buf);
                super::attention_scores_encoded_portable(p, &q, &rows, 0.125, &mut b, &[], &mut buf);
                assert!(same(&a, &b), "{p} hd {hd} scores");
                let (mut oa, mut ob) = (q.clone(), q.clone());
                super::attention_weighted_sum_encoded(p, &w, &rows, &mut oa, &[], &mut buf);
                super::attention_weighted_sum_encoded_portable(p, &w, &rows, &mut ob, &[], &mut buf);
                assert!(same(&oa, &ob), "{p} hd {hd} weighted sum");
                let (mut da, mut db) = (vec![0f32; n * hd], vec![0f32; n * hd]);
                super::decode_kv_rows(p, &rows, hd, &mut da);
                super::decode_kv_rows_portable(p, &rows, hd, &mut db);
                assert!(same(&da, &db), "{p} hd {hd} decoded rows");
                // Groups of 1 to 5 heads over the same rows: each head's scores and sums as the
                // single-head entry points make them.
                for heads in 1..=5usize {
                    let qs: Vec<f32> = (0..heads * hd).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
                    let ws: Vec<f32> = (0..heads * n).map(|_| g.unit_f32()).collect();
                    let (mut ga, mut one) = (vec![0f32; heads * n], vec![0f32; n]);
                    super::attention_scores_group_encoded(p, &qs, heads, &rows, 0.125, &mut ga, &rows[..7], &mut buf);
                    let (mut oa, mut o1) = (vec![0.5f32; heads * hd], vec![0f32; hd]);
                    super::attention_weighted_sum_group_encoded(p, &ws, heads, &rows, &mut oa, &[], &mut buf);
                    for h in 0..heads {
                        super::attention_scores_encoded(p, &qs[h * hd..][..hd], &rows, 0.125, &mut one, &[], &mut buf);
                        assert!(same(&ga[h * n..][..n], &one), "{p} hd {hd} group of {heads}, head {h} scores");
                        o1.fill(0.5);
                        super::attention_weighted_sum_encoded(p, &ws[h * n..][..n], &rows, &mut o1, &[], &mut buf);
                        assert!(same(&oa[h * hd..][..hd], &o1), "{p} hd {hd} group of {heads}, head {h} sums");
                    }
                }
                // Every fp8 code alone: the reader's float is the decode's.
                if p == KvPrecision::Fp8 && hd == 128 {
                    let mut row = vec![0u8; p.bytes_per_vector(256)];
                    for (i, c) in row[..256].iter_mut().enumerate() {
                        *c = i as u8;
                    }
                    row[256..].copy_from_slice(&half::f16::from_f32(1.5).to_le_bytes());
                    let mut want = vec![0f32; 256];
                    p.decode(&row, &mut want);
                    let (mut oa, mut ob) = (vec![0f32; 256], vec![0f32; 256]);
                    super::attention_weighted_sum_encoded(p, &[1.0], &row, &mut oa, &[], &mut buf);
                    super::attention_weighted_sum_encoded_portable(p, &[1.0], &row, &mut ob, &[], &mut buf);
                    assert!(same(&oa, &ob), "every fp8 code");
                    assert!(same(&ob, &want.iter().map(|v| 0.0 + 1.0 * v).collect::<Vec<_>>()), "portable fp8 codes");
                }
            }
        }
    }

    #[test]
    fn encoded_attention_equals_decoding_position_by_position() {
        // The reference is what attention did before: each position's vector decoded on its own
        // (`KvPrecision::decode`, checked against plain formulas in kv_cache), then `attention_dot`
        // or one fused multiply-add per element. Every ISA entry point must give the same bits.
        use crate::attention::KvPrecision;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut g = crate::rng::SplitMix64::new(29);
        let mut buf = vec![0f32; super::ENCODED_CHUNK_VALUES];
        for p in KvPrecision::ALL.into_iter().filter(|p| !matches!(p, KvPrecision::F32 | KvPrecision::F16)) {
            for hd in [17usize, 64, 96, 100, 128] {
                for n in [1usize, 2, 33, 130] {
                    let vb = p.bytes_per_vector(hd);
                    let q: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
                    let w: Vec<f32> = (0..n).map(|_| g.unit_f32()).collect();
                    let mut rows = vec![0u8; n * vb];
                    for r in rows.chunks_exact_mut(vb) {
                        let v: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
                        p.encode(&v, r);
                    }
                    let decoded = |i: usize| {
                        let mut v = vec![0f32; hd];
                        p.decode(&rows[i * vb..(i + 1) * vb], &mut v);
                        v
                    };
                    let want_scores: Vec<f32> =
                        (0..n).map(|i| crate::ops::portable::attention_dot(&q, &decoded(i)) * 0.125).collect();
                    let mut want_sum = q.clone();
                    for (i, wp) in w.iter().enumerate() {
                        for (a, x) in want_sum.iter_mut().zip(decoded(i)) {
                            *a = wp.mul_add(x, *a);
                        }
                    }
                    let what = format!("{p} hd {hd} n {n}");
                    let mut scores = vec![0f32; n];
                    super::attention_scores_encoded(
                        p,
                        &q,
                        &rows,
                        0.125,
                        &mut scores,
                        &rows[vb.min(rows.len())..],
                        &mut buf,
                    );
                    assert_eq!(bits(&scores), bits(&want_scores), "scores, {what}");
                    super::attention_scores_encoded_portable(p, &q, &rows, 0.125, &mut scores, &[], &mut buf);
                    assert_eq!(bits(&scores), bits(&want_scores), "portable scores, {what}");
                    let mut sum = q.clone();
                    super::attention_weighted_sum_encoded(p, &w, &rows, &mut sum, &rows, &mut buf);
                    assert_eq!(bits(&sum), bits(&want_sum), "weighted sum, {what}");
                    #[cfg(target_arch = "x86_64")]
                    if let Some(t) = super::Avx2::new() {
                        super::x86_avx2::attention_scores_encoded(t, p, &q, &rows, 0.125, &mut scores, &[], &mut buf);
                        assert_eq!(bits(&scores), bits(&want_scores), "AVX2 scores, {what}");
                        let mut sum = q.clone();
                        super::x86_avx2::attention_weighted_sum_encoded(t, p, &w, &rows, &mut sum, &[], &mut buf);
                        assert_eq!(bits(&sum), bits(&want_sum), "AVX2 weighted sum, {what}");
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_attention_is_each_head_alone_bit_for_bit() {
        // Every group size (2 and 4 take the one-pass kernels, 1 and 3 the per-head loop), head
        // sizes with and without a 16-multiple, and enough positions to cross a position block.
        let mut g = crate::rng::SplitMix64::new(23);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for heads in [1usize, 2, 3, 4] {
            for hd in [64usize, 100, 128] {
                for n in [0usize, 1, 17, 300, 600] {
                    let qs: Vec<f32> = (0..heads * hd).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
                    let k32: Vec<f32> = (0..n * hd).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
                    let k16: Vec<half::f16> = k32.iter().map(|v| half::f16::from_f32(*v)).collect();
                    let ws: Vec<f32> = (0..heads * n).map(|_| g.unit_f32()).collect();
                    let o0: Vec<f32> = (0..heads * hd).map(|_| g.unit_f32() - 0.5).collect();
                    let (mut a, mut b) = (vec![0f32; heads * n], vec![0f32; heads * n]);
                    let case = format!("heads {heads} hd {hd} n {n}");
                    super::attention_scores_group(&qs, heads, &k32, 0.125, &mut a, &k32[..k32.len().min(9)]);
                    super::attention_scores_group_portable(&qs, &k32, 0.125, &mut b, n);
                    assert_eq!(bits(&a), bits(&b), "f32 scores, {case}");
                    super::attention_scores_group(&qs, heads, &k16, 0.125, &mut a, &[]);
                    super::attention_scores_group_portable(&qs, &k16, 0.125, &mut b, n);
                    assert_eq!(bits(&a), bits(&b), "f16 scores, {case}");
                    // The definition is each head through the single-head loop.
                    for h in 0..heads {
                        let mut one = vec![0f32; n];
                        super::attention_scores_portable(&qs[h * hd..(h + 1) * hd], &k16, 0.125, &mut one);
                        assert_eq!(bits(&b[h * n..(h + 1) * n]), bits(&one), "definition, head {h}, {case}");
                    }
                    let (mut oa, mut ob) = (o0.clone(), o0.clone());
                    super::attention_weighted_sum_group(&ws, heads, &k16, &mut oa, &k16[..k16.len().min(3)]);
                    super::attention_weighted_sum_group_portable(&ws, n, &k16, &mut ob, hd);
                    assert_eq!(bits(&oa), bits(&ob), "f16 sums, {case}");
                    let (mut oa, mut ob) = (o0.clone(), o0.clone());
                    super::attention_weighted_sum_group(&ws, heads, &k32, &mut oa, &[]);
                    super::attention_weighted_sum_group_portable(&ws, n, &k32, &mut ob, hd);
                    assert_eq!(bits(&oa), bits(&ob), "f32 sums, {case}");
                    for h in 0..heads {
                        let mut one = o0[h * hd..(h + 1) * hd].to_vec();
                        super::attention_weighted_sum_portable(&ws[h * n..(h + 1) * n], &k32, &mut one);
                        assert_eq!(bits(&ob[h * hd..(h + 1) * hd]), bits(&one), "sum definition, head {h}, {case}");
                    }
                    // The AVX2 entry points directly (what the dispatch skips on AVX-512 CPUs).
                    #[cfg(target_arch = "x86_64")]
                    if let Some(t) = super::Avx2::new() {
                        super::x86_avx2::attention_scores_group(t, &qs, &k16, 0.125, &mut a, n, &[]);
                        super::attention_scores_group_portable(&qs, &k16, 0.125, &mut b, n);
                        assert_eq!(bits(&a), bits(&b), "AVX2 f16 scores, {case}");
                        let (mut oa, mut ob) = (o0.clone(), o0.clone());
                        super::x86_avx2::attention_axpy_group(t, &ws, n, &k32, &mut oa, hd, &[]);
                        super::attention_weighted_sum_group_portable(&ws, n, &k32, &mut ob, hd);
                        assert_eq!(bits(&oa), bits(&ob), "AVX2 f32 sums, {case}");
                    }
                }
            }
        }
    }

    #[test]
    fn attention_primitives_are_bit_identical_to_the_portable_loops() {
        let mut g = crate::rng::SplitMix64::new(17);
        for hd in [64usize, 96, 100, 128, 200, 256] {
            for n in [1usize, 2, 16, 17, 130] {
                let q: Vec<f32> = (0..hd).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
                let k32: Vec<f32> = (0..n * hd).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
                let k16: Vec<half::f16> = k32.iter().map(|v| half::f16::from_f32(*v)).collect();
                let w: Vec<f32> = (0..n).map(|_| g.unit_f32()).collect();
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                super::attention_scores(&q, &k32, 0.125, &mut a, &k32[..7]);
                super::attention_scores_portable(&q, &k32, 0.125, &mut b);
                assert_eq!(
                    a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f32 scores hd {hd} n {n}"
                );
                super::attention_scores(&q, &k16, 0.125, &mut a, &[]);
                super::attention_scores_portable(&q, &k16, 0.125, &mut b);
                assert_eq!(
                    a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f16 scores hd {hd} n {n}"
                );
                let (mut oa, mut ob) = (q.clone(), q.clone());
                super::attention_weighted_sum(&w, &k16, &mut oa, &k16[3..]);
                super::attention_weighted_sum_portable(&w, &k16, &mut ob);
                assert_eq!(
                    oa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    ob.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f16 sum hd {hd} n {n}"
                );
                let (mut oa, mut ob) = (q.clone(), q.clone());
                super::attention_weighted_sum(&w, &k32, &mut oa, &[]);
                super::attention_weighted_sum_portable(&w, &k32, &mut ob);
                assert_eq!(
                    oa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    ob.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "f32 sum hd {hd} n {n}"
                );
                // The AVX2 entry points (what CPUs without AVX-512 run) against the same loops,
                // and the portable loops against one value at a time (exact conversions).
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let one_at_a_time: Vec<f32> = (0..n)
                    .map(|p| {
                        let k: Vec<f32> = k16[p * hd..(p + 1) * hd].iter().map(|v| v.to_f32()).collect();
                        crate::ops::portable::attention_dot(&q, &k) * 0.125
                    })
                    .collect();
                super::attention_scores_portable(&q, &k16, 0.125, &mut b);
                assert_eq!(bits(&b), bits(&one_at_a_time), "f16 row conversion, hd {hd} n {n}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = super::Avx2::new() {
                    super::x86_avx2::attention_scores(t, &q, &k32, 0.125, &mut a, &k32[..9]);
                    super::attention_scores_portable(&q, &k32, 0.125, &mut b);
                    assert_eq!(bits(&a), bits(&b), "AVX2 f32 scores hd {hd} n {n}");
                    super::x86_avx2::attention_scores(t, &q, &k16, 0.125, &mut a, &k16[..3]);
                    assert_eq!(bits(&a), bits(&one_at_a_time), "AVX2 f16 scores hd {hd} n {n}");
                    let (mut oa, mut ob) = (q.clone(), q.clone());
                    super::x86_avx2::attention_axpy(t, &w, &k16, &mut oa, &[]);
                    super::attention_weighted_sum_portable(&w, &k16, &mut ob);
                    assert_eq!(bits(&oa), bits(&ob), "AVX2 f16 sum hd {hd} n {n}");
                    let (mut oa, mut ob) = (q.clone(), q.clone());
                    super::x86_avx2::attention_axpy(t, &w, &k32, &mut oa, &k32[..5]);
                    super::attention_weighted_sum_portable(&w, &k32, &mut ob);
                    assert_eq!(bits(&oa), bits(&ob), "AVX2 f32 sum hd {hd} n {n}");
                }
            }
        }
    }
}
