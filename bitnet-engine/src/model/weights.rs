//! Model weights: ternary linear layers in a packed format, f32 norms, int8 embedding/LM head.
//! Synthetic weights are generated deterministically from a seed.

use crate::error::{Error, Result};
use crate::formats::{EmbeddingRows, Int8Rows, PackedWeights, WeightFormat};
use crate::matmul::{Kernel, KernelFamily};
use crate::model::config::ModelConfig;
use crate::rng::SplitMix64;

/// One decoder layer. Shapes are `[out, in]`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `[hidden]`
    pub attn_norm: Vec<f32>,
    /// `[q_dim, hidden]`
    pub wq: PackedWeights,
    /// `[kv_dim, hidden]`
    pub wk: PackedWeights,
    /// `[kv_dim, hidden]`
    pub wv: PackedWeights,
    /// `[q_dim]`, applied to the attention output before `wo` (BitNet b1.58's sub-norm).
    pub attn_sub_norm: Option<Vec<f32>>,
    /// `[hidden, q_dim]`
    pub wo: PackedWeights,
    /// `[hidden]`
    pub ffn_norm: Vec<f32>,
    /// `[ffn, hidden]`
    pub w_gate: PackedWeights,
    /// `[ffn, hidden]`
    pub w_up: PackedWeights,
    /// `[ffn]`, applied before `w_down`.
    pub ffn_sub_norm: Option<Vec<f32>>,
    /// `[hidden, ffn]`
    pub w_down: PackedWeights,
    /// A factor on each projection's output, in the order of [`LayerWeights::linears`]: 1
    /// unless a GGUF carries llama.cpp's optional `blk.N.<proj>.scale` tensors (conversions of
    /// checkpoints whose ternary weights and scales are stored apart, e.g. 2B4T's).
    pub out_scales: [f32; 7],
}

/// All weights of a model.
#[derive(Debug, Clone)]
pub struct Weights {
    /// `[vocab, hidden]`: int8 with a scale per row, or Q6_K as a GGUF stores it.
    pub token_embd: EmbeddingRows,
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`
    pub output_norm: Vec<f32>,
    /// `[vocab, hidden]`; `None` when tied to `token_embd`.
    pub lm_head: Option<EmbeddingRows>,
}

impl Weights {
    /// The matrix the LM head multiplies by.
    pub fn lm_head(&self) -> &EmbeddingRows {
        self.lm_head.as_ref().unwrap_or(&self.token_embd)
    }

    /// Multiply-adds of one token through the linear layers and the LM head (rows × columns
    /// of each): the work a batch-decode or prefill step is measured against the int8 peak
    /// with ([`crate::probes::compute_peak`]). Attention's float work, which grows with the context,
    /// is not counted.
    pub fn macs_per_token(&self) -> u64 {
        self.linear_macs_per_token() + self.head_macs_per_token()
    }

    /// Multiply-adds of one token through the linear layers (all a prompt token costs in a
    /// prefill that takes logits of the last position only).
    pub fn linear_macs_per_token(&self) -> u64 {
        self.layers.iter().flat_map(|l| l.linears()).map(|w| (w.rows() * w.cols()) as u64).sum()
    }

    /// Multiply-adds of one token's logits (vocabulary × hidden).
    pub fn head_macs_per_token(&self) -> u64 {
        (self.lm_head().rows() * self.lm_head().cols()) as u64
    }

    /// Bytes of ternary linear weights.
    pub fn linear_bytes(&self) -> usize {
        self.layers.iter().flat_map(|l| l.linears()).map(|w| w.byte_len()).sum()
    }

    /// Makes what the kernels `forced` (or the best for each format) read beside the linear
    /// weights and lack ([`Kernel::prepare`]: TQ1_0's table-lookup repack, TQ2_0's code copy),
    /// on `threads` threads, so that no matmul makes it mid-run. Each thread takes a run of
    /// consecutive matrices: a thread carves its buffers from its own region (`aligned`), so
    /// handing out matrices one at a time would interleave a layer's repacks between regions
    /// instead of laying them back to back in the order decode reads them.
    pub fn prepare_repacks(&self, forced: Option<Kernel>, threads: usize) {
        let todo: Vec<(Kernel, &PackedWeights)> = self
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .map(|w| (Kernel::for_weights(forced, w), w))
            .filter(|(k, w)| !k.prepared(w))
            .collect();
        let run = todo.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            for part in todo.chunks(run) {
                s.spawn(move || part.iter().for_each(|(k, w)| k.prepare(w)));
            }
        });
    }

    /// Weight bytes a decode step of `batch` tokens reads with the kernels `forced` (or the best
    /// for each format): [`Weights::bytes_read_per_token`] with each linear counted as the
    /// kernel that runs that batch reads it (the `lut` and `perm` forms read TQ1_0's repack up
    /// to [`LUT_MAX_BATCH`](crate::matmul::LUT_MAX_BATCH) tokens and hand larger batches to
    /// the fused form, which reads the blocks).
    pub fn bytes_read_per_step_by(&self, forced: Option<Kernel>, batch: usize) -> usize {
        let linear: usize = self
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .map(|w| Kernel::for_weights(forced, w).for_batch(batch).bytes_read(w))
            .sum();
        self.bytes_read_per_token() - self.linear_bytes() + linear
    }

    /// The formats of the linear layers, each once, in layer order: one for most files, more
    /// for a GGUF file that mixes them.
    pub fn linear_formats(&self) -> Vec<WeightFormat> {
        let mut formats = Vec::new();
        for w in self.layers.iter().flat_map(|l| l.linears()) {
            if !formats.contains(&w.format()) {
                formats.push(w.format());
            }
        }
        formats
    }

    /// The kernel family tools run by default: the best one for the linear layers' format, or
    /// an error naming the formats when they mix them (each layer then needs its own kernel,
    /// which [`StateOptions::kernel`](crate::StateOptions) left unset gives).
    pub fn kernel_family(&self) -> Result<KernelFamily> {
        match &self.linear_formats()[..] {
            [f] => Ok(Kernel::best_for(*f).family()),
            mixed => Err(Error::Unsupported(format!(
                "its linear layers mix {} weights, and one kernel family cannot run every layer \
                 (`bitnet-bench run` gives each layer the kernel for its own format)",
                mixed.iter().map(|f| f.name()).collect::<Vec<_>>().join(" and ")
            ))),
        }
    }

    /// Bytes of memory the kernels `forced` (or the best for each format) add to the weights
    /// ([`Kernel::repack_bytes`]: TQ1_0's table-lookup repacks, TQ2_0's code copies; made or
    /// not yet).
    pub fn repack_bytes(&self, forced: Option<Kernel>) -> usize {
        self.layers.iter().flat_map(|l| l.linears()).map(|w| Kernel::for_weights(forced, w).repack_bytes(w)).sum()
    }

    /// The Q6_K LM head whose 16-row groups a state of `sequences` sequences running `forced`
    /// (or the best kernels) makes and multiplies batches on (AVX-512 VNNI;
    /// [`crate::formats::Q6kRows::prepare_groups`]), if it does.
    pub fn grouped_head(&self, forced: Option<Kernel>, sequences: usize) -> Option<&crate::formats::Q6kRows> {
        let isa = Kernel::for_weights(forced, &self.layers.first()?.wq).isa();
        match self.lm_head() {
            EmbeddingRows::Q6K(m) if crate::matmul::q6k_groups_used(isa, sequences) => Some(m),
            _ => None,
        }
    }

    /// Bytes of memory that state adds for the LM head: its 16-row groups ([`Self::grouped_head`];
    /// made or not yet), else 0.
    pub fn head_repack_bytes(&self, forced: Option<Kernel>, sequences: usize) -> usize {
        self.grouped_head(forced, sequences)
            .map_or(0, |m| crate::formats::Q6kRowGroups::byte_len_for(m.rows(), m.cols()))
    }

    /// Bytes a decode step reads: every linear weight, the LM head and the norms (the
    /// embedding lookup reads one row; the KV cache is counted separately).
    pub fn bytes_read_per_token(&self) -> usize {
        self.linear_bytes() + self.lm_head().byte_len() + self.norm_bytes()
    }

    /// Bytes of every weight as held in memory: linear layers (with the f32 tensor scale of the
    /// I2, bit-plane and binary formats), embedding, a separate LM head and the f32 norms. For
    /// a preset this is the [`tensor_layout`](crate::model::tensor_layout) total. For a GGUF
    /// file it is the file's tensor bytes only where the engine holds every tensor as stored
    /// (TQ1_0/TQ2_0 linears, Q6_K or int8 embedding, F32 norms): an F16 embedding is held as
    /// int8 rows, F16 norms as f32, an I2_S tensor's 32-byte scale block as 4 bytes.
    pub fn total_bytes(&self) -> usize {
        let tensor_scales = self
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .filter(|w| matches!(w.format(), WeightFormat::I2 | WeightFormat::BitPlanes | WeightFormat::Binary))
            .count();
        self.linear_bytes()
            + 4 * tensor_scales
            + self.token_embd.byte_len()
            + self.lm_head.as_ref().map_or(0, |h| h.byte_len())
            + self.norm_bytes()
    }

    /// Bytes of the f32 norm vectors.
    fn norm_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn_norm.len()
                    + l.ffn_norm.len()
                    + l.attn_sub_norm.as_ref().map_or(0, |v| v.len())
                    + l.ffn_sub_norm.as_ref().map_or(0, |v| v.len())
            })
            .sum();
        4 * (layers + self.output_norm.len())
    }

    /// Deterministic synthetic weights with the shapes of `cfg`: ternary linear layers with
    /// about a third zeros in `format` and scales that give unit-variance outputs for
    /// unit-variance inputs, norms near 1, an embedding with standard deviation 1/√hidden.
    /// Layers are generated in parallel on `threads` threads, each from its own seed stream, so
    /// the result does not depend on the thread count.
    pub fn synthetic(cfg: &ModelConfig, format: WeightFormat, seed: u64, threads: usize) -> Result<Self> {
        cfg.validate()?;
        let threads = threads.max(1);
        let mut layers: Vec<Option<Result<LayerWeights>>> = (0..cfg.layers).map(|_| None).collect();
        std::thread::scope(|s| {
            for (t, chunk) in layers.chunks_mut(cfg.layers.div_ceil(threads)).enumerate() {
                let first = t * cfg.layers.div_ceil(threads);
                s.spawn(move || {
                    for (i, slot) in chunk.iter_mut().enumerate() {
                        *slot = Some(synthetic_layer(cfg, format, seed, first + i));
                    }
                });
            }
        });
        let layers = layers.into_iter().map(|l| l.expect("every layer generated")).collect::<Result<Vec<_>>>()?;
        let embd_std = 1.0 / (cfg.hidden as f32).sqrt();
        let token_embd = synthetic_int8(cfg.vocab, cfg.hidden, embd_std, seed ^ 0xE1BD, threads).into();
        let lm_head = (!cfg.tied_embeddings)
            .then(|| synthetic_int8(cfg.vocab, cfg.hidden, embd_std, seed ^ 0x1EAD, threads).into());
        let output_norm = norm_vector(cfg.hidden, seed ^ 0x0077);
        Ok(Self { token_embd, layers, output_norm, lm_head })
    }
}

impl LayerWeights {
    /// Names of the seven projections in GGUF tensor names, in the order of `linears`.
    pub const LINEAR_NAMES: [&'static str; 7] =
        ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

    /// The seven ternary projections, in the order q, k, v, o, gate, up, down.
    pub fn linears(&self) -> [&PackedWeights; 7] {
        [&self.wq, &self.wk, &self.wv, &self.wo, &self.w_gate, &self.w_up, &self.w_down]
    }
}

fn norm_vector(n: usize, seed: u64) -> Vec<f32> {
    let mut g = SplitMix64::new(seed);
    (0..n).map(|_| 1.0 + (g.unit_f32() - 0.5) * 0.2).collect()
}

/// Scale β for a ternary [out, in] layer so that unit-variance inputs give unit-variance
/// outputs: var = in × (2/3) × β². (With smaller residual contributions, or a larger
/// embedding, a random tied-embedding model just echoes its input token under greedy decoding.)
fn ternary_scale(inputs: usize) -> f32 {
    1.0 / (inputs as f32 * 2.0 / 3.0).sqrt()
}

fn synthetic_layer(cfg: &ModelConfig, format: WeightFormat, seed: u64, layer: usize) -> Result<LayerWeights> {
    let s = |tensor: u64| seed.wrapping_mul(0x100_0000_01B3) ^ ((layer as u64) << 8 | tensor);
    let lin = |rows: usize, cols: usize, tensor: u64| format.random(rows, cols, ternary_scale(cols), s(tensor));
    Ok(LayerWeights {
        attn_norm: norm_vector(cfg.hidden, s(1)),
        wq: lin(cfg.q_dim(), cfg.hidden, 2)?,
        wk: lin(cfg.kv_dim(), cfg.hidden, 3)?,
        wv: lin(cfg.kv_dim(), cfg.hidden, 4)?,
        attn_sub_norm: cfg.sub_norms.then(|| norm_vector(cfg.q_dim(), s(5))),
        wo: lin(cfg.hidden, cfg.q_dim(), 6)?,
        ffn_norm: norm_vector(cfg.hidden, s(7)),
        w_gate: lin(cfg.ffn, cfg.hidden, 8)?,
        w_up: lin(cfg.ffn, cfg.hidden, 9)?,
        ffn_sub_norm: cfg.sub_norms.then(|| norm_vector(cfg.ffn, s(10))),
        w_down: lin(cfg.hidden, cfg.ffn, 11)?,
        out_scales: [1.0; 7],
    })
}

/// Int8 rows of approximately normal values with standard deviation `std` (sum of 4 uniforms).
fn synthetic_int8(rows: usize, cols: usize, std: f32, seed: u64, threads: usize) -> Int8Rows {
    let mut m = Int8Rows::zeroed(rows, cols);
    let per = rows.div_ceil(threads.max(1));
    let parts: Vec<(usize, Int8Rows)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                s.spawn(move || {
                    let (r0, r1) = (t * per, ((t + 1) * per).min(rows));
                    let mut part = Int8Rows::zeroed(r1.saturating_sub(r0).max(1), cols);
                    let mut row = vec![0f32; cols];
                    for r in r0..r1 {
                        let mut g = SplitMix64::stream(seed, r as u64);
                        for v in row.iter_mut() {
                            // Irwin–Hall(4) centred: variance 4/12 → scale to `std`.
                            let u = g.unit_f32() + g.unit_f32() + g.unit_f32() + g.unit_f32() - 2.0;
                            *v = u * std * 3f32.sqrt();
                        }
                        part.set_row(r - r0, &row);
                    }
                    (r0, part)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("generator thread")).collect()
    });
    for (r0, part) in parts {
        if r0 < rows {
            m.copy_rows_from(r0, &part);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiply_adds_per_token_are_the_linear_and_head_weights() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let (h, q, kv, f) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
        let per_layer = q * h + 2 * kv * h + h * q + 3 * f * h;
        let want = (cfg.layers * per_layer + cfg.vocab * h) as u64;
        for format in [WeightFormat::I2, WeightFormat::Tq1_0] {
            let w = Weights::synthetic(&cfg, format, 1, 1).unwrap();
            assert_eq!(w.macs_per_token(), want, "{format}");
            assert_eq!(w.head_macs_per_token(), (cfg.vocab * h) as u64);
            assert_eq!(w.linear_macs_per_token() + w.head_macs_per_token(), want);
            let mut untied = w.clone();
            untied.lm_head = Some(w.token_embd.clone());
            assert_eq!(untied.macs_per_token(), want, "{format}, separate head");
        }
    }
}
