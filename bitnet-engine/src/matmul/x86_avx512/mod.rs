//! AVX-512 matmul kernels: VNNI `vpdpbusd` (64 unsigned-code × signed-int8 products per
//! instruction) and VPOPCNTDQ. AVX-512F implies AVX2, so the AVX2 TQ1 decoder and table-lookup
//! kernel are reused here. This file: the `IsaOps` entry points, block decoders, the split
//! form's dot stage and popcount; `codes` the fused I2/TQ2 tiles, `tq1` the base-3 kernels
//! (and `lut` with AVX-512 masks), `perm` the `vpermb` TQ1 kernel, `xnor` the bit-plane kernel.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::activations::{ActivationBatch, ACT_PLANES, PLANE_WEIGHTS};
use crate::aligned::AlignedBytes;
use crate::formats::i2::{I2_BLOCK_BYTES, I2_BLOCK_WEIGHTS};
use crate::formats::tq1_perm::PERM_TILE_ROWS;
use crate::formats::{BlockTq1_0, BlockTq2_0, I2Matrix, PackedWeights, Tq1Matrix, Tq1PermMatrix, Tq2Matrix, QK_K};
use crate::matmul::portable::{
    i2_tail_dot, run, tq1_digit_order, tq1_row_chunks, tq1_row_digit_order, tq2_lane_order, IsaOps, TQ1_DIGIT_BLOCK,
};
use crate::matmul::x86_avx2::lut::{lut_emit, lut_widen_span, LookupRows};
use crate::matmul::x86_avx2::tq1::{times3_asm, tq1_rows_with};
use crate::matmul::x86_avx2::{decode_tq1_block as decode_tq1_block_avx2, encode_i2_block};
use crate::matmul::{
    batched_tiles, finish_blocks, finish_tensor, tile_pointers, KernelForm, KernelScratch, TokenTables,
};
use crate::simd::x86_avx2::{f16_to_f64, prefetch_stream, prefetch_stream_span, PrefetchShares};
use crate::simd::x86_avx512::*;

mod codes;
mod perm;
pub(super) mod tq1;
mod xnor;

use codes::*;
use perm::*;
use tq1::*;
use xnor::*;

pub(crate) fn matmul(
    isa: Avx512,
    form: KernelForm,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    run(isa, form, w, x, rows, out, scratch)
}

// SAFETY (for every `unsafe` block in this impl): `self` is an `Avx512` token, created by
// `Avx512::new` only when the CPU supports every feature the callees enable (which include
// AVX2); slice bounds are guaranteed by the callers (lengths are multiples of 256 by
// construction of `ActivationBatch`, the tile and the formats) and checked by `debug_assert!`s.
impl IsaOps for Avx512 {
    fn decode_i2_block(self, src: &[u8], dst: &mut [u8]) {
        unsafe { decode_i2_block(src, dst) }
    }
    fn decode_tq2_block(self, b: &BlockTq2_0, dst: &mut [u8]) {
        unsafe { decode_tq2_block(b, dst) }
    }
    fn decode_tq1_block(self, b: &BlockTq1_0, dst: &mut [u8]) {
        unsafe { decode_tq1_block_avx2(b, dst) }
    }
    fn dot_codes(self, codes: &[u8], x: &[i8]) -> i32 {
        unsafe { dot_codes(codes, x) }
    }
    fn dot_codes_tile(self, codes: &[u8], n: usize, tokens: &[i8], out: &mut [i32]) {
        let nt = tokens.len() / n.max(1);
        assert!(
            n.is_multiple_of(256) && codes.len().is_multiple_of(n) && tokens.len() == n * nt && (1..=8).contains(&nt)
        );
        assert_eq!(out.len(), codes.len() / n * nt);
        // SAFETY: the token proves AVX-512 VNNI; the asserts above keep every load in bounds.
        unsafe { dot_codes_tile(codes, n, tokens, out) }
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
    fn tq2_fused(
        self,
        w: &Tq2Matrix,
        x: &ActivationBatch,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut KernelScratch,
    ) {
        unsafe { tq2_fused(w, x, rows, out, scratch) }
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
    /// The AVX2 kernel's 256-bit loop, with its signs and nibbles in AVX-512 masks and GFNI
    /// where the CPU has GFNI ([`MaskSigns`]), else as on AVX2. On Zen 4, whose AVX-512 runs
    /// on 256-bit units, it beats the fused `vpdpbusd` kernel, and `perm` beats it (see
    /// `KernelFamily::default_form`).
    fn tq1_lut(
        self,
        w: &crate::formats::Tq1LutMatrix,
        x: &ActivationBatch,
        tables: TokenTables<'_>,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        if std::arch::is_x86_feature_detected!("gfni") {
            // SAFETY: the token proves AVX-512 F/BW/VL (and AVX2); GFNI is checked above.
            unsafe { tq1_lut_masks(w, x, tables, rows, out) }
        } else {
            unsafe { crate::matmul::x86_avx2::lut::tq1_lut(w, x, tables, rows, out) }
        }
    }

    /// The `vpermb` kernel where the CPU has VBMI and GFNI (`Kernel::new` offers the `perm`
    /// form at AVX-512 only then), else the portable one.
    fn tq1_perm(
        self,
        w: &Tq1PermMatrix,
        x: &ActivationBatch,
        tables: TokenTables<'_>,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        if perm_supported() {
            // SAFETY: the token proves AVX-512 F/BW/VL (and AVX2); VBMI and GFNI are checked.
            unsafe { tq1_perm(w, x, tables, rows, out) }
        } else {
            crate::matmul::portable::tq1_perm_portable(w, x, tables, rows, out)
        }
    }
}

/// Whether this CPU has what the `perm` kernel needs beyond the AVX-512 level: VBMI
/// (`vpermb`) and GFNI (`vgf2p8affineqb`).
pub(crate) fn perm_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512vbmi") && std::arch::is_x86_feature_detected!("gfni")
}

/// Codes `(v >> 2n) & 3`: field n of every byte of an I2 block, the codes of its weights
/// 64n..64n+64. `n` is a constant wherever this is inlined (an unrolled loop).
#[inline(always)]
unsafe fn i2_field(v: __m512i, n: usize) -> __m512i {
    let shifted = match n {
        0 => v,
        1 => _mm512_srli_epi16::<2>(v),
        2 => _mm512_srli_epi16::<4>(v),
        _ => _mm512_srli_epi16::<6>(v),
    };
    _mm512_and_si512(shifted, _mm512_set1_epi8(3))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn decode_i2_block(src: &[u8], dst: &mut [u8]) {
    debug_assert!(src.len() >= I2_BLOCK_BYTES && dst.len() >= I2_BLOCK_WEIGHTS);
    let c = split4(load(src.as_ptr()));
    for (n, cn) in c.iter().enumerate() {
        store(dst.as_mut_ptr().add(64 * n), *cn);
    }
}

/// TQ2_0 codes as four 64-lane vectors in natural order: code vector v holds weights
/// 64v..64v+64. Each 32-byte half of the block (128 weights, shifts 0,2,4,6 ↔ 32-weight runs)
/// is broadcast to both 256-bit lanes and shifted by a different amount per lane.
#[inline(always)]
unsafe fn tq2_codes(qs: *const u8) -> [__m512i; 4] {
    // Not array::from_fn: see reduce16.
    [tq2_code_vector(qs, 0), tq2_code_vector(qs, 1), tq2_code_vector(qs, 2), tq2_code_vector(qs, 3)]
}

/// Code vector v of [`tq2_codes`] alone: half v / 2 of the block broadcast, shifted by 0 and 2
/// (even v) or 4 and 6 (odd v) per 256-bit lane.
#[inline(always)]
unsafe fn tq2_code_vector(qs: *const u8, v: usize) -> __m512i {
    // 16-bit lane shifts: lanes 0..16 (bytes 0..32) by the first, lanes 16..32 by the second.
    let (s0, s1) = if v.is_multiple_of(2) { (0, 2) } else { (4, 6) };
    let shifts = _mm512_inserti64x4::<1>(_mm512_set1_epi16(s0), _mm256_set1_epi16(s1));
    let half = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * (v / 2)) as *const __m256i));
    _mm512_and_si512(_mm512_srlv_epi16(half, shifts), _mm512_set1_epi8(3))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn decode_tq2_block(b: &BlockTq2_0, dst: &mut [u8]) {
    debug_assert!(dst.len() >= QK_K);
    let c = tq2_codes(b.qs.as_ptr());
    for (v, cv) in c.iter().enumerate() {
        store(dst.as_mut_ptr().add(64 * v), *cv);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn dot_codes(codes: &[u8], x: &[i8]) -> i32 {
    debug_assert!(codes.len() == x.len() && codes.len().is_multiple_of(256));
    let (c, xp) = (codes.as_ptr(), x.as_ptr() as *const u8);
    let mut acc = [_mm512_setzero_si512(); 4];
    for i in (0..codes.len()).step_by(256) {
        for (n, a) in acc.iter_mut().enumerate() {
            *a = _mm512_dpbusd_epi32(*a, load(c.add(i + 64 * n)), load(xp.add(i + 64 * n)));
        }
    }
    let s = _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3]));
    _mm512_reduce_add_epi32(s)
}

/// Up to 8 tokens: each 64 codes are loaded once and multiplied into every token's
/// accumulator (the one-token loop above loads a vector of codes per product, so at a batch
/// its loads, not its `vpdpbusd`s, set the pace). A constant token count per instance keeps
/// the accumulators in registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn dot_codes_tokens(codes: &[u8], tokens: &[i8], out: &mut [i32]) {
    dot_codes_by_token_count!(dot_codes, dot_codes_n, codes, tokens, out)
}

/// Rows of `n` codes × tokens: tiles of 4 rows × up to 4 tokens or 2 rows × 5 to 8, where each
/// vector of a token serves every row of the tile; other shapes a row at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn dot_codes_tile(codes: &[u8], n: usize, tokens: &[i8], out: &mut [i32]) {
    let (rows, nt) = (codes.len() / n, tokens.len() / n);
    match (rows, nt) {
        (4, 1) => dot_codes_rows_n::<4, 1>(codes, n, tokens, out),
        (4, 2) => dot_codes_rows_n::<4, 2>(codes, n, tokens, out),
        (4, 3) => dot_codes_rows_n::<4, 3>(codes, n, tokens, out),
        (4, 4) => dot_codes_rows_n::<4, 4>(codes, n, tokens, out),
        (2, 5) => dot_codes_rows_n::<2, 5>(codes, n, tokens, out),
        (2, 6) => dot_codes_rows_n::<2, 6>(codes, n, tokens, out),
        (2, 7) => dot_codes_rows_n::<2, 7>(codes, n, tokens, out),
        (2, 8) => dot_codes_rows_n::<2, 8>(codes, n, tokens, out),
        _ => {
            for (row, o) in codes.chunks_exact(n).zip(out.chunks_exact_mut(nt)) {
                dot_codes_tokens(row, tokens, o);
            }
        }
    }
}

/// R rows × T tokens, `out[i × T + t]`; loops, not `array::from_fn`, so that nothing is left
/// out of line.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn dot_codes_rows_n<const R: usize, const T: usize>(codes: &[u8], n: usize, tokens: &[i8], out: &mut [i32]) {
    debug_assert!(n.is_multiple_of(64) && codes.len() == n * R && tokens.len() == n * T && out.len() == R * T);
    let (c, xp) = (codes.as_ptr(), tokens.as_ptr() as *const u8);
    let mut acc = [[_mm512_setzero_si512(); T]; R];
    let mut cv = [_mm512_setzero_si512(); R];
    for i in (0..n).step_by(64) {
        for (r, v) in cv.iter_mut().enumerate() {
            *v = load(c.add(r * n + i));
        }
        for t in 0..T {
            let xv = load(xp.add(t * n + i));
            for r in 0..R {
                acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], cv[r], xv);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            out[r * T + t] = _mm512_reduce_add_epi32(acc[r][t]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn dot_codes_n<const T: usize>(codes: &[u8], tokens: &[i8], out: &mut [i32]) {
    let n = codes.len();
    debug_assert!(n.is_multiple_of(64) && tokens.len() == n * T && out.len() == T);
    let (c, xp) = (codes.as_ptr(), tokens.as_ptr() as *const u8);
    let mut acc = [_mm512_setzero_si512(); T];
    for i in (0..n).step_by(64) {
        let cv = load(c.add(i));
        for (t, a) in acc.iter_mut().enumerate() {
            *a = _mm512_dpbusd_epi32(*a, cv, load(xp.add(t * n + i)));
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = _mm512_reduce_add_epi32(a);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn and_planes(mask: Option<&[u64]>, sign: &[u64], plane: &[u64], words: usize, dst: &mut [u64]) {
    let x_words = dst.len() / 2;
    debug_assert!(sign.len() >= words && plane.len() >= words && x_words >= words);
    let (dm, ds) = dst.split_at_mut(x_words);
    let and_into = |src: &[u64], out: &mut [u64]| {
        let mut w = 0;
        while w < words {
            // Masked loads/stores cover the last partial vector without reading past `words`.
            let k: __mmask8 = if words - w >= 8 { 0xff } else { (1u8 << (words - w)) - 1 };
            let v = _mm512_and_si512(
                _mm512_maskz_loadu_epi64(k, src.as_ptr().add(w) as *const i64),
                _mm512_maskz_loadu_epi64(k, plane.as_ptr().add(w) as *const i64),
            );
            _mm512_mask_storeu_epi64(out.as_mut_ptr().add(w) as *mut i64, k, v);
            w += 8;
        }
        out[words..].fill(0);
    };
    if let Some(mask) = mask {
        and_into(mask, dm);
    }
    and_into(sign, ds);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn popcount(words: &[u64]) -> u32 {
    let mut acc = _mm512_setzero_si512();
    let mut w = 0;
    while w < words.len() {
        let k: __mmask8 = if words.len() - w >= 8 { 0xff } else { (1u8 << (words.len() - w)) - 1 };
        let v = _mm512_maskz_loadu_epi64(k, words.as_ptr().add(w) as *const i64);
        acc = _mm512_add_epi64(acc, _mm512_popcnt_epi64(v));
        w += 8;
    }
    _mm512_reduce_add_epi64(acc) as u32
}

/// Codes `(v >> 2n) & 3` for n = 0..4.
#[inline(always)]
unsafe fn split4(v: __m512i) -> [__m512i; 4] {
    // Not array::from_fn: see reduce16.
    [i2_field(v, 0), i2_field(v, 1), i2_field(v, 2), i2_field(v, 3)]
}
