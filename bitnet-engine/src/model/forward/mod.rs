//! The fast forward pass: batched prefill (the prompt as a matrix) and batched decode (B
//! sequences in lock-step), with preallocated buffers, the worker pool and the SIMD kernels.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::activations::ActivationBatch;
use crate::attention::KvPrecision;
use crate::attention::{decode_kv_rows, encoded_groups_read_once, ENCODED_CHUNK_VALUES};
use crate::error::{Error, Result};
use crate::formats::{EmbeddingRows, PackedWeights, WeightFormat};
use crate::instrument::{clock, Level, Op, Phase, SpanCtx, Stage, ThreadRecorder};
use crate::matmul::{head_matmul, q6k_groups_used, Kernel, KernelFamily, KernelForm, KernelScratch};
use crate::model::config::{FfnActivation, ModelConfig};
use crate::model::kv_cache::{KvCache, KvRows};
use crate::model::weights::{LayerWeights, Weights};
use crate::ops::portable::{add_in_place, rope, rope_angles, transpose_into};
use crate::ops::{rms_norm_in_place, rms_norm_rows, softmax_in_place, transpose_8_cols_to_rows, transpose_cols_into};
use crate::pool::{chunk_range, Ahead, Columns, ScatterTarget, WorkerPool};
use crate::simd::prefetch_l2;

mod attention_block;
mod linear;

use attention_block::*;
use linear::*;

/// A model: its config and weights.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    /// Which model a [`State`] was made for (a clone is the same model).
    id: u64,
}

impl Model {
    pub fn new(config: ModelConfig, weights: Weights) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self { config, weights, id: NEXT_ID.fetch_add(1, Ordering::Relaxed) }
    }

    /// A preset with synthetic weights in `format`.
    pub fn synthetic(preset: &str, format: WeightFormat, seed: u64, threads: usize) -> Result<Self> {
        let config = ModelConfig::preset(preset)?;
        let weights = Weights::synthetic(&config, format, seed, threads)?;
        Ok(Self::new(config, weights))
    }
}

/// What every block of one forward call reads about its rows: row i is sequence `seqs[i]` at
/// position `positions[i]`, in layer `layer`, with the call's span context.
struct Rows<'a> {
    seqs: &'a [usize],
    positions: &'a [usize],
    layer: usize,
    ctx: SpanCtx,
}

/// How a [`State`] is built.
#[derive(Debug, Clone)]
pub struct StateOptions {
    /// Sequences decoded in lock-step (batch size).
    pub sequences: usize,
    /// KV cache positions per sequence.
    pub context: usize,
    pub kv_precision: KvPrecision,
    /// Worker threads in all (the calling thread is one of them).
    pub threads: usize,
    /// Pin worker threads to cores.
    pub pin: bool,
    /// Kernel for the linear layers; `None` = the best one for the weight format.
    pub kernel: Option<Kernel>,
    /// Most rows one `forward` call takes (prefill chunk size; ≥ `sequences`).
    pub max_rows: usize,
}

impl StateOptions {
    pub fn new(sequences: usize, context: usize, kv_precision: KvPrecision, threads: usize) -> Self {
        Self { sequences, context, kv_precision, threads, pin: false, kernel: None, max_rows: sequences.max(64) }
    }
}

/// Which rows of a `forward` call get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every row (e.g. to compare prefill logits with another implementation).
    All,
    /// Only the last row (a prompt's prefill before generation).
    Last,
    /// No row.
    None,
}

/// What each thread of the pool owns: kernel and attention scratch, and its span recorder.
#[derive(Debug, Clone)]
struct Worker {
    kernel: KernelScratch,
    /// `[context]` attention weights.
    scores: Vec<f32>,
    /// `[ENCODED_CHUNK_VALUES]` quantized keys or values decoded for attention.
    decoded: Vec<f32>,
    /// `[context, head_dim]` each, with an encoded KV cache (else empty): one head's keys and
    /// values decoded once for all the rows of a prompt that attend to them.
    prompt_keys: Vec<f32>,
    prompt_values: Vec<f32>,
    /// `[PROMPT_TILE_ROWS, head_dim]`: the query vectors of a [`prompt_tile`].
    q_tile: Vec<f32>,
    rec: ThreadRecorder,
}

/// The run state: KV cache, worker pool and every buffer a forward pass needs, allocated once.
pub struct State {
    cfg: ModelConfig,
    /// The [`Model`] this state was made for.
    model_id: u64,
    max_rows: usize,
    /// The kernel forced for every linear layer, if any.
    kernel: Option<Kernel>,
    /// Whether some layer runs an xnor kernel (which reads activation bit-planes).
    extras: ActivationExtras,
    pool: WorkerPool,
    kv: KvCache,
    /// `[rows, hidden]` residual stream.
    x: Vec<f32>,
    /// `[rows, hidden]` normed input of a projection.
    xb: Vec<f32>,
    /// `[rows, q_dim]` queries, then attention output.
    q: Vec<f32>,
    /// `[rows, q_dim]` attention output.
    att: Vec<f32>,
    /// `[rows, kv_dim]` keys and values of the rows being processed.
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[rows, ffn]` the gated activation SiLU/ReLU²(gate) × up.
    gate: Vec<f32>,
    /// `[rows, hidden]` output of the O and down projections.
    proj: Vec<f32>,
    /// `[max(N), rows]` kernel output, row-major by output row (N: Q+K+V together, gate and up
    /// together, or the LM head).
    mm: Vec<f32>,
    /// `[rows, vocab]` logits.
    logits: Vec<f32>,
    /// Quantized activations of width hidden (= q_dim) and ffn.
    act_hidden: ActivationBatch,
    act_ffn: ActivationBatch,
    /// One per thread (thread 0 is the caller).
    workers: Vec<Worker>,
    /// Forward calls since the recorders were last reset (the `step` of spans).
    step: u32,
    /// Phase of the last forward call (the `sample` span's).
    last_phase: Phase,
    /// `[head_dim / 2]` RoPE inverse frequencies.
    inv_freq: Vec<f32>,
    /// `[max_rows, head_dim / 2]` each: cos and sin of the RoPE angles of each row of the
    /// current call.
    rope_cos: Vec<f32>,
    rope_sin: Vec<f32>,
    /// Rows of the last call that got logits, in `logits`.
    logit_rows: Range<usize>,
    /// `[max_rows]` sequence and position of each row, for callers that build rows (prefill).
    pub(crate) row_seqs: Vec<usize>,
    pub(crate) row_positions: Vec<usize>,
}

impl State {
    pub fn new(model: &Model, opts: &StateOptions) -> Result<Self> {
        let cfg = model.config.clone();
        if opts.max_rows < opts.sequences {
            return Err(Error::Shape(format!(
                "max_rows ({}) must be at least the number of sequences ({})",
                opts.max_rows, opts.sequences
            )));
        }
        // A forced kernel must read every layer; otherwise each layer gets the best kernel for
        // its own format (a file may mix formats).
        if let Some(k) = opts.kernel {
            for (l, lw) in model.weights.layers.iter().enumerate() {
                if let Some(w) = lw.linears().iter().find(|w| !k.family().accepts(w.format())) {
                    return Err(Error::Unsupported(format!(
                        "kernel {k} cannot read layer {l}'s {} weights",
                        w.format()
                    )));
                }
            }
        }
        let kernel = opts.kernel;
        let kernels = || model.weights.layers.iter().flat_map(|l| l.linears()).map(|w| kernel_for(kernel, w));
        let extras = ActivationExtras { planes: kernels().any(|k| k.family() == crate::matmul::KernelFamily::Xnor) };
        // Repacks made now, in parallel, rather than by the first matmul of each matrix mid-run.
        model.weights.prepare_repacks(kernel, opts.threads);
        let rows = opts.max_rows;
        let kv = KvCache::new(&cfg, opts.kv_precision, opts.sequences, opts.context)?;
        let pool = WorkerPool::new(opts.threads, opts.pin)?;
        let hd = cfg.head_dim();
        // Prompt attention decodes an encoded cache's rows into per-thread f32 buffers.
        let encoded_kv = opts.kv_precision.is_encoded();
        // The largest kernel output: a projection, or the LM head's [vocab, rows].
        // The widest matmul output: Q, K and V together, gate and up together, or the LM head.
        let max_n = (cfg.q_dim() + 2 * cfg.kv_dim()).max(2 * cfg.ffn).max(cfg.hidden).max(cfg.vocab);
        let mut act_hidden = ActivationBatch::new(rows, cfg.hidden)?;
        let act_ffn = ActivationBatch::new(rows, cfg.ffn)?;
        if let Some(head) = model.weights.grouped_head(kernel, opts.sequences) {
            // A batch's logits read the head's 16-row groups (made here, once per model) and
            // the tokens' offsets (`head_q6k_offsets`).
            head.prepare_groups();
            act_hidden.reserve_q6k_offsets();
        }
        let padded = act_hidden.padded_cols().max(act_ffn.padded_cols());
        Ok(Self {
            model_id: model.id,
            max_rows: rows,
            kernel,
            kv,
            x: vec![0.0; rows * cfg.hidden],
            xb: vec![0.0; rows * cfg.hidden],
            q: vec![0.0; rows * cfg.q_dim()],
            att: vec![0.0; rows * cfg.q_dim()],
            k: vec![0.0; rows * cfg.kv_dim()],
            v: vec![0.0; rows * cfg.kv_dim()],
            gate: vec![0.0; rows * cfg.ffn],
            proj: vec![0.0; rows * cfg.hidden],
            mm: vec![0.0; rows * max_n],
            logits: vec![0.0; rows * cfg.vocab],
            act_hidden,
            act_ffn,
            workers: (0..opts.threads)
                .map(|i| Worker {
                    kernel: KernelScratch::for_kernels(padded, rows, kernels()),
                    scores: vec![0.0; opts.context * GROUP_HEADS_MAX.max(PROMPT_TILE_ROWS)],
                    decoded: vec![0.0; ENCODED_CHUNK_VALUES],
                    prompt_keys: vec![0.0; if encoded_kv { opts.context * hd } else { 0 }],
                    prompt_values: vec![0.0; if encoded_kv { opts.context * hd } else { 0 }],
                    q_tile: vec![0.0; PROMPT_TILE_ROWS * hd],
                    rec: ThreadRecorder::off(i),
                })
                .collect(),
            step: 0,
            last_phase: Phase::Prefill,
            inv_freq: (0..hd / 2).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / hd as f32)).collect(),
            rope_cos: vec![0.0; rows * hd / 2],
            rope_sin: vec![0.0; rows * hd / 2],
            logit_rows: 0..0,
            extras,
            row_seqs: Vec::with_capacity(rows),
            row_positions: Vec::with_capacity(rows),
            pool,
            cfg,
        })
    }

    /// The kernel the first layer's linear weights run on (all layers, unless a file mixes
    /// formats and no kernel was forced).
    pub fn kernel(&self, model: &Model) -> Kernel {
        kernel_for(self.kernel, &model.weights.layers[0].wq)
    }
    /// Most rows one `forward` call takes.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }
    /// The worker pool (for work that should run on the decode's own threads, such as a
    /// bandwidth probe between steps).
    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
    pub fn pinned(&self) -> bool {
        self.pool.pinned()
    }

    /// Switches per-stage spans on or off (allocates the recorders; see [`crate::instrument`]).
    /// `timeline_capacity` events per thread are kept at [`Level::Timeline`].
    pub fn set_instrument(&mut self, level: Level, timeline_capacity: usize) {
        let layers = self.cfg.layers;
        for (i, w) in self.workers.iter_mut().enumerate() {
            w.rec = ThreadRecorder::new(i, level, layers, timeline_capacity);
            w.kernel.set_time_stages(w.rec.on());
            w.kernel.take_split_ticks();
            w.kernel.take_table_ticks();
        }
        self.step = 0;
    }

    /// Forgets what was recorded so far (keeps the level and the buffers).
    pub fn reset_instrument(&mut self) {
        self.workers.iter_mut().for_each(|w| w.rec.clear());
        self.step = 0;
    }

    /// The span recorder of each thread (thread 0 is the caller).
    pub fn recorders(&self) -> impl Iterator<Item = &ThreadRecorder> {
        self.workers.iter().map(|w| &w.rec)
    }

    /// Runs `f` on this state (e.g. choosing the next token from its logits) as a `sample`
    /// span of the last forward call.
    pub fn time_sample<R>(&mut self, f: impl FnOnce(&Self) -> R) -> R {
        let t0 = self.workers[0].rec.start();
        let r = f(self);
        let ctx = SpanCtx::new(self.last_phase, self.step.saturating_sub(1));
        self.workers[0].rec.end(ctx, Stage::Sample, t0, 0);
        r
    }

    /// Logits of row `i` of the last `forward` call (if it computed them).
    pub fn logits(&self, i: usize) -> Option<&[f32]> {
        let v = self.cfg.vocab;
        self.logit_rows.contains(&i).then(|| &self.logits[i * v..(i + 1) * v])
    }

    /// Runs the model on `tokens.len()` rows: row i is token `tokens[i]` of sequence `seqs[i]`
    /// at position `positions[i]`. Each row's key and value are cached before attention, and
    /// row i attends to positions `0..=positions[i]` of its sequence, so one call can hold a
    /// whole prompt (causal prefill) or one token of each of B sequences (batched decode).
    /// `model` must be the one this state was made for.
    pub fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        seqs: &[usize],
        positions: &[usize],
        logits_for: LogitsFor,
    ) -> Result<()> {
        self.check_model(model)?;
        self.check_rows(tokens, seqs, positions)?;
        let w = &model.weights;
        let rows = tokens.len();
        let ctx = self.begin_step(seqs, positions);
        self.embed(w, tokens, ctx);
        self.act_hidden.set_batch(rows)?;
        self.act_ffn.set_batch(rows)?;
        self.rope_angles(positions, ctx);
        for (l, lw) in w.layers.iter().enumerate() {
            let rows = Rows { seqs, positions, layer: l, ctx };
            self.attention_block(lw, &rows)?;
            // The next layer's first norm and projections (or the output norm), which the last
            // projection of this block prefetches.
            let next = w.layers.get(l + 1);
            self.ffn_block(lw, next.map_or(&w.output_norm, |n| &n.attn_norm), next, &rows)?;
        }
        self.lm_head(w, logits_for, rows, ctx)
    }

    /// The span context of this call, and the step and phase the spans and `time_sample` use.
    fn begin_step(&mut self, seqs: &[usize], positions: &[usize]) -> SpanCtx {
        let on = self.workers[0].rec.on();
        let ctx = if on { SpanCtx::new(phase_of(seqs, positions), self.step) } else { SpanCtx::new(Phase::Decode, 0) };
        self.step = self.step.wrapping_add(1);
        self.last_phase = ctx.phase;
        ctx
    }

    /// The residual stream of each row: its token's embedding.
    fn embed(&mut self, w: &Weights, tokens: &[u32], ctx: SpanCtx) {
        let h = self.cfg.hidden;
        let emb_bytes = (tokens.len() * w.token_embd.row_bytes()) as u64;
        self.workers[0].rec.time(ctx, Stage::Embed, emb_bytes, || {
            for (r, &t) in tokens.iter().enumerate() {
                w.token_embd.dequantize_row(t as usize, &mut self.x[r * h..(r + 1) * h]);
            }
        });
    }

    /// The rotation angles of each row's position, once for all layers (a rope span of no
    /// layer): a token's 24–30 layers had each computed the same sines and cosines again.
    fn rope_angles(&mut self, positions: &[usize], ctx: SpanCtx) {
        let half = self.cfg.head_dim() / 2;
        self.workers[0].rec.time(ctx, Stage::Rope, 0, || {
            for (r, &p) in positions.iter().enumerate() {
                let (c, s) = (&mut self.rope_cos[r * half..][..half], &mut self.rope_sin[r * half..][..half]);
                rope_angles(p, &self.inv_freq, c, s);
            }
        });
    }

    /// One layer's attention block: norm, Q/K/V, RoPE, KV write, attention, sub-norm, O and the
    /// residual add.
    fn attention_block(&mut self, lw: &LayerWeights, at: &Rows<'_>) -> Result<()> {
        let cfg = &self.cfg;
        let (h, qd, kvd, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim());
        let (rows, l, half) = (at.seqs.len(), at.layer, hd / 2);
        let (ctx, attn) = (at.ctx, at.ctx.at(at.layer, Op::Attn));
        if rows <= PREFETCH_ROWS {
            for r in 0..rows {
                self.kv.prefetch_write(l, at.seqs[r], at.positions[r]);
            }
        }
        let rec = &mut self.workers[0].rec;
        rec.time(attn, Stage::Norm, 0, || {
            rms_norm_rows(&self.x[..rows * h], &lw.attn_norm, cfg.norm_eps, &mut self.xb[..rows * h])
        });
        rec.time(attn, Stage::Quantize, 0, || quantize(self.extras, &mut self.act_hidden, &self.xb[..rows * h]))?;
        linear_multi(
            Dispatch { pool: &self.pool, forced: self.kernel, mm: &mut self.mm, workers: &mut self.workers },
            [
                Projection { w: &lw.wq, out_scale: lw.out_scales[0], ctx: ctx.at(l, Op::Q) },
                Projection { w: &lw.wk, out_scale: lw.out_scales[1], ctx: ctx.at(l, Op::K) },
                Projection { w: &lw.wv, out_scale: lw.out_scales[2], ctx: ctx.at(l, Op::V) },
            ],
            &self.act_hidden,
            [&mut self.q[..rows * qd], &mut self.k[..rows * kvd], &mut self.v[..rows * kvd]],
            &NextInputs { residual: None, norm: lw.attn_sub_norm.as_deref(), norm_out: None, act: None, n_rows: rows },
        )?;
        let rec = &mut self.workers[0].rec;
        rec.time(attn, Stage::Rope, 0, || {
            for r in 0..rows {
                let (c, s) = (&self.rope_cos[r * half..][..half], &self.rope_sin[r * half..][..half]);
                rope(&mut self.q[r * qd..(r + 1) * qd], c, s);
                rope(&mut self.k[r * kvd..(r + 1) * kvd], c, s);
            }
        });
        let kv_token_bytes = self.kv.precision().bytes_per_vector(hd) as u64 * 2 * cfg.kv_heads as u64;
        rec.time(attn, Stage::KvWrite, kv_token_bytes * rows as u64, || {
            for r in 0..rows {
                for kh in 0..cfg.kv_heads {
                    let s = r * kvd + kh * hd..r * kvd + (kh + 1) * hd;
                    self.kv.write(l, at.seqs[r], kh, at.positions[r], &self.k[s.clone()], &self.v[s]);
                }
            }
        });
        attention(
            Dispatch { pool: &self.pool, forced: self.kernel, mm: &mut self.mm, workers: &mut self.workers },
            &AttentionInputs {
                cfg,
                kv: &self.kv,
                layer: l,
                q: &self.q[..rows * qd],
                seqs: at.seqs,
                positions: at.positions,
                ctx: attn,
            },
            &mut self.att[..rows * qd],
            Upcoming::rows(self.kernel, rows, [&lw.wo]),
        );
        let o_ctx = ctx.at(l, Op::O);
        let rec = &mut self.workers[0].rec;
        if let Some(sub) = &lw.attn_sub_norm {
            rec.time(o_ctx, Stage::Norm, 0, || rms_norm_in_place(&mut self.att[..rows * qd], sub, cfg.norm_eps));
        }
        rec.time(o_ctx, Stage::Quantize, 0, || quantize(self.extras, &mut self.act_hidden, &self.att[..rows * qd]))?;
        linear(
            Dispatch { pool: &self.pool, forced: self.kernel, mm: &mut self.mm, workers: &mut self.workers },
            Projection { w: &lw.wo, out_scale: lw.out_scales[3], ctx: o_ctx },
            &self.act_hidden,
            &mut self.proj[..rows * h],
            &NextInputs {
                residual: Some(&self.x[..rows * h]),
                norm: Some(&lw.ffn_norm),
                norm_out: Some(&self.xb[..rows * h]),
                act: Some(&self.act_hidden),
                n_rows: rows,
            },
            Upcoming::pair(self.kernel, rows, &lw.w_gate, &lw.w_up),
        )?;
        let rec = &mut self.workers[0].rec;
        rec.time(attn, Stage::Residual, 0, || add_in_place(&mut self.x[..rows * h], &self.proj[..rows * h]));
        Ok(())
    }

    /// One layer's feed-forward block: norm, gate and up with the gated activation, sub-norm,
    /// down and the residual add. `next_norm` and `next` are what follows it (the next layer's
    /// attention norm and its Q, K, V, or the output norm), which the down projection prefetches.
    fn ffn_block(
        &mut self,
        lw: &LayerWeights,
        next_norm: &[f32],
        next: Option<&LayerWeights>,
        at: &Rows<'_>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, ffn, rows, l, ctx) = (cfg.hidden, cfg.ffn, at.seqs.len(), at.layer, at.ctx);
        let (ffn_ctx, down_ctx) = (ctx.at(l, Op::Ffn), ctx.at(l, Op::Down));
        let rec = &mut self.workers[0].rec;
        rec.time(ffn_ctx, Stage::Norm, 0, || {
            rms_norm_rows(&self.x[..rows * h], &lw.ffn_norm, cfg.norm_eps, &mut self.xb[..rows * h])
        });
        rec.time(ffn_ctx, Stage::Quantize, 0, || quantize(self.extras, &mut self.act_hidden, &self.xb[..rows * h]))?;
        linear_gated(
            Dispatch { pool: &self.pool, forced: self.kernel, mm: &mut self.mm, workers: &mut self.workers },
            Projection { w: &lw.w_gate, out_scale: lw.out_scales[4], ctx: ctx.at(l, Op::Gate) },
            Projection { w: &lw.w_up, out_scale: lw.out_scales[5], ctx: ctx.at(l, Op::Up) },
            (cfg.activation, ffn_ctx),
            &self.act_hidden,
            &mut self.gate[..rows * ffn],
            &NextInputs {
                residual: None,
                norm: lw.ffn_sub_norm.as_deref(),
                norm_out: None,
                act: Some(&self.act_ffn),
                n_rows: rows,
            },
            Upcoming::rows(self.kernel, rows, [&lw.w_down]),
        )?;
        let rec = &mut self.workers[0].rec;
        if let Some(sub) = &lw.ffn_sub_norm {
            rec.time(down_ctx, Stage::Norm, 0, || rms_norm_in_place(&mut self.gate[..rows * ffn], sub, cfg.norm_eps));
        }
        rec.time(down_ctx, Stage::Quantize, 0, || quantize(self.extras, &mut self.act_ffn, &self.gate[..rows * ffn]))?;
        linear(
            Dispatch { pool: &self.pool, forced: self.kernel, mm: &mut self.mm, workers: &mut self.workers },
            Projection { w: &lw.w_down, out_scale: lw.out_scales[6], ctx: down_ctx },
            &self.act_ffn,
            &mut self.proj[..rows * h],
            &NextInputs {
                residual: Some(&self.x[..rows * h]),
                norm: Some(next_norm),
                norm_out: Some(&self.xb[..rows * h]),
                act: Some(&self.act_hidden),
                n_rows: rows,
            },
            next.map_or(Upcoming::Nothing, |n| Upcoming::rows(self.kernel, rows, [&n.wq, &n.wk, &n.wv])),
        )?;
        self.workers[0]
            .rec
            .time(ffn_ctx, Stage::Residual, 0, || add_in_place(&mut self.x[..rows * h], &self.proj[..rows * h]));
        Ok(())
    }

    /// The output norm and the LM head, for the rows `logits_for` asks for (of `rows`).
    fn lm_head(&mut self, w: &Weights, logits_for: LogitsFor, rows: usize, ctx: SpanCtx) -> Result<()> {
        let (cfg, h) = (&self.cfg, self.cfg.hidden);
        self.logit_rows = match logits_for {
            LogitsFor::All => 0..rows,
            LogitsFor::Last => rows - 1..rows,
            LogitsFor::None => 0..0,
        };
        if self.logit_rows.is_empty() {
            return Ok(());
        }
        let on = self.workers[0].rec.on();
        let out_ctx = ctx.with_op(Op::Output);
        let lr = self.logit_rows.clone();
        let n = lr.len();
        let rec = &mut self.workers[0].rec;
        rec.time(out_ctx, Stage::Norm, 0, || {
            rms_norm_rows(&self.x[lr.start * h..lr.end * h], &w.output_norm, cfg.norm_eps, &mut self.xb[..n * h])
        });
        self.act_hidden.set_batch(n)?;
        let head = w.lm_head();
        let isa = kernel_for(self.kernel, &w.layers[0].wq).isa();
        // What the AVX-512 head kernel on two or more tokens reads besides the head's 16-row
        // groups (made for batched states; see `q6k_rows_matmul`).
        let head_q6k_offsets = matches!(head, EmbeddingRows::Q6K(m) if m.groups().is_some()) && q6k_groups_used(isa, n);
        rec.time(out_ctx, Stage::Quantize, 0, || {
            self.act_hidden.quantize(&self.xb[..n * h])?;
            if head_q6k_offsets {
                self.act_hidden.build_q6k_offsets();
            }
            Ok::<_, Error>(())
        })?;
        let vocab = cfg.vocab;
        let act = &self.act_hidden;
        let head_bytes = head.byte_len() as u64;
        // `mm` holds [vocab, n]; the LM head's rows are split across threads. One row
        // (decode) is written straight into its logits: `[vocab, 1]` is `[1, vocab]`.
        let base = lr.start * vocab;
        let direct = n == 1;
        let dst = if direct { &mut self.logits[base..base + vocab] } else { &mut self.mm[..vocab * n] };
        let t_split = rec.start();
        rec.begin_split(t_split);
        self.pool.split_blocks(
            dst,
            n,
            BLOCK_ROWS,
            &mut self.workers,
            |_| Ahead::NONE,
            |blocks, wk| {
                let t0 = wk.rec.start();
                let mut bytes = None;
                while let Some((first, chunk)) = blocks.next_block() {
                    let r = first..first + chunk.len() / n;
                    *bytes.get_or_insert(0) += head_bytes * r.len() as u64 / vocab as u64;
                    head_matmul(isa, head, act, r, chunk).expect("shapes checked when the state was built");
                }
                if let Some(bytes) = bytes {
                    wk.rec.chunk_start = t0;
                    wk.rec.chunk_end = wk.rec.end(out_ctx, Stage::LmHead, t0, bytes);
                }
            },
        );
        let rec = &mut self.workers[0].rec;
        if on {
            rec.end_split(out_ctx, t_split);
        }
        if !direct {
            let logits = &mut self.logits[base..base + n * vocab];
            transpose_result(&self.pool, &self.mm[..vocab * n], vocab, n, logits, &mut self.workers, out_ctx);
        }
        self.logit_rows = lr;
        Ok(())
    }

    /// Whether `model` is the one this state was made for: its buffers, cache and kernels
    /// are sized and chosen for that model's config and weights.
    fn check_model(&self, model: &Model) -> Result<()> {
        if model.id != self.model_id {
            return Err(Error::Value(format!(
                "forward: this state was made for another model (make a State for each Model: State::new(model, ..)); \
                 got a {} model",
                model.config.name
            )));
        }
        Ok(())
    }

    fn check_rows(&self, tokens: &[u32], seqs: &[usize], positions: &[usize]) -> Result<()> {
        let rows = tokens.len();
        if rows == 0 || rows > self.max_rows || seqs.len() != rows || positions.len() != rows {
            return Err(Error::Shape(format!(
                "forward: need 1..={} rows with one sequence and position each, got {} tokens, {} sequences, {} positions",
                self.max_rows,
                rows,
                seqs.len(),
                positions.len()
            )));
        }
        for i in 0..rows {
            if tokens[i] as usize >= self.cfg.vocab {
                return Err(Error::Value(format!(
                    "token id {} is outside the vocabulary (0..{})",
                    tokens[i], self.cfg.vocab
                )));
            }
            if seqs[i] >= self.kv.sequences() {
                return Err(Error::Shape(format!("sequence {} is outside 0..{}", seqs[i], self.kv.sequences())));
            }
            if positions[i] >= self.kv.context() {
                return Err(Error::Shape(format!(
                    "position {} is beyond the context length {} of this state",
                    positions[i],
                    self.kv.context()
                )));
            }
        }
        Ok(())
    }
}

/// The phase of a forward call: a prompt (rows that share a sequence, or start one) or decode.
fn phase_of(seqs: &[usize], positions: &[usize]) -> Phase {
    if positions.contains(&0) || seqs.windows(2).any(|p| p[0] == p[1]) {
        Phase::Prefill
    } else {
        Phase::Decode
    }
}

/// The index of the largest logit (the first one on ties; a NaN never wins, unless it is the
/// first logit): see `ops::argmax_portable`.
pub fn argmax(logits: &[f32]) -> u32 {
    crate::ops::argmax(logits)
}
