//! Activation quantization: BitNet b1.58's per-token absmax int8 (A8), the sums the
//! unsigned-code trick needs, and bit-planes for the XNOR/popcount kernels.
//!
//! The unsigned-code trick: ternary weights are stored as codes `c = w + 1` ∈ {0, 1, 2}, which
//! are valid unsigned operands of `vpdpbusd` / `vpmaddubsw`, and `dot(w, x) = dot(c, x) − sum(x)`.
//! So each token keeps `sum(x)` over K and per 256-weight block (for the block-scaled formats).

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::aligned::AlignedBytes;
use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx512::Avx512;

/// Activations are stored padded with zeros to a multiple of this many columns, so every kernel
/// can read whole 256-wide blocks; zeros contribute nothing to any dot product.
pub const ACT_PAD: usize = crate::formats::QK_K;
/// Bit-planes of an int8 value (two's complement).
pub const ACT_PLANES: usize = 8;
/// Weight of plane p in two's complement: 2^p for p < 7, −128 for the sign plane.
pub const PLANE_WEIGHTS: [i32; ACT_PLANES] = [1, 2, 4, 8, 16, 32, 64, -128];

/// A batch of B quantized activation vectors of length K, with preallocated storage, so that
/// quantizing a new batch of the same shape allocates nothing.
#[derive(Debug, Clone)]
pub struct ActivationBatch {
    /// Vectors in use (≤ `capacity`).
    batch: usize,
    /// Vectors the buffers hold.
    capacity: usize,
    cols: usize,
    padded: usize,
    words: usize,
    /// `[batch, padded]` int8, zero beyond `cols`.
    values: AlignedBytes,
    /// `[batch]`: x ≈ q × scale (scale = absmax / 127).
    scales: Vec<f32>,
    /// `[batch]`: Σ q over K.
    sums: Vec<i32>,
    /// `[batch, padded / 256]`: Σ q over each 256-column block.
    block_sums: Vec<i32>,
    /// `[batch, padded / 16]`: Σ q over each 16 columns (|Σ| ≤ 2048), for the Q6_K LM head's
    /// `− 32` offset.
    sub_sums: Vec<i16>,
    /// `[batch, 8, words]`: bit p of every q, packed 64 per word; filled by `build_planes`.
    planes: Vec<u64>,
    /// `[batch, 8]`: popcount of each plane.
    plane_counts: Vec<u32>,
    planes_ready: bool,
    /// `[capacity, padded / 16]`: −32 × each 16 columns' sum, the Q6_K `− 32` offset per
    /// sub-block (see [`Self::build_q6k_offsets`]).
    q6k_offsets: Vec<i32>,
    q6k_offsets_ready: bool,
    /// Names these values: a new one, unique in the process, whenever they change (see
    /// [`Self::stamp`]).
    stamp: u64,
}

/// The next [`ActivationBatch::stamp`]; 0 is never handed out.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

fn new_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Relaxed)
}

#[inline(always)]
fn max_ignoring_nan(m: f32, x: f32) -> f32 {
    if x > m {
        x
    } else {
        m
    }
}

/// q = round_half_even(v) clamped to [−127, 127] (NaN → 0), without a float → int conversion
/// (Rust's saturating `as` does not vectorize at the baseline ISA): after adding 1.5 × 2^23 the
/// rounded integer sits in the low bits of the float's representation.
#[inline(always)]
pub(crate) fn to_q8(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    let c = if v.is_nan() { 0.0 } else { v.clamp(-127.0, 127.0) };
    ((c + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits())) as i32 as i8
}

/// max |v| (NaNs ignored, as `f32::max` does), in 16 lanes so that it vectorizes; max is
/// exact, so the lane order does not change the result. A compare-and-select rather than
/// `f32::max`, whose NaN rule keeps LLVM from using `maxps`.
#[inline(always)]
fn absmax(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = v.chunks_exact(16);
    for (l, x) in chunks.remainder().iter().enumerate() {
        lanes[l] = max_ignoring_nan(lanes[l], x.abs());
    }
    for c in chunks {
        for l in 0..16 {
            lanes[l] = max_ignoring_nan(lanes[l], c[l].abs());
        }
    }
    lanes.iter().fold(0.0f32, |m, x| m.max(*x))
}

/// One token's per-token absmax quantization (see [`ActivationBatch::quantize`]): writes `dst`
/// and returns the scale. Plain Rust, inlined into each ISA's compilation of it
/// ([`crate::activations::quantize_token`]); the results are identical at every level.
#[inline(always)]
pub(crate) fn quantize_token_portable(src: &[f32], dst: &mut [i8]) -> f32 {
    let absmax = absmax(src);
    if absmax > 0.0 && absmax.is_finite() {
        let inv = 127.0 / absmax;
        for (q, v) in dst.iter_mut().zip(src) {
            *q = to_q8(v * inv);
        }
        absmax / 127.0
    } else {
        dst.fill(0);
        0.0
    }
}

/// Σ of each 16 values of `q` (`q.len()` = 16 · `subs.len()`): the definition of
/// `activations::sub_sums`.
pub(crate) fn sub_sums_portable(q: &[i8], subs: &mut [i16]) {
    for (s, chunk) in subs.iter_mut().zip(q.chunks_exact(16)) {
        *s = chunk.iter().map(|v| *v as i16).sum();
    }
}

impl ActivationBatch {
    /// Storage for `batch` vectors of `cols` values.
    pub fn new(batch: usize, cols: usize) -> Result<Self> {
        if batch == 0 || cols == 0 {
            return Err(Error::Shape(format!("activation batch needs batch > 0 and K > 0, got {batch}×{cols}")));
        }
        let padded = cols.div_ceil(ACT_PAD) * ACT_PAD;
        let words = padded / 64;
        Ok(Self {
            batch,
            capacity: batch,
            cols,
            padded,
            words,
            values: AlignedBytes::zeroed(batch * padded),
            scales: vec![0.0; batch],
            sums: vec![0; batch],
            block_sums: vec![0; batch * padded / ACT_PAD],
            sub_sums: vec![0; batch * padded / 16],
            planes: vec![0; batch * ACT_PLANES * words],
            plane_counts: vec![0; batch * ACT_PLANES],
            planes_ready: false,
            q6k_offsets: Vec::new(),
            q6k_offsets_ready: false,
            stamp: new_stamp(),
        })
    }

    /// Uses the first `batch` vectors of the storage (≤ the capacity it was made with), so one
    /// buffer serves prefill chunks and decode batches of different sizes without allocating.
    pub fn set_batch(&mut self, batch: usize) -> Result<()> {
        if batch == 0 || batch > self.capacity {
            return Err(Error::Shape(format!("activation batch {batch} is outside 1..={}", self.capacity)));
        }
        self.batch = batch;
        self.planes_ready = false;
        self.q6k_offsets_ready = false;
        self.stamp = new_stamp();
        Ok(())
    }

    /// The most vectors this batch can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Quantizes `x` (`[batch, cols]` f32) per token: scale = absmax / 127,
    /// q = round_half_even(x / scale) ∈ [−127, 127]. A token whose absmax is 0 or not finite
    /// gets scale 0 and q = 0. Allocates nothing. Never inlined: it is the `quantize` stage.
    #[inline(never)]
    pub fn quantize(&mut self, x: &[f32]) -> Result<()> {
        if x.len() != self.batch * self.cols {
            return Err(Error::Shape(format!(
                "activations: expected {}×{} = {} floats, got {}",
                self.batch,
                self.cols,
                self.batch * self.cols,
                x.len()
            )));
        }
        let (cols, padded) = (self.cols, self.padded);
        for b in 0..self.batch {
            let src = &x[b * cols..(b + 1) * cols];
            let dst = &mut self.values.as_i8_mut()[b * padded..b * padded + cols];
            self.scales[b] = crate::activations::quantize_token(src, dst);
        }
        self.finish();
        Ok(())
    }

    /// Sets already-quantized values directly (`q`: `[batch, cols]`, `scales`: `[batch]`), for
    /// tests of extreme activations and for callers with their own quantizer.
    pub fn set_quantized(&mut self, q: &[i8], scales: &[f32]) -> Result<()> {
        if q.len() != self.batch * self.cols || scales.len() != self.batch {
            return Err(Error::Shape(format!(
                "activations: expected {} values and {} scales, got {} and {}",
                self.batch * self.cols,
                self.batch,
                q.len(),
                scales.len()
            )));
        }
        let (cols, padded) = (self.cols, self.padded);
        for b in 0..self.batch {
            self.values.as_i8_mut()[b * padded..b * padded + cols].copy_from_slice(&q[b * cols..(b + 1) * cols]);
        }
        self.scales.copy_from_slice(scales);
        self.finish();
        Ok(())
    }

    fn finish(&mut self) {
        let (nblk, nsub) = (self.padded / ACT_PAD, self.padded / 16);
        for b in 0..self.batch {
            let q = &self.values.as_i8()[b * self.padded..(b + 1) * self.padded];
            let subs = &mut self.sub_sums[b * nsub..(b + 1) * nsub];
            crate::activations::sub_sums(q, subs);
            let mut total = 0i32;
            for (blk, chunk) in subs.chunks_exact(ACT_PAD / 16).enumerate() {
                let s: i32 = chunk.iter().map(|v| *v as i32).sum();
                self.block_sums[b * nblk + blk] = s;
                total += s;
            }
            self.sums[b] = total;
        }
        self.planes_ready = false;
        self.q6k_offsets_ready = false;
        self.stamp = new_stamp();
    }

    /// Asks for the buffers [`Self::quantize`] writes in L2 (see `forward`'s `linear`).
    pub fn prefetch(&self) {
        let (n, s) = (self.batch * self.padded, self.batch * self.padded / 16);
        crate::simd::prefetch_l2(&self.values.as_i8()[..n]);
        crate::simd::prefetch_l2(&self.sub_sums[..s]);
        crate::simd::prefetch_l2(&self.block_sums[..self.batch * self.padded / ACT_PAD]);
        crate::simd::prefetch_l2(&self.scales[..self.batch]);
        crate::simd::prefetch_l2(&self.sums[..self.batch]);
    }

    /// Makes room for the Q6_K offsets of every token the batch can hold, so that
    /// `build_q6k_offsets` allocates nothing.
    pub fn reserve_q6k_offsets(&mut self) {
        let n = self.capacity * self.padded / 16;
        if self.q6k_offsets.len() < n {
            self.q6k_offsets = vec![0; n];
        }
    }

    /// Builds every token's −32 × each 16 columns' sum, the `− 32` offset of Q6_K codes per
    /// sub-block, which the AVX-512 Q6_K head kernel starts each sub-block's sum at. Makes room
    /// first if `reserve_q6k_offsets` did not. Never inlined: part of the `quantize` stage.
    #[inline(never)]
    pub fn build_q6k_offsets(&mut self) {
        let nsub = self.padded / 16;
        if self.q6k_offsets.len() < self.batch * nsub {
            self.reserve_q6k_offsets();
        }
        let n = self.batch * nsub;
        for (o, s) in self.q6k_offsets[..n].iter_mut().zip(&self.sub_sums[..n]) {
            *o = -32 * *s as i32;
        }
        self.q6k_offsets_ready = true;
    }

    /// Decomposes every q into its 8 two's-complement bit-planes (for the XNOR kernels):
    /// q = Σ_p `PLANE_WEIGHTS[p]` × bit_p(q). Never inlined: part of the `quantize` stage.
    #[inline(never)]
    pub fn build_planes(&mut self) {
        let words = self.words;
        for b in 0..self.batch {
            let q = &self.values.as_slice()[b * self.padded..(b + 1) * self.padded];
            let planes = &mut self.planes[b * ACT_PLANES * words..(b + 1) * ACT_PLANES * words];
            for (w, chunk) in q.chunks_exact(64).enumerate() {
                let mut acc = [0u64; ACT_PLANES];
                for (i, &v) in chunk.iter().enumerate() {
                    for (p, a) in acc.iter_mut().enumerate() {
                        *a |= (((v >> p) & 1) as u64) << i;
                    }
                }
                for p in 0..ACT_PLANES {
                    planes[p * words + w] = acc[p];
                }
            }
            for p in 0..ACT_PLANES {
                self.plane_counts[b * ACT_PLANES + p] =
                    planes[p * words..(p + 1) * words].iter().map(|w| w.count_ones()).sum();
            }
        }
        self.planes_ready = true;
    }

    pub fn batch(&self) -> usize {
        self.batch
    }
    /// K.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// K rounded up to a multiple of 256: the stride between tokens.
    pub fn padded_cols(&self) -> usize {
        self.padded
    }
    /// 64-bit words per bit-plane.
    pub fn plane_words(&self) -> usize {
        self.words
    }
    /// Token `b`'s int8 values, `padded_cols` long (zeros beyond `cols`).
    #[inline]
    pub fn token(&self, b: usize) -> &[i8] {
        &self.values.as_i8()[b * self.padded..(b + 1) * self.padded]
    }
    /// The quantized values of tokens `b`, token after token (`padded_cols` each).
    #[inline]
    pub fn tokens(&self, b: Range<usize>) -> &[i8] {
        &self.values.as_i8()[b.start * self.padded..b.end * self.padded]
    }
    #[inline]
    pub fn scale(&self, b: usize) -> f32 {
        self.scales[b]
    }
    #[inline]
    pub fn sum(&self, b: usize) -> i32 {
        self.sums[b]
    }
    /// Every token's scale, token b at index b.
    #[inline]
    pub fn scales(&self) -> &[f32] {
        &self.scales[..self.batch]
    }
    /// Every token's sum of its int8 values, token b at index b.
    #[inline]
    pub fn sums(&self) -> &[i32] {
        &self.sums[..self.batch]
    }
    /// Token `b`'s sums per 16 columns.
    #[inline]
    pub fn sub_sums(&self, b: usize) -> &[i16] {
        let n = self.padded / 16;
        &self.sub_sums[b * n..(b + 1) * n]
    }
    /// Token `b`'s sums per 256-column block.
    #[inline]
    pub fn block_sums(&self, b: usize) -> &[i32] {
        let n = self.padded / ACT_PAD;
        &self.block_sums[b * n..(b + 1) * n]
    }
    pub fn planes_ready(&self) -> bool {
        self.planes_ready
    }
    /// Names the current values: equal stamps mean equal values, so a thread that derived
    /// something from them (the lookup kernels' tables, `KernelScratch`) knows whether it is
    /// still valid. Each quantization, `set_quantized` and `set_batch` takes a new one.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }
    pub fn q6k_offsets_ready(&self) -> bool {
        self.q6k_offsets_ready
    }
    /// Tokens `b`' Q6_K offsets (`padded_cols / 16` each), token after token; valid after
    /// [`Self::build_q6k_offsets`].
    #[inline]
    pub(crate) fn q6k_offsets(&self, b: Range<usize>) -> &[i32] {
        let n = self.padded / 16;
        &self.q6k_offsets[b.start * n..b.end * n]
    }
    /// Token `b`'s bit-planes, `[8, plane_words]`; valid after `build_planes`.
    #[inline]
    pub fn planes(&self, b: usize) -> &[u64] {
        &self.planes[b * ACT_PLANES * self.words..(b + 1) * ACT_PLANES * self.words]
    }
    /// Token `b`'s popcount per plane; valid after `build_planes`.
    #[inline]
    pub fn plane_counts(&self, b: usize) -> &[u32] {
        &self.plane_counts[b * ACT_PLANES..(b + 1) * ACT_PLANES]
    }
}

/// Per-token int8 quantization (`activations::quantize_token_portable`, the definition): with
/// AVX-512 that code compiled for it (which has byte-narrowing instructions), with AVX2 intrinsics
/// (`x86_avx2::quantize_token`), each bit-identical to it. At baseline x86-64 the float → byte
/// narrowing has no single instruction, which made the portable loop slow (docs/perf-notes.md).
pub(crate) fn quantize_token(src: &[f32], dst: &mut [i8]) -> f32 {
    widest_compiled!(quantize_token, crate::activations::quantize_token_portable, src, dst)
}

/// Σ of each 16 values of a token's int8 activations (`activations::sub_sums_portable`, the
/// definition), for the Q6_K head's offset: `vpsadbw` where the CPU has AVX2 (also under
/// AVX-512). Integer sums, so every path gives the same values.
pub(crate) fn sub_sums(q: &[i8], subs: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx2::new() {
        return x86_avx2::sub_sums(t, q, subs);
    }
    crate::activations::sub_sums_portable(q, subs)
}

/// One token's lookup tables for the table-lookup TQ1 kernels
/// (`tq1_lut::build_token_tables_portable`, the definition): with AVX2 (also under AVX-512)
/// a group pair per step in registers. Integer arithmetic only, so every path writes the same
/// bytes.
pub(crate) fn build_lut_tables(x: &[i8], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx2::new() {
        return x86_avx2::build_lut_tables(t, x, dst);
    }
    crate::formats::tq1_lut::build_token_tables_portable(x, dst)
}

/// One token's `perm` tables (`tq1_perm::build_perm_tables_portable`, the definition): with
/// AVX-512 a group per step in registers (the `lut` builder's sums, each beside its
/// complement). Integer arithmetic only, so every path writes the same bytes.
pub(crate) fn build_perm_tables(x: &[i8], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx512::new() {
        return x86_avx512::build_perm_tables(t, x, dst);
    }
    crate::formats::tq1_perm::build_perm_tables_portable(x, dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn lookup_tables_are_identical_to_the_portable_loops() {
        use crate::formats::{tq1_lut, tq1_perm};
        type Builder = fn(&[i8], &mut [u8]);
        type Form = (&'static str, fn(usize) -> usize, Builder, Builder);
        let forms: [Form; 2] = [
            ("lut", tq1_lut::lut_table_bytes, super::build_lut_tables, tq1_lut::build_token_tables_portable),
            ("perm", tq1_perm::perm_table_bytes, super::build_perm_tables, tq1_perm::build_perm_tables_portable),
        ];
        let mut g = crate::rng::SplitMix64::new(17);
        // Short rows (no whole pair or group pair: the SIMD builders' tails only, one pair and a
        // tail), odd lengths and model widths; extremes included.
        for n in [1usize, 3, 4, 5, 6, 7, 12, 13, 24, 25, 47, 256, 1536, 2560, 2561, 6912] {
            let mut x: Vec<i8> = (0..n).map(|_| g.next_u64() as i8).collect();
            for (k, v) in x.iter_mut().enumerate().take(12) {
                *v = [-128, 127, -128, 127, 127, 127, -128, -128, -128, 0, 1, -1][k];
            }
            for (form, table_bytes, fast_builder, plain_builder) in forms {
                let bytes = table_bytes(n);
                let (mut fast, mut plain) = (vec![0x5Au8; bytes], vec![0xA5u8; bytes]);
                fast_builder(&x, &mut fast);
                plain_builder(&x, &mut plain);
                assert_eq!(fast, plain, "{form}, n {n}");
            }
        }
    }

    #[test]
    fn quantize_token_is_identical_to_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(13);
        for n in [1usize, 15, 16, 17, 2560, 6913] {
            let mut x: Vec<f32> = (0..n).map(|_| (g.unit_f32() - 0.5) * 200.0).collect();
            x[0] = 127.0; // the absmax: scale 1, so the values below are their own q
            if n > 4 {
                x[1] = 2.5; // ties to even: 2
                x[2] = -3.5; // −4
                x[3] = f32::NAN; // → 0, and ignored by absmax
            }
            let (mut fast, mut plain) = (vec![9i8; n], vec![9i8; n]);
            let (sf, sp) =
                (super::quantize_token(&x, &mut fast), crate::activations::quantize_token_portable(&x, &mut plain));
            assert_eq!((sf.to_bits(), &fast), (sp.to_bits(), &plain), "n {n}");
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = super::Avx2::new() {
                let mut avx2 = vec![9i8; n];
                let sa = super::x86_avx2::quantize_token(t, &x, &mut avx2);
                assert_eq!((sa.to_bits(), &avx2), (sp.to_bits(), &plain), "AVX2, n {n}");
            }
            assert_eq!(fast[0], 127);
            if n > 4 {
                assert_eq!(&fast[1..4], &[2, -4, 0], "ties to even, NaN to 0");
            }
        }
        // A subnormal absmax makes 127 / absmax infinite: q = ±127, and 0 · ∞ = NaN → 0.
        let tiny: Vec<f32> = (0..70).map(|i| [1e-45f32, 0.0, -1e-45, f32::NAN][i % 4]).collect();
        let (mut fast, mut plain) = (vec![9i8; 70], vec![9i8; 70]);
        let sp = crate::activations::quantize_token_portable(&tiny, &mut plain);
        assert_eq!(super::quantize_token(&tiny, &mut fast).to_bits(), sp.to_bits());
        assert_eq!(fast, plain);
        assert_eq!(&plain[..4], &[127, 0, -127, 0]);
        // Not finite or all zero: scale 0 and zeros.
        for bad in [vec![0.0f32; 40], vec![1.0, f32::INFINITY, 2.0]] {
            let mut q = vec![5i8; bad.len()];
            assert_eq!(super::quantize_token(&bad, &mut q), 0.0);
            assert!(q.iter().all(|v| *v == 0));
        }
    }

    #[test]
    fn sub_sums_equal_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(21);
        for subs in [1usize, 2, 3, 96, 433] {
            let mut q: Vec<i8> = (0..16 * subs).map(|_| g.next_u64() as i8).collect();
            // The extremes: a sub-block of −128s and one of 127s.
            q[..16].fill(-128);
            if subs > 1 {
                q[16..32].fill(127);
            }
            let (mut fast, mut plain) = (vec![7i16; subs], vec![-7i16; subs]);
            super::sub_sums(&q, &mut fast);
            crate::activations::sub_sums_portable(&q, &mut plain);
            assert_eq!(fast, plain, "{subs} sub-blocks");
            assert_eq!(plain[0], -2048);
        }
    }

    #[test]
    fn absmax_quantization_and_sums() {
        let mut a = ActivationBatch::new(2, 300).unwrap();
        let mut x: Vec<f32> = (0..600).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        x[300..].fill(0.0);
        a.quantize(&x).unwrap();
        let absmax = x[..300].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(a.scale(0), absmax / 127.0);
        for (k, v) in x[..300].iter().enumerate() {
            let q = a.token(0)[k] as f32;
            assert!((q * a.scale(0) - v).abs() <= a.scale(0) * 0.5 + 1e-6);
        }
        assert!(a.token(0)[300..].iter().all(|v| *v == 0));
        assert_eq!(a.sum(0), a.token(0).iter().map(|v| *v as i32).sum::<i32>());
        assert_eq!(a.block_sums(0).iter().sum::<i32>(), a.sum(0));
        for (j, s) in a.sub_sums(0).iter().enumerate() {
            assert_eq!(*s as i32, a.token(0)[16 * j..16 * j + 16].iter().map(|v| *v as i32).sum::<i32>());
        }
        assert_eq!((a.scale(1), a.sum(1)), (0.0, 0));
        assert_eq!(a.token(0).iter().map(|v| v.unsigned_abs()).max(), Some(127));
    }

    #[test]
    fn ties_round_to_even() {
        let mut a = ActivationBatch::new(1, 4).unwrap();
        // absmax 127 → scale 1: 0.5 → 0, 1.5 → 2, -2.5 → -2
        a.quantize(&[0.5, 1.5, -2.5, 127.0]).unwrap();
        assert_eq!(&a.token(0)[..4], &[0, 2, -2, 127]);
    }

    #[test]
    fn planes_recompose_values() {
        let mut a = ActivationBatch::new(3, 130).unwrap();
        let q: Vec<i8> = (0..390).map(|i| ((i * 73) % 255) as u8 as i8).map(|v| v.max(-127)).collect();
        a.set_quantized(&q, &[1.0; 3]).unwrap();
        a.build_planes();
        let w = a.plane_words();
        for b in 0..3 {
            for k in 0..a.padded_cols() {
                let v: i32 =
                    (0..8).map(|p| PLANE_WEIGHTS[p] * ((a.planes(b)[p * w + k / 64] >> (k % 64)) & 1) as i32).sum();
                assert_eq!(v, a.token(b)[k] as i32);
            }
        }
    }

    #[test]
    fn shape_errors_name_the_sizes() {
        let mut a = ActivationBatch::new(2, 3).unwrap();
        assert!(matches!(a.quantize(&[0.0; 5]), Err(Error::Shape(s)) if s.contains("2×3")));
        assert!(ActivationBatch::new(0, 3).is_err());
    }
}
