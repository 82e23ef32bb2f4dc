//! The bit-plane (XNOR/popcount) kernel at AVX-512, with VPOPCNTDQ.

use super::*;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vpopcntdq,avx2,fma,popcnt,f16c")]
pub(super) unsafe fn xnor_fused(w: &PackedWeights, x: &ActivationBatch, rows: Range<usize>, out: &mut [f32]) {
    let batch = x.batch();
    let xw = x.plane_words();
    for (i, r) in rows.enumerate() {
        let (mask, sign, words, scale) = match w {
            PackedWeights::BitPlanes(m) => {
                let (mk, sg) = m.row_planes(r);
                (Some(mk), sg, m.words(), m.scale())
            }
            PackedWeights::Binary(m) => (None, m.row_words(r), m.words(), m.scale()),
            _ => unreachable!("xnor takes plane formats only"),
        };
        for b in 0..batch {
            let planes = x.planes(b).as_ptr();
            let mut nz = [_mm512_setzero_si512(); ACT_PLANES];
            let mut neg = [_mm512_setzero_si512(); ACT_PLANES];
            let mut wd = 0;
            while wd < words {
                let k: __mmask8 = if words - wd >= 8 { 0xff } else { (1u8 << (words - wd)) - 1 };
                let s = _mm512_maskz_loadu_epi64(k, sign.as_ptr().add(wd) as *const i64);
                let m = match mask {
                    Some(mk) => _mm512_maskz_loadu_epi64(k, mk.as_ptr().add(wd) as *const i64),
                    None => _mm512_setzero_si512(),
                };
                for p in 0..ACT_PLANES {
                    let bp = _mm512_maskz_loadu_epi64(k, planes.add(p * xw + wd) as *const i64);
                    neg[p] = _mm512_add_epi64(neg[p], _mm512_popcnt_epi64(_mm512_and_si512(s, bp)));
                    if mask.is_some() {
                        nz[p] = _mm512_add_epi64(nz[p], _mm512_popcnt_epi64(_mm512_and_si512(m, bp)));
                    }
                }
                wd += 8;
            }
            let mut isum = 0i32;
            for p in 0..ACT_PLANES {
                let nz_c =
                    if mask.is_some() { _mm512_reduce_add_epi64(nz[p]) as i32 } else { x.plane_counts(b)[p] as i32 };
                let neg_c = _mm512_reduce_add_epi64(neg[p]) as i32;
                isum += PLANE_WEIGHTS[p] * (nz_c - 2 * neg_c);
            }
            out[i * batch + b] = finish_tensor(isum, scale, x.scale(b));
        }
    }
}
