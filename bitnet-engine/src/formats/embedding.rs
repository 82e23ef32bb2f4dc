//! `EmbeddingRows`: the token embedding and LM head matrix (tied in BitNet b1.58 models), in
//! one of the two row formats the engine multiplies: int8 rows (synthetic weights, and GGUF
//! embeddings stored as floats) or Q6_K as a GGUF stores it.

use crate::formats::{Int8Rows, Q6kRows};

/// A `[vocab, hidden]` embedding or LM head.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingRows {
    /// int8 with one f32 scale per row.
    Int8(Int8Rows),
    /// llama.cpp Q6_K blocks, as stored.
    Q6K(Q6kRows),
}

impl EmbeddingRows {
    pub fn rows(&self) -> usize {
        match self {
            EmbeddingRows::Int8(m) => m.rows(),
            EmbeddingRows::Q6K(m) => m.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            EmbeddingRows::Int8(m) => m.cols(),
            EmbeddingRows::Q6K(m) => m.cols(),
        }
    }

    /// Bytes read to use every weight once (what one LM head product reads).
    pub fn byte_len(&self) -> usize {
        match self {
            EmbeddingRows::Int8(m) => m.byte_len(),
            EmbeddingRows::Q6K(m) => m.byte_len(),
        }
    }

    /// Bytes of one row as stored (what one embedding lookup reads).
    pub fn row_bytes(&self) -> usize {
        match self {
            EmbeddingRows::Int8(m) => m.stride() + 4,
            EmbeddingRows::Q6K(m) => m.blocks_per_row() * super::Q6K_BLOCK_BYTES,
        }
    }

    /// Row `r` as f32 (`cols` values): the embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self {
            EmbeddingRows::Int8(m) => m.dequantize_row(r, out),
            EmbeddingRows::Q6K(m) => m.dequantize_row(r, out),
        }
    }

    /// The storage type's name, as `inspect` and the docs call it.
    pub fn type_name(&self) -> &'static str {
        match self {
            EmbeddingRows::Int8(_) => "int8_rows",
            EmbeddingRows::Q6K(_) => "Q6_K",
        }
    }
}

impl From<Int8Rows> for EmbeddingRows {
    fn from(m: Int8Rows) -> Self {
        EmbeddingRows::Int8(m)
    }
}

impl From<Q6kRows> for EmbeddingRows {
    fn from(m: Q6kRows) -> Self {
        EmbeddingRows::Q6K(m)
    }
}
