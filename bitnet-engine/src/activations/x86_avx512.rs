//! Activation quantization at AVX-512: the `perm` tables, and per-token int8 compiled for
//! AVX-512.

use std::arch::x86_64::*;

use crate::simd::x86_avx512::*;

/// One token's `perm` tables (`tq1_perm::build_perm_tables_portable` is the definition), two
/// groups per step in 512-bit registers: the six activations' bytes broadcast from one 8-byte
/// load, spread by `vpshufb` into each group's (a, b) and (c, ·) byte pairs (group 2P in the low
/// 256 bits, 2P + 1 in the high), the 16 pattern sums per group in i16 lanes from `vpmaddubsw`
/// against constant trit pairs (as the `lut` builder's [`super::x86_avx2::LutGroupSums`]),
/// split into l and h bytes by `vpmovwb`, and each group's `[l | !l | h | !h]` put together by
/// one `vpermt2q`. Two groups a step gain little over one in 256-bit registers, and the build
/// stays slower than `lut`'s: writing twice `lut`'s bytes is most of it (docs/perf-notes.md).
pub(crate) fn build_perm_tables(_t: Avx512, x: &[i8], dst: &mut [u8]) {
    // SAFETY: the token proves AVX-512 F/BW (so AVX2); reads of x stay below `x.len()` (pairs
    // whose eight bytes do not fit are left to the portable tail) and writes below dst's
    // length, checked here.
    unsafe { build_perm_tables_avx512(x, dst) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn build_perm_tables_avx512(x: &[i8], dst: &mut [u8]) {
    use crate::formats::tq1_lut::LUT_H_WEIGHT;
    use crate::formats::tq1_perm::{build_perm_groups_portable, perm_groups, PERM_GROUP_TABLE_BYTES};
    let groups = perm_groups(x.len());
    assert_eq!(dst.len(), groups * PERM_GROUP_TABLE_BYTES, "build_perm_tables: table size");
    // Pair P (groups 2P, 2P + 1) reads bytes 6P .. 6P + 8.
    let pairs = if x.len() >= 8 { ((x.len() - 8) / 6 + 1).min(groups / 2) } else { 0 };
    // The `lut` builder's trit pairs and offsets, in each 256-bit half.
    let sums = super::x86_avx2::LutGroupSums::new();
    let (w01, w2, off) =
        (_mm512_broadcast_i64x4(sums.w01), _mm512_broadcast_i64x4(sums.w2), _mm512_broadcast_i64x4(sums.off));
    // Per 128-bit lane of the broadcast bytes x[6P..6P + 8]: the low 256 bits take group 2P's
    // (a, b) = bytes (0, 1) and (c, ·) = (2, 2); the high 256 bits group 2P + 1's: (3, 4), (5, 5).
    let ab_idx = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0x0100), _mm256_set1_epi16(0x0403));
    let c_idx = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0x0202), _mm256_set1_epi16(0x0505));
    // Qwords of [l(2P), l(2P+1), h(2P), h(2P+1)] (0–7) and their complements (8–15) in the
    // order of each group's table.
    let first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let (flip, half_h) = (_mm512_set1_epi8(-128), _mm512_set1_epi16(LUT_H_WEIGHT / 2));
    for pr in 0..pairs {
        let q = _mm512_xor_si512(_mm512_set1_epi64((x.as_ptr().add(6 * pr) as *const i64).read_unaligned()), flip);
        let (ab, c) = (_mm512_shuffle_epi8(q, ab_idx), _mm512_shuffle_epi8(q, c_idx));
        let v = _mm512_add_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(ab, w01), _mm512_maddubs_epi16(c, w2)), off);
        // h = (v + 16) >> 5, l = v − 32h: both fit a byte.
        let h = _mm512_srai_epi16::<5>(_mm512_add_epi16(v, half_h));
        let l = _mm512_sub_epi16(v, _mm512_slli_epi16::<5>(h));
        let lh = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(l)), _mm512_cvtepi16_epi8(h));
        let not = _mm512_ternarylogic_epi64::<0x55>(lh, lh, lh);
        let out = dst.as_mut_ptr().add(2 * pr * PERM_GROUP_TABLE_BYTES);
        store(out, _mm512_permutex2var_epi64(lh, first, not));
        store(out.add(PERM_GROUP_TABLE_BYTES), _mm512_permutex2var_epi64(lh, second, not));
    }
    build_perm_groups_portable(x, dst, 2 * pairs..groups);
}

// Per-token quantization's portable definition at AVX-512, which has byte-narrowing
// instructions (see `widest_compiled!`).
compiled_for! {
    Avx512, "avx512f,avx512bw,avx512vl,avx512dq";
    quantize_token(src: &[f32], dst: &mut [i8]) -> f32 = super::quantize_token_portable;
}
