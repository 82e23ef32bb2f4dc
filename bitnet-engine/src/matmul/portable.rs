//! The ISA seam, the split-form driver shared by every ISA, and the portable (no intrinsics)
//! implementation of every primitive.

use std::ops::Range;

use super::{finish_blocks, finish_tensor, KernelForm, KernelScratch, TileScales, TokenTables};
use crate::activations::{ActivationBatch, ACT_PLANES, PLANE_WEIGHTS};
use crate::formats::i2::{i2_position, I2_BLOCK_BYTES, I2_BLOCK_WEIGHTS};
use crate::formats::tq1::{tq1_digit, tq1_position};
use crate::formats::tq1_lut::{LUT_H_WEIGHT, LUT_NEGATED, LUT_PAIR_TABLE_BYTES, LUT_SPAN_GROUPS};
use crate::formats::tq2::tq2_position;
use crate::formats::{
    BinaryMatrix, BitPlaneMatrix, BlockTq1_0, BlockTq2_0, I2Matrix, PackedWeights, Tq1LutMatrix, Tq1Matrix,
    Tq1PermMatrix, Tq2Matrix, QK_K,
};
use crate::instrument::{clock, TIMED_TILE_EVERY};

/// The primitives one ISA level provides. Implemented by zero-sized tokens that can only be
/// created when the CPU supports the level, so every method is safe to call.
pub(crate) trait IsaOps: Copy {
    /// 64 packed I2 bytes → 256 codes in natural order.
    fn decode_i2_block(self, src: &[u8], dst: &mut [u8]);
    /// One TQ2_0 block → 256 codes in natural order.
    fn decode_tq2_block(self, b: &BlockTq2_0, dst: &mut [u8]);
    /// One TQ1_0 block → 256 codes in natural order.
    fn decode_tq1_block(self, b: &BlockTq1_0, dst: &mut [u8]);
    /// Σ codes[k] × x[k]; both the same length, a multiple of 256.
    fn dot_codes(self, codes: &[u8], x: &[i8]) -> i32;
    /// `out[i × T + t]` = [`IsaOps::dot_codes`] of row i of `codes` (rows of `n` codes, back to
    /// back) with token t of `tokens` (T = `tokens.len() / n` tokens, back to back): ISAs that
    /// override it load each vector of codes once for all the tokens, and (AVX-512) each vector
    /// of a token once for a few rows, as the fused kernels do.
    fn dot_codes_tile(self, codes: &[u8], n: usize, tokens: &[i8], out: &mut [i32]) {
        let nt = tokens.len() / n;
        for (i, row) in codes.chunks_exact(n).enumerate() {
            for t in 0..nt {
                out[i * nt + t] = self.dot_codes(row, &tokens[t * n..(t + 1) * n]);
            }
        }
    }
    /// The xnor stage for one row and one token: `dst[p][0][w] = mask[w] & plane_p[w]`,
    /// `dst[p][1][w] = sign[w] & plane_p[w]` (binary weights: only `[p][1]` is written).
    fn and_planes(self, mask: Option<&[u64]>, sign: &[u64], planes: &[u64], words: usize, dst: &mut [u64]);
    /// Total population count of `words`.
    fn popcount(self, words: &[u64]) -> u32;
    fn i2_fused(self, w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]);
    /// `scratch` holds the activations in TQ2 lane order for the ISA levels that use it.
    fn tq2_fused(
        self,
        w: &Tq2Matrix,
        x: &ActivationBatch,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut KernelScratch,
    );
    /// `scratch` holds the activations in TQ1 digit order for the ISA levels that use it.
    fn tq1_fused(
        self,
        w: &Tq1Matrix,
        x: &ActivationBatch,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut KernelScratch,
    );
    fn xnor_fused(self, w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]);
    /// The table-lookup form of `tq1`: rows of the repack against the tokens' tables (see
    /// `formats::tq1_lut`), the tables built by this thread (`KernelScratch::tables_of`).
    fn tq1_lut(
        self,
        w: &Tq1LutMatrix,
        x: &ActivationBatch,
        tables: TokenTables<'_>,
        rows: Range<usize>,
        out: &mut [f32],
    );
    /// The 32-entry table-lookup form of `tq1` (see `formats::tq1_perm`), the tables
    /// built by this thread. Portable unless a level has its own.
    fn tq1_perm(
        self,
        w: &Tq1PermMatrix,
        x: &ActivationBatch,
        tables: TokenTables<'_>,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        tq1_perm_portable(w, x, tables, rows, out)
    }
}

/// The `perm` form, row by row from the portable definition of its sums
/// ([`Tq1PermMatrix::dot_portable`]).
pub(crate) fn tq1_perm_portable(
    w: &Tq1PermMatrix,
    x: &ActivationBatch,
    tables: TokenTables<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let batch = x.batch();
    for (i, r) in rows.enumerate() {
        for b in 0..batch {
            let isum = w.dot_portable(r, tables.token(b));
            out[i * batch + b] = finish_blocks(w.scale(r).to_f64() * isum as f64, x.scale(b));
        }
    }
}

/// Runs `form` with the primitives of `isa`.
pub(crate) fn run<I: IsaOps>(
    isa: I,
    form: KernelForm,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    match (form, w) {
        (KernelForm::Fused, PackedWeights::I2(m)) => isa.i2_fused(m, x, rows, out),
        (KernelForm::Fused, PackedWeights::Tq2(m)) => isa.tq2_fused(m, x, rows, out, scratch),
        (KernelForm::Fused, PackedWeights::Tq1(m)) => isa.tq1_fused(m, x, rows, out, scratch),
        (KernelForm::Fused, PackedWeights::BitPlanes(_) | PackedWeights::Binary(_)) => isa.xnor_fused(w, x, rows, out),
        (KernelForm::Split, PackedWeights::BitPlanes(_) | PackedWeights::Binary(_)) => {
            split_xnor(isa, w, x, rows, out, scratch)
        }
        (KernelForm::Split, _) => split_codes(isa, w, x, rows, out, scratch),
        // A matrix with mixed block scales in a row has no repack: the digit kernel reads it.
        // (Batches above LUT_MAX_BATCH never get here as `lut`: see `Kernel::for_batch`.)
        (KernelForm::Lut, PackedWeights::Tq1(m)) => match m.lut() {
            Some(l) => isa.tq1_lut(l, x, scratch.tables_of(form, x), rows, out),
            None => isa.tq1_fused(m, x, rows, out, scratch),
        },
        (KernelForm::Perm, PackedWeights::Tq1(m)) => match m.perm() {
            Some(p) => isa.tq1_perm(p, x, scratch.tables_of(form, x), rows, out),
            None => isa.tq1_fused(m, x, rows, out, scratch),
        },
        (KernelForm::Lut | KernelForm::Perm, _) => unreachable!("Kernel::new gives the lookup forms to tq1 only"),
    }
}

pub(crate) fn matmul(
    form: KernelForm,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    run(Portable, form, w, x, rows, out, scratch)
}

// ---------------------------------------------------------------------------------------------
// Split form: unpack a tile of rows to codes, then dot. Each stage is its own non-inlined
// function so span timers and sampling profilers can tell them apart.

fn split_codes<I: IsaOps>(
    isa: I,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    let stride = x.padded_cols();
    let tile_rows = scratch.tile_rows(stride);
    let batch = x.batch();
    let scales = match w {
        PackedWeights::I2(m) => TileScales::Tensor(m.scale()),
        PackedWeights::Tq2(m) => TileScales::Tq2(m),
        PackedWeights::Tq1(m) => TileScales::Tq1(m),
        _ => unreachable!("split_codes takes code formats only"),
    };
    let mut r0 = rows.start;
    let mut ticks = scratch.split_ticks;
    let timing = scratch.time_stages;
    let (every, phase) = sample_positions(scratch, rows.len().div_ceil(tile_rows));
    let mut index = 0;
    while r0 < rows.end {
        let r1 = (r0 + tile_rows).min(rows.end);
        let tile = &mut scratch.codes.as_mut_slice()[..(r1 - r0) * stride];
        let o = (r0 - rows.start) * batch;
        let out = &mut out[o..o + (r1 - r0) * batch];
        if timing && index % every == phase {
            let t0 = clock::now();
            unpack_stage(isa, w, r0..r1, tile, stride);
            let t1 = clock::now();
            dot_stage(isa, tile, stride, r0..r1, scales, x, out);
            ticks.first += t1 - t0;
            ticks.second += clock::now() - t1;
        } else {
            unpack_stage(isa, w, r0..r1, tile, stride);
            dot_stage(isa, tile, stride, r0..r1, scales, x, out);
        }
        ticks.tiles += 1;
        index += 1;
        r0 = r1;
    }
    scratch.split_ticks = ticks;
}

/// Which tiles of a run are timed: every `every`-th from `phase`. `every` is
/// [`TIMED_TILE_EVERY`], or the run's tile count if smaller, so every run times at least one
/// tile; `phase` rotates from run to run, so no tile position (the first, with its cold weight
/// loads, above all) is favoured.
fn sample_positions(scratch: &mut KernelScratch, tiles: usize) -> (usize, usize) {
    let every = TIMED_TILE_EVERY.min(tiles.max(1));
    let phase = scratch.sample_phase % every;
    scratch.sample_phase = scratch.sample_phase.wrapping_add(1);
    (every, phase)
}

/// Stage `unpack`: rows of packed weights → `[rows, stride]` codes (padding: code 1 = weight 0).
#[inline(never)]
pub(crate) fn unpack_stage<I: IsaOps>(isa: I, w: &PackedWeights, rows: Range<usize>, tile: &mut [u8], stride: usize) {
    for (i, r) in rows.enumerate() {
        let dst = &mut tile[i * stride..(i + 1) * stride];
        match w {
            PackedWeights::I2(m) => {
                let src = m.row(r);
                let full = m.full_blocks();
                for blk in 0..full {
                    isa.decode_i2_block(
                        &src[blk * I2_BLOCK_BYTES..(blk + 1) * I2_BLOCK_BYTES],
                        &mut dst[blk * I2_BLOCK_WEIGHTS..(blk + 1) * I2_BLOCK_WEIGHTS],
                    );
                }
                if m.tail_weights() > 0 {
                    decode_i2_tail(
                        &src[full * I2_BLOCK_BYTES..],
                        m.tail_weights(),
                        &mut dst[full * QK_K..(full + 1) * QK_K],
                    );
                }
            }
            PackedWeights::Tq2(m) => {
                for (blk, b) in m.row(r).iter().enumerate() {
                    isa.decode_tq2_block(b, &mut dst[blk * QK_K..(blk + 1) * QK_K]);
                }
            }
            PackedWeights::Tq1(m) => {
                for (blk, b) in m.row(r).iter().enumerate() {
                    isa.decode_tq1_block(b, &mut dst[blk * QK_K..(blk + 1) * QK_K]);
                }
            }
            _ => unreachable!("unpack_stage takes code formats only"),
        }
    }
}

/// Tokens per pass of the dot stage over a row's codes ([`IsaOps::dot_codes_tile`]).
const DOT_TOKENS: usize = 8;
/// Most rows × tokens per call of [`IsaOps::dot_codes_tile`] (4 × 4 or 2 × 8): 16
/// accumulators, half of AVX-512's registers.
const DOT_TILE: usize = 16;

/// Stage `dot`: `[rows, stride]` codes × every token → `out[rows, batch]`.
#[inline(never)]
pub(crate) fn dot_stage<I: IsaOps>(
    isa: I,
    tile: &[u8],
    stride: usize,
    rows: Range<usize>,
    scales: TileScales<'_>,
    x: &ActivationBatch,
    out: &mut [f32],
) {
    let batch = x.batch();
    // Rows with one scale: one dot product over the row per token, scaled once (for
    // block-scaled formats the same f64 as block by block: each d × (integer sum) is exact, and
    // so is their sum). Token groups outside rows, so that a group's activations stay in L1
    // across the tile (a prompt's tokens do not fit there).
    let mut dots = [0i32; DOT_TILE];
    for t0 in (0..batch).step_by(DOT_TOKENS) {
        let nt = (batch - t0).min(DOT_TOKENS);
        let tokens = x.tokens(t0..t0 + nt);
        // Runs of uniform rows per call: 4 rows for up to 4 tokens, else 2 (the AVX-512 tiles).
        let most = if nt <= 4 { 4 } else { 2 };
        let mut i = 0;
        while i < rows.len() {
            let run = (i..rows.len().min(i + most)).take_while(|&j| scales.row_uniform(rows.start + j)).count();
            if run == 0 {
                i += 1;
                continue;
            }
            isa.dot_codes_tile(&tile[i * stride..(i + run) * stride], stride, tokens, &mut dots[..run * nt]);
            for k in 0..run {
                let r = rows.start + i + k;
                for t in 0..nt {
                    let b = t0 + t;
                    let isum = dots[k * nt + t] - x.sum(b);
                    out[(i + k) * batch + b] = match scales {
                        TileScales::Tensor(ws) => finish_tensor(isum, ws, x.scale(b)),
                        _ => finish_blocks(scales.block_d(r, 0) * isum as f64, x.scale(b)),
                    };
                }
            }
            i += run;
        }
    }
    // Rows with a scale per block: block by block.
    for (i, r) in rows.enumerate().filter(|&(_, r)| !scales.row_uniform(r)) {
        let codes = &tile[i * stride..(i + 1) * stride];
        for b in 0..batch {
            let (q, bs) = (x.token(b), x.block_sums(b));
            let mut acc = 0f64;
            for blk in 0..stride / QK_K {
                let s = blk * QK_K..(blk + 1) * QK_K;
                let isum = isa.dot_codes(&codes[s.clone()], &q[s]) - bs[blk];
                acc += scales.block_d(r, blk) * isum as f64;
            }
            out[i * batch + b] = finish_blocks(acc, x.scale(b));
        }
    }
}

fn split_xnor<I: IsaOps>(
    isa: I,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) {
    let batch = x.batch();
    let words = x.plane_words();
    let (every, phase) = sample_positions(scratch, rows.len() * batch);
    let dst = &mut scratch.words[..ACT_PLANES * 2 * words];
    let mut ticks = scratch.split_ticks;
    let timing = scratch.time_stages;
    let mut index = 0;
    for (i, r) in rows.enumerate() {
        for b in 0..batch {
            let (mask, sign, w_words, scale) = match w {
                PackedWeights::BitPlanes(m) => {
                    let (mk, sg) = m.row_planes(r);
                    (Some(mk), sg, m.words(), m.scale())
                }
                PackedWeights::Binary(m) => (None, m.row_words(r), m.words(), m.scale()),
                _ => unreachable!("split_xnor takes plane formats only"),
            };
            let timed = timing && index % every == phase;
            index += 1;
            let t0 = if timed { clock::now() } else { 0 };
            xnor_stage(isa, mask, sign, x.planes(b), w_words, words, dst);
            let t1 = if timed { clock::now() } else { 0 };
            let isum = popcount_stage(isa, dst, words, mask.is_none(), x.plane_counts(b));
            if timed {
                ticks.first += t1 - t0;
                ticks.second += clock::now() - t1;
            }
            ticks.tiles += 1;
            out[i * batch + b] = finish_tensor(isum, scale, x.scale(b));
        }
    }
    scratch.split_ticks = ticks;
}

/// Runs one stage of the split form alone over `rows` (for counters per stage: see
/// [`super::Kernel::run_stage_alone`]). `Unpack`/`Xnor` do only the first stage; `Dot`/`Popcount`
/// run the second stage over an operand prepared once (the first tile's codes, the first row's
/// AND words), which stays in L1 as it does in the split form. Returns a checksum so the work
/// cannot be optimised away.
pub(crate) fn stage_alone<I: IsaOps>(
    isa: I,
    stage: super::SplitStage,
    w: &PackedWeights,
    x: &ActivationBatch,
    rows: Range<usize>,
    out: &mut [f32],
    scratch: &mut KernelScratch,
) -> u64 {
    use super::SplitStage::*;
    let batch = x.batch();
    match (stage, w) {
        (Unpack | Dot, PackedWeights::I2(_) | PackedWeights::Tq2(_) | PackedWeights::Tq1(_)) => {
            let stride = x.padded_cols();
            let tile_rows = scratch.tile_rows(stride);
            let scales = match w {
                PackedWeights::I2(m) => TileScales::Tensor(m.scale()),
                PackedWeights::Tq2(m) => TileScales::Tq2(m),
                PackedWeights::Tq1(m) => TileScales::Tq1(m),
                _ => unreachable!(),
            };
            let first = rows.start..(rows.start + tile_rows).min(rows.end);
            if stage == Dot {
                let tile = &mut scratch.codes.as_mut_slice()[..first.len() * stride];
                unpack_stage(isa, w, first.clone(), tile, stride);
            }
            let mut sum = 0u64;
            let mut r0 = rows.start;
            while r0 < rows.end {
                let r1 = (r0 + tile_rows).min(rows.end);
                let o = (r0 - rows.start) * batch;
                if stage == Unpack {
                    let tile = &mut scratch.codes.as_mut_slice()[..(r1 - r0) * stride];
                    unpack_stage(isa, w, r0..r1, tile, stride);
                    sum = sum.wrapping_add(tile[0] as u64);
                } else {
                    // The first tile's codes against these rows' scales (same work per row).
                    let n = (r1 - r0).min(first.len());
                    let tile = &scratch.codes.as_slice()[..n * stride];
                    dot_stage(isa, tile, stride, r0..r0 + n, scales, x, &mut out[o..o + n * batch]);
                    sum = sum.wrapping_add(out[o].to_bits() as u64);
                }
                r0 = r1;
            }
            sum
        }
        (Xnor | Popcount, PackedWeights::BitPlanes(_) | PackedWeights::Binary(_)) => {
            let words = x.plane_words();
            let dst = &mut scratch.words[..ACT_PLANES * 2 * words];
            let row = |r: usize| match w {
                PackedWeights::BitPlanes(m) => {
                    let (mk, sg) = m.row_planes(r);
                    (Some(mk), sg, m.words())
                }
                PackedWeights::Binary(m) => (None, m.row_words(r), m.words()),
                _ => unreachable!(),
            };
            let (mask0, sign0, ww) = row(rows.start);
            xnor_stage(isa, mask0, sign0, x.planes(0), ww, words, dst);
            let mut sum = 0u64;
            for r in rows {
                for b in 0..batch {
                    if stage == Xnor {
                        let (mask, sign, ww) = row(r);
                        xnor_stage(isa, mask, sign, x.planes(b), ww, words, dst);
                        sum = sum.wrapping_add(dst[0]);
                    } else {
                        let isum = popcount_stage(isa, dst, words, mask0.is_none(), x.plane_counts(b));
                        sum = sum.wrapping_add(isum as u64);
                    }
                }
            }
            sum
        }
        _ => 0,
    }
}

/// Stage `xnor`: AND one row's weight planes with one token's 8 activation planes.
#[inline(never)]
fn xnor_stage<I: IsaOps>(
    isa: I,
    mask: Option<&[u64]>,
    sign: &[u64],
    planes: &[u64],
    w_words: usize,
    x_words: usize,
    dst: &mut [u64],
) {
    // Weight rows hold ceil(K/64) words; activation planes are padded further with zero words,
    // which contribute nothing, so only the weight's words are combined.
    for p in 0..ACT_PLANES {
        let plane = &planes[p * x_words..p * x_words + w_words];
        isa.and_planes(mask, sign, plane, w_words, &mut dst[p * 2 * x_words..(p + 1) * 2 * x_words]);
    }
}

/// Stage `popcount`: weighted population counts of the xnor stage's output →
/// Σ_k w_k q_k = Σ_p c_p (|mask ∧ b_p| − 2 |sign ∧ b_p|) (binary: |b_p| in place of |mask ∧ b_p|).
#[inline(never)]
fn popcount_stage<I: IsaOps>(isa: I, src: &[u64], x_words: usize, binary: bool, plane_counts: &[u32]) -> i32 {
    let mut isum = 0i32;
    for p in 0..ACT_PLANES {
        let base = p * 2 * x_words;
        let nonzero = if binary { plane_counts[p] } else { isa.popcount(&src[base..base + x_words]) } as i32;
        let negative = isa.popcount(&src[base + x_words..base + 2 * x_words]) as i32;
        isum += PLANE_WEIGHTS[p] * (nonzero - 2 * negative);
    }
    isum
}

// ---------------------------------------------------------------------------------------------
// Plain block decoders, shared by the portable path and by SIMD tails.

/// The tail of an I2 row (`t` < 256 weights, lane width ceil(t/4)) → 256 codes, code 1 beyond `t`.
pub(crate) fn decode_i2_tail(src: &[u8], t: usize, dst: &mut [u8]) {
    let lane = t.div_ceil(4);
    dst[..QK_K].fill(1);
    for (j, d) in dst[..t].iter_mut().enumerate() {
        let (byte, shift) = i2_position(j, lane);
        *d = (src[byte] >> shift) & 3;
    }
}

/// Σ over the I2 tail of a row, for one token, with plain loops.
pub(crate) fn i2_tail_dot(src: &[u8], t: usize, x: &[i8]) -> i32 {
    let lane = t.div_ceil(4);
    (0..t)
        .map(|j| {
            let (byte, shift) = i2_position(j, lane);
            ((src[byte] >> shift) & 3) as i32 * x[j] as i32
        })
        .sum()
}

/// Bytes of one 256-weight block of activations in TQ1 digit order: five 64-lane vectors.
pub(crate) const TQ1_DIGIT_BLOCK: usize = 5 * 64;

/// One token's activations in the lane order of a TQ2_0 block's 64 code bytes: lane 32j + m of
/// vector n holds the activation of field n of code byte 32j + m, weight 128j + 32n + m. A
/// kernel then loads a block's codes once and masks field n in place for vector n, as for
/// I2. `x.len()` must equal `dst.len()`, a multiple of 256.
pub(crate) fn tq2_lane_order(x: &[i8], dst: &mut [i8]) {
    debug_assert!(dst.len() == x.len() && x.len().is_multiple_of(QK_K));
    for (src, d) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(QK_K)) {
        for n in 0..4 {
            for j in 0..2 {
                d[64 * n + 32 * j..64 * n + 32 * j + 32].copy_from_slice(&src[128 * j + 32 * n..128 * j + 32 * n + 32]);
            }
        }
    }
}

/// One token's activations rearranged for the in-register TQ1 kernels: vector n of a block holds
/// in lane m the activation of the weight that digit n of code byte m (`qs` then `qh`, see
/// [`tq1_position`]) encodes, and 0 where byte m has no digit n (the fifth digit of `qh`) and in
/// lanes 52..64. A kernel can then load the block's 52 code bytes once, advance them digit by
/// digit, and multiply each step by one contiguous vector. `x.len()` must be a multiple of 256.
pub(crate) fn tq1_digit_order(x: &[i8], dst: &mut [i8]) {
    debug_assert!(dst.len() == x.len() / QK_K * TQ1_DIGIT_BLOCK);
    for (src, d) in x.chunks_exact(QK_K).zip(dst.chunks_exact_mut(TQ1_DIGIT_BLOCK)) {
        for (n, v) in d.chunks_exact_mut(64).enumerate() {
            v[..32].copy_from_slice(&src[32 * n..32 * n + 32]);
            v[32..48].copy_from_slice(&src[160 + 16 * n..176 + 16 * n]);
            if n < 4 {
                v[48..52].copy_from_slice(&src[240 + 4 * n..244 + 4 * n]);
            } else {
                v[48..52].fill(0);
            }
            v[52..].fill(0);
        }
    }
}

/// One token's activations for a TQ1_0 row read as one stream of 64-byte chunks, blocks and
/// their scales included: vector n of chunk c holds in lane j the activation that
/// [`tq1_digit_order`] gives to digit n of row byte 64c + j, and 0 where that byte is a block
/// scale (`d`) or lies past the row. A kernel then uses all 64 lanes of every load, where
/// block-aligned loads use 52. `dst.len()` must be `row_chunks(x.len() / 256) × 320`.
pub(crate) fn tq1_row_digit_order(x: &[i8], dst: &mut [i8]) {
    tq1_row_order_with(x, dst, false)
}

/// [`tq1_row_digit_order`] with every activation offset to an unsigned byte, `x + 128` (as
/// `x ^ 0x80`), and still 0 in the lanes that hold no weight: a kernel can then multiply it
/// (unsigned) by signed digit bytes and take back 128 × the row's digit sum.
pub(crate) fn tq1_row_digit_order_offset(x: &[i8], dst: &mut [i8]) {
    tq1_row_order_with(x, dst, true)
}

fn tq1_row_order_with(x: &[i8], dst: &mut [i8], offset: bool) {
    const BLOCK_BYTES: usize = std::mem::size_of::<BlockTq1_0>();
    debug_assert!(dst.len() == tq1_row_chunks(x.len() / QK_K) * TQ1_DIGIT_BLOCK);
    dst.fill(0);
    // Activations `src` for digit n of row bytes p.., split where they cross a chunk boundary.
    let mut put = |n: usize, mut p: usize, mut src: &[i8]| {
        while !src.is_empty() {
            let len = src.len().min(64 - p % 64);
            let at = p / 64 * TQ1_DIGIT_BLOCK + 64 * n + p % 64;
            if offset {
                for (d, &s) in dst[at..at + len].iter_mut().zip(&src[..len]) {
                    *d = s ^ i8::MIN;
                }
            } else {
                dst[at..at + len].copy_from_slice(&src[..len]);
            }
            (p, src) = (p + len, &src[len..]);
        }
    };
    // The lanes of `tq1_digit_order`: qs[0..32] digit n ↔ weights 32n.., qs[32..48] ↔
    // 160 + 16n.., qh[0..4] ↔ 240 + 4n.. (no fifth digit).
    for (blk, src) in x.chunks_exact(QK_K).enumerate() {
        let p = blk * BLOCK_BYTES;
        for n in 0..5 {
            put(n, p, &src[32 * n..32 * n + 32]);
            put(n, p + 32, &src[160 + 16 * n..176 + 16 * n]);
            if n < 4 {
                put(n, p + 48, &src[240 + 4 * n..244 + 4 * n]);
            }
        }
    }
}

/// 64-byte chunks that cover a row of `blocks` TQ1_0 blocks.
pub(crate) fn tq1_row_chunks(blocks: usize) -> usize {
    (blocks * std::mem::size_of::<BlockTq1_0>()).div_ceil(64)
}

/// Decodes the 4 qh digits of a TQ1_0 block into `dst[240..256]` (shared by the SIMD paths:
/// 4 bytes are not worth a vector).
#[inline(always)]
pub(crate) fn decode_tq1_qh(b: &BlockTq1_0, dst: &mut [u8]) {
    for n in 0..4 {
        for m in 0..4 {
            dst[240 + 4 * n + m] = tq1_digit(b.qh[m], n);
        }
    }
}

/// The portable ISA level.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl IsaOps for Portable {
    fn decode_i2_block(self, src: &[u8], dst: &mut [u8]) {
        for j in 0..I2_BLOCK_WEIGHTS {
            let (byte, shift) = i2_position(j, I2_BLOCK_BYTES);
            dst[j] = (src[byte] >> shift) & 3;
        }
    }

    fn decode_tq2_block(self, b: &BlockTq2_0, dst: &mut [u8]) {
        for (i, d) in dst[..QK_K].iter_mut().enumerate() {
            let (byte, shift) = tq2_position(i);
            *d = (b.qs[byte] >> shift) & 3;
        }
    }

    fn decode_tq1_block(self, b: &BlockTq1_0, dst: &mut [u8]) {
        for (i, d) in dst[..240].iter_mut().enumerate() {
            let (byte, n) = tq1_position(i);
            *d = tq1_digit(b.qs[byte], n);
        }
        decode_tq1_qh(b, dst);
    }

    fn dot_codes(self, codes: &[u8], x: &[i8]) -> i32 {
        codes.iter().zip(x).map(|(c, v)| *c as i32 * *v as i32).sum()
    }

    fn and_planes(self, mask: Option<&[u64]>, sign: &[u64], plane: &[u64], words: usize, dst: &mut [u64]) {
        let x_words = dst.len() / 2;
        let (dm, ds) = dst.split_at_mut(x_words);
        if let Some(mask) = mask {
            for w in 0..words {
                dm[w] = mask[w] & plane[w];
            }
            dm[words..].fill(0);
        }
        for w in 0..words {
            ds[w] = sign[w] & plane[w];
        }
        ds[words..].fill(0);
    }

    fn popcount(self, words: &[u64]) -> u32 {
        words.iter().map(|w| w.count_ones()).sum()
    }

    fn i2_fused(self, w: &I2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
        let batch = x.batch();
        let (full, t) = (w.full_blocks(), w.tail_weights());
        for (i, r) in rows.enumerate() {
            let src = w.row(r);
            for b in 0..batch {
                let q = x.token(b);
                let mut isum = 0i32;
                for blk in 0..full {
                    let bytes = &src[blk * I2_BLOCK_BYTES..(blk + 1) * I2_BLOCK_BYTES];
                    let xq = &q[blk * I2_BLOCK_WEIGHTS..];
                    for n in 0..4 {
                        for (byte, v) in bytes.iter().enumerate() {
                            isum += ((v >> (2 * n)) & 3) as i32 * xq[64 * n + byte] as i32;
                        }
                    }
                }
                if t > 0 {
                    isum += i2_tail_dot(&src[full * I2_BLOCK_BYTES..], t, &q[full * I2_BLOCK_WEIGHTS..]);
                }
                out[i * batch + b] = finish_tensor(isum - x.sum(b), w.scale(), x.scale(b));
            }
        }
    }

    fn tq2_fused(self, w: &Tq2Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32], _: &mut KernelScratch) {
        let batch = x.batch();
        for (i, r) in rows.enumerate() {
            for b in 0..batch {
                let (q, bs) = (x.token(b), x.block_sums(b));
                let mut acc = 0f64;
                for (blk, block) in w.row(r).iter().enumerate() {
                    let xq = &q[blk * QK_K..];
                    let mut isum = 0i32;
                    for (byte, v) in block.qs.iter().enumerate() {
                        let base = 128 * (byte / 32) + byte % 32;
                        for n in 0..4 {
                            isum += ((v >> (2 * n)) & 3) as i32 * xq[base + 32 * n] as i32;
                        }
                    }
                    acc += block.d.to_f64() * (isum - bs[blk]) as f64;
                }
                out[i * batch + b] = finish_blocks(acc, x.scale(b));
            }
        }
    }

    fn tq1_fused(self, w: &Tq1Matrix, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32], _: &mut KernelScratch) {
        // Base-3 digits cannot be extracted cheaply per weight in a dot loop; decode each block
        // to 256 codes on the stack, then multiply.
        let batch = x.batch();
        let mut codes = [0u8; QK_K];
        for (i, r) in rows.enumerate() {
            for b in 0..batch {
                let (q, bs) = (x.token(b), x.block_sums(b));
                let mut acc = 0f64;
                for (blk, block) in w.row(r).iter().enumerate() {
                    self.decode_tq1_block(block, &mut codes);
                    let isum = self.dot_codes(&codes, &q[blk * QK_K..(blk + 1) * QK_K]) - bs[blk];
                    acc += block.d.to_f64() * isum as f64;
                }
                out[i * batch + b] = finish_blocks(acc, x.scale(b));
            }
        }
    }

    fn tq1_lut(
        self,
        w: &Tq1LutMatrix,
        x: &ActivationBatch,
        tables: TokenTables<'_>,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        // Group by group: the pattern index and sign from the repack, the pattern's sum from
        // the token's table (its l and h bytes), added or subtracted.
        let batch = x.batch();
        for (i, r) in rows.enumerate() {
            for b in 0..batch {
                let table = tables.token(b);
                let mut isum = 0i32;
                for g in 0..w.spans() * LUT_SPAN_GROUPS {
                    let c = w.code(r, g);
                    let (p, neg) = (c & (LUT_NEGATED - 1), c & LUT_NEGATED != 0);
                    let at = g / 2 * LUT_PAIR_TABLE_BYTES + 16 * (g % 2) + p as usize;
                    let v = table[at] as i8 as i32 + LUT_H_WEIGHT as i32 * table[at + 32] as i8 as i32;
                    isum += if neg { -v } else { v };
                }
                out[i * batch + b] = finish_blocks(w.scale(r).to_f64() * isum as f64, x.scale(b));
            }
        }
    }

    fn xnor_fused(self, w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
        let batch = x.batch();
        let xw = x.plane_words();
        for (i, r) in rows.enumerate() {
            for b in 0..batch {
                let planes = x.planes(b);
                let (isum, scale) = match w {
                    PackedWeights::BitPlanes(m) => (xnor_ternary_row(m, r, planes, xw), m.scale()),
                    PackedWeights::Binary(m) => (xnor_binary_row(m, r, planes, xw, x.plane_counts(b)), m.scale()),
                    _ => unreachable!("xnor takes plane formats only"),
                };
                out[i * batch + b] = finish_tensor(isum, scale, x.scale(b));
            }
        }
    }
}

fn xnor_ternary_row(m: &BitPlaneMatrix, r: usize, planes: &[u64], xw: usize) -> i32 {
    let (mask, sign) = m.row_planes(r);
    let mut isum = 0i32;
    for p in 0..ACT_PLANES {
        let plane = &planes[p * xw..];
        let (mut nz, mut neg) = (0u32, 0u32);
        for w in 0..m.words() {
            nz += (mask[w] & plane[w]).count_ones();
            neg += (sign[w] & plane[w]).count_ones();
        }
        isum += PLANE_WEIGHTS[p] * (nz as i32 - 2 * neg as i32);
    }
    isum
}

fn xnor_binary_row(m: &BinaryMatrix, r: usize, planes: &[u64], xw: usize, counts: &[u32]) -> i32 {
    let sign = m.row_words(r);
    let mut isum = 0i32;
    for p in 0..ACT_PLANES {
        let plane = &planes[p * xw..];
        let neg: u32 = (0..m.words()).map(|w| (sign[w] & plane[w]).count_ones()).sum();
        isum += PLANE_WEIGHTS[p] * (counts[p] as i32 - 2 * neg as i32);
    }
    isum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tq1_digit_order_puts_each_activation_under_its_digit() {
        // Built independently from the format's position table: weight i of a block is digit n
        // of code byte m, so its activation must sit in lane m of vector n, and every lane that
        // no weight maps to must be zero.
        let x: Vec<i8> = (0..2 * QK_K).map(|i| ((i * 37 % 251) as i32 - 125) as i8).collect();
        let mut got = vec![99i8; 2 * TQ1_DIGIT_BLOCK];
        tq1_digit_order(&x, &mut got);
        let mut want = vec![0i8; 2 * TQ1_DIGIT_BLOCK];
        for blk in 0..2 {
            for i in 0..QK_K {
                let (m, n) = tq1_position(i);
                want[blk * TQ1_DIGIT_BLOCK + 64 * n + m] = x[blk * QK_K + i];
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn tq1_row_orders_put_each_activation_under_its_digit_of_the_row_stream() {
        // From the format's position table: weight i of block blk is digit n of code byte m,
        // row byte 54·blk + m, so its activation sits in lane (row byte mod 64) of vector n of
        // chunk (row byte / 64); every other lane (scales, qh's fifth digit, past the row) is
        // zero, in both orders. The offset order holds x + 128 as a byte (x ^ 0x80), so that
        // 0 there means a lane with no weight or x = −128. Three blocks: chunks that straddle
        // blocks and a partial last chunk.
        const BLOCKS: usize = 3;
        let x: Vec<i8> = (0..BLOCKS * QK_K).map(|i| (i * 37 % 256) as u8 as i8).collect();
        assert!(x.contains(&0) && x.contains(&i8::MIN) && x.contains(&i8::MAX));
        let len = tq1_row_chunks(BLOCKS) * TQ1_DIGIT_BLOCK;
        let (mut plain, mut offset) = (vec![99i8; len], vec![99i8; len]);
        tq1_row_digit_order(&x, &mut plain);
        tq1_row_digit_order_offset(&x, &mut offset);
        let (mut want_plain, mut want_offset) = (vec![0i8; len], vec![0i8; len]);
        for blk in 0..BLOCKS {
            for i in 0..QK_K {
                let (m, n) = tq1_position(i);
                let p = blk * std::mem::size_of::<BlockTq1_0>() + m;
                let at = p / 64 * TQ1_DIGIT_BLOCK + 64 * n + p % 64;
                let v = x[blk * QK_K + i];
                want_plain[at] = v;
                want_offset[at] = (v as i32 + 128) as u8 as i8;
            }
        }
        assert_eq!(plain, want_plain);
        assert_eq!(offset, want_offset);
    }

    #[test]
    fn tq2_lane_order_puts_each_activation_under_its_field() {
        // From the format's position table: weight i of a block is field s/2 of code byte m,
        // so its activation must sit in lane m of vector s/2.
        let x: Vec<i8> = (0..3 * QK_K).map(|i| ((i * 37 % 251) as i32 - 125) as i8).collect();
        let mut got = vec![99i8; 3 * QK_K];
        tq2_lane_order(&x, &mut got);
        let mut want = vec![99i8; 3 * QK_K];
        for blk in 0..3 {
            for i in 0..QK_K {
                let (m, shift) = crate::formats::tq2::tq2_position(i);
                want[blk * QK_K + 64 * (shift as usize / 2) + m] = x[blk * QK_K + i];
            }
        }
        assert_eq!(got, want);
    }
}
