//! The KV cache, at several precisions, quantized on write and dequantized on read.
//!
//! Each (layer, sequence, KV head, position) holds one key and one value vector of `head_dim`
//! values, encoded independently (so a write never touches other entries):
//!
//! | precision | stored per vector of d values |
//! |---|---|
//! | `f32` | 4d bytes |
//! | `f16`, `bf16` | 2d bytes |
//! | `fp8` (E4M3) | d bytes + f16 scale (absmax → 448) |
//! | `int8` | d bytes + f16 scale (absmax / 127, symmetric) |
//! | `int4` | ⌈d/2⌉ bytes + f16 scale per group of 32 (absmax / 7, symmetric) |
//! | `int2` | ⌈d/4⌉ bytes + f16 min and f16 step per group of 16 (4 levels, asymmetric) |

use std::ops::Range;

use half::{f16, slice::HalfFloatSliceExt};

use crate::aligned::PageVec;
use crate::attention::{
    attention_scores, attention_scores_encoded, attention_scores_group, attention_scores_group_encoded,
    attention_weighted_sum, attention_weighted_sum_encoded, attention_weighted_sum_group,
    attention_weighted_sum_group_encoded, KeyElem, KvPrecision,
};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;

impl KvPrecision {
    /// Exact KV-cache bytes one token adds to one sequence (keys and values, all layers).
    pub fn bytes_per_token(self, cfg: &ModelConfig) -> usize {
        2 * cfg.layers * cfg.kv_heads * self.bytes_per_vector(cfg.head_dim())
    }
}

/// Encoded vectors of one layer, `[seqs, kv_heads, ctx, head_dim]`: floats kept as floats so
/// reads need no decoding (f32) or only a vectorized conversion (f16); everything else as bytes.
#[derive(Debug, Clone)]
/// Large caches sit in huge pages (see `aligned`): attention streams them every step.
enum Store {
    F32(PageVec<f32>),
    F16(PageVec<f16>),
    /// `[.., vec_bytes]` encoded by `KvPrecision::encode`.
    Bytes(PageVec<u8>),
}

/// [`KvRows::scores`] over rows kept as floats: one head through the one-head kernel, more
/// through the group kernel.
#[inline]
fn scores_of<K: KeyElem>(qs: &[f32], heads: usize, keys: &[K], scale: f32, out: &mut [f32], ahead: &[K]) {
    if heads == 1 {
        attention_scores(qs, keys, scale, out, ahead)
    } else {
        attention_scores_group(qs, heads, keys, scale, out, ahead)
    }
}

/// [`KvRows::weighted_sum`] over rows kept as floats, split as [`scores_of`] splits it.
#[inline]
fn weighted_sum_of<K: KeyElem>(ws: &[f32], heads: usize, values: &[K], os: &mut [f32], ahead: &[K]) {
    if heads == 1 {
        attention_weighted_sum(ws, values, os, ahead)
    } else {
        attention_weighted_sum_group(ws, heads, values, os, ahead)
    }
}

impl Store {
    fn new(p: KvPrecision, vectors: usize, hd: usize) -> Self {
        match p {
            KvPrecision::F32 => Store::F32(PageVec::zeroed(vectors * hd)),
            KvPrecision::F16 => Store::F16(PageVec::zeroed(vectors * hd)),
            _ => Store::Bytes(PageVec::zeroed(vectors * p.bytes_per_vector(hd))),
        }
    }

    fn write(&mut self, p: KvPrecision, index: usize, v: &[f32]) {
        let hd = v.len();
        match self {
            Store::F32(d) => d[index * hd..(index + 1) * hd].copy_from_slice(v),
            Store::F16(d) => d[index * hd..(index + 1) * hd].convert_from_f32_slice(v),
            Store::Bytes(d) => {
                let n = p.bytes_per_vector(hd);
                p.encode(v, &mut d[index * n..(index + 1) * n]);
            }
        }
    }

    /// Asks for the bytes of vector `index` in L2 (see [`KvCache::prefetch_write`]).
    fn prefetch(&self, p: KvPrecision, index: usize, hd: usize) {
        match self {
            Store::F32(d) => crate::simd::prefetch_l2(&d[index * hd..(index + 1) * hd]),
            Store::F16(d) => crate::simd::prefetch_l2(&d[index * hd..(index + 1) * hd]),
            Store::Bytes(d) => {
                let n = p.bytes_per_vector(hd);
                crate::simd::prefetch_l2(&d[index * n..(index + 1) * n])
            }
        }
    }

    /// The vector as f32: borrowed in place for f32, else decoded into `scratch`.
    #[inline]
    fn read<'a>(&'a self, p: KvPrecision, index: usize, hd: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        match self {
            Store::F32(d) => &d[index * hd..(index + 1) * hd],
            Store::F16(d) => {
                d[index * hd..(index + 1) * hd].convert_to_f32_slice(&mut scratch[..hd]);
                &scratch[..hd]
            }
            Store::Bytes(d) => {
                let n = p.bytes_per_vector(hd);
                p.decode(&d[index * n..(index + 1) * n], &mut scratch[..hd]);
                &scratch[..hd]
            }
        }
    }
}

/// Positions `0..n` of one (layer, sequence, head) as stored: contiguous rows of `head_dim`
/// for the float stores, which attention then reads without decoding.
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// Quantized (and bf16): `n` vectors of `precision.bytes_per_vector(head_dim)` bytes each,
    /// back to back, which attention decodes a vector at a time
    /// (`attention::attention_scores_encoded`).
    Encoded(&'a [u8]),
}

impl<'a> KvRows<'a> {
    /// Asks for the rows in L2 ahead of their use.
    pub fn prefetch(&self) {
        match self {
            KvRows::F32(d) => crate::simd::prefetch_l2(d),
            KvRows::F16(d) => crate::simd::prefetch_l2(d),
            KvRows::Encoded(d) => crate::simd::prefetch_l2(d),
        }
    }

    /// Positions `r` of these rows (`hd` values each, stored at `precision`).
    pub(crate) fn positions(&self, r: Range<usize>, hd: usize, precision: KvPrecision) -> KvRows<'a> {
        match *self {
            KvRows::F32(d) => KvRows::F32(&d[r.start * hd..r.end * hd]),
            KvRows::F16(d) => KvRows::F16(&d[r.start * hd..r.end * hd]),
            KvRows::Encoded(d) => {
                let vb = precision.bytes_per_vector(hd);
                KvRows::Encoded(&d[r.start * vb..r.end * vb])
            }
        }
    }

    /// The attention scores of `heads` query heads (`qs`: `heads` rows of hd) over these keys
    /// into `out` (`heads` rows of n): one head through the one-head kernels, more through the
    /// group kernels, which read each key once for all of them (each head's floats the same).
    /// `ahead` (rows of the same cache read next, if any) is asked for in L2 meanwhile; `buf`
    /// is the encoded kernels' decode buffer ([`crate::attention::ENCODED_CHUNK_VALUES`]).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn scores(
        &self,
        precision: KvPrecision,
        qs: &[f32],
        heads: usize,
        scale: f32,
        out: &mut [f32],
        ahead: Option<&KvRows<'_>>,
        buf: &mut [f32],
    ) {
        match (self, ahead) {
            (KvRows::F32(k), a) => {
                scores_of(qs, heads, k, scale, out, if let Some(KvRows::F32(a)) = a { a } else { &[] })
            }
            (KvRows::F16(k), a) => {
                scores_of(qs, heads, k, scale, out, if let Some(KvRows::F16(a)) = a { a } else { &[] })
            }
            (KvRows::Encoded(k), a) => {
                let a = if let Some(KvRows::Encoded(a)) = a { a } else { &[][..] };
                if heads == 1 {
                    attention_scores_encoded(precision, qs, k, scale, out, a, buf)
                } else {
                    attention_scores_group_encoded(precision, qs, heads, k, scale, out, a, buf)
                }
            }
        }
    }

    /// `os[h] += Σ_p ws[h][p] × v_p` for `heads` heads (`ws`: `heads` rows of n weights; `os`:
    /// `heads` rows of hd) over these values, as [`KvRows::scores`] splits the work; `ahead`
    /// and `buf` as there.
    #[inline]
    pub(crate) fn weighted_sum(
        &self,
        precision: KvPrecision,
        ws: &[f32],
        heads: usize,
        os: &mut [f32],
        ahead: Option<&KvRows<'_>>,
        buf: &mut [f32],
    ) {
        match (self, ahead) {
            (KvRows::F32(v), a) => {
                weighted_sum_of(ws, heads, v, os, if let Some(KvRows::F32(a)) = a { a } else { &[] })
            }
            (KvRows::F16(v), a) => {
                weighted_sum_of(ws, heads, v, os, if let Some(KvRows::F16(a)) = a { a } else { &[] })
            }
            (KvRows::Encoded(v), a) => {
                let a = if let Some(KvRows::Encoded(a)) = a { a } else { &[][..] };
                if heads == 1 {
                    attention_weighted_sum_encoded(precision, ws, v, os, a, buf)
                } else {
                    attention_weighted_sum_group_encoded(precision, ws, heads, v, os, a, buf)
                }
            }
        }
    }
}

impl Store {
    fn rows(&self, p: KvPrecision, first: usize, n: usize, hd: usize) -> KvRows<'_> {
        match self {
            Store::F32(d) => KvRows::F32(&d[first * hd..(first + n) * hd]),
            Store::F16(d) => KvRows::F16(&d[first * hd..(first + n) * hd]),
            Store::Bytes(d) => {
                let vb = p.bytes_per_vector(hd);
                KvRows::Encoded(&d[first * vb..(first + n) * vb])
            }
        }
    }
}

/// Keys and values of every layer for `seqs` sequences of up to `ctx` positions.
#[derive(Debug, Clone)]
pub struct KvCache {
    precision: KvPrecision,
    layers: usize,
    seqs: usize,
    kv_heads: usize,
    ctx: usize,
    head_dim: usize,
    /// Per layer.
    keys: Vec<Store>,
    /// Per layer.
    values: Vec<Store>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, precision: KvPrecision, seqs: usize, ctx: usize) -> Result<Self> {
        if seqs == 0 || ctx == 0 || ctx > cfg.max_context {
            return Err(Error::Shape(format!(
                "KV cache needs ≥ 1 sequence and 1 ≤ context ≤ {} (the model's maximum), got {seqs} and {ctx}",
                cfg.max_context
            )));
        }
        let vectors = seqs * cfg.kv_heads * ctx;
        let hd = cfg.head_dim();
        Ok(Self {
            precision,
            layers: cfg.layers,
            seqs,
            kv_heads: cfg.kv_heads,
            ctx,
            head_dim: hd,
            keys: (0..cfg.layers).map(|_| Store::new(precision, vectors, hd)).collect(),
            values: (0..cfg.layers).map(|_| Store::new(precision, vectors, hd)).collect(),
        })
    }

    /// Exact bytes the cache occupies.
    pub fn byte_len(&self) -> usize {
        2 * self.layers * self.seqs * self.kv_heads * self.ctx * self.precision.bytes_per_vector(self.head_dim)
    }
    pub fn precision(&self) -> KvPrecision {
        self.precision
    }
    pub fn context(&self) -> usize {
        self.ctx
    }
    pub fn sequences(&self) -> usize {
        self.seqs
    }

    #[inline]
    fn index(&self, seq: usize, head: usize, pos: usize) -> usize {
        (seq * self.kv_heads + head) * self.ctx + pos
    }

    /// Keys of positions `0..n` of (layer, sequence, head), as stored.
    pub fn key_rows(&self, layer: usize, seq: usize, head: usize, n: usize) -> KvRows<'_> {
        self.keys[layer].rows(self.precision, self.index(seq, head, 0), n, self.head_dim)
    }

    /// Values of positions `0..n` of (layer, sequence, head), as stored.
    pub fn value_rows(&self, layer: usize, seq: usize, head: usize, n: usize) -> KvRows<'_> {
        self.values[layer].rows(self.precision, self.index(seq, head, 0), n, self.head_dim)
    }

    /// Stores the key and value of one (layer, sequence, head, position).
    pub fn write(&mut self, layer: usize, seq: usize, head: usize, pos: usize, k: &[f32], v: &[f32]) {
        let i = self.index(seq, head, pos);
        self.keys[layer].write(self.precision, i, k);
        self.values[layer].write(self.precision, i, v);
    }

    /// Asks for the lines that [`KvCache::write`] of (layer, sequence, position) will store
    /// into, every head's key and value, in L2. Those rows were never read, so without this
    /// the write waits on a fresh line from memory per 64 bytes (decode's `kv_write` stage,
    /// on the caller thread while the others wait); issued before the layer's projections,
    /// the lines arrive while the weights stream.
    pub fn prefetch_write(&self, layer: usize, seq: usize, pos: usize) {
        for head in 0..self.kv_heads {
            let i = self.index(seq, head, pos);
            self.keys[layer].prefetch(self.precision, i, self.head_dim);
            self.values[layer].prefetch(self.precision, i, self.head_dim);
        }
    }

    /// The key at (layer, sequence, head, position) as `head_dim` floats (in place for f32,
    /// otherwise decoded into `scratch`).
    #[inline]
    pub fn key<'a>(&'a self, layer: usize, seq: usize, head: usize, pos: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        self.keys[layer].read(self.precision, self.index(seq, head, pos), self.head_dim, scratch)
    }

    #[inline]
    pub fn value<'a>(&'a self, layer: usize, seq: usize, head: usize, pos: usize, scratch: &'a mut [f32]) -> &'a [f32] {
        self.values[layer].read(self.precision, self.index(seq, head, pos), self.head_dim, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_are_exact() {
        let cfg = ModelConfig::preset("bitnet-b1.58-2b-4t").unwrap();
        // 2 (K,V) × 30 layers × 5 KV heads × 128 dims × 2 bytes.
        assert_eq!(KvPrecision::F16.bytes_per_token(&cfg), 2 * 30 * 5 * 128 * 2);
        assert_eq!(KvPrecision::Int4.bytes_per_vector(128), 64 + 8);
        assert_eq!(KvPrecision::Int2.bytes_per_vector(100), 25 + 4 * 7);
        let c = KvCache::new(&cfg, KvPrecision::Int8, 2, 64).unwrap();
        assert_eq!(c.byte_len(), 2 * 64 * KvPrecision::Int8.bytes_per_token(&cfg));
        assert!(KvCache::new(&cfg, KvPrecision::F16, 1, 5000).unwrap_err().to_string().contains("4096"));
    }

    #[test]
    fn writes_do_not_disturb_neighbours() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let mut c = KvCache::new(&cfg, KvPrecision::Int4, 2, 8).unwrap();
        let d = cfg.head_dim();
        let a: Vec<f32> = (0..d).map(|i| i as f32 / 10.0).collect();
        let b: Vec<f32> = (0..d).map(|i| -(i as f32) / 7.0).collect();
        c.write(1, 1, 1, 3, &a, &b);
        c.write(1, 1, 1, 4, &b, &a);
        let mut scratch = vec![0f32; d];
        // int4: error at most half a step, absmax / 14 (plus the f16 rounding of the scale).
        let close = |out: &[f32], want: &[f32]| {
            let tol = want.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 14.0 * 1.01;
            out.iter().zip(want).all(|(x, y)| (x - y).abs() <= tol)
        };
        assert!(close(c.key(1, 1, 1, 3, &mut scratch), &a));
        assert!(close(c.value(1, 1, 1, 4, &mut scratch), &a));
        assert!(close(c.key(1, 1, 1, 4, &mut scratch), &b));
        assert!(close(c.value(1, 1, 1, 3, &mut scratch), &b));
        // f32 and f16 stores read back exactly (f16: exactly the f16 rounding).
        for p in [KvPrecision::F32, KvPrecision::F16] {
            let mut c = KvCache::new(&cfg, p, 1, 4).unwrap();
            c.write(0, 0, 1, 2, &a, &b);
            let want: Vec<f32> =
                a.iter().map(|x| if p == KvPrecision::F16 { f16::from_f32(*x).to_f32() } else { *x }).collect();
            assert_eq!(c.key(0, 0, 1, 2, &mut scratch), &want[..]);
        }
    }
}
