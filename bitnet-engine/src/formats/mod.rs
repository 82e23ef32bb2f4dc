//! Packed weight formats. Each packs from a dense [`TernaryMatrix`] and unpacks back.

pub mod bitplanes;
pub mod embedding;
pub mod i2;
pub mod int8;
pub mod q6k;
pub mod q6k_groups;
pub mod tq1;
pub mod tq1_lut;
pub mod tq1_perm;
pub mod tq2;

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::ternary::TernaryMatrix;

pub use bitplanes::{BinaryMatrix, BitPlaneMatrix};
pub use embedding::EmbeddingRows;
pub use i2::{BlockI2, I2Matrix};
pub use int8::Int8Rows;
pub use q6k::{Q6kRows, Q6K_BLOCK_BYTES};
pub use q6k_groups::{Q6kRowGroups, Q6K_GROUP_ROWS};
pub use tq1::{BlockTq1_0, Tq1Matrix};
pub use tq1_lut::Tq1LutMatrix;
pub use tq1_perm::Tq1PermMatrix;
pub use tq2::{BlockTq2_0, Tq2Matrix, QK_K};

/// A dense matrix read weight by weight from a packed one through its plain decoder: how
/// every format unpacks (and so what round-trip tests compare).
pub(crate) fn unpack_by(rows: usize, cols: usize, scale: f32, get: impl Fn(usize, usize) -> i8) -> TernaryMatrix {
    let mut values = vec![0i8; rows * cols];
    for (r, row) in values.chunks_mut(cols).enumerate() {
        for (k, v) in row.iter_mut().enumerate() {
            *v = get(r, k);
        }
    }
    TernaryMatrix { rows, cols, values, scale }
}

/// The weight formats the kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// 2-bit codes, one f32 scale per tensor (bitnet.cpp I2_S semantics, our SIMD layout).
    I2,
    /// llama.cpp TQ2_0: 2-bit codes, f16 scale per 256 weights.
    Tq2_0,
    /// llama.cpp TQ1_0: base-3, 1.6875 bits per weight, f16 scale per 256 weights.
    Tq1_0,
    /// Ternary as sign + non-zero mask bit-planes (2 bits per weight), for XNOR/popcount.
    BitPlanes,
    /// Sign-only ±1 weights, 1 bit per weight.
    Binary,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 5] =
        [WeightFormat::I2, WeightFormat::Tq2_0, WeightFormat::Tq1_0, WeightFormat::BitPlanes, WeightFormat::Binary];

    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::I2 => "i2",
            WeightFormat::Tq2_0 => "tq2_0",
            WeightFormat::Tq1_0 => "tq1_0",
            WeightFormat::BitPlanes => "bitplanes",
            WeightFormat::Binary => "binary",
        }
    }

    /// Whether the format needs K to be a multiple of 256 (llama.cpp's block formats).
    pub fn needs_qk_multiple(self) -> bool {
        matches!(self, WeightFormat::Tq2_0 | WeightFormat::Tq1_0)
    }

    /// Packs `m` into this format.
    pub fn pack(self, m: &TernaryMatrix) -> Result<PackedWeights> {
        Ok(match self {
            WeightFormat::I2 => PackedWeights::I2(I2Matrix::pack(m)?),
            WeightFormat::Tq2_0 => PackedWeights::Tq2(Tq2Matrix::pack(m)?),
            WeightFormat::Tq1_0 => PackedWeights::Tq1(Tq1Matrix::pack(m)?),
            WeightFormat::BitPlanes => PackedWeights::BitPlanes(BitPlaneMatrix::pack(m)?),
            WeightFormat::Binary => PackedWeights::Binary(BinaryMatrix::pack(m)?),
        })
    }

    /// Random weights generated straight into this format (fast, for benchmarks).
    pub fn random(self, rows: usize, cols: usize, scale: f32, seed: u64) -> Result<PackedWeights> {
        Ok(match self {
            WeightFormat::I2 => PackedWeights::I2(I2Matrix::random(rows, cols, scale, seed)?),
            WeightFormat::Tq2_0 => PackedWeights::Tq2(Tq2Matrix::random(rows, cols, scale, seed)?),
            WeightFormat::Tq1_0 => PackedWeights::Tq1(Tq1Matrix::random(rows, cols, scale, seed)?),
            WeightFormat::BitPlanes => PackedWeights::BitPlanes(BitPlaneMatrix::random(rows, cols, scale, seed)?),
            WeightFormat::Binary => PackedWeights::Binary(BinaryMatrix::random(rows, cols, scale, seed)?),
        })
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        WeightFormat::ALL.iter().copied().find(|f| f.name() == s.to_ascii_lowercase()).ok_or_else(|| {
            Error::UnknownName {
                what: "weight format",
                got: s.to_string(),
                expected: WeightFormat::ALL.map(|f| f.name()).join(", "),
            }
        })
    }
}

/// A packed weight matrix of any format: what a kernel takes.
#[derive(Debug, Clone, PartialEq)]
pub enum PackedWeights {
    I2(I2Matrix),
    Tq2(Tq2Matrix),
    Tq1(Tq1Matrix),
    BitPlanes(BitPlaneMatrix),
    Binary(BinaryMatrix),
}

impl PackedWeights {
    pub fn format(&self) -> WeightFormat {
        match self {
            PackedWeights::I2(_) => WeightFormat::I2,
            PackedWeights::Tq2(_) => WeightFormat::Tq2_0,
            PackedWeights::Tq1(_) => WeightFormat::Tq1_0,
            PackedWeights::BitPlanes(_) => WeightFormat::BitPlanes,
            PackedWeights::Binary(_) => WeightFormat::Binary,
        }
    }

    /// Output rows (N).
    pub fn rows(&self) -> usize {
        match self {
            PackedWeights::I2(m) => m.rows(),
            PackedWeights::Tq2(m) => m.rows(),
            PackedWeights::Tq1(m) => m.rows(),
            PackedWeights::BitPlanes(m) => m.rows(),
            PackedWeights::Binary(m) => m.rows(),
        }
    }

    /// Inputs (K).
    pub fn cols(&self) -> usize {
        match self {
            PackedWeights::I2(m) => m.cols(),
            PackedWeights::Tq2(m) => m.cols(),
            PackedWeights::Tq1(m) => m.cols(),
            PackedWeights::BitPlanes(m) => m.cols(),
            PackedWeights::Binary(m) => m.cols(),
        }
    }

    /// Bytes a kernel reads to use every weight once (what bandwidth figures are based on).
    pub fn byte_len(&self) -> usize {
        match self {
            PackedWeights::I2(m) => m.bytes().len(),
            PackedWeights::Tq2(m) => m.byte_len(),
            PackedWeights::Tq1(m) => m.byte_len(),
            PackedWeights::BitPlanes(m) => m.byte_len(),
            PackedWeights::Binary(m) => m.byte_len(),
        }
    }

    /// Bytes per weight × 8.
    pub fn bits_per_weight(&self) -> f64 {
        self.byte_len() as f64 * 8.0 / (self.rows() * self.cols()) as f64
    }

    /// Ternary value at (row, col), decoded the plain way.
    #[inline]
    pub fn get(&self, row: usize, col: usize) -> i8 {
        match self {
            PackedWeights::I2(m) => m.get(row, col),
            PackedWeights::Tq2(m) => m.get(row, col),
            PackedWeights::Tq1(m) => m.get(row, col),
            PackedWeights::BitPlanes(m) => m.get(row, col),
            PackedWeights::Binary(m) => m.get(row, col),
        }
    }

    pub fn unpack(&self) -> TernaryMatrix {
        match self {
            PackedWeights::I2(m) => m.unpack(),
            PackedWeights::Tq2(m) => m.unpack(),
            PackedWeights::Tq1(m) => m.unpack(),
            PackedWeights::BitPlanes(m) => m.unpack(),
            PackedWeights::Binary(m) => m.unpack(),
        }
    }
}

/// Something a matrix makes from its own data on first use (a kernel's repack): a cache, so
/// not part of the matrix's equality.
#[derive(Debug, Clone)]
pub(crate) struct Cache<T>(pub(crate) std::sync::OnceLock<T>);

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Self(std::sync::OnceLock::new())
    }
}

impl<T> PartialEq for Cache<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
