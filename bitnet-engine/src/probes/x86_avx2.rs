//! The probes' loops at AVX2: the bandwidth reader and the `vpmaddubsw` compute chains.

use std::arch::x86_64::*;

use crate::simd::x86_avx2::*;

/// The bandwidth probe's reader: wrapping sum of `words` with 4 independent 256-bit accumulators.
pub(crate) fn sum_words(_t: Avx2, words: &[u64]) -> u64 {
    // SAFETY: the token proves AVX2 support; every load is inside `words` (i + 4j + 4 ≤ body).
    unsafe { sum_words_impl(words) }
}

#[target_feature(enable = "avx2")]
unsafe fn sum_words_impl(words: &[u64]) -> u64 {
    let mut acc = [_mm256_setzero_si256(); 4];
    let body = words.len() / 16 * 16;
    let p = words.as_ptr();
    for i in (0..body).step_by(16) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + 4 * j) as *const __m256i));
        }
    }
    let s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    hsum_u64(s).wrapping_add(crate::probes::bandwidth::sum_words_portable(&words[body..]))
}

/// The compute probe's loop (see `compute_peak`): `rounds` × 8 independent chains of the
/// fastest int8 product AVX2 has — `vpmaddubsw` (32 u8 × i8 products, summed in pairs into
/// i16 with saturation) accumulated with `vpaddw` (wrapping), as the batched kernels
/// accumulate before they widen — every chain `a · b` once a round. Returns the lane-wise
/// wrapping i16 sum of the 8 accumulators, each lane widened to i32 (lane l: 8 × rounds ×
/// sat(a[2l]·b[2l] + a[2l+1]·b[2l+1]), wrapped to i16).
pub(crate) fn int8_mac_chains(_t: Avx2, rounds: u64, a: &[u8; 32], b: &[i8; 32]) -> [i32; 16] {
    // SAFETY: the token proves AVX2 support; the loads read the two 32-byte arrays.
    unsafe { int8_mac_chains_impl(rounds, a, b) }
}

#[target_feature(enable = "avx2")]
unsafe fn int8_mac_chains_impl(rounds: u64, a: &[u8; 32], b: &[i8; 32]) -> [i32; 16] {
    let va = _mm256_loadu_si256(a.as_ptr() as *const __m256i);
    let vb = _mm256_loadu_si256(b.as_ptr() as *const __m256i);
    let mut c = [_mm256_setzero_si256(); 8];
    for _ in 0..rounds {
        // In assembly so that the compiler can neither merge the identical chains nor hoist
        // their products out of the loop (8 accumulators, two temporaries: 12 of 16 registers).
        std::arch::asm!(
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c0}, {c0}, {t0}",
            "vpaddw {c1}, {c1}, {t1}",
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c2}, {c2}, {t0}",
            "vpaddw {c3}, {c3}, {t1}",
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c4}, {c4}, {t0}",
            "vpaddw {c5}, {c5}, {t1}",
            "vpmaddubsw {t0}, {a}, {b}",
            "vpmaddubsw {t1}, {a}, {b}",
            "vpaddw {c6}, {c6}, {t0}",
            "vpaddw {c7}, {c7}, {t1}",
            a = in(ymm_reg) va,
            b = in(ymm_reg) vb,
            t0 = out(ymm_reg) _,
            t1 = out(ymm_reg) _,
            c0 = inout(ymm_reg) c[0],
            c1 = inout(ymm_reg) c[1],
            c2 = inout(ymm_reg) c[2],
            c3 = inout(ymm_reg) c[3],
            c4 = inout(ymm_reg) c[4],
            c5 = inout(ymm_reg) c[5],
            c6 = inout(ymm_reg) c[6],
            c7 = inout(ymm_reg) c[7],
            options(pure, nomem, nostack),
        );
    }
    let mut s = c[0];
    for v in &c[1..] {
        s = _mm256_add_epi16(s, *v);
    }
    let lanes = std::mem::transmute::<__m256i, [i16; 16]>(s);
    let mut out = [0i32; 16];
    for (o, l) in out.iter_mut().zip(lanes) {
        *o = l as i32;
    }
    out
}
