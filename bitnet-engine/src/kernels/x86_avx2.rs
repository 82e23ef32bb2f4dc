//! AVX2 kernels: `vpmaddubsw` (unsigned codes × signed activations) and nibble-table popcount.
//!
//! Every public item takes an [`Avx2`] token, which exists only when the CPU reports AVX2, FMA
//! and POPCNT, so the `#[target_feature]` functions behind it are sound to call.

use std::arch::x86_64::*;
use std::ops::Range;

use super::portable::{
    decode_tq1_qh, i2_tail_dot, run, tq1_row_chunks, tq1_row_digit_order_offset, IsaOps, TQ1_DIGIT_BLOCK,
};
use super::{batched_tiles, finish_blocks, finish_tensor, tile_pointers, KernelForm, KernelScratch, TokenTables};
use crate::activations::{ActivationBatch, ACT_PLANES, PLANE_WEIGHTS};
use crate::aligned::AlignedBytes;
use crate::cpu::IsaLevel;
use crate::formats::i2::{I2_BLOCK_BYTES, I2_BLOCK_WEIGHTS};
use crate::formats::tq1_lut::{
    LUT_H_WEIGHT, LUT_NEGATION_BIAS, LUT_PAIR_TABLE_BYTES, LUT_SPAN_BYTES, LUT_SPAN_GROUPS, LUT_TILE_ROWS,
};
use crate::formats::{BlockTq1_0, BlockTq2_0, I2Matrix, PackedWeights, Tq1LutMatrix, Tq1Matrix, Tq2Matrix, QK_K};

/// Proof that AVX2 + FMA + POPCNT + F16C are available.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    pub(crate) fn new() -> Option<Self> {
        IsaLevel::Avx2.is_supported().then_some(Avx2(()))
    }
}

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

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn store(p: *mut u8, v: __m256i) {
    _mm256_storeu_si256(p as *mut __m256i, v)
}

/// Horizontal sum of 8 i32 lanes.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Codes `(v >> 2n) & 3` for n = 0..4.
#[inline(always)]
unsafe fn split4(v: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(v), m),
    ]
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

#[inline(always)]
unsafe fn hsum_u64(v: __m256i) -> u64 {
    let s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    (_mm_cvtsi128_si64(s) as u64).wrapping_add(_mm_extract_epi64::<1>(s) as u64)
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

/// Software prefetch distances of the weight-streaming kernels (here and in the AVX-512
/// module). Batch-1 decode streams weights from DRAM and the out-of-order window alone keeps
/// too few misses in flight. Measured on Zen 4 (2-vCPU VM), AVX-512 I2 over a 512 MiB set,
/// as a fraction of the bandwidth probe in the same run: no prefetch 50–60%; L2 at 32 KiB
/// 75–86%; L2 at 32 KiB plus L1 at 2 KiB 88–90% (L1 alone, or NTA hints, were worse). Rows are
/// contiguous, so the prefetches run on into the next rows; a prefetch never faults, even past
/// the end of the buffer.
///
/// Later, with the 4-row one-token kernels, the L2 distance was swept in the whole model
/// (distances alternating decode step by step in one process): the large preset with 2 threads
/// decoded 2–13% faster at 12–16 KiB than at 32 KiB (9 or 10 rounds of 10 each time, four
/// runs), 64 KiB was 10% slower; 2B4T (I2, TQ2, TQ1; 1 and 2 threads), large with 1 thread and
/// batch 8 moved by less than ±3% either way. Stopping the prefetches at the end of a thread's
/// rows did not help, so the gain is the distance, not less overshoot.
pub(crate) const PREFETCH_L2_BYTES: usize = 16 * 1024;
pub(crate) const PREFETCH_L1_BYTES: usize = 2 * 1024;

/// Asks for every cache line of `bytes` bytes from `p` in L2: for reads a little later that
/// are too short for the hardware prefetcher (one attention head's cached keys or values).
pub(crate) fn prefetch_l2(p: *const u8, bytes: usize) {
    let mut b = 0;
    while b < bytes {
        // SAFETY: SSE is part of x86-64; a prefetch is a hint that never faults, whatever the
        // address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(b) as *const i8) };
        b += 64;
    }
}

/// Asks for the cache lines of `ahead` (in L2) a share at a time: spread over a loop of
/// `steps` steps, the next step's rows stream in under this step's arithmetic, where asking for
/// them all at once stalls on the full miss queue (large decode, one thread: keys and values
/// read at 14–17 GB/s in the model). Built once per loop: share boundaries are a multiply and a
/// shift per step, where dividing per step (two 64-bit divisions per key) had cost about as
/// much as the key's dot product.
#[derive(Clone, Copy)]
pub(crate) struct PrefetchShares {
    start: usize,
    lines: usize,
    /// ⌈lines · 2³² / steps⌉: share `s` starts at line `s · per_step >> 32`.
    per_step: u64,
}

impl PrefetchShares {
    pub(crate) fn new<T>(ahead: &[T], steps: usize) -> Self {
        Self::of_bytes(ahead.as_ptr() as *const u8, std::mem::size_of_val(ahead), steps)
    }

    /// [`PrefetchShares::new`] for `bytes` bytes from `p` (nothing when `bytes` is 0).
    pub(crate) fn of_bytes(p: *const u8, bytes: usize, steps: usize) -> Self {
        let at = p as usize;
        let start = at & !63;
        let lines = if bytes == 0 { 0 } else { (at + bytes - start).div_ceil(64) };
        let per_step = ((lines as u64) << 32).div_ceil(steps.max(1) as u64);
        Self { start, lines, per_step }
    }

    /// The lines of share `step`: shares 0..steps together cover every line once, in order.
    #[inline(always)]
    pub(crate) fn share(&self, step: usize) -> Range<usize> {
        let line = |s: usize| (((s as u64 * self.per_step) >> 32) as usize).min(self.lines);
        line(step)..line(step + 1)
    }

    /// Asks for share `step` in L2.
    #[inline(always)]
    pub(crate) fn issue(&self, step: usize) {
        for l in self.share(step) {
            // SAFETY: SSE is part of x86-64; a prefetch is a hint that never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T1>((self.start + 64 * l) as *const i8) };
        }
    }
}

/// [`prefetch_stream`] for a block of `len` ≤ 128 bytes that may straddle two cache lines
/// (TQ2_0's 66-byte blocks where a row has several scales, TQ1_0's 54): prefetching by block
/// start alone skips one line in every 33 for 66-byte blocks, and each skipped line is a full
/// DRAM miss in the stream.
#[inline(always)]
pub(crate) unsafe fn prefetch_stream_span(p: *const u8, len: usize) {
    prefetch_stream(p);
    prefetch_stream(p.wrapping_add(len - 1));
}

/// Columns `cols` of a `[r_n, c_n]` matrix, transposed (see `kernels::transpose_cols_into`):
/// whole 8 × 8 tiles in registers, the edges (rows past the last multiple of 8, columns past the
/// last whole tile of `cols`) by plain loops.
pub(crate) fn transpose_cols_into(_t: Avx2, src: &[f32], r_n: usize, c_n: usize, cols: Range<usize>, dst: &mut [f32]) {
    assert!(cols.start <= cols.end && cols.end <= c_n, "columns {cols:?} of {c_n}");
    assert!(src.len() >= r_n * c_n && dst.len() >= cols.len() * r_n, "transpose buffers too short");
    let rows_full = r_n / 8 * 8;
    let cols_full = cols.start..cols.start + cols.len() / 8 * 8;
    // SAFETY: the token proves AVX2; the asserts above bound every tile (see the impl).
    unsafe { transpose_tiles(src, r_n, c_n, rows_full, cols_full.clone(), cols.start, dst) };
    // The edges, by plain loops (empty ranges where the tiles covered everything): the last
    // r_n − rows_full rows in every column of `cols`, then the columns past the last whole tile.
    let mut plain = |cs: Range<usize>, rs: Range<usize>| {
        for c in cs {
            for r in rs.clone() {
                dst[(c - cols.start) * r_n + r] = src[r * c_n + c];
            }
        }
    };
    plain(cols.clone(), rows_full..r_n);
    plain(cols_full.end..cols.end, 0..rows_full);
}

/// Tiles rows `0..rows_full` (a multiple of 8) × columns `cols` (a multiple of 8 long) of a
/// `[r_n, c_n]` source: eight 8-float rows in, eight 8-float columns out.
///
/// SAFETY: the caller guarantees `rows_full ≤ r_n`, `cols.end ≤ c_n`, `src.len() ≥ r_n·c_n` and
/// `dst.len() ≥ (cols.end − first)·r_n`, so every load (row < rows_full, column < cols.end) and
/// every store (destination row < cols.end − first, column < rows_full) is in bounds.
#[target_feature(enable = "avx2")]
unsafe fn transpose_tiles(
    src: &[f32],
    r_n: usize,
    c_n: usize,
    rows_full: usize,
    cols: Range<usize>,
    first: usize,
    dst: &mut [f32],
) {
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    for r0 in (0..rows_full).step_by(8) {
        for c0 in cols.clone().step_by(8) {
            let v: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(s.add((r0 + i) * c_n + c0)));
            for (j, col) in transpose8x8(v).into_iter().enumerate() {
                _mm256_storeu_ps(d.add((c0 - first + j) * r_n + r0), col);
            }
        }
    }
}

/// The 8 × 8 tile whose row i is `v[i]`, transposed: column j in element j.
#[inline(always)]
unsafe fn transpose8x8(v: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved, then pairs of pairs: each 128-bit half now holds four
    // consecutive rows of one column; the lane permute joins the two halves.
    let t = [
        _mm256_unpacklo_ps(v[0], v[1]),
        _mm256_unpackhi_ps(v[0], v[1]),
        _mm256_unpacklo_ps(v[2], v[3]),
        _mm256_unpackhi_ps(v[2], v[3]),
        _mm256_unpacklo_ps(v[4], v[5]),
        _mm256_unpackhi_ps(v[4], v[5]),
        _mm256_unpacklo_ps(v[6], v[7]),
        _mm256_unpackhi_ps(v[6], v[7]),
    ];
    let u: [__m256; 8] = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    std::array::from_fn(|j| {
        if j < 4 {
            _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j])
        }
    })
}

/// Columns `c0..c0 + 8` of a `[r_n, c_n]` matrix into eight separate rows (see
/// `kernels::transpose_8_cols_to_rows`): 8 × 8 tiles in registers, the last r_n mod 8 rows by
/// a plain loop.
pub(crate) fn transpose_8_cols_to_rows(_t: Avx2, src: &[f32], c_n: usize, c0: usize, dsts: [&mut [f32]; 8]) {
    let r_n = dsts[0].len();
    assert!(dsts.iter().all(|d| d.len() == r_n), "rows of different lengths");
    assert!(c0 + 8 <= c_n && src.len() >= r_n * c_n, "columns {c0}..{} of {c_n}, or source too short", c0 + 8);
    let rows_full = r_n / 8 * 8;
    let d: [*mut f32; 8] = std::array::from_fn(|k| dsts[k].as_mut_ptr());
    // SAFETY: the token proves AVX2; the asserts bound every tile (see the impl).
    unsafe { transpose_tiles_to_rows(src, c_n, c0, rows_full, d) };
    for (k, dst) in dsts.into_iter().enumerate() {
        for r in rows_full..r_n {
            dst[r] = src[r * c_n + c0 + k];
        }
    }
}

/// Tiles of [`transpose_8_cols_to_rows`].
///
/// SAFETY: the caller guarantees `c0 + 8 ≤ c_n`, `src.len() ≥ rows_full·c_n` and that each of
/// `d` points to at least `rows_full` writable floats of its own, so every load (row <
/// rows_full, column < c0 + 8) and every store (8 floats from row r0 < rows_full) is in
/// bounds.
#[target_feature(enable = "avx2")]
unsafe fn transpose_tiles_to_rows(src: &[f32], c_n: usize, c0: usize, rows_full: usize, d: [*mut f32; 8]) {
    let s = src.as_ptr();
    for r0 in (0..rows_full).step_by(8) {
        let v: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(s.add((r0 + i) * c_n + c0)));
        for (k, col) in transpose8x8(v).into_iter().enumerate() {
            _mm256_storeu_ps(d[k].add(r0), col);
        }
    }
}

/// One ascending stream over rows stored back to back, read R at a time, `step` bytes of each
/// row per pass from offset `off`: asks for the lines of that stretch of the tile
/// (`first_row + R·off ..`) [`PREFETCH_L2_BYTES`] ahead, into L2, one request per line.
#[inline(always)]
pub(crate) unsafe fn prefetch_rows_l2<const R: usize>(first_row: *const u8, off: usize, step: usize) {
    let mut at = (R * off).next_multiple_of(64);
    while at < R * (off + step) {
        _mm_prefetch::<_MM_HINT_T1>(first_row.wrapping_add(at + PREFETCH_L2_BYTES) as *const i8);
        at += 64;
    }
}

/// Prefetches for the block that starts at `p` is about to be read: one line into L2 far ahead,
/// one into L1 near ahead.
#[inline(always)]
pub(crate) unsafe fn prefetch_stream(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_L2_BYTES) as *const i8);
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_L1_BYTES) as *const i8);
}

/// f16 block scale → f64 with the F16C instruction (inlined, unlike a library call).
#[inline(always)]
pub(crate) unsafe fn f16_to_f64(d: half::f16) -> f64 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d.to_bits() as i32))) as f64
}

/// Bytes of a block of 256 2-bit codes the code tiles read: an I2_S block, or a TQ2_0 block's
/// codes alone ([`Tq2Matrix::codes`]).
const CODE_BLOCK_BYTES: usize = I2_BLOCK_BYTES;
const _: () = assert!(I2_BLOCK_BYTES == crate::formats::tq2::CODE_BYTES);

/// Tokens processed together per pass over a weight row (codes unpacked once for all of them).
const GROUP: usize = 4;

/// Rows of a batched I2/TQ2 tile: two rows × [`GROUP`] tokens ([`code_tile_2x4`]), one row
/// for the groups of fewer tokens and a block's last odd row ([`code_tile`]). Measured with
/// intrinsics before the assembly tile (Zen 3, `bitnet-bench kernels --batch 8`, Mrow·tok/s,
/// 2560-wide rows / the 6912-wide down projection): 1 × 4 45.7 / 18.2; 2 × 4 39–42 / 16.1–16.6
/// (LLVM spilled accumulators with AVX2's 16 registers); 1 × 8 44.8 / 12.5 (eight tokens of
/// 6912-wide activations, 55 KiB, overflow the 32 KiB L1d).
const TILE_ROWS: usize = 2;

/// Blocks of 256 codes summed in i16 lanes before they are widened to i32 (one `vpmaddwd` per
/// accumulator): a `vpmaddubsw` pair sum of codes ≤ 2 and activations in [−128, 127] lies in
/// [−512, 508], eight per block and lane, so four blocks stay within [−16384, 16256]. Widening
/// every half block, as the kernels before these did, cost one multiply for four.
const I16_BLOCKS: usize = 4;

/// Runs `$tile::<R, G>($args…)` for the token count `$g` ∈ 1..=4 of a [`batched_tiles`] step
/// and the rows `$left` it may take: two rows ([`code_tile_2x4`]) for a whole group of four
/// tokens, else one. Evaluates to the rows it did.
macro_rules! code_tile_for {
    ($tile:ident, $g:expr, $left:expr, ($($arg:expr),*)) => {{
        match ($g, $left >= 2) {
            (1, _) => { $tile::<1, 1>($($arg),*); 1 }
            (2, _) => { $tile::<1, 2>($($arg),*); 1 }
            (3, _) => { $tile::<1, 3>($($arg),*); 1 }
            (_, true) => { $tile::<2, GROUP>($($arg),*); 2 }
            (_, false) => { $tile::<1, GROUP>($($arg),*); 1 }
        }
    }};
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn i2_fused(w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let batch = x.batch();
    if batch > 1 {
        batched_tiles::<TILE_ROWS, GROUP>(rows, w.row_bytes(), batch, out, |r, left, b0, g, first, o| {
            code_tile_for!(i2_tile, g, left, (w, r, x, b0, first, o))
        });
        return;
    }
    // One token: four rows per pass, each half-block's activation vectors loaded once for them
    // all and their sums reduced and finished together; on short rows (K = 1536, six blocks)
    // the work between two passes' code loops weighs as much as a block.
    let mut r = rows.start;
    let tiles = rows.len() / 4;
    if w.tail_weights() == 0 && tiles > 0 {
        let (xsum, ws, xs) = (_mm_set1_epi32(x.sum(0)), _mm_set1_ps(w.scale()), _mm_set1_ps(x.scale(0)));
        one_token_tiles::<false>(w.row(r).as_ptr(), w.row_bytes(), w.full_blocks(), x, tiles, |t, sums| {
            // `finish_tensor`'s operations in its order, four rows at once (so the same bits).
            let v = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(sums, xsum)), ws), xs);
            store4_f32(v, &mut out[4 * t..]);
        });
        r += 4 * tiles;
    }
    while r < rows.end {
        let o = &mut out[r - rows.start..];
        r += match rows.end - r {
            1 => {
                i2_tile::<1, 1>(w, r, x, 0, true, o);
                1
            }
            2 | 3 => {
                i2_tile::<2, 1>(w, r, x, 0, true, o);
                2
            }
            _ => {
                i2_tile::<4, 1>(w, r, x, 0, true, o);
                4
            }
        };
    }
}

/// Rows `r..r+R` × tokens `b0..b0+G` of an I2 matrix ([`code_tile`] over its full blocks, then
/// the tail). Writes `out[i × batch + b]` for row `r + i`.
#[inline(always)]
unsafe fn i2_tile<const R: usize, const G: usize>(
    w: &I2Matrix,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    prefetch: bool,
    out: &mut [f32],
) {
    let batch = x.batch();
    let (src, xs) = tile_pointers::<R, G>(|i| w.row(i).as_ptr(), r, x, b0);
    let sums = tile_sums::<R, G, false>(src, w.full_blocks(), xs, prefetch);
    let (full, t) = (w.full_blocks(), w.tail_weights());
    if G == GROUP && t == 0 {
        let (xsums, xscales) = (&x.sums()[b0..b0 + GROUP], &x.scales()[b0..b0 + GROUP]);
        for i in 0..R {
            let v = _mm_cvtepi32_ps(_mm_sub_epi32(load4_i32(&sums[i]), load4_i32(xsums)));
            let v = _mm_mul_ps(_mm_mul_ps(v, _mm_set1_ps(w.scale())), _mm_loadu_ps(xscales.as_ptr()));
            store4_f32(v, &mut out[i * batch + b0..][..GROUP]);
        }
        return;
    }
    for i in 0..R {
        for g in 0..G {
            let b = b0 + g;
            let mut isum = sums[i][g];
            if t > 0 {
                isum += i2_tail_dot(&w.row(r + i)[full * I2_BLOCK_BYTES..], t, &x.token(b)[full * I2_BLOCK_WEIGHTS..]);
            }
            out[i * batch + b] = finish_tensor(isum - x.sum(b), w.scale(), x.scale(b));
        }
    }
}

/// One token × `tiles` passes over four rows each: the `4 × tiles` rows from `src` on lie
/// `row_stride` bytes apart, `blocks` I2 (or, with `TQ2`, TQ2_0 code) blocks each. Calls
/// `finish(t, sums)` with the integer sums of pass t's four rows. One loop for the run, so that
/// between two passes' code loops there is only the reduction and the finish: the per-pass
/// row checks, pointers and dispatch had cost 6–10% on 1536-wide rows.
#[inline(always)]
unsafe fn one_token_tiles<const TQ2: bool>(
    src: *const u8,
    row_stride: usize,
    blocks: usize,
    x: &ActivationBatch,
    tiles: usize,
    mut finish: impl FnMut(usize, __m128i),
) {
    debug_assert_eq!(x.batch(), 1);
    let xs = [x.token(0).as_ptr() as *const u8];
    for t in 0..tiles {
        let p = src.add(4 * t * row_stride);
        let rows = [p, p.add(row_stride), p.add(2 * row_stride), p.add(3 * row_stride)];
        let sums = code_tile::<4, 1, TQ2>(rows, blocks, xs, true);
        finish(t, load4_i32(sums.as_flattened()));
    }
}

/// Four i32 from `v[..4]`: a tile's sums of four tokens, or those tokens' activation sums.
#[inline(always)]
unsafe fn load4_i32(v: &[i32]) -> __m128i {
    _mm_loadu_si128(v[..4].as_ptr() as *const __m128i)
}

/// Stores four floats to `out[..4]`: the outputs of four tokens, computed together by the
/// [`GROUP`]-token tiles with the same operations, in the same order, as `finish_tensor` and
/// `finish_blocks` do one at a time (so the same bits), but without a dependent scalar chain
/// per output after each tile.
#[inline(always)]
unsafe fn store4_f32(v: __m128, out: &mut [f32]) {
    _mm_storeu_ps(out[..4].as_mut_ptr(), v)
}

/// [`code_tile`]'s sums, by [`code_tile_2x4`] for two rows × four tokens.
#[inline(always)]
unsafe fn tile_sums<const R: usize, const G: usize, const TQ2: bool>(
    src: [*const u8; R],
    blocks: usize,
    xs: [*const u8; G],
    prefetch: bool,
) -> [[i32; G]; R] {
    if R != 2 || G != GROUP || blocks == 0 {
        return code_tile::<R, G, TQ2>(src, blocks, xs, prefetch);
    }
    let mut xs4 = [std::ptr::null(); GROUP];
    xs4.copy_from_slice(&xs[..GROUP]);
    let rs = (src[R - 1] as usize).wrapping_sub(src[0] as usize);
    let two = code_tile_2x4::<TQ2>(src[0], rs, blocks, xs4, prefetch);
    let mut sums = [[0i32; G]; R];
    for i in 0..R {
        for g in 0..G {
            sums[i][g] = two[i][g];
        }
    }
    sums
}

/// Integer dot products of R back-to-back rows × G tokens over `blocks` blocks of 256 2-bit
/// codes, 64 bytes each: an I2 block (byte j of half h holds the weights 64n + 32h + j at
/// shift 2n) or, with `TQ2`, a TQ2_0 block's codes without its scale ([`Tq2Matrix::codes`]:
/// byte m of chunk h holds 128h + 32n + m). Field by field: the R rows' code vectors of field
/// n, then each token's 32 activations of that field, loaded once for all R rows, into i16
/// accumulators widened every [`I16_BLOCKS`] blocks. With `prefetch`, the R rows are asked for
/// as one ascending stream; later token groups of a row block read them from L2. Returns the
/// sum of row i and token g at `[i][g]`.
#[inline(always)]
unsafe fn code_tile<const R: usize, const G: usize, const TQ2: bool>(
    src: [*const u8; R],
    blocks: usize,
    xs: [*const u8; G],
    prefetch: bool,
) -> [[i32; G]; R] {
    let ones = _mm256_set1_epi16(1);
    // Plain loops and arrays, not array::from_fn: its closures are not always inlined, and out
    // of line they lose this function's target features.
    let mut acc = [[_mm256_setzero_si256(); G]; R];
    let mut blk = 0;
    while blk < blocks {
        let end = blocks.min(blk + I16_BLOCKS);
        let mut acc16 = [[_mm256_setzero_si256(); G]; R];
        while blk < end {
            let off = blk * CODE_BLOCK_BYTES;
            if prefetch {
                for i in 0..R {
                    prefetch_stream(src[0].wrapping_add(R * off + 64 * i));
                }
            }
            for h in 0..2 {
                let mut raw = [_mm256_setzero_si256(); R];
                for i in 0..R {
                    raw[i] = load(src[i].add(off + 32 * h));
                }
                for n in 0..4 {
                    // Field n only: the other three of `split4` are unused and folded away.
                    let mut c = [_mm256_setzero_si256(); R];
                    for i in 0..R {
                        c[i] = split4(raw[i])[n];
                    }
                    let x_off = if TQ2 { 128 * h + 32 * n } else { 64 * n + 32 * h };
                    for g in 0..G {
                        let xv = load(xs[g].add(blk * QK_K + x_off));
                        for i in 0..R {
                            acc16[i][g] = _mm256_add_epi16(acc16[i][g], _mm256_maddubs_epi16(c[i], xv));
                        }
                    }
                }
            }
            blk += 1;
        }
        for i in 0..R {
            for g in 0..G {
                acc[i][g] = _mm256_add_epi32(acc[i][g], _mm256_madd_epi16(acc16[i][g], ones));
            }
        }
    }
    reduce_tile(acc)
}

/// One field of a [`code_tile_2x4`] chunk: the two rows' codes `(raw >> shift) & 3` (`$split`,
/// four ops), then the eight products with the four tokens' 32 activations at byte `$o` of
/// the block, each added to its i16 accumulator. The activations are memory operands, loaded
/// once per row; `{p}` and `{q}` point at tokens 0 and 2, `{ts}` is the token stride.
macro_rules! field_2x4 {
    ($split:expr, $o:literal) => {
        concat!(
            $split,
            "vpmaddubsw {t0}, {c0}, ymmword ptr [{p} + ",
            $o,
            "]\n",
            "vpaddw {a00}, {a00}, {t0}\n",
            "vpmaddubsw {t1}, {c1}, ymmword ptr [{p} + ",
            $o,
            "]\n",
            "vpaddw {a10}, {a10}, {t1}\n",
            "vpmaddubsw {t0}, {c0}, ymmword ptr [{p} + {ts} + ",
            $o,
            "]\n",
            "vpaddw {a01}, {a01}, {t0}\n",
            "vpmaddubsw {t1}, {c1}, ymmword ptr [{p} + {ts} + ",
            $o,
            "]\n",
            "vpaddw {a11}, {a11}, {t1}\n",
            "vpmaddubsw {t0}, {c0}, ymmword ptr [{q} + ",
            $o,
            "]\n",
            "vpaddw {a02}, {a02}, {t0}\n",
            "vpmaddubsw {t1}, {c1}, ymmword ptr [{q} + ",
            $o,
            "]\n",
            "vpaddw {a12}, {a12}, {t1}\n",
            "vpmaddubsw {t0}, {c0}, ymmword ptr [{q} + {ts} + ",
            $o,
            "]\n",
            "vpaddw {a03}, {a03}, {t0}\n",
            "vpmaddubsw {t1}, {c1}, ymmword ptr [{q} + {ts} + ",
            $o,
            "]\n",
            "vpaddw {a13}, {a13}, {t1}\n",
        )
    };
}

/// `$split` of [`field_2x4`] for field 0 (no shift) and for the fields at `$shift` bits.
macro_rules! split_2x4 {
    () => {
        "vpand {c0}, {r0}, {m}\nvpand {c1}, {r1}, {m}\n"
    };
    ($shift:literal) => {
        concat!(
            "vpsrlw {c0}, {r0}, ",
            $shift,
            "\nvpand {c0}, {c0}, {m}\nvpsrlw {c1}, {r1}, ",
            $shift,
            "\nvpand {c1}, {c1}, {m}\n"
        )
    };
}

/// The prefetches of one block step of [`code_tile_2x4`]: the lines at `$line` bytes from
/// `{pf}`, each far ahead into L2 and near ahead into L1 (as [`prefetch_stream`]), then `{pf}`
/// moves on by `$advance` bytes (both rows' blocks, read as one ascending stream).
macro_rules! prefetch_2x4 {
    ($advance:literal, $($line:literal),*) => {
        concat!(
            $(
                "prefetcht1 byte ptr [{pf} + {l2} + ", $line, "]\n",
                "prefetcht0 byte ptr [{pf} + {l1} + ", $line, "]\n",
            )*
            "add {pf}, ", $advance, "\n"
        )
    };
}

/// A 32-byte code chunk at byte `$at` of both rows' blocks, its four fields against the
/// activations at `$o0..$o3` of the block.
macro_rules! chunk_2x4 {
    ($at:literal, $o0:literal, $o1:literal, $o2:literal, $o3:literal) => {
        concat!(
            "vmovdqu {r0}, ymmword ptr [{c} + ",
            $at,
            "]\nvmovdqu {r1}, ymmword ptr [{c} + {rs} + ",
            $at,
            "]\n",
            field_2x4!(split_2x4!(), $o0),
            field_2x4!(split_2x4!("2"), $o1),
            field_2x4!(split_2x4!("4"), $o2),
            field_2x4!(split_2x4!("6"), $o3),
        )
    };
}

/// Rows `src`, `src + rs` × tokens `xs` (equally spaced) over `blocks` ≥ 1 blocks of 256
/// 2-bit codes: [`code_tile`]'s sums for two rows and four tokens, the same integer additions
/// in another order, so exactly equal. In assembly because the tile needs 15 of AVX2's 16
/// vector registers (eight i16 accumulators, two code chunks, the mask, two fields, two
/// products): written with intrinsics, LLVM also kept the i32 sums in registers and spilled
/// accumulators in the inner loop (39–42 Mrow·tok/s against 45.7 for one row). Here the i32
/// sums live in memory, added to once per [`I16_BLOCKS`] blocks.
///
/// What two rows change: each code load and each field's split (two ops per row) still feed
/// four multiplies per row, and the activations are still memory operands of the multiplies,
/// read from L1 once per row (so per multiply the loads and splits are as many as one row's).
/// What the wider tile saves is the rest of the loop: one set of pointer and counter updates
/// for twice the work, no spills, and the i32 sums out of the registers. Zen 3 runs about 1.6
/// `vpmaddubsw` + `vpaddw` pairs and two vector loads per cycle. A C
/// mock-up of this loop alone reached 45 multiply-adds per cycle. In the
/// kernel (`bitnet-bench kernels --isa avx2 --form fused --batch 8 128`, one thread, old and
/// new binaries alternating), Mrow·tok/s: 2560-wide rows 45.5 → 47.7, the 6912-wide down
/// projection 18.1 → 19.4. A profile then put 83% of the time in this loop and 11% in the
/// tiles' outputs, one dependent scalar chain per output; computing a row's four outputs as
/// one vector ([`store4_f32`]) took 2560-wide rows to 50.3 (TQ2) and 51.4 (I2), down to 19.7
/// and 20.0.
///
/// With `prefetch` (the first token group, which streams the rows from memory), both rows are
/// asked for as one ascending stream, as [`code_tile`] does.
#[inline]
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn code_tile_2x4<const TQ2: bool>(
    src: *const u8,
    rs: usize,
    blocks: usize,
    xs: [*const u8; GROUP],
    prefetch: bool,
) -> [[i32; GROUP]; 2] {
    let ts = (xs[1] as usize).wrapping_sub(xs[0] as usize);
    debug_assert!(xs.windows(2).all(|w| (w[1] as usize).wrapping_sub(w[0] as usize) == ts));
    let m = _mm256_set1_epi8(3);
    let (mut c, mut p, mut q, mut pf, mut n) = (src, xs[0], xs[2], src, blocks);
    // The i32 sums, row-major ([i][g] at 4i + g), added to in memory once per I16_BLOCKS.
    let mut acc = [_mm256_setzero_si256(); 2 * GROUP];
    let sums = acc.as_mut_ptr();
    // SAFETY: the caller guarantees `blocks` ≥ 1 whole blocks in both rows from `src` and
    // `blocks × 256` activation bytes from each of `xs`; the asm reads only those (prefetches
    // never fault) and writes only `acc` and its register operands.
    macro_rules! run {
        ($stride:literal, $pf:expr, $chunks:expr $(, $($extra:tt)*)?) => {
            std::arch::asm!(
                "3:",
                // Blocks of this pass: min(n, I16_BLOCKS).
                "mov {k}, {i16_blocks}",
                "cmp {n}, {k}",
                "cmovb {k}, {n}",
                "sub {n}, {k}",
                "vpxor {a00}, {a00}, {a00}", "vpxor {a01}, {a01}, {a01}", "vpxor {a02}, {a02}, {a02}",
                "vpxor {a03}, {a03}, {a03}", "vpxor {a10}, {a10}, {a10}", "vpxor {a11}, {a11}, {a11}",
                "vpxor {a12}, {a12}, {a12}", "vpxor {a13}, {a13}, {a13}",
                "2:",
                $pf,
                $chunks,
                concat!("add {c}, ", $stride),
                "add {p}, 256",
                "add {q}, 256",
                "dec {k}",
                "jnz 2b",
                // Widen (i16 pairs → i32 lanes, `vpmaddwd` with ones) and add to the sums.
                "vpcmpeqw {t0}, {t0}, {t0}",
                "vpsrlw {t0}, {t0}, 15",
                "vpmaddwd {a00}, {a00}, {t0}", "vpaddd {a00}, {a00}, ymmword ptr [{acc}]",
                "vmovdqu ymmword ptr [{acc}], {a00}",
                "vpmaddwd {a01}, {a01}, {t0}", "vpaddd {a01}, {a01}, ymmword ptr [{acc} + 32]",
                "vmovdqu ymmword ptr [{acc} + 32], {a01}",
                "vpmaddwd {a02}, {a02}, {t0}", "vpaddd {a02}, {a02}, ymmword ptr [{acc} + 64]",
                "vmovdqu ymmword ptr [{acc} + 64], {a02}",
                "vpmaddwd {a03}, {a03}, {t0}", "vpaddd {a03}, {a03}, ymmword ptr [{acc} + 96]",
                "vmovdqu ymmword ptr [{acc} + 96], {a03}",
                "vpmaddwd {a10}, {a10}, {t0}", "vpaddd {a10}, {a10}, ymmword ptr [{acc} + 128]",
                "vmovdqu ymmword ptr [{acc} + 128], {a10}",
                "vpmaddwd {a11}, {a11}, {t0}", "vpaddd {a11}, {a11}, ymmword ptr [{acc} + 160]",
                "vmovdqu ymmword ptr [{acc} + 160], {a11}",
                "vpmaddwd {a12}, {a12}, {t0}", "vpaddd {a12}, {a12}, ymmword ptr [{acc} + 192]",
                "vmovdqu ymmword ptr [{acc} + 192], {a12}",
                "vpmaddwd {a13}, {a13}, {t0}", "vpaddd {a13}, {a13}, ymmword ptr [{acc} + 224]",
                "vmovdqu ymmword ptr [{acc} + 224], {a13}",
                "test {n}, {n}",
                "jnz 3b",
                c = inout(reg) c,
                rs = in(reg) rs,
                p = inout(reg) p,
                q = inout(reg) q,
                ts = in(reg) ts,
                n = inout(reg) n,
                k = out(reg) _,
                acc = in(reg) sums,
                i16_blocks = const I16_BLOCKS,
                m = in(ymm_reg) m,
                a00 = out(ymm_reg) _,
                a01 = out(ymm_reg) _,
                a02 = out(ymm_reg) _,
                a03 = out(ymm_reg) _,
                a10 = out(ymm_reg) _,
                a11 = out(ymm_reg) _,
                a12 = out(ymm_reg) _,
                a13 = out(ymm_reg) _,
                r0 = out(ymm_reg) _,
                r1 = out(ymm_reg) _,
                c0 = out(ymm_reg) _,
                c1 = out(ymm_reg) _,
                t0 = out(ymm_reg) _,
                t1 = out(ymm_reg) _,
                $($($extra)*)?
                options(nostack),
            )
        };
    }
    // With prefetches: `run!` plus their pointer and distances.
    macro_rules! run_prefetching {
        ($stride:literal, $pf:expr, $chunks:expr) => {
            run!(
                $stride,
                $pf,
                $chunks,
                pf = inout(reg) pf,
                l1 = const PREFETCH_L1_BYTES,
                l2 = const PREFETCH_L2_BYTES,
            )
        };
    }
    // TQ2_0 codes: chunk j (bytes 32j..) holds the weights 128j + 32n + m at shift 2n; I2_S:
    // half h (bytes 32h..) holds the weights 64n + 32h + m at shift 2n. Two rows' blocks span
    // 128 bytes, two lines.
    macro_rules! tq2_chunks {
        () => {
            concat!(chunk_2x4!("0", "0", "32", "64", "96"), chunk_2x4!("32", "128", "160", "192", "224"))
        };
    }
    macro_rules! i2_chunks {
        () => {
            concat!(chunk_2x4!("0", "0", "64", "128", "192"), chunk_2x4!("32", "32", "96", "160", "224"))
        };
    }
    match (TQ2, prefetch) {
        (true, false) => run!("64", "", tq2_chunks!()),
        (true, true) => run_prefetching!("64", prefetch_2x4!("128", "0", "64"), tq2_chunks!()),
        (false, false) => run!("64", "", i2_chunks!()),
        (false, true) => run_prefetching!("64", prefetch_2x4!("128", "0", "64"), i2_chunks!()),
    }
    let _ = (c, p, q, pf, n);
    reduce_tile([[acc[0], acc[1], acc[2], acc[3]], [acc[4], acc[5], acc[6], acc[7]]])
}

/// Lane sums of a tile's i32 accumulators, `[i][g]` for row i and token g: four per reduction
/// where there are four (a row's four tokens, or one token's four rows).
#[inline(always)]
unsafe fn reduce_tile<const R: usize, const G: usize>(acc: [[__m256i; G]; R]) -> [[i32; G]; R] {
    let mut sums = [[0i32; G]; R];
    let mut quad = [0i32; 4];
    if G == 1 && R == 4 {
        _mm_storeu_si128(quad.as_mut_ptr() as *mut __m128i, hsum4_i32([acc[0][0], acc[1][0], acc[2][0], acc[3][0]]));
        for i in 0..R {
            sums[i][0] = quad[i];
        }
    } else if G == 4 {
        for i in 0..R {
            _mm_storeu_si128(
                quad.as_mut_ptr() as *mut __m128i,
                hsum4_i32([acc[i][0], acc[i][1], acc[i][2], acc[i][3]]),
            );
            sums[i].copy_from_slice(&quad[..G]);
        }
    } else {
        for i in 0..R {
            for g in 0..G {
                sums[i][g] = hsum_i32(acc[i][g]);
            }
        }
    }
    sums
}

/// Lane sums of four vectors at once: `[Σa, Σb, Σc, Σd]`.
#[inline(always)]
unsafe fn hsum4_i32(v: [__m256i; 4]) -> __m128i {
    // hadd pairs within each 128-bit lane; two rounds leave, per lane, the four partial sums.
    let ab = _mm256_hadd_epi32(v[0], v[1]);
    let cd = _mm256_hadd_epi32(v[2], v[3]);
    let abcd = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256::<1>(abcd))
}

/// Batches of more than this many tokens take the repacked TQ1 kernel ([`repacked_rows`]):
/// from two token groups on, decoding a row's digits once costs less than decoding them again
/// for every group.
pub(crate) const UNPACK_MIN_BATCH: usize = GROUP + 1;

/// Bytes of repacked codes per row block of [`repacked_rows`] (a quarter of a byte per
/// weight): a quarter of Zen 3's 512 KiB L2, which also holds the packed rows streaming in for
/// the next block.
const REPACKED_BLOCK_BYTES: usize = 128 * 1024;

/// Bytes of [`KernelScratch::unpacked`] that [`repacked_rows`] needs for rows of `cols`
/// weights: a block, and at least one row.
pub(crate) fn unpacked_scratch_bytes(cols: usize) -> usize {
    (cols / 4).max(REPACKED_BLOCK_BYTES)
}

/// Most rows of a [`repacked_rows`] block (its partial sums live on the stack).
const REPACKED_BLOCK_ROWS: usize = 256;

/// Activation bytes of one token group's column chunk in [`repacked_rows`]: half of a 32 KiB
/// L1d, so the group's activations stay in L1 across a block's rows beside the codes streaming
/// from L2. Whole rows of a 6912-wide down projection (27 KiB for four tokens) did not: Zen 3,
/// `bitnet-bench kernels --batch 8`, TQ1 down 2560x6912, 7.6 Mrow·tok/s against 29.8 for the
/// 2560-wide rows.
const REPACKED_CHUNK_X_BYTES: usize = 16 * 1024;

/// Rows `rows` × every token of a batch, for weights whose rows decode to one code per weight
/// (weight + 1, so 0, 1 or 2) in column order: a block of rows is decoded (`decode(r, dst)`
/// writes row r's `cols` codes, one per byte, into a 256-byte block at a time) and repacked
/// into I2 blocks (2 bits a code); then each group of [`GROUP`] tokens runs over the block a
/// column chunk at a time with the I2 tiles ([`tile_sums`]: two rows × four tokens in the
/// assembly tile). Row r's outputs are `d(r) × (Σ code·x − Σ x)`, rounded to f32, times the
/// token's scale (`finish_blocks`), four tokens at a time in vectors with the same operations
/// (the scalar finish per output had cost the I2/TQ2 tiles about a tenth of their time).
///
/// Why: TQ1_0's base-3 digits cost about ten vector ops per 32 weights to decode; the
/// in-register kernel (`tq1_digit_tile`) pays that again for every group of four tokens, this
/// one once per row. The codes were first kept one per byte, for a one-row tile (Zen 3,
/// `bitnet-bench kernels`, TQ1, Mrow·tok/s on 2560-wide rows: B=8 25 → 28–30, B=128 23 → 42 against
/// the in-register kernel); repacked to 2 bits, a block is a quarter of the bytes and runs the
/// tile that I2_S and TQ2_0 batches run.
///
/// While a block computes, the next block's packed rows (`packed(range)`: their first byte and
/// length) are asked for in L2 a share per tile, so the decode pass finds them in cache.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn repacked_rows(
    rows: Range<usize>,
    cols: usize,
    x: &ActivationBatch,
    out: &mut [f32],
    codes: &mut AlignedBytes,
    packed: impl Fn(Range<usize>) -> (*const u8, usize),
    mut decode: impl FnMut(usize, usize, &mut [u8; QK_K]),
    d: impl Fn(usize) -> f64,
) {
    debug_assert!(cols > 0 && cols.is_multiple_of(QK_K));
    let batch = x.batch();
    if codes.len() < unpacked_scratch_bytes(cols) {
        *codes = AlignedBytes::zeroed(unpacked_scratch_bytes(cols));
    }
    let blocks = cols / QK_K;
    let row_bytes = blocks * I2_BLOCK_BYTES;
    let block_rows = (codes.len() / row_bytes).min(REPACKED_BLOCK_ROWS);
    // Column chunks of whole blocks, as even as they come, each within REPACKED_CHUNK_X_BYTES.
    let max_chunk = (REPACKED_CHUNK_X_BYTES / (GROUP * QK_K)).max(1);
    let chunk_blocks = blocks.div_ceil(blocks.div_ceil(max_chunk));
    let chunks = blocks.div_ceil(chunk_blocks);
    let mut sums = [[0i32; GROUP]; REPACKED_BLOCK_ROWS];
    let mut one = [0u8; QK_K];
    let mut start = rows.start;
    while start < rows.end {
        let end = rows.end.min(start + block_rows);
        for r in start..end {
            let dst = codes.as_mut_slice()[(r - start) * row_bytes..][..row_bytes].as_mut_ptr();
            for blk in 0..blocks {
                decode(r, blk, &mut one);
                encode_i2_block(one.as_ptr(), dst.add(blk * I2_BLOCK_BYTES));
            }
        }
        let next = end..rows.end.min(end + block_rows);
        let (ahead, ahead_len) = if next.is_empty() { (std::ptr::null(), 0) } else { packed(next) };
        let shares = PrefetchShares::of_bytes(ahead, ahead_len, batch.div_ceil(GROUP) * chunks * (end - start));
        let c = codes.as_slice().as_ptr();
        let mut step = 0;
        let mut b0 = 0;
        while b0 < batch {
            let g = GROUP.min(batch - b0);
            for k in 0..chunks {
                let (first, n) = (k * chunk_blocks, chunk_blocks.min(blocks - k * chunk_blocks));
                let mut r = start;
                while r < end {
                    shares.issue(step);
                    step += 1;
                    let src = c.add((r - start) * row_bytes + first * I2_BLOCK_BYTES);
                    let s = &mut sums[r - start..end - start];
                    r += code_tile_for!(repacked_tile, g, end - r, (src, row_bytes, n, first, x, b0, k == 0, s));
                }
            }
            for r in start..end {
                let o = &mut out[(r - rows.start) * batch + b0..][..g];
                if g == GROUP {
                    let dot = _mm_sub_epi32(load4_i32(&sums[r - start]), load4_i32(&x.sums()[b0..]));
                    let v = _mm256_mul_pd(_mm256_cvtepi32_pd(dot), _mm256_set1_pd(d(r)));
                    store4_f32(_mm_mul_ps(_mm256_cvtpd_ps(v), _mm_loadu_ps(x.scales()[b0..b0 + 4].as_ptr())), o);
                } else {
                    for (j, o) in o.iter_mut().enumerate() {
                        *o = finish_blocks(d(r) * (sums[r - start][j] - x.sum(b0 + j)) as f64, x.scale(b0 + j));
                    }
                }
            }
            b0 += g;
        }
        start = end;
    }
}

/// Rows `src`, `src + row_bytes`, … (R of them) of a [`repacked_rows`] block × tokens
/// `b0..b0 + G` over `n` I2 blocks from column block `first`: the tile's sums stored into
/// `sums[i][g]` (`fresh`: the first column chunk) or added to them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn repacked_tile<const R: usize, const G: usize>(
    src: *const u8,
    row_bytes: usize,
    n: usize,
    first: usize,
    x: &ActivationBatch,
    b0: usize,
    fresh: bool,
    sums: &mut [[i32; GROUP]],
) {
    let (src, xs) = tile_pointers::<R, G>(|i| src.add(i * row_bytes), 0, x, b0);
    let t = tile_sums::<R, G, false>(src, n, xs.map(|p| p.add(first * QK_K)), false);
    for (s, t) in sums.iter_mut().zip(&t) {
        for j in 0..G {
            s[j] = if fresh { t[j] } else { s[j] + t[j] };
        }
    }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn tq2_fused(w: &Tq2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let batch = x.batch();
    // Uniform rows read the codes without the scales (64-byte blocks, as I2_S: see
    // `Tq2Matrix::codes`) and their one scale from `row_scales`, never the blocks.
    let codes = w.codes().map_or(std::ptr::null(), |c| c.as_ptr());
    let row_bytes = w.blocks_per_row() * CODE_BLOCK_BYTES;
    if batch > 1 {
        batched_tiles::<TILE_ROWS, GROUP>(rows, row_bytes, batch, out, |r, left, b0, g, first, o| {
            // Rows with one scale for all their blocks take the integer tiles, as I2; a row
            // with a scale per block takes the f64 kernel.
            if w.row_has_uniform_scale(r) {
                let left = if left >= 2 && w.row_has_uniform_scale(r + 1) { left } else { 1 };
                return code_tile_for!(tq2_uniform_tile, g, left, (w, codes, r, x, b0, first, o));
            }
            tq2_row_block_scaled(w, r, x, b0, &mut o[b0..b0 + g]);
            1
        });
        return;
    }
    // One token: four uniform rows per pass (as I2), each run of uniform rows in one loop.
    let (xsum, xs) = (_mm_set1_epi32(x.sum(0)), _mm_set1_ps(x.scale(0)));
    let mut r = rows.start;
    while r < rows.end {
        let run = if w.all_rows_uniform() {
            rows.end - r
        } else {
            (r..rows.end).take_while(|&i| w.row_has_uniform_scale(i)).count()
        };
        let tiles = run / 4;
        if tiles > 0 {
            let (src, d, o) = (codes.add(r * row_bytes), &w.row_scales()[r..], &mut out[r - rows.start..]);
            one_token_tiles::<true>(src, row_bytes, w.blocks_per_row(), x, tiles, |t, sums| {
                // `finish_blocks`'s operations in its order, four rows at once (so the same bits).
                let d = _mm256_cvtps_pd(_mm_loadu_ps(d[4 * t..][..4].as_ptr()));
                let v = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(sums, xsum)), d);
                store4_f32(_mm_mul_ps(_mm256_cvtpd_ps(v), xs), &mut o[4 * t..]);
            });
            r += 4 * tiles;
            continue;
        }
        let o = &mut out[r - rows.start..];
        let uniform = |n: usize| r + n <= rows.end && (r..r + n).all(|i| w.row_has_uniform_scale(i));
        let n = if uniform(2) {
            tq2_uniform_tile::<2, 1>(w, codes, r, x, 0, true, o);
            2
        } else if uniform(1) {
            tq2_uniform_tile::<1, 1>(w, codes, r, x, 0, true, o);
            1
        } else {
            tq2_row_block_scaled(w, r, x, 0, &mut o[..1]);
            1
        };
        r += n;
    }
}

/// Row `r` of a TQ2_0 matrix whose blocks have different scales × tokens `b0..b0 + out.len()`:
/// each block's integer sum scaled by its own scale, accumulated in f64.
#[inline(always)]
unsafe fn tq2_row_block_scaled(w: &Tq2Matrix, r: usize, x: &ActivationBatch, b0: usize, out: &mut [f32]) {
    for (g, ob) in out.iter_mut().enumerate() {
        let b = b0 + g;
        let (xp, bs) = (x.token(b).as_ptr(), x.block_sums(b));
        let mut acc = 0f64;
        for (blk, block) in w.row(r).iter().enumerate() {
            prefetch_stream_span(block as *const BlockTq2_0 as *const u8, std::mem::size_of::<BlockTq2_0>());
            let xb = xp.add(blk * QK_K);
            let [c0, c1] = tq2_split(block);
            let s = _mm256_add_epi32(dot4(&c0, xb, [0, 32, 64, 96]), dot4(&c1, xb, [128, 160, 192, 224]));
            acc += f16_to_f64(block.d) * (hsum_i32(s) - bs[blk]) as f64;
        }
        *ob = finish_blocks(acc, x.scale(b));
    }
}

/// Uniform rows `r..r+R` (one scale for all their blocks) × tokens `b0..b0+G` of a TQ2_0
/// matrix: integer sums over its `codes` ([`code_tile`]), scaled once (exact; see the kernels
/// module docs).
#[inline(always)]
unsafe fn tq2_uniform_tile<const R: usize, const G: usize>(
    w: &Tq2Matrix,
    codes: *const u8,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    prefetch: bool,
    out: &mut [f32],
) {
    let batch = x.batch();
    let row_bytes = w.blocks_per_row() * CODE_BLOCK_BYTES;
    let (src, xs) = tile_pointers::<R, G>(|i| codes.add(i * row_bytes), r, x, b0);
    let sums = tile_sums::<R, G, true>(src, w.blocks_per_row(), xs, prefetch);
    if G == GROUP {
        let (xsums, xscales) = (&x.sums()[b0..b0 + GROUP], &x.scales()[b0..b0 + GROUP]);
        for i in 0..R {
            let d = _mm256_set1_pd(w.row_scales()[r + i] as f64);
            let v = _mm256_cvtepi32_pd(_mm_sub_epi32(load4_i32(&sums[i]), load4_i32(xsums)));
            let v = _mm_mul_ps(_mm256_cvtpd_ps(_mm256_mul_pd(v, d)), _mm_loadu_ps(xscales.as_ptr()));
            store4_f32(v, &mut out[i * batch + b0..][..GROUP]);
        }
        return;
    }
    for i in 0..R {
        let d = w.row_scales()[r + i] as f64;
        for g in 0..G {
            let b = b0 + g;
            out[i * batch + b] = finish_blocks(d * (sums[i][g] - x.sum(b)) as f64, x.scale(b));
        }
    }
}

/// A TQ2_0 block's codes: 32-byte chunk j holds weights 128j + 32n + m at shift 2n, so
/// `split4` of chunk j gives vectors for the activations at 128j + 32n.
#[inline(always)]
unsafe fn tq2_split(block: &BlockTq2_0) -> [[__m256i; 4]; 2] {
    [split4(load(block.qs.as_ptr())), split4(load(block.qs.as_ptr().add(32)))]
}

/// Shared shape of the TQ1 kernels: decode each block once into a stack tile, then dot it with
/// up to 64 tokens (block-scaled accumulation per token).
#[inline(always)]
pub(crate) unsafe fn tq1_rows_with<I: IsaOps>(
    isa: I,
    w: &Tq1Matrix,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    const CHUNK: usize = 64;
    let batch = x.batch();
    let mut codes = [0u8; QK_K];
    let mut acc = [0f64; CHUNK];
    for (i, r) in rows.enumerate() {
        let mut b0 = 0;
        while b0 < batch {
            let n = CHUNK.min(batch - b0);
            acc[..n].fill(0.0);
            for (blk, block) in w.row(r).iter().enumerate() {
                isa.decode_tq1_block(block, &mut codes);
                let d = block.d.to_f64();
                for (g, a) in acc[..n].iter_mut().enumerate() {
                    let q = &x.token(b0 + g)[blk * QK_K..(blk + 1) * QK_K];
                    *a += d * (isa.dot_codes(&codes, q) - x.block_sums(b0 + g)[blk]) as f64;
                }
            }
            for g in 0..n {
                out[i * batch + b0 + g] = finish_blocks(acc[g], x.scale(b0 + g));
            }
            b0 += n;
        }
    }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn tq1_fused(
    isa: Avx2,
    w: &Tq1Matrix,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    // Digits computed in registers from each row read as one stream of 64-byte chunks, against
    // every token's activations in the same row-stream order as the AVX-512 one-token kernel's,
    // offset to unsigned bytes (see `tq1_half_digits`).
    let batch = x.batch();
    if batch >= UNPACK_MIN_BATCH && rows.clone().all(|r| w.row_has_uniform_scale(r)) {
        // Two token groups or more: each row's digits decoded once, not once per group.
        let n = w.blocks_per_row();
        let (base, rb) = (w.blocks().as_ptr() as *const u8, n * std::mem::size_of::<BlockTq1_0>());
        repacked_rows(
            rows,
            n * QK_K,
            x,
            out,
            &mut scratch.unpacked,
            |next| (base.wrapping_add(next.start * rb), next.len() * rb),
            |r, blk, dst| decode_tq1_block(&w.row(r)[blk], dst),
            |r| f16_to_f64(w.row(r)[0].d),
        );
        return;
    }
    let stride = tq1_row_chunks(w.blocks_per_row()) * TQ1_DIGIT_BLOCK;
    if scratch.x_reordered.len() < batch * stride {
        scratch.x_reordered = AlignedBytes::zeroed(batch * stride);
    }
    let digits = &mut scratch.x_reordered.as_i8_mut()[..batch * stride];
    for (b, d) in digits.chunks_exact_mut(stride).enumerate() {
        tq1_row_digit_order_offset(x.token(b), d);
    }
    let xd = scratch.x_reordered.as_slice().as_ptr();
    let mut r = rows.start;
    while r < rows.end {
        let o = &mut out[(r - rows.start) * batch..];
        if !w.row_has_uniform_scale(r) {
            tq1_rows_with(isa, w, x, r..r + 1, &mut o[..batch]);
            r += 1;
            continue;
        }
        if batch == 1 {
            // One token: two rows per pass share each activation load.
            let two = r + 2 <= rows.end && w.row_has_uniform_scale(r + 1);
            if two {
                tq1_digit_tile::<2, 1>(w, r, x, xd, stride, 0, o);
            } else {
                tq1_digit_tile::<1, 1>(w, r, x, xd, stride, 0, o);
            }
            r += if two { 2 } else { 1 };
            continue;
        }
        // More tokens: each row's digits are computed once per chunk half for up to four.
        let mut b0 = 0;
        while b0 < batch {
            match batch - b0 {
                1 => tq1_digit_tile::<1, 1>(w, r, x, xd, stride, b0, o),
                2 => tq1_digit_tile::<1, 2>(w, r, x, xd, stride, b0, o),
                3 => tq1_digit_tile::<1, 3>(w, r, x, xd, stride, b0, o),
                _ => tq1_digit_tile::<1, GROUP>(w, r, x, xd, stride, b0, o),
            }
            b0 += GROUP.min(batch - b0);
        }
        r += 1;
    }
}

/// Defines `unsafe fn $name(y) -> y × 3 mod 256` per byte for one vector width, as two byte
/// adds in inline assembly (`$add_2y`, `$add_3y`), because written as intrinsics LLVM folds
/// the chain `y, 3y, 9y, …` into byte multiplications (`vpmullw` + shifts + blends), several
/// times the two adds. The scratch register is a typed output: an untyped `out(zmm_reg) _` is
/// printed with a byte-register name when it lands in zmm16–31 (an LLVM quirk), which does not
/// assemble.
macro_rules! times3_asm {
    ($(#[$doc:meta])* $name:ident: $ty:ty, $reg:ident, $features:literal, $add_2y:literal, $add_3y:literal) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name(y: $ty) -> $ty {
            let (out, _two_y): ($ty, $ty);
            std::arch::asm!(
                $add_2y,
                $add_3y,
                y = in($reg) y,
                t = out($reg) _two_y,
                o = lateout($reg) out,
                options(pure, nomem, nostack, preserves_flags),
            );
            out
        }
    };
}
pub(crate) use times3_asm;

times3_asm!(
    /// `y × 3 mod 256` per byte (see [`times3_asm`]).
    times3: __m256i, ymm_reg, "avx2", "vpaddb {t}, {y}, {y}", "vpaddb {o}, {t}, {y}"
);
times3_asm!(
    /// [`times3`] on 16 bytes.
    times3_128: __m128i, xmm_reg, "avx2", "vpaddb {t}, {y}, {y}", "vpaddb {o}, {t}, {y}"
);

/// One 64-byte chunk `p[i]` of each of R rows against G tokens' offset activations for the
/// chunk (`xc[g]`): adds Σ (x + 128)·(−digit) to `acc[i][g]` (i32 lanes).
///
/// Digit n of a code byte q is `(3·yₙ) >> 8` for `yₙ = 3ⁿq mod 256`, i.e. `(yₙ > 85) + (yₙ >
/// 170)`: two signed compares once the top bit is flipped (`q ^ 0x80`), and the flip is done
/// once per load, since 3 times the flipped byte is the flipped `3yₙ` (3·128 ≡ 128 mod 256).
/// The compares give −1 where true, so their sum is the negated digit in one add. It goes into
/// `vpmaddubsw` as the signed operand against activations offset to unsigned (`x + 128`), and
/// the caller takes the offset back with the row's digit sum; digits as the unsigned operand
/// against signed activations cost one more op per vector (`0 − c₁ − c₂`). A `vpmaddubsw` pair
/// is at least 2·255·(−2) = −1020, so a chunk's ten per lane (−10 200) sum in i16.
///
/// The loop runs digit by digit across all 2R code vectors, so that 2R independent chains of
/// `times3` are in flight at every step: the digit-major order within each vector left Zen 3
/// at under 3 of its 4 vector ops per cycle (B=1: 13.9 → 15.5 Mrow·tok/s on q/o, B=8: 23 → 27).
#[inline(always)]
unsafe fn tq1_digit_chunk<const R: usize, const G: usize>(
    p: [*const u8; R],
    xc: [*const u8; G],
    acc: &mut [[__m256i; G]; R],
) {
    let (t1, t2) = (_mm256_set1_epi8(-43), _mm256_set1_epi8(42));
    // Plain loops: nested `array::from_fn` is not always inlined, and a call here costs 2×.
    let mut y = [[_mm256_setzero_si256(); 2]; R];
    for i in 0..R {
        for h in 0..2 {
            y[i][h] = _mm256_xor_si256(load(p[i].add(32 * h)), _mm256_set1_epi8(-128));
        }
    }
    let mut s = [[_mm256_setzero_si256(); G]; R];
    for n in 0..5 {
        let mut xv = [[_mm256_setzero_si256(); 2]; G];
        for g in 0..G {
            for h in 0..2 {
                xv[g][h] = load(xc[g].add(32 * h + 64 * n));
            }
        }
        for i in 0..R {
            for h in 0..2 {
                if n > 0 {
                    y[i][h] = times3(y[i][h]);
                }
                let d = _mm256_add_epi8(_mm256_cmpgt_epi8(y[i][h], t1), _mm256_cmpgt_epi8(y[i][h], t2));
                for g in 0..G {
                    s[i][g] = _mm256_add_epi16(s[i][g], _mm256_maddubs_epi16(xv[g][h], d));
                }
            }
        }
    }
    for i in 0..R {
        for g in 0..G {
            acc[i][g] = _mm256_add_epi32(acc[i][g], _mm256_madd_epi16(s[i][g], _mm256_set1_epi16(1)));
        }
    }
}

/// Rows `r..r+R` (uniform scales) × tokens `b0..b0+G` of a TQ1_0 matrix, each row read as one
/// stream of 64-byte chunks across block boundaries against `xd`, every token's activations in
/// [`tq1_row_digit_order_offset`] (`stride` bytes per token): block scales and the fifth digit of
/// `qh` meet zero activations and add nothing. A row's last chunk may run into the next row
/// (zero activations too); where it would run past the matrix's end, it is copied into a zeroed
/// buffer first. Writes `out[i × batch + b]` for row `r + i`.
#[inline(always)]
unsafe fn tq1_digit_tile<const R: usize, const G: usize>(
    w: &Tq1Matrix,
    r: usize,
    x: &ActivationBatch,
    xd: *const u8,
    stride: usize,
    b0: usize,
    out: &mut [f32],
) {
    let batch = x.batch();
    let src: [*const u8; R] = std::array::from_fn(|i| w.row(r + i).as_ptr() as *const u8);
    let xs: [*const u8; G] = std::array::from_fn(|g| xd.add((b0 + g) * stride));
    let row_bytes = w.blocks_per_row() * std::mem::size_of::<BlockTq1_0>();
    // At least one chunk: a Tq1Matrix has K ≥ 256.
    let chunks = tq1_row_chunks(w.blocks_per_row());
    let mut acc = [[_mm256_setzero_si256(); G]; R];
    for c in 0..chunks - 1 {
        // The R rows lie back to back: one ascending prefetch stream, R lines per chunk.
        for i in 0..R {
            prefetch_stream(src[0].wrapping_add(R * 64 * c + 64 * i));
        }
        let xc = std::array::from_fn(|g| xs[g].add(c * TQ1_DIGIT_BLOCK));
        tq1_digit_chunk(std::array::from_fn(|i| src[i].add(64 * c)), xc, &mut acc);
    }
    let off = 64 * (chunks - 1);
    let xc = std::array::from_fn(|g| xs[g].add((chunks - 1) * TQ1_DIGIT_BLOCK));
    // Only the matrix's last row can end less than a chunk before the matrix does.
    let matrix_end = w.blocks().as_ptr_range().end as *const u8;
    if src[R - 1].add(off + 64) <= matrix_end {
        tq1_digit_chunk(std::array::from_fn(|i| src[i].add(off)), xc, &mut acc);
    } else {
        let mut last = [[0u8; 64]; R];
        for i in 0..R {
            std::ptr::copy_nonoverlapping(src[i].add(off), last[i].as_mut_ptr(), row_bytes - off);
        }
        tq1_digit_chunk(std::array::from_fn(|i| last[i].as_ptr()), xc, &mut acc);
    }
    for i in 0..R {
        let d = f16_to_f64(w.row(r + i)[0].d);
        // acc = Σ (x + 128)·(−digit) = −Σ x·digit − 128·Σ digit, and weight = digit − 1.
        let offset = 128 * w.row_digit_sum(r + i);
        for g in 0..G {
            let b = b0 + g;
            let dot = -hsum_i32(acc[i][g]) - offset - x.sum(b);
            out[i * batch + b] = finish_blocks(d * dot as f64, x.scale(b));
        }
    }
}

/// One token's lookup tables (`tq1_lut::build_token_tables_portable` is the definition), a
/// group pair per step: each group's 16 sums in i16 lanes from two `vpmaddubsw` against
/// constant trit pairs (activations offset to unsigned, the offset taken back by a constant),
/// then split into (l, h) bytes (`tq1_lut::lut_split`) and the pair's two tables interleaved.
/// The portable loop
/// took 14 ns a group, serial on the calling thread: 2 ms of a 32 ms 2B4T decode step.
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

/// Spans summed in i16 lanes before they are widened: a lane takes one group per pair, eight
/// per span, each a looked-up sum or its complement in [−384 − 33, 384], so eight spans stay
/// within 64 · 417 = 26 688.
const LUT_I16_SPANS: usize = 8;

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
unsafe fn lut_finish8(w: LookupRows, r: usize, sums: __m256i, x_scale: f32, out: *mut f32) {
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
const LUT_TOKENS: usize = 4;

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
unsafe fn lut_tiles<S: LutSigns, const R: usize, const G: usize>(
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

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn xnor_fused(w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let batch = x.batch();
    let xw = x.plane_words();
    for (i, r) in rows.enumerate() {
        let (mask, sign, words, scale) = match w {
            PackedWeights::BitPlanes(m) => {
                let (mk, sg) = m.row_planes(r);
                (Some(mk), sg, m.words(), m.scale())
            }
            PackedWeights::Binary(m) => (None, m.row_words(r), m.words(), m.scale()),
            _ => unreachable!("xnor takes plane formats only"),
        };
        let body = words / 4 * 4;
        for b in 0..batch {
            let planes = x.planes(b);
            let mut isum = 0i32;
            for p in 0..ACT_PLANES {
                let plane = &planes[p * xw..p * xw + words];
                let (mut nz, mut neg) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for wd in (0..body).step_by(4) {
                    let bp = load(plane.as_ptr().add(wd) as *const u8);
                    let s = _mm256_and_si256(load(sign.as_ptr().add(wd) as *const u8), bp);
                    neg = _mm256_add_epi64(neg, popcnt_u64x4(s));
                    if let Some(mask) = mask {
                        let m = _mm256_and_si256(load(mask.as_ptr().add(wd) as *const u8), bp);
                        nz = _mm256_add_epi64(nz, popcnt_u64x4(m));
                    }
                }
                let mut neg_c = hsum_u64(neg) as i32;
                let mut nz_c = hsum_u64(nz) as i32;
                for wd in body..words {
                    neg_c += (sign[wd] & plane[wd]).count_ones() as i32;
                    if let Some(mask) = mask {
                        nz_c += (mask[wd] & plane[wd]).count_ones() as i32;
                    }
                }
                if mask.is_none() {
                    nz_c = x.plane_counts(b)[p] as i32;
                }
                isum += PLANE_WEIGHTS[p] * (nz_c - 2 * neg_c);
            }
            out[i * batch + b] = finish_tensor(isum, scale, x.scale(b));
        }
    }
}

/// Eight key or value elements as f32 from `p` (f32, or f16 through F16C).
trait Lanes8: Copy {
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

macro_rules! attention_avx2_entry {
    ($($scores:ident, $axpy:ident: $t:ty;)*) => {$(
        /// Attention scores without AVX-512: [`scores_impl`] for this element type.
        pub(crate) fn $scores(_t: Avx2, q: &[f32], keys: &[$t], scale: f32, out: &mut [f32], ahead: &[$t]) {
            // SAFETY: the token proves AVX2 and F16C; `keys` holds `out.len()` rows of `q.len()`
            // (checked inside), and every load is inside a row.
            unsafe { scores_impl(q, keys, scale, out, ahead) }
        }
        /// The attention's weighted sum without AVX-512: [`axpy_impl`] for this element type.
        pub(crate) fn $axpy(_t: Avx2, w: &[f32], values: &[$t], o: &mut [f32], ahead: &[$t]) {
            // SAFETY: as for the scores; `values` holds `w.len()` rows of `o.len()`.
            unsafe { axpy_impl(w, values, o, ahead) }
        }
    )*};
}

attention_avx2_entry! {
    attention_scores_f32, attention_axpy_f32: f32;
    attention_scores_f16, attention_axpy_f16: half::f16;
}

/// `out[p] = attention_dot(q, k_p) × scale`, bit-identical to the portable `attention_dot`: its
/// 16 lanes are two registers (lanes 0–7 and 8–15), each chunk's products are added in order
/// (one fused multiply-add each), and [`reduce16`] is its reduction tree. Head sizes that are not a multiple of 16 take
/// the portable loop.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_impl<K: Lanes8 + super::KeyElem>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
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
unsafe fn axpy_impl<K: Lanes8 + super::KeyElem>(w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
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

macro_rules! attention_group_avx2_entry {
    ($($scores:ident, $axpy:ident: $t:ty;)*) => {$(
        /// Scores of a group of query heads over one KV head's keys, one pass: [`scores_group_impl`].
        pub(crate) fn $scores(_t: Avx2, qs: &[f32], keys: &[$t], scale: f32, out: &mut [f32], n: usize, ahead: &[$t]) {
            // SAFETY: the token proves AVX2 and F16C; the sizes are checked inside and every
            // load is inside a key row or a query.
            unsafe {
                match if n == 0 { 0 } else { out.len() / n } {
                    2 => scores_group_impl::<$t, 2>(qs, keys, scale, out, n, ahead),
                    4 => scores_group_impl::<$t, 4>(qs, keys, scale, out, n, ahead),
                    _ => super::attention_scores_group_portable(qs, keys, scale, out, n),
                }
            }
        }
        /// The weighted sums of a group of query heads over one KV head's values, one pass:
        /// [`axpy_group_impl`].
        pub(crate) fn $axpy(_t: Avx2, ws: &[f32], n: usize, values: &[$t], os: &mut [f32], hd: usize, ahead: &[$t]) {
            // SAFETY: as for the scores; `values` holds `n` rows of `hd`.
            unsafe {
                match os.len() / hd.max(1) {
                    2 => axpy_group_impl::<$t, 2>(ws, n, values, os, hd, ahead),
                    4 => axpy_group_impl::<$t, 4>(ws, n, values, os, hd, ahead),
                    _ => super::attention_weighted_sum_group_portable(ws, n, values, os, hd),
                }
            }
        }
    )*};
}

attention_group_avx2_entry! {
    attention_scores_group_f32, attention_axpy_group_f32: f32;
    attention_scores_group_f16, attention_axpy_group_f16: half::f16;
}

/// [`scores_impl`] for G query heads (`qs`: G rows of hd) over the same keys: each key chunk is
/// loaded (and converted from f16) once for all G, and each head's lanes are the same products
/// added in the same order as [`scores_impl`]'s, so `out[g·n + p]` is bit-identical to head g
/// alone. Grouped-query attention reads a KV head once per step instead of once per query head.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_group_impl<K: Lanes8 + super::KeyElem, const G: usize>(
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
unsafe fn axpy_group_impl<K: Lanes8 + super::KeyElem, const G: usize>(
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

// The portable helpers at 8 lanes for CPUs without AVX-512 (see `widest_compiled!`).
compiled_for! {
    Avx2, "avx2,fma,f16c";
    gated_activation(act: crate::model::FfnActivation, gate: &mut [f32], up: &[f32]) =
        crate::model::ops::gated_activation_portable;
    rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) = crate::model::ops::rms_norm_rows_portable;
    rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) = crate::model::ops::rms_norm_in_place_portable;
    softmax_in_place(scores: &mut [f32]) = crate::model::ops::softmax_in_place_portable;
    argmax(logits: &[f32]) -> u32 = crate::model::ops::argmax_portable;
    attention_scores_encoded(precision: crate::model::KvPrecision, q: &[f32], keys: &[u8], scale: f32, out: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_scores_encoded_portable;
    attention_weighted_sum_encoded(precision: crate::model::KvPrecision, w: &[f32], values: &[u8], o: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_weighted_sum_encoded_portable;
    decode_kv_rows(precision: crate::model::KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) =
        super::decode_kv_rows_portable;
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

/// The bandwidth probe's reader: wrapping sum of `words` with 4 independent 256-bit accumulators.
pub(crate) fn sum_words(_t: Avx2, words: &[u64]) -> u64 {
    // SAFETY: the token proves AVX2 support; every load is inside `words` (i + 4j + 4 ≤ body).
    unsafe { sum_words_impl(words) }
}

#[target_feature(enable = "avx2")]
unsafe fn sum_words_impl(words: &[u64]) -> u64 {
    let mut acc = [_mm256_setzero_si256(); 4];
    let body = words.len() / 16 * 16;
    let p = words.as_ptr();
    for i in (0..body).step_by(16) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + 4 * j) as *const __m256i));
        }
    }
    let s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    hsum_u64(s).wrapping_add(crate::bandwidth::sum_words_portable(&words[body..]))
}

/// Int8-row matmul (LM head) without VNNI. The codes are `w + 128`, so `w = code ^ 0x80`
/// (|w| ≤ 127: `Int8Rows` never stores code 0). `vpmaddubsw(|x|, sign(w, x))` then multiplies
/// exactly: |x| ≤ 128 as an unsigned byte, |sign(w, x)| ≤ 127, so a pair sums to at most
/// 2 · 128 · 127 = 32512 < 2¹⁵ (the textbook `|w|, sign(x, w)` order would wrap at x = −128).
/// Below AVX2 the LM head fell to the portable loop: 5 GB/s, two thirds of an AVX2 decode step.
pub(crate) fn int8_rows(
    _t: Avx2,
    m: &crate::formats::Int8Rows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    // SAFETY: the token proves AVX2 support; rows and out were bounds-checked by
    // `int8_rows_matmul`, and code rows and tokens are both `stride` = padded K long.
    unsafe { int8_rows_impl(m, x, rows, out) }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn int8_rows_impl(m: &crate::formats::Int8Rows, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    super::int8_rows_tiled::<Int8Avx2>(m, x, rows, out)
}

/// [`int8_tile`] as the shared driver's tile.
struct Int8Avx2;

impl super::Int8Tile for Int8Avx2 {
    #[inline(always)]
    unsafe fn tile<const R: usize, const G: usize, const STREAM: bool>(
        m: &crate::formats::Int8Rows,
        r: usize,
        x: &ActivationBatch,
        b0: usize,
        out: &mut [f32],
    ) {
        int8_tile::<R, G, STREAM>(m, r, x, b0, out)
    }
}

/// Rows `r..r+R` × tokens `b0..b0+G` of an int8-row matrix; writes `out[i × batch + b]`.
#[inline(always)]
unsafe fn int8_tile<const R: usize, const G: usize, const STREAM: bool>(
    m: &crate::formats::Int8Rows,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    out: &mut [f32],
) {
    let batch = x.batch();
    let codes: [*const u8; R] = std::array::from_fn(|i| m.row_codes(r + i).as_ptr());
    let xs: [*const u8; G] = std::array::from_fn(|g| x.token(b0 + g).as_ptr() as *const u8);
    let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
    let mut acc = [[_mm256_setzero_si256(); G]; R];
    for off in (0..m.stride()).step_by(32) {
        if STREAM {
            prefetch_rows_l2::<R>(codes[0], off, 32);
        }
        let w: [__m256i; R] = std::array::from_fn(|i| {
            if !STREAM {
                prefetch_stream(codes[i].add(off));
            }
            _mm256_xor_si256(load(codes[i].add(off)), flip)
        });
        for g in 0..G {
            let xv = load(xs[g].add(off));
            let ax = _mm256_abs_epi8(xv);
            for i in 0..R {
                let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w[i], xv));
                acc[i][g] = _mm256_add_epi32(acc[i][g], _mm256_madd_epi16(p, ones));
            }
        }
    }
    for i in 0..R {
        for g in 0..G {
            let b = b0 + g;
            out[i * batch + b] = finish_tensor(hsum_i32(acc[i][g]), m.scale(r + i), x.scale(b));
        }
    }
}

/// Q6_K LM head without VNNI (the AVX-512 level runs it too). Per 32 weights: the 6-bit codes
/// q (low nibble from `ql`, two high bits from `qh`) as unsigned bytes × the token's int8
/// values with `vpmaddubsw` (a pair sums to at most 2 · 63 · 128 = 16128 < 2¹⁵), then
/// `vpmaddwd` by the two 16-weight sub-blocks' scales. Per block, the `− 32` offset is one
/// `vpmaddwd` of the 16 scales by the token's 16-column sums, and the exact i32 sum (at most
/// 16 · 128 · 16 · 32 · 128 = 2²⁷ in magnitude) is scaled by `d` in f64, as the portable loop.
pub(crate) fn q6k_rows(
    _t: Avx2,
    m: &crate::formats::Q6kRows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    // SAFETY: the token proves AVX2 and F16C; rows and out were bounds-checked by
    // `q6k_rows_matmul`, every row is `blocks_per_row` 210-byte blocks, and every token is
    // `cols` = 256 · blocks_per_row values with `cols / 16` sums.
    unsafe { q6k_rows_impl(m, x, rows, out) }
}

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn q6k_rows_impl(m: &crate::formats::Q6kRows, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let batch = x.batch();
    if batch == 1 {
        // One token: two rows per pass (`q6k_pair`), with the blocks' sums and scales of the
        // pass kept here, made once per call.
        let mut r = rows.start;
        let mut isums = [_mm256_setzero_si256(); 2 * Q6K_PAIR_BLOCKS + 2];
        let mut dbuf = [0u16; 2 * Q6K_PAIR_BLOCKS + 2];
        while r < rows.end {
            let o = &mut out[r - rows.start..];
            if r + 2 <= rows.end {
                q6k_pair(m, r, x, &mut isums, &mut dbuf, o);
                r += 2;
            } else {
                q6k_tile::<1>(m, r, x, 0, o);
                r += 1;
            }
        }
        return;
    }
    let mut octet_sums = [_mm256_setzero_si256(); 8 * Q6K_PAIR_BLOCKS];
    for (i, r) in rows.enumerate() {
        let o = &mut out[i * batch..(i + 1) * batch];
        let mut b0 = 0;
        // Eight tokens per pass where there are eight: each chunk's codes are decoded once for
        // twice the multiplies. 2B4T batch 8 (`bitnet-trace --batch 8`, 2 threads, alternating
        // binaries): the head 433–434 → 380–383 ms, a quarter of the step before. The first
        // eight tokens, which stream the row in, take the assembly tile (`q6k_octet`).
        while b0 < batch {
            let g = match batch - b0 {
                1 => {
                    q6k_tile::<1>(m, r, x, b0, o);
                    1
                }
                2 => {
                    q6k_tile::<2>(m, r, x, b0, o);
                    2
                }
                3 => {
                    q6k_tile::<3>(m, r, x, b0, o);
                    3
                }
                4..=7 => {
                    q6k_tile::<4>(m, r, x, b0, o);
                    4
                }
                _ if b0 == 0 => {
                    q6k_octet(m, r, x, &mut octet_sums, o);
                    8
                }
                _ => {
                    q6k_tile::<8>(m, r, x, b0, o);
                    8
                }
            };
            b0 += g;
        }
    }
}

/// Codes of chunk n (weights 32n..32n + 32) of half h of the Q6_K block at `p`: low bits from
/// `ql` at `p + 64h` (n even) or `p + 64h + 32` (n odd), the low or high nibble; high bits at
/// shift 2n of `qh` at `p + 128 + 32h`, moved to bits 4–5. (16-bit shifts carry bits across
/// bytes only into positions the masks clear.) Loaded per chunk; a tile's chunks of one half
/// read the same lines from L1.
#[inline(always)]
unsafe fn q6k_chunk_codes(p: *const u8, h: usize, n: usize) -> __m256i {
    let (low4, high2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let ql = load(p.add(64 * h + 32 * (n & 1)));
    let qh = load(p.add(128 + 32 * h));
    let low = if n < 2 { _mm256_and_si256(ql, low4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low4) };
    let high = match n {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm256_srli_epi16::<2>(qh),
    };
    _mm256_or_si256(low, _mm256_and_si256(high, high2))
}

/// Assembly of one Q6_K chunk (32 weights) of both rows of [`q6k_pair`]: the codes (low bits
/// from `ql` at byte `$ql` of the block, shifted down by 4 when `$shift_low` is "4"; chunk
/// `$n`'s high bits from the half's `qh`), × the token's activations at `[x + $x]`
/// (`vpmaddubsw`), × the chunk's two sub-block scales (`vpmaddwd` with `vpshufb` pattern
/// `[pick + $pick]` of the half's scales), subtracted from each row's i32 sums.
macro_rules! q6k_chunk_pair {
    ($ql:literal, $shift_low:tt, $n:tt, $x:literal, $pick:literal) => {
        concat!(
            q6k_low!($shift_low, "{c0}", "{p0}", $ql),
            q6k_low!($shift_low, "{c1}", "{p0} + {rs}", $ql),
            q6k_high!("{t0}", "{q0}", $n, "{m30}"),
            q6k_high!("{t1}", "{q1}", $n, "{m30}"),
            "vpor {c0}, {c0}, {t0}\n",
            "vpor {c1}, {c1}, {t1}\n",
            "vpmaddubsw {c0}, {c0}, ymmword ptr [{x} + ",
            $x,
            "]\n",
            "vpmaddubsw {c1}, {c1}, ymmword ptr [{x} + ",
            $x,
            "]\n",
            "vpshufb {t0}, {h0}, ymmword ptr [{pick} + ",
            $pick,
            "]\n",
            "vpshufb {t1}, {h1}, ymmword ptr [{pick} + ",
            $pick,
            "]\n",
            "vpmaddwd {c0}, {c0}, {t0}\n",
            "vpmaddwd {c1}, {c1}, {t1}\n",
            "vpsubd {i0}, {i0}, {c0}\n",
            "vpsubd {i1}, {i1}, {c1}\n",
        )
    };
}

/// Assembly of a chunk's low nibbles into `$dst`: `ql & 0x0F`, or `(ql >> 4) & 0x0F` when
/// `$shift` is "4" (AVX2 shifts take no memory operand, hence the load).
macro_rules! q6k_low {
    ("0", $dst:literal, $p:literal, $off:literal) => {
        concat!("vpand ", $dst, ", {m4}, ymmword ptr [", $p, " + ", $off, "]\n")
    };
    ("4", $dst:literal, $p:literal, $off:literal) => {
        concat!(
            "vmovdqu ",
            $dst,
            ", ymmword ptr [",
            $p,
            " + ",
            $off,
            "]\n",
            "vpsrlw ",
            $dst,
            ", ",
            $dst,
            ", 4\n",
            "vpand ",
            $dst,
            ", ",
            $dst,
            ", {m4}\n"
        )
    };
}

/// Assembly of chunk n's two high bits, moved from bits 2n, 2n + 1 of `qh` to bits 4–5 of
/// `$t` (16-bit shifts carry bits across bytes only into positions the mask `$m30`, a
/// register or memory operand of 0x30 bytes, clears).
macro_rules! q6k_high {
    ($t:literal, $qh:literal, 0, $m30:literal) => {
        concat!("vpsllw ", $t, ", ", $qh, ", 4\n", "vpand ", $t, ", ", $t, ", ", $m30, "\n")
    };
    ($t:literal, $qh:literal, 1, $m30:literal) => {
        concat!("vpsllw ", $t, ", ", $qh, ", 2\n", "vpand ", $t, ", ", $t, ", ", $m30, "\n")
    };
    ($t:literal, $qh:literal, 2, $m30:literal) => {
        concat!("vpand ", $t, ", ", $qh, ", ", $m30, "\n")
    };
    ($t:literal, $qh:literal, 3, $m30:literal) => {
        concat!("vpsrlw ", $t, ", ", $qh, ", 2\n", "vpand ", $t, ", ", $t, ", ", $m30, "\n")
    };
}

/// Assembly of one half of a block of both rows: the half's eight scales (i16, in both 128-bit
/// lanes, from the block's scales stored at `tmp`), its `qh` (bytes `$qh`), then its four
/// chunks.
macro_rules! q6k_half_pair {
    ($ql_a:literal, $ql_b:literal, $qh:literal, $sc0:literal, $sc1:literal, $x0:literal, $x1:literal, $x2:literal, $x3:literal) => {
        concat!(
            "vbroadcasti128 {h0}, xmmword ptr [{tmp} + ",
            $sc0,
            "]\n",
            "vbroadcasti128 {h1}, xmmword ptr [{tmp} + ",
            $sc1,
            "]\n",
            "vmovdqu {q0}, ymmword ptr [{p0} + ",
            $qh,
            "]\n",
            "vmovdqu {q1}, ymmword ptr [{p0} + {rs} + ",
            $qh,
            "]\n",
            q6k_chunk_pair!($ql_a, "0", 0, $x0, "0"),
            q6k_chunk_pair!($ql_b, "0", 1, $x1, "32"),
            q6k_chunk_pair!($ql_a, "4", 2, $x2, "64"),
            q6k_chunk_pair!($ql_b, "4", 3, $x3, "96"),
        )
    };
}

/// Blocks whose sums [`q6k_pair`] holds before reducing and scaling them.
const Q6K_PAIR_BLOCKS: usize = 16;

/// Rows `r` and `r + 1` × the one token of a Q6_K matrix, into `out[0..2]`: [`q6k_tile`]'s
/// arithmetic for each row (each block's exact i32 sum, times its `d` in f64, added in block
/// order), the block loop in assembly. Per block of both rows: the −32 offsets from the
/// token's sub-block sums, then eight chunks each decoded, multiplied by the activations and
/// by its sub-block scales, and the two rows' i32 sums stored (negated) with their `d`s. The
/// sums are reduced and scaled after the loop, up to [`Q6K_PAIR_BLOCKS`] at a time, so each
/// block ends in four stores (two sums, two `d`s) instead of a horizontal sum and a dependent
/// f64 chain.
///
/// Why assembly: with intrinsics (the same operations, reduction after the loop or not), LLVM
/// spilled and reloaded constants and ran about 66 cycles per block pair; a C mock-up of the
/// block alone ran 52 with the reduction in the loop and 39 without. Zen 3, one thread,
/// `cargo bench --bench head` (2B4T's 2560-wide rows), old and new alternating: 128 rows in L2
/// 19.5–20.5 → 23.3–23.8 GB/s; streamed rows (twice the L3), where DRAM limits one core,
/// 16.3–17.5 → 17.5–18.0. In 2B4T TQ1_0 decode on one thread (3 rounds, alternating) 21.97
/// → 22.24–22.42 tok/s.
#[inline]
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn q6k_pair(
    m: &crate::formats::Q6kRows,
    r: usize,
    x: &ActivationBatch,
    isums: &mut [__m256i; 2 * Q6K_PAIR_BLOCKS + 2],
    dbuf: &mut [u16; 2 * Q6K_PAIR_BLOCKS + 2],
    out: &mut [f32],
) {
    use crate::formats::Q6K_BLOCK_BYTES;
    // `Q6kRows` stores its rows back to back in one buffer: row r + 1 is `rs` bytes after row
    // r, and one pointer into both rows' bytes reads either.
    let rs = m.blocks_per_row() * Q6K_BLOCK_BYTES;
    let row0 = m.as_bytes()[r * rs..(r + 2) * rs].as_ptr();
    let (xp, sums) = (x.token(0).as_ptr() as *const u8, x.sub_sums(0).as_ptr());
    let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let mut acc = _mm_setzero_pd();
    let mut scales = [_mm256_setzero_si256(); 2];
    let tmp = scales.as_mut_ptr();
    let pick = Q6K_SCALE_PICK.as_ptr();
    let nb = m.blocks_per_row();
    let mut blk0 = 0;
    while blk0 < nb {
        let g = (nb - blk0).min(Q6K_PAIR_BLOCKS);
        let off = blk0 * Q6K_BLOCK_BYTES;
        // SAFETY: the caller pairs rows only where r + 2 ≤ rows.end ≤ m.rows(), so `row0`
        // covers rows r and r + 1, `nb` whole 210-byte blocks each, `rs` bytes apart; the token
        // holds `nb × 256` values and `nb × 16` sums (`q6k_rows_matmul` checked the shapes).
        // The asm reads blocks blk0..blk0 + g of both rows and of the token (prefetches never
        // fault), the pick table and `scales`, and writes `scales`, `isums[..2g]` and
        // `dbuf[..2g]` (1 ≤ g ≤ Q6K_PAIR_BLOCKS), all unaligned stores.
        std::arch::asm!(
            "2:",
            // The pair's bytes as one stream, PREFETCH_L2_BYTES ahead: 7 lines per 420 bytes.
            "prefetcht1 byte ptr [{pf}]",
            "prefetcht1 byte ptr [{pf} + 64]",
            "prefetcht1 byte ptr [{pf} + 128]",
            "prefetcht1 byte ptr [{pf} + 192]",
            "prefetcht1 byte ptr [{pf} + 256]",
            "prefetcht1 byte ptr [{pf} + 320]",
            "prefetcht1 byte ptr [{pf} + 384]",
            // Both rows' 16 scales as i16, kept for the halves' broadcasts; the −32 offsets
            // (32 × Σ scale × the token's sub-block sums) start the sums, chunks subtract.
            "vpmovsxbw {t0}, xmmword ptr [{p0} + 192]",
            "vpmovsxbw {t1}, xmmword ptr [{p0} + {rs} + 192]",
            "vmovdqu ymmword ptr [{tmp}], {t0}",
            "vmovdqu ymmword ptr [{tmp} + 32], {t1}",
            "vpmaddwd {i0}, {t0}, ymmword ptr [{s}]",
            "vpmaddwd {i1}, {t1}, ymmword ptr [{s}]",
            "vpslld {i0}, {i0}, 5",
            "vpslld {i1}, {i1}, 5",
            q6k_half_pair!("0", "32", "128", "0", "32", "0", "32", "64", "96"),
            q6k_half_pair!("64", "96", "160", "16", "48", "128", "160", "192", "224"),
            "vmovdqu ymmword ptr [{is}], {i0}",
            "vmovdqu ymmword ptr [{is} + 32], {i1}",
            "movzx {k:e}, word ptr [{p0} + 208]",
            "mov word ptr [{d}], {k:x}",
            "movzx {k:e}, word ptr [{p0} + {rs} + 208]",
            "mov word ptr [{d} + 2], {k:x}",
            "add {p0}, {bb}",
            "add {pf}, {bb2}",
            "add {x}, 256",
            "add {s}, 32",
            "add {is}, 64",
            "add {d}, 4",
            "dec {n}",
            "jnz 2b",
            p0 = inout(reg) row0.add(off) => _,
            rs = in(reg) rs,
            pf = inout(reg) row0.wrapping_add(2 * off + PREFETCH_L2_BYTES) => _,
            x = inout(reg) xp.add(blk0 * QK_K) => _,
            s = inout(reg) sums.add(16 * blk0) => _,
            is = inout(reg) isums.as_mut_ptr() => _,
            d = inout(reg) dbuf.as_mut_ptr() => _,
            n = inout(reg) g => _,
            k = out(reg) _,
            tmp = in(reg) tmp,
            pick = in(reg) pick,
            bb = const Q6K_BLOCK_BYTES,
            bb2 = const 2 * Q6K_BLOCK_BYTES,
            m4 = in(ymm_reg) m4,
            m30 = in(ymm_reg) m30,
            i0 = out(ymm_reg) _,
            i1 = out(ymm_reg) _,
            h0 = out(ymm_reg) _,
            h1 = out(ymm_reg) _,
            q0 = out(ymm_reg) _,
            q1 = out(ymm_reg) _,
            c0 = out(ymm_reg) _,
            c1 = out(ymm_reg) _,
            t0 = out(ymm_reg) _,
            t1 = out(ymm_reg) _,
            options(nostack),
        );
        // Two blocks at a time, [row r, row r + 1] of block j then of block j + 1 (an odd
        // count's last pair is zeros, its product unused): `acc − d × (−isum)`, block order.
        isums[2 * g] = _mm256_setzero_si256();
        isums[2 * g + 1] = _mm256_setzero_si256();
        let mut j = 0;
        while j < g {
            let s = _mm256_cvtepi32_pd(hsum4_i32([isums[2 * j], isums[2 * j + 1], isums[2 * j + 2], isums[2 * j + 3]]));
            let dv = _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(dbuf.as_ptr().add(2 * j) as *const __m128i)));
            let p = _mm256_mul_pd(dv, s);
            acc = _mm_sub_pd(acc, _mm256_castpd256_pd128(p));
            if j + 1 < g {
                acc = _mm_sub_pd(acc, _mm256_extractf128_pd::<1>(p));
            }
            j += 2;
        }
        blk0 += g;
    }
    let mut lanes = [0f64; 2];
    _mm_storeu_pd(lanes.as_mut_ptr(), acc);
    out[0] = finish_blocks(lanes[0], x.scale(0));
    out[1] = finish_blocks(lanes[1], x.scale(0));
}

/// Assembly of one Q6_K chunk of one row × eight tokens: the chunk's codes into `{c}` (low
/// nibbles from byte `$ql` of the block, shifted down when `$shift` is "4"; chunk `$n`'s high
/// bits from the half's `qh`), its sub-block scales into `{sc}`, then per token `vpmaddubsw`
/// with the activations at `+ $x` and `vpmaddwd` with the scales, added to the token's sums.
macro_rules! q6k_chunk_octet {
    ($ql:literal, $shift:tt, $n:tt, $x:literal, $pick:literal) => {
        concat!(
            q6k_low!($shift, "{c}", "{p}", $ql),
            q6k_high!("{t0}", "{qh}", $n, "ymmword ptr [{m30}]"),
            "vpor {c}, {c}, {t0}\n",
            "vpshufb {sc}, {hs}, ymmword ptr [{pick} + ",
            $pick,
            "]\n",
            q6k_token_octet!("{a0}", "{xa}", $x),
            q6k_token_octet!("{a1}", "{xa} + {st}", $x),
            q6k_token_octet!("{a2}", "{xa} + 2 * {st}", $x),
            q6k_token_octet!("{a3}", "{xb}", $x),
            q6k_token_octet!("{a4}", "{xa} + 4 * {st}", $x),
            q6k_token_octet!("{a5}", "{xb} + 2 * {st}", $x),
            q6k_token_octet!("{a6}", "{xc}", $x),
            q6k_token_octet!("{a7}", "{xb} + 4 * {st}", $x),
        )
    };
}

/// Assembly of one token's products of a chunk (activations at `[$xp + $x]`), added to `$acc`.
macro_rules! q6k_token_octet {
    ($acc:literal, $xp:literal, $x:literal) => {
        concat!(
            "vpmaddubsw {t1}, {c}, ymmword ptr [",
            $xp,
            " + ",
            $x,
            "]\n",
            "vpmaddwd {t1}, {t1}, {sc}\n",
            "vpaddd ",
            $acc,
            ", ",
            $acc,
            ", {t1}\n",
        )
    };
}

/// Assembly of one half of a block of one row × eight tokens.
macro_rules! q6k_half_octet {
    ($ql_a:literal, $ql_b:literal, $qh:literal, $sc:literal, $x0:literal, $x1:literal, $x2:literal, $x3:literal) => {
        concat!(
            "vbroadcasti128 {hs}, xmmword ptr [{tmp} + ",
            $sc,
            "]\n",
            "vmovdqu {qh}, ymmword ptr [{p} + ",
            $qh,
            "]\n",
            q6k_chunk_octet!($ql_a, "0", 0, $x0, "0"),
            q6k_chunk_octet!($ql_b, "0", 1, $x1, "32"),
            q6k_chunk_octet!($ql_a, "4", 2, $x2, "64"),
            q6k_chunk_octet!($ql_b, "4", 3, $x3, "96"),
        )
    };
}

/// Row `r` × tokens 0..8 of a Q6_K matrix, into `out[0..8]`: [`q6k_tile`]'s arithmetic for
/// eight tokens (each block's exact i32 sum per token, times `d` in f64, added in block
/// order), the block loop in assembly. Per block: each chunk's codes and scales made once,
/// then `vpmaddubsw`, `vpmaddwd` and an add per token into eight accumulators, stored; the
/// −32 offsets, reductions and scaling follow the loop, up to [`Q6K_PAIR_BLOCKS`] blocks at a
/// time. The eight tokens are read through three base pointers (tokens 0, 3 and 6) and the
/// token stride, as x86 addressing scales an index by 1, 2, 4 or 8 only. With intrinsics
/// ([`q6k_tile`] with G = 8) the block ran about 115 cycles; here about 103, near what its
/// 300-odd vector ops (with the work after the loop) allow at the three or so per cycle Zen 3
/// sustains on such mixes. Zen 3, one thread,
/// `cargo bench --bench head` B = 8 in L2, alternating: 5.63–5.80 → 6.23–6.51 GB/s; 2B4T TQ2_0
/// batch-8 decode on 2 threads (3 rounds): 80.7–81.6 → 81.8–83.3 tok/s.
#[inline]
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
unsafe fn q6k_octet(
    m: &crate::formats::Q6kRows,
    r: usize,
    x: &ActivationBatch,
    sums_buf: &mut [__m256i; 8 * Q6K_PAIR_BLOCKS],
    out: &mut [f32],
) {
    use crate::formats::Q6K_BLOCK_BYTES;
    let row = m.row(r).as_ptr();
    let st = x.padded_cols();
    let xa = x.tokens(0..8).as_ptr() as *const u8;
    let sums: [*const i16; 8] = std::array::from_fn(|t| x.sub_sums(t).as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut scales = [_mm256_setzero_si256(); 1];
    let tmp = scales.as_mut_ptr();
    let pick = Q6K_SCALE_PICK.as_ptr();
    let m30 = Q6K_HIGH_MASK.0.as_ptr();
    let (mut acc4, mut acc8) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let nb = m.blocks_per_row();
    let mut blk0 = 0;
    while blk0 < nb {
        let g = (nb - blk0).min(Q6K_PAIR_BLOCKS);
        let off = blk0 * Q6K_BLOCK_BYTES;
        // SAFETY: row r is `nb` whole 210-byte blocks and tokens 0..8 (`xa`, `st` apart) hold
        // `nb × 256` values each (`q6k_rows_matmul` checked the shapes; the caller has ≥ 8
        // tokens); the asm reads blocks blk0..blk0 + g of the row and the tokens (prefetches
        // never fault), the pick table, the mask and `scales`, and writes `scales` and
        // `sums_buf[..8g]` (1 ≤ g ≤ Q6K_PAIR_BLOCKS), unaligned.
        std::arch::asm!(
            "2:",
            // The row into L2, PREFETCH_L2_BYTES ahead: four lines per 210-byte block (a block
            // may touch five lines; the next block's four cover the fifth).
            "prefetcht1 byte ptr [{p} + {pf}]",
            "prefetcht1 byte ptr [{p} + {pf} + 64]",
            "prefetcht1 byte ptr [{p} + {pf} + 128]",
            "prefetcht1 byte ptr [{p} + {pf} + 192]",
            "vpmovsxbw {t0}, xmmword ptr [{p} + 192]",
            "vmovdqu ymmword ptr [{tmp}], {t0}",
            "vpxor {a0}, {a0}, {a0}",
            "vpxor {a1}, {a1}, {a1}",
            "vpxor {a2}, {a2}, {a2}",
            "vpxor {a3}, {a3}, {a3}",
            "vpxor {a4}, {a4}, {a4}",
            "vpxor {a5}, {a5}, {a5}",
            "vpxor {a6}, {a6}, {a6}",
            "vpxor {a7}, {a7}, {a7}",
            q6k_half_octet!("0", "32", "128", "0", "0", "32", "64", "96"),
            q6k_half_octet!("64", "96", "160", "16", "128", "160", "192", "224"),
            "vmovdqu ymmword ptr [{is}], {a0}",
            "vmovdqu ymmword ptr [{is} + 32], {a1}",
            "vmovdqu ymmword ptr [{is} + 64], {a2}",
            "vmovdqu ymmword ptr [{is} + 96], {a3}",
            "vmovdqu ymmword ptr [{is} + 128], {a4}",
            "vmovdqu ymmword ptr [{is} + 160], {a5}",
            "vmovdqu ymmword ptr [{is} + 192], {a6}",
            "vmovdqu ymmword ptr [{is} + 224], {a7}",
            "add {p}, {bb}",
            "add {xa}, 256",
            "add {xb}, 256",
            "add {xc}, 256",
            "add {is}, 256",
            "dec {n}",
            "jnz 2b",
            p = inout(reg) row.add(off) => _,
            pf = const PREFETCH_L2_BYTES,
            xa = inout(reg) xa.add(blk0 * QK_K) => _,
            xb = inout(reg) xa.add(3 * st + blk0 * QK_K) => _,
            xc = inout(reg) xa.add(6 * st + blk0 * QK_K) => _,
            st = in(reg) st,
            is = inout(reg) sums_buf.as_mut_ptr() => _,
            n = inout(reg) g => _,
            tmp = in(reg) tmp,
            pick = in(reg) pick,
            m30 = in(reg) m30,
            bb = const Q6K_BLOCK_BYTES,
            m4 = in(ymm_reg) m4,
            a0 = out(ymm_reg) _,
            a1 = out(ymm_reg) _,
            a2 = out(ymm_reg) _,
            a3 = out(ymm_reg) _,
            a4 = out(ymm_reg) _,
            a5 = out(ymm_reg) _,
            a6 = out(ymm_reg) _,
            a7 = out(ymm_reg) _,
            hs = out(ymm_reg) _,
            qh = out(ymm_reg) _,
            c = out(ymm_reg) _,
            sc = out(ymm_reg) _,
            t0 = out(ymm_reg) _,
            t1 = out(ymm_reg) _,
            options(nostack),
        );
        // Per block: each token's exact sum (chunk products − 32 × Σ scale × sub-block sum),
        // four tokens per reduction, `acc += d × sum` in block order.
        for j in 0..g {
            let blk = blk0 + j;
            let p = row.add(blk * Q6K_BLOCK_BYTES);
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
            let d = f16_to_f64(half::f16::from_bits((p.add(208) as *const u16).read_unaligned()));
            let v: [__m256i; 8] = std::array::from_fn(|t| {
                let offset = _mm256_madd_epi16(sc16, _mm256_loadu_si256(sums[t].add(16 * blk) as *const __m256i));
                _mm256_sub_epi32(sums_buf[8 * j + t], _mm256_slli_epi32::<5>(offset))
            });
            let s4 = hsum4_i32([v[0], v[1], v[2], v[3]]);
            acc4 = _mm256_add_pd(acc4, _mm256_mul_pd(_mm256_set1_pd(d), _mm256_cvtepi32_pd(s4)));
            let s4 = hsum4_i32([v[4], v[5], v[6], v[7]]);
            acc8 = _mm256_add_pd(acc8, _mm256_mul_pd(_mm256_set1_pd(d), _mm256_cvtepi32_pd(s4)));
        }
        blk0 += g;
    }
    let mut lanes = [0f64; 8];
    _mm256_storeu_pd(lanes.as_mut_ptr(), acc4);
    _mm256_storeu_pd(lanes.as_mut_ptr().add(4), acc8);
    for t in 0..8 {
        out[t] = finish_blocks(lanes[t], x.scale(t));
    }
}

/// [`q6k_octet`]'s high-bit mask, a memory operand (the tile holds 15 vector registers; this
/// keeps one spare for the assembler's choice of temporaries).
#[repr(align(32))]
struct Q6kHighMask([u8; 32]);
static Q6K_HIGH_MASK: Q6kHighMask = Q6kHighMask([0x30; 32]);

/// `vpshufb` patterns (within each 128-bit half) that broadcast one i16 of eight: for chunk n of
/// a block half, the low half takes scale 2n and the high half scale 2n + 1 of a vector holding
/// that half's eight sub-block scales (as i16) in both halves.
static Q6K_SCALE_PICK: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut n = 0;
    while n < 4 {
        let mut i = 0;
        while i < 32 {
            let k = 2 * n + i / 16; // the i16 lane to broadcast
            t[n][i] = (2 * k + i % 2) as u8;
            i += 1;
        }
        n += 1;
    }
    t
};

/// Row `r` × tokens `b0..b0+G` of a Q6_K matrix, into `out[b]`. The first token group streams
/// the row in (rows are back to back, so the L2 prefetches run on into the next row); later
/// groups read it from cache. (From eight tokens on, [`q6k_octet`] takes the first group.)
#[inline(always)]
unsafe fn q6k_tile<const G: usize>(
    m: &crate::formats::Q6kRows,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    out: &mut [f32],
) {
    use crate::formats::Q6K_BLOCK_BYTES;
    let row = m.row(r).as_ptr();
    let xs: [*const u8; G] = std::array::from_fn(|g| x.token(b0 + g).as_ptr() as *const u8);
    let sums: [*const i16; G] = std::array::from_fn(|g| x.sub_sums(b0 + g).as_ptr());
    let mut acc = [0f64; G];
    // Four (or eight) tokens: their block sums reduced together and scaled in one f64 vector
    // per four, lane g doing token g's `acc += d × isum` (a multiply, then an add, as the
    // scalar line below).
    let (mut acc4, mut acc8) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    for blk in 0..m.blocks_per_row() {
        let off = blk * Q6K_BLOCK_BYTES;
        if b0 == 0 {
            prefetch_rows_l2::<1>(row, off, Q6K_BLOCK_BYTES);
        }
        let p = row.add(off);
        let scales = _mm_loadu_si128(p.add(192) as *const __m128i);
        let sc16 = _mm256_cvtepi8_epi16(scales);
        // Each half's eight scales as i16 in both 128-bit halves, for one in-lane shuffle per
        // chunk (`vpshufb` + `vpmovsxbw` per chunk, as written first, compiled to four shuffles).
        let halves = [_mm256_permute4x64_epi64::<0x44>(sc16), _mm256_permute4x64_epi64::<0xEE>(sc16)];
        let mut isum = [_mm256_setzero_si256(); G];
        for h in 0..2 {
            for n in 0..4 {
                let qn = &q6k_chunk_codes(p, h, n);
                let c = 4 * h + n;
                let pick = _mm256_loadu_si256(Q6K_SCALE_PICK[n].as_ptr() as *const __m256i);
                let sc = _mm256_shuffle_epi8(halves[h], pick);
                for g in 0..G {
                    let xv = load(xs[g].add(blk * QK_K + 32 * c));
                    isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(_mm256_maddubs_epi16(*qn, xv), sc));
                }
            }
        }
        let d = f16_to_f64(half::f16::from_bits((p.add(208) as *const u16).read_unaligned()));
        for g in 0..G {
            let offset = _mm256_madd_epi16(sc16, _mm256_loadu_si256(sums[g].add(16 * blk) as *const __m256i));
            isum[g] = _mm256_sub_epi32(isum[g], _mm256_slli_epi32::<5>(offset));
        }
        if G == 4 || G == 8 {
            let s4 = hsum4_i32([isum[0], isum[1], isum[2], isum[3]]);
            acc4 = _mm256_add_pd(acc4, _mm256_mul_pd(_mm256_set1_pd(d), _mm256_cvtepi32_pd(s4)));
            if G == 8 {
                let s4 = hsum4_i32([isum[4], isum[5], isum[6], isum[7]]);
                acc8 = _mm256_add_pd(acc8, _mm256_mul_pd(_mm256_set1_pd(d), _mm256_cvtepi32_pd(s4)));
            }
        } else {
            for g in 0..G {
                acc[g] += d * hsum_i32(isum[g]) as f64;
            }
        }
    }
    if G == 4 || G == 8 {
        let mut lanes = [0f64; 8];
        _mm256_storeu_pd(lanes.as_mut_ptr(), acc4);
        _mm256_storeu_pd(lanes.as_mut_ptr().add(4), acc8);
        acc.copy_from_slice(&lanes[..G]);
    }
    for g in 0..G {
        out[b0 + g] = finish_blocks(acc[g], x.scale(b0 + g));
    }
}

/// The compute probe's loop (see `compute_peak`): `rounds` × 8 independent chains of the
/// fastest int8 product AVX2 has — `vpmaddubsw` (32 u8 × i8 products, summed in pairs into
/// i16 with saturation) accumulated with `vpaddw` (wrapping), as the batched kernels
/// accumulate before they widen — every chain `a · b` once a round. Returns the lane-wise
/// wrapping i16 sum of the 8 accumulators, each lane widened to i32 (lane l: 8 × rounds ×
/// sat(a[2l]·b[2l] + a[2l+1]·b[2l+1]), wrapped to i16).
pub(crate) fn int8_mac_chains(_t: Avx2, rounds: u64, a: &[u8; 32], b: &[i8; 32]) -> [i32; 16] {
    // SAFETY: the token proves AVX2 support; the loads read the two 32-byte arrays.
    unsafe { int8_mac_chains_impl(rounds, a, b) }
}

#[target_feature(enable = "avx2")]
unsafe fn int8_mac_chains_impl(rounds: u64, a: &[u8; 32], b: &[i8; 32]) -> [i32; 16] {
    let va = _mm256_loadu_si256(a.as_ptr() as *const __m256i);
    let vb = _mm256_loadu_si256(b.as_ptr() as *const __m256i);
    let mut c = [_mm256_setzero_si256(); 8];
    for _ in 0..rounds {
        // In assembly so that the compiler can neither merge the identical chains nor hoist
        // their products out of the loop (8 accumulators, two temporaries: 12 of 16 registers).
        std::arch::asm!(
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c0}, {c0}, {t0}",
            "vpaddw {c1}, {c1}, {t1}",
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c2}, {c2}, {t0}",
            "vpaddw {c3}, {c3}, {t1}",
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c4}, {c4}, {t0}",
            "vpaddw {c5}, {c5}, {t1}",
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c6}, {c6}, {t0}",
            "vpaddw {c7}, {c7}, {t1}",
            a = in(ymm_reg) va,
            b = in(ymm_reg) vb,
            t0 = out(ymm_reg) _,
            t1 = out(ymm_reg) _,
            c0 = inout(ymm_reg) c[0],
            c1 = inout(ymm_reg) c[1],
            c2 = inout(ymm_reg) c[2],
            c3 = inout(ymm_reg) c[3],
            c4 = inout(ymm_reg) c[4],
            c5 = inout(ymm_reg) c[5],
            c6 = inout(ymm_reg) c[6],
            c7 = inout(ymm_reg) c[7],
            options(pure, nomem, nostack),
        );
    }
    let mut s = c[0];
    for v in &c[1..] {
        s = _mm256_add_epi16(s, *v);
    }
    let lanes = std::mem::transmute::<__m256i, [i16; 16]>(s);
    let mut out = [0i32; 16];
    for (o, l) in out.iter_mut().zip(lanes) {
        *o = l as i32;
    }
    out
}
