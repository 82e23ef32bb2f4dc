//! AVX-512 kernels: VNNI `vpdpbusd` (64 unsigned-code × signed-int8 products per instruction)
//! and VPOPCNTDQ.
//!
//! Every public item takes an [`Avx512`] token, which exists only when the CPU reports
//! AVX-512 F/BW/VL/VNNI/VPOPCNTDQ, so the `#[target_feature]` functions behind it are sound.
//! AVX-512F implies AVX2, so the AVX2 TQ1 decoder is reused here.

use std::arch::x86_64::*;
use std::ops::Range;

use super::portable::{
    i2_tail_dot, run, tq1_digit_order, tq1_row_chunks, tq1_row_digit_order, tq2_lane_order, IsaOps, TQ1_DIGIT_BLOCK,
};
use super::x86_avx2::{
    decode_tq1_block as decode_tq1_block_avx2, encode_i2_block, f16_to_f64, lut_emit, lut_widen_span, prefetch_l2,
    prefetch_rows_l2, prefetch_stream, prefetch_stream_span, times3_asm, tq1_rows_with, LookupRows, PrefetchShares,
};
use super::{batched_tiles, finish_blocks, finish_tensor, tile_pointers, KernelForm, KernelScratch, TokenTables};
use crate::activations::{ActivationBatch, ACT_PLANES, PLANE_WEIGHTS};
use crate::aligned::AlignedBytes;
use crate::cpu::IsaLevel;
use crate::formats::i2::{I2_BLOCK_BYTES, I2_BLOCK_WEIGHTS};
use crate::formats::tq1_perm::PERM_TILE_ROWS;
use crate::formats::{BlockTq1_0, BlockTq2_0, I2Matrix, PackedWeights, Tq1Matrix, Tq1PermMatrix, Tq2Matrix, QK_K};

/// Proof that AVX-512 F/BW/VL/VNNI/VPOPCNTDQ are available.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    pub(crate) fn new() -> Option<Self> {
        IsaLevel::Avx512.is_supported().then_some(Avx512(()))
    }
}

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
            unsafe { super::x86_avx2::tq1_lut(w, x, tables, rows, out) }
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
            super::portable::tq1_perm_portable(w, x, tables, rows, out)
        }
    }
}

/// Whether this CPU has what the `perm` kernel needs beyond the AVX-512 level: VBMI
/// (`vpermb`) and GFNI (`vgf2p8affineqb`).
pub(crate) fn perm_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512vbmi") && std::arch::is_x86_feature_detected!("gfni")
}

/// The table-lookup TQ1 kernel's sign and nibble operations in fewer vector operations than
/// AVX2's ([`super::x86_avx2::CompareSigns`]): a pair's negated lanes are one `vptestmb` of the
/// span's sign vector against the pair's bit (AVX2: a compare and a doubling), applied as a
/// masked `vpsubb` from −1 (in place of the XOR), and the high nibble is one `vgf2p8affineqb`
/// (AVX2: a shift and an AND).
struct MaskSigns;

impl super::x86_avx2::LutSigns for MaskSigns {
    type Neg = __mmask32;
    #[inline(always)]
    unsafe fn negated(sign: &mut __m256i, pair: usize) -> __mmask32 {
        _mm256_test_epi8_mask(*sign, _mm256_set1_epi8((0x80u8 >> pair) as i8))
    }
    #[inline(always)]
    unsafe fn complement(v: __m256i, neg: __mmask32) -> __m256i {
        _mm256_mask_sub_epi8(v, neg, _mm256_set1_epi8(-1), v)
    }
    #[inline(always)]
    unsafe fn high_nibble(v: __m256i) -> __m256i {
        // Output bit i (row byte 7 − i of the matrix) is input bit i + 4 for i < 4, else 0.
        _mm256_gf2p8affine_epi64_epi8::<0>(v, _mm256_set1_epi64x(0x1020_4080_0000_0000))
    }
}

/// [`super::x86_avx2::tq1_lut`] with [`MaskSigns`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,avx2,fma,popcnt,f16c")]
unsafe fn tq1_lut_masks(
    w: &crate::formats::Tq1LutMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    super::x86_avx2::tq1_lut_with::<MaskSigns>(w, x, tables, rows, out)
}

/// One token's `perm` tables (`tq1_perm::build_perm_tables_portable` is the definition), two
/// groups per step in 512-bit registers: the six activations' bytes broadcast from one 8-byte
/// load, spread by `vpshufb` into each group's (a, b) and (c, ·) byte pairs (group 2P in the low
/// 256 bits, 2P + 1 in the high), the 16 pattern sums per group in i16 lanes from `vpmaddubsw`
/// against constant trit pairs (as the `lut` builder's [`super::x86_avx2::LutGroupSums`]),
/// split into l and h bytes by `vpmovwb`, and each group's `[l | !l | h | !h]` put together by
/// one `vpermt2q`. One token's tables of 1536 columns took 1.23 µs one group per step in
/// 256-bit registers, 1.15–1.19 µs so (`lut`: 0.84): writing twice `lut`'s bytes is most of it.
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

/// The `perm` TQ1 kernel (see `formats::tq1_perm`): one token, two 32-row tiles per pass
/// where the range has them, sharing each table load; more tokens, two tiles against
/// [`PERM_TOKENS`] tokens per pass ([`perm_batched`]), sharing each table load and each span's
/// codes. Rows outside `rows` of a tile the range only partly covers are computed and dropped.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,gfni,avx2,fma,popcnt,f16c")]
unsafe fn tq1_perm(
    w: &Tq1PermMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    let (first, end) = (rows.start / PERM_TILE_ROWS, rows.end.div_ceil(PERM_TILE_ROWS));
    let spans = w.spans();
    let lr = LookupRows { scales: w.row_scales(), negated: w.negated_counts() };
    let r0 = |t: usize| t * PERM_TILE_ROWS;
    // Prefetch distance: the same place in the tiles of the next pass. A fixed distance (the
    // `lut` kernel's PREFETCH_L2_BYTES) falls, for two 32-row tiles of 2560-wide rows (17 KB
    // each), into the second tile of the same pass: streamed, that ran at 13.4 GB/s against
    // 22 for `lut`.
    let tile_bytes = w.tile(first).len();
    let mut t = first;
    while t < end {
        if batch == 1 {
            let table = [tables.token(0).as_ptr()];
            if t + 2 <= end {
                let sums =
                    perm_tiles::<2, 1>([w.tile(t).as_ptr(), w.tile(t + 1).as_ptr()], table, 0..spans, 2 * tile_bytes);
                lut_emit(lr, x, &rows, out, r0(t), 0, &sums[0][0]);
                lut_emit(lr, x, &rows, out, r0(t + 1), 0, &sums[1][0]);
                t += 2;
            } else {
                let sums = perm_tiles::<1, 1>([w.tile(t).as_ptr()], table, 0..spans, tile_bytes);
                lut_emit(lr, x, &rows, out, r0(t), 0, &sums[0][0]);
                t += 1;
            }
            continue;
        }
        // More tokens: two tiles per pass where the range has them, sharing each table load.
        if t + 2 <= end {
            perm_batched::<2>(w, x, tables, &rows, out, t, tile_bytes);
            t += 2;
        } else {
            perm_batched::<1>(w, x, tables, &rows, out, t, tile_bytes);
            t += 1;
        }
    }
}

/// [`tq1_perm`] for more than one token: R tiles from `t` against every token, in column
/// chunks whose tables for a block of tokens take [`PERM_TABLE_BUDGET`], each chunk against
/// every token of the block, [`PERM_TOKENS`] per pass. Every token's tables are read once per
/// pass over R tiles, which for eight tokens' 6912-wide rows (147 KB each) is more than L2
/// holds: two tiles per pass halve those reads.
#[inline(always)]
unsafe fn perm_batched<const R: usize>(
    w: &Tq1PermMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: &Range<usize>,
    out: &mut [f32],
    t: usize,
    tile_bytes: usize,
) {
    let (batch, spans) = (x.batch(), w.spans());
    let lr = LookupRows { scales: w.row_scales(), negated: w.negated_counts() };
    let src: [*const u8; R] = std::array::from_fn(|i| w.tile(t + i).as_ptr());
    let zero = _mm256_setzero_si256();
    let mut first_token = 0;
    while first_token < batch {
        let tokens = (batch - first_token).min(PERM_BLOCK_TOKENS);
        let chunk = (PERM_TABLE_BUDGET / (tokens * PERM_SPAN_TABLE_BYTES)).max(1);
        let mut sums = [[[zero; 4]; PERM_BLOCK_TOKENS]; R];
        let mut c0 = 0;
        while c0 < spans {
            let cols = c0..spans.min(c0 + chunk);
            let mut b0 = 0;
            while b0 < tokens {
                let g = PERM_TOKENS.min(tokens - b0);
                let tb = |i: usize| tables.token(first_token + b0 + i.min(g - 1)).as_ptr();
                // Only the first pass over a chunk streams it from memory; later ones hit L1/L2.
                let ahead = if b0 == 0 { R * tile_bytes } else { 0 };
                let mut part = [[[zero; 4]; PERM_TOKENS]; R];
                match g {
                    1 => {
                        let one = perm_tiles::<R, 1>(src, [tb(0)], cols.clone(), ahead);
                        for i in 0..R {
                            part[i][0] = one[i][0];
                        }
                    }
                    _ => part = perm_tiles::<R, PERM_TOKENS>(src, std::array::from_fn(tb), cols.clone(), ahead),
                }
                for i in 0..R {
                    for (sum, p) in sums[i][b0..b0 + g].iter_mut().zip(&part[i]) {
                        for (s, v) in sum.iter_mut().zip(p) {
                            *s = _mm256_add_epi32(*s, *v);
                        }
                    }
                }
                b0 += g;
            }
            c0 = cols.end;
        }
        for (i, tile_sums) in sums.iter().enumerate() {
            for (b, s) in tile_sums[..tokens].iter().enumerate() {
                lut_emit(lr, x, rows, out, (t + i) * PERM_TILE_ROWS, first_token + b, s);
            }
        }
        first_token += tokens;
    }
}

/// Tokens whose row sums a batched `perm` tile keeps while it goes through the columns.
const PERM_BLOCK_TOKENS: usize = crate::kernels::LUT_MAX_BATCH;

/// Bytes of tables a batched `perm` tile reads per column chunk (a quarter of Zen 4's L2).
const PERM_TABLE_BUDGET: usize = 256 * 1024;

/// Bytes of one token's tables for one span.
const PERM_SPAN_TABLE_BYTES: usize =
    crate::formats::tq1_perm::PERM_SPAN_GROUPS * crate::formats::tq1_perm::PERM_GROUP_TABLE_BYTES;

/// Tokens per pass of the batched `perm` tile.
const PERM_TOKENS: usize = 2;

/// Spans summed in i16 lanes before they are widened: a lane takes one row's eight groups per
/// span, each a looked-up sum or its complement in [−384 − 33, 384], so eight spans stay within
/// 64 · 417 = 26 688.
const PERM_I16_SPANS: usize = 8;

/// A span's eight code vectors from its five stored ones (`formats::tq1_perm`'s layout): codes
/// 0–4 as stored (`vpermb` reads bits 0–4 only), codes 5–7 gathered from bits 5–7 by
/// `vgf2p8affineqb` (one bit permutation within each byte) and OR-ed together. Bits 5–7 of
/// codes 5–7 are zero; those of 0–4 are other codes' bits, which `vpermb` ignores.
#[inline(always)]
unsafe fn perm_codes(v: [__m256i; 5]) -> [__m256i; 8] {
    // Matrix byte 7 − i gives output bit i; these move input bits to outputs:
    // 5, 6, 7 → 0, 1, 2; 5, 6 → 3, 4; 7 → 3; 7 → 4.
    let bits_5_7_to_0 = _mm256_set1_epi64x(0x2040_8000_0000_0000);
    let bits_5_6_to_3 = _mm256_set1_epi64x(0x0000_0020_4000_0000);
    let bit_7_to_3 = _mm256_set1_epi64x(0x0000_0080_0000_0000);
    let bit_7_to_4 = _mm256_set1_epi64x(0x0000_0000_8000_0000);
    let gf = |a: __m256i, m: __m256i| _mm256_gf2p8affine_epi64_epi8::<0>(a, m);
    let c5 = _mm256_or_si256(gf(v[0], bits_5_7_to_0), gf(v[1], bits_5_6_to_3));
    let c6 = _mm256_or_si256(gf(v[2], bits_5_7_to_0), gf(v[3], bits_5_6_to_3));
    // a | b | c.
    let c7 = _mm256_ternarylogic_epi32::<0xFE>(gf(v[4], bits_5_7_to_0), gf(v[1], bit_7_to_3), gf(v[3], bit_7_to_4));
    [v[0], v[1], v[2], v[3], v[4], c5, c6, c7]
}

/// Σ over spans `spans` of R 32-row tiles (`src[i]`: the tile's bytes) against G tokens' `perm`
/// tables: per group, one `vpermb` each from its l and h tables for 32 rows, added in i8 lanes
/// over the span's eight groups; once per span, l and h unpacked into (l, h) byte pairs and
/// `vpmaddubsw` by (1, 32) give i16 row sums, widened to i32 every [`PERM_I16_SPANS`] spans.
/// Returns each tile's and token's row sums as i32 vectors of rows 0–7, 8–15, 16–23, 24–31,
/// with every negated group counted as −v − 33. Prefetches into L2 `ahead` bytes past what it
/// reads of each tile (0: none).
#[inline(always)]
unsafe fn perm_tiles<const R: usize, const G: usize>(
    src: [*const u8; R],
    tables: [*const u8; G],
    spans: Range<usize>,
    ahead: usize,
) -> [[[__m256i; 4]; G]; R] {
    use crate::formats::tq1_perm::{PERM_GROUP_TABLE_BYTES, PERM_SPAN_BYTES, PERM_SPAN_GROUPS};
    let zero = _mm256_setzero_si256();
    let mut wide = [[[zero; 4]; G]; R];
    let mut s = spans.start;
    while s < spans.end {
        let end = spans.end.min(s + PERM_I16_SPANS);
        // Per tile and token: rows 0–7 and 16–23 (unpacked low halves), 8–15 and 24–31.
        let mut acc = [[[zero; 2]; G]; R];
        while s < end {
            let off = s * PERM_SPAN_BYTES;
            if ahead > 0 && s.is_multiple_of(2) {
                // Two spans are five cache lines, into L2 (as the `lut` kernel).
                for p in src {
                    for l in 0..5 {
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off + 64 * l + ahead) as *const i8);
                    }
                }
            }
            let mut codes = [[zero; PERM_SPAN_GROUPS]; R];
            for i in 0..R {
                let v = [0, 1, 2, 3, 4].map(|k| _mm256_loadu_si256(src[i].add(off + 32 * k) as *const __m256i));
                codes[i] = perm_codes(v);
            }
            let toff = s * PERM_SPAN_GROUPS * PERM_GROUP_TABLE_BYTES;
            let mut part = [[[zero; 2]; G]; R];
            for k in 0..PERM_SPAN_GROUPS {
                for g in 0..G {
                    let t = tables[g].add(toff + k * PERM_GROUP_TABLE_BYTES);
                    let t_l = _mm256_loadu_si256(t as *const __m256i);
                    let t_h = _mm256_loadu_si256(t.add(32) as *const __m256i);
                    for i in 0..R {
                        part[i][g][0] = _mm256_add_epi8(part[i][g][0], _mm256_permutexvar_epi8(codes[i][k], t_l));
                        part[i][g][1] = _mm256_add_epi8(part[i][g][1], _mm256_permutexvar_epi8(codes[i][k], t_h));
                    }
                }
            }
            lut_widen_span(&part, &mut acc);
            s += 1;
        }
        for i in 0..R {
            for g in 0..G {
                let [a, b] = acc[i][g];
                let parts = [
                    _mm256_castsi256_si128(a),
                    _mm256_castsi256_si128(b),
                    _mm256_extracti128_si256::<1>(a),
                    _mm256_extracti128_si256::<1>(b),
                ];
                for (wd, p) in wide[i][g].iter_mut().zip(parts) {
                    *wd = _mm256_add_epi32(*wd, _mm256_cvtepi16_epi32(p));
                }
            }
        }
    }
    wide
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

#[inline(always)]
unsafe fn store(p: *mut u8, v: __m512i) {
    _mm512_storeu_si512(p as *mut _, v)
}

/// Codes `(v >> 2n) & 3` for n = 0..4.
#[inline(always)]
unsafe fn split4(v: __m512i) -> [__m512i; 4] {
    // Not array::from_fn: see reduce16.
    [i2_field(v, 0), i2_field(v, 1), i2_field(v, 2), i2_field(v, 3)]
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

/// Sum of all i32 lanes of a token's accumulators.
#[inline(always)]
unsafe fn reduce_acc<const A: usize>(acc: &[__m512i; A]) -> i32 {
    let mut s = acc[0];
    for a in &acc[1..] {
        s = _mm512_add_epi32(s, *a);
    }
    _mm512_reduce_add_epi32(s)
}

/// Rows and tokens of a batched integer tile ([`code_tile`]): 4 × 4 accumulators, so that each
/// activation load feeds four `vpdpbusd` and each code vector four, with the codes of one
/// field of four rows and one activation vector beside them in registers.
const TILE_ROWS: usize = 4;
const TILE_TOKENS: usize = 4;

/// Runs `$tile::<R, G>($args…)` for the row count R ∈ {4, 2, 1} (the largest ≤ `$rows`) and
/// token count `$g` ∈ 1..=4 of a [`batched_tiles`] step; evaluates to R.
macro_rules! code_tile_for {
    ($tile:ident, $rows:expr, $g:expr, ($($arg:expr),*)) => {{
        let rows = match $rows {
            0 => unreachable!("a tile has rows"),
            1 => 1,
            2 | 3 => 2,
            _ => 4,
        };
        match (rows, $g) {
            (4, 1) => $tile::<4, 1>($($arg),*),
            (4, 2) => $tile::<4, 2>($($arg),*),
            (4, 3) => $tile::<4, 3>($($arg),*),
            (4, 4) => $tile::<4, 4>($($arg),*),
            (2, 1) => $tile::<2, 1>($($arg),*),
            (2, 2) => $tile::<2, 2>($($arg),*),
            (2, 3) => $tile::<2, 3>($($arg),*),
            (2, 4) => $tile::<2, 4>($($arg),*),
            (1, 1) => $tile::<1, 1>($($arg),*),
            (1, 2) => $tile::<1, 2>($($arg),*),
            (1, 3) => $tile::<1, 3>($($arg),*),
            (1, 4) => $tile::<1, 4>($($arg),*),
            _ => unreachable!("token groups are 1..=4"),
        }
        rows
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn i2_fused(w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let batch = x.batch();
    if batch > 1 {
        batched_tiles::<TILE_ROWS, TILE_TOKENS>(rows, w.row_bytes(), batch, out, |r, left, b0, g, first, o| {
            code_tile_for!(i2_tile, left, g, (w, r, x, b0, first, o))
        });
        return;
    }
    // One token: four rows per pass (16 accumulators, codes masked as they are used): the
    // per-row epilogue weighed as much as the loop on short rows (K = 1536: 6 blocks).
    let mut r = rows.start;
    while r < rows.end {
        let o = &mut out[r - rows.start..];
        if r + 4 <= rows.end {
            i2_masked_rows::<4>(w, r, x, o);
            r += 4;
        } else if r + 2 <= rows.end {
            i2_masked_rows::<2>(w, r, x, o);
            r += 2;
        } else {
            i2_masked_rows::<1>(w, r, x, o);
            r += 1;
        }
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
    let sums = code_tile::<R, G, false>(src, I2_BLOCK_BYTES, w.full_blocks(), xs, prefetch);
    let (full, t) = (w.full_blocks(), w.tail_weights());
    if G == TILE_TOKENS && t == 0 {
        // Four tokens and no tail, the common case: finish_tensor lane by lane, the same two
        // f32 multiplies in the same order, four outputs per row stored at once.
        let xsum = _mm512_broadcast_i32x4(_mm_loadu_si128(x.sums()[b0..b0 + 4].as_ptr() as *const __m128i));
        let xscale = _mm512_broadcast_f32x4(_mm_loadu_ps(x.scales()[b0..b0 + 4].as_ptr()));
        let f = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, xsum));
        let f = _mm512_mul_ps(_mm512_mul_ps(f, _mm512_set1_ps(w.scale())), xscale);
        store_row_quads::<R>(f, out, batch, b0);
        return;
    }
    let sums = lanes_i32(sums);
    for i in 0..R {
        for g in 0..G {
            let b = b0 + g;
            let mut isum = sums[i * G + g];
            if t > 0 {
                isum += i2_tail_dot(&w.row(r + i)[full * I2_BLOCK_BYTES..], t, &x.token(b)[full * I2_BLOCK_WEIGHTS..]);
            }
            out[i * batch + b] = finish_tensor(isum - x.sum(b), w.scale(), x.scale(b));
        }
    }
}

/// Stores 128-bit lane i of `f` (row i's four tokens) at `out[i·batch + b0..][..4]`, i < R.
#[inline(always)]
unsafe fn store_row_quads<const R: usize>(f: __m512, out: &mut [f32], batch: usize, b0: usize) {
    let lanes: [__m128; 4] = std::mem::transmute(f);
    for i in 0..R {
        let dst = &mut out[i * batch + b0..i * batch + b0 + 4];
        _mm_storeu_ps(dst.as_mut_ptr(), lanes[i]);
    }
}

/// Integer dot products of R back-to-back rows × G tokens over `blocks` blocks of 256 2-bit
/// codes, `stride` bytes apart in each row: an I2 block (64 bytes, [`i2_field`]) or, with
/// `TQ2`, a TQ2_0 block (66 bytes, [`tq2_code_vector`]). Field by field: the R rows' code
/// vectors of field n, then each token's 64 activations of that field, loaded once for all R
/// rows. One accumulator per row and token (R·G ≤ 16: 16 chains hide vpdpbusd's latency at two
/// per cycle). With `prefetch`, the R rows are prefetched as one ascending stream (as in
/// [`masked_rows_sums`]); later token groups of a row block read them from L2. Returns the
/// sums in one vector, row i and token g in lane `i·G + g` ([`reduce16`]).
#[inline(always)]
unsafe fn code_tile<const R: usize, const G: usize, const TQ2: bool>(
    src: [*const u8; R],
    stride: usize,
    blocks: usize,
    xs: [*const u8; G],
    prefetch: bool,
) -> __m512i {
    let mut acc = [[_mm512_setzero_si512(); G]; R];
    for blk in 0..blocks {
        let off = blk * stride;
        if prefetch {
            for i in 0..R + TQ2 as usize {
                prefetch_stream(src[0].wrapping_add(R * off + 64 * i));
            }
        }
        // Plain loops, not array::from_fn (see reduce16).
        let mut raw = [_mm512_setzero_si512(); R];
        if !TQ2 {
            for i in 0..R {
                raw[i] = load(src[i].add(off));
            }
        }
        for n in 0..4 {
            let mut c = [_mm512_setzero_si512(); R];
            for i in 0..R {
                c[i] = if TQ2 { tq2_code_vector(src[i].add(off), n) } else { i2_field(raw[i], n) };
            }
            for g in 0..G {
                let xv = load(xs[g].add(blk * QK_K + 64 * n));
                for i in 0..R {
                    acc[i][g] = _mm512_dpbusd_epi32(acc[i][g], c[i], xv);
                }
            }
        }
    }
    reduce16(acc)
}

/// The lane sums of the R × G (≤ 16) accumulators in one vector: lane `i·G + g` holds the sum of
/// `acc[i][g]`'s lanes, lanes past R·G zero. A transposing tree: adjacent accumulators are
/// interleaved and added 32 bits, then 64 bits, then 128-bit lanes at a time, 15 adds and
/// 30 shuffles for 16 sums, where one reduction each took 4 adds and 4 shuffles plus a move
/// to a scalar register. On 4 × 4 tiles of 2560-wide rows (10 blocks, 640 vpdpbusd) the
/// per-tile epilogue had been about 30% of the kernel's time.
#[inline(always)]
unsafe fn reduce16<const R: usize, const G: usize>(acc: [[__m512i; G]; R]) -> __m512i {
    const { assert!(R * G <= 16) };
    // Plain loops, not array::from_fn: its closures are not always inlined, and out of line
    // they lose this function's target features (each intrinsic became a call).
    let mut v = [_mm512_setzero_si512(); 16];
    for i in 0..R {
        for g in 0..G {
            v[i * G + g] = acc[i][g];
        }
    }
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3].
    let mut w = [_mm512_setzero_si512(); 8];
    for k in 0..8 {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        w[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    }
    // Per 128-bit lane: one partial sum of each of four accumulators, in order.
    let mut x = [_mm512_setzero_si512(); 4];
    for k in 0..4 {
        let (c, d) = (w[2 * k], w[2 * k + 1]);
        x[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(c, d), _mm512_unpackhi_epi64(c, d));
    }
    // 128-bit lanes (0 + 1, 2 + 3) of x[2k] then of x[2k + 1].
    let mut u = [_mm512_setzero_si512(); 2];
    for k in 0..2 {
        let (e, f) = (x[2 * k], x[2 * k + 1]);
        u[k] =
            _mm512_add_epi32(_mm512_shuffle_i64x2::<0b10_00_10_00>(e, f), _mm512_shuffle_i64x2::<0b11_01_11_01>(e, f));
    }
    // 128-bit lane m: the sums of accumulators 4m..4m + 4.
    _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b10_00_10_00>(u[0], u[1]),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(u[0], u[1]),
    )
}

/// Lanes of an i32 vector as an array.
#[inline(always)]
unsafe fn lanes_i32(v: __m512i) -> [i32; 16] {
    std::mem::transmute(v)
}

/// The mask of 2-bit field n of every byte, `3 << 2n`: `v & mask` leaves the field in place,
/// its code times 4ⁿ. One AND per field and no shift; the accumulator of field n is divided
/// by 4ⁿ at the end ([`combine_fields`]), exactly, since every product in it is a multiple of 4ⁿ.
#[inline(always)]
unsafe fn field_mask(n: usize) -> __m512i {
    _mm512_set1_epi8((3u8 << (2 * n)) as i8)
}

/// Σ over fields n of `acc[n] >> 2n` (arithmetic, exact: see [`field_mask`]), lane by lane.
#[inline(always)]
unsafe fn combine_fields(acc: [__m512i; 4]) -> __m512i {
    _mm512_add_epi32(
        _mm512_add_epi32(acc[0], _mm512_srai_epi32::<2>(acc[1])),
        _mm512_add_epi32(_mm512_srai_epi32::<4>(acc[2]), _mm512_srai_epi32::<6>(acc[3])),
    )
}

/// The lane sums of R vectors, two at a time.
#[inline(always)]
unsafe fn reduce_rows<const R: usize>(lanes: [__m512i; R]) -> [i32; R] {
    let mut sums = [0; R];
    let mut i = 0;
    while i + 1 < R {
        (sums[i], sums[i + 1]) = reduce_two(lanes[i], lanes[i + 1]);
        i += 2;
    }
    if i < R {
        sums[i] = _mm512_reduce_add_epi32(lanes[i]);
    }
    sums
}

/// Token 0 × rows `r..r+R` of an I2 matrix ([`masked_rows_sums`] over its full blocks, then
/// the tail).
#[inline(always)]
unsafe fn i2_masked_rows<const R: usize>(w: &I2Matrix, r: usize, x: &ActivationBatch, out: &mut [f32]) {
    let src: [*const u8; R] = std::array::from_fn(|i| w.row(r + i).as_ptr());
    let xs = x.token(0).as_ptr() as *const u8;
    // Every row's integer sum before any tail call (a call would have the accumulators
    // spilled, and LLVM then stores them inside the loop).
    let sums = masked_rows_sums::<R, false>(src, I2_BLOCK_BYTES, w.full_blocks(), xs);
    let (full, t) = (w.full_blocks(), w.tail_weights());
    for i in 0..R {
        let mut isum = sums[i];
        if t > 0 {
            isum += i2_tail_dot(&w.row(r + i)[full * I2_BLOCK_BYTES..], t, &x.token(0)[full * I2_BLOCK_WEIGHTS..]);
        }
        out[i] = finish_tensor(isum - x.sum(0), w.scale(), x.scale(0));
    }
}

/// One token's integer dot products with R rows over `blocks` blocks of 256 2-bit codes,
/// `stride` bytes apart in each row, the codes kept in place ([`field_mask`]): per block and row
/// one 64-byte load and four ANDs feed four vpdpbusd, against seven unpack operations with
/// shifts. `xs` holds the activations in the codes' lane order: the token itself for I2, its
/// [`tq2_lane_order`] for TQ2_0 (`TQ2`, 66-byte blocks whose 64 code bytes lead). One
/// accumulator per row and field, exact in i32: a lane gains at most 4 · 128 · 128 = 2¹⁶ per
/// block, so rows up to 2²³ weights cannot overflow.
#[inline(always)]
unsafe fn masked_rows_sums<const R: usize, const TQ2: bool>(
    src: [*const u8; R],
    stride: usize,
    blocks: usize,
    xs: *const u8,
) -> [i32; R] {
    let mut acc = [[_mm512_setzero_si512(); 4]; R];
    for blk in 0..blocks {
        let off = blk * stride;
        // The R rows lie back to back: prefetch them as one ascending stream, R lines per block
        // for I2 (R blocks of 64 bytes), R + 1 for TQ2_0 (66 bytes), so that over the row's
        // blocks the stream covers the tile. Wrapping: near the matrix's end these addresses
        // pass it (a prefetch never faults). For I2 this replaced one prefetch per row's block:
        // streaming 512 MiB from DRAM on one Zen 5 core (probe 40.5 GB/s), 6912x2560 rows read
        // 27.5 -> 32.8 GB/s, 1536x4096 25.8 -> 33.1, 1536x1536 29.3 -> 31.7 (on Zen 4 the two
        // had measured equal).
        for i in 0..R + TQ2 as usize {
            prefetch_stream(src[0].wrapping_add(R * off + 64 * i));
        }
        let v: [__m512i; R] = std::array::from_fn(|i| load(src[i].add(off)));
        let xb = xs.add(blk * QK_K);
        for n in 0..4 {
            let xv = load(xb.add(64 * n));
            let m = field_mask(n);
            for i in 0..R {
                acc[i][n] = _mm512_dpbusd_epi32(acc[i][n], _mm512_and_si512(v[i], m), xv);
            }
        }
    }
    reduce_rows(std::array::from_fn(|i| combine_fields(acc[i])))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn tq2_fused(
    w: &Tq2Matrix,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    let batch = x.batch();
    if batch > 1 {
        let row_bytes = w.blocks_per_row() * std::mem::size_of::<BlockTq2_0>();
        batched_tiles::<TILE_ROWS, TILE_TOKENS>(rows, row_bytes, batch, out, |r, left, b0, g, first, o| {
            // Rows with one scale for all their blocks take the integer tiles, as I2 (in
            // runs of up to four); a row with a scale per block takes the f64 kernel.
            let uniform = (r..r + left).take_while(|&j| w.row_has_uniform_scale(j)).count();
            if uniform > 0 {
                return code_tile_for!(tq2_uniform_tile, uniform, g, (w, r, x, b0, first, o));
            }
            let o = &mut o[..batch];
            match g {
                1 => tq2_group::<1>(w, r, x, b0, o),
                2 => tq2_group::<2>(w, r, x, b0, o),
                3 => tq2_group::<3>(w, r, x, b0, o),
                _ => tq2_group::<TILE_TOKENS>(w, r, x, b0, o),
            }
            1
        });
        return;
    }
    // One token: the activations in the codes' lane order, once per call.
    let k = w.cols();
    if scratch.x_reordered.len() < k {
        scratch.x_reordered = AlignedBytes::zeroed(k);
    }
    tq2_lane_order(&x.token(0)[..k], &mut scratch.x_reordered.as_i8_mut()[..k]);
    let xl = scratch.x_reordered.as_slice().as_ptr();
    let mut r = rows.start;
    while r < rows.end {
        let i = r - rows.start;
        // One token: up to four uniform rows per pass, so that every activation load and row
        // epilogue serves them all (as in i2_masked_rows).
        if w.row_has_uniform_scale(r) {
            let uniform = (r + 1..rows.end.min(r + 4)).take_while(|&j| w.row_has_uniform_scale(j)).count() + 1;
            let tile = match uniform {
                4 => 4,
                2 | 3 => 2,
                _ => 1,
            };
            match tile {
                4 => tq2_uniform_rows::<4>(w, r, x, xl, &mut out[i..i + 4]),
                2 => tq2_uniform_rows::<2>(w, r, x, xl, &mut out[i..i + 2]),
                _ => tq2_uniform_rows::<1>(w, r, x, xl, &mut out[i..i + 1]),
            }
            r += tile;
            continue;
        }
        tq2_group::<1>(w, r, x, 0, &mut out[i..i + 1]);
        r += 1;
    }
}

/// Token 0 × rows `r..r+R` of a TQ2_0 matrix, each with one scale for all its blocks
/// ([`masked_rows_sums`] against the activations `xl` in [`tq2_lane_order`]).
#[inline(always)]
unsafe fn tq2_uniform_rows<const R: usize>(
    w: &Tq2Matrix,
    r: usize,
    x: &ActivationBatch,
    xl: *const u8,
    out: &mut [f32],
) {
    let src: [*const u8; R] = std::array::from_fn(|i| w.row(r + i).as_ptr() as *const u8);
    let sums = masked_rows_sums::<R, true>(src, std::mem::size_of::<BlockTq2_0>(), w.blocks_per_row(), xl);
    for i in 0..R {
        let d = f16_to_f64(w.row(r + i)[0].d);
        out[i] = finish_blocks(d * (sums[i] - x.sum(0)) as f64, x.scale(0));
    }
}

/// One TQ2_0 row with a scale per block × tokens `b0..b0+G`. Per block, the 16 i32 lanes are
/// folded to 8, converted to f64 and multiplied by the block scale into f64 lane accumulators
/// (exact: see the kernels module docs); the activation block sums are subtracted the same way
/// in scalar f64.
#[inline(always)]
unsafe fn tq2_group<const G: usize>(w: &Tq2Matrix, r: usize, x: &ActivationBatch, b0: usize, out: &mut [f32]) {
    let xs: [*const u8; G] = std::array::from_fn(|g| x.token(b0 + g).as_ptr() as *const u8);
    let bs: [&[i32]; G] = std::array::from_fn(|g| x.block_sums(b0 + g));
    let mut facc = [_mm512_setzero_pd(); G];
    let mut corr = [0f64; G];
    for (blk, block) in w.row(r).iter().enumerate() {
        prefetch_stream_span(block as *const BlockTq2_0 as *const u8, std::mem::size_of::<BlockTq2_0>());
        let c = tq2_codes(block.qs.as_ptr());
        let d = f16_to_f64(block.d);
        let dv = _mm512_set1_pd(d);
        for g in 0..G {
            let xb = xs[g].add(blk * QK_K);
            let a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[0], load(xb));
            let b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[1], load(xb.add(64)));
            let a = _mm512_dpbusd_epi32(a, c[2], load(xb.add(128)));
            let b = _mm512_dpbusd_epi32(b, c[3], load(xb.add(192)));
            let s = _mm512_add_epi32(a, b);
            let s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
            facc[g] = _mm512_fmadd_pd(_mm512_cvtepi32_pd(s8), dv, facc[g]);
            corr[g] += d * bs[g][blk] as f64;
        }
    }
    for g in 0..G {
        let acc = _mm512_reduce_add_pd(facc[g]) - corr[g];
        out[b0 + g] = finish_blocks(acc, x.scale(b0 + g));
    }
}

/// Rows `r..r+R` of a TQ2_0 matrix whose blocks all share one scale `d` per row × tokens
/// `b0..b0+G`: Σ_blk d·isum_blk = d·Σ_blk isum_blk exactly (every partial sum is d times an
/// integer below 2^31, exact in f64), so the rows are summed in integers like I2
/// ([`code_tile`]) and scaled once. Writes `out[i × batch + b]` for row `r + i`.
#[inline(always)]
unsafe fn tq2_uniform_tile<const R: usize, const G: usize>(
    w: &Tq2Matrix,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    prefetch: bool,
    out: &mut [f32],
) {
    let (src, xs) = tile_pointers::<R, G>(|i| w.row(i).as_ptr() as *const u8, r, x, b0);
    let sums = code_tile::<R, G, true>(src, std::mem::size_of::<BlockTq2_0>(), w.blocks_per_row(), xs, prefetch);
    let d: [f64; R] = std::array::from_fn(|i| f16_to_f64(w.row(r + i)[0].d));
    finish_uniform_tile::<R, G>(sums, d, x, b0, out);
}

/// Outputs of a tile of rows with one block scale `d[i]` each ([`code_tile`]'s lane order):
/// `finish_blocks(d · (isum − x_sum) as f64, x_scale)`, exact since every isum is an integer
/// below 2³¹ (see the kernels module docs). Writes `out[i × batch + b]`.
#[inline(always)]
unsafe fn finish_uniform_tile<const R: usize, const G: usize>(
    sums: __m512i,
    d: [f64; R],
    x: &ActivationBatch,
    b0: usize,
    out: &mut [f32],
) {
    let batch = x.batch();
    if G == TILE_TOKENS {
        // Four tokens: finish_blocks lane by lane, the same f64 multiply, rounding to f32 and
        // f32 multiply, four outputs per row stored at once.
        let xsum = _mm512_broadcast_i32x4(_mm_loadu_si128(x.sums()[b0..b0 + 4].as_ptr() as *const __m128i));
        let xscale = _mm512_broadcast_f32x4(_mm_loadu_ps(x.scales()[b0..b0 + 4].as_ptr()));
        let diff = _mm512_sub_epi32(sums, xsum);
        // Rows 0 and 1 in lanes 0..8, rows 2 and 3 in lanes 8..16 (zero past R).
        let dv = |i: usize| _mm256_set1_pd(if i < R { d[i] } else { 0.0 });
        let d01 = _mm512_insertf64x4::<1>(_mm512_castpd256_pd512(dv(0)), dv(1));
        let d23 = _mm512_insertf64x4::<1>(_mm512_castpd256_pd512(dv(2)), dv(3));
        let lo = _mm512_cvtpd_ps(_mm512_mul_pd(d01, _mm512_cvtepi32_pd(_mm512_castsi512_si256(diff))));
        let hi = _mm512_cvtpd_ps(_mm512_mul_pd(d23, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64::<1>(diff))));
        // (inserti64x4: AVX-512F; the f32x8 insert would need DQ, which the token does not prove)
        let f = _mm512_castsi512_ps(_mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_castps_si256(lo)),
            _mm256_castps_si256(hi),
        ));
        store_row_quads::<R>(_mm512_mul_ps(f, xscale), out, batch, b0);
        return;
    }
    let sums = lanes_i32(sums);
    for i in 0..R {
        for g in 0..G {
            let b = b0 + g;
            out[i * batch + b] = finish_blocks(d[i] * (sums[i * G + g] - x.sum(b)) as f64, x.scale(b));
        }
    }
}

/// The 52 code bytes of a TQ1_0 block (`qs` then `qh`); the masked load reads nothing beyond
/// them, so the last block of a matrix is never read past its end.
const TQ1_CODE_LANES: __mmask64 = (1u64 << 52) - 1;

/// Tokens per pass of the one-row batched TQ1_0 kernel ([`tq1_decoded`]), used where that
/// many tokens' digit-ordered activations fit in [`TQ1_ROW_GROUP_BYTES`] (a share of L1d).
const TQ1_ROW_GROUP: usize = 8;
const TQ1_ROW_GROUP_BYTES: usize = 32 * 1024;

times3_asm!(
    /// `y × 3 mod 256` per byte: moves every code byte to its next base-3 digit. Two byte adds
    /// in inline assembly ([`times3_asm`]): as intrinsics each step became `vpmullw` +
    /// `vpmaddubsw` + shift + blend, two multiplies that compete with `vpdpbusd` for the same
    /// ports (TQ1_0 in cache: 9 GB/s).
    times3: __m512i, zmm_reg, "avx512f,avx512bw", "vpaddb {t:z}, {y:z}, {y:z}", "vpaddb {o:z}, {t:z}, {y:z}"
);

/// Codes `(3y) >> 8 = (y > 85) + (y > 170)` ∈ {0, 1, 2} of the current digit of every byte.
#[inline(always)]
unsafe fn tq1_digit_codes(y: __m512i) -> __m512i {
    let one = _mm512_set1_epi8(1);
    let c = _mm512_maskz_mov_epi8(_mm512_cmpgt_epu8_mask(y, _mm512_set1_epi8(85)), one);
    _mm512_mask_add_epi8(c, _mm512_cmpgt_epu8_mask(y, _mm512_set1_epi8(170u8 as i8)), c, one)
}

/// Σ of the i32 lanes of several accumulators, in i64.
#[inline(always)]
unsafe fn reduce_i64<const A: usize>(acc: &[__m512i; A]) -> i64 {
    let mut s = _mm512_setzero_si512();
    for a in acc {
        s = _mm512_add_epi64(s, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(*a)));
        s = _mm512_add_epi64(s, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(*a)));
    }
    _mm512_reduce_add_epi64(s)
}

/// TQ1_0 with the base-3 digits extracted in registers. The block's 52 code bytes are loaded
/// once and multiplied by 3 (mod 256) per digit; the activations come pre-arranged in digit
/// order (`portable::tq1_digit_order`, built here once per call into `scratch`), so each digit
/// meets one contiguous 64-byte activation vector. From [`TQ1_REPACK_MIN_BATCH`] tokens on,
/// matrices whose rows each have one scale are decoded once per call instead
/// ([`tq1_repacked`]). Rows whose blocks have different scales (never the case for BitNet
/// tensors) take the generic decode-then-dot path.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn tq1_fused(
    isa: Avx512,
    w: &Tq1Matrix,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    let batch = x.batch();
    if batch >= TQ1_REPACK_MIN_BATCH && rows.clone().all(|r| w.row_has_uniform_scale(r)) {
        tq1_repacked(w, x, rows, out, &mut scratch.unpacked);
        return;
    }
    // One token: activations in row-stream order (every lane of every load used); more tokens:
    // in block order, for the decode-once kernel.
    let stride = if batch == 1 {
        tq1_row_chunks(w.blocks_per_row()) * TQ1_DIGIT_BLOCK
    } else {
        w.blocks_per_row() * TQ1_DIGIT_BLOCK
    };
    if scratch.x_reordered.len() < batch * stride {
        scratch.x_reordered = AlignedBytes::zeroed(batch * stride);
    }
    let digits = &mut scratch.x_reordered.as_i8_mut()[..batch * stride];
    if batch == 1 {
        tq1_row_digit_order(x.token(0), digits);
    } else {
        for (b, d) in digits.chunks_exact_mut(stride).enumerate() {
            tq1_digit_order(x.token(b), d);
        }
    }
    let xd = scratch.x_reordered.as_slice().as_ptr();
    if batch > 1 && TQ1_ROW_GROUP * stride <= TQ1_ROW_GROUP_BYTES {
        // Short rows: one row × up to 8 tokens per pass, whose activations stay in L1. Its
        // digit codes serve 8 tokens, against 4 in a tile, and decoding, not loading, limits
        // TQ1_0: bitnet-bench kernels, B = 8, 2560-wide rows, 103 Mrow·tok/s against 90 for
        // the tiles.
        let mut r = rows.start;
        while r < rows.end {
            let o = &mut out[(r - rows.start) * batch..];
            if !w.row_has_uniform_scale(r) {
                tq1_rows_with(isa, w, x, r..r + 1, &mut o[..batch]);
                r += 1;
                continue;
            }
            let mut b0 = 0;
            while b0 < batch {
                match batch - b0 {
                    1 => tq1_decoded::<1, 2>(w, r, x, xd, stride, b0, o),
                    2 => tq1_decoded::<2, 2>(w, r, x, xd, stride, b0, o),
                    3 => tq1_decoded::<3, 2>(w, r, x, xd, stride, b0, o),
                    4 => tq1_decoded::<4, 2>(w, r, x, xd, stride, b0, o),
                    5 => tq1_decoded::<5, 1>(w, r, x, xd, stride, b0, o),
                    6 => tq1_decoded::<6, 1>(w, r, x, xd, stride, b0, o),
                    7 => tq1_decoded::<7, 1>(w, r, x, xd, stride, b0, o),
                    _ => tq1_decoded::<TQ1_ROW_GROUP, 1>(w, r, x, xd, stride, b0, o),
                }
                b0 += TQ1_ROW_GROUP.min(batch - b0);
            }
            r += 1;
        }
        return;
    }
    if batch > 1 {
        // Long rows: 4 × 4 tiles in row blocks ([`tq1_tile`]).
        let row_bytes = w.blocks_per_row() * std::mem::size_of::<BlockTq1_0>();
        batched_tiles::<TILE_ROWS, TILE_TOKENS>(rows, row_bytes, batch, out, |r, left, b0, g, first, o| {
            let uniform = (r..r + left).take_while(|&j| w.row_has_uniform_scale(j)).count();
            if uniform > 0 {
                return code_tile_for!(tq1_tile, uniform, g, (w, r, x, xd, stride, b0, first, o));
            }
            // A scale per block: the generic path does all tokens of the row at once.
            if b0 == 0 {
                tq1_rows_with(isa, w, x, r..r + 1, &mut o[..batch]);
            }
            1
        });
        return;
    }
    // One token: four rows per pass where they are uniform: the rows lie back to back (one
    // 2 KiB stretch for 2B4T), and each activation load and row epilogue serves four rows.
    // 2B4T TQ1 decode, one thread, alternating builds: linears 12.5-13.5 -> 14.1 GB/s.
    let mut r = rows.start;
    while r < rows.end {
        let o = &mut out[r - rows.start..];
        if !w.row_has_uniform_scale(r) {
            tq1_rows_with(isa, w, x, r..r + 1, &mut o[..1]);
            r += 1;
            continue;
        }
        let two = r + 2 <= rows.end && w.row_has_uniform_scale(r + 1);
        let four = r + 4 <= rows.end && (r + 1..r + 4).all(|i| w.row_has_uniform_scale(i));
        if four {
            tq1_telescoped::<4>(w, r, x, xd, o);
            r += 4;
        } else if two {
            tq1_telescoped::<2>(w, r, x, xd, o);
            r += 2;
        } else {
            tq1_telescoped::<1>(w, r, x, xd, o);
            r += 1;
        }
    }
}

/// Batches of at least this many tokens take [`tq1_repacked`]: from three token groups on.
/// Below, the in-register tiles decode each row once or twice, about what the repack costs;
/// on Zen 4 (`bitnet-bench kernels`, 2B4T shapes, one thread, Mrow·tok/s on 2560-wide rows)
/// B = 8 in registers ran 45, B = 9 repacked 45 and B = 16 repacked 57.
pub(crate) const TQ1_REPACK_MIN_BATCH: usize = 2 * TILE_TOKENS + 1;

/// Most rows of a [`tq1_repacked`] block (its tiles' partial sums live on the stack).
const TQ1_REPACK_BLOCK_ROWS: usize = 256;

/// Activation bytes of one token group's column chunk in [`tq1_repacked`]: half of Zen 4's
/// 32 KiB L1d, so the group's activations stay in L1 across a block's rows while the codes
/// come from L2 (four tokens of a 6912-wide row are 27 KiB).
const TQ1_REPACK_CHUNK_X_BYTES: usize = 16 * 1024;

/// Bytes of [`KernelScratch::unpacked`] that [`tq1_repacked`] needs for rows of `cols`
/// weights: a row block of I2 codes (a quarter of a byte per weight), and at least one row.
pub(crate) fn tq1_repack_scratch_bytes(cols: usize) -> usize {
    (cols / 4).max(super::ROW_BLOCK_BYTES)
}

/// TQ1_0 rows (each with one scale) × a batch of [`TQ1_REPACK_MIN_BATCH`] tokens or more: a
/// block of rows is decoded once (the AVX2 digit decoder) and repacked into I2 blocks in
/// `codes`; then every group of four tokens runs the I2 tiles ([`code_tile`], 4 rows × 4
/// tokens) over the block, a column chunk at a time (each within
/// [`TQ1_REPACK_CHUNK_X_BYTES`] of activations), and each tile's sums are finished once, after
/// its last chunk, as `tq1_tile` finishes them. Results are those of the oracle: the same
/// integer sums, scaled the same way.
///
/// Why: the in-register tiles ([`tq1_tile`]) decode every digit again for each group of four
/// tokens: a 128-token prompt decodes each row 32 times. On Zen 4 (`bitnet-bench kernels
/// --batch 128`, 2B4T shapes, one thread) they ran 33 Mrow·tok/s on 2560-wide rows, against 84
/// for I2 and 56 for the AVX2 kernel, which already decoded rows once.
///
/// While a block computes, the next block's packed rows are asked for in L2 a share per tile,
/// so the decode pass finds them in cache.
#[inline(always)]
unsafe fn tq1_repacked(
    w: &Tq1Matrix,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    codes: &mut AlignedBytes,
) {
    let batch = x.batch();
    let blocks = w.blocks_per_row();
    if codes.len() < tq1_repack_scratch_bytes(blocks * QK_K) {
        *codes = AlignedBytes::zeroed(tq1_repack_scratch_bytes(blocks * QK_K));
    }
    let row_bytes = blocks * I2_BLOCK_BYTES;
    let fit = (codes.len() / row_bytes).min(TQ1_REPACK_BLOCK_ROWS);
    let block_rows = if fit >= TILE_ROWS { fit / TILE_ROWS * TILE_ROWS } else { fit };
    // Column chunks of whole blocks, as even as they come.
    let max_chunk = (TQ1_REPACK_CHUNK_X_BYTES / (TILE_TOKENS * QK_K)).max(1);
    let chunk_blocks = blocks.div_ceil(blocks.div_ceil(max_chunk));
    let chunks = blocks.div_ceil(chunk_blocks);
    let packed_row = blocks * std::mem::size_of::<BlockTq1_0>();
    let base = w.blocks().as_ptr() as *const u8;
    let mut one = [0u8; QK_K];
    // One sum vector per tile: a block's whole tiles, then at most a two-row and a one-row one.
    let mut sums = [_mm512_setzero_si512(); TQ1_REPACK_BLOCK_ROWS / TILE_ROWS + 2];
    let mut start = rows.start;
    while start < rows.end {
        let end = rows.end.min(start + block_rows);
        for r in start..end {
            let dst = codes.as_mut_slice()[(r - start) * row_bytes..][..row_bytes].as_mut_ptr();
            for (blk, b) in w.row(r).iter().enumerate() {
                decode_tq1_block_avx2(b, &mut one);
                encode_i2_block(one.as_ptr(), dst.add(blk * I2_BLOCK_BYTES));
            }
        }
        let next = end..rows.end.min(end + block_rows);
        let tiles = (end - start).div_ceil(TILE_ROWS);
        let shares = PrefetchShares::of_bytes(
            base.wrapping_add(next.start * packed_row),
            next.len() * packed_row,
            batch.div_ceil(TILE_TOKENS) * chunks * tiles,
        );
        let c = codes.as_slice().as_ptr();
        let mut step = 0;
        let mut b0 = 0;
        while b0 < batch {
            let g = TILE_TOKENS.min(batch - b0);
            for k in 0..chunks {
                let (first, n) = (k * chunk_blocks, chunk_blocks.min(blocks - k * chunk_blocks));
                let (mut r, mut t) = (start, 0);
                while r < end {
                    shares.issue(step);
                    step += 1;
                    let src = c.add((r - start) * row_bytes + first * I2_BLOCK_BYTES);
                    let acc = &mut sums[t];
                    r += code_tile_for!(repacked_tile_sums, end - r, g, (src, row_bytes, n, first, x, b0, k == 0, acc));
                    t += 1;
                }
            }
            let (mut r, mut t) = (start, 0);
            while r < end {
                let o = &mut out[(r - rows.start) * batch..];
                r += code_tile_for!(repacked_tile_finish, end - r, g, (w, r, x, b0, sums[t], o));
                t += 1;
            }
            b0 += g;
        }
        start = end;
    }
}

/// Rows `src`, `src + row_bytes`, … (R of them) of a [`tq1_repacked`] block × tokens
/// `b0..b0 + G` over `n` I2 blocks from column block `first`: the tile's sums ([`code_tile`]'s
/// lane order) stored into `acc` (`fresh`: the first column chunk) or added.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn repacked_tile_sums<const R: usize, const G: usize>(
    src: *const u8,
    row_bytes: usize,
    n: usize,
    first: usize,
    x: &ActivationBatch,
    b0: usize,
    fresh: bool,
    acc: &mut __m512i,
) {
    let (src, xs) = tile_pointers::<R, G>(|i| src.add(i * row_bytes), 0, x, b0);
    let s = code_tile::<R, G, false>(src, I2_BLOCK_BYTES, n, xs.map(|p| p.add(first * QK_K)), false);
    *acc = if fresh { s } else { _mm512_add_epi32(*acc, s) };
}

/// The outputs of rows `r..r+R` × tokens `b0..b0+G` from a [`tq1_repacked`] tile's sums.
#[inline(always)]
unsafe fn repacked_tile_finish<const R: usize, const G: usize>(
    w: &Tq1Matrix,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    sums: __m512i,
    out: &mut [f32],
) {
    let mut d = [0f64; R];
    for (i, d) in d.iter_mut().enumerate() {
        *d = f16_to_f64(w.row(r + i)[0].d);
    }
    finish_uniform_tile::<R, G>(sums, d, x, b0, out);
}

/// One token, rows `r..r+R` (uniform scales), without materialising the digit codes: with
/// `y_n = 3^n q mod 256` the digit is the carry of `3 y_n`, i.e. `256 · digit_n = 3 y_n − y_{n+1}`
/// exactly, lane by lane, for every byte value. So Σ digit·x = (3 Σ y_n x_n − Σ y_{n+1} x_n) / 256:
/// two `vpdpbusd` on the raw bytes per digit and no compares. For one token that beats decoding
/// (2B4T gate/up in cache: 9.6 vs 6.9 GB/s); from two tokens on, decoding once wins.
///
/// The row is read as one stream of 64-byte chunks across block boundaries, activations in
/// [`tq1_row_digit_order`]: the block scales inside a chunk meet zero activations and add
/// nothing, and all 64 lanes work (block-aligned loads used 52). The last chunk is a masked
/// load that stops at the row's end. Rows up to [`TQ1_I32_CHUNKS`] reduce in i32; the i64
/// reduction of longer rows needs each lane's sums below 2^31, true for K < 800k (≤ 5 · 4 ·
/// 255 · 128 per chunk).
#[inline(always)]
unsafe fn tq1_telescoped<const R: usize>(w: &Tq1Matrix, r: usize, x: &ActivationBatch, xd: *const u8, out: &mut [f32]) {
    let src: [*const u8; R] = std::array::from_fn(|i| w.row(r + i).as_ptr() as *const u8);
    let row_bytes = w.blocks_per_row() * std::mem::size_of::<BlockTq1_0>();
    // At least one chunk: a Tq1Matrix has K ≥ 256.
    let chunks = tq1_row_chunks(w.blocks_per_row());
    // One accumulator of each kind per row: 5 updates per chunk, far apart (two did not help).
    let mut yx = [_mm512_setzero_si512(); R];
    let mut nx = [_mm512_setzero_si512(); R];
    // Whole chunks with plain loads (masked loads cost about 10% here even with every lane
    // set); a chunk may run into the next row, whose bytes meet zero activations. Only the
    // last chunk, which may end at the matrix's end, is a masked load.
    for c in 0..chunks - 1 {
        // The R rows lie back to back: prefetch them as one ascending stream, R lines per
        // chunk, so that over the row's chunks the stream covers the tile's R rows.
        for i in 0..R {
            prefetch_stream(src[0].wrapping_add(R * 64 * c + 64 * i));
        }
        let y: [__m512i; R] = std::array::from_fn(|i| load(src[i].add(64 * c)));
        tq1_telescoped_chunk(y, xd.add(c * TQ1_DIGIT_BLOCK), &mut yx, &mut nx);
    }
    let off = 64 * (chunks - 1);
    // Wrapping: near the matrix's end these addresses pass it (a prefetch never faults).
    for i in 0..R {
        prefetch_stream(src[0].wrapping_add(R * off + 64 * i));
    }
    let lanes = u64::MAX >> (64 - (row_bytes - off));
    let y = std::array::from_fn(|i| _mm512_maskz_loadu_epi8(lanes, src[i].add(off) as *const i8));
    tq1_telescoped_chunk(y, xd.add((chunks - 1) * TQ1_DIGIT_BLOCK), &mut yx, &mut nx);
    let dots: [i64; R] = if chunks <= TQ1_I32_CHUNKS {
        // Per lane, 3·Σy·x − Σnext·x is 256 × that lane's Σ digit·x, exactly (see the limit):
        // shift each lane, then reduce the rows' lanes together.
        let lanes: [__m512i; R] = std::array::from_fn(|i| {
            let scaled = _mm512_sub_epi32(_mm512_add_epi32(yx[i], _mm512_add_epi32(yx[i], yx[i])), nx[i]);
            _mm512_srai_epi32::<8>(scaled)
        });
        reduce_rows(lanes).map(i64::from)
    } else {
        std::array::from_fn(|i| {
            let scaled = 3 * reduce_i64(&[yx[i]]) - reduce_i64(&[nx[i]]);
            debug_assert!(scaled % 256 == 0, "3·y − next is 256 × the digit in every lane");
            scaled / 256
        })
    };
    for i in 0..R {
        let isum = dots[i] - x.sum(0) as i64;
        let d = f16_to_f64(w.row(r + i)[0].d);
        out[i] = finish_blocks(d * isum as f64, x.scale(0));
    }
}

/// One 64-byte chunk of R rows' codes `y` against its activations `xb` (five digit vectors):
/// per digit and row, `Σ y·x` into `yx` and `Σ 3y·x` (mod 256 per byte) into `nx`.
#[inline(always)]
unsafe fn tq1_telescoped_chunk<const R: usize>(
    mut y: [__m512i; R],
    xb: *const u8,
    yx: &mut [__m512i; R],
    nx: &mut [__m512i; R],
) {
    for n in 0..5 {
        // One activation load serves every row of the tile.
        let xv = load(xb.add(64 * n));
        for i in 0..R {
            let next = times3(y[i]);
            yx[i] = _mm512_dpbusd_epi32(yx[i], y[i], xv);
            nx[i] = _mm512_dpbusd_epi32(nx[i], next, xv);
            y[i] = next;
        }
    }
}

/// Rows of at most this many 64-byte chunks reduce [`tq1_telescoped`]'s lanes in i32. The
/// lane sums Σy·x and Σnext·x may wrap (vpdpbusd and the adds are modulo 2³²), so
/// 3·Σy·x − Σnext·x comes out exact whenever its true value, 256 × the lane's Σ digit·x, fits
/// in i32: a lane holds 20 digits per chunk, each |digit·x| ≤ 2 · 128, so up to 1638 chunks
/// (about 490k weights per row). Longer rows reduce in i64.
const TQ1_I32_CHUNKS: usize = 1600;

/// Lane sums of two rows at once: (Σ a, Σ b).
#[inline(always)]
unsafe fn reduce_two(a: __m512i, b: __m512i) -> (i32, i32) {
    // [a.lo256 | b.lo256] + [a.hi256 | b.hi256]: 8 lanes of each row.
    let u = _mm512_add_epi32(_mm512_shuffle_i64x2::<0x44>(a, b), _mm512_shuffle_i64x2::<0xEE>(a, b));
    // Within each 256-bit half, add the other 128-bit lane, then the other 64 and 32 bits.
    let u = _mm512_add_epi32(u, _mm512_shuffle_i64x2::<0xB1>(u, u));
    let u = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0x4E>(u));
    let u = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0xB1>(u));
    (_mm512_cvtsi512_si32(u), _mm_cvtsi128_si32(_mm512_extracti32x4_epi32::<2>(u)))
}

/// Rows `r..r+R` (uniform scales) × tokens `b0..b0+G` of a TQ1_0 matrix, batched: per block,
/// each row's 52 code bytes are loaded once and moved digit by digit (× 3 mod 256), each
/// digit's codes computed once per row (two compares) and multiplied with every token's
/// activations of that digit ([`tq1_digit_order`], `stride` bytes a token), loaded once for all
/// R rows. Tiles, row blocks and the reduction as for I2 ([`batched_tiles`], [`reduce16`]).
/// For long rows only: 8 tokens of a 6912-wide down projection (8 × 8.6 KiB of activations)
/// overflowed L1 in [`tq1_decoded`]; bitnet-bench kernels, B = 8: 18 -> 36 Mrow·tok/s.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tq1_tile<const R: usize, const G: usize>(
    w: &Tq1Matrix,
    r: usize,
    x: &ActivationBatch,
    xd: *const u8,
    stride: usize,
    b0: usize,
    prefetch: bool,
    out: &mut [f32],
) {
    let src: [*const u8; R] = std::array::from_fn(|i| w.row(r + i).as_ptr() as *const u8);
    let xs: [*const u8; G] = std::array::from_fn(|g| xd.add((b0 + g) * stride));
    let block = std::mem::size_of::<BlockTq1_0>();
    let mut acc = [[_mm512_setzero_si512(); G]; R];
    // Plain loops, not array::from_fn (see reduce16).
    for blk in 0..w.blocks_per_row() {
        let off = blk * block;
        let mut y = [_mm512_setzero_si512(); R];
        for i in 0..R {
            if prefetch {
                // The R rows lie back to back: one ascending stream, R lines per block (R · 54
                // bytes of rows pass per block).
                prefetch_stream(src[0].wrapping_add(R * off + 64 * i));
            }
            y[i] = _mm512_maskz_loadu_epi8(TQ1_CODE_LANES, src[i].add(off) as *const i8);
        }
        for n in 0..5 {
            let mut c = [_mm512_setzero_si512(); R];
            for i in 0..R {
                if n > 0 {
                    y[i] = times3(y[i]);
                }
                c[i] = tq1_digit_codes(y[i]);
            }
            for g in 0..G {
                let xv = load(xs[g].add(blk * TQ1_DIGIT_BLOCK + 64 * n));
                for i in 0..R {
                    acc[i][g] = _mm512_dpbusd_epi32(acc[i][g], c[i], xv);
                }
            }
        }
    }
    // Exact in i32: a row's |Σ| ≤ 2 · 128 · K, below 2³¹ for K < 2²³ (as for I2).
    let d: [f64; R] = std::array::from_fn(|i| f16_to_f64(w.row(r + i)[0].d));
    finish_uniform_tile::<R, G>(reduce16(acc), d, x, b0, out);
}

/// Row `r` (uniform scale) × tokens `b0..b0+G`: each digit's codes are computed once
/// (two compares) and multiplied with every token, A accumulators per token.
#[inline(always)]
unsafe fn tq1_decoded<const G: usize, const A: usize>(
    w: &Tq1Matrix,
    r: usize,
    x: &ActivationBatch,
    xd: *const u8,
    stride: usize,
    b0: usize,
    out: &mut [f32],
) {
    let src = w.row(r).as_ptr() as *const u8;
    let xs: [*const u8; G] = std::array::from_fn(|g| xd.add((b0 + g) * stride));
    let mut acc = [[_mm512_setzero_si512(); A]; G];
    for blk in 0..w.blocks_per_row() {
        let off = blk * std::mem::size_of::<BlockTq1_0>();
        prefetch_stream(src.add(off));
        let mut y = _mm512_maskz_loadu_epi8(TQ1_CODE_LANES, src.add(off) as *const i8);
        for n in 0..5 {
            if n > 0 {
                y = times3(y);
            }
            let c = tq1_digit_codes(y);
            for g in 0..G {
                let xv = load(xs[g].add(blk * TQ1_DIGIT_BLOCK + 64 * n));
                acc[g][n % A] = _mm512_dpbusd_epi32(acc[g][n % A], c, xv);
            }
        }
    }
    let d = f16_to_f64(w.row(r)[0].d);
    for g in 0..G {
        let b = b0 + g;
        let isum = reduce_i64(&acc[g]) - x.sum(b) as i64;
        out[b] = finish_blocks(d * isum as f64, x.scale(b));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
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
        for b in 0..batch {
            let planes = x.planes(b).as_ptr();
            let mut nz = [_mm512_setzero_si512(); ACT_PLANES];
            let mut neg = [_mm512_setzero_si512(); ACT_PLANES];
            let mut wd = 0;
            while wd < words {
                let k: __mmask8 = if words - wd >= 8 { 0xff } else { (1u8 << (words - wd)) - 1 };
                let s = _mm512_maskz_loadu_epi64(k, sign.as_ptr().add(wd) as *const i64);
                let m = match mask {
                    Some(mk) => _mm512_maskz_loadu_epi64(k, mk.as_ptr().add(wd) as *const i64),
                    None => _mm512_setzero_si512(),
                };
                for p in 0..ACT_PLANES {
                    let bp = _mm512_maskz_loadu_epi64(k, planes.add(p * xw + wd) as *const i64);
                    neg[p] = _mm512_add_epi64(neg[p], _mm512_popcnt_epi64(_mm512_and_si512(s, bp)));
                    if mask.is_some() {
                        nz[p] = _mm512_add_epi64(nz[p], _mm512_popcnt_epi64(_mm512_and_si512(m, bp)));
                    }
                }
                wd += 8;
            }
            let mut isum = 0i32;
            for p in 0..ACT_PLANES {
                let nz_c =
                    if mask.is_some() { _mm512_reduce_add_epi64(nz[p]) as i32 } else { x.plane_counts(b)[p] as i32 };
                let neg_c = _mm512_reduce_add_epi64(neg[p]) as i32;
                isum += PLANE_WEIGHTS[p] * (nz_c - 2 * neg_c);
            }
            out[i * batch + b] = finish_tensor(isum, scale, x.scale(b));
        }
    }
}

/// Int8-row matmul (LM head): codes `w + 128` × int8 tokens with `vpdpbusd`, minus 128·Σx.
pub(crate) fn int8_rows(
    _t: Avx512,
    m: &crate::formats::Int8Rows,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    // SAFETY: the token proves AVX-512 VNNI support; rows and out were bounds-checked by
    // `int8_rows_matmul`, and code rows and tokens are both `stride` = padded K long.
    unsafe { int8_rows_impl(m, x, rows, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
unsafe fn int8_rows_impl(m: &crate::formats::Int8Rows, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    super::int8_rows_tiled::<Int8Avx512>(m, x, rows, out)
}

/// [`int8_tile`] as the shared driver's tile, with the accumulators per row and token that hide
/// vpdpbusd's latency: four for one row and one token, two where the tile has one row or one
/// token, else one.
struct Int8Avx512;

impl super::Int8Tile for Int8Avx512 {
    #[inline(always)]
    unsafe fn tile<const R: usize, const G: usize, const STREAM: bool>(
        m: &crate::formats::Int8Rows,
        r: usize,
        x: &ActivationBatch,
        b0: usize,
        out: &mut [f32],
    ) {
        if R == 1 && G == 1 {
            int8_tile::<R, G, 4, STREAM>(m, r, x, b0, out)
        } else if R == 1 || G == 1 {
            int8_tile::<R, G, 2, STREAM>(m, r, x, b0, out)
        } else {
            int8_tile::<R, G, 1, STREAM>(m, r, x, b0, out)
        }
    }
}

/// Rows `r..r+R` × tokens `b0..b0+G` of an int8-row matrix; writes `out[i × batch + b]`.
/// `STREAM`: see [`super::Int8Tile`].
#[inline(always)]
unsafe fn int8_tile<const R: usize, const G: usize, const A: usize, const STREAM: bool>(
    m: &crate::formats::Int8Rows,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    out: &mut [f32],
) {
    let batch = x.batch();
    let codes: [*const u8; R] = std::array::from_fn(|i| m.row_codes(r + i).as_ptr());
    let xs: [*const u8; G] = std::array::from_fn(|g| x.token(b0 + g).as_ptr() as *const u8);
    let mut acc = [[[_mm512_setzero_si512(); A]; G]; R];
    for (step, off) in (0..m.stride()).step_by(64).enumerate() {
        if STREAM {
            prefetch_rows_l2::<R>(codes[0], off, 64);
        }
        let c: [__m512i; R] = std::array::from_fn(|i| {
            if !STREAM {
                prefetch_stream(codes[i].add(off));
            }
            load(codes[i].add(off))
        });
        for g in 0..G {
            let xv = load(xs[g].add(off));
            for i in 0..R {
                acc[i][g][step % A] = _mm512_dpbusd_epi32(acc[i][g][step % A], c[i], xv);
            }
        }
    }
    for i in 0..R {
        for g in 0..G {
            let b = b0 + g;
            let isum = reduce_acc(&acc[i][g]) - 128 * x.sum(b);
            out[i * batch + b] = finish_tensor(isum, m.scale(r + i), x.scale(b));
        }
    }
}

// The portable helpers at 16 lanes, with the byte-narrowing instructions (see `widest_compiled!`).
compiled_for! {
    Avx512, "avx512f,avx512bw,avx512vl,avx512dq";
    gated_activation(act: crate::model::FfnActivation, gate: &mut [f32], up: &[f32]) =
        crate::model::ops::gated_activation_portable;
    quantize_token(src: &[f32], dst: &mut [i8]) -> f32 = crate::activations::quantize_token_portable;
    rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) = crate::model::ops::rms_norm_rows_portable;
    rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) = crate::model::ops::rms_norm_in_place_portable;
    softmax_in_place(scores: &mut [f32]) = crate::model::ops::softmax_in_place_portable;
    argmax(logits: &[f32]) -> u32 = crate::model::ops::argmax_portable;
    attention_scores_encoded_compiled(precision: crate::model::KvPrecision, q: &[f32], keys: &[u8], scale: f32, out: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_scores_encoded_portable;
    attention_weighted_sum_encoded_compiled(precision: crate::model::KvPrecision, w: &[f32], values: &[u8], o: &mut [f32], ahead: &[u8], buf: &mut [f32]) =
        super::attention_weighted_sum_encoded_portable;
    decode_kv_rows(precision: crate::model::KvPrecision, bytes: &[u8], hd: usize, dst: &mut [f32]) =
        super::decode_kv_rows_portable;
}

/// Evaluates `$call` with `$rows` bound to the row reader of `$precision` over `$bytes` (rows of
/// `$hd` values, `$vb` bytes each, which the reader's layout must match), or `$other` where
/// there is none (f32 and f16 have their own kernels; a head dimension of 0).
macro_rules! with_row_reader {
    ($precision:expr, $bytes:expr, $hd:expr, $vb:expr, |$rows:ident| $call:expr, $other:expr) => {{
        use crate::model::KvPrecision;
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
    precision: crate::model::KvPrecision,
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
    precision: crate::model::KvPrecision,
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
    precision: crate::model::KvPrecision,
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
    precision: crate::model::KvPrecision,
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

/// The bandwidth probe's reader: wrapping sum of `words` with 4 independent 512-bit accumulators.
pub(crate) fn sum_words(_t: Avx512, words: &[u64]) -> u64 {
    // SAFETY: the token proves AVX-512F support; every load is inside `words` (i + 8j + 8 ≤ body).
    unsafe { sum_words_impl(words) }
}

#[target_feature(enable = "avx512f")]
unsafe fn sum_words_impl(words: &[u64]) -> u64 {
    let mut acc = [_mm512_setzero_si512(); 4];
    let body = words.len() / 32 * 32;
    let p = words.as_ptr();
    for i in (0..body).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.add(i + 8 * j) as *const _));
        }
    }
    let s = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
    (_mm512_reduce_add_epi64(s) as u64).wrapping_add(crate::bandwidth::sum_words_portable(&words[body..]))
}

// Attention in the forward pass's fixed float order (see `ops::attention_dot`): lane l of a
// 16-lane accumulator sums products of elements l, l+16, l+32, … each with one fused
// multiply-add, a short last chunk only touches its own lanes (masked), and the lanes are
// reduced as 8+8, 4+4, 2+2, 1+1. Results are therefore identical to the portable path.

/// Sixteen key elements as f32 from `p` (f32 or f16), `n` ≤ 16 valid, the rest 0.
trait Lanes: Copy {
    unsafe fn load16(p: *const Self, n: usize) -> __m512;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32, n: usize) -> __m512 {
        if n == 16 {
            _mm512_loadu_ps(p)
        } else {
            _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p)
        }
    }
}

impl Lanes for half::f16 {
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
/// without this, large-preset decode read keys and values at 6–7 GB/s.
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

impl<K: Lanes> KvRowReader for PlainRows<K> {
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
/// f16's speed on half its bytes (large, 2000 positions: 34 µs a head's scores against 18).
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
/// time down a chain of dependent extracts (7.9 ns per key in L1 for 96 dims).
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
/// one dependent chain per 16 lanes (which left the sum latency-bound: 1.1 µs for 160
/// positions × 96 dims in L1). The first block brings in whole rows and shares of `ahead`.
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

macro_rules! attention_entry {
    ($scores:ident, $axpy:ident, $t:ty, $si:ident, $ai:ident) => {
        pub(crate) fn $scores(_t: Avx512, q: &[f32], keys: &[$t], scale: f32, out: &mut [f32], ahead: &[$t]) {
            assert!(keys.len() >= out.len() * q.len());
            // SAFETY: the token proves AVX-512 F/BW/VL/F16C; loads stay inside `q` and `keys`
            // (masked for the last partial chunk), as the assert above guarantees; `ahead` is
            // only prefetched, which never faults.
            unsafe { $si(q, keys, scale, out, ahead) }
        }
        pub(crate) fn $axpy(_t: Avx512, w: &[f32], values: &[$t], o: &mut [f32], ahead: &[$t]) {
            assert!(values.len() >= w.len() * o.len());
            // SAFETY: as above, for `w`, `values` and `o`.
            unsafe { $ai(w, values, o, ahead) }
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
        unsafe fn $si(q: &[f32], keys: &[$t], scale: f32, out: &mut [f32], ahead: &[$t]) {
            scores_impl(q, PlainRows { p: keys.as_ptr(), hd: q.len() }, scale, out, ahead)
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
        unsafe fn $ai(w: &[f32], values: &[$t], o: &mut [f32], ahead: &[$t]) {
            axpy_impl(w, PlainRows { p: values.as_ptr(), hd: o.len() }, o, ahead)
        }
    };
}

attention_entry!(attention_scores_f32, attention_axpy_f32, f32, scores_f32_impl, axpy_f32_impl);
attention_entry!(attention_scores_f16, attention_axpy_f16, half::f16, scores_f16_impl, axpy_f16_impl);

macro_rules! attention_group_entry {
    ($scores:ident, $axpy:ident, $t:ty, $si:ident, $ai:ident) => {
        /// [`scores_group_impl`]: `heads` rows of `qs` over the keys, into `heads` rows of `out`.
        pub(crate) fn $scores(
            _t: Avx512,
            qs: &[f32],
            heads: usize,
            keys: &[$t],
            scale: f32,
            out: &mut [f32],
            ahead: &[$t],
        ) {
            assert!(heads > 0 && qs.len().is_multiple_of(heads) && out.len().is_multiple_of(heads));
            assert!(keys.len() >= out.len() / heads * (qs.len() / heads));
            // SAFETY: the token proves AVX-512 F/BW/VL/F16C; every load stays inside `qs` and
            // `keys` and every store inside `out` (rows of hd and n, masked at the ends), as the
            // asserts above guarantee; `ahead` is only prefetched, which never faults.
            unsafe { $si(qs, heads, keys, scale, out, ahead) }
        }
        /// [`axpy_group_impl`]: `heads` rows of `ws` over the values, into `heads` rows of `os`.
        pub(crate) fn $axpy(_t: Avx512, ws: &[f32], heads: usize, values: &[$t], os: &mut [f32], ahead: &[$t]) {
            assert!(heads > 0 && ws.len().is_multiple_of(heads) && os.len().is_multiple_of(heads));
            assert!(values.len() >= ws.len() / heads * (os.len() / heads));
            // SAFETY: as above, for `ws`, `values` and `os`.
            unsafe { $ai(ws, heads, values, os, ahead) }
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
        unsafe fn $si(qs: &[f32], heads: usize, keys: &[$t], scale: f32, out: &mut [f32], ahead: &[$t]) {
            let rows = PlainRows { p: keys.as_ptr(), hd: qs.len() / heads };
            scores_group_impl(qs, heads, rows, scale, out, ahead)
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c")]
        unsafe fn $ai(ws: &[f32], heads: usize, values: &[$t], os: &mut [f32], ahead: &[$t]) {
            axpy_group_impl(ws, heads, PlainRows { p: values.as_ptr(), hd: os.len() / heads }, os, ahead)
        }
    };
}

attention_group_entry!(
    attention_scores_group_f32,
    attention_axpy_group_f32,
    f32,
    scores_group_f32_impl,
    axpy_group_f32_impl
);
attention_group_entry!(
    attention_scores_group_f16,
    attention_axpy_group_f16,
    half::f16,
    scores_group_f16_impl,
    axpy_group_f16_impl
);

/// How far ahead [`q6k_groups`] streams a group into L2: twice the other kernels'
/// `PREFETCH_L2_BYTES`. Zen 4, one thread, 8 tokens, 32768 × 2560 streamed, with an earlier
/// prefetch loop (lines spread evenly over the group's sub-blocks): 4.86 / 4.66 / 4.62 / 4.75
/// ms at 8 / 32 / 64 / 128 KiB (the file layout's kernel: 6.80–7.14); this one, a line per
/// line read, 4.57 ms at 32 KiB.
const Q6K_GROUP_PREFETCH_BYTES: usize = 32 * 1024;

/// Q6_K LM head in 16-row groups ([`crate::formats::Q6kRowGroups`]) × any number of tokens,
/// with VNNI: lane l of every vector is row l of the group, so per sub-block and token four
/// `vpdpbusd` (the token's 4 activations broadcast; the accumulator starts at its −32 × the
/// sub-block's column sum) and one `vpmulld` by the 16 rows' scales leave each row's exact
/// `scale × Σ (q − 32)·x` in its lane, with no rearranging or reducing; the codes are
/// assembled once per sub-block for up to 8 tokens. Results are the portable ones bit for bit:
/// each block's exact i32 sum (at most 16 · 128 · 16 · 32 · 128 = 2²⁷ in magnitude), times `d`
/// in f64 (exact), added in block order. Needs the tokens' offsets
/// ([`ActivationBatch::build_q6k_offsets`]).
pub(crate) fn q6k_groups(
    _t: Avx512,
    m: &crate::formats::Q6kRowGroups,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    assert!(x.q6k_offsets_ready() && x.padded_cols() == m.cols() && rows.end <= m.rows());
    assert!(out.len() >= rows.len() * batch);
    // SAFETY: the token proves AVX-512 F/BW/VL/VNNI (and AVX2, F16C); the asserts above give
    // every group `cols / 256` whole blocks, every token `cols` values and `cols / 16`
    // offsets, and `out` one value per row and token.
    unsafe { q6k_groups_impl(m, x, rows, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,popcnt,f16c")]
unsafe fn q6k_groups_impl(m: &crate::formats::Q6kRowGroups, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    use crate::formats::Q6K_GROUP_ROWS as GR;
    let batch = x.batch();
    if rows.is_empty() {
        return;
    }
    for g in rows.start / GR..rows.end.div_ceil(GR) {
        let mut b0 = 0;
        // Eight tokens per pass where there are eight; the first pass streams the group in,
        // later ones read it from L2.
        while b0 < batch {
            let first = b0 == 0;
            b0 += match batch - b0 {
                1 => q6k_group_tile::<1>(m, g, x, b0, &rows, out, first),
                2..=3 => q6k_group_tile::<2>(m, g, x, b0, &rows, out, first),
                4..=7 => q6k_group_tile::<4>(m, g, x, b0, &rows, out, first),
                _ => q6k_group_tile::<8>(m, g, x, b0, &rows, out, first),
            };
        }
    }
}

/// Group `g` × tokens `b0..b0 + G` into `out[(r − rows.start) × batch + b]` for its rows r in
/// `rows`; returns G. `stream`: also prefetch the group into L2 ahead.
#[inline(always)]
unsafe fn q6k_group_tile<const G: usize>(
    m: &crate::formats::Q6kRowGroups,
    g: usize,
    x: &ActivationBatch,
    b0: usize,
    rows: &Range<usize>,
    out: &mut [f32],
    stream: bool,
) -> usize {
    const BLOCK: usize = 16 * 192 + 256;
    let batch = x.batch();
    let nb = m.blocks_per_row();
    let base = m.group(g).as_ptr();
    let (x0, o0, n) = (x.tokens(b0..b0 + G).as_ptr() as *const u8, x.q6k_offsets(b0..b0 + G).as_ptr(), x.padded_cols());
    let mut xs = [x0; G];
    let mut offs = [o0; G];
    for t in 0..G {
        xs[t] = x0.add(t * n);
        offs[t] = o0.add(t * n / 16);
    }
    let (low4, high2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    // Token t's rows 0..8 and 8..16: Σ over blocks of d × the block's integer sum.
    let mut acc = [[_mm512_setzero_pd(); 2]; G];
    for blk in 0..nb {
        let p = base.add(blk * BLOCK);
        let mut isum = [_mm512_setzero_si512(); G];
        for j in 0..16 {
            if stream {
                // The demand reads shifted `Q6K_GROUP_PREFETCH_BYTES` ahead, one prefetch a line: the sub-block's
                // three lines of codes, a line of scales every fourth sub-block, a line of d's
                // every second block.
                let ahead = p.wrapping_add(Q6K_GROUP_PREFETCH_BYTES);
                for line in 0..3 {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(192 * j + 64 * line) as *const i8);
                }
                if j % 4 == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(3072 + 16 * j) as *const i8);
                }
                if j == 0 && blk % 2 == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(
                        base.wrapping_add(Q6K_GROUP_PREFETCH_BYTES + nb * BLOCK + 32 * blk) as *const i8
                    );
                }
            }
            let v = p.add(192 * j);
            let (a, b, h) = (load(v), load(v.add(64)), load(v.add(128)));
            let scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(3072 + 16 * j) as *const __m128i));
            // Codes of columns 4k..4k + 4: (low nibble) | (high bits at 4..6).
            let codes = [
                _mm512_ternarylogic_epi32::<0xEC>(a, _mm512_and_si512(_mm512_slli_epi16::<4>(h), high2), low4),
                _mm512_ternarylogic_epi32::<0xEC>(
                    _mm512_srli_epi16::<4>(a),
                    _mm512_and_si512(_mm512_slli_epi16::<2>(h), high2),
                    low4,
                ),
                _mm512_ternarylogic_epi32::<0xEC>(b, _mm512_and_si512(h, high2), low4),
                _mm512_ternarylogic_epi32::<0xEC>(
                    _mm512_srli_epi16::<4>(b),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(h), high2),
                    low4,
                ),
            ];
            for t in 0..G {
                let xp = xs[t].add(QK_K * blk + 16 * j);
                let mut s = _mm512_set1_epi32(*offs[t].add(16 * blk + j));
                for (k, c) in codes.iter().enumerate() {
                    let xk = _mm512_set1_epi32(std::ptr::read_unaligned(xp.add(4 * k) as *const i32));
                    s = _mm512_dpbusd_epi32(s, *c, xk);
                }
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s, scales));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(nb * BLOCK + 32 * blk) as *const __m256i));
        let (d_lo, d_hi) =
            (_mm512_cvtps_pd(_mm512_castps512_ps256(d)), _mm512_cvtps_pd(_mm512_extractf32x8_ps::<1>(d)));
        for t in 0..G {
            let (lo, hi) = (_mm512_castsi512_si256(isum[t]), _mm512_extracti64x4_epi64::<1>(isum[t]));
            acc[t][0] = _mm512_add_pd(acc[t][0], _mm512_mul_pd(d_lo, _mm512_cvtepi32_pd(lo)));
            acc[t][1] = _mm512_add_pd(acc[t][1], _mm512_mul_pd(d_hi, _mm512_cvtepi32_pd(hi)));
        }
    }
    let first_row = g * crate::formats::Q6K_GROUP_ROWS;
    for t in 0..G {
        let sums: [f64; 16] = std::mem::transmute(acc[t]);
        let scale = x.scale(b0 + t);
        for (l, s) in sums.iter().enumerate() {
            let r = first_row + l;
            if rows.contains(&r) {
                out[(r - rows.start) * batch + b0 + t] = finish_blocks(*s, scale);
            }
        }
    }
    G
}

/// The compute probe's loop (see `compute_peak`): `rounds` × 12 independent `vpdpbusd` on
/// 512-bit registers (64 u8 × i8 products each), every chain `a · b` once a round. Returns the
/// lane-wise wrapping sum of the 12 accumulators (lane l: 12 × rounds × Σ_{j<4} a[4l+j] ×
/// b[4l+j]). Twelve chains cover `vpdpbusd`'s latency at one or two a cycle.
pub(crate) fn int8_mac_chains(_t: Avx512, rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> [i32; 16] {
    // SAFETY: the token proves AVX-512F/VNNI support; the loads read the two 64-byte arrays.
    unsafe { int8_mac_chains_impl(rounds, a, b) }
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_mac_chains_impl(rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> [i32; 16] {
    let va = _mm512_loadu_si512(a.as_ptr() as *const _);
    let vb = _mm512_loadu_si512(b.as_ptr() as *const _);
    let mut c = [_mm512_setzero_si512(); 12];
    for _ in 0..rounds {
        // In assembly so that the compiler can neither merge the identical chains nor hoist
        // their products: the loop is the instruction it measures.
        std::arch::asm!(
            "vpdpbusd {c0}, {a}, {b}",
            "vpdpbusd {c1}, {a}, {b}",
            "vpdpbusd {c2}, {a}, {b}",
            "vpdpbusd {c3}, {a}, {b}",
            "vpdpbusd {c4}, {a}, {b}",
            "vpdpbusd {c5}, {a}, {b}",
            "vpdpbusd {c6}, {a}, {b}",
            "vpdpbusd {c7}, {a}, {b}",
            "vpdpbusd {c8}, {a}, {b}",
            "vpdpbusd {c9}, {a}, {b}",
            "vpdpbusd {c10}, {a}, {b}",
            "vpdpbusd {c11}, {a}, {b}",
            a = in(zmm_reg) va,
            b = in(zmm_reg) vb,
            c0 = inout(zmm_reg) c[0],
            c1 = inout(zmm_reg) c[1],
            c2 = inout(zmm_reg) c[2],
            c3 = inout(zmm_reg) c[3],
            c4 = inout(zmm_reg) c[4],
            c5 = inout(zmm_reg) c[5],
            c6 = inout(zmm_reg) c[6],
            c7 = inout(zmm_reg) c[7],
            c8 = inout(zmm_reg) c[8],
            c9 = inout(zmm_reg) c[9],
            c10 = inout(zmm_reg) c[10],
            c11 = inout(zmm_reg) c[11],
            options(pure, nomem, nostack),
        );
    }
    let mut s = c[0];
    for v in &c[1..] {
        s = _mm512_add_epi32(s, *v);
    }
    std::mem::transmute::<__m512i, [i32; 16]>(s)
}
