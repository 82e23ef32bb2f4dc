//! Shared set-up for the criterion benchmarks in `benches/`.

use bitnet_engine::rng::SplitMix64;
use bitnet_engine::{ActivationBatch, ModelConfig};

/// The linear-layer shapes of BitNet b1.58 2B4T as (criterion id, N outputs, K inputs):
/// `qo_2560x2560`, `kv_640x2560`, `gateup_6912x2560`, `down_2560x6912`.
pub fn shapes_2b4t() -> Vec<(String, usize, usize)> {
    let cfg = ModelConfig::preset("bitnet-b1.58-2b-4t").expect("a known preset");
    cfg.linear_shapes().into_iter().map(|(name, n, k)| (name.replace('/', "").replace(' ', "_"), n, k)).collect()
}

/// Quantized activations (with bit-planes) of `batch` random vectors of length `cols`.
pub fn activations(batch: usize, cols: usize, seed: u64) -> ActivationBatch {
    let mut g = SplitMix64::new(seed);
    let x: Vec<f32> = (0..batch * cols).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
    let mut a = ActivationBatch::new(batch, cols).expect("valid shape");
    a.quantize(&x).expect("matching length");
    a.build_planes();
    a
}
