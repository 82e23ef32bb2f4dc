//! The fused I2_S and TQ2_0 kernels at AVX2: register tiles of rows × tokens over 2-bit codes, and the repacked form for larger batches.

use super::*;

/// Bytes of a block of 256 2-bit codes the code tiles read: an I2_S block, or a TQ2_0 block's
/// codes alone ([`Tq2Matrix::codes`]).
pub(super) const CODE_BLOCK_BYTES: usize = I2_BLOCK_BYTES;
const _: () = assert!(I2_BLOCK_BYTES == crate::formats::tq2::CODE_BYTES);

/// Tokens processed together per pass over a weight row (codes unpacked once for all of them).
pub(super) const GROUP: usize = 4;

/// Rows of a batched I2/TQ2 tile: two rows × [`GROUP`] tokens ([`code_tile_2x4`]), one row
/// for the groups of fewer tokens and a block's last odd row ([`code_tile`]). With intrinsics,
/// before the assembly tile, 2 × 4 lost to 1 × 4 (LLVM spilled accumulators with AVX2's 16
/// registers), and 1 × 8 lost on long rows (eight tokens of 6912-wide activations, 55 KiB,
/// overflow the 32 KiB L1d); Zen 3 figures: docs/perf-notes.md.
pub(super) const TILE_ROWS: usize = 2;

/// Blocks of 256 codes summed in i16 lanes before they are widened to i32 (one `vpmaddwd` per
/// accumulator): a `vpmaddubsw` pair sum of codes ≤ 2 and activations in [−128, 127] lies in
/// [−512, 508], eight per block and lane, so four blocks stay within [−16384, 16256]. Widening
/// every half block, as the kernels before these did, cost one multiply for four.
pub(super) const I16_BLOCKS: usize = 4;

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
pub(super) unsafe fn i2_fused(w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
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
pub(super) unsafe fn one_token_tiles<const TQ2: bool>(
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
pub(super) unsafe fn load4_i32(v: &[i32]) -> __m128i {
    _mm_loadu_si128(v[..4].as_ptr() as *const __m128i)
}

/// Stores four floats to `out[..4]`: the outputs of four tokens, computed together by the
/// [`GROUP`]-token tiles with the same operations, in the same order, as `finish_tensor` and
/// `finish_blocks` do one at a time (so the same bits), but without a dependent scalar chain
/// per output after each tile.
#[inline(always)]
pub(super) unsafe fn store4_f32(v: __m128, out: &mut [f32]) {
    _mm_storeu_ps(out[..4].as_mut_ptr(), v)
}

/// [`code_tile`]'s sums, by [`code_tile_2x4`] for two rows × four tokens.
#[inline(always)]
pub(super) unsafe fn tile_sums<const R: usize, const G: usize, const TQ2: bool>(
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
pub(super) unsafe fn code_tile<const R: usize, const G: usize, const TQ2: bool>(
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
/// accumulators in the inner loop, slower than the one-row tile. Here the i32 sums live in
/// memory, added to once per [`I16_BLOCKS`] blocks.
///
/// What two rows change: each code load and each field's split (two ops per row) still feed
/// four multiplies per row, and the activations are still memory operands of the multiplies,
/// read from L1 once per row (so per multiply the loads and splits are as many as one row's).
/// What the wider tile saves is the rest of the loop: one set of pointer and counter updates
/// for twice the work, no spills, and the i32 sums out of the registers. Zen 3 runs about 1.6
/// `vpmaddubsw` + `vpaddw` pairs and two vector loads per cycle. Measured faster than the
/// intrinsics on Zen 3, and faster again once a row's four outputs became one vector
/// ([`store4_f32`]) instead of one dependent scalar chain per output: docs/perf-notes.md.
///
/// With `prefetch` (the first token group, which streams the rows from memory), both rows are
/// asked for as one ascending stream, as [`code_tile`] does.
#[inline]
#[target_feature(enable = "avx2,fma,popcnt,f16c")]
pub(super) unsafe fn code_tile_2x4<const TQ2: bool>(
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
pub(super) unsafe fn reduce_tile<const R: usize, const G: usize>(acc: [[__m256i; G]; R]) -> [[i32; G]; R] {
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

/// Batches of more than this many tokens take the repacked TQ1 kernel ([`repacked_rows`]):
/// from two token groups on, decoding a row's digits once costs less than decoding them again
/// for every group.
pub(crate) const UNPACK_MIN_BATCH: usize = GROUP + 1;

/// Bytes of repacked codes per row block of [`repacked_rows`] (a quarter of a byte per
/// weight): a quarter of Zen 3's 512 KiB L2, which also holds the packed rows streaming in for
/// the next block.
pub(super) const REPACKED_BLOCK_BYTES: usize = 128 * 1024;

/// Bytes of [`KernelScratch::unpacked`] that [`repacked_rows`] needs for rows of `cols`
/// weights: a block, and at least one row.
pub(crate) fn unpacked_scratch_bytes(cols: usize) -> usize {
    (cols / 4).max(REPACKED_BLOCK_BYTES)
}

/// Most rows of a [`repacked_rows`] block (its partial sums live on the stack).
pub(super) const REPACKED_BLOCK_ROWS: usize = 256;

/// Activation bytes of one token group's column chunk in [`repacked_rows`]: half of a 32 KiB
/// L1d, so the group's activations stay in L1 across a block's rows beside the codes streaming
/// from L2. Whole rows of a 6912-wide down projection (27 KiB for four tokens) did not, and
/// ran at a fraction of the 2560-wide rows' speed (Zen 3: docs/perf-notes.md).
pub(super) const REPACKED_CHUNK_X_BYTES: usize = 16 * 1024;

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
/// one once per row (measured faster at 8 and 128 tokens on Zen 3: docs/perf-notes.md). The
/// codes were first kept one per byte, for a one-row tile; repacked to 2 bits, a block is a
/// quarter of the bytes and runs the tile that I2_S and TQ2_0 batches run.
///
/// While a block computes, the next block's packed rows (`packed(range)`: their first byte and
/// length) are asked for in L2 a share per tile, so the decode pass finds them in cache.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn repacked_rows(
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
pub(super) unsafe fn repacked_tile<const R: usize, const G: usize>(
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
pub(super) unsafe fn tq2_fused(w: &Tq2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
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
pub(super) unsafe fn tq2_row_block_scaled(w: &Tq2Matrix, r: usize, x: &ActivationBatch, b0: usize, out: &mut [f32]) {
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
pub(super) unsafe fn tq2_uniform_tile<const R: usize, const G: usize>(
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
pub(super) unsafe fn tq2_split(block: &BlockTq2_0) -> [[__m256i; 4]; 2] {
    [split4(load(block.qs.as_ptr())), split4(load(block.qs.as_ptr().add(32)))]
}
