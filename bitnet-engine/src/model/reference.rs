//! A plain reference forward, for tests: dequantized f32 weights, f64 sums, one token at a
//! time, the whole history kept in f32, no cache tricks, no SIMD, no threads. It shares only
//! the model's definition with the fast path — including BitLinear's per-token absmax int8
//! activation quantization (q = round_half_even(x × 127 / absmax)) — not its code.

use crate::formats::{EmbeddingRows, PackedWeights, QK_K};
use crate::model::forward::Model;
use crate::ops::FfnActivation;

/// Dense f32 copy of a ternary layer: `[rows, cols]` real weights (value × scale).
struct Dense {
    rows: usize,
    cols: usize,
    w: Vec<f32>,
}

impl Dense {
    fn new(p: &PackedWeights) -> Self {
        let (rows, cols) = (p.rows(), p.cols());
        let mut w = vec![0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                let scale = match p {
                    PackedWeights::I2(m) => m.scale(),
                    PackedWeights::BitPlanes(m) => m.scale(),
                    PackedWeights::Binary(m) => m.scale(),
                    PackedWeights::Tq2(m) => m.row(r)[c / QK_K].d.to_f32(),
                    PackedWeights::Tq1(m) => m.row(r)[c / QK_K].d.to_f32(),
                };
                w[r * cols + c] = p.get(r, c) as f32 * scale;
            }
        }
        Self { rows, cols, w }
    }

    /// BitLinear: quantize x per token to int8 by absmax, multiply, rescale.
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let (q, s) = quantize_a8(x);
        (0..self.rows)
            .map(|r| {
                let dot: f64 = (0..self.cols).map(|c| self.w[r * self.cols + c] as f64 * q[c] as f64).sum();
                (dot * s as f64) as f32
            })
            .collect()
    }
}

fn quantize_a8(x: &[f32]) -> (Vec<f32>, f32) {
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if absmax == 0.0 {
        return (vec![0.0; x.len()], 0.0);
    }
    let inv = 127.0 / absmax;
    (x.iter().map(|v| (v * inv).round_ties_even().clamp(-127.0, 127.0)).collect(), absmax / 127.0)
}

fn rms_norm(x: &[f32], g: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(g).map(|(v, g)| (*v as f64 * inv * *g as f64) as f32).collect()
}

/// A projection's output times its `.scale` factor (llama.cpp's `ggml_mul` after the matmul).
fn scaled(mut v: Vec<f32>, s: f32) -> Vec<f32> {
    v.iter_mut().for_each(|x| *x *= s);
    v
}

fn rope(v: &mut [f32], hd: usize, pos: usize, theta: f32) {
    for head in v.chunks_exact_mut(hd) {
        for i in 0..hd / 2 {
            let freq = 1.0 / (theta as f64).powf(2.0 * i as f64 / hd as f64);
            let (s, c) = (pos as f64 * freq).sin_cos();
            let (a, b) = (head[i] as f64, head[i + hd / 2] as f64);
            head[i] = (a * c - b * s) as f32;
            head[i + hd / 2] = (a * s + b * c) as f32;
        }
    }
}

/// Logits (`[tokens.len(), vocab]`) of one sequence, computed position by position.
pub fn reference_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let cfg = &model.config;
    let w = &model.weights;
    let (hd, heads, kvh) = (cfg.head_dim(), cfg.heads, cfg.kv_heads);
    let layers: Vec<[Dense; 7]> = w.layers.iter().map(|l| l.linears().map(Dense::new)).collect();
    // keys[layer][pos], values[layer][pos]: [kv_dim]
    let mut keys: Vec<Vec<Vec<f32>>> = vec![Vec::new(); cfg.layers];
    let mut values: Vec<Vec<Vec<f32>>> = vec![Vec::new(); cfg.layers];
    let mut out = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        let mut x = vec![0f32; cfg.hidden];
        w.token_embd.dequantize_row(t as usize, &mut x);
        for (l, lw) in w.layers.iter().enumerate() {
            let [wq, wk, wv, wo, wg, wu, wd] = &layers[l];
            let [sq, sk, sv, so, sg, su, sd] = lw.out_scales;
            let xn = rms_norm(&x, &lw.attn_norm, cfg.norm_eps);
            let mut q = scaled(wq.apply(&xn), sq);
            let mut k = scaled(wk.apply(&xn), sk);
            let v = scaled(wv.apply(&xn), sv);
            rope(&mut q, hd, pos, cfg.rope_theta);
            rope(&mut k, hd, pos, cfg.rope_theta);
            keys[l].push(k);
            values[l].push(v);
            let mut att = vec![0f32; cfg.q_dim()];
            for h in 0..heads {
                let kh = h / (heads / kvh);
                let qh = &q[h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|p| {
                        let kp = &keys[l][p][kh * hd..(kh + 1) * hd];
                        qh.iter().zip(kp).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    att[h * hd + d] =
                        (0..=pos).map(|p| e[p] / sum * values[l][p][kh * hd + d] as f64).sum::<f64>() as f32;
                }
            }
            if let Some(g) = &lw.attn_sub_norm {
                att = rms_norm(&att, g, cfg.norm_eps);
            }
            let o = scaled(wo.apply(&att), so);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let xn = rms_norm(&x, &lw.ffn_norm, cfg.norm_eps);
            let gate = scaled(wg.apply(&xn), sg);
            let up = scaled(wu.apply(&xn), su);
            let mut hcur: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| match cfg.activation {
                    FfnActivation::Silu => (*g as f64 / (1.0 + (-*g as f64).exp()) * *u as f64) as f32,
                    FfnActivation::ReluSquared => (g.max(0.0) as f64).powi(2) as f32 * u,
                })
                .collect();
            if let Some(g) = &lw.ffn_sub_norm {
                hcur = rms_norm(&hcur, g, cfg.norm_eps);
            }
            let d = scaled(wd.apply(&hcur), sd);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
        let xn = rms_norm(&x, &w.output_norm, cfg.norm_eps);
        let (q, s) = quantize_a8(&xn);
        let mut row = vec![0f32; cfg.hidden];
        out.push(
            (0..cfg.vocab)
                .map(|v| {
                    let dot = match w.lm_head() {
                        EmbeddingRows::Int8(head) => {
                            (0..cfg.hidden).map(|c| head.get(v, c) as f64 * q[c] as f64).sum::<f64>()
                                * head.scale(v) as f64
                        }
                        EmbeddingRows::Q6K(head) => {
                            head.dequantize_row(v, &mut row);
                            row.iter().zip(&q).map(|(w, x)| *w as f64 * *x as f64).sum::<f64>()
                        }
                    };
                    (dot * s as f64) as f32
                })
                .collect(),
        );
    }
    out
}
