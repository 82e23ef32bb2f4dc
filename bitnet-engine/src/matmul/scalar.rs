//! The oracle: every weight decoded by the format's plain accessor, multiplied, summed.
//! Slow and obviously right; every other path must equal it exactly.

use std::ops::Range;

use super::{finish_blocks, finish_tensor};
use crate::activations::ActivationBatch;
use crate::formats::{PackedWeights, QK_K};

pub(crate) fn matmul(w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let (k_len, batch) = (w.cols(), x.batch());
    for (i, r) in rows.enumerate() {
        for b in 0..batch {
            let q = x.token(b);
            let dot = |range: Range<usize>| -> i32 { range.map(|k| w.get(r, k) as i32 * q[k] as i32).sum() };
            out[i * batch + b] = match w {
                PackedWeights::Tq2(_) | PackedWeights::Tq1(_) => {
                    let mut acc = 0f64;
                    for blk in 0..k_len / QK_K {
                        let d = match w {
                            PackedWeights::Tq2(m) => m.row(r)[blk].d.to_f64(),
                            PackedWeights::Tq1(m) => m.row(r)[blk].d.to_f64(),
                            _ => unreachable!(),
                        };
                        acc += d * dot(blk * QK_K..(blk + 1) * QK_K) as f64;
                    }
                    finish_blocks(acc, x.scale(b))
                }
                PackedWeights::I2(m) => finish_tensor(dot(0..k_len), m.scale(), x.scale(b)),
                PackedWeights::BitPlanes(m) => finish_tensor(dot(0..k_len), m.scale(), x.scale(b)),
                PackedWeights::Binary(m) => finish_tensor(dot(0..k_len), m.scale(), x.scale(b)),
            };
        }
    }
}
