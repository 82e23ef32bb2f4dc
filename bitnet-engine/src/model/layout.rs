//! The tensor list of a model (llama.cpp's names, shapes, types, exact bytes), computed from the
//! config and the weight format without generating any weights — what `inspect` prints.

use crate::error::{Error, Result};
use crate::formats::{I2Matrix, WeightFormat, QK_K};
use crate::model::config::ModelConfig;

/// One tensor of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// GGUF name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// `[rows (outputs), cols (inputs)]`, or `[n]` for vectors.
    pub shape: Vec<usize>,
    /// Storage type: a weight format name, `int8_rows` or `f32`.
    pub dtype: String,
    /// Exact bytes.
    pub bytes: usize,
}

/// Bytes of a `[rows, cols]` ternary matrix in `format` (including its scales).
pub fn ternary_bytes(format: WeightFormat, rows: usize, cols: usize) -> Result<usize> {
    if format.needs_qk_multiple() && !cols.is_multiple_of(QK_K) {
        return Err(Error::Shape(format!(
            "{format} needs every linear layer's input width to be a multiple of {QK_K}; this model has one of {cols}"
        )));
    }
    Ok(match format {
        WeightFormat::I2 => rows * I2Matrix::row_bytes_for(cols) + 4,
        WeightFormat::Tq2_0 => rows * cols / QK_K * 66,
        WeightFormat::Tq1_0 => rows * cols / QK_K * 54,
        WeightFormat::BitPlanes => rows * 2 * cols.div_ceil(64) * 8 + 4,
        WeightFormat::Binary => rows * cols.div_ceil(64) * 8 + 4,
    })
}

/// Every tensor of `cfg` with linear layers in `format`.
pub fn tensor_layout(cfg: &ModelConfig, format: WeightFormat) -> Result<Vec<TensorInfo>> {
    let mut t = Vec::new();
    let vector = |name: String, n: usize| TensorInfo { name, shape: vec![n], dtype: "f32".into(), bytes: 4 * n };
    let int8 = |name: &str| TensorInfo {
        name: name.into(),
        shape: vec![cfg.vocab, cfg.hidden],
        dtype: "int8_rows".into(),
        bytes: cfg.vocab * (cfg.hidden + 4),
    };
    t.push(int8("token_embd.weight"));
    for l in 0..cfg.layers {
        let lin = |name: &str, rows: usize, cols: usize| -> Result<TensorInfo> {
            Ok(TensorInfo {
                name: format!("blk.{l}.{name}.weight"),
                shape: vec![rows, cols],
                dtype: format.name().into(),
                bytes: ternary_bytes(format, rows, cols)?,
            })
        };
        t.push(vector(format!("blk.{l}.attn_norm.weight"), cfg.hidden));
        t.push(lin("attn_q", cfg.q_dim(), cfg.hidden)?);
        t.push(lin("attn_k", cfg.kv_dim(), cfg.hidden)?);
        t.push(lin("attn_v", cfg.kv_dim(), cfg.hidden)?);
        if cfg.sub_norms {
            t.push(vector(format!("blk.{l}.attn_sub_norm.weight"), cfg.q_dim()));
        }
        t.push(lin("attn_output", cfg.hidden, cfg.q_dim())?);
        t.push(vector(format!("blk.{l}.ffn_norm.weight"), cfg.hidden));
        t.push(lin("ffn_gate", cfg.ffn, cfg.hidden)?);
        t.push(lin("ffn_up", cfg.ffn, cfg.hidden)?);
        if cfg.sub_norms {
            t.push(vector(format!("blk.{l}.ffn_sub_norm.weight"), cfg.ffn));
        }
        t.push(lin("ffn_down", cfg.hidden, cfg.ffn)?);
    }
    t.push(vector("output_norm.weight".into(), cfg.hidden));
    if !cfg.tied_embeddings {
        t.push(int8("output.weight"));
    }
    Ok(t)
}

/// Bytes one decode step reads from weights: everything but the embedding table (of which one
/// row is read) — with a tied LM head the table *is* read in full, as the LM head.
pub fn bytes_read_per_token(cfg: &ModelConfig, layout: &[TensorInfo]) -> usize {
    layout.iter().filter(|t| t.name != "token_embd.weight" || cfg.tied_embeddings).map(|t| t.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::weights::Weights;

    #[test]
    fn layout_bytes_equal_the_generated_weights() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        for format in
            [WeightFormat::I2, WeightFormat::Tq2_0, WeightFormat::Tq1_0, WeightFormat::BitPlanes, WeightFormat::Binary]
        {
            let layout = tensor_layout(&cfg, format).unwrap();
            let w = Weights::synthetic(&cfg, format, 1, 1).unwrap();
            let linear: usize = layout.iter().filter(|t| t.dtype == format.name()).map(|t| t.bytes).sum();
            let scales = if matches!(format, WeightFormat::I2 | WeightFormat::BitPlanes | WeightFormat::Binary) {
                4 * 7 * cfg.layers
            } else {
                0
            };
            assert_eq!(linear, w.linear_bytes() + scales, "{format}");
            assert_eq!(bytes_read_per_token(&cfg, &layout), w.bytes_read_per_token() + scales, "{format}");
            assert_eq!(layout.iter().map(|t| t.bytes).sum::<usize>(), w.total_bytes(), "{format}");
            assert_eq!(layout.iter().filter(|t| t.name.starts_with("blk.0.")).count(), 11);
        }
    }

    #[test]
    fn tq_formats_refuse_widths_that_are_not_multiples_of_256() {
        let cfg = ModelConfig::preset("bitnet-b1.58-3b").unwrap();
        let e = tensor_layout(&cfg, WeightFormat::Tq2_0).unwrap_err().to_string();
        // hidden = 3200 (and ffn = 8640) are not multiples of 256.
        assert!(e.contains("3200") && e.contains("256"), "{e}");
        assert!(tensor_layout(&cfg, WeightFormat::I2).is_ok());
    }
}
