//! The AVX2 token and what every AVX2 kernel uses: 256-bit loads, stores and reductions,
//! software prefetch.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::cpu::IsaLevel;

/// Proof that AVX2 + FMA + POPCNT + F16C are available.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    pub(crate) fn new() -> Option<Self> {
        IsaLevel::Avx2.is_supported().then_some(Avx2(()))
    }
}

#[inline(always)]
pub(crate) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
pub(crate) unsafe fn store(p: *mut u8, v: __m256i) {
    _mm256_storeu_si256(p as *mut __m256i, v)
}

/// Horizontal sum of 8 i32 lanes.
#[inline(always)]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Codes `(v >> 2n) & 3` for n = 0..4.
#[inline(always)]
pub(crate) unsafe fn split4(v: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(v), m),
    ]
}

/// Software prefetch distances of the weight-streaming kernels (here and in the AVX-512
/// module). Batch-1 decode streams weights from DRAM and the out-of-order window alone keeps
/// too few misses in flight. Both an L2 and an L1 distance: on Zen 4 the pair read the most of
/// the bandwidth probe, ahead of L2 alone, while L1 alone, or NTA hints, were worse. Rows are
/// contiguous, so the prefetches run on into the next rows; a prefetch never faults, even past
/// the end of the buffer.
///
/// The L2 distance, 16 KiB, came from a sweep in the whole model with the 4-row one-token
/// kernels (distances alternating step by step in one process): shorter than 32 KiB helped the
/// large preset on 2 threads, longer hurt, and the other cases barely moved. Stopping the
/// prefetches at the end of a thread's rows did not help, so the gain is the distance, not
/// less overshoot. Figures: docs/perf-notes.md.
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
/// them all at once stalls on the full miss queue. Built once per loop: share boundaries are a
/// multiply and a shift per step, where dividing per step (two 64-bit divisions per key) had
/// cost about as much as the key's dot product.
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

/// Lane sums of four vectors at once: `[Σa, Σb, Σc, Σd]`.
#[inline(always)]
pub(crate) unsafe fn hsum4_i32(v: [__m256i; 4]) -> __m128i {
    // hadd pairs within each 128-bit lane; two rounds leave, per lane, the four partial sums.
    let ab = _mm256_hadd_epi32(v[0], v[1]);
    let cd = _mm256_hadd_epi32(v[2], v[3]);
    let abcd = _mm256_hadd_epi32(ab, cd);
    _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256::<1>(abcd))
}

#[inline(always)]
pub(crate) unsafe fn hsum_u64(v: __m256i) -> u64 {
    let s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    (_mm_cvtsi128_si64(s) as u64).wrapping_add(_mm_extract_epi64::<1>(s) as u64)
}
