//! The forward pass's element-wise float operations: RMSNorm, RoPE, the gated FFN activation,
//! residual adds, the fixed-order dot product attention uses, and a transpose.
//!
//! Each is plain Rust written so that the compiler vectorizes it at the baseline ISA: reductions
//! run in 16 independent lanes with a fixed reduction tree, and `exp` is a polynomial instead of
//! a libm call. The result is the same on every machine (no reassociation; the only fused
//! multiply-adds are attention's, `f32::mul_add`, correctly rounded wherever it runs), so
//! outputs are bit-identical across ISA levels. Each is checked against a plain f64
//! computation in the tests below.

/// Lanes of the fixed-order reductions (one AVX-512 register, four SSE registers).
const LANES: usize = 16;

/// Σ of 16 lane partial sums by a fixed tree (8, 4, 2, 1).
#[inline(always)]
fn reduce_lanes(mut lanes: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
        w /= 2;
    }
    lanes[0]
}

/// Dot product in a fixed order: 16 lane sums, then a fixed reduction tree. The compiler can
/// keep the lanes in one vector register, and the result is the same at every ISA level (no
/// fused multiply-add, no reassociation), so RMSNorm is bit-identical across machines.
#[inline(always)]
pub(crate) fn dot16(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    reduce_lanes(lanes)
}

/// Attention's dot product: [`dot16`]'s lanes and reduction tree, each product added to its
/// lane in one fused multiply-add (one rounding, not two). The SIMD attention kernels then use
/// one `vfmadd` where they had a multiply and an add, the two ops that bound the score and
/// weighted-sum loops of long prompts (both measured faster: docs/perf-notes.md).
/// Correctly rounded everywhere, so still the same on every ISA level (at baseline x86-64,
/// without FMA, `mul_add` is libm's `fmaf`: slow, but only the portable fallback of CPUs
/// without AVX2 runs it there).
#[inline(always)]
pub(crate) fn attention_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            lanes[l] = x[l].mul_add(y[l], lanes[l]);
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] = x.mul_add(*y, lanes[l]);
    }
    reduce_lanes(lanes)
}

/// `dst[c][r] = src[r][c]` for a `[r_n, c_n]` source, in 8 × 8 tiles so that both sides are
/// read and written a cache line at a time ([`crate::ops::transpose_cols_into`]).
pub(crate) fn transpose_into(src: &[f32], r_n: usize, c_n: usize, dst: &mut [f32]) {
    if c_n == 1 {
        dst[..r_n].copy_from_slice(&src[..r_n]);
        return;
    }
    crate::ops::transpose_cols_into(src, r_n, c_n, 0..c_n, dst);
}

/// Columns `c0..c0 + 8` of a `[r_n, c_n]` matrix into eight rows (`dsts[k][r] = src[r][c0 + k]`,
/// r_n = each row's length).
pub(crate) fn transpose_8_cols_to_rows_portable(src: &[f32], c_n: usize, c0: usize, dsts: [&mut [f32]; 8]) {
    for (k, dst) in dsts.into_iter().enumerate() {
        for (r, d) in dst.iter_mut().enumerate() {
            *d = src[r * c_n + c0 + k];
        }
    }
}

/// Columns `cols` of a `[r_n, c_n]` source, transposed: `dst[c − cols.start][r] = src[r][c]`
/// (one thread's share of [`transpose_into`]: its rows of the destination). Plain loops over
/// 8 × 8 tiles: the oracle of, and the fallback for, the SIMD tiles in `ops::x86_avx2`.
pub(crate) fn transpose_cols_into_portable(
    src: &[f32],
    r_n: usize,
    c_n: usize,
    cols: std::ops::Range<usize>,
    dst: &mut [f32],
) {
    const T: usize = 8;
    debug_assert!(cols.end <= c_n && dst.len() >= cols.len() * r_n);
    for r0 in (0..r_n).step_by(T) {
        for c0 in cols.clone().step_by(T) {
            for r in r0..(r0 + T).min(r_n) {
                for c in c0..(c0 + T).min(cols.end) {
                    dst[(c - cols.start) * r_n + r] = src[r * c_n + c];
                }
            }
        }
    }
}

/// 1 / RMS of a row (RMSNorm's factor).
#[inline(always)]
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    1.0 / (dot16(row, row) / row.len() as f32 + eps).sqrt()
}

/// RMSNorm of each row of `x` (row length = `weight.len()`) into `out`, as plain Rust inlined
/// into each ISA's compilation of it: callers use [`crate::ops::rms_norm_rows`], which runs
/// at the widest ISA this CPU has, with identical results.
#[inline(always)]
pub(crate) fn rms_norm_rows_portable(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let inv = inv_rms(xr, eps);
        for ((o, v), g) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * g;
        }
    }
}

/// In-place twin of [`rms_norm_rows_portable`].
#[inline(always)]
pub(crate) fn rms_norm_in_place_portable(x: &mut [f32], weight: &[f32], eps: f32) {
    for xr in x.chunks_exact_mut(weight.len()) {
        let inv = inv_rms(xr, eps);
        for (v, g) in xr.iter_mut().zip(weight) {
            *v = *v * inv * g;
        }
    }
}

pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `cos` and `sin` of pos × inv_freq[i], the rotation angles of one position (shared by every
/// head of the position, so computed once rather than per head).
pub(crate) fn rope_angles(pos: usize, inv_freq: &[f32], cos: &mut [f32], sin: &mut [f32]) {
    for ((f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        (*s, *c) = (pos as f32 * f).sin_cos();
    }
}

/// NEOX-style rotary embedding of every head of `v` (head size `2 × cos.len()`): dimension i
/// is rotated with i + hd/2 by the angle whose cosine and sine are `cos[i]`, `sin[i]`.
pub(crate) fn rope(v: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in v.chunks_exact_mut(2 * half) {
        let (lo, hi) = head.split_at_mut(half);
        for (((a, b), c), s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
            let (x, y) = (*a, *b);
            *a = x * c - y * s;
            *b = x * s + y * c;
        }
    }
}

/// `e^x` for f32, within 2 ulp of the correctly rounded result on [−87, 88]; 0 below −87
/// (e^−87 ≈ 1.6e−38 is the edge of the normal range), +∞ above 88 (a deviation only on
/// (88, 88.72], irrelevant to SiLU and softmax), NaN for NaN. Branch-free arithmetic, so loops
/// over it vectorize, unlike calls to libm's `expf`: x = n ln2 + r with |r| ≤ ln2/2
/// (Cody–Waite, ln2 split so that n × LN2_HI is exact), e^r by Cephes' degree-5 minimax
/// polynomial, times 2^n built in the exponent bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 355.0 / 512.0; // 0.693359375, 9 significant bits
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5 × 2^23: adding it rounds to an integer.
    let xc = x.clamp(-87.0, 88.0);
    // n = round(x / ln2), both as a float and, from the representation, as an integer.
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let n_int = t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    let scaled = er * f32::from_bits(((n_int + 127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else if x.is_nan() {
        x
    } else {
        scaled
    }
}

/// The gated FFN activation, in place in `gate`: SiLU(gate) × up or ReLU(gate)² × up.
/// Runs at the widest ISA this CPU has ([`crate::ops::gated_activation`]), with identical
/// results.
#[inline(always)]
pub(crate) fn gated_activation_portable(act: crate::ops::FfnActivation, gate: &mut [f32], up: &[f32]) {
    use crate::ops::FfnActivation;
    match act {
        FfnActivation::Silu => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + exp(-*g)) * u;
            }
        }
        FfnActivation::ReluSquared => {
            for (g, u) in gate.iter_mut().zip(up) {
                let r = g.max(0.0);
                *g = r * r * u;
            }
        }
    }
}

/// The largest of `init` and the values of `v`, lane by lane then across the lanes, by
/// compare-and-select (not `f32::max`, whose NaN rule keeps LLVM from using `maxps`): NaNs never
/// win, and of −0 and +0 the first met stays.
#[inline(always)]
fn lanes_max(v: &[f32], init: f32) -> f32 {
    let max2 = |m: f32, x: f32| if x > m { x } else { m };
    let mut lanes = [init; LANES];
    let chunks = v.chunks_exact(LANES);
    for (l, x) in chunks.remainder().iter().enumerate() {
        lanes[l] = max2(lanes[l], *x);
    }
    for c in chunks {
        for l in 0..LANES {
            lanes[l] = max2(lanes[l], c[l]);
        }
    }
    lanes.iter().copied().fold(init, max2)
}

/// The index of the largest logit, the first one on ties; a NaN never wins, and a NaN first
/// logit is the answer (exactly the plain loop `if v > logits[best] { best = i }`). Two passes
/// that vectorize: the largest value, lane by lane (compare-and-select from the first logit),
/// then the first index holding it (`==`, so −0 and +0 are one value, as `>` makes them). Runs
/// at the widest ISA this CPU has ([`crate::ops::argmax`]).
#[inline(always)]
pub(crate) fn argmax_portable(logits: &[f32]) -> u32 {
    let Some(&first) = logits.first() else { return 0 };
    if first.is_nan() {
        return 0;
    }
    let max = lanes_max(logits, first);
    for (k, c) in logits.chunks(LANES).enumerate() {
        if c.iter().fold(false, |hit, v| hit | (*v == max)) {
            let at = c.iter().position(|v| *v == max).expect("the chunk holds the maximum");
            return (k * LANES + at) as u32;
        }
    }
    unreachable!("the maximum is one of the logits")
}

/// Softmax of attention scores, in place: e^(s − max) / Σ. Runs at the widest ISA this CPU has
/// ([`crate::ops::softmax_in_place`]), with identical results.
#[inline(always)]
pub(crate) fn softmax_in_place_portable(scores: &mut [f32]) {
    let max = lanes_max(scores, f32::NEG_INFINITY);
    let mut sums = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            c[l] = exp(c[l] - max);
            sums[l] += c[l];
        }
    }
    for (l, v) in chunks.into_remainder().iter_mut().enumerate() {
        *v = exp(*v - max);
        sums[l] += *v;
    }
    let inv = 1.0 / reduce_lanes(sums);
    for v in scores.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp() as f32;
            let got = exp(x);
            assert!(ulps(got, want) <= 2, "exp({x}) = {got}, want {want}");
            worst = worst.max(ulps(got, want));
            x += 0.000_731;
        }
        assert!(worst >= 1, "the sweep must reach inexact cases");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn reductions_match_f64() {
        let mut g = SplitMix64::new(3);
        for n in [1, 15, 16, 17, 96, 1536, 2560] {
            let a: Vec<f32> = (0..n).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
            let b: Vec<f32> = (0..n).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot16(&a, &b) as f64 - want).abs() < 1e-5 * n as f64, "n = {n}");
            assert!((attention_dot(&a, &b) as f64 - want).abs() < 1e-5 * n as f64, "n = {n}");
            let w: Vec<f32> = (0..n).map(|_| g.unit_f32() + 0.5).collect();
            let mut out = vec![0.0; n];
            crate::ops::rms_norm_rows(&a, &w, 1e-6, &mut out);
            let rms = (a.iter().map(|v| *v as f64 * *v as f64).sum::<f64>() / n as f64 + 1e-6).sqrt();
            for i in 0..n {
                let want = a[i] as f64 / rms * w[i] as f64;
                assert!((out[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1e-3), "norm n = {n}, i = {i}");
            }
            let mut s = a.clone();
            softmax_in_place_portable(&mut s);
            let max = a.iter().fold(f32::MIN, |m, v| m.max(*v)) as f64;
            let total: f64 = a.iter().map(|v| (*v as f64 - max).exp()).sum();
            for i in 0..n {
                let want = (a[i] as f64 - max).exp() / total;
                assert!((s[i] as f64 - want).abs() <= 1e-6 * want.max(1e-3), "softmax n = {n}, i = {i}");
            }
        }
    }

    #[test]
    fn rope_rotates_each_head_by_the_position_angles() {
        let (hd, heads, pos) = (8, 3, 7);
        let inv_freq: Vec<f32> = (0..hd / 2).map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32)).collect();
        let v: Vec<f32> = (0..hd * heads).map(|i| i as f32 * 0.1 - 1.0).collect();
        let (mut c, mut s) = (vec![0.0; hd / 2], vec![0.0; hd / 2]);
        rope_angles(pos, &inv_freq, &mut c, &mut s);
        let mut got = v.clone();
        rope(&mut got, &c, &s);
        for h in 0..heads {
            for i in 0..hd / 2 {
                let ang = pos as f64 * inv_freq[i] as f64;
                let (a, b) = (v[h * hd + i] as f64, v[h * hd + i + hd / 2] as f64);
                assert!((got[h * hd + i] as f64 - (a * ang.cos() - b * ang.sin())).abs() < 1e-5);
                assert!((got[h * hd + i + hd / 2] as f64 - (a * ang.sin() + b * ang.cos())).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn transpose_matches_the_definition() {
        for (r_n, c_n) in [(1, 1), (5, 1), (3, 7), (17, 9), (64, 8)] {
            let src: Vec<f32> = (0..r_n * c_n).map(|i| i as f32).collect();
            let mut dst = vec![0.0; r_n * c_n];
            transpose_into(&src, r_n, c_n, &mut dst);
            for r in 0..r_n {
                for c in 0..c_n {
                    assert_eq!(dst[c * r_n + r], src[r * c_n + c]);
                }
            }
            // Any split of the columns, each part transposed alone, gives the same rows.
            for cut in 0..=c_n {
                let mut parts = vec![-1.0; r_n * c_n];
                let (a, b) = parts.split_at_mut(cut * r_n);
                transpose_cols_into_portable(&src, r_n, c_n, 0..cut, a);
                transpose_cols_into_portable(&src, r_n, c_n, cut..c_n, b);
                assert_eq!(parts, dst, "{r_n}×{c_n} cut at {cut}");
            }
        }
    }
}
