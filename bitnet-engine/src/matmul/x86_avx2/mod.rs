//! AVX2 matmul kernels: `vpmaddubsw` (unsigned codes × signed activations) and nibble-table
//! popcount. This file: the `IsaOps` entry points, block decoders, the split form's dot stage
//! and the popcount kernels; `codes` the fused I2/TQ2 tiles, `tq1` the base-3 kernels, `lut`
//! the table-lookup TQ1 kernel, `xnor` the bit-plane kernel.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::activations::{ActivationBatch, ACT_PLANES, PLANE_WEIGHTS};
use crate::aligned::AlignedBytes;
use crate::formats::i2::{I2_BLOCK_BYTES, I2_BLOCK_WEIGHTS};
use crate::formats::tq1_lut::{
    LUT_H_WEIGHT, LUT_NEGATION_BIAS, LUT_PAIR_TABLE_BYTES, LUT_SPAN_BYTES, LUT_SPAN_GROUPS, LUT_TILE_ROWS,
};
use crate::formats::{BlockTq1_0, BlockTq2_0, I2Matrix, PackedWeights, Tq1LutMatrix, Tq1Matrix, Tq2Matrix, QK_K};
use crate::matmul::portable::{
    decode_tq1_qh, i2_tail_dot, run, tq1_row_chunks, tq1_row_digit_order_offset, IsaOps, TQ1_DIGIT_BLOCK,
};
use crate::matmul::{
    batched_tiles, finish_blocks, finish_tensor, tile_pointers, KernelForm, KernelScratch, TokenTables,
};
use crate::simd::x86_avx2::*;

pub(super) mod codes;
pub(super) mod lut;
pub(super) mod tq1;
mod xnor;

use codes::*;
use lut::*;
use tq1::*;
use xnor::*;

pub(crate) fn matmul(
    isa: Avx2,
    form: KernelForm,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    run(isa, form, w, x, rows, out, scratch)
}

// SAFETY (for every `unsafe` block in this impl): `self` is an `Avx2` token, which `Avx2::new`
// only creates when the CPU supports AVX2/FMA/POPCNT/F16C; the callee's slice bounds are checked by
// `debug_assert!`s inside and guaranteed by the callers (tile, block and activation lengths are
// multiples of 256 by construction of `ActivationBatch` and the formats).
impl IsaOps for Avx2 {
    fn decode_i2_block(self, src: &[u8], dst: &mut [u8]) {
        unsafe { decode_i2_block(src, dst) }
    }
    fn decode_tq2_block(self, b: &BlockTq2_0, dst: &mut [u8]) {
        unsafe { decode_tq2_block(b, dst) }
    }
    fn decode_tq1_block(self, b: &BlockTq1_0, dst: &mut [u8]) {
        unsafe { decode_tq1_block(b, dst) }
    }
    fn dot_codes(self, codes: &[u8], x: &[i8]) -> i32 {
        unsafe { dot_codes(codes, x) }
    }
    fn dot_codes_tile(self, codes: &[u8], n: usize, tokens: &[i8], out: &mut [i32]) {
        let nt = tokens.len() / n.max(1);
        assert!(
            n.is_multiple_of(128) && codes.len().is_multiple_of(n) && tokens.len() == n * nt && (1..=8).contains(&nt)
        );
        assert_eq!(out.len(), codes.len() / n * nt);
        for (row, o) in codes.chunks_exact(n).zip(out.chunks_exact_mut(nt)) {
            // SAFETY: the token proves AVX2; the asserts above keep every load in bounds.
            unsafe { dot_codes_tokens(row, tokens, o) }
        }
    }
    fn and_planes(self, mask: Option<&[u64]>, sign: &[u64], plane: &[u64], words: usize, dst: &mut [u64]) {
        unsafe { and_planes(mask, sign, plane, words, dst) }
    }
    fn popcount(self, words: &[u64]) -> u32 {
        unsafe { popcount(words) }
    }
    fn i2_fused(self, w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
        unsafe { i2_fused(w, x, rows, out) }
    }
    fn tq2_fused(self, w: &Tq2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32], _: &mut KernelScratch) {
        unsafe { tq2_fused(w, x, rows, out) }
    }
    fn tq1_fused(
        self,
        w: &Tq1Matrix,
        x: &ActivationBatch,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut KernelScratch,
    ) {
        unsafe { tq1_fused(self, w, x, rows, out, scratch) }
    }
    fn xnor_fused(self, w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
        unsafe { xnor_fused(w, x, rows, out) }
    }
    fn tq1_lut(
        self,
        w: &Tq1LutMatrix,
        x: &ActivationBatch,
        tables: TokenTables<'_>,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        unsafe { tq1_lut(w, x, tables, rows, out) }
    }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn decode_i2_block(src: &[u8], dst: &mut [u8]) {
    debug_assert!(src.len() >= I2_BLOCK_BYTES && dst.len() >= I2_BLOCK_WEIGHTS);
    for half in 0..2 {
        let c = split4(load(src.as_ptr().add(32 * half)));
        for (n, cn) in c.iter().enumerate() {
            store(dst.as_mut_ptr().add(64 * n + 32 * half), *cn);
        }
    }
}

/// The inverse of [`decode_i2_block`]: 256 codes (each ≤ 3, one per byte) packed into one
/// 64-byte I2 block (byte j of half h holds the codes 64n + 32h + j at shift 2n). A code
/// shifted by 6 within its 16-bit lane stays in its byte (3 << 6 < 256).
///
/// SAFETY: the caller guarantees 256 readable bytes at `src` and 64 writable ones at `dst`.
#[inline(always)]
pub(crate) unsafe fn encode_i2_block(src: *const u8, dst: *mut u8) {
    for half in 0..2 {
        let c = |n: usize| load(src.add(64 * n + 32 * half));
        let lo = _mm256_or_si256(c(0), _mm256_slli_epi16::<2>(c(1)));
        let hi = _mm256_or_si256(_mm256_slli_epi16::<4>(c(2)), _mm256_slli_epi16::<6>(c(3)));
        store(dst.add(32 * half), _mm256_or_si256(lo, hi));
    }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn decode_tq2_block(b: &BlockTq2_0, dst: &mut [u8]) {
    debug_assert!(dst.len() >= QK_K);
    for j in 0..2 {
        let c = split4(load(b.qs.as_ptr().add(32 * j)));
        for (n, cn) in c.iter().enumerate() {
            store(dst.as_mut_ptr().add(128 * j + 32 * n), *cn);
        }
    }
}

/// Digit of each byte of `q` (already multiplied by 3^n mod 256): `(q × 3) >> 8`, which is
/// `(q > 85) + (q > 170)` — unsigned compares done as signed ones after flipping the top bit.
#[inline(always)]
unsafe fn tq1_trits256(q: __m256i) -> __m256i {
    let flip = _mm256_set1_epi8(-128);
    let qs = _mm256_xor_si256(q, flip);
    let gt1 = _mm256_cmpgt_epi8(qs, _mm256_set1_epi8((85u8 ^ 0x80) as i8));
    let gt2 = _mm256_cmpgt_epi8(qs, _mm256_set1_epi8((170u8 ^ 0x80) as i8));
    _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), gt1), gt2)
}

#[inline(always)]
unsafe fn tq1_trits128(q: __m128i) -> __m128i {
    let flip = _mm_set1_epi8(-128);
    let qs = _mm_xor_si128(q, flip);
    let gt1 = _mm_cmpgt_epi8(qs, _mm_set1_epi8((85u8 ^ 0x80) as i8));
    let gt2 = _mm_cmpgt_epi8(qs, _mm_set1_epi8((170u8 ^ 0x80) as i8));
    _mm_sub_epi8(_mm_sub_epi8(_mm_setzero_si128(), gt1), gt2)
}

/// Shared with the AVX-512 path (which implies AVX2).
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
pub(crate) unsafe fn decode_tq1_block(b: &BlockTq1_0, dst: &mut [u8]) {
    debug_assert!(dst.len() >= QK_K);
    // qs[0..32]: digit n → weights 32n..32n+32. Multiplying by 3 (mod 256) moves to the next digit.
    let mut q = load(b.qs.as_ptr());
    for n in 0..5 {
        if n > 0 {
            q = times3(q);
        }
        store(dst.as_mut_ptr().add(32 * n), tq1_trits256(q));
    }
    // qs[32..48]: digit n → weights 160 + 16n .. +16.
    let mut q = _mm_loadu_si128(b.qs.as_ptr().add(32) as *const __m128i);
    for n in 0..5 {
        if n > 0 {
            q = times3_128(q);
        }
        _mm_storeu_si128(dst.as_mut_ptr().add(160 + 16 * n) as *mut __m128i, tq1_trits128(q));
    }
    decode_tq1_qh(b, dst);
}

/// Σ c·x over 4 × 32 bytes: `vpmaddubsw` pairs (|sum| ≤ 2·2·127 = 508) summed four times in
/// i16 (≤ 2032, no saturation), then widened once with `vpmaddwd`.
#[inline(always)]
unsafe fn dot4(c: &[__m256i; 4], x: *const i8, offsets: [usize; 4]) -> __m256i {
    let mut s = _mm256_maddubs_epi16(c[0], load(x.add(offsets[0]) as *const u8));
    for n in 1..4 {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(c[n], load(x.add(offsets[n]) as *const u8)));
    }
    _mm256_madd_epi16(s, _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn dot_codes(codes: &[u8], x: &[i8]) -> i32 {
    debug_assert!(codes.len() == x.len() && codes.len().is_multiple_of(128));
    let mut acc = _mm256_setzero_si256();
    let (c, xp) = (codes.as_ptr(), x.as_ptr());
    for i in (0..codes.len()).step_by(128) {
        let cv = [load(c.add(i)), load(c.add(i + 32)), load(c.add(i + 64)), load(c.add(i + 96))];
        acc = _mm256_add_epi32(acc, dot4(&cv, xp.add(i), [0, 32, 64, 96]));
    }
    hsum_i32(acc)
}

/// Up to 8 tokens: each 128 codes are loaded once for all the tokens (as
/// `x86_avx512::dot_codes_tokens`); a constant token count per instance keeps the 4 code
/// vectors and the accumulators in the 16 registers.
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn dot_codes_tokens(codes: &[u8], tokens: &[i8], out: &mut [i32]) {
    dot_codes_by_token_count!(dot_codes, dot_codes_n, codes, tokens, out)
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn dot_codes_n<const T: usize>(codes: &[u8], tokens: &[i8], out: &mut [i32]) {
    let n = codes.len();
    debug_assert!(n.is_multiple_of(128) && tokens.len() == n * T && out.len() == T);
    let (c, xp) = (codes.as_ptr(), tokens.as_ptr());
    let mut acc = [_mm256_setzero_si256(); T];
    for i in (0..n).step_by(128) {
        let cv = [load(c.add(i)), load(c.add(i + 32)), load(c.add(i + 64)), load(c.add(i + 96))];
        for (t, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi32(*a, dot4(&cv, xp.add(t * n + i), [0, 32, 64, 96]));
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = hsum_i32(a);
    }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn and_planes(mask: Option<&[u64]>, sign: &[u64], plane: &[u64], words: usize, dst: &mut [u64]) {
    let x_words = dst.len() / 2;
    debug_assert!(sign.len() >= words && plane.len() >= words && x_words >= words);
    let (dm, ds) = dst.split_at_mut(x_words);
    let body = words / 4 * 4;
    let and_into = |src: &[u64], out: &mut [u64]| {
        for w in (0..body).step_by(4) {
            let v = _mm256_and_si256(load(src.as_ptr().add(w) as *const u8), load(plane.as_ptr().add(w) as *const u8));
            store(out.as_mut_ptr().add(w) as *mut u8, v);
        }
        for w in body..words {
            out[w] = src[w] & plane[w];
        }
        out[words..].fill(0);
    };
    if let Some(mask) = mask {
        and_into(mask, dm);
    }
    and_into(sign, ds);
}

/// Per-byte population counts of a vector (Mula's nibble table).
#[inline(always)]
unsafe fn popcnt_bytes(v: __m256i) -> __m256i {
    let lut = _mm256_setr_epi8(
        0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
    );
    let low = _mm256_set1_epi8(0x0f);
    let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low));
    let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
    _mm256_add_epi8(lo, hi)
}

/// Population count of a vector as 4 u64 lanes.
#[inline(always)]
unsafe fn popcnt_u64x4(v: __m256i) -> __m256i {
    _mm256_sad_epu8(popcnt_bytes(v), _mm256_setzero_si256())
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn popcount(words: &[u64]) -> u32 {
    let body = words.len() / 4 * 4;
    let mut acc = _mm256_setzero_si256();
    for w in (0..body).step_by(4) {
        acc = _mm256_add_epi64(acc, popcnt_u64x4(load(words.as_ptr().add(w) as *const u8)));
    }
    let tail: u32 = words[body..].iter().map(|w| w.count_ones()).sum();
    hsum_u64(acc) as u32 + tail
}
