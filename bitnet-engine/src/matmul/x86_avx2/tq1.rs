//! The TQ1_0 (base-3) kernels at AVX2: decoded blocks dotted with up to 64 tokens, and the digit tiles.

use super::*;

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
pub(super) unsafe fn tq1_fused(
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
        pub(crate) unsafe fn $name(y: $ty) -> $ty {
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
/// at under 3 of its 4 vector ops per cycle (figures: docs/perf-notes.md).
#[inline(always)]
pub(super) unsafe fn tq1_digit_chunk<const R: usize, const G: usize>(
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
pub(super) unsafe fn tq1_digit_tile<const R: usize, const G: usize>(
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
