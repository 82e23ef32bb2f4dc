//! How the KV cache stores a vector: each precision's encoding and decoding, quantized on
//! write and dequantized on read; each vector is encoded independently.
//!
//! | precision | stored per vector of d values |
//! |---|---|
//! | `f32` | 4d bytes |
//! | `f16`, `bf16` | 2d bytes |
//! | `fp8` (E4M3) | d bytes + f16 scale (absmax → 448) |
//! | `int8` | d bytes + f16 scale (absmax / 127, symmetric) |
//! | `int4` | ⌈d/2⌉ bytes + f16 scale per group of 32 (absmax / 7, symmetric) |
//! | `int2` | ⌈d/4⌉ bytes + f16 min and f16 step per group of 16 (4 levels, asymmetric) |

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::formats::int8::round_even;

/// Storage precision of cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KvPrecision {
    F32,
    F16,
    Bf16,
    Fp8,
    Int8,
    Int4,
    Int2,
}

const INT4_GROUP: usize = 32;
const INT2_GROUP: usize = 16;

impl KvPrecision {
    pub const ALL: [KvPrecision; 7] = [
        KvPrecision::F32,
        KvPrecision::F16,
        KvPrecision::Bf16,
        KvPrecision::Fp8,
        KvPrecision::Int8,
        KvPrecision::Int4,
        KvPrecision::Int2,
    ];

    /// Stored as bytes that attention decodes to f32 (`KvRows::Encoded`): every precision but
    /// f32 and f16, which attention reads as they are.
    pub fn is_encoded(self) -> bool {
        !matches!(self, KvPrecision::F32 | KvPrecision::F16)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::Bf16 => "bf16",
            KvPrecision::Fp8 => "fp8",
            KvPrecision::Int8 => "int8",
            KvPrecision::Int4 => "int4",
            KvPrecision::Int2 => "int2",
        }
    }

    /// Exact bytes of one encoded vector of `d` values.
    pub fn bytes_per_vector(self, d: usize) -> usize {
        match self {
            KvPrecision::F32 => 4 * d,
            KvPrecision::F16 | KvPrecision::Bf16 => 2 * d,
            KvPrecision::Fp8 | KvPrecision::Int8 => d + 2,
            KvPrecision::Int4 => d.div_ceil(2) + 2 * d.div_ceil(INT4_GROUP),
            KvPrecision::Int2 => d.div_ceil(4) + 4 * d.div_ceil(INT2_GROUP),
        }
    }

    /// Encodes `v` into `out` (`bytes_per_vector(v.len())` bytes).
    pub fn encode(self, v: &[f32], out: &mut [u8]) {
        let d = v.len();
        debug_assert_eq!(out.len(), self.bytes_per_vector(d));
        match self {
            KvPrecision::F32 => {
                for (o, x) in out.chunks_exact_mut(4).zip(v) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
            KvPrecision::F16 => {
                for (o, x) in out.chunks_exact_mut(2).zip(v) {
                    o.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
                }
            }
            KvPrecision::Bf16 => {
                for (o, x) in out.chunks_exact_mut(2).zip(v) {
                    o.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
                }
            }
            KvPrecision::Fp8 => {
                let absmax = absmax(v);
                let scale = f16::from_f32(absmax / 448.0);
                let inv = if scale.to_f32() > 0.0 { 1.0 / scale.to_f32() } else { 0.0 };
                for (o, x) in out[..d].iter_mut().zip(v) {
                    *o = e4m3_encode(x * inv);
                }
                out[d..].copy_from_slice(&scale.to_le_bytes());
            }
            KvPrecision::Int8 => {
                let scale = f16::from_f32(absmax(v) / 127.0);
                let inv = if scale.to_f32() > 0.0 { 1.0 / scale.to_f32() } else { 0.0 };
                for (o, x) in out[..d].iter_mut().zip(v) {
                    *o = round_even(x * inv).clamp(-127.0, 127.0) as i8 as u8;
                }
                out[d..].copy_from_slice(&scale.to_le_bytes());
            }
            KvPrecision::Int4 => {
                let (codes, scales) = out.split_at_mut(d.div_ceil(2));
                codes.fill(0);
                for (g, chunk) in v.chunks(INT4_GROUP).enumerate() {
                    let scale = f16::from_f32(absmax(chunk) / 7.0);
                    let inv = if scale.to_f32() > 0.0 { 1.0 / scale.to_f32() } else { 0.0 };
                    scales[2 * g..2 * g + 2].copy_from_slice(&scale.to_le_bytes());
                    for (j, x) in chunk.iter().enumerate() {
                        let i = g * INT4_GROUP + j;
                        let q = (round_even(x * inv).clamp(-7.0, 7.0) as i32 + 8) as u8; // 1..=15
                        codes[i / 2] |= q << (4 * (i % 2));
                    }
                }
            }
            KvPrecision::Int2 => {
                let (codes, params) = out.split_at_mut(d.div_ceil(4));
                codes.fill(0);
                for (g, chunk) in v.chunks(INT2_GROUP).enumerate() {
                    let lo = chunk.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let min = f16::from_f32(lo);
                    let step = f16::from_f32((hi - min.to_f32()) / 3.0);
                    let inv = if step.to_f32() > 0.0 { 1.0 / step.to_f32() } else { 0.0 };
                    params[4 * g..4 * g + 2].copy_from_slice(&min.to_le_bytes());
                    params[4 * g + 2..4 * g + 4].copy_from_slice(&step.to_le_bytes());
                    for (j, x) in chunk.iter().enumerate() {
                        let i = g * INT2_GROUP + j;
                        let q = round_even((x - min.to_f32()) * inv).clamp(0.0, 3.0) as u8;
                        codes[i / 4] |= q << (2 * (i % 4));
                    }
                }
            }
        }
    }

    /// Decodes `d = out.len()` values from `bytes`. Inlined, so that where the precision is a
    /// constant (attention's per-precision loops, compiled for the widest ISA) only its arm
    /// remains; the int4 and int2 arms unpack whole groups in fixed-size loops, which vectorize.
    #[inline(always)]
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) {
        let d = out.len();
        match self {
            KvPrecision::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            KvPrecision::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16_at(b);
                }
            }
            KvPrecision::Bf16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            KvPrecision::Fp8 => {
                let scale = f16_at(&bytes[d..]);
                for (o, b) in out.iter_mut().zip(&bytes[..d]) {
                    *o = e4m3_to_f32(*b) * scale;
                }
            }
            KvPrecision::Int8 => {
                let scale = f16_at(&bytes[d..]);
                for (o, b) in out.iter_mut().zip(&bytes[..d]) {
                    *o = *b as i8 as f32 * scale;
                }
            }
            KvPrecision::Int4 => {
                // Value i is nibble i mod 2 of byte i / 2, minus 8, times its group's scale.
                let (codes, scales) = bytes.split_at(d.div_ceil(2));
                #[inline(always)]
                fn int4(q: u8, scale: f32) -> f32 {
                    (q as i32 - 8) as f32 * scale
                }
                for (g, og) in out.chunks_mut(INT4_GROUP).enumerate() {
                    let (scale, cg) = (f16_at(&scales[2 * g..]), &codes[g * INT4_GROUP / 2..]);
                    if let (Ok(og), Some(cg)) = (<&mut [f32; INT4_GROUP]>::try_from(&mut *og), cg.first_chunk::<16>()) {
                        for j in 0..INT4_GROUP / 2 {
                            og[2 * j] = int4(cg[j] & 15, scale);
                            og[2 * j + 1] = int4(cg[j] >> 4, scale);
                        }
                    } else {
                        for (j, o) in og.iter_mut().enumerate() {
                            *o = int4((cg[j / 2] >> (4 * (j % 2))) & 15, scale);
                        }
                    }
                }
            }
            KvPrecision::Int2 => {
                // Value i is crumb i mod 4 of byte i / 4: its group's min plus that many steps.
                let (codes, params) = bytes.split_at(d.div_ceil(4));
                for (g, og) in out.chunks_mut(INT2_GROUP).enumerate() {
                    let (min, step) = (f16_at(&params[4 * g..]), f16_at(&params[4 * g + 2..]));
                    let cg = &codes[g * INT2_GROUP / 4..];
                    if let (Ok(og), Some(cg)) = (<&mut [f32; INT2_GROUP]>::try_from(&mut *og), cg.first_chunk::<4>()) {
                        for j in 0..INT2_GROUP {
                            og[j] = min + ((cg[j / 4] >> (2 * (j % 4))) & 3) as f32 * step;
                        }
                    } else {
                        for (j, o) in og.iter_mut().enumerate() {
                            *o = min + ((cg[j / 4] >> (2 * (j % 4))) & 3) as f32 * step;
                        }
                    }
                }
            }
        }
    }
}

/// The little-endian f16 at the start of `b`, as f32. (`half` converts with F16C where the CPU
/// has it; an inlined bit-field conversion measured slower here: docs/perf-notes.md.)
#[inline(always)]
fn f16_at(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

impl fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvPrecision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        KvPrecision::ALL.iter().copied().find(|p| p.name() == s).ok_or_else(|| Error::UnknownName {
            what: "KV precision",
            got: s.to_string(),
            expected: KvPrecision::ALL.map(|p| p.name()).join(", "),
        })
    }
}

fn absmax(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// All 256 E4M3 (OCP FP8, "fn" variant: no infinities, 0x7F/0xFF are NaN) values.
/// An E4M3 byte's value, computed from its fields: the same floats as [`e4m3_table`] (tested on
/// all 256 bytes), in selects that vectorize where a table lookup is a load per value.
#[inline(always)]
fn e4m3_to_f32(b: u8) -> f32 {
    let b = b as u32;
    let (sign, exp, man) = ((b & 0x80) << 24, (b >> 3) & 15, b & 7);
    // Normal: (1 + m/8) · 2^(e − 7), an f32 exponent field of e + 120. Subnormal: m · 2⁻⁹.
    let normal = f32::from_bits(sign | ((exp + 120) << 23) | (man << 20));
    let subnormal = f32::from_bits(sign | (man as f32 * (1.0 / 512.0)).to_bits());
    let v = if exp == 0 { subnormal } else { normal };
    if b & 0x7f == 0x7f {
        f32::NAN
    } else {
        v
    }
}

#[cfg(test)]
fn e4m3_table() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0f32; 256];
        for (b, v) in t.iter_mut().enumerate() {
            let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
            let exp = ((b >> 3) & 15) as i32;
            let man = (b & 7) as f32;
            *v = if b & 0x7f == 0x7f {
                f32::NAN
            } else if exp == 0 {
                sign * man / 8.0 * 2f32.powi(-6)
            } else {
                sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
            };
        }
        t
    })
}

/// The definition [`e4m3_encode`] is tested against: the largest code at most |x| by a binary
/// search of the (increasing) positive codes, or the next one up if nearer, ties to the even code.
#[cfg(test)]
fn e4m3_encode_by_search(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let t = e4m3_table();
    let sign = if x < 0.0 { 0x80u8 } else { 0 };
    let a = x.abs();
    let (mut lo, mut hi) = (0usize, 0x7e);
    if a >= t[hi] {
        return sign | hi as u8;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if t[mid] <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (dl, dh) = (a - t[lo], t[hi] - a);
    let code = if dl < dh || (dl == dh && lo % 2 == 0) { lo } else { hi };
    sign | code as u8
}

/// Nearest E4M3 code (ties to even code), saturating at ±448; NaN maps to 0. Arithmetic and
/// branch-free, so a row's encode vectorizes: a prompt's KV write had spent 1.1 ns a value in
/// a binary search of the code table (large, context 2000: 16% of prefill, on one thread). The
/// search is kept as the tests' reference (`e4m3_encode_by_search`).
#[inline(always)]
fn e4m3_encode(x: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 × 2^23: see `activations::to_q8`
    let a = x.abs();
    let bits = a.to_bits();
    // From 2⁻⁶ up: the f32's mantissa rounded to three bits (ties to even: + 0x7ffff and the
    // kept bits' lowest), the exponent rebiased from 127 to 7 (code = e << 3 | m, so a carry
    // out of the mantissa steps the exponent), capped at 448's code 0x7e.
    let normal = (bits.wrapping_add(0x7_FFFF + ((bits >> 20) & 1)) >> 20).wrapping_sub(120 << 3).min(0x7E);
    // Below 2⁻⁶: subnormal codes are the multiples of 2⁻⁹, a · 2⁹ rounded to even (8 is the
    // first normal code, 2⁻⁶). Capped at 8 first so that the rounding trick stays exact.
    let sub = ((a * 512.0).min(8.0) + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits());
    let code = if a < 1.0 / 64.0 { sub } else { normal };
    let code = if x.is_nan() { 0 } else { code as u8 };
    code | if x < 0.0 { 0x80 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_table_and_rounding() {
        let t = e4m3_table();
        assert_eq!(t[0x7e], 448.0);
        assert_eq!(t[0x08], 2f32.powi(-6));
        assert_eq!(t[0x01], 2f32.powi(-9));
        assert!(t[0x7f].is_nan());
        for b in 0..0x7fu8 {
            assert_eq!(e4m3_encode_by_search(t[b as usize]), b, "exact value of code {b:#x}");
            assert_eq!(e4m3_encode_by_search(-t[b as usize]) & 0x7f, b);
        }
        assert_eq!(e4m3_encode_by_search(1000.0), 0x7e);
        // 1.0 (0x38) and 1.125 (0x39): the midpoint ties to the even code.
        assert_eq!(e4m3_encode_by_search(1.0625), 0x38);
        assert_eq!(e4m3_encode_by_search(1.07), 0x39);
        // The arithmetic encode is the search's: at every code, its neighbours one ulp away, every
        // midpoint between codes and one ulp either side, specials, and a sweep of f32 patterns
        // from 0 past the saturation (every 251st; both signs).
        let mut xs = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::MAX, 1e-45, 1e-40];
        for b in 0..0x7fusize {
            let v = t[b];
            xs.extend([v, v.next_up(), v.next_down()]);
            if b < 0x7e {
                let mid = (v + t[b + 1]) / 2.0;
                xs.extend([mid, mid.next_up(), mid.next_down()]);
            }
        }
        xs.extend((0..0x4400_0000u32).step_by(251).map(f32::from_bits));
        for x in xs {
            for x in [x, -x] {
                assert_eq!(e4m3_encode(x), e4m3_encode_by_search(x), "{x:e} ({:#x})", x.to_bits());
            }
        }
        // The arithmetic decode gives the table's bits for every byte (NaN included).
        for b in 0..=255u8 {
            assert_eq!(e4m3_to_f32(b).to_bits(), t[b as usize].to_bits(), "code {b:#x}");
        }
    }

    #[test]
    fn decode_matches_the_plain_formulas() {
        // `decode` unpacks whole int4/int2 groups in fixed-size loops; the definition is one
        // value at a time, as the table in the module docs says.
        let mut g = crate::rng::SplitMix64::new(5);
        for d in [1usize, 15, 16, 17, 31, 32, 33, 96, 100, 128] {
            let v: Vec<f32> = (0..d).map(|_| g.unit_f32() * 6.0 - 3.0).collect();
            for p in KvPrecision::ALL {
                let mut bytes = vec![0u8; p.bytes_per_vector(d)];
                p.encode(&v, &mut bytes);
                let h = |i: usize| f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32();
                let plain: Vec<f32> = (0..d)
                    .map(|i| match p {
                        KvPrecision::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
                        KvPrecision::F16 => h(2 * i),
                        KvPrecision::Bf16 => bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
                        KvPrecision::Fp8 => e4m3_table()[bytes[i] as usize] * h(d),
                        KvPrecision::Int8 => bytes[i] as i8 as f32 * h(d),
                        KvPrecision::Int4 => {
                            let q = (bytes[i / 2] >> (4 * (i % 2))) & 15;
                            (q as i32 - 8) as f32 * h(d.div_ceil(2) + 2 * (i / INT4_GROUP))
                        }
                        KvPrecision::Int2 => {
                            let q = (bytes[i / 4] >> (2 * (i % 4))) & 3;
                            let at = d.div_ceil(4) + 4 * (i / INT2_GROUP);
                            h(at) + q as f32 * h(at + 2)
                        }
                    })
                    .collect();
                let mut got = vec![f32::NAN; d];
                p.decode(&bytes, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&plain), "{p}, d {d}");
            }
        }
    }

    #[test]
    fn round_trip_errors_are_ordered_by_precision() {
        let d = 100; // 3B's head size: not a multiple of any group size
        let v: Vec<f32> = (0..d).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 31.0).collect();
        let mut errs = Vec::new();
        for p in KvPrecision::ALL {
            let mut bytes = vec![0u8; p.bytes_per_vector(d)];
            p.encode(&v, &mut bytes);
            let mut back = vec![0f32; d];
            p.decode(&bytes, &mut back);
            let err = v.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            errs.push((p, err));
        }
        assert_eq!(errs[0].1, 0.0, "f32 is exact");
        let e = |p: KvPrecision| errs.iter().find(|(q, _)| *q == p).unwrap().1;
        assert!(e(KvPrecision::F16) < e(KvPrecision::Int8));
        assert!(e(KvPrecision::Int8) < e(KvPrecision::Int4));
        assert!(e(KvPrecision::Int4) < e(KvPrecision::Int2));
        assert!(e(KvPrecision::Fp8) < e(KvPrecision::Int4));
        let range = 105.0 / 31.0 * 2.0;
        assert!(e(KvPrecision::Int2) <= range / 3.0 * 0.5 * 1.01 + 1e-3, "{errs:?}");
    }
}
