//! `bitnet-engine`: BitNet b1.58 inference on CPUs, built to be measured.
//!
//! Laid out by operation, each folder a file per ISA, dependencies one way:
//! [`cpu`] → [`simd`] → [`formats`], [`activations`] → [`matmul`], [`attention`], [`ops`] →
//! [`pool`] → [`model`]; [`probes`] use `simd` and `pool`; [`instrument`] is a leaf.
//!
//! - [`cpu`]: CPU detection and ISA levels; [`simd`]: ISA tokens, shared register helpers,
//!   prefetch hints.
//! - [`formats`]: packed ternary weights (I2, llama.cpp's TQ2_0 and TQ1_0, bit-planes, binary).
//! - [`activations`]: per-token absmax int8 activations, block sums, bit-planes, lookup tables.
//! - [`matmul`]: ternary × int8 matmul families at several ISA levels, chosen at run time, all
//!   equal to a plain scalar oracle; [`matmul::head`]: the LM head (int8 and Q6_K rows).
//! - [`attention`]: KV precisions and the attention kernels; [`ops`]: RMSNorm, softmax, argmax,
//!   the gated FFN activation, RoPE, transposes.
//! - [`pool`]: the worker pool; [`probes`]: the memory-bandwidth and int8-compute rooflines.
//! - [`model`]: the BitNet b1.58 decoder, KV cache, generation; [`gguf`]: files.
//! - [`instrument`]: per-stage spans (the engine emits; `bitnet-trace` reads).
//! - [`tokenizer`]: text to token ids and back from GGUF vocabularies, as llama.cpp tokenizes.
//!
//! The engine depends on nothing heavy; the tools (`bitnet-trace`, `bitnet-bench`,
//! `bitnet-diff`) depend on it.

// Kernels index several arrays with one loop variable; iterator chains would hide that.
#![allow(clippy::needless_range_loop)]

// First: its macros (`compiled_for!`, `widest_compiled!`) are used by the modules below.
#[macro_use]
pub mod simd;

pub mod activations;
pub mod aligned;
pub mod attention;
pub mod cpu;
pub mod error;
pub mod formats;
pub mod gguf;
pub mod instrument;
pub mod matmul;
pub mod model;
pub mod ops;
pub mod pool;
pub mod probes;
pub mod rng;
pub mod ternary;
pub mod tokenizer;

pub use activations::ActivationBatch;
pub use attention::KvPrecision;
pub use cpu::IsaLevel;
pub use error::{Error, Result};
pub use formats::{PackedWeights, WeightFormat};
pub use matmul::{Kernel, KernelFamily, KernelForm, KernelScratch, ScratchNeeds};
pub use model::{LogitsFor, Model, ModelConfig, State, StateOptions};
pub use ternary::TernaryMatrix;
pub use tokenizer::{StreamDecoder, Tokenizer};
