//! The BitNet b1.58 model: config, weights, KV cache, forward pass, generation and a plain
//! reference forward for tests.

pub mod config;
pub mod forward;
pub mod generate;
pub mod kv_cache;
pub mod layout;
pub mod reference;
pub mod sampling;
pub mod weights;

pub use crate::attention::KvPrecision;
pub use config::{ActivationSource, FfnActivation, ModelConfig, PRESETS};
pub use forward::{argmax, LogitsFor, Model, State, StateOptions};
pub use generate::{greedy, greedy_batch, kv_quality, prefill, Generation, KvQuality};
pub use kv_cache::KvCache;
pub use layout::{bytes_read_per_token, tensor_layout, TensorInfo};
pub use sampling::{Sampler, SamplingParams};
pub use weights::{LayerWeights, Weights};
