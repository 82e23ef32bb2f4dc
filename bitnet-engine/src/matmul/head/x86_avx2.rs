//! The LM head at AVX2: int8 rows and Q6_K rows with `vpmaddubsw`.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::activations::ActivationBatch;
use crate::formats::QK_K;
use crate::matmul::{finish_blocks, finish_tensor};
use crate::simd::x86_avx2::*;

/// Int8-row matmul (LM head) without VNNI. The codes are `w + 128`, so `w = code ^ 0x80`
/// (|w| ≤ 127: `Int8Rows` never stores code 0). `vpmaddubsw(|x|, sign(w, x))` then multiplies
/// exactly: |x| ≤ 128 as an unsigned byte, |sign(w, x)| ≤ 127, so a pair sums to at most
/// 2 · 128 · 127 = 32512 < 2¹⁵ (the textbook `|w|, sign(x, w)` order would wrap at x = −128).
/// Without this AVX2 path the LM head fell to the portable loop below AVX-512, and took most
/// of a decode step.
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
        // twice the multiplies (the head measured faster in 2B4T batch 8: docs/perf-notes.md).
        // The first eight tokens, which stream the row in, take the assembly tile (`q6k_octet`).
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
/// spilled and reloaded constants, well above what a C mock-up of the block alone took with the
/// reduction after the loop. Measured faster on Zen 3 in L2, streamed and in decode
/// (docs/perf-notes.md).
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
/// ([`q6k_tile`] with G = 8) the block took more cycles; here it runs near what its 300-odd
/// vector ops (with the work after the loop) allow at the three or so per cycle Zen 3 sustains
/// on such mixes (figures: docs/perf-notes.md).
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
