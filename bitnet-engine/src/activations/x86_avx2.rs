//! Activation quantization at AVX2: per-token int8, the 16-value sums, the `lut` tables.

use std::arch::x86_64::*;

use crate::formats::tq1_lut::{LUT_H_WEIGHT, LUT_PAIR_TABLE_BYTES};
use crate::simd::x86_avx2::*;

/// One token's lookup tables (`tq1_lut::build_token_tables_portable` is the definition), a
/// group pair per step: each group's 16 sums in i16 lanes from two `vpmaddubsw` against
/// constant trit pairs (activations offset to unsigned, the offset taken back by a constant),
/// then split into (l, h) bytes (`tq1_lut::lut_split`) and the pair's two tables interleaved.
/// The portable loop, serial on the calling thread, had been a visible share of a 2B4T decode
/// step (docs/perf-notes.md).
pub(crate) fn build_lut_tables(_t: Avx2, x: &[i8], dst: &mut [u8]) {
    // SAFETY: the token proves AVX2; `build_lut_pairs` reads x only below `x.len()` and writes
    // dst only below `pairs · 64`, both checked here.
    unsafe { build_lut_tables_avx2(x, dst) }
}

#[target_feature(enable = "avx2")]
unsafe fn build_lut_tables_avx2(x: &[i8], dst: &mut [u8]) {
    use crate::formats::tq1_lut::{build_groups_portable, lut_groups};
    let groups = lut_groups(x.len());
    assert_eq!(dst.len(), groups / 2 * LUT_PAIR_TABLE_BYTES, "build_lut_tables: table size");
    // Pair P reads bytes 6P .. 6P + 7 (group 2P + 1's c with the byte after it).
    let pairs = if x.len() >= 7 { ((x.len() - 7) / 6 + 1).min(groups / 2) } else { 0 };
    let sums = LutGroupSums::new();
    for pr in 0..pairs {
        let (a, b) = (sums.group(x.as_ptr().add(6 * pr)), sums.group(x.as_ptr().add(6 * pr + 3)));
        store(dst.as_mut_ptr().add(pr * LUT_PAIR_TABLE_BYTES), _mm256_permute2x128_si256::<0x20>(a, b));
        store(dst.as_mut_ptr().add(pr * LUT_PAIR_TABLE_BYTES + 32), _mm256_permute2x128_si256::<0x31>(a, b));
    }
    build_groups_portable(x, dst, 2 * pairs..groups);
}

/// One group's 16 pattern sums (`tq1_lut::build_groups_portable`), split into (l, h) bytes:
/// the sums in i16 lanes from two `vpmaddubsw` against constant trit pairs (activations offset
/// to unsigned, the offset taken back by a constant). The `perm` table builder takes its
/// constants, one group per 256-bit half.
pub(crate) struct LutGroupSums {
    /// Word lane p: bytes (t₀(p), t₁(p)).
    pub(crate) w01: __m256i,
    /// Word lane p: bytes (t₂(p), 0).
    pub(crate) w2: __m256i,
    /// Word lane p: −128·Σtᵢ(p), the offset of activations made unsigned.
    pub(crate) off: __m256i,
    split: __m256i,
}

impl LutGroupSums {
    #[inline(always)]
    pub(crate) unsafe fn new() -> Self {
        use crate::formats::tq1_lut::lut_pattern;
        // Word lane p: bytes (t₀(p), t₁(p)) and (t₂(p), 0); the offset 128·Σtᵢ(p) comes back off.
        let mut w01 = [0i8; 32];
        let mut w2 = [0i8; 32];
        let mut off = [0i16; 16];
        for p in 0..14 {
            let t = lut_pattern(p);
            (w01[2 * p], w01[2 * p + 1], w2[2 * p]) = (t[0], t[1], t[2]);
            off[p] = -128 * (t[0] as i16 + t[1] as i16 + t[2] as i16);
        }
        // Per 128-bit lane: the words' 8 low (l) bytes, then their 8 high (h) bytes.
        let split = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
        );
        Self {
            w01: load(w01.as_ptr() as *const u8),
            w2: load(w2.as_ptr() as *const u8),
            off: load(off.as_ptr() as *const u8),
            split,
        }
    }

    /// `[l bytes of p 0–15 | h bytes of p 0–15]` of the group of activations `x[0..3]`; reads
    /// `x[0..4]`.
    #[inline(always)]
    pub(crate) unsafe fn group(&self, x: *const i8) -> __m256i {
        let flip = _mm256_set1_epi8(-128);
        let ab = _mm256_xor_si256(_mm256_set1_epi16((x as *const i16).read_unaligned()), flip);
        let c = _mm256_xor_si256(_mm256_set1_epi16((x.add(2) as *const i16).read_unaligned()), flip);
        let v = _mm256_add_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(ab, self.w01), _mm256_maddubs_epi16(c, self.w2)),
            self.off,
        );
        // h = (v + 16) >> 5 and l = v − 32h in one word as (l, h) bytes.
        let h = _mm256_srai_epi16::<5>(_mm256_add_epi16(v, _mm256_set1_epi16(LUT_H_WEIGHT / 2)));
        let l = _mm256_sub_epi16(v, _mm256_slli_epi16::<5>(h));
        let lh = _mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi16(0xff)), _mm256_slli_epi16::<8>(h));
        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(lh, self.split))
    }
}

/// Per-token int8 quantization (`activations::quantize_token_portable` is the definition), 32
/// values a step: the absmax as `vmaxps` (which keeps the running maximum when the value is
/// NaN, as the portable compare does), then q = `vcvtps2dq` of the product clamped to ±127
/// (round half to even, the default rounding mode, as the portable magic-number add), NaN
/// products zeroed first, narrowed with two packs and one permute. The portable loop compiled
/// for AVX2 had narrowed through extracts, inserts and blends: 1536 values took 350 ns.
pub(crate) fn quantize_token(_t: Avx2, src: &[f32], dst: &mut [i8]) -> f32 {
    assert_eq!(src.len(), dst.len(), "quantize: one byte per value");
    // SAFETY: the token proves AVX2; every load and store is inside `src` / `dst` (same length).
    unsafe { quantize_token_impl(src, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_token_impl(src: &[f32], dst: &mut [i8]) -> f32 {
    let n = src.len();
    let body = n / 32 * 32;
    let sp = src.as_ptr();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = [_mm256_setzero_ps(); 4];
    for i in (0..body).step_by(32) {
        for (j, mj) in m.iter_mut().enumerate() {
            *mj = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(sp.add(i + 8 * j)), abs_mask), *mj);
        }
    }
    let m4 = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m4);
    let absmax = src[body..].iter().chain(&lanes).fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    if !(absmax > 0.0 && absmax.is_finite()) {
        dst.fill(0);
        return 0.0;
    }
    let inv = 127.0 / absmax;
    let (vinv, lo, hi) = (_mm256_set1_ps(inv), _mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let dp = dst.as_mut_ptr();
    for i in (0..body).step_by(32) {
        let q: [__m256i; 4] = std::array::from_fn(|j| {
            let p = _mm256_mul_ps(_mm256_loadu_ps(sp.add(i + 8 * j)), vinv);
            let p = _mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
            _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(p, lo), hi))
        });
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(dp.add(i) as *mut __m256i, _mm256_permutevar8x32_epi32(bytes, order));
    }
    for (q, v) in dst[body..].iter_mut().zip(&src[body..]) {
        *q = crate::activations::to_q8(v * inv);
    }
    absmax / 127.0
}

/// Σ of each 16 int8 values of `q` into `subs` (`activations::sub_sums_portable` is the
/// definition): `vpsadbw` of the values biased to unsigned (+128 each) sums eight bytes, two of
/// those make a sub-block, less 16 · 128.
pub(crate) fn sub_sums(_t: Avx2, q: &[i8], subs: &mut [i16]) {
    assert_eq!(q.len(), 16 * subs.len(), "sub-block sums: 16 values each");
    // SAFETY: the token proves AVX2; loads stay inside `q` (32 at a time below 16 · (len − 1)).
    unsafe { sub_sums_impl(q, subs) }
}

#[target_feature(enable = "avx2")]
unsafe fn sub_sums_impl(q: &[i8], subs: &mut [i16]) {
    let (bias, zero) = (_mm256_set1_epi8(-128), _mm256_setzero_si256());
    let pairs = subs.len() / 2;
    for k in 0..pairs {
        let v = _mm256_xor_si256(load(q.as_ptr().add(32 * k) as *const u8), bias);
        let s = _mm256_sad_epu8(v, zero);
        let t = _mm256_add_epi64(s, _mm256_shuffle_epi32::<0b0100_1110>(s));
        subs[2 * k] = (_mm256_cvtsi256_si32(t) - 2048) as i16;
        subs[2 * k + 1] = (_mm256_extract_epi32::<4>(t) - 2048) as i16;
    }
    if subs.len() % 2 == 1 {
        crate::activations::sub_sums_portable(&q[32 * pairs..], &mut subs[2 * pairs..]);
    }
}
