//! The forward pass's element-wise float operations (RMSNorm, softmax, argmax, the gated FFN
//! activation, transposes): each defined by plain Rust in [`portable`] and run here at the
//! widest ISA the CPU has, with identical results.

pub mod portable;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::error::{Error, Result};

#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2::Avx2;

/// The gating non-linearity of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FfnActivation {
    /// `silu(gate) × up` (1bitLLM BitNet b1.58 models, LLaMA).
    Silu,
    /// `relu(gate)² × up` (BitNet b1.58 2B4T).
    ReluSquared,
}

impl FfnActivation {
    pub fn name(self) -> &'static str {
        match self {
            FfnActivation::Silu => "silu",
            FfnActivation::ReluSquared => "relu2",
        }
    }

    /// The activation a `<arch>.hidden_activation` value names: llama.cpp's names for SiLU
    /// (`silu`, `swish`, `swiglu`) and the usual names of ReLU² (Hugging Face's `relu2`).
    pub fn from_metadata(value: &str) -> Option<Self> {
        match value {
            "silu" | "swish" | "swiglu" => Some(FfnActivation::Silu),
            "relu2" | "relu_squared" | "relu_sqr" | "squared_relu" => Some(FfnActivation::ReluSquared),
            _ => None,
        }
    }
}

impl FromStr for FfnActivation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "silu" => Ok(FfnActivation::Silu),
            "relu2" => Ok(FfnActivation::ReluSquared),
            _ => Err(Error::UnknownName { what: "FFN activation", got: s.to_string(), expected: "silu, relu2".into() }),
        }
    }
}

impl fmt::Display for FfnActivation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The gated FFN activation (`ops::gated_activation_portable`) compiled for the widest ISA the
/// CPU has (AVX-512, else AVX2): the same Rust code, so the same IEEE operations in the same
/// order, 16 or 8 lanes wide instead of the baseline's 4 (SiLU is slow at baseline x86-64:
/// docs/perf-notes.md).
pub(crate) fn gated_activation(act: crate::ops::FfnActivation, gate: &mut [f32], up: &[f32]) {
    widest_compiled!(gated_activation, crate::ops::portable::gated_activation_portable, act, gate, up)
}

/// Softmax of attention scores in place (`ops::softmax_in_place_portable`) compiled for the
/// widest ISA the CPU has, as [`gated_activation`]: the same floats (at baseline x86-64 it was
/// a few percent of a long-context decode step: docs/perf-notes.md).
pub(crate) fn softmax_in_place(scores: &mut [f32]) {
    widest_compiled!(softmax_in_place, crate::ops::portable::softmax_in_place_portable, scores)
}

/// The greedy token (`ops::argmax_portable`) compiled for the widest ISA the CPU has, as
/// [`softmax_in_place`]: the same index. The plain loop it replaces, which compares with the
/// running best by index, cost about a percent of a batched decode step over a 128256-token
/// vocabulary (docs/perf-notes.md).
pub(crate) fn argmax(logits: &[f32]) -> u32 {
    widest_compiled!(argmax, crate::ops::portable::argmax_portable, logits)
}

/// Columns `cols` of a `[r_n, c_n]` f32 matrix, transposed into `dst` (`dst[c − cols.start][r] =
/// src[r][c]`; `ops::transpose_cols_into_portable` is the definition): 8 × 8 tiles transposed in
/// registers where the CPU has AVX2. Data movement only, so every path gives the same bytes.
pub(crate) fn transpose_cols_into(src: &[f32], r_n: usize, c_n: usize, cols: Range<usize>, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx2::new() {
        return x86_avx2::transpose_cols_into(t, src, r_n, c_n, cols, dst);
    }
    crate::ops::portable::transpose_cols_into_portable(src, r_n, c_n, cols, dst)
}

/// Columns `c0..c0 + 8` of a `[r_n, c_n]` f32 matrix into eight rows (`dsts[k][r] =
/// src[r][c0 + k]`, r_n = each row's length; `ops::transpose_8_cols_to_rows_portable` is the
/// definition): a decode batch's `[rows, tokens]` matmul block written into eight tokens' rows
/// of a `[tokens, n]` output, 8 × 8 tiles in registers where the CPU has AVX2.
pub(crate) fn transpose_8_cols_to_rows(src: &[f32], c_n: usize, c0: usize, dsts: [&mut [f32]; 8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = Avx2::new() {
        return x86_avx2::transpose_8_cols_to_rows(t, src, c_n, c0, dsts);
    }
    crate::ops::portable::transpose_8_cols_to_rows_portable(src, c_n, c0, dsts)
}

/// RMSNorm of each row (`ops::rms_norm_rows_portable`) compiled for the widest ISA the CPU
/// has, bit-identical for the same reason as [`gated_activation`]. A norm runs on the caller
/// thread while the others wait, so its speed counts (docs/perf-notes.md).
pub(crate) fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    widest_compiled!(rms_norm_rows, crate::ops::portable::rms_norm_rows_portable, x, weight, eps, out)
}

/// In-place twin of [`rms_norm_rows`].
pub(crate) fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    widest_compiled!(rms_norm_in_place, crate::ops::portable::rms_norm_in_place_portable, x, weight, eps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 tile transpose equals the plain loops on every shape class: whole tiles, row
    /// and column edges, one row or column, and column ranges starting anywhere.
    #[test]
    fn transpose_tiles_equal_plain_loops() {
        for r_n in [1usize, 7, 8, 9, 16, 23, 64, 130] {
            for c_n in [1usize, 3, 8, 13, 16, 24, 33] {
                let src: Vec<f32> = (0..r_n * c_n).map(|i| i as f32 * 0.5 - 3.0).collect();
                for (a, b) in [(0, c_n), (0, c_n / 2), (c_n / 3, c_n), (1.min(c_n), c_n), (c_n / 2, c_n / 2)] {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    let mut want = vec![f32::NAN; (b - a) * r_n];
                    crate::ops::portable::transpose_cols_into_portable(&src, r_n, c_n, a..b, &mut want);
                    for r in 0..r_n {
                        for c in a..b {
                            assert_eq!(want[(c - a) * r_n + r], src[r * c_n + c]);
                        }
                    }
                    let mut got = vec![f32::NAN; (b - a) * r_n];
                    transpose_cols_into(&src, r_n, c_n, a..b, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{r_n}×{c_n} cols {a}..{b}");
                    #[cfg(target_arch = "x86_64")]
                    if let Some(t) = Avx2::new() {
                        let mut simd = vec![f32::NAN; (b - a) * r_n];
                        x86_avx2::transpose_cols_into(t, &src, r_n, c_n, a..b, &mut simd);
                        assert_eq!(bits(&simd), bits(&want), "avx2 {r_n}×{c_n} cols {a}..{b}");
                    }
                }
            }
        }
    }

    /// Eight columns into eight rows: the portable loop is the definition, checked against
    /// the source, and every path gives its bits, at tile and tail row counts.
    #[test]
    fn eight_columns_into_rows_equal_plain_loops() {
        for r_n in [0usize, 1, 7, 8, 9, 16, 23, 130] {
            for (c_n, c0) in [(8usize, 0usize), (9, 1), (16, 8), (13, 3)] {
                let src: Vec<f32> = (0..r_n * c_n).map(|i| i as f32 * 0.25 - 7.0).collect();
                let run = |f: &dyn Fn(&mut [Vec<f32>; 8])| {
                    let mut rows: [Vec<f32>; 8] = std::array::from_fn(|_| vec![f32::NAN; r_n]);
                    f(&mut rows);
                    rows.map(|r| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
                };
                let want = run(&|rows| {
                    crate::ops::portable::transpose_8_cols_to_rows_portable(
                        &src,
                        c_n,
                        c0,
                        rows.each_mut().map(|r| &mut r[..]),
                    )
                });
                for (k, row) in want.iter().enumerate() {
                    for (r, bits) in row.iter().enumerate() {
                        assert_eq!(f32::from_bits(*bits), src[r * c_n + c0 + k]);
                    }
                }
                let got = run(&|rows| transpose_8_cols_to_rows(&src, c_n, c0, rows.each_mut().map(|r| &mut r[..])));
                assert_eq!(got, want, "{r_n}×{c_n} from column {c0}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = Avx2::new() {
                    let simd = run(&|rows| {
                        x86_avx2::transpose_8_cols_to_rows(t, &src, c_n, c0, rows.each_mut().map(|r| &mut r[..]))
                    });
                    assert_eq!(simd, want, "avx2 {r_n}×{c_n} from column {c0}");
                }
            }
        }
    }

    #[test]
    fn gated_activation_is_bit_identical_to_the_portable_loop() {
        use crate::ops::FfnActivation;
        let mut g = crate::rng::SplitMix64::new(5);
        // Odd length (a vector tail), values over SiLU's whole range, and the clamp edges.
        let mut gate: Vec<f32> = (0..1037).map(|_| (g.unit_f32() - 0.5) * 40.0).collect();
        gate.extend([-100.0, -87.5, -87.0, -0.0, 0.0, 1e-30, 87.9, 88.5, 100.0, f32::MIN_POSITIVE]);
        let up: Vec<f32> = (0..gate.len()).map(|_| g.unit_f32() * 4.0 - 2.0).collect();
        for act in [FfnActivation::Silu, FfnActivation::ReluSquared] {
            let (mut fast, mut plain) = (gate.clone(), gate.clone());
            super::gated_activation(act, &mut fast, &up);
            crate::ops::portable::gated_activation_portable(act, &mut plain, &up);
            for (i, (a, b)) in fast.iter().zip(&plain).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{act:?} element {i} (gate {}): {a} vs {b}", gate[i]);
            }
            // The AVX2 tier too (what CPUs without AVX-512 run).
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = super::Avx2::new() {
                let mut avx2 = gate.clone();
                super::x86_avx2::gated_activation(t, act, &mut avx2, &up);
                assert!(avx2.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()), "{act:?} AVX2");
            }
            // And it is the activation: SiLU(g) × up = g / (1 + e^-g) × up.
            if act == FfnActivation::Silu {
                let i = 3;
                let want = gate[i] / (1.0 + (-gate[i]).exp()) * up[i];
                assert!((fast[i] - want).abs() <= 1e-5 * want.abs().max(1.0), "{} vs {want}", fast[i]);
            }
        }
    }

    #[test]
    fn argmax_is_the_plain_loops_index() {
        // The definition: the running best by index, replaced only by a strictly larger value.
        let plain = |v: &[f32]| {
            let mut best = 0;
            for (i, x) in v.iter().enumerate() {
                if *x > v[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut g = crate::rng::SplitMix64::new(23);
        let special = [f32::NAN, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1.0, 1.0];
        for n in [0usize, 1, 2, 15, 16, 17, 33, 100, 128256] {
            for case in 0..24 {
                let mut v: Vec<f32> = (0..n).map(|_| (g.next_u64() % 64) as f32 - 32.0).collect();
                // Ties, signed zeros, NaNs (first or anywhere), infinities, all-NaN tails.
                for _ in 0..case.min(n) {
                    let at = (g.next_u64() % n as u64) as usize;
                    v[at] = special[(g.next_u64() % special.len() as u64) as usize];
                }
                if case == 5 && n > 0 {
                    v[0] = f32::NAN;
                }
                if case == 6 {
                    v.iter_mut().for_each(|x| *x = -0.0);
                    if n > 3 {
                        v[3] = 0.0;
                    }
                }
                let want = plain(&v);
                assert_eq!(super::argmax(&v), want, "n {n} case {case}");
                assert_eq!(crate::ops::portable::argmax_portable(&v), want, "portable, n {n} case {case}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = super::Avx2::new() {
                    assert_eq!(super::x86_avx2::argmax(t, &v), want, "AVX2, n {n} case {case}");
                }
            }
        }
    }

    #[test]
    fn softmax_is_bit_identical_to_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(9);
        // Lengths around the 16-lane blocks, spreads that underflow some exponentials, and -∞.
        for n in [1usize, 5, 16, 17, 129, 1025] {
            for spread in [1.0f32, 30.0, 200.0] {
                let mut s: Vec<f32> = (0..n).map(|_| (g.unit_f32() - 0.5) * spread).collect();
                if n > 4 {
                    s[3] = f32::NEG_INFINITY;
                }
                let (mut fast, mut plain) = (s.clone(), s.clone());
                super::softmax_in_place(&mut fast);
                crate::ops::portable::softmax_in_place_portable(&mut plain);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&plain), "n {n} spread {spread}");
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = super::Avx2::new() {
                    let mut avx2 = s.clone();
                    super::x86_avx2::softmax_in_place(t, &mut avx2);
                    assert_eq!(bits(&avx2), bits(&plain), "AVX2, n {n} spread {spread}");
                }
                // And it is a softmax: sums to 1, the largest score has the largest weight.
                let sum: f64 = fast.iter().map(|v| *v as f64).sum();
                assert!((sum - 1.0).abs() < 1e-5, "n {n}: Σ = {sum}");
                let top = (0..n).max_by(|&a, &b| s[a].total_cmp(&s[b])).unwrap();
                assert!(fast.iter().all(|v| *v <= fast[top]), "n {n}");
            }
        }
    }

    #[test]
    fn rms_norm_is_bit_identical_to_the_portable_loop() {
        let mut g = crate::rng::SplitMix64::new(9);
        for n in [7usize, 16, 1536, 2560, 4099] {
            let rows = 3;
            let mut x: Vec<f32> = (0..rows * n).map(|_| (g.unit_f32() - 0.5) * 8.0).collect();
            x[n..2 * n].fill(0.0); // a zero row: eps alone sets the factor
            x[2 * n] = 1e30; // a huge element in the last row
            let w: Vec<f32> = (0..n).map(|_| g.unit_f32() * 2.0).collect();
            let (mut fast, mut plain) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            super::rms_norm_rows(&x, &w, 1e-5, &mut fast);
            crate::ops::portable::rms_norm_rows_portable(&x, &w, 1e-5, &mut plain);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&plain), "rows, n {n}");
            let (mut fast_ip, mut plain_ip) = (x.clone(), x.clone());
            super::rms_norm_in_place(&mut fast_ip, &w, 1e-5);
            crate::ops::portable::rms_norm_in_place_portable(&mut plain_ip, &w, 1e-5);
            assert_eq!(bits(&fast_ip), bits(&plain_ip), "in place, n {n}");
            assert_eq!(bits(&fast_ip), bits(&fast), "in place = into out, n {n}");
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = super::Avx2::new() {
                let (mut rows_avx2, mut ip_avx2) = (vec![0f32; rows * n], x.clone());
                super::x86_avx2::rms_norm_rows(t, &x, &w, 1e-5, &mut rows_avx2);
                super::x86_avx2::rms_norm_in_place(t, &mut ip_avx2, &w, 1e-5);
                assert_eq!((bits(&rows_avx2), bits(&ip_avx2)), (bits(&plain), bits(&plain_ip)), "AVX2, n {n}");
            }
            // And it is RMSNorm: x / sqrt(mean(x²) + eps) × w, checked in f64 on the first row.
            let ms: f64 = x[..n].iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
            let want = x[3] as f64 / (ms + 1e-5).sqrt() * w[3] as f64;
            assert!((fast[3] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "{} vs {want}", fast[3]);
        }
    }
}
