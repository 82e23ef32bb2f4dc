//! The TQ1_0 (base-3) kernels at AVX-512: fused digit tiles, the repacked and telescoped forms, and the table-lookup kernel with AVX-512 masks.

use super::*;

/// The table-lookup TQ1 kernel's sign and nibble operations in fewer vector operations than
/// AVX2's ([`crate::matmul::x86_avx2::lut::CompareSigns`]): a pair's negated lanes are one `vptestmb` of the
/// span's sign vector against the pair's bit (AVX2: a compare and a doubling), applied as a
/// masked `vpsubb` from −1 (in place of the XOR), and the high nibble is one `vgf2p8affineqb`
/// (AVX2: a shift and an AND).
pub(super) struct MaskSigns;

impl crate::matmul::x86_avx2::lut::LutSigns for MaskSigns {
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

/// [`crate::matmul::x86_avx2::lut::tq1_lut`] with [`MaskSigns`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,avx2,fma,popcnt,f16c")]
pub(super) unsafe fn tq1_lut_masks(
    w: &crate::formats::Tq1LutMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    crate::matmul::x86_avx2::lut::tq1_lut_with::<MaskSigns>(w, x, tables, rows, out)
}

/// The 52 code bytes of a TQ1_0 block (`qs` then `qh`); the masked load reads nothing beyond
/// them, so the last block of a matrix is never read past its end.
pub(super) const TQ1_CODE_LANES: __mmask64 = (1u64 << 52) - 1;

/// Tokens per pass of the one-row batched TQ1_0 kernel ([`tq1_decoded`]), used where that
/// many tokens' digit-ordered activations fit in [`TQ1_ROW_GROUP_BYTES`] (a share of L1d).
pub(super) const TQ1_ROW_GROUP: usize = 8;
pub(super) const TQ1_ROW_GROUP_BYTES: usize = 32 * 1024;

times3_asm!(
    /// `y × 3 mod 256` per byte: moves every code byte to its next base-3 digit. Two byte adds
    /// in inline assembly ([`times3_asm`]): as intrinsics each step became `vpmullw` +
    /// `vpmaddubsw` + shift + blend, two multiplies that compete with `vpdpbusd` for the same
    /// ports.
    times3: __m512i, zmm_reg, "avx512f,avx512bw", "vpaddb {t:z}, {y:z}, {y:z}", "vpaddb {o:z}, {t:z}, {y:z}"
);

/// Codes `(3y) >> 8 = (y > 85) + (y > 170)` ∈ {0, 1, 2} of the current digit of every byte.
#[inline(always)]
pub(super) unsafe fn tq1_digit_codes(y: __m512i) -> __m512i {
    let one = _mm512_set1_epi8(1);
    let c = _mm512_maskz_mov_epi8(_mm512_cmpgt_epu8_mask(y, _mm512_set1_epi8(85)), one);
    _mm512_mask_add_epi8(c, _mm512_cmpgt_epu8_mask(y, _mm512_set1_epi8(170u8 as i8)), c, one)
}

/// Σ of the i32 lanes of several accumulators, in i64.
#[inline(always)]
pub(super) unsafe fn reduce_i64<const A: usize>(acc: &[__m512i; A]) -> i64 {
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
pub(super) unsafe fn tq1_fused(
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
        // TQ1_0: faster than the tiles on 2560-wide rows (docs/perf-notes.md).
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
    // 2 KiB stretch for 2B4T), and each activation load and row epilogue serves four rows
    // (measured faster in 2B4T decode: docs/perf-notes.md).
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
/// Below, the in-register tiles decode each row once or twice, about what the repack costs
/// (on Zen 4, 8 tokens in registers and 9 repacked ran level: docs/perf-notes.md).
pub(crate) const TQ1_REPACK_MIN_BATCH: usize = 2 * TILE_TOKENS + 1;

/// Most rows of a [`tq1_repacked`] block (its tiles' partial sums live on the stack).
pub(super) const TQ1_REPACK_BLOCK_ROWS: usize = 256;

/// Activation bytes of one token group's column chunk in [`tq1_repacked`]: half of Zen 4's
/// 32 KiB L1d, so the group's activations stay in L1 across a block's rows while the codes
/// come from L2 (four tokens of a 6912-wide row are 27 KiB).
pub(super) const TQ1_REPACK_CHUNK_X_BYTES: usize = 16 * 1024;

/// Bytes of [`KernelScratch::unpacked`] that [`tq1_repacked`] needs for rows of `cols`
/// weights: a row block of I2 codes (a quarter of a byte per weight), and at least one row.
pub(crate) fn tq1_repack_scratch_bytes(cols: usize) -> usize {
    (cols / 4).max(crate::matmul::ROW_BLOCK_BYTES)
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
/// tokens: a 128-token prompt decodes each row 32 times. On Zen 4 they ran well behind I2 and
/// behind the AVX2 kernel, which already decoded rows once (docs/perf-notes.md).
///
/// While a block computes, the next block's packed rows are asked for in L2 a share per tile,
/// so the decode pass finds them in cache.
#[inline(always)]
pub(super) unsafe fn tq1_repacked(
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
pub(super) unsafe fn repacked_tile_sums<const R: usize, const G: usize>(
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
pub(super) unsafe fn repacked_tile_finish<const R: usize, const G: usize>(
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
/// (docs/perf-notes.md); from two tokens on, decoding once wins.
///
/// The row is read as one stream of 64-byte chunks across block boundaries, activations in
/// [`tq1_row_digit_order`]: the block scales inside a chunk meet zero activations and add
/// nothing, and all 64 lanes work (block-aligned loads used 52). The last chunk is a masked
/// load that stops at the row's end. Rows up to [`TQ1_I32_CHUNKS`] reduce in i32; the i64
/// reduction of longer rows needs each lane's sums below 2^31, true for K < 800k (≤ 5 · 4 ·
/// 255 · 128 per chunk).
#[inline(always)]
pub(super) unsafe fn tq1_telescoped<const R: usize>(
    w: &Tq1Matrix,
    r: usize,
    x: &ActivationBatch,
    xd: *const u8,
    out: &mut [f32],
) {
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
pub(super) unsafe fn tq1_telescoped_chunk<const R: usize>(
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
pub(super) const TQ1_I32_CHUNKS: usize = 1600;

/// Lane sums of two rows at once: (Σ a, Σ b).
#[inline(always)]
pub(super) unsafe fn reduce_two(a: __m512i, b: __m512i) -> (i32, i32) {
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
/// overflowed L1 in [`tq1_decoded`] (the tiles measured twice as fast there: docs/perf-notes.md).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tq1_tile<const R: usize, const G: usize>(
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
pub(super) unsafe fn tq1_decoded<const G: usize, const A: usize>(
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
