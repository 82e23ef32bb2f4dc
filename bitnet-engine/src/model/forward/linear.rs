//! The linear layers of a forward call: one matmul, several on the same activations in one
//! dispatch (Q, K, V), or gate and up with the gated activation; what each worker asks for
//! ahead, and the transposes of their results.

use super::*;

/// BitLinear's activation quantization (the `quantize` stage), plus the bit-planes the xnor
/// kernels read.
pub(super) fn quantize(extras: ActivationExtras, act: &mut ActivationBatch, x: &[f32]) -> Result<()> {
    act.quantize(x)?;
    if extras.planes {
        act.build_planes();
    }
    Ok(())
}

/// What the linear layers' kernels read beside the int8 activations.
#[derive(Debug, Clone, Copy)]
pub(super) struct ActivationExtras {
    /// Bit-planes (the xnor kernels). (The lookup forms' tables are each thread's own:
    /// `KernelScratch::tables_of`.)
    pub(super) planes: bool,
}

/// What every pool dispatch of a forward call borrows from its [`State`]: the pool, the
/// kernel forced for every layer (if any), the `[max(N), rows]` matmul output (attention's
/// head-major scratch) and the workers.
pub(super) struct Dispatch<'s> {
    pub(super) pool: &'s WorkerPool,
    pub(super) forced: Option<Kernel>,
    pub(super) mm: &'s mut [f32],
    pub(super) workers: &'s mut [Worker],
}

/// One projection: its weights, the GGUF `.scale` its output is multiplied by, and its span
/// context.
#[derive(Clone, Copy)]
pub(super) struct Projection<'a> {
    pub(super) w: &'a PackedWeights,
    pub(super) out_scale: f32,
    pub(super) ctx: SpanCtx,
}

/// `out[rows, N] = act × wᵀ`: the kernel writes `[N, rows]` into `mm`, split by output rows
/// across threads, then it is transposed (a no-op copy for one row).
/// The kernel for `w`: the forced one, or the best for its format.
#[inline]
pub(super) fn kernel_for(forced: Option<Kernel>, w: &PackedWeights) -> Kernel {
    Kernel::for_weights(forced, w)
}

/// The kernel that runs `w` on `rows` tokens ([`Kernel::for_batch`]): what the spans name and
/// count bytes for.
pub(super) fn kernel_for_rows(forced: Option<Kernel>, w: &PackedWeights, rows: usize) -> Kernel {
    Kernel::for_weights(forced, w).for_batch(rows)
}

pub(super) fn linear(
    d: Dispatch<'_>,
    p: Projection<'_>,
    act: &ActivationBatch,
    out: &mut [f32],
    next: &NextInputs,
    upcoming: Upcoming,
) -> Result<()> {
    let Dispatch { pool, forced, mm, workers } = d;
    let Projection { w, out_scale, ctx } = p;
    let (n, rows) = (w.rows(), act.batch());
    let kernel = kernel_for_rows(forced, w, rows);
    kernel.check(w, act, &(0..n), &mm[..n * rows])?;
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    let w_bytes = kernel.bytes_read(w) as u64;
    let threads = pool.threads();
    let scatter = scatters(rows);
    pool.split_blocks_scatter(
        (&mut mm[..n * rows], None),
        rows,
        kernel.row_block(),
        [ScatterTarget::new(&mut out[..rows * n], n, 0)],
        workers,
        |i| upcoming.ahead(threads, i),
        |blocks, wk| {
            let t0 = wk.rec.start();
            let mut t = t0;
            // Bytes of the blocks not yet in a span: a run of blocks is one span, cut where a
            // block's scatter is timed.
            let mut open = None;
            while let Some((first, chunk, _, [mut cols])) = blocks.next_block() {
                let r = first..first + chunk.len() / rows;
                *open.get_or_insert(0) += w_bytes * r.len() as u64 / n as u64;
                // One token: `[n, 1]` is `[1, n]`, so the kernel writes the output in place.
                let dst = if rows == 1 { cols.token(0) } else { &mut *chunk };
                kernel.matmul(w, act, r, dst, &mut wk.kernel).expect("arguments checked before the split");
                scale_in_place(dst, out_scale);
                if scatter && rows > 1 {
                    if let (Some(bytes), true) = (open.take(), wk.rec.on()) {
                        t = record_matmul(&mut wk.rec, &mut wk.kernel, kernel, ctx, t, bytes);
                    }
                    scatter_block(chunk, &mut cols);
                    t = wk.rec.end(ctx, Stage::Transpose, t, 0);
                }
            }
            if let (Some(bytes), true) = (open, wk.rec.on()) {
                t = record_matmul(&mut wk.rec, &mut wk.kernel, kernel, ctx, t, bytes);
            }
            if t != t0 {
                wk.rec.chunk_start = t0;
                wk.rec.chunk_end = t;
            }
            if blocks.is_caller() {
                next.prefetch();
            }
        },
    );
    let rec = &mut workers[0].rec;
    if on {
        rec.end_split(ctx, t_split);
    }
    if !scatter {
        transpose_result(pool, &mm[..n * rows], n, rows, out, workers, ctx);
    }
    Ok(())
}

/// Records one thread's run of a matmul that started at `t0`: one span for a fused kernel; for
/// a split one, the run's time divided between its two stages in the ratio of the timed tiles
/// (see [`crate::instrument`]). Returns the end tick.
/// Several matmuls on the same activations in one pool dispatch (Q, K and V): their output
/// rows are split across threads as one concatenation, so the layer pays one barrier instead of
/// one per matrix and the threads stay balanced across the parts. Part i's `[n_i, rows]`
/// result lands in `mm` after the earlier parts', then is transposed into `outs[i]`.
pub(super) fn linear_multi<const P: usize>(
    d: Dispatch<'_>,
    parts: [Projection<'_>; P],
    act: &ActivationBatch,
    outs: [&mut [f32]; P],
    next: &NextInputs,
) -> Result<()> {
    let Dispatch { pool, forced, mm, workers } = d;
    let rows = act.batch();
    let kernels: [Kernel; P] = std::array::from_fn(|i| kernel_for_rows(forced, parts[i].w, rows));
    let ns: [usize; P] = std::array::from_fn(|i| parts[i].w.rows());
    let mut offs = [0usize; P];
    for i in 1..P {
        offs[i] = offs[i - 1] + ns[i - 1];
    }
    let total = offs[P - 1] + ns[P - 1];
    for i in 0..P {
        let m = &mm[offs[i] * rows..(offs[i] + ns[i]) * rows];
        kernels[i].check(parts[i].w, act, &(0..ns[i]), m)?;
    }
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    let block_rows = kernels.iter().map(|k| k.row_block()).max().unwrap_or(BLOCK_ROWS);
    let scatter = scatters(rows);
    let mut outs = outs;
    let mut part = 0;
    let targets = outs.each_mut().map(|out| {
        let target = ScatterTarget::new(&mut out[..rows * ns[part]], ns[part], offs[part]);
        part += 1;
        target
    });
    pool.split_blocks_scatter(
        (&mut mm[..total * rows], None),
        rows,
        block_rows,
        targets,
        workers,
        |_| Ahead::NONE,
        |blocks, wk| {
            let t0 = wk.rec.start();
            let mut t = t0;
            // The part being timed and its bytes so far: consecutive blocks of one part make one
            // span (a thread's blocks are consecutive rows, except those it takes from others),
            // cut where a block's scatter is timed.
            let mut open: Option<(usize, u64)> = None;
            while let Some((first, chunk, _, mut cols)) = blocks.next_block() {
                let end = first + chunk.len() / rows;
                for i in 0..P {
                    let (lo, hi) = (offs[i].max(first), (offs[i] + ns[i]).min(end));
                    if lo >= hi {
                        continue;
                    }
                    if let Some((p, bytes)) = open.filter(|o| o.0 != i) {
                        if wk.rec.on() {
                            t = record_matmul(&mut wk.rec, &mut wk.kernel, kernels[p], parts[p].ctx, t, bytes);
                        }
                        open = None;
                    }
                    let Projection { w, out_scale, ctx } = parts[i];
                    let part = &mut chunk[(lo - first) * rows..(hi - first) * rows];
                    // One token: the kernel writes the part's output in place (see `linear`).
                    let dst = if rows == 1 { cols[i].token(0) } else { &mut *part };
                    kernels[i]
                        .matmul(w, act, lo - offs[i]..hi - offs[i], dst, &mut wk.kernel)
                        .expect("arguments checked before the split");
                    scale_in_place(dst, out_scale);
                    let bytes = kernels[i].bytes_read(w) as u64 * (hi - lo) as u64 / ns[i] as u64;
                    open = Some((i, open.map_or(0, |o| o.1) + bytes));
                    if scatter && rows > 1 {
                        if let (Some((p, bytes)), true) = (open.take(), wk.rec.on()) {
                            t = record_matmul(&mut wk.rec, &mut wk.kernel, kernels[p], parts[p].ctx, t, bytes);
                        }
                        scatter_block(part, &mut cols[i]);
                        t = wk.rec.end(ctx, Stage::Transpose, t, 0);
                    }
                }
            }
            if let (Some((p, bytes)), true) = (open, wk.rec.on()) {
                t = record_matmul(&mut wk.rec, &mut wk.kernel, kernels[p], parts[p].ctx, t, bytes);
            }
            if t != t0 {
                wk.rec.chunk_start = t0;
                wk.rec.chunk_end = t;
            }
            if blocks.is_caller() {
                next.prefetch();
            }
        },
    );
    let rec = &mut workers[0].rec;
    if on {
        rec.end_split(parts[0].ctx, t_split);
    }
    if !scatter {
        for (i, out) in outs.into_iter().enumerate() {
            let m = &mm[offs[i] * rows..(offs[i] + ns[i]) * rows];
            transpose_result(pool, m, ns[i], rows, out, workers, parts[i].ctx);
        }
    }
    Ok(())
}

/// The gate and up projections in one pool dispatch, each thread computing the same rows of
/// both and then the gated activation of those rows (`ffn_act`, in parallel instead of on the
/// caller afterwards). The activated `[n, rows]` result is transposed into `out`.
/// `activation`: the FFN's non-linearity and the span context of its stage.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_gated(
    d: Dispatch<'_>,
    gate: Projection<'_>,
    up: Projection<'_>,
    activation: (FfnActivation, SpanCtx),
    act: &ActivationBatch,
    out: &mut [f32],
    next: &NextInputs,
    upcoming: Upcoming,
) -> Result<()> {
    let Dispatch { pool, forced, mm, workers } = d;
    let (activation, act_ctx) = activation;
    let (rows, n) = (act.batch(), gate.w.rows());
    if up.w.rows() != n {
        return Err(Error::Shape(format!("gate has {n} rows but up has {}", up.w.rows())));
    }
    let (kg, ku) = (kernel_for_rows(forced, gate.w, rows), kernel_for_rows(forced, up.w, rows));
    let (mg, mu) = mm[..2 * n * rows].split_at_mut(n * rows);
    kg.check(gate.w, act, &(0..n), mg)?;
    ku.check(up.w, act, &(0..n), mu)?;
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    let (gate_bytes, up_bytes) = (kg.bytes_read(gate.w) as u64, ku.bytes_read(up.w) as u64);
    let (threads, block) = (pool.threads(), kg.row_block().max(ku.row_block()));
    let scatter = scatters(rows);
    pool.split_blocks_scatter(
        (mg, Some(mu)),
        rows,
        block,
        [ScatterTarget::new(&mut out[..rows * n], n, 0)],
        workers,
        |i| upcoming.ahead(threads, i),
        |blocks, wk| {
            let t0 = wk.rec.start();
            let mut t = t0;
            // Each block is gate, up and the activation of the same rows (and the scatter of
            // the activated rows): three spans per block (four).
            while let Some((first, cg, cu, [mut cols])) = blocks.next_block() {
                let cu = cu.expect("split with up's output");
                let r = first..first + cg.len() / rows;
                // One token: the activated gate rows are written in place (see `linear`).
                let block = cg;
                let cg = if rows == 1 { cols.token(0) } else { &mut *block };
                kg.matmul(gate.w, act, r.clone(), cg, &mut wk.kernel).expect("arguments checked before the split");
                scale_in_place(cg, gate.out_scale);
                if wk.rec.on() {
                    t = record_matmul(
                        &mut wk.rec,
                        &mut wk.kernel,
                        kg,
                        gate.ctx,
                        t,
                        gate_bytes * r.len() as u64 / n as u64,
                    );
                }
                ku.matmul(up.w, act, r.clone(), cu, &mut wk.kernel).expect("arguments checked before the split");
                scale_in_place(cu, up.out_scale);
                if wk.rec.on() {
                    t = record_matmul(&mut wk.rec, &mut wk.kernel, ku, up.ctx, t, up_bytes * r.len() as u64 / n as u64);
                }
                crate::ops::gated_activation(activation, cg, cu);
                t = wk.rec.end(act_ctx, Stage::FfnAct, t, 0);
                if scatter && rows > 1 {
                    scatter_block(block, &mut cols);
                    t = wk.rec.end(gate.ctx, Stage::Transpose, t, 0);
                }
            }
            if t != t0 {
                wk.rec.chunk_start = t0;
                wk.rec.chunk_end = t;
            }
            if blocks.is_caller() {
                next.prefetch();
            }
        },
    );
    let rec = &mut workers[0].rec;
    if on {
        rec.end_split(gate.ctx, t_split);
    }
    if !scatter {
        transpose_result(pool, &mm[..n * rows], n, rows, out, workers, gate.ctx);
    }
    Ok(())
}

/// Output rows per block of the LM head's [`WorkerPool::split_blocks`] (the linear layers take
/// [`Kernel::row_block`], which is this but for the 32-row tiles of the `perm` form). Threads
/// take their own rows in halves of what is left (see `Blocks::next_block`), so a small block
/// costs no more kernel calls than a large one until the end of the run, where it lets a
/// thread that finished take over the other's last rows.
pub(super) const BLOCK_ROWS: usize = crate::matmul::ROW_BLOCK;

/// Up to this many rows per forward call (decode steps, not prompts), the lines the caller's
/// serial stages between projections will touch are prefetched: the cache lines the layer's
/// `kv_write` will store into, before its projections run, and the residual stream, norm
/// output and activation buffers, by the caller as soon as its share of a projection is done
/// ([`NextInputs`]). A few KiB per row, which a prompt chunk's hundreds of rows would turn into
/// a flood.
pub(super) const PREFETCH_ROWS: usize = 16;

/// What the caller's serial stages after a projection read and write, asked for in L2 by the
/// caller when its share of the projection is done, while the other threads finish theirs:
/// the weights streamed since had evicted them, and the norm and quantize stages, each on the
/// caller alone while the others wait, met them line by line (asking ahead roughly halved
/// those stages: docs/perf-notes.md).
pub(super) struct NextInputs<'a> {
    /// The residual stream the add after the projection reads first (row-sized).
    pub(super) residual: Option<&'a [f32]>,
    /// The next norm's weights: always (a few KiB, however many rows).
    pub(super) norm: Option<&'a [f32]>,
    /// The norm's output (row-sized).
    pub(super) norm_out: Option<&'a [f32]>,
    /// The activations the quantize stage writes (row-sized).
    pub(super) act: Option<&'a ActivationBatch>,
    /// Rows of this forward call: the row-sized buffers only for up to [`PREFETCH_ROWS`].
    pub(super) n_rows: usize,
}

impl NextInputs<'_> {
    /// In the order of use: the residual stream, the norm's weights, then the norm's output and
    /// the activations.
    pub(super) fn prefetch(&self) {
        let few = self.n_rows <= PREFETCH_ROWS;
        if let (Some(x), true) = (self.residual, few) {
            prefetch_l2(x);
        }
        if let Some(norm) = self.norm {
            prefetch_l2(norm);
        }
        if few {
            if let Some(out) = self.norm_out {
                prefetch_l2(out);
            }
            if let Some(act) = self.act {
                act.prefetch();
            }
        }
    }
}

/// Bytes of the next matmul's weights each worker asks for in L2 once its part of a decode
/// step's dispatch is done ([`Ahead`]): its own first rows, which the bus then streams while
/// the caller runs the serial stages before that matmul (the norm, quantization, residual),
/// where no thread had read weights for a few percent of a step. 128 KiB: smaller amounts
/// gained less and 256 KiB no more (docs/perf-notes.md).
pub(super) const AHEAD_BYTES: usize = 128 * 1024;

/// The matmul a pool dispatch is followed by, for [`AHEAD_BYTES`] (nothing for a prompt's
/// rows: its matmuls are compute-bound).
#[derive(Clone, Copy)]
pub(super) enum Upcoming<'a> {
    Nothing,
    /// Up to three matrices split as one concatenation of their rows (see [`linear_multi`]),
    /// in blocks of `block` rows.
    Rows {
        parts: [Option<(Kernel, &'a PackedWeights)>; 3],
        block: usize,
    },
    /// The same rows of two matrices (see [`linear_gated`]).
    Pair {
        gate: (Kernel, &'a PackedWeights),
        up: (Kernel, &'a PackedWeights),
        block: usize,
    },
}

impl<'a> Upcoming<'a> {
    /// The `P` matrices [`linear`] (P = 1) or [`linear_multi`] runs next on `rows` tokens.
    pub(super) fn rows<const P: usize>(forced: Option<Kernel>, rows: usize, ws: [&'a PackedWeights; P]) -> Self {
        if rows > PREFETCH_ROWS {
            return Upcoming::Nothing;
        }
        let mut parts = [None; 3];
        for (p, w) in parts.iter_mut().zip(ws) {
            *p = Some((kernel_for_rows(forced, w, rows), w));
        }
        let block = parts.iter().flatten().map(|(k, _)| k.row_block()).max().unwrap_or(BLOCK_ROWS);
        Upcoming::Rows { parts, block }
    }

    /// The gate and up projections [`linear_gated`] runs next on `rows` tokens.
    pub(super) fn pair(forced: Option<Kernel>, rows: usize, gate: &'a PackedWeights, up: &'a PackedWeights) -> Self {
        if rows > PREFETCH_ROWS {
            return Upcoming::Nothing;
        }
        let (kg, ku) = (kernel_for_rows(forced, gate, rows), kernel_for_rows(forced, up, rows));
        Upcoming::Pair { gate: (kg, gate), up: (ku, up), block: kg.row_block().max(ku.row_block()) }
    }

    /// What worker `i` of `threads` asks for: the start of the run of rows
    /// [`WorkerPool::split_blocks`] will give it first (the caller, thread 0, asks for
    /// nothing: it goes on to the serial stages).
    pub(super) fn ahead(&self, threads: usize, i: usize) -> Ahead {
        let first_row = |units: usize, block: usize| chunk_range(units.div_ceil(block), threads, 1, i).start * block;
        match *self {
            _ if i == 0 => Ahead::NONE,
            Upcoming::Nothing => Ahead::NONE,
            Upcoming::Rows { parts, block } => {
                let mut row = first_row(parts.iter().flatten().map(|(_, w)| w.rows()).sum(), block);
                for (k, w) in parts.into_iter().flatten() {
                    if row < w.rows() {
                        return Ahead::one(k.stream_from(w, row).window(0, AHEAD_BYTES));
                    }
                    row -= w.rows();
                }
                Ahead::NONE
            }
            Upcoming::Pair { gate, up, block } => {
                let row = first_row(gate.1.rows(), block);
                let half = |(k, w): (Kernel, &PackedWeights)| k.stream_from(w, row).window(0, AHEAD_BYTES / 2);
                Ahead([half(gate), half(up)])
            }
        }
    }
}

/// Whether the linear layers of a forward call on `rows` tokens write their results straight
/// into `[rows, n]` ([`ScatterTarget`]), each thread its blocks' columns, rather than into
/// `[n, rows]` for a transpose afterwards. Decode batches: the serial transposes had taken a
/// few percent of a batch-8 step while the other threads waited (the copies take the same
/// thread time, now shared; measured faster: docs/perf-notes.md). A prompt's tokens keep the
/// transpose split by tokens ([`transpose_result`]); the scatter was not measured there.
pub(super) fn scatters(rows: usize) -> bool {
    rows < PARALLEL_TRANSPOSE_ROWS
}

/// Copies a `[len, tokens]` block of a matmul result into its columns of a `[tokens, n]`
/// output (`cols.cols().len() == len`): eight tokens at a time as 8 × 8 tiles, the rest by a
/// plain loop.
pub(super) fn scatter_block(block: &[f32], cols: &mut Columns<'_, '_, f32>) {
    let tokens = cols.tokens();
    debug_assert_eq!(block.len(), cols.cols().len() * tokens);
    let mut t = 0;
    while t + 8 <= tokens {
        transpose_8_cols_to_rows(block, tokens, t, cols.token_group::<8>(t));
        t += 8;
    }
    for t in t..tokens {
        for (j, d) in cols.token(t).iter_mut().enumerate() {
            *d = block[j * tokens + t];
        }
    }
}

/// From this many tokens on, a `[n, rows]` matmul result is transposed by the pool (each
/// thread its share of the tokens) instead of by the caller alone: in a 128-token prefill the
/// serial transposes took 14% of the wall time with the other threads idle. Decode batches
/// scatter their blocks instead ([`scatters`]); the LM head's logits still come here.
pub(super) const PARALLEL_TRANSPOSE_ROWS: usize = 16;

/// Fewer rows are transposed in parallel too when there are this many floats (1 MiB, an L2):
/// the LM head's `[vocab, B]` logits of a decode batch (2B4T at B = 8: 1M floats, which took
/// the caller alone a visible share of a step: docs/perf-notes.md).
pub(super) const PARALLEL_TRANSPOSE_FLOATS: usize = 1 << 18;

/// `[n, rows]` → `[rows, n]`: see [`PARALLEL_TRANSPOSE_ROWS`] and [`PARALLEL_TRANSPOSE_FLOATS`].
pub(super) fn transpose_result(
    pool: &WorkerPool,
    src: &[f32],
    n: usize,
    rows: usize,
    out: &mut [f32],
    workers: &mut [Worker],
    ctx: SpanCtx,
) {
    if (rows < PARALLEL_TRANSPOSE_ROWS && rows * n < PARALLEL_TRANSPOSE_FLOATS) || pool.threads() == 1 {
        workers[0].rec.time(ctx, Stage::Transpose, 0, || transpose_into(src, n, rows, out));
        return;
    }
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    pool.split(&mut out[..rows * n], n, 1, workers, |first, chunk, wk| {
        let t0 = wk.rec.start();
        wk.rec.chunk_start = t0;
        transpose_cols_into(src, n, rows, first..first + chunk.len() / n, chunk);
        wk.rec.chunk_end = wk.rec.end(ctx, Stage::Transpose, t0, 0);
    });
    if on {
        workers[0].rec.end_split(ctx, t_split);
    }
}

/// Multiplies a projection's output by its GGUF `.scale` factor (see `LayerWeights::out_scales`).
#[inline]
pub(super) fn scale_in_place(v: &mut [f32], s: f32) {
    if s != 1.0 {
        v.iter_mut().for_each(|x| *x *= s);
    }
}

pub(super) fn record_matmul(
    rec: &mut ThreadRecorder,
    scratch: &mut KernelScratch,
    kernel: Kernel,
    ctx: SpanCtx,
    t0: u64,
    bytes: u64,
) -> u64 {
    let t1 = clock::now();
    let xnor = kernel.family() == KernelFamily::Xnor;
    if kernel.form() == KernelForm::Split && kernel.family() != KernelFamily::Scalar {
        let ticks = scratch.take_split_ticks();
        let (a, _) = ticks.divide(t1 - t0);
        let (first, second) = if xnor { (Stage::Xnor, Stage::Popcount) } else { (Stage::Unpack, Stage::Dot) };
        rec.record(ctx, first, t0, t0 + a, bytes, ticks.tiles);
        rec.record(ctx, second, t0 + a, t1, 0, ticks.tiles);
    } else {
        // The lookup forms' table building, at the start of a thread's first block for new
        // activations, is its own span.
        let tables = scratch.take_table_ticks().min(t1 - t0);
        if tables > 0 {
            rec.record(ctx, Stage::Tables, t0, t0 + tables, 0, 1);
        }
        let stage = if xnor {
            Stage::XnorPopcount
        } else if kernel.uses_lut() {
            Stage::Lookup
        } else {
            Stage::UnpackDot
        };
        rec.record(ctx, stage, t0 + tables, t1, bytes, 1);
    }
    t1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::Tq2Matrix;

    /// Each worker of a decode step's dispatch asks for the start of the rows the next dispatch
    /// will give it first: in the right part of a Q, K, V concatenation, and in both the gate
    /// and the up projection of a pair. The caller and a prompt's rows ask for nothing.
    #[test]
    fn workers_ask_for_their_first_rows_of_the_next_matmul() {
        assert_eq!(BLOCK_ROWS, 16, "the rows below assume blocks of 16");
        let tq2 = |rows, seed| PackedWeights::Tq2(Tq2Matrix::random(rows, 256, 0.5, seed).unwrap());
        let (q, k, v) = (tq2(64, 1), tq2(32, 2), tq2(32, 3));
        let kern = kernel_for_rows(None, &q, 1);
        let first = |w: &PackedWeights, row: usize| Ahead::one(kern.stream_from(w, row).window(0, AHEAD_BYTES));
        // 128 rows in 8 blocks for 3 threads: blocks 0..3, 3..6 and 6..8, so rows 0, 48, 96:
        // the caller, row 48 of Q, row 0 of V.
        let qkv = Upcoming::rows(None, 1, [&q, &k, &v]);
        assert_eq!(qkv.ahead(3, 0), Ahead::NONE);
        assert_eq!(qkv.ahead(3, 1), first(&q, 48));
        assert_eq!(qkv.ahead(3, 2), first(&v, 0));
        // 2 threads: blocks 4..8, row 64: row 0 of K.
        assert_eq!(qkv.ahead(2, 1), first(&k, 0));
        let (gate, up) = (tq2(96, 4), tq2(96, 5));
        let pair = Upcoming::pair(None, 8, &gate, &up);
        // 96 rows in 6 blocks for 2 threads: row 48 of each.
        let half = |w: &PackedWeights| kern.stream_from(w, 48).window(0, AHEAD_BYTES / 2);
        assert_eq!(pair.ahead(2, 1), Ahead([half(&gate), half(&up)]));
        assert!(!half(&gate).is_empty());
        assert_eq!(Upcoming::rows(None, PREFETCH_ROWS + 1, [&q]).ahead(2, 1), Ahead::NONE, "a prompt's rows");
        assert_eq!(Upcoming::pair(None, PREFETCH_ROWS + 1, &gate, &up).ahead(2, 1), Ahead::NONE);
    }
}
