//! The fused I2_S and TQ2_0 kernels at AVX-512: `vpdpbusd` register tiles of rows × tokens over 2-bit codes.

use super::*;

/// Rows and tokens of a batched integer tile ([`code_tile`]): 4 × 4 accumulators, so that each
/// activation load feeds four `vpdpbusd` and each code vector four, with the codes of one
/// field of four rows and one activation vector beside them in registers.
pub(super) const TILE_ROWS: usize = 4;
pub(super) const TILE_TOKENS: usize = 4;

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
pub(super) use code_tile_for;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
pub(super) unsafe fn i2_fused(w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
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
pub(super) unsafe fn i2_tile<const R: usize, const G: usize>(
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
pub(super) unsafe fn store_row_quads<const R: usize>(f: __m512, out: &mut [f32], batch: usize, b0: usize) {
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
pub(super) unsafe fn code_tile<const R: usize, const G: usize, const TQ2: bool>(
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
pub(super) unsafe fn reduce16<const R: usize, const G: usize>(acc: [[__m512i; G]; R]) -> __m512i {
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
pub(super) unsafe fn lanes_i32(v: __m512i) -> [i32; 16] {
    std::mem::transmute(v)
}

/// The mask of 2-bit field n of every byte, `3 << 2n`: `v & mask` leaves the field in place,
/// its code times 4ⁿ. One AND per field and no shift; the accumulator of field n is divided
/// by 4ⁿ at the end ([`combine_fields`]), exactly, since every product in it is a multiple of 4ⁿ.
#[inline(always)]
pub(super) unsafe fn field_mask(n: usize) -> __m512i {
    _mm512_set1_epi8((3u8 << (2 * n)) as i8)
}

/// Σ over fields n of `acc[n] >> 2n` (arithmetic, exact: see [`field_mask`]), lane by lane.
#[inline(always)]
pub(super) unsafe fn combine_fields(acc: [__m512i; 4]) -> __m512i {
    _mm512_add_epi32(
        _mm512_add_epi32(acc[0], _mm512_srai_epi32::<2>(acc[1])),
        _mm512_add_epi32(_mm512_srai_epi32::<4>(acc[2]), _mm512_srai_epi32::<6>(acc[3])),
    )
}

/// The lane sums of R vectors, two at a time.
#[inline(always)]
pub(super) unsafe fn reduce_rows<const R: usize>(lanes: [__m512i; R]) -> [i32; R] {
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
pub(super) unsafe fn i2_masked_rows<const R: usize>(w: &I2Matrix, r: usize, x: &ActivationBatch, out: &mut [f32]) {
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
pub(super) unsafe fn masked_rows_sums<const R: usize, const TQ2: bool>(
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
        // pass it (a prefetch never faults). For I2 this replaced one prefetch per row's block,
        // and streams faster on Zen 5 (level on Zen 4): docs/perf-notes.md.
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
pub(super) unsafe fn tq2_fused(
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
pub(super) unsafe fn tq2_uniform_rows<const R: usize>(
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
pub(super) unsafe fn tq2_group<const G: usize>(
    w: &Tq2Matrix,
    r: usize,
    x: &ActivationBatch,
    b0: usize,
    out: &mut [f32],
) {
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
pub(super) unsafe fn tq2_uniform_tile<const R: usize, const G: usize>(
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
pub(super) unsafe fn finish_uniform_tile<const R: usize, const G: usize>(
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
