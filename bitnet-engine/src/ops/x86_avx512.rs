//! The float operations' portable definitions compiled for AVX-512.

use crate::simd::x86_avx512::Avx512;

// The portable definitions at 16 lanes (see `widest_compiled!`).
compiled_for! {
    Avx512, "avx512f,avx512bw,avx512vl,avx512dq";
    gated_activation(act: super::FfnActivation, gate: &mut [f32], up: &[f32]) = super::portable::gated_activation_portable;
    rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) = super::portable::rms_norm_rows_portable;
    rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) = super::portable::rms_norm_in_place_portable;
    softmax_in_place(scores: &mut [f32]) = super::portable::softmax_in_place_portable;
    argmax(logits: &[f32]) -> u32 = super::portable::argmax_portable;
}
