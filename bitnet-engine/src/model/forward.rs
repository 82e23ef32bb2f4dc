//! The fast forward pass: batched prefill (the prompt as a matrix) and batched decode (B
//! sequences in lock-step), with preallocated buffers, the worker pool and the SIMD kernels.

use std::ops::Range;

use crate::activations::ActivationBatch;
use crate::error::{Error, Result};
use crate::formats::{PackedWeights, WeightFormat};
use crate::kernels::{attention_scores, attention_weighted_sum, int8_rows_matmul, Kernel, KernelScratch};
use crate::model::config::{FfnActivation, ModelConfig};
use crate::model::kv_cache::{KvCache, KvPrecision, KvRows};
use crate::model::pool::WorkerPool;
use crate::model::weights::Weights;

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

/// Per-thread attention scratch.
#[derive(Debug, Clone)]
struct AttnScratch {
    /// `[context]` attention weights.
    scores: Vec<f32>,
    /// `[head_dim]` one decoded key or value.
    vec: Vec<f32>,
}

/// The run state: KV cache, worker pool and every buffer a forward pass needs, allocated once.
pub struct State {
    cfg: ModelConfig,
    max_rows: usize,
    /// The kernel forced for every linear layer, if any.
    kernel: Option<Kernel>,
    /// Whether some layer runs an xnor kernel (which reads activation bit-planes).
    any_xnor: bool,
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
    /// `[rows, ffn]` gate (then gated activation) and up projections.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `[rows, hidden]` output of the O and down projections.
    proj: Vec<f32>,
    /// `[max(N), rows]` kernel output, row-major by output row.
    mm: Vec<f32>,
    /// `[rows, vocab]` logits.
    logits: Vec<f32>,
    /// Quantized activations of width hidden (= q_dim) and ffn.
    act_hidden: ActivationBatch,
    act_ffn: ActivationBatch,
    /// One per thread.
    kernel_scratch: Vec<KernelScratch>,
    attn_scratch: Vec<AttnScratch>,
    /// `[head_dim / 2]` RoPE inverse frequencies.
    inv_freq: Vec<f32>,
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
        let any_xnor = model
            .weights
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .any(|w| kernel_for(kernel, w).family() == crate::kernels::KernelFamily::Xnor);
        let rows = opts.max_rows;
        let kv = KvCache::new(&cfg, opts.kv_precision, opts.sequences, opts.context)?;
        let pool = WorkerPool::new(opts.threads, opts.pin)?;
        let hd = cfg.head_dim();
        // The largest kernel output: a projection, or the LM head's [vocab, rows].
        let max_n = cfg.q_dim().max(cfg.ffn).max(cfg.hidden).max(cfg.vocab);
        let act_hidden = ActivationBatch::new(rows, cfg.hidden)?;
        let act_ffn = ActivationBatch::new(rows, cfg.ffn)?;
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
            up: vec![0.0; rows * cfg.ffn],
            proj: vec![0.0; rows * cfg.hidden],
            mm: vec![0.0; rows * max_n],
            logits: vec![0.0; rows * cfg.vocab],
            act_hidden,
            act_ffn,
            kernel_scratch: (0..opts.threads).map(|_| KernelScratch::for_cols(padded)).collect(),
            attn_scratch: (0..opts.threads)
                .map(|_| AttnScratch { scores: vec![0.0; opts.context], vec: vec![0.0; hd] })
                .collect(),
            inv_freq: (0..hd / 2).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / hd as f32)).collect(),
            logit_rows: 0..0,
            any_xnor,
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
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }
    pub fn pinned(&self) -> bool {
        self.pool.pinned()
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
        for (r, &t) in tokens.iter().enumerate() {
            w.token_embd.dequantize_row(t as usize, &mut self.x[r * h..(r + 1) * h]);
        }
        self.act_hidden.set_batch(rows)?;
        self.act_ffn.set_batch(rows)?;
        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            rms_norm_rows(&self.x[..rows * h], &lw.attn_norm, cfg.norm_eps, &mut self.xb[..rows * h]);
            quantize(self.any_xnor, &mut self.act_hidden, &self.xb[..rows * h])?;
            linear(
                &self.pool,
                self.kernel,
                &lw.wq,
                &self.act_hidden,
                &mut self.mm,
                &mut self.q[..rows * qd],
                &mut self.kernel_scratch,
            )?;
            linear(
                &self.pool,
                self.kernel,
                &lw.wk,
                &self.act_hidden,
                &mut self.mm,
                &mut self.k[..rows * kvd],
                &mut self.kernel_scratch,
            )?;
            linear(
                &self.pool,
                self.kernel,
                &lw.wv,
                &self.act_hidden,
                &mut self.mm,
                &mut self.v[..rows * kvd],
                &mut self.kernel_scratch,
            )?;
            for r in 0..rows {
                rope(&mut self.q[r * qd..(r + 1) * qd], hd, positions[r], &self.inv_freq);
                rope(&mut self.k[r * kvd..(r + 1) * kvd], hd, positions[r], &self.inv_freq);
                for kh in 0..cfg.kv_heads {
                    let s = r * kvd + kh * hd..r * kvd + (kh + 1) * hd;
                    self.kv.write(l, seqs[r], kh, positions[r], &self.k[s.clone()], &self.v[s]);
                }
            }
            attention(
                &self.pool,
                cfg,
                &self.kv,
                l,
                &self.q[..rows * qd],
                seqs,
                positions,
                &mut self.att[..rows * qd],
                &mut self.attn_scratch,
            );
            if let Some(sub) = &lw.attn_sub_norm {
                rms_norm_in_place(&mut self.att[..rows * qd], sub, cfg.norm_eps);
            }
            quantize(self.any_xnor, &mut self.act_hidden, &self.att[..rows * qd])?;
            linear(
                &self.pool,
                self.kernel,
                &lw.wo,
                &self.act_hidden,
                &mut self.mm,
                &mut self.proj[..rows * h],
                &mut self.kernel_scratch,
            )?;
            add_in_place(&mut self.x[..rows * h], &self.proj[..rows * h]);

            // Feed-forward block.
            rms_norm_rows(&self.x[..rows * h], &lw.ffn_norm, cfg.norm_eps, &mut self.xb[..rows * h]);
            quantize(self.any_xnor, &mut self.act_hidden, &self.xb[..rows * h])?;
            linear(
                &self.pool,
                self.kernel,
                &lw.w_gate,
                &self.act_hidden,
                &mut self.mm,
                &mut self.gate[..rows * ffn],
                &mut self.kernel_scratch,
            )?;
            linear(
                &self.pool,
                self.kernel,
                &lw.w_up,
                &self.act_hidden,
                &mut self.mm,
                &mut self.up[..rows * ffn],
                &mut self.kernel_scratch,
            )?;
            gated_activation(cfg.activation, &mut self.gate[..rows * ffn], &self.up[..rows * ffn]);
            if let Some(sub) = &lw.ffn_sub_norm {
                rms_norm_in_place(&mut self.gate[..rows * ffn], sub, cfg.norm_eps);
            }
            quantize(self.any_xnor, &mut self.act_ffn, &self.gate[..rows * ffn])?;
            linear(
                &self.pool,
                self.kernel,
                &lw.w_down,
                &self.act_ffn,
                &mut self.mm,
                &mut self.proj[..rows * h],
                &mut self.kernel_scratch,
            )?;
            add_in_place(&mut self.x[..rows * h], &self.proj[..rows * h]);
        }
        // Final norm and LM head for the requested rows.
        self.logit_rows = match logits_for {
            LogitsFor::All => 0..rows,
            LogitsFor::Last => rows - 1..rows,
            LogitsFor::None => 0..0,
        };
        if !self.logit_rows.is_empty() {
            let lr = self.logit_rows.clone();
            let n = lr.len();
            rms_norm_rows(&self.x[lr.start * h..lr.end * h], &w.output_norm, cfg.norm_eps, &mut self.xb[..n * h]);
            self.act_hidden.set_batch(n)?;
            self.act_hidden.quantize(&self.xb[..n * h])?;
            let head = w.lm_head();
            let vocab = cfg.vocab;
            let isa = kernel_for(self.kernel, &w.layers[0].wq).isa();
            let act = &self.act_hidden;
            // `mm` holds [vocab, n]; the LM head's rows are split across threads.
            self.pool.split(&mut self.mm[..vocab * n], n, 16, &mut self.kernel_scratch, |first, chunk, _| {
                let r = first..first + chunk.len() / n;
                int8_rows_matmul(isa, head, act, r, chunk).expect("shapes checked when the state was built");
            });
            let base = lr.start * vocab;
            transpose_into(&self.mm[..vocab * n], vocab, n, &mut self.logits[base..base + n * vocab]);
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
fn quantize(planes: bool, act: &mut ActivationBatch, x: &[f32]) -> Result<()> {
    act.quantize(x)?;
    if planes {
        act.build_planes();
    }
    Ok(())
}

/// `out[rows, N] = act × wᵀ`: the kernel writes `[N, rows]` into `mm`, split by output rows
/// across threads, then it is transposed (a no-op copy for one row).
/// The kernel for `w`: the forced one, or the best for its format.
#[inline]
fn kernel_for(forced: Option<Kernel>, w: &PackedWeights) -> Kernel {
    forced.unwrap_or_else(|| Kernel::best_for(w.format()))
}

fn linear(
    pool: &WorkerPool,
    forced: Option<Kernel>,
    w: &PackedWeights,
    act: &ActivationBatch,
    mm: &mut [f32],
    out: &mut [f32],
    scratch: &mut [KernelScratch],
) -> Result<()> {
    let (n, rows) = (w.rows(), act.batch());
    let kernel = kernel_for(forced, w);
    kernel.check(w, act, &(0..n), &mm[..n * rows])?;
    pool.split(&mut mm[..n * rows], rows, 16, scratch, |first, chunk, s| {
        let r = first..first + chunk.len() / rows;
        kernel.matmul(w, act, r, chunk, s).expect("arguments checked before the split");
    });
    transpose_into(&mm[..n * rows], n, rows, out);
    Ok(())
}

/// `dst[c][r] = src[r][c]` for a `[r_n, c_n]` source.
fn transpose_into(src: &[f32], r_n: usize, c_n: usize, dst: &mut [f32]) {
    if c_n == 1 {
        dst[..r_n].copy_from_slice(&src[..r_n]);
        return;
    }
    for r in 0..r_n {
        for c in 0..c_n {
            dst[c * r_n + r] = src[r * c_n + c];
        }
    }
}

/// 1 / RMS of a row (RMSNorm's factor).
#[inline]
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    1.0 / (row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32 + eps).sqrt()
}

/// RMSNorm of each row of `x` (row length = `weight.len()`) into `out`.
pub(crate) fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let inv = inv_rms(xr, eps);
        for ((o, v), g) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * g;
        }
    }
}

fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    for xr in x.chunks_exact_mut(weight.len()) {
        let inv = inv_rms(xr, eps);
        for (v, g) in xr.iter_mut().zip(weight) {
            *v = *v * inv * g;
        }
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// NEOX-style rotary embedding of every head of `v` (head size `hd`): dimension i is rotated
/// with i + hd/2 by angle pos × inv_freq[i].
pub(crate) fn rope(v: &mut [f32], hd: usize, pos: usize, inv_freq: &[f32]) {
    let half = hd / 2;
    for head in v.chunks_exact_mut(hd) {
        for i in 0..half {
            let (s, c) = (pos as f32 * inv_freq[i]).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = a * s + b * c;
        }
    }
}

fn gated_activation(act: FfnActivation, gate: &mut [f32], up: &[f32]) {
    match act {
        FfnActivation::Silu => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        FfnActivation::ReluSquared => {
            for (g, u) in gate.iter_mut().zip(up) {
                let r = g.max(0.0);
                *g = r * r * u;
            }
        }
    }
}

/// Causal grouped-query attention of every (row, head), split across threads by (row, head).
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
    scratch: &mut [AttnScratch],
) {
    let (hd, heads) = (cfg.head_dim(), cfg.heads);
    let group = heads / cfg.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    pool.split(out, hd, 1, scratch, |first, chunk, s| {
        for (j, o) in chunk.chunks_exact_mut(hd).enumerate() {
            let item = first + j;
            let (row, head) = (item / heads, item % heads);
            let (seq, pos, kh) = (seqs[row], positions[row], head / group);
            let qh = &q[row * heads * hd + head * hd..][..hd];
            let scores = &mut s.scores[..=pos];
            match kv.key_rows(layer, seq, kh, pos + 1) {
                KvRows::F32(k) => attention_scores(qh, k, scale, scores),
                KvRows::F16(k) => attention_scores(qh, k, scale, scores),
                KvRows::Encoded => {
                    for (p, sc) in scores.iter_mut().enumerate() {
                        *sc = dot16(qh, kv.key(layer, seq, kh, p, &mut s.vec)) * scale;
                    }
                }
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            // Attention weights, in place.
            for sc in scores.iter_mut() {
                *sc /= sum;
            }
            o.fill(0.0);
            match kv.value_rows(layer, seq, kh, pos + 1) {
                KvRows::F32(v) => attention_weighted_sum(scores, v, o),
                KvRows::F16(v) => attention_weighted_sum(scores, v, o),
                KvRows::Encoded => {
                    for (p, wgt) in scores.iter().enumerate() {
                        for (a, v) in o.iter_mut().zip(kv.value(layer, seq, kh, p, &mut s.vec)) {
                            *a += wgt * v;
                        }
                    }
                }
            }
        }
    });
}

/// Dot product in a fixed order: 16 lane sums, then a fixed reduction tree. The compiler can
/// keep the lanes in one vector register, and the result is the same at every ISA level (no
/// fused multiply-add, no reassociation), so attention is bit-identical across machines.
#[inline]
pub(crate) fn dot16(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
        w /= 2;
    }
    lanes[0]
}

/// The index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}
