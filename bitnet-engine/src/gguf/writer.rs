//! Writing GGUF: a model saved in the layouts its peers run, so the very same weights can be run
//! by llama.cpp's `llama-bench` or bitnet.cpp beside ours:
//! - TQ2_0 / TQ1_0 linear weights under llama.cpp's `bitnet` (SiLU-gated models) or bitnet.cpp's
//!   `bitnet-25` (ReLU²-gated: llama.cpp's `bitnet` graph is SiLU-only, so such a model would run
//!   there as a different function; llama.cpp refuses `bitnet-25` instead);
//! - I2_S linear weights under `bitnet-b1.58`, as the official 2B4T file is laid out.
//!
//! F16 embedding (Q6_K kept as stored), F32 norms, the activation under
//! `<arch>.hidden_activation`, a minimal llama-style vocabulary.
//!
//! Tensors are written one at a time (a 2B4T file never sits in memory) to a temporary file
//! that is renamed into place when complete.

use std::io::{BufWriter, Write};
use std::path::Path;

use half::f16;

use crate::error::{Error, Result};
use crate::formats::{EmbeddingRows, Int8Rows, PackedWeights, Tq1Matrix, Tq2Matrix, WeightFormat};
use crate::gguf::load::hidden_activation_key;
use crate::gguf::reader::Value;
use crate::gguf::types::{encode_i2s, GgmlType};
use crate::model::forward::Model;
use crate::model::weights::LayerWeights;
use crate::ops::FfnActivation;

const ALIGNMENT: usize = 32;

/// The key this project recorded a saved model's FFN gating under before it wrote llama.cpp's
/// `<arch>.hidden_activation`; still read, so older files load as they were saved.
pub const LEGACY_ACTIVATION_KEY: &str = "bitnet_perf.ffn_activation";

type Producer<'a> = Box<dyn Fn(&mut dyn Write) -> std::io::Result<()> + 'a>;

struct PendingTensor<'a> {
    name: String,
    /// GGUF dims, fastest first.
    dims: Vec<u64>,
    ty: GgmlType,
    size: usize,
    write: Producer<'a>,
}

fn matrix<'a>(name: String, rows: usize, cols: usize, ty: GgmlType, write: Producer<'a>) -> PendingTensor<'a> {
    PendingTensor {
        size: ty.byte_size(cols as u64, (rows * cols) as u64).expect("shape checked by tensor_layout"),
        name,
        dims: vec![cols as u64, rows as u64],
        ty,
        write,
    }
}

fn linear(name: String, p: &PackedWeights, ty: GgmlType) -> PendingTensor<'_> {
    matrix(
        name,
        p.rows(),
        p.cols(),
        ty,
        Box::new(move |out: &mut dyn Write| out.write_all(&ternary_bytes(p, ty).map_err(std::io::Error::other)?)),
    )
}

fn vector(name: String, v: &[f32]) -> PendingTensor<'_> {
    PendingTensor {
        name,
        dims: vec![v.len() as u64],
        ty: GgmlType::F32,
        size: 4 * v.len(),
        write: Box::new(f32_vec(v)),
    }
}

fn put_string(w: &mut dyn Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(w: &mut dyn Write, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&[*x as u8]),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => put_string(w, s),
        Value::Array(items) => {
            w.write_all(&items.first().map_or(4, type_id).to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|i| put_value(w, i))
        }
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}

/// A minimal llama (SentencePiece-style) vocabulary of `n` tokens: `<unk>`, `<s>`, `</s>`, the
/// 256 byte tokens `<0x00>`..`<0xFF>` llama.cpp's tokenizer looks up, then `<tN>` fillers.
fn vocabulary(n: usize) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        let (t, ty) = match i {
            0 => ("<unk>".to_string(), 2),
            1 => ("<s>".to_string(), 3),
            2 => ("</s>".to_string(), 3),
            3..=258 => (format!("<0x{:02X}>", i - 3), 6),
            _ => (format!("<t{i}>"), 1),
        };
        tokens.push(Value::String(t));
        types.push(Value::I32(ty));
    }
    (tokens, vec![Value::F32(0.0); n], types)
}

/// An embedding or untied output: Q6_K as it is; int8 rows as F16 (every int8 × scale value is
/// within f16's range and loses at most f16's rounding).
fn embedding_tensor<'a>(name: &str, m: &'a EmbeddingRows) -> PendingTensor<'a> {
    match m {
        EmbeddingRows::Int8(rows) => matrix(name.into(), m.rows(), m.cols(), GgmlType::F16, Box::new(f16_rows(rows))),
        EmbeddingRows::Q6K(q) => {
            matrix(name.into(), m.rows(), m.cols(), GgmlType::Q6K, Box::new(move |w| w.write_all(q.as_bytes())))
        }
    }
}

fn f16_rows(m: &Int8Rows) -> impl Fn(&mut dyn Write) -> std::io::Result<()> + '_ {
    move |w| {
        let mut row = vec![0f32; m.cols()];
        let mut buf = Vec::with_capacity(2 * m.cols());
        for r in 0..m.rows() {
            m.dequantize_row(r, &mut row);
            buf.clear();
            buf.extend(row.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()));
            w.write_all(&buf)?;
        }
        Ok(())
    }
}

fn f32_vec(v: &[f32]) -> impl Fn(&mut dyn Write) -> std::io::Result<()> + '_ {
    move |w| w.write_all(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// One linear layer as TQ2_0, TQ1_0 or I2_S bytes (weights already in that format are written
/// as they are; others are repacked, each TQ block scale = f16 of the tensor scale).
fn ternary_bytes(w: &PackedWeights, ty: GgmlType) -> Result<Vec<u8>> {
    Ok(match (w, ty) {
        (PackedWeights::Tq2(m), GgmlType::Tq2_0) => m.to_bytes(),
        (PackedWeights::Tq1(m), GgmlType::Tq1_0) => m.to_bytes(),
        (_, GgmlType::Tq2_0) => Tq2Matrix::pack(&w.unpack())?.to_bytes(),
        (_, GgmlType::Tq1_0) => Tq1Matrix::pack(&w.unpack())?.to_bytes(),
        (_, GgmlType::I2S) => {
            let t = w.unpack();
            encode_i2s(&t.values, t.scale)
        }
        _ => unreachable!("save_model only asks for ternary types"),
    })
}

/// The architecture a saved model is written under (see the module comment).
pub fn saved_architecture(activation: FfnActivation, format: WeightFormat) -> &'static str {
    match (format, activation) {
        (WeightFormat::I2, _) => "bitnet-b1.58",
        (_, FfnActivation::Silu) => "bitnet",
        (_, FfnActivation::ReluSquared) => "bitnet-25",
    }
}

/// Saves `model` as a GGUF file with linear layers in `format`: TQ2_0 or TQ1_0 (llama.cpp's
/// types), or I2 as bitnet.cpp's I2_S. The architecture follows the FFN gating, so no peer runs
/// the file as a different function ([`saved_architecture`]); the gating is also written under
/// `<arch>.hidden_activation`, which this loader reads first.
pub fn save_model(model: &Model, format: WeightFormat, path: &Path) -> Result<()> {
    let ty = match format {
        WeightFormat::Tq2_0 => GgmlType::Tq2_0,
        WeightFormat::Tq1_0 => GgmlType::Tq1_0,
        WeightFormat::I2 => GgmlType::I2S,
        other => {
            return Err(Error::Unsupported(format!(
                "GGUF files hold ternary weights as TQ2_0 or TQ1_0 (llama.cpp) or I2_S (bitnet.cpp, format i2), not {other}; save with one of those"
            )))
        }
    };
    let cfg = &model.config;
    let w = &model.weights;
    crate::model::layout::tensor_layout(cfg, format)?;
    let a = saved_architecture(cfg.activation, format);
    let (tokens, scores, types) = vocabulary(cfg.vocab);
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String(cfg.name.clone())),
        (format!("{a}.vocab_size"), Value::U32(cfg.vocab as u32)),
        (format!("{a}.context_length"), Value::U32(cfg.max_context as u32)),
        (format!("{a}.embedding_length"), Value::U32(cfg.hidden as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(cfg.ffn as u32)),
        (format!("{a}.block_count"), Value::U32(cfg.layers as u32)),
        (format!("{a}.attention.head_count"), Value::U32(cfg.heads as u32)),
        (format!("{a}.attention.head_count_kv"), Value::U32(cfg.kv_heads as u32)),
        (format!("{a}.rope.freq_base"), Value::F32(cfg.rope_theta)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(cfg.norm_eps)),
        (hidden_activation_key(a), Value::String(cfg.activation.name().into())),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.scores".into(), Value::Array(scores)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
    ];
    let mut tensors: Vec<PendingTensor> = Vec::new();
    tensors.push(embedding_tensor("token_embd.weight", &w.token_embd));
    for (l, lw) in w.layers.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let lin = |name: &str, p| linear(n(name), p, ty);
        tensors.push(vector(n("attn_norm"), &lw.attn_norm));
        tensors.push(lin("attn_q", &lw.wq));
        tensors.push(lin("attn_k", &lw.wk));
        tensors.push(lin("attn_v", &lw.wv));
        if let Some(v) = &lw.attn_sub_norm {
            tensors.push(vector(n("attn_sub_norm"), v));
        }
        tensors.push(lin("attn_output", &lw.wo));
        tensors.push(vector(n("ffn_norm"), &lw.ffn_norm));
        tensors.push(lin("ffn_gate", &lw.w_gate));
        tensors.push(lin("ffn_up", &lw.w_up));
        if let Some(v) = &lw.ffn_sub_norm {
            tensors.push(vector(n("ffn_sub_norm"), v));
        }
        tensors.push(lin("ffn_down", &lw.w_down));
        // llama.cpp's optional per-projection output scales, only where they are not 1.
        for (p, v) in LayerWeights::LINEAR_NAMES.iter().zip(&lw.out_scales) {
            if *v != 1.0 {
                tensors.push(vector(format!("blk.{l}.{p}.scale"), std::slice::from_ref(v)));
            }
        }
    }
    tensors.push(vector("output_norm.weight".into(), &w.output_norm));
    if let Some(head) = &w.lm_head {
        tensors.push(embedding_tensor("output.weight", head));
    }
    write_file(path, &meta, &tensors)
}

/// A tensor given as its bytes, for [`write_raw`].
pub struct RawTensor {
    pub name: String,
    /// GGUF dims, fastest first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// The data as it goes into the file (its length need not match the type table: tests
    /// write damaged files on purpose).
    pub data: Vec<u8>,
}

/// Writes a GGUF file of exactly these metadata and tensors, in order, atomically: fixtures for
/// tests and tools that need a file no model makes (other layouts, damaged or duplicate tensors).
pub fn write_raw(path: &Path, meta: &[(String, Value)], tensors: &[RawTensor]) -> Result<()> {
    let pending: Vec<PendingTensor<'_>> = tensors
        .iter()
        .map(|t| PendingTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
            size: t.data.len(),
            write: Box::new(move |w: &mut dyn Write| w.write_all(&t.data)),
        })
        .collect();
    write_file(path, meta, &pending)
}

fn write_file(path: &Path, meta: &[(String, Value)], tensors: &[PendingTensor<'_>]) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| Error::Format(format!("{}: no file name", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let io = |e: std::io::Error| Error::Format(format!("{}: {e}", path.display()));
    let result = (|| -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        w.write_all(b"GGUF")?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(meta.len() as u64).to_le_bytes())?;
        let mut pos = 24usize;
        let mut header = Vec::new();
        for (k, v) in meta {
            put_string(&mut header, k)?;
            header.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut header, v)?;
        }
        let mut offset = 0usize;
        for t in tensors {
            put_string(&mut header, &t.name)?;
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.ty.id().to_le_bytes());
            header.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.size.div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        w.write_all(&header)?;
        pos += header.len();
        w.write_all(&vec![0u8; pos.div_ceil(ALIGNMENT) * ALIGNMENT - pos])?;
        for t in tensors {
            (t.write)(&mut w)?;
            w.write_all(&vec![0u8; t.size.div_ceil(ALIGNMENT) * ALIGNMENT - t.size])?;
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}
