//! ggml tensor types this engine reads: ids, exact byte sizes, and decoders.

use half::{bf16, f16};

pub use crate::formats::q6k::decode_q6k_block;

/// A ggml tensor type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Bf16,
    /// llama.cpp ternary, base-3.
    Tq1_0,
    /// llama.cpp ternary, 2-bit.
    Tq2_0,
    /// bitnet.cpp's 2-bit ternary with one f32 scale per tensor (x86 layout).
    I2S,
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            15 => GgmlType::Q8K,
            30 => GgmlType::Bf16,
            34 => GgmlType::Tq1_0,
            35 => GgmlType::Tq2_0,
            36 => GgmlType::I2S,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::Bf16 => 30,
            GgmlType::Tq1_0 => 34,
            GgmlType::Tq2_0 => 35,
            GgmlType::I2S => 36,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::Bf16 => "BF16",
            GgmlType::Tq1_0 => "TQ1_0",
            GgmlType::Tq2_0 => "TQ2_0",
            GgmlType::I2S => "I2_S",
        }
    }

    /// (elements per block, bytes per block) of the block types.
    fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::Q8K => (256, 292),
            GgmlType::Tq1_0 => (256, 54),
            GgmlType::Tq2_0 => (256, 66),
            GgmlType::I2S => (4, 1),
        }
    }

    /// Exact data bytes of a tensor with `elements` elements and rows of `row_len`. I2_S (which
    /// a generic reader cannot size from the type table) is 2 bits per weight plus 32 bytes:
    /// the f32 tensor scale and 28 bytes of padding.
    pub fn byte_size(self, row_len: u64, elements: u64) -> Result<usize, String> {
        let (bs, bytes) = self.block();
        if !row_len.is_multiple_of(bs) {
            return Err(format!("{} needs rows of a multiple of {bs} values, got {row_len}", self.name()));
        }
        let extra = if self == GgmlType::I2S { 32 } else { 0 };
        usize::try_from(elements / bs * bytes + extra).map_err(|_| "too large".to_string())
    }
}

/// Decodes `n` values of a float or k-quant tensor into f32 (types used for embeddings,
/// output matrices and norms). Returns `None` for other types.
pub fn decode_f32(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Option<()> {
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Bf16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q6K => {
            for (block, o) in data.chunks_exact(210).zip(out.chunks_mut(256)) {
                decode_q6k_block(block, o);
            }
        }
        _ => return None,
    }
    Some(())
}

/// Decodes a bitnet.cpp I2_S tensor (`rows × cols` codes + f32 scale) into ternary values
/// (row-major) and its scale. Weight j of 128-weight block i is in byte `32 i + j % 32` at shift
/// `6 − 2 (j / 32)`; codes 0, 1, 2 mean −1, 0, +1.
pub fn decode_i2s(data: &[u8], rows: usize, cols: usize) -> Result<(Vec<i8>, f32), String> {
    let n = rows * cols;
    if !n.is_multiple_of(128) {
        return Err(format!("I2_S needs a multiple of 128 weights, got {n}"));
    }
    if data.len() < n / 4 + 4 {
        return Err(format!("I2_S data is {} bytes, expected at least {}", data.len(), n / 4 + 4));
    }
    let mut values = vec![0i8; n];
    for (i, block) in data[..n / 4].chunks_exact(32).enumerate() {
        for j in 0..128 {
            let code = (block[j % 32] >> (6 - 2 * (j / 32))) & 3;
            values[128 * i + j] = match code {
                0 => -1,
                1 => 0,
                2 => 1,
                _ => return Err(format!("I2_S holds code 3 (not ternary) at weight {}", 128 * i + j)),
            };
        }
    }
    let s = &data[n / 4..n / 4 + 4];
    Ok((values, f32::from_le_bytes([s[0], s[1], s[2], s[3]])))
}

/// Encodes ternary values (row-major, a multiple of 128) and their scale as bitnet.cpp's I2_S
/// tensor data: the inverse of [`decode_i2s`], with the 28 bytes after the scale zeroed.
pub fn encode_i2s(values: &[i8], scale: f32) -> Vec<u8> {
    debug_assert!(values.len().is_multiple_of(128));
    let mut out = vec![0u8; values.len() / 4 + 32];
    for (i, block) in values.chunks_exact(128).enumerate() {
        for (j, v) in block.iter().enumerate() {
            out[32 * i + j % 32] |= ((*v + 1) as u8 & 3) << (6 - 2 * (j / 32));
        }
    }
    let n = values.len() / 4;
    out[n..n + 4].copy_from_slice(&scale.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs ternary values the way bitnet.cpp's x86 I2_S does (shared/PLATFORM.md): weight j of
    /// 128-weight block i in byte 32 i + j % 32 at shift 6 − 2 (j / 32), codes 0/1/2 = −1/0/+1,
    /// then the f32 scale and 28 bytes of padding (not necessarily zero).
    fn pack_i2s(values: &[i8], scale: f32) -> Vec<u8> {
        let mut out = vec![0u8; values.len() / 4];
        for (k, v) in values.iter().enumerate() {
            let (i, j) = (k / 128, k % 128);
            out[32 * i + j % 32] |= ((v + 1) as u8) << (6 - 2 * (j / 32));
        }
        out.extend_from_slice(&scale.to_le_bytes());
        out.extend_from_slice(&[0xAB; 28]);
        out
    }

    #[test]
    fn i2s_encodes_as_bitnet_cpp_packs() {
        let mut g = crate::rng::SplitMix64::new(5);
        let values: Vec<i8> = (0..4 * 128).map(|_| g.ternary()).collect();
        let ours = encode_i2s(&values, 0.5);
        let theirs = pack_i2s(&values, 0.5);
        assert_eq!(ours.len(), theirs.len());
        assert_eq!(ours[..values.len() / 4 + 4], theirs[..values.len() / 4 + 4]);
        assert!(ours[values.len() / 4 + 4..].iter().all(|b| *b == 0));
    }

    #[test]
    fn i2s_decodes_bitnet_cpp_layout() {
        let mut g = crate::rng::SplitMix64::new(4);
        let values: Vec<i8> = (0..3 * 256).map(|_| g.ternary()).collect();
        let bytes = pack_i2s(&values, 0.0625);
        assert_eq!(GgmlType::I2S.byte_size(256, 3 * 256).unwrap(), bytes.len());
        let (back, scale) = decode_i2s(&bytes, 3, 256).unwrap();
        assert_eq!((back, scale), (values.clone(), 0.0625));
        // Weight 0 is the top 2 bits of byte 0; weight 32 the next 2 bits of the same byte.
        assert_eq!(bytes[0] >> 6, (values[0] + 1) as u8);
        assert_eq!((bytes[0] >> 4) & 3, (values[32] + 1) as u8);
        let mut bad = bytes.clone();
        bad[5] = 0xFF;
        assert!(decode_i2s(&bad, 3, 256).unwrap_err().contains("code 3"));
        assert!(decode_i2s(&bytes[..100], 3, 256).is_err());
    }

    #[test]
    fn sizes_of_block_types() {
        assert_eq!(GgmlType::Tq2_0.byte_size(512, 512 * 3).unwrap(), 6 * 66);
        assert_eq!(GgmlType::Q6K.byte_size(256, 256).unwrap(), 210);
        assert!(GgmlType::Tq1_0.byte_size(100, 100).unwrap_err().contains("multiple of 256"));
        for id in 0..40 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
    }
}
