//! The fast forward pass: batched prefill (the prompt as a matrix) and batched decode (B
//! sequences in lock-step), with preallocated buffers, the worker pool and the SIMD kernels.

use std::ops::Range;

use crate::activations::ActivationBatch;
use crate::attention::KvPrecision;
use crate::attention::{
    attention_scores, attention_scores_encoded, attention_scores_group, attention_scores_group_encoded,
    attention_weighted_sum, attention_weighted_sum_encoded, attention_weighted_sum_group,
    attention_weighted_sum_group_encoded, decode_kv_rows, encoded_groups_read_once, ENCODED_CHUNK_VALUES,
};
use crate::error::{Error, Result};
use crate::formats::{EmbeddingRows, PackedWeights, WeightFormat};
use crate::instrument::{clock, Level, Op, Phase, SpanCtx, Stage, ThreadRecorder};
use crate::matmul::{head_matmul, q6k_groups_used, Kernel, KernelFamily, KernelForm, KernelScratch};
use crate::model::config::{FfnActivation, ModelConfig};
use crate::model::kv_cache::{KvCache, KvRows};
use crate::model::weights::Weights;
use crate::ops::portable::{add_in_place, rope, rope_angles, transpose_into};
use crate::ops::{rms_norm_in_place, rms_norm_rows, softmax_in_place, transpose_8_cols_to_rows, transpose_cols_into};
use crate::pool::{chunk_range, Ahead, Columns, ScatterTarget, WorkerPool};
use crate::simd::prefetch_l2;

/// A model: its config and weights.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
}

impl Model {
    /// A preset with synthetic weights in `format`.
    pub fn synthetic(preset: &str, format: WeightFormat, seed: u64, threads: usize) -> Result<Self> {
        let config = ModelConfig::preset(preset)?;
        let weights = Weights::synthetic(&config, format, seed, threads)?;
        Ok(Self { config, weights })
    }
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
    pub fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        seqs: &[usize],
        positions: &[usize],
        logits_for: LogitsFor,
    ) -> Result<()> {
        let rows = tokens.len();
        self.check_rows(tokens, seqs, positions)?;
        let cfg = &self.cfg;
        let (h, qd, kvd, ffn, hd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim());
        let w = &model.weights;
        let on = self.workers[0].rec.on();
        let ctx = if on { SpanCtx::new(phase_of(seqs, positions), self.step) } else { SpanCtx::new(Phase::Decode, 0) };
        self.step = self.step.wrapping_add(1);
        self.last_phase = ctx.phase;
        let emb_bytes = (rows * w.token_embd.row_bytes()) as u64;
        self.workers[0].rec.time(ctx, Stage::Embed, emb_bytes, || {
            for (r, &t) in tokens.iter().enumerate() {
                w.token_embd.dequantize_row(t as usize, &mut self.x[r * h..(r + 1) * h]);
            }
        });
        self.act_hidden.set_batch(rows)?;
        self.act_ffn.set_batch(rows)?;
        let kv_token_bytes = self.kv.precision().bytes_per_vector(hd) as u64 * 2 * cfg.kv_heads as u64;
        // The rotation angles of each row's position, once for all layers (a rope span of no
        // layer): a token's 24–30 layers had each computed the same sines and cosines again
        // (large, one token: the rope stage 23.1 → 17.8 µs a step, on the caller).
        let half = hd / 2;
        self.workers[0].rec.time(ctx, Stage::Rope, 0, || {
            for r in 0..rows {
                let (c, s) = (&mut self.rope_cos[r * half..][..half], &mut self.rope_sin[r * half..][..half]);
                rope_angles(positions[r], &self.inv_freq, c, s);
            }
        });
        for (l, lw) in w.layers.iter().enumerate() {
            let (attn, ffn_ctx) = (ctx.at(l, Op::Attn), ctx.at(l, Op::Ffn));
            if rows <= PREFETCH_ROWS {
                for r in 0..rows {
                    self.kv.prefetch_write(l, seqs[r], positions[r]);
                }
            }
            // Attention block.
            let rec = &mut self.workers[0].rec;
            rec.time(attn, Stage::Norm, 0, || {
                rms_norm_rows(&self.x[..rows * h], &lw.attn_norm, cfg.norm_eps, &mut self.xb[..rows * h])
            });
            rec.time(attn, Stage::Quantize, 0, || quantize(self.extras, &mut self.act_hidden, &self.xb[..rows * h]))?;
            linear_multi(
                &self.pool,
                self.kernel,
                [
                    (&lw.wq, lw.out_scales[0], ctx.at(l, Op::Q)),
                    (&lw.wk, lw.out_scales[1], ctx.at(l, Op::K)),
                    (&lw.wv, lw.out_scales[2], ctx.at(l, Op::V)),
                ],
                &self.act_hidden,
                &mut self.mm,
                [&mut self.q[..rows * qd], &mut self.k[..rows * kvd], &mut self.v[..rows * kvd]],
                &mut self.workers,
                &NextInputs {
                    residual: None,
                    norm: lw.attn_sub_norm.as_deref(),
                    norm_out: None,
                    act: None,
                    n_rows: rows,
                },
            )?;
            let rec = &mut self.workers[0].rec;
            rec.time(attn, Stage::Rope, 0, || {
                for r in 0..rows {
                    let (c, s) = (&self.rope_cos[r * half..][..half], &self.rope_sin[r * half..][..half]);
                    rope(&mut self.q[r * qd..(r + 1) * qd], c, s);
                    rope(&mut self.k[r * kvd..(r + 1) * kvd], c, s);
                }
            });
            rec.time(attn, Stage::KvWrite, kv_token_bytes * rows as u64, || {
                for r in 0..rows {
                    for kh in 0..cfg.kv_heads {
                        let s = r * kvd + kh * hd..r * kvd + (kh + 1) * hd;
                        self.kv.write(l, seqs[r], kh, positions[r], &self.k[s.clone()], &self.v[s]);
                    }
                }
            });
            attention(
                &self.pool,
                cfg,
                &self.kv,
                l,
                &self.q[..rows * qd],
                seqs,
                positions,
                &mut self.att[..rows * qd],
                &mut self.mm,
                &mut self.workers,
                attn,
                Upcoming::rows(self.kernel, rows, [&lw.wo]),
            );
            let o_ctx = ctx.at(l, Op::O);
            let rec = &mut self.workers[0].rec;
            if let Some(sub) = &lw.attn_sub_norm {
                rec.time(o_ctx, Stage::Norm, 0, || rms_norm_in_place(&mut self.att[..rows * qd], sub, cfg.norm_eps));
            }
            rec.time(o_ctx, Stage::Quantize, 0, || {
                quantize(self.extras, &mut self.act_hidden, &self.att[..rows * qd])
            })?;
            linear(
                &self.pool,
                self.kernel,
                &lw.wo,
                lw.out_scales[3],
                &self.act_hidden,
                &mut self.mm,
                &mut self.proj[..rows * h],
                &mut self.workers,
                o_ctx,
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

            // Feed-forward block.
            rec.time(ffn_ctx, Stage::Norm, 0, || {
                rms_norm_rows(&self.x[..rows * h], &lw.ffn_norm, cfg.norm_eps, &mut self.xb[..rows * h])
            });
            rec.time(ffn_ctx, Stage::Quantize, 0, || {
                quantize(self.extras, &mut self.act_hidden, &self.xb[..rows * h])
            })?;
            let down_ctx = ctx.at(l, Op::Down);
            linear_gated(
                &self.pool,
                self.kernel,
                (&lw.w_gate, lw.out_scales[4], ctx.at(l, Op::Gate)),
                (&lw.w_up, lw.out_scales[5], ctx.at(l, Op::Up)),
                cfg.activation,
                ffn_ctx,
                &self.act_hidden,
                &mut self.mm,
                &mut self.gate[..rows * ffn],
                &mut self.workers,
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
                rec.time(down_ctx, Stage::Norm, 0, || {
                    rms_norm_in_place(&mut self.gate[..rows * ffn], sub, cfg.norm_eps)
                });
            }
            rec.time(down_ctx, Stage::Quantize, 0, || {
                quantize(self.extras, &mut self.act_ffn, &self.gate[..rows * ffn])
            })?;
            linear(
                &self.pool,
                self.kernel,
                &lw.w_down,
                lw.out_scales[6],
                &self.act_ffn,
                &mut self.mm,
                &mut self.proj[..rows * h],
                &mut self.workers,
                down_ctx,
                &NextInputs {
                    residual: Some(&self.x[..rows * h]),
                    norm: Some(w.layers.get(l + 1).map_or(&w.output_norm, |next| &next.attn_norm)),
                    norm_out: Some(&self.xb[..rows * h]),
                    act: Some(&self.act_hidden),
                    n_rows: rows,
                },
                w.layers.get(l + 1).map_or(Upcoming::Nothing, |next| {
                    Upcoming::rows(self.kernel, rows, [&next.wq, &next.wk, &next.wv])
                }),
            )?;
            self.workers[0]
                .rec
                .time(ffn_ctx, Stage::Residual, 0, || add_in_place(&mut self.x[..rows * h], &self.proj[..rows * h]));
        }
        // Final norm and LM head for the requested rows.
        self.logit_rows = match logits_for {
            LogitsFor::All => 0..rows,
            LogitsFor::Last => rows - 1..rows,
            LogitsFor::None => 0..0,
        };
        if !self.logit_rows.is_empty() {
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
            let head_q6k_offsets =
                matches!(head, EmbeddingRows::Q6K(m) if m.groups().is_some()) && q6k_groups_used(isa, n);
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

/// BitLinear's activation quantization (the `quantize` stage), plus the bit-planes the xnor
/// kernels read.
fn quantize(extras: ActivationExtras, act: &mut ActivationBatch, x: &[f32]) -> Result<()> {
    act.quantize(x)?;
    if extras.planes {
        act.build_planes();
    }
    Ok(())
}

/// What the linear layers' kernels read beside the int8 activations.
#[derive(Debug, Clone, Copy)]
struct ActivationExtras {
    /// Bit-planes (the xnor kernels). (The lookup forms' tables are each thread's own:
    /// `KernelScratch::tables_of`.)
    planes: bool,
}

/// `out[rows, N] = act × wᵀ`: the kernel writes `[N, rows]` into `mm`, split by output rows
/// across threads, then it is transposed (a no-op copy for one row).
/// The kernel for `w`: the forced one, or the best for its format.
#[inline]
fn kernel_for(forced: Option<Kernel>, w: &PackedWeights) -> Kernel {
    Kernel::for_weights(forced, w)
}

/// The kernel that runs `w` on `rows` tokens ([`Kernel::for_batch`]): what the spans name and
/// count bytes for.
fn kernel_for_rows(forced: Option<Kernel>, w: &PackedWeights, rows: usize) -> Kernel {
    Kernel::for_weights(forced, w).for_batch(rows)
}

#[allow(clippy::too_many_arguments)]
fn linear(
    pool: &WorkerPool,
    forced: Option<Kernel>,
    w: &PackedWeights,
    out_scale: f32,
    act: &ActivationBatch,
    mm: &mut [f32],
    out: &mut [f32],
    workers: &mut [Worker],
    ctx: SpanCtx,
    next: &NextInputs,
    upcoming: Upcoming,
) -> Result<()> {
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
#[allow(clippy::too_many_arguments)]
fn linear_multi<const P: usize>(
    pool: &WorkerPool,
    forced: Option<Kernel>,
    parts: [(&PackedWeights, f32, SpanCtx); P],
    act: &ActivationBatch,
    mm: &mut [f32],
    outs: [&mut [f32]; P],
    workers: &mut [Worker],
    next: &NextInputs,
) -> Result<()> {
    let rows = act.batch();
    let kernels: [Kernel; P] = std::array::from_fn(|i| kernel_for_rows(forced, parts[i].0, rows));
    let ns: [usize; P] = std::array::from_fn(|i| parts[i].0.rows());
    let mut offs = [0usize; P];
    for i in 1..P {
        offs[i] = offs[i - 1] + ns[i - 1];
    }
    let total = offs[P - 1] + ns[P - 1];
    for i in 0..P {
        let m = &mm[offs[i] * rows..(offs[i] + ns[i]) * rows];
        kernels[i].check(parts[i].0, act, &(0..ns[i]), m)?;
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
                            t = record_matmul(&mut wk.rec, &mut wk.kernel, kernels[p], parts[p].2, t, bytes);
                        }
                        open = None;
                    }
                    let (w, out_scale, ctx) = parts[i];
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
                            t = record_matmul(&mut wk.rec, &mut wk.kernel, kernels[p], parts[p].2, t, bytes);
                        }
                        scatter_block(part, &mut cols[i]);
                        t = wk.rec.end(ctx, Stage::Transpose, t, 0);
                    }
                }
            }
            if let (Some((p, bytes)), true) = (open, wk.rec.on()) {
                t = record_matmul(&mut wk.rec, &mut wk.kernel, kernels[p], parts[p].2, t, bytes);
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
        rec.end_split(parts[0].2, t_split);
    }
    if !scatter {
        for (i, out) in outs.into_iter().enumerate() {
            let m = &mm[offs[i] * rows..(offs[i] + ns[i]) * rows];
            transpose_result(pool, m, ns[i], rows, out, workers, parts[i].2);
        }
    }
    Ok(())
}

/// The gate and up projections in one pool dispatch, each thread computing the same rows of
/// both and then the gated activation of those rows (`ffn_act`, in parallel instead of on the
/// caller afterwards). The activated `[n, rows]` result is transposed into `out`.
#[allow(clippy::too_many_arguments)]
fn linear_gated(
    pool: &WorkerPool,
    forced: Option<Kernel>,
    gate: (&PackedWeights, f32, SpanCtx),
    up: (&PackedWeights, f32, SpanCtx),
    activation: FfnActivation,
    act_ctx: SpanCtx,
    act: &ActivationBatch,
    mm: &mut [f32],
    out: &mut [f32],
    workers: &mut [Worker],
    next: &NextInputs,
    upcoming: Upcoming,
) -> Result<()> {
    let (rows, n) = (act.batch(), gate.0.rows());
    if up.0.rows() != n {
        return Err(Error::Shape(format!("gate has {n} rows but up has {}", up.0.rows())));
    }
    let (kg, ku) = (kernel_for_rows(forced, gate.0, rows), kernel_for_rows(forced, up.0, rows));
    let (mg, mu) = mm[..2 * n * rows].split_at_mut(n * rows);
    kg.check(gate.0, act, &(0..n), mg)?;
    ku.check(up.0, act, &(0..n), mu)?;
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    let (gate_bytes, up_bytes) = (kg.bytes_read(gate.0) as u64, ku.bytes_read(up.0) as u64);
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
                kg.matmul(gate.0, act, r.clone(), cg, &mut wk.kernel).expect("arguments checked before the split");
                scale_in_place(cg, gate.1);
                if wk.rec.on() {
                    t = record_matmul(
                        &mut wk.rec,
                        &mut wk.kernel,
                        kg,
                        gate.2,
                        t,
                        gate_bytes * r.len() as u64 / n as u64,
                    );
                }
                ku.matmul(up.0, act, r.clone(), cu, &mut wk.kernel).expect("arguments checked before the split");
                scale_in_place(cu, up.1);
                if wk.rec.on() {
                    t = record_matmul(&mut wk.rec, &mut wk.kernel, ku, up.2, t, up_bytes * r.len() as u64 / n as u64);
                }
                crate::ops::gated_activation(activation, cg, cu);
                t = wk.rec.end(act_ctx, Stage::FfnAct, t, 0);
                if scatter && rows > 1 {
                    scatter_block(block, &mut cols);
                    t = wk.rec.end(gate.2, Stage::Transpose, t, 0);
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
        rec.end_split(gate.2, t_split);
    }
    if !scatter {
        transpose_result(pool, &mm[..n * rows], n, rows, out, workers, gate.2);
    }
    Ok(())
}

/// Output rows per block of the LM head's [`WorkerPool::split_blocks`] (the linear layers take
/// [`Kernel::row_block`], which is this but for the 32-row tiles of the `perm` form). Threads
/// take their own rows in halves of what is left (see `Blocks::next_block`), so a small block
/// costs no more kernel calls than a large one until the end of the run, where it lets a
/// thread that finished take over the other's last rows.
const BLOCK_ROWS: usize = crate::matmul::ROW_BLOCK;

/// Up to this many rows per forward call (decode steps, not prompts), the lines the caller's
/// serial stages between projections will touch are prefetched: the cache lines the layer's
/// `kv_write` will store into, before its projections run, and the residual stream, norm
/// output and activation buffers, by the caller as soon as its share of a projection is done
/// ([`NextInputs`]). A few KiB per row, which a prompt chunk's hundreds of rows would turn into
/// a flood.
const PREFETCH_ROWS: usize = 16;

/// What the caller's serial stages after a projection read and write, asked for in L2 by the
/// caller when its share of the projection is done, while the other threads finish theirs:
/// the weights streamed since had evicted them, and the norm and quantize stages, each on the
/// caller alone while the others wait, met them line by line (large, 2 threads, one token, per
/// call: norm 1.04 → 0.57 µs, quantize 1.36 → 0.52; a token's norms and quantizations 232 →
/// 105 µs, of 5–8 ms).
struct NextInputs<'a> {
    /// The residual stream the add after the projection reads first (row-sized).
    residual: Option<&'a [f32]>,
    /// The next norm's weights: always (a few KiB, however many rows).
    norm: Option<&'a [f32]>,
    /// The norm's output (row-sized).
    norm_out: Option<&'a [f32]>,
    /// The activations the quantize stage writes (row-sized).
    act: Option<&'a ActivationBatch>,
    /// Rows of this forward call: the row-sized buffers only for up to [`PREFETCH_ROWS`].
    n_rows: usize,
}

impl NextInputs<'_> {
    /// In the order of use: the residual stream, the norm's weights, then the norm's output and
    /// the activations.
    fn prefetch(&self) {
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
/// where no thread had read weights for 4–5% of a step (large, one token, two threads). In
/// one process, steps of 0 and 128 KiB interleaved, 80 rounds of 24 steps: median step −2.4%,
/// faster in 53 rounds of 80; 32 and 64 KiB gained less, 256 as much.
const AHEAD_BYTES: usize = 128 * 1024;

/// The matmul a pool dispatch is followed by, for [`AHEAD_BYTES`] (nothing for a prompt's
/// rows: its matmuls are compute-bound).
#[derive(Clone, Copy)]
enum Upcoming<'a> {
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
    fn rows<const P: usize>(forced: Option<Kernel>, rows: usize, ws: [&'a PackedWeights; P]) -> Self {
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
    fn pair(forced: Option<Kernel>, rows: usize, gate: &'a PackedWeights, up: &'a PackedWeights) -> Self {
        if rows > PREFETCH_ROWS {
            return Upcoming::Nothing;
        }
        let (kg, ku) = (kernel_for_rows(forced, gate, rows), kernel_for_rows(forced, up, rows));
        Upcoming::Pair { gate: (kg, gate), up: (ku, up), block: kg.row_block().max(ku.row_block()) }
    }

    /// What worker `i` of `threads` asks for: the start of the run of rows
    /// [`WorkerPool::split_blocks`] will give it first (the caller, thread 0, asks for
    /// nothing: it goes on to the serial stages).
    fn ahead(&self, threads: usize, i: usize) -> Ahead {
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
/// `[n, rows]` for a transpose afterwards. Decode batches: the serial transposes had taken
/// 1.5–3% of a batch-8 step while the other threads waited (2B4T TQ2_0, batch 8, 2 threads,
/// alternating in one process: steps 1.4% faster, in 12 of 16 rounds; the copies take the
/// same thread time, now shared). A prompt's tokens keep the transpose split by tokens
/// ([`transpose_result`]); the scatter was not measured there.
fn scatters(rows: usize) -> bool {
    rows < PARALLEL_TRANSPOSE_ROWS
}

/// Copies a `[len, tokens]` block of a matmul result into its columns of a `[tokens, n]`
/// output (`cols.cols().len() == len`): eight tokens at a time as 8 × 8 tiles, the rest by a
/// plain loop.
fn scatter_block(block: &[f32], cols: &mut Columns<'_, '_, f32>) {
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
const PARALLEL_TRANSPOSE_ROWS: usize = 16;

/// Fewer rows are transposed in parallel too when there are this many floats (1 MiB, an L2):
/// the LM head's `[vocab, B]` logits of a decode batch (2B4T at B = 8: 1M floats, 0.9 ms a
/// step on the caller alone, 1.4% of a two-thread step).
const PARALLEL_TRANSPOSE_FLOATS: usize = 1 << 18;

/// `[n, rows]` → `[rows, n]`: see [`PARALLEL_TRANSPOSE_ROWS`] and [`PARALLEL_TRANSPOSE_FLOATS`].
fn transpose_result(
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
fn scale_in_place(v: &mut [f32], s: f32) {
    if s != 1.0 {
        v.iter_mut().for_each(|x| *x *= s);
    }
}

fn record_matmul(
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

/// The phase of a forward call: a prompt (rows that share a sequence, or start one) or decode.
fn phase_of(seqs: &[usize], positions: &[usize]) -> Phase {
    if positions.contains(&0) || seqs.windows(2).any(|p| p[0] == p[1]) {
        Phase::Prefill
    } else {
        Phase::Decode
    }
}

/// From this many rows on (a prompt chunk), attention over an encoded KV cache runs head by
/// head, so that a thread's items are consecutive rows of one head, and each head's rows are
/// decoded once per thread for all of them. Row by row, every key and value was decoded once per
/// query row: large, 128-token prefill, 2 threads, same-session A/B: int4 KV 222–225 → 252–255
/// tok/s, int8 247–248 → 260–261. A prompt chunk (one sequence, consecutive positions) also
/// attends in tiles of consecutive rows ([`prompt_tile`]) at every precision, unless row-major
/// items already share each key among as many query heads.
const HEAD_MAJOR_ROWS: usize = 4;

/// Most query heads one attention work item reads its KV head's rows for ([`heads_per_item`]).
const GROUP_HEADS_MAX: usize = 4;

/// Query rows of one prompt that attend together in [`prompt_tile`]: the grouped-query
/// kernels' four heads a pass. Prefill tok/s, 2 threads, context 2000, alternating builds:
/// large TQ2_0 f16 KV 195–199 → 280–282, int8 181 → 251, fp8 187 → 242; 2B4T TQ2_0 int8
/// 84–85 → 117–123 (2B4T with f16 keeps its row-major items of four heads).
const PROMPT_TILE_ROWS: usize = 4;

/// Whether the rows are one sequence at consecutive positions (a prompt chunk).
fn is_one_prompt(seqs: &[usize], positions: &[usize]) -> bool {
    seqs.iter().all(|&s| s == seqs[0]) && positions.iter().enumerate().all(|(i, &p)| p == positions[0] + i)
}

/// What every [`prompt_tile`] of one attention call shares.
struct PromptTileArgs<'a> {
    kv: &'a KvCache,
    layer: usize,
    q: &'a [f32],
    seqs: &'a [usize],
    positions: &'a [usize],
    heads: usize,
    group: usize,
    scale: f32,
    ctx: SpanCtx,
}

/// Attention of query head `head` for the prompt rows `rows` (consecutive positions of one
/// sequence, at most [`PROMPT_TILE_ROWS`]) into `out` (`rows.len()` × hd): the rows' query
/// vectors go through the grouped-query kernels as if they were heads of one group, so each key
/// and value is loaded (and converted) once for the tile instead of once per row. Every float is
/// the row-by-row path's:
/// - the scores of all rows run over the last row's keys; row j uses its own first `n_j`
///   (each score is computed alone, so the extra ones change nothing), then its softmax;
/// - the weighted sums run over the keys every row sees together, then each row's few more on
///   its own, continuing the same per-element sum in the same order.
///
/// With an encoded cache the head's rows are decoded into f32 once per thread and (sequence,
/// KV head) as far as needed (`decoded`: which, and how many rows), as the head-major rows do.
fn prompt_tile(
    a: &PromptTileArgs<'_>,
    head: usize,
    rows: Range<usize>,
    out: &mut [f32],
    s: &mut Worker,
    decoded: &mut DecodedRows,
) {
    let Worker { scores, q_tile, prompt_keys, prompt_values, rec, .. } = s;
    let (t, hd) = (rows.len(), out.len() / rows.len());
    let (seq, kh) = (a.seqs[rows.start], head / a.group);
    // Keys row j sees: n0 + j.
    let (n0, n) = (a.positions[rows.start] + 1, a.positions[rows.end - 1] + 1);
    let t0 = rec.start();
    let (mut keys, mut values) = (a.kv.key_rows(a.layer, seq, kh, n), a.kv.value_rows(a.layer, seq, kh, n));
    let precision = a.kv.precision();
    if let (KvRows::Encoded(k), KvRows::Encoded(v)) = (&keys, &values) {
        decode_rows_once(precision, (seq, kh), k, v, hd, n, prompt_keys, prompt_values, decoded);
        keys = KvRows::F32(&prompt_keys[..n * hd]);
        values = KvRows::F32(&prompt_values[..n * hd]);
    }
    for (j, r) in rows.clone().enumerate() {
        q_tile[j * hd..(j + 1) * hd].copy_from_slice(&a.q[(r * a.heads + head) * hd..][..hd]);
    }
    let qs = &q_tile[..t * hd];
    let sc = &mut scores[..t * n];
    match (&keys, &values) {
        (KvRows::F32(k), KvRows::F32(v)) => attention_scores_group(qs, t, k, a.scale, sc, v),
        (KvRows::F16(k), KvRows::F16(v)) => attention_scores_group(qs, t, k, a.scale, sc, v),
        _ => unreachable!("encoded rows are decoded above; keys and values share a store type"),
    }
    // Each row's share of its KV head's bytes, as the row-by-row path counts them.
    let kv_bytes = rows.clone().map(|r| (a.positions[r] + 1) as u64).sum::<u64>()
        * precision.bytes_per_vector(hd) as u64
        / a.group as u64;
    let t1 = rec.end(a.ctx, Stage::Qk, t0, kv_bytes);
    // Row j's weights beyond the first n0 (j of them), kept aside, then the rows' first n0
    // weights packed n0 apart for the grouped sum.
    let mut tails = [[0f32; PROMPT_TILE_ROWS]; PROMPT_TILE_ROWS];
    for j in 0..t {
        let w = &mut sc[j * n..j * n + n0 + j];
        softmax_in_place(w);
        tails[j][..j].copy_from_slice(&w[n0..]);
    }
    for j in 1..t {
        sc.copy_within(j * n..j * n + n0, j * n0);
    }
    let t2 = rec.end(a.ctx, Stage::Softmax, t1, 0);
    out.fill(0.0);
    let ws = &sc[..t * n0];
    match values {
        KvRows::F32(v) => {
            attention_weighted_sum_group(ws, t, &v[..n0 * hd], out, &[]);
            for j in 1..t {
                attention_weighted_sum(&tails[j][..j], &v[n0 * hd..(n0 + j) * hd], &mut out[j * hd..(j + 1) * hd], &[]);
            }
        }
        KvRows::F16(v) => {
            attention_weighted_sum_group(ws, t, &v[..n0 * hd], out, &[]);
            for j in 1..t {
                attention_weighted_sum(&tails[j][..j], &v[n0 * hd..(n0 + j) * hd], &mut out[j * hd..(j + 1) * hd], &[]);
            }
        }
        KvRows::Encoded(_) => unreachable!("decoded above"),
    }
    rec.chunk_end = rec.end(a.ctx, Stage::Av, t2, kv_bytes);
}

/// Which (sequence, KV head) a thread's f32 copies of encoded keys and values hold, and how
/// many of its rows (`None`: nothing yet).
type DecodedRows = Option<((usize, usize), usize)>;

/// Makes the first `n` keys and values of `of` (encoded `k`, `v`) f32 in `keys_f32` /
/// `values_f32`, decoding only the rows `decoded` says are not there yet: a thread's prompt
/// items of one head each need a few rows more than the last.
#[allow(clippy::too_many_arguments)]
fn decode_rows_once(
    precision: KvPrecision,
    of: (usize, usize),
    k: &[u8],
    v: &[u8],
    hd: usize,
    n: usize,
    keys_f32: &mut [f32],
    values_f32: &mut [f32],
    decoded: &mut DecodedRows,
) {
    let done = match *decoded {
        Some((held, rows)) if held == of => rows,
        _ => 0,
    };
    if n > done {
        let vb = precision.bytes_per_vector(hd);
        decode_kv_rows(precision, &k[done * vb..], hd, &mut keys_f32[done * hd..n * hd]);
        decode_kv_rows(precision, &v[done * vb..], hd, &mut values_f32[done * hd..n * hd]);
    }
    *decoded = Some((of, n.max(done)));
}

/// Query heads per attention item (f32 and f16 caches, and encoded ones where their group
/// kernels decode each row once for the group: AVX-512, decode steps): the largest of 4, 2 that divides the
/// group and still leaves the `kv_items` × (group / that) items evenly or finely split over the
/// threads (2B4T, one token, 2 threads: 5 KV heads → 10 items of 2 heads), else 1. An item
/// reads its KV head's keys and values once for all its heads (each head's floats unchanged),
/// where one item per head had read them once per head.
fn heads_per_item(kv_items: usize, group: usize, threads: usize) -> usize {
    for sg in [4, 2] {
        let items = kv_items * (group / sg);
        if group.is_multiple_of(sg) && (items.is_multiple_of(threads) || items >= 8 * threads) {
            return sg;
        }
    }
    1
}

/// Causal grouped-query attention of every (row, head), split across threads by (row, head):
/// row-major, or head-major (see [`HEAD_MAJOR_ROWS`]) into `scratch` and then copied into `out`
/// (`[rows, heads × hd]`). Each (row, head) is the same floats either way.
#[allow(clippy::too_many_arguments)]
fn attention(
    pool: &WorkerPool,
    cfg: &ModelConfig,
    kv: &KvCache,
    layer: usize,
    q: &[f32],
    seqs: &[usize],
    positions: &[usize],
    out: &mut [f32],
    scratch: &mut [f32],
    workers: &mut [Worker],
    ctx: SpanCtx,
    upcoming: Upcoming,
) {
    let (hd, heads) = (cfg.head_dim(), cfg.heads);
    let rows = seqs.len();
    let group = heads / cfg.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let precision = kv.precision();
    // One prompt's rows: tiles of consecutive rows of one head ([`prompt_tile`]), head-major,
    // unless row-major items already share each key among as many query heads (f32 and f16
    // caches of a model whose KV heads serve 4 query heads each, as 2B4T's: there the tiles
    // measured 8–12% slower, for their copies and extra scores).
    let row_major_heads =
        if precision.is_encoded() { 1 } else { heads_per_item(rows * cfg.kv_heads, group, pool.threads()) };
    let tiled = rows >= HEAD_MAJOR_ROWS && row_major_heads < PROMPT_TILE_ROWS && is_one_prompt(seqs, positions);
    let head_major = tiled || (precision.is_encoded() && rows >= HEAD_MAJOR_ROWS);
    // Query heads per work item: 1, or a share of a KV head's group read in one pass (encoded
    // rows only where the group kernels decode them once, and not for a prompt's head-major
    // items, which decode each head's rows once into f32 first).
    let grouped = !tiled && (!precision.is_encoded() || (!head_major && encoded_groups_read_once()));
    let sg = if grouped { heads_per_item(rows * cfg.kv_heads, group, pool.threads()) } else { 1 };
    let items_per_row = heads / sg;
    // Item i's (row, first head).
    let at = |i: usize| if head_major { (i % rows, i / rows) } else { (i / items_per_row, i % items_per_row * sg) };
    let on = workers[0].rec.on();
    let t_split = workers[0].rec.start();
    workers[0].rec.begin_split(t_split);
    let vec_bytes = precision.bytes_per_vector(hd) as u64;
    let dst = if head_major { &mut scratch[..out.len()] } else { &mut *out };
    let block_items = if tiled { PROMPT_TILE_ROWS } else { 1 };
    let tile_args = PromptTileArgs { kv, layer, q, seqs, positions, heads, group, scale, ctx };
    let threads = pool.threads();
    pool.split_blocks(
        dst,
        sg * hd,
        block_items,
        workers,
        |i| upcoming.ahead(threads, i),
        |blocks, s| {
            if tiled {
                // Items are (head, row), head-major: each block's items in runs of up to
                // PROMPT_TILE_ROWS consecutive rows of one head.
                let mut decoded = None;
                let mut started = false;
                while let Some((first, chunk)) = blocks.next_block() {
                    let items = chunk.len() / hd;
                    let mut j = 0;
                    while j < items {
                        let (row, head) = ((first + j) % rows, (first + j) / rows);
                        let t = (items - j).min(rows - row).min(PROMPT_TILE_ROWS);
                        if !started {
                            s.rec.chunk_start = s.rec.start();
                            started = true;
                        }
                        prompt_tile(&tile_args, head, row..row + t, &mut chunk[j * hd..(j + t) * hd], s, &mut decoded);
                        j += t;
                    }
                }
                return;
            }
            let mut started = false;
            // With an encoded cache and head-major items: what `s.prompt_keys` / `s.prompt_values`
            // hold ([`DecodedRows`]).
            let mut decoded = None;
            while let Some((first, chunk)) = blocks.next_block() {
                let items = chunk.len() / (sg * hd);
                for (j, o) in chunk.chunks_exact_mut(sg * hd).enumerate() {
                    let item = first + j;
                    let (row, head) = at(item);
                    let (seq, pos, kh) = (seqs[row], positions[row], head / group);
                    let t0 = s.rec.start();
                    if j == 0 {
                        if !started {
                            s.rec.chunk_start = t0;
                            started = true;
                        }
                        kv.key_rows(layer, seq, kh, pos + 1).prefetch();
                    }
                    let (mut keys, mut values) =
                        (kv.key_rows(layer, seq, kh, pos + 1), kv.value_rows(layer, seq, kh, pos + 1));
                    let next_keys = (j + 1 < items).then(|| {
                        let (row, head) = at(item + 1);
                        kv.key_rows(layer, seqs[row], head / group, positions[row] + 1)
                    });
                    // The KV head's bytes counted once per row however many items share it (sg of
                    // its group's query heads each), as `bitnet-bench` counts them per step: a stage's
                    // GB/s is then memory traffic, not bytes touched again in cache.
                    let kv_bytes = vec_bytes * (pos + 1) as u64 * sg as u64 / group as u64;
                    if sg > 1 {
                        // The sg query heads over their KV head's rows, each read once: every head's
                        // scores, softmax and sum are the floats of the one-head path below.
                        let qs = &q[row * heads * hd + head * hd..][..sg * hd];
                        let n = pos + 1;
                        let scores = &mut s.scores[..sg * n];
                        match (&keys, &values) {
                            (KvRows::F32(k), KvRows::F32(v)) => attention_scores_group(qs, sg, k, scale, scores, v),
                            (KvRows::F16(k), KvRows::F16(v)) => attention_scores_group(qs, sg, k, scale, scores, v),
                            (KvRows::Encoded(k), KvRows::Encoded(v)) => {
                                attention_scores_group_encoded(precision, qs, sg, k, scale, scores, v, &mut s.decoded)
                            }
                            _ => unreachable!("keys and values of one cache share a store type"),
                        }
                        let t1 = s.rec.end(ctx, Stage::Qk, t0, kv_bytes);
                        for w in scores.chunks_exact_mut(n) {
                            softmax_in_place(w);
                        }
                        let t2 = s.rec.end(ctx, Stage::Softmax, t1, 0);
                        o.fill(0.0);
                        match (&values, &next_keys) {
                            (KvRows::F32(v), Some(KvRows::F32(nk))) => {
                                attention_weighted_sum_group(scores, sg, v, o, nk)
                            }
                            (KvRows::F32(v), _) => attention_weighted_sum_group(scores, sg, v, o, &[]),
                            (KvRows::F16(v), Some(KvRows::F16(nk))) => {
                                attention_weighted_sum_group(scores, sg, v, o, nk)
                            }
                            (KvRows::F16(v), _) => attention_weighted_sum_group(scores, sg, v, o, &[]),
                            (KvRows::Encoded(v), Some(KvRows::Encoded(nk))) => {
                                attention_weighted_sum_group_encoded(precision, scores, sg, v, o, nk, &mut s.decoded)
                            }
                            (KvRows::Encoded(v), _) => {
                                attention_weighted_sum_group_encoded(precision, scores, sg, v, o, &[], &mut s.decoded)
                            }
                        }
                        s.rec.chunk_end = s.rec.end(ctx, Stage::Av, t2, kv_bytes);
                        continue;
                    }
                    let qh = &q[row * heads * hd + head * hd..][..hd];
                    let scores = &mut s.scores[..=pos];
                    if let (KvRows::Encoded(k), KvRows::Encoded(v), true) = (&keys, &values, head_major) {
                        // Decode only the rows this item needs beyond those already decoded, then
                        // attend over the f32 rows as over an f32 cache.
                        let n = (pos + 1) * hd;
                        decode_rows_once(
                            precision,
                            (seq, kh),
                            k,
                            v,
                            hd,
                            pos + 1,
                            &mut s.prompt_keys,
                            &mut s.prompt_values,
                            &mut decoded,
                        );
                        keys = KvRows::F32(&s.prompt_keys[..n]);
                        values = KvRows::F32(&s.prompt_values[..n]);
                    }
                    // The cache is cold at every step (the weights streamed since evicted it), and one
                    // head's rows are a few KiB, too short for the hardware prefetcher: the scores ask
                    // for this head's values a share at a time while they run, and the weighted sum for
                    // the next head's keys, so that memory streams under the arithmetic throughout.
                    match (&keys, &values) {
                        (KvRows::F32(k), KvRows::F32(v)) => attention_scores(qh, k, scale, scores, v),
                        (KvRows::F16(k), KvRows::F16(v)) => attention_scores(qh, k, scale, scores, v),
                        (KvRows::Encoded(k), KvRows::Encoded(v)) => {
                            attention_scores_encoded(precision, qh, k, scale, scores, v, &mut s.decoded)
                        }
                        _ => unreachable!("keys and values of one cache share a store type"),
                    }
                    let t1 = s.rec.end(ctx, Stage::Qk, t0, kv_bytes);
                    // Attention weights, in place.
                    softmax_in_place(scores);
                    let t2 = s.rec.end(ctx, Stage::Softmax, t1, 0);
                    o.fill(0.0);
                    match (&values, &next_keys) {
                        (KvRows::F32(v), Some(KvRows::F32(n))) => attention_weighted_sum(scores, v, o, n),
                        (KvRows::F32(v), _) => attention_weighted_sum(scores, v, o, &[]),
                        (KvRows::F16(v), Some(KvRows::F16(n))) => attention_weighted_sum(scores, v, o, n),
                        (KvRows::F16(v), _) => attention_weighted_sum(scores, v, o, &[]),
                        (KvRows::Encoded(v), Some(KvRows::Encoded(n))) => {
                            attention_weighted_sum_encoded(precision, scores, v, o, n, &mut s.decoded)
                        }
                        (KvRows::Encoded(v), _) => {
                            attention_weighted_sum_encoded(precision, scores, v, o, &[], &mut s.decoded)
                        }
                    }
                    s.rec.chunk_end = s.rec.end(ctx, Stage::Av, t2, kv_bytes);
                }
            }
        },
    );
    let rec = &mut workers[0].rec;
    if on {
        rec.end_split(ctx, t_split);
    }
    if head_major {
        rec.time(ctx, Stage::Transpose, 0, || {
            for (head, src) in scratch[..out.len()].chunks_exact(rows * hd).enumerate() {
                for (row, v) in src.chunks_exact(hd).enumerate() {
                    out[(row * heads + head) * hd..][..hd].copy_from_slice(v);
                }
            }
        });
    }
}

/// The index of the largest logit (the first one on ties; a NaN never wins, unless it is the
/// first logit): see `ops::argmax_portable`.
pub fn argmax(logits: &[f32]) -> u32 {
    crate::ops::argmax(logits)
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
