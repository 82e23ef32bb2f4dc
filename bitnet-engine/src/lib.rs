//! `bitnet-engine`: BitNet b1.58 inference on CPUs, built to be measured.
//!
//! - [`formats`]: packed ternary weights (I2, llama.cpp's TQ2_0 and TQ1_0, bit-planes, binary).
//! - [`activations`]: per-token absmax int8 activations, block sums, bit-planes.
//! - [`kernels`]: ternary × int8 matmul families at several ISA levels, chosen at run time,
//!   all equal to a plain scalar oracle.
//! - [`bandwidth`]: the memory read-bandwidth probe (the decode roofline); [`compute_peak`]: the
//!   int8 multiply-add probe (the roofline of batch decode and prefill).
//! - [`model`]: the BitNet b1.58 decoder, KV cache, worker pool, generation; [`gguf`]: files.
//! - [`instrument`]: per-stage spans (the engine emits; `bitnet-trace` reads).
//! - [`tokenizer`]: text to token ids and back from GGUF vocabularies, as llama.cpp tokenizes.
//!
//! The engine depends on nothing heavy; the tools (`bitnet-trace`, `bitnet-bench`,
//! `bitnet-diff`) depend on it.

// Kernels index several arrays with one loop variable; iterator chains would hide that.
#![allow(clippy::needless_range_loop)]

pub mod activations;
pub mod aligned;
pub mod bandwidth;
pub mod compute_peak;
pub mod cpu;
pub mod error;
pub mod files;
pub mod formats;
pub mod gguf;
pub mod instrument;
pub mod kernels;
pub mod model;
pub mod rng;
pub mod ternary;
pub mod tokenizer;

pub use activations::ActivationBatch;
pub use cpu::IsaLevel;
pub use error::{Error, Result};
pub use formats::{PackedWeights, WeightFormat};
pub use kernels::{Kernel, KernelFamily, KernelForm, KernelScratch, ScratchNeeds};
pub use model::{KvPrecision, LogitsFor, Model, ModelConfig, State, StateOptions};
pub use ternary::TernaryMatrix;
pub use tokenizer::{StreamDecoder, Tokenizer};
