//! The bit-plane (XNOR/popcount) kernel at AVX2.

use super::*;

#[target_feature(enable = "avx2,fma,popcnt,f16c")]
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
        let body = words / 4 * 4;
        for b in 0..batch {
            let planes = x.planes(b);
            let mut isum = 0i32;
            for p in 0..ACT_PLANES {
                let plane = &planes[p * xw..p * xw + words];
                let (mut nz, mut neg) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for wd in (0..body).step_by(4) {
                    let bp = load(plane.as_ptr().add(wd) as *const u8);
                    let s = _mm256_and_si256(load(sign.as_ptr().add(wd) as *const u8), bp);
                    neg = _mm256_add_epi64(neg, popcnt_u64x4(s));
                    if let Some(mask) = mask {
                        let m = _mm256_and_si256(load(mask.as_ptr().add(wd) as *const u8), bp);
                        nz = _mm256_add_epi64(nz, popcnt_u64x4(m));
                    }
                }
                let mut neg_c = hsum_u64(neg) as i32;
                let mut nz_c = hsum_u64(nz) as i32;
                for wd in body..words {
                    neg_c += (sign[wd] & plane[wd]).count_ones() as i32;
                    if let Some(mask) = mask {
                        nz_c += (mask[wd] & plane[wd]).count_ones() as i32;
                    }
                }
                if mask.is_none() {
                    nz_c = x.plane_counts(b)[p] as i32;
                }
                isum += PLANE_WEIGHTS[p] * (nz_c - 2 * neg_c);
            }
            out[i * batch + b] = finish_tensor(isum, scale, x.scale(b));
        }
    }
}
