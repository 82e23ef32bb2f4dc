//! A [`Model`] from a GGUF file of llama.cpp's `bitnet` architecture, or bitnet.cpp's
//! `bitnet-b1.58` / `bitnet-25` (the official 2B4T files).

use crate::error::{Error, Result};
use crate::formats::{EmbeddingRows, I2Matrix, Int8Rows, PackedWeights, Q6kRows, Tq1Matrix, Tq2Matrix};
use crate::gguf::reader::{GgufFile, TensorDesc};
use crate::gguf::types::{decode_f32, decode_i2s, GgmlType};
use crate::model::config::{ActivationSource, FfnActivation, ModelConfig};
use crate::model::forward::Model;
use crate::model::weights::{LayerWeights, Weights};
use crate::ternary::TernaryMatrix;

/// Architectures this loader knows, with the FFN activation each implies when no metadata key
/// names one. `bitnet` is SiLU-gated because llama.cpp's graph for it is, unconditionally
/// (`LLM_FFN_SILU` in `src/models/bitnet.cpp`; its converter records no activation): that is right
/// for the 1bitLLM models and wrong for a 2B4T converted from Hugging Face, which also lands
/// there. `bitnet-b1.58` and `bitnet-25` are the names of the official 2B4T files, whose
/// config says `hidden_act: relu2` (bitnet.cpp runs `bitnet-b1.58` with SiLU, a known bug).
pub const ARCHITECTURES: [(&str, FfnActivation); 3] = [
    ("bitnet", FfnActivation::Silu),
    ("bitnet-b1.58", FfnActivation::ReluSquared),
    ("bitnet-25", FfnActivation::ReluSquared),
];

/// The metadata key llama.cpp reads an FFN activation from (`LLM_KV_HIDDEN_ACT`, gguf-py's
/// `add_hidden_act`), for architecture `arch`.
pub fn hidden_activation_key(arch: &str) -> String {
    format!("{arch}.hidden_activation")
}

/// Decides the FFN activation: a metadata key naming it wins (llama.cpp's
/// `<arch>.hidden_activation`, then the key this project wrote before that one), else the
/// architecture's.
fn activation_of(f: &GgufFile<'_>, arch: &str, by_arch: FfnActivation) -> Result<(FfnActivation, ActivationSource)> {
    for key in [hidden_activation_key(arch), crate::gguf::writer::LEGACY_ACTIVATION_KEY.to_string()] {
        let Some(v) = f.get(&key) else { continue };
        let act = v.as_str().and_then(FfnActivation::from_metadata).ok_or_else(|| {
            Error::Unsupported(format!(
                "metadata key '{key}' is {v}; this engine runs BitNet FFNs gated by \"silu\" (also \"swish\", \"swiglu\") or \"relu2\""
            ))
        })?;
        return Ok((act, ActivationSource::MetadataKey(key)));
    }
    Ok((by_arch, ActivationSource::Architecture(arch.to_string())))
}

/// Builds the model in a parsed GGUF file. `name` is used when the file has no `general.name`.
pub fn model_from_gguf(f: &GgufFile<'_>, name: &str) -> Result<Model> {
    let config = config_from_gguf(f, name)?;
    let weights = weights_from_gguf(f, &config)?;
    Ok(Model::new(config, weights))
}

fn key_u64(f: &GgufFile<'_>, key: &str, default: Option<u64>) -> Result<u64> {
    match f.get(key) {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| Error::Format(format!("metadata key '{key}' is {v}; expected a non-negative integer"))),
        None => default.ok_or_else(|| Error::Format(format!("metadata key '{key}' is missing"))),
    }
}

fn key_f32(f: &GgufFile<'_>, key: &str, default: f32) -> Result<f32> {
    match f.get(key) {
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Error::Format(format!("metadata key '{key}' is {v}; expected a number"))),
        None => Ok(default),
    }
}

/// Hyperparameters from the metadata (llama.cpp's keys; defaults as llama.cpp's where a key
/// is optional), checked against the tensor shapes.
pub fn config_from_gguf(f: &GgufFile<'_>, name: &str) -> Result<ModelConfig> {
    let arch = f
        .get("general.architecture")
        .ok_or_else(|| Error::Format("metadata key 'general.architecture' is missing".into()))?;
    let arch = arch
        .as_str()
        .ok_or_else(|| Error::Format(format!("metadata key 'general.architecture' is {arch}; expected a string")))?;
    let (_, activation) = ARCHITECTURES.iter().find(|(a, _)| *a == arch).ok_or_else(|| {
        Error::Unsupported(format!(
            "architecture '{arch}' (metadata key 'general.architecture'); this engine runs: {}",
            ARCHITECTURES.map(|(a, _)| a).join(", ")
        ))
    })?;
    let k = |s: &str| format!("{arch}.{s}");
    let heads = key_u64(f, &k("attention.head_count"), None)? as usize;
    let embd =
        f.tensor("token_embd.weight").ok_or_else(|| Error::Format("tensor 'token_embd.weight' is missing".into()))?;
    let vocab = match f.get(&k("vocab_size")) {
        Some(_) => key_u64(f, &k("vocab_size"), None)? as usize,
        None => embd.rows_cols().0,
    };
    let (activation, activation_source) = activation_of(f, arch, *activation)?;
    let cfg = ModelConfig {
        name: f.get("general.name").and_then(|v| v.as_str()).unwrap_or(name).to_string(),
        hidden: key_u64(f, &k("embedding_length"), None)? as usize,
        ffn: key_u64(f, &k("feed_forward_length"), None)? as usize,
        layers: key_u64(f, &k("block_count"), None)? as usize,
        heads,
        kv_heads: key_u64(f, &k("attention.head_count_kv"), Some(heads as u64))? as usize,
        vocab,
        max_context: key_u64(f, &k("context_length"), Some(2048))? as usize,
        rope_theta: key_f32(f, &k("rope.freq_base"), 10_000.0)?,
        norm_eps: key_f32(f, &k("attention.layer_norm_rms_epsilon"), 1e-5)?,
        activation,
        activation_source,
        sub_norms: f.tensor("blk.0.attn_sub_norm.weight").is_some(),
        tied_embeddings: f.tensor("output.weight").is_none(),
    };
    cfg.validate().map_err(|e| Error::Format(format!("hyperparameters in the metadata do not fit: {e}")))?;
    if cfg.layers > 4096 || cfg.hidden > 1 << 16 || cfg.ffn > 1 << 18 || cfg.vocab > 1 << 22 {
        return Err(Error::Format(format!("hyperparameters are implausibly large: {cfg}")));
    }
    Ok(cfg)
}

fn tensor<'f>(f: &'f GgufFile<'_>, name: &str) -> Result<&'f TensorDesc> {
    f.tensor(name).ok_or_else(|| Error::Format(format!("tensor '{name}' is missing")))
}

fn check_shape(t: &TensorDesc, rows: usize, cols: usize) -> Result<()> {
    let want: Vec<u64> = if rows == 1 { vec![cols as u64] } else { vec![cols as u64, rows as u64] };
    if t.dims != want {
        return Err(Error::Format(format!(
            "tensor '{}' has GGUF dims {:?}; the hyperparameters need {:?}",
            t.name, t.dims, want
        )));
    }
    Ok(())
}

/// An f32 vector (norm weights).
fn vector(f: &GgufFile<'_>, name: &str, n: usize) -> Result<Vec<f32>> {
    let t = tensor(f, name)?;
    check_shape(t, 1, n)?;
    let mut out = vec![0f32; n];
    decode_f32(t.ggml_type, f.data(t), &mut out).ok_or_else(|| {
        Error::Unsupported(format!("tensor '{name}' is {}; norm weights must be F32, F16 or BF16", t.ggml_type.name()))
    })?;
    Ok(out)
}

/// The optional scalar llama.cpp multiplies a projection's output by (`ggml_mul` with a
/// one-element tensor); 1 when the tensor is absent.
fn out_scale(f: &GgufFile<'_>, name: &str) -> Result<f32> {
    let Some(t) = f.tensor(name) else { return Ok(1.0) };
    let elements: u64 = t.dims.iter().product();
    if elements != 1 {
        return Err(Error::Format(format!(
            "tensor '{name}' has shape {:?}; a projection scale has one element",
            t.dims
        )));
    }
    let mut v = [0f32];
    decode_f32(t.ggml_type, f.data(t), &mut v).ok_or_else(|| {
        Error::Unsupported(format!(
            "tensor '{name}' is {}; a projection scale must be F32, F16 or BF16",
            t.ggml_type.name()
        ))
    })?;
    if !v[0].is_finite() {
        return Err(Error::Format(format!("tensor '{name}' is {}; a projection scale must be finite", v[0])));
    }
    Ok(v[0])
}

/// A `[rows, cols]` embedding or untied output: Q6_K as stored (what llama.cpp reads), any
/// float type as int8 rows.
fn embedding(f: &GgufFile<'_>, name: &str, rows: usize, cols: usize) -> Result<EmbeddingRows> {
    let t = tensor(f, name)?;
    if t.ggml_type == GgmlType::Q6K {
        check_shape(t, rows, cols)?;
        return Ok(Q6kRows::from_bytes(rows, cols, f.data(t))
            .map_err(|e| Error::Format(format!("tensor '{name}': {e}")))?
            .into());
    }
    Ok(int8_rows(f, name, rows, cols)?.into())
}

/// A `[rows, cols]` float matrix (embedding, untied output) as int8 rows.
fn int8_rows(f: &GgufFile<'_>, name: &str, rows: usize, cols: usize) -> Result<Int8Rows> {
    let t = tensor(f, name)?;
    check_shape(t, rows, cols)?;
    let data = f.data(t);
    let row_bytes =
        t.ggml_type.byte_size(cols as u64, cols as u64).map_err(|e| Error::Format(format!("tensor '{name}': {e}")))?;
    let mut m = Int8Rows::zeroed(rows, cols);
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        decode_f32(t.ggml_type, &data[r * row_bytes..(r + 1) * row_bytes], &mut row).ok_or_else(|| {
            Error::Unsupported(format!(
                "tensor '{name}' is {}; embeddings must be F32, F16, BF16 or Q6_K",
                t.ggml_type.name()
            ))
        })?;
        if let Some(c) = row.iter().position(|v| !v.is_finite()) {
            return Err(Error::Format(format!("tensor '{name}' holds a non-finite value at row {r}, column {c}")));
        }
        m.set_row(r, &row);
    }
    Ok(m)
}

/// A ternary linear layer `[rows, cols]`.
fn linear(f: &GgufFile<'_>, name: &str, rows: usize, cols: usize) -> Result<PackedWeights> {
    let t = tensor(f, name)?;
    check_shape(t, rows, cols)?;
    let data = f.data(t);
    let ctx = |e: Error| Error::Format(format!("tensor '{name}': {e}"));
    Ok(match t.ggml_type {
        GgmlType::Tq2_0 => PackedWeights::Tq2(Tq2Matrix::from_bytes(rows, cols, data).map_err(ctx)?),
        GgmlType::Tq1_0 => PackedWeights::Tq1(Tq1Matrix::from_bytes(rows, cols, data).map_err(ctx)?),
        GgmlType::I2S => {
            let (values, scale) =
                decode_i2s(data, rows, cols).map_err(|e| Error::Format(format!("tensor '{name}': {e}")))?;
            PackedWeights::I2(
                I2Matrix::pack(&TernaryMatrix::new(rows, cols, values, scale).map_err(ctx)?).map_err(ctx)?,
            )
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => {
            // Unquantized conversions of BitNet checkpoints hold ternary × scale values.
            let mut w = vec![0f32; rows * cols];
            decode_f32(t.ggml_type, data, &mut w).expect("float types decode");
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut values = Vec::with_capacity(w.len());
            for (i, v) in w.iter().enumerate() {
                let q = (v * inv).round();
                if (v * inv - q).abs() > 1e-3 {
                    return Err(Error::Unsupported(format!(
                        "tensor '{name}' is {} with non-ternary values (row {}, column {}: {v} with scale {scale}); quantize it to TQ1_0 or TQ2_0 first",
                        t.ggml_type.name(),
                        i / cols,
                        i % cols
                    )));
                }
                values.push(q as i8);
            }
            PackedWeights::I2(
                I2Matrix::pack(&TernaryMatrix::new(rows, cols, values, scale).map_err(ctx)?).map_err(ctx)?,
            )
        }
        other => {
            return Err(Error::Unsupported(format!(
                "tensor '{name}' is {}; linear layers must be TQ1_0, TQ2_0, I2_S or ternary-valued F32/F16/BF16",
                other.name()
            )))
        }
    })
}

fn weights_from_gguf(f: &GgufFile<'_>, cfg: &ModelConfig) -> Result<Weights> {
    for t in &f.tensors {
        let known =
            (0..cfg.layers).any(|l| LayerWeights::LINEAR_NAMES.iter().any(|p| t.name == format!("blk.{l}.{p}.scale")));
        if t.name.ends_with(".scale") && !known {
            return Err(Error::Format(format!(
                "tensor '{}': a .scale tensor that belongs to no projection (expected blk.N.{{{}}}.scale, N < {})",
                t.name,
                LayerWeights::LINEAR_NAMES.join(","),
                cfg.layers
            )));
        }
    }
    let (h, q, kv, ffn) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
    let mut layers = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let opt_vec = |s: &str, len: usize| -> Result<Option<Vec<f32>>> {
            if cfg.sub_norms {
                Ok(Some(vector(f, &n(s), len)?))
            } else {
                Ok(None)
            }
        };
        layers.push(LayerWeights {
            attn_norm: vector(f, &n("attn_norm"), h)?,
            wq: linear(f, &n("attn_q"), q, h)?,
            wk: linear(f, &n("attn_k"), kv, h)?,
            wv: linear(f, &n("attn_v"), kv, h)?,
            attn_sub_norm: opt_vec("attn_sub_norm", q)?,
            wo: linear(f, &n("attn_output"), h, q)?,
            ffn_norm: vector(f, &n("ffn_norm"), h)?,
            w_gate: linear(f, &n("ffn_gate"), ffn, h)?,
            w_up: linear(f, &n("ffn_up"), ffn, h)?,
            ffn_sub_norm: opt_vec("ffn_sub_norm", ffn)?,
            w_down: linear(f, &n("ffn_down"), h, ffn)?,
            out_scales: {
                let mut s = [1f32; 7];
                for (v, p) in s.iter_mut().zip(LayerWeights::LINEAR_NAMES) {
                    *v = out_scale(f, &format!("blk.{l}.{p}.scale"))?;
                }
                s
            },
        });
    }
    Ok(Weights {
        token_embd: embedding(f, "token_embd.weight", cfg.vocab, h)?,
        layers,
        output_norm: vector(f, "output_norm.weight", h)?,
        lm_head: if cfg.tied_embeddings { None } else { Some(embedding(f, "output.weight", cfg.vocab, h)?) },
    })
}
