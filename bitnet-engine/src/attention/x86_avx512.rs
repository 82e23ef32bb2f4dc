//! Attention kernels at AVX-512 (16 lanes, masked tails): f32 and f16 rows, and row readers
//! that decode each encoded precision as they read.

use std::arch::x86_64::*;

use super::KvPrecision;
use crate::simd::x86_avx2::{prefetch_l2, PrefetchShares};
use crate::simd::x86_avx512::*;

// The encoded-row attention's portable code at 16 lanes, where no row reader applies.
compiled_for! {
    Avx512, "avx512f,avx512bw,avx512vl,avx512dq";
    attention_scores_encoded_compiled(precision: KvPrecision, q: &[f32], keys: &[u8], scale: f32, out: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_scores_encoded_portable;
    attention_weighted_sum_encoded_compiled(precision: KvPrecision, w: &[f32], values: &[u8], o: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_weighted_sum_encoded_portable;
    decode_kv_rows(precision: KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) =
        super::decode_kv_rows_portable;
}

/// Evaluates `$call` with `$rows` bound to the row reader of `$precision` over `$bytes` (rows of
/// `$hd` values, `$vb` bytes each, which the reader's layout must match), or `$other` where
/// there is none (f32 and f16 have their own kernels; a head dimension of 0).
macro_rules! with_row_reader {
    ($precision:expr, $bytes:expr, $hd:expr, $vb:expr, |$rows:ident| $call:expr, $other:expr) => {{
        use crate::attention::KvPrecision;
        let (p, hd) = ($bytes.as_ptr(), $hd);
        macro_rules! run {
            ($reader:expr) => {{
                let $rows = $reader;
                assert_eq!($rows.row_bytes(), $vb, "KV row layout");
                $call
            }};
        }
        match $precision {
            KvPrecision::Int8 if hd > 0 => run!(Int8Rows { p, hd }),
            KvPrecision::Int4 if hd > 0 => run!(Int4Rows { p, hd }),
            KvPrecision::Int2 if hd > 0 => run!(Int2Rows { p, hd }),
            KvPrecision::Fp8 if hd > 0 => run!(Fp8Rows { p, hd }),
            KvPrecision::Bf16 if hd > 0 => run!(Bf16Rows { p, hd }),
            _ => $other,
        }
    }};
}

/// [`super::attention_scores_encoded`]: keys decoded as they are read, by the row reader of
/// their precision ([`Int8Rows`], [`Int4Rows`], [`Int2Rows`], [`Fp8Rows`], [`Bf16Rows`]); `buf`
/// is only the portable path's (a head dimension of 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_scores_encoded(
    t: Avx512,
    precision: crate::attention::KvPrecision,
    q: &[f32],
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    let (hd, vb) = (q.len(), precision.bytes_per_vector(q.len()));
    assert!(keys.len() >= out.len() * vb);
    with_row_reader!(
        precision,
        keys,
        hd,
        vb,
        // SAFETY: the token proves AVX-512 F/BW/VL/DQ and F16C; the assert gives every one of
        // the `out.len()` rows its `vb` bytes inside `keys`, which are the reader's `row_bytes`
        // (asserted), and its loads stay inside a row (masked past a short last chunk's
        // codes); `ahead` is only prefetched, which never faults.
        |rows| unsafe { scores_encoded(q, rows, scale, out, ahead) },
        attention_scores_encoded_compiled(t, precision, q, keys, scale, out, ahead, buf)
    )
}

/// [`super::attention_weighted_sum_encoded`], as [`attention_scores_encoded`] splits it.
pub(crate) fn attention_weighted_sum_encoded(
    t: Avx512,
    precision: crate::attention::KvPrecision,
    w: &[f32],
    values: &[u8],
    o: &mut [f32],
    ahead: &[u8],
    buf: &mut [f32],
) {
    let (hd, vb) = (o.len(), precision.bytes_per_vector(o.len()));
    assert!(values.len() >= w.len() * vb);
    with_row_reader!(
        precision,
        values,
        hd,
        vb,
        // SAFETY: as for the scores, with the `w.len()` rows of `values`.
        |rows| unsafe { axpy_encoded(w, rows, o, ahead) },
        attention_weighted_sum_encoded_compiled(t, precision, w, values, o, ahead, buf)
    )
}

/// [`super::attention_scores_group_encoded`]: the `heads` query heads of one grouped-query
/// group over their shared encoded keys, each block of keys read and decoded once for all of
/// them (four heads a pass, as [`scores_group_impl`] does for f32 and f16), by the row reader of
/// the precision. `None` where there is none (a head dimension of 0): the caller goes head by
/// head.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_scores_group_encoded(
    _t: Avx512,
    precision: crate::attention::KvPrecision,
    qs: &[f32],
    heads: usize,
    keys: &[u8],
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
) -> Option<()> {
    assert!(heads > 0 && qs.len().is_multiple_of(heads) && out.len().is_multiple_of(heads));
    let (hd, n) = (qs.len() / heads, out.len() / heads);
    let vb = precision.bytes_per_vector(hd);
    assert!(keys.len() >= n * vb);
    with_row_reader!(
        precision,
        keys,
        hd,
        vb,
        // SAFETY: the token proves AVX-512 F/BW/VL/DQ and F16C; the assert gives each of the
        // `n` rows its `vb` bytes inside `keys` (the reader's `row_bytes`, asserted), the
        // reader's loads stay inside a row, and `qs`/`out` hold `heads` rows of hd and n (the
        // first assert); `ahead` is only prefetched, which never faults.
        |rows| Some(unsafe { scores_group_encoded(qs, heads, rows, scale, out, ahead) }),
        None
    )
}

/// [`super::attention_weighted_sum_group_encoded`], as [`attention_scores_group_encoded`].
pub(crate) fn attention_weighted_sum_group_encoded(
    _t: Avx512,
    precision: crate::attention::KvPrecision,
    ws: &[f32],
    heads: usize,
    values: &[u8],
    os: &mut [f32],
    ahead: &[u8],
) -> Option<()> {
    assert!(heads > 0 && ws.len().is_multiple_of(heads) && os.len().is_multiple_of(heads));
    let (n, hd) = (ws.len() / heads, os.len() / heads);
    let vb = precision.bytes_per_vector(hd);
    assert!(values.len() >= n * vb);
    with_row_reader!(
        precision,
        values,
        hd,
        vb,
        // SAFETY: as for the scores, with the `n` rows of `values` and `heads` rows of `ws`/`os`.
        |rows| Some(unsafe { axpy_group_encoded(ws, heads, rows, os, ahead) }),
        None
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn scores_group_encoded<R: KvRowReader>(
    qs: &[f32],
    heads: usize,
    keys: R,
    scale: f32,
    out: &mut [f32],
    ahead: &[u8],
) {
    scores_group_impl(qs, heads, keys, scale, out, ahead)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn axpy_group_encoded<R: KvRowReader>(ws: &[f32], heads: usize, values: R, os: &mut [f32], ahead: &[u8]) {
    axpy_group_impl(ws, heads, values, os, ahead)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn scores_encoded<R: KvRowReader>(q: &[f32], keys: R, scale: f32, out: &mut [f32], ahead: &[u8]) {
    scores_impl(q, keys, scale, out, ahead)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn axpy_encoded<R: KvRowReader>(w: &[f32], values: R, o: &mut [f32], ahead: &[u8]) {
    axpy_impl(w, values, o, ahead)
}

// Attention in the forward pass's fixed float order (see `ops::attention_dot`): lane l of a
// 16-lane accumulator sums products of elements l, l+16, l+32, … each with one fused
// multiply-add, a short last chunk only touches its own lanes (masked), and the lanes are
// reduced as 8+8, 4+4, 2+2, 1+1. Results are therefore identical to the portable path.

/// Sixteen key elements as f32 from `p` (f32 or f16), `n` ≤ 16 valid, the rest 0.
pub(crate) trait Lanes16: Copy {
    unsafe fn load16(p: *const Self, n: usize) -> __m512;
}

impl Lanes16 for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32, n: usize) -> __m512 {
        if n == 16 {
            _mm512_loadu_ps(p)
        } else {
            _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p)
        }
    }
}

impl Lanes16 for half::f16 {
    #[inline(always)]
    unsafe fn load16(p: *const half::f16, n: usize) -> __m512 {
        let raw = if n == 16 {
            _mm256_loadu_si256(p as *const __m256i)
        } else {
            _mm256_maskz_loadu_epi16(((1u32 << n) - 1) as __mmask16, p as *const i16)
        };
        _mm512_cvtph_ps(raw)
    }
}

#[inline(always)]
unsafe fn reduce_fixed(v: __m512) -> f32 {
    let a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps::<0b01>(c, c)))
}

/// Positions ahead whose cached rows attention prefetches (the first ones all at once, at the
/// start). The KV cache is cold at every decode step (the weights streamed since evicted it),
/// and one head's rows are only a few KiB, too short for the hardware prefetcher to ramp up:
/// without this, large-preset decode read keys and values at a fraction of the bandwidth.
const KV_PREFETCH_ROWS: usize = 32;

/// Prefetches rows `from..to` (clipped to the `rows` there are) of a cache block at `base`.
#[inline(always)]
unsafe fn prefetch_kv_rows(base: *const u8, row_bytes: usize, from: usize, to: usize, rows: usize) {
    let to = to.min(rows);
    if from < to {
        prefetch_l2(base.add(from * row_bytes), (to - from) * row_bytes);
    }
}

/// Rows of cached keys or values as the single-head kernels read them. `load16` gives 16
/// values of a row from dim `i` as f32 (`n` ≤ 16 valid, the rest 0), exactly the floats the
/// portable decode makes, so every kernel over a source gives the portable path's bits.
trait KvRowReader: Copy {
    /// What a row's loads need, made once per row: its address, and int8's scale.
    type Row: Copy;
    /// Bytes from one row's start to the next's.
    fn row_bytes(&self) -> usize;
    fn base(&self) -> *const u8;
    unsafe fn row(&self, r: usize) -> Self::Row;
    unsafe fn load16(&self, row: Self::Row, i: usize, n: usize) -> __m512;
}

/// f32 or f16 rows of `hd` values, back to back.
#[derive(Clone, Copy)]
struct PlainRows<K> {
    p: *const K,
    hd: usize,
}

impl<K: Lanes16> KvRowReader for PlainRows<K> {
    type Row = *const K;
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        self.hd * std::mem::size_of::<K>()
    }
    #[inline(always)]
    fn base(&self) -> *const u8 {
        self.p as *const u8
    }
    #[inline(always)]
    unsafe fn row(&self, r: usize) -> *const K {
        self.p.add(r * self.hd)
    }
    #[inline(always)]
    unsafe fn load16(&self, row: *const K, i: usize, n: usize) -> __m512 {
        K::load16(row.add(i), n)
    }
}

/// `KvPrecision::Int8` (`FP8` false) and `KvPrecision::Fp8` (`FP8` true) rows: `hd` one-byte
/// codes, then the row's f16 scale. A value is the code's number times the scale in f32 (one
/// rounding), as `KvPrecision::decode` makes it: an int8 code widened and converted; an E4M3
/// code through the f16 its bits make (see `e4m3_over_256`), S.1111.111 as the decode's NaN.
/// Decoded here as they
/// are read instead of into a buffer first, which had left int8 attention compute-bound at half
/// f16's speed on half its bytes (docs/perf-notes.md).
#[derive(Clone, Copy)]
struct ByteRows<const FP8: bool> {
    p: *const u8,
    hd: usize,
}

type Int8Rows = ByteRows<false>;
type Fp8Rows = ByteRows<true>;

impl<const FP8: bool> ByteRows<FP8> {
    /// The 16 E4M3 codes in `codes` as f32, times 2⁻⁸: each code's bits placed in an f16's
    /// (sign to the sign; the four exponent and three mantissa bits to the exponent's low four
    /// and the mantissa's top three) make the f16 (1 + m/8) · 2^(e − 15), or m/8 · 2⁻¹⁴ for a
    /// subnormal, exactly the code's value times 2⁻⁸ either way, and the hardware converts that
    /// to f32. [`KvRowReader::row`] folds the 2⁸ into the row's scale, exactly, since the scale
    /// is an f16 (so the product is the decode's one rounding). S.1111.111 is the decode's NaN.
    #[inline(always)]
    unsafe fn e4m3_over_256(codes: __m128i) -> __m512 {
        // Sign-extended, so bit 15 (and 14) of the word × 2⁷ hold the sign; 0xBF80 clears 14.
        let words = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(codes));
        let halves = _mm256_and_si256(words, _mm256_set1_epi16(0xBF80u16 as i16));
        let is_nan = _mm_cmpeq_epi8_mask(_mm_and_si128(codes, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
        _mm512_mask_mov_ps(_mm512_cvtph_ps(halves), is_nan, _mm512_set1_ps(f32::NAN))
    }
}

impl<const FP8: bool> KvRowReader for ByteRows<FP8> {
    type Row = (*const u8, f32);
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        self.hd + 2
    }
    #[inline(always)]
    fn base(&self) -> *const u8 {
        self.p
    }
    #[inline(always)]
    unsafe fn row(&self, r: usize) -> (*const u8, f32) {
        let row = self.p.add(r * (self.hd + 2));
        let scale = f16_to_f32(std::ptr::read_unaligned(row.add(self.hd) as *const u16));
        // For fp8, × 2⁸ to undo `e4m3_over_256`: exact for any f16 scale (at most 65504).
        (row, if FP8 { scale * 256.0 } else { scale })
    }
    #[inline(always)]
    unsafe fn load16(&self, (row, scale): (*const u8, f32), i: usize, n: usize) -> __m512 {
        let codes = if n == 16 {
            _mm_loadu_si128(row.add(i) as *const __m128i)
        } else {
            _mm_maskz_loadu_epi8(((1u32 << n) - 1) as __mmask16, row.add(i) as *const i8)
        };
        // Masked-off codes are 0, a 0 in both encodings: the lanes past `n` are 0.
        let v = if FP8 { Self::e4m3_over_256(codes) } else { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)) };
        _mm512_mul_ps(v, _mm512_set1_ps(scale))
    }
}

/// `KvPrecision::Int4` (`BITS` 4) and `KvPrecision::Int2` (`BITS` 2) rows: the codes packed low
/// first (value i is nibble i mod 2 of byte i / 2, or crumb i mod 4 of byte i / 4), then per
/// group the f16 parameters. Int4: a scale per 32 values, a value is (code − 8) × scale; int2:
/// a minimum and a step per 16, a value is min + code × step (a multiply, then an add). Each in
/// f32 as `KvPrecision::decode` makes it. A 16-value chunk starts at a multiple of 16, so it
/// lies in one group.
#[derive(Clone, Copy)]
struct PackedRows<const BITS: usize> {
    p: *const u8,
    hd: usize,
}

type Int4Rows = PackedRows<4>;
type Int2Rows = PackedRows<2>;

impl<const BITS: usize> PackedRows<BITS> {
    const GROUP: usize = if BITS == 4 { 32 } else { 16 };
    const PARAM_BYTES: usize = if BITS == 4 { 2 } else { 4 };
    #[inline(always)]
    fn code_bytes(&self) -> usize {
        (self.hd * BITS).div_ceil(8)
    }
    #[inline(always)]
    unsafe fn int4(&self, row: *const u8, i: usize, n: usize) -> __m512 {
        let at = row.add(i / 2);
        // Eight bytes hold the chunk's sixteen nibbles; a short last chunk reads only its own.
        let bytes = if n == 16 {
            _mm_loadl_epi64(at as *const __m128i)
        } else {
            _mm_maskz_loadu_epi8(((1u32 << n.div_ceil(2)) - 1) as __mmask16, at as *const i8)
        };
        let low4 = _mm_set1_epi8(0x0F);
        let (lo, hi) = (_mm_and_si128(bytes, low4), _mm_and_si128(_mm_srli_epi16::<4>(bytes), low4));
        // Value 2j from byte j's low nibble, 2j + 1 from its high one.
        let codes = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), _mm_set1_epi8(8));
        let bits = std::ptr::read_unaligned(row.add(self.code_bytes() + 2 * (i / Self::GROUP)) as *const u16);
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)), _mm512_set1_ps(f16_to_f32(bits)))
    }
    #[inline(always)]
    unsafe fn int2(&self, row: *const u8, i: usize, n: usize) -> __m512 {
        let at = row.add(i / 4);
        // Four bytes hold the chunk's sixteen crumbs; a short last chunk reads only its own.
        let word = if n == 16 {
            std::ptr::read_unaligned(at as *const i32)
        } else {
            _mm_cvtsi128_si32(_mm_maskz_loadu_epi8(((1u32 << n.div_ceil(4)) - 1) as __mmask16, at as *const i8))
        };
        // Lane j: bits 2j..2j + 2 of the word.
        let shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let codes = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), shifts), _mm512_set1_epi32(3));
        let params = row.add(self.code_bytes() + Self::PARAM_BYTES * (i / Self::GROUP));
        let min = f16_to_f32(std::ptr::read_unaligned(params as *const u16));
        let step = f16_to_f32(std::ptr::read_unaligned(params.add(2) as *const u16));
        _mm512_add_ps(_mm512_set1_ps(min), _mm512_mul_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(step)))
    }
}

impl<const BITS: usize> KvRowReader for PackedRows<BITS> {
    type Row = *const u8;
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        self.code_bytes() + Self::PARAM_BYTES * self.hd.div_ceil(Self::GROUP)
    }
    #[inline(always)]
    fn base(&self) -> *const u8 {
        self.p
    }
    #[inline(always)]
    unsafe fn row(&self, r: usize) -> *const u8 {
        self.p.add(r * self.row_bytes())
    }
    #[inline(always)]
    unsafe fn load16(&self, row: *const u8, i: usize, n: usize) -> __m512 {
        let v = if BITS == 4 { self.int4(row, i, n) } else { self.int2(row, i, n) };
        if n == 16 {
            v
        } else {
            _mm512_maskz_mov_ps(((1u32 << n) - 1) as __mmask16, v)
        }
    }
}

/// `KvPrecision::Bf16` rows of `hd` values: a bf16 is the top half of its f32, so a load is
/// a widen and a shift. (`half`'s conversion also sets a NaN's quiet bit; here the first
/// arithmetic on it does, so the kernels' results are the same.)
#[derive(Clone, Copy)]
struct Bf16Rows {
    p: *const u8,
    hd: usize,
}

impl KvRowReader for Bf16Rows {
    type Row = *const u8;
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        2 * self.hd
    }
    #[inline(always)]
    fn base(&self) -> *const u8 {
        self.p
    }
    #[inline(always)]
    unsafe fn row(&self, r: usize) -> *const u8 {
        self.p.add(r * 2 * self.hd)
    }
    #[inline(always)]
    unsafe fn load16(&self, row: *const u8, i: usize, n: usize) -> __m512 {
        let at = row.add(2 * i);
        let raw = if n == 16 {
            _mm256_loadu_si256(at as *const __m256i)
        } else {
            _mm256_maskz_loadu_epi16(((1u32 << n) - 1) as __mmask16, at as *const i16)
        };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    }
}

/// An f16's bits as f32, exactly (F16C).
#[inline(always)]
unsafe fn f16_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
unsafe fn scores_impl<R: KvRowReader, A>(q: &[f32], keys: R, scale: f32, out: &mut [f32], ahead: &[A]) {
    let hd = q.len();
    let (row_bytes, rows, base) = (keys.row_bytes(), out.len(), keys.base());
    // One share of `ahead` per 16 keys, and one for the keys after the last 16.
    let steps = rows / 16 + 1;
    let shares = PrefetchShares::new(ahead, steps);
    prefetch_kv_rows(base, row_bytes, 0, KV_PREFETCH_ROWS, rows);
    let mut p = 0;
    while p + 16 <= rows {
        prefetch_kv_rows(base, row_bytes, p + KV_PREFETCH_ROWS, p + KV_PREFETCH_ROWS + 16, rows);
        shares.issue(p / 16);
        let v = scores16(q, keys, p);
        _mm512_storeu_ps(out.as_mut_ptr().add(p), _mm512_mul_ps(v, _mm512_set1_ps(scale)));
        p += 16;
    }
    shares.issue(steps - 1);
    for (p, o) in out.iter_mut().enumerate().skip(p) {
        prefetch_kv_rows(base, row_bytes, p + KV_PREFETCH_ROWS, p + KV_PREFETCH_ROWS + 1, rows);
        *o = score_one(q.as_ptr(), keys, keys.row(p), hd) * scale;
    }
}

/// The unscaled score of one key (`row` of `keys`, hd values) for the query at `q`: 16-lane
/// products added chunk by chunk, then [`reduce_fixed`] (what [`reduce_tree16`] gives 16 keys
/// at once).
#[inline(always)]
unsafe fn score_one<R: KvRowReader>(q: *const f32, keys: R, row: R::Row, hd: usize) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < hd {
        let n = (hd - i).min(16);
        acc = _mm512_mask3_fmadd_ps(
            f32::load16(q.add(i), n),
            keys.load16(row, i, n),
            acc,
            ((1u32 << n) - 1) as __mmask16,
        );
        i += 16;
    }
    reduce_fixed(acc)
}

/// Unscaled scores of the 16 keys from row `p0` (rows of `q.len()` values), lane j = key j,
/// each bit-identical to [`reduce_fixed`] of that key's 16-lane accumulator: the accumulators
/// are built the same way, and the reduction tree below adds the same pairs (lanes l + l+8,
/// then l + l+4, l + l+2, l + l+1) for 16 keys at once with shuffles, instead of one key at a
/// time down a chain of dependent extracts, which bound the scores' speed.
#[inline(always)]
unsafe fn scores16<R: KvRowReader>(q: &[f32], keys: R, p0: usize) -> __m512 {
    let hd = q.len();
    // Accumulator 4i + c holds key 4c + i: after the tree, lane 4c + i is then key 4c + i.
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut rows = [keys.row(p0); 16];
    for (a, r) in rows.iter_mut().enumerate() {
        *r = keys.row(p0 + 4 * (a % 4) + a / 4);
    }
    let mut i = 0;
    while i < hd {
        let n = (hd - i).min(16);
        let m = ((1u32 << n) - 1) as __mmask16;
        let qv = f32::load16(q.as_ptr().add(i), n);
        for (slot, row) in acc.iter_mut().zip(rows) {
            *slot = _mm512_mask3_fmadd_ps(qv, keys.load16(row, i, n), *slot, m);
        }
        i += 16;
    }
    reduce_tree16(acc)
}

/// Lane `4c + i` = the lanes of `acc[4i + c]` summed as [`reduce_fixed`] sums them (l + l+8,
/// then l + l+4, l + l+2, l + l+1), for 16 accumulators at once with shuffles.
#[inline(always)]
unsafe fn reduce_tree16(acc: [__m512; 16]) -> __m512 {
    // Plain loops, not array::from_fn: its closures are not always inlined, and out of line
    // they lose the caller's target features (see reduce16).
    // l + l+8: blocks [A 0-7 | B 0-7].
    let mut t = [_mm512_setzero_ps(); 8];
    for j in 0..8 {
        let (a, b) = (acc[2 * j], acc[2 * j + 1]);
        t[j] = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(a, b), _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b));
    }
    // l + l+4: blocks [A | B | C | D], 4 lanes each.
    let mut u = [_mm512_setzero_ps(); 4];
    for j in 0..4 {
        let (a, b) = (t[2 * j], t[2 * j + 1]);
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b));
    }
    // l + l+2: block c of w[j] is [u[2j] block c: 2 lanes | u[2j+1] block c: 2 lanes].
    let mut w = [_mm512_setzero_ps(); 2];
    for j in 0..2 {
        let (a, b) = (_mm512_castps_pd(u[2 * j]), _mm512_castps_pd(u[2 * j + 1]));
        w[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    // l + l+1: block c is [u[0], u[1], u[2], u[3]] block c, i.e. accumulators c, 4 + c, 8 + c,
    // 12 + c, which hold keys 4c, 4c + 1, 4c + 2, 4c + 3.
    _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]), _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]))
}

/// The weighted sum in blocks of up to 128 dims (8 accumulators), each block one pass over the
/// positions: each lane still adds its products in position order, so the result is the same
/// as a pass per 16 lanes, but rows are read in order and 8 independent chains of adds replace
/// one dependent chain per 16 lanes (which left the sum latency-bound). The first block brings
/// in whole rows and shares of `ahead`.
#[inline(always)]
unsafe fn axpy_impl<R: KvRowReader, A>(w: &[f32], values: R, o: &mut [f32], ahead: &[A]) {
    let hd = o.len();
    prefetch_kv_rows(values.base(), values.row_bytes(), 0, KV_PREFETCH_ROWS, w.len());
    for d0 in (0..hd).step_by(128) {
        let first = d0 == 0;
        let ob = &mut o[d0..(d0 + 128).min(hd)];
        match ob.len().div_ceil(16) {
            1 => axpy_block::<R, A, 1>(w, values, d0, ob, first, ahead),
            2 => axpy_block::<R, A, 2>(w, values, d0, ob, first, ahead),
            3 => axpy_block::<R, A, 3>(w, values, d0, ob, first, ahead),
            4 => axpy_block::<R, A, 4>(w, values, d0, ob, first, ahead),
            5 => axpy_block::<R, A, 5>(w, values, d0, ob, first, ahead),
            6 => axpy_block::<R, A, 6>(w, values, d0, ob, first, ahead),
            7 => axpy_block::<R, A, 7>(w, values, d0, ob, first, ahead),
            _ => axpy_block::<R, A, 8>(w, values, d0, ob, first, ahead),
        }
    }
}

/// Dims `d0..d0 + ob.len()` (at most 16·C) of the weighted sum of the rows of `values`.
/// `first`: also prefetch each row ahead and a share of `ahead` per position.
#[inline(always)]
unsafe fn axpy_block<R: KvRowReader, A, const C: usize>(
    w: &[f32],
    values: R,
    d0: usize,
    ob: &mut [f32],
    first: bool,
    ahead: &[A],
) {
    let (row_bytes, rows, base) = (values.row_bytes(), w.len(), values.base());
    let n = ob.len();
    let width = |c: usize| (n - 16 * c).min(16);
    // A plain loop, not array::from_fn (see reduce16).
    let mut acc = [_mm512_setzero_ps(); C];
    for (c, a) in acc.iter_mut().enumerate() {
        *a = f32::load16(ob.as_ptr().add(16 * c), width(c));
    }
    let shares = PrefetchShares::new(ahead, rows);
    for (p, wp) in w.iter().enumerate() {
        if first {
            prefetch_kv_rows(base, row_bytes, p + KV_PREFETCH_ROWS, p + KV_PREFETCH_ROWS + 1, rows);
            shares.issue(p);
        }
        let wv = _mm512_set1_ps(*wp);
        let row = values.row(p);
        for (c, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(wv, values.load16(row, d0 + 16 * c, width(c)), *a);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(ob.as_mut_ptr().add(16 * c), ((1u32 << width(c)) - 1) as __mmask16, *a);
    }
}

/// Scores of the `heads` query heads of one grouped-query group (`qs`: `heads` rows of hd) over
/// their shared keys into `out` (`heads` rows of n): four heads a pass (then two, then one with
/// [`scores_impl`]), each block of keys loaded (and converted from f16) once for all of them.
/// Every score is the per-head kernel's, bit for bit: each (key, head) accumulator is built
/// chunk by chunk as there, and reduced by the same tree.
#[inline(always)]
unsafe fn scores_group_impl<R: KvRowReader, A>(
    qs: &[f32],
    heads: usize,
    keys: R,
    scale: f32,
    out: &mut [f32],
    ahead: &[A],
) {
    let (hd, n) = (qs.len() / heads, out.len() / heads);
    let mut h = 0;
    while h < heads {
        // The first pass streams the keys in (and asks for `ahead`); later ones find them in L2.
        let ah = if h == 0 { ahead } else { &[] };
        let (q, o) = (&qs[h * hd..], &mut out[h * n..]);
        h += match heads - h {
            1 => {
                scores_impl(&q[..hd], keys, scale, &mut o[..n], ah);
                1
            }
            2 | 3 => scores_heads::<R, A, 2, 8>(q, hd, keys, scale, o, n, ah),
            _ => scores_heads::<R, A, 4, 4>(q, hd, keys, scale, o, n, ah),
        };
    }
}

/// H heads (rows of `qs`) × `n` keys, KP = 16 / H keys a pass: one accumulator per (key, head),
/// reduced together by [`reduce_tree16`]. Returns H.
#[inline(always)]
unsafe fn scores_heads<R: KvRowReader, A, const H: usize, const KP: usize>(
    qs: &[f32],
    hd: usize,
    keys: R,
    scale: f32,
    out: &mut [f32],
    n: usize,
    ahead: &[A],
) -> usize {
    const { assert!(H * KP == 16) };
    debug_assert!(qs.len() >= H * hd && out.len() >= H * n);
    let (row_bytes, base) = (keys.row_bytes(), keys.base());
    let steps = n / KP + 1;
    let shares = PrefetchShares::new(ahead, steps);
    prefetch_kv_rows(base, row_bytes, 0, KV_PREFETCH_ROWS, n);
    let sc = _mm512_set1_ps(scale);
    let mut p = 0;
    while p + KP <= n {
        prefetch_kv_rows(base, row_bytes, p + KV_PREFETCH_ROWS, p + KV_PREFETCH_ROWS + KP, n);
        shares.issue(p / KP);
        // Lane h·KP + k: head h, key p + k.
        let v = _mm512_mul_ps(scores_block::<R, H, KP>(qs, hd, keys, p), sc);
        for h in 0..H {
            // Lanes h·KP..(h + 1)·KP, stored at out[h·n + p..]: the store's lane 0 falls
            // h·KP floats before it (masked off, never written).
            let dst = out.as_mut_ptr().add(h * n + p).wrapping_sub(h * KP);
            _mm512_mask_storeu_ps(dst, (((1u32 << KP) - 1) << (h * KP)) as __mmask16, v);
        }
        p += KP;
    }
    shares.issue(steps - 1);
    for p in p..n {
        for h in 0..H {
            out[h * n + p] = score_one(qs.as_ptr().add(h * hd), keys, keys.row(p), hd) * scale;
        }
    }
    H
}

/// Unscaled scores of the KP keys from row `p0` × H heads, lane h·KP + k (see
/// [`reduce_tree16`]'s accumulator order): each key's chunk is loaded (and decoded) once for
/// the H heads.
#[inline(always)]
unsafe fn scores_block<R: KvRowReader, const H: usize, const KP: usize>(
    qs: &[f32],
    hd: usize,
    keys: R,
    p0: usize,
) -> __m512 {
    let mut rows = [keys.row(p0); KP];
    for (k, r) in rows.iter_mut().enumerate().skip(1) {
        *r = keys.row(p0 + k);
    }
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut i = 0;
    while i < hd {
        let w = (hd - i).min(16);
        let m = ((1u32 << w) - 1) as __mmask16;
        let mut qv = [_mm512_setzero_ps(); H];
        for h in 0..H {
            qv[h] = f32::load16(qs.as_ptr().add(h * hd + i), w);
        }
        for (key, row) in rows.iter().enumerate() {
            let kv = keys.load16(*row, i, w);
            for h in 0..H {
                // Output lane L = h·KP + key comes from accumulator 4(L mod 4) + L / 4.
                let l = h * KP + key;
                let a = 4 * (l % 4) + l / 4;
                acc[a] = _mm512_mask3_fmadd_ps(qv[h], kv, acc[a], m);
            }
        }
        i += 16;
    }
    reduce_tree16(acc)
}

/// The weighted sums of the `heads` heads of one group over their shared values (`ws`: `heads`
/// rows of n weights; `os`: `heads` rows of hd), four heads a pass (then two, then one with
/// [`axpy_impl`]), each value chunk loaded (and converted) once for all of them. Each lane adds
/// its products in position order, as the per-head kernel does: the same floats.
#[inline(always)]
unsafe fn axpy_group_impl<R: KvRowReader, A>(ws: &[f32], heads: usize, values: R, os: &mut [f32], ahead: &[A]) {
    let (n, hd) = (ws.len() / heads, os.len() / heads);
    let mut h = 0;
    while h < heads {
        let ah = if h == 0 { ahead } else { &[] };
        let (w, o) = (&ws[h * n..], &mut os[h * hd..]);
        h += match heads - h {
            1 => {
                axpy_impl(&w[..n], values, &mut o[..hd], ah);
                1
            }
            2 | 3 => axpy_heads::<R, A, 2, 8>(w, n, values, o, hd, ah),
            _ => axpy_heads::<R, A, 4, 4>(w, n, values, o, hd, ah),
        };
    }
}

/// H heads' weighted sums, C ≤ 16 / H vectors of dims a pass over the positions. Returns H.
#[inline(always)]
unsafe fn axpy_heads<R: KvRowReader, A, const H: usize, const C: usize>(
    ws: &[f32],
    n: usize,
    values: R,
    os: &mut [f32],
    hd: usize,
    ahead: &[A],
) -> usize {
    debug_assert!(ws.len() >= H * n && os.len() >= H * hd);
    let (row_bytes, base) = (values.row_bytes(), values.base());
    prefetch_kv_rows(base, row_bytes, 0, KV_PREFETCH_ROWS, n);
    let shares = PrefetchShares::new(ahead, n);
    let mut d0 = 0;
    while d0 < hd {
        let first = d0 == 0;
        let width = |c: usize| (hd - d0).saturating_sub(16 * c).min(16);
        let mut acc = [[_mm512_setzero_ps(); C]; H];
        for h in 0..H {
            for c in 0..C {
                if width(c) > 0 {
                    acc[h][c] = f32::load16(os.as_ptr().add(h * hd + d0 + 16 * c), width(c));
                }
            }
        }
        for p in 0..n {
            if first {
                prefetch_kv_rows(base, row_bytes, p + KV_PREFETCH_ROWS, p + KV_PREFETCH_ROWS + 1, n);
                shares.issue(p);
            }
            let mut wv = [_mm512_setzero_ps(); H];
            for h in 0..H {
                wv[h] = _mm512_set1_ps(*ws.get_unchecked(h * n + p));
            }
            let row = values.row(p);
            for c in 0..C {
                if width(c) == 0 {
                    break;
                }
                let v = values.load16(row, d0 + 16 * c, width(c));
                for h in 0..H {
                    acc[h][c] = _mm512_fmadd_ps(wv[h], v, acc[h][c]);
                }
            }
        }
        for h in 0..H {
            for c in 0..C {
                if width(c) > 0 {
                    let m = ((1u32 << width(c)) - 1) as __mmask16;
                    _mm512_mask_storeu_ps(os.as_mut_ptr().add(h * hd + d0 + 16 * c), m, acc[h][c]);
                }
            }
        }
        d0 += 16 * C;
    }
    H
}

/// Attention scores over f32 or f16 key rows: [`scores_impl`].
pub(crate) fn attention_scores<K: Lanes16>(
    _t: Avx512,
    q: &[f32],
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    ahead: &[K],
) {
    assert!(keys.len() >= out.len() * q.len());
    // SAFETY: the token proves AVX-512 F/BW/VL/F16C; loads stay inside `q` and `keys` (masked
    // for the last partial chunk), as the assert above guarantees; `ahead` is only
    // prefetched, which never faults.
    unsafe { scores_plain(q, keys, scale, out, ahead) }
}

/// The attention's weighted sum over f32 or f16 value rows: [`axpy_impl`].
pub(crate) fn attention_axpy<K: Lanes16>(_t: Avx512, w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
    assert!(values.len() >= w.len() * o.len());
    // SAFETY: as above, for `w`, `values` and `o`.
    unsafe { axpy_plain(w, values, o, ahead) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn scores_plain<K: Lanes16>(q: &[f32], keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
    scores_impl(q, PlainRows { p: keys.as_ptr(), hd: q.len() }, scale, out, ahead)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn axpy_plain<K: Lanes16>(w: &[f32], values: &[K], o: &mut [f32], ahead: &[K]) {
    axpy_impl(w, PlainRows { p: values.as_ptr(), hd: o.len() }, o, ahead)
}

/// [`scores_group_impl`]: `heads` rows of `qs` over the keys, into `heads` rows of `out`.
pub(crate) fn attention_scores_group<K: Lanes16>(
    _t: Avx512,
    qs: &[f32],
    heads: usize,
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    ahead: &[K],
) {
    assert!(heads > 0 && qs.len().is_multiple_of(heads) && out.len().is_multiple_of(heads));
    assert!(keys.len() >= out.len() / heads * (qs.len() / heads));
    // SAFETY: the token proves AVX-512 F/BW/VL/F16C; every load stays inside `qs` and `keys`
    // and every store inside `out` (rows of hd and n, masked at the ends), as the asserts above
    // guarantee; `ahead` is only prefetched, which never faults.
    unsafe { scores_group_plain(qs, heads, keys, scale, out, ahead) }
}

/// [`axpy_group_impl`]: `heads` rows of `ws` over the values, into `heads` rows of `os`.
pub(crate) fn attention_axpy_group<K: Lanes16>(
    _t: Avx512,
    ws: &[f32],
    heads: usize,
    values: &[K],
    os: &mut [f32],
    ahead: &[K],
) {
    assert!(heads > 0 && ws.len().is_multiple_of(heads) && os.len().is_multiple_of(heads));
    assert!(values.len() >= ws.len() / heads * (os.len() / heads));
    // SAFETY: as above, for `ws`, `values` and `os`.
    unsafe { axpy_group_plain(ws, heads, values, os, ahead) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn scores_group_plain<K: Lanes16>(
    qs: &[f32],
    heads: usize,
    keys: &[K],
    scale: f32,
    out: &mut [f32],
    ahead: &[K],
) {
    let rows = PlainRows { p: keys.as_ptr(), hd: qs.len() / heads };
    scores_group_impl(qs, heads, rows, scale, out, ahead)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
unsafe fn axpy_group_plain<K: Lanes16>(ws: &[f32], heads: usize, values: &[K], os: &mut [f32], ahead: &[K]) {
    axpy_group_impl(ws, heads, PlainRows { p: values.as_ptr(), hd: os.len() / heads }, os, ahead)
}
