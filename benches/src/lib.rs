//! Shared set-up for the criterion benchmarks in `benches/`.

use bitnet_engine::rng::SplitMix64;
use bitnet_engine::ActivationBatch;

/// The linear-layer shapes (name, N outputs, K inputs) of BitNet b1.58 2B4T.
pub const SHAPES_2B4T: [(&str, usize, usize); 4] = [
    ("qo_2560x2560", 2560, 2560),
    ("kv_640x2560", 640, 2560),
    ("gateup_6912x2560", 6912, 2560),
    ("down_2560x6912", 2560, 6912),
];

/// Quantized activations (with bit-planes) of `batch` random vectors of length `cols`.
pub fn activations(batch: usize, cols: usize, seed: u64) -> ActivationBatch {
    let mut g = SplitMix64::new(seed);
    let x: Vec<f32> = (0..batch * cols).map(|_| g.unit_f32() * 2.0 - 1.0).collect();
    let mut a = ActivationBatch::new(batch, cols).expect("valid shape");
    a.quantize(&x).expect("matching length");
    a.build_planes();
    a.build_lut();
    a
}
