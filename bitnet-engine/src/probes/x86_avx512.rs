//! The probes' loops at AVX-512: the bandwidth reader and the `vpdpbusd` compute chains.

use std::arch::x86_64::*;

use crate::simd::x86_avx512::*;

/// The bandwidth probe's reader: wrapping sum of `words` with 4 independent 512-bit accumulators.
pub(crate) fn sum_words(_t: Avx512, words: &[u64]) -> u64 {
    // SAFETY: the token proves AVX-512F support; every load is inside `words` (i + 8j + 8 ≤ body).
    unsafe { sum_words_impl(words) }
}

#[target_feature(enable = "avx512f")]
unsafe fn sum_words_impl(words: &[u64]) -> u64 {
    let mut acc = [_mm512_setzero_si512(); 4];
    let body = words.len() / 32 * 32;
    let p = words.as_ptr();
    for i in (0..body).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.add(i + 8 * j) as *const _));
        }
    }
    let s = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
    (_mm512_reduce_add_epi64(s) as u64).wrapping_add(crate::probes::bandwidth::sum_words_portable(&words[body..]))
}

/// The compute probe's loop (see `compute_peak`): `rounds` × 12 independent `vpdpbusd` on
/// 512-bit registers (64 u8 × i8 products each), every chain `a · b` once a round. Returns the
/// lane-wise wrapping sum of the 12 accumulators (lane l: 12 × rounds × Σ_{j<4} a[4l+j] ×
/// b[4l+j]). Twelve chains cover `vpdpbusd`'s latency at one or two a cycle.
pub(crate) fn int8_mac_chains(_t: Avx512, rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> [i32; 16] {
    // SAFETY: the token proves AVX-512F/VNNI support; the loads read the two 64-byte arrays.
    unsafe { int8_mac_chains_impl(rounds, a, b) }
}

#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_mac_chains_impl(rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> [i32; 16] {
    let va = _mm512_loadu_si512(a.as_ptr() as *const _);
    let vb = _mm512_loadu_si512(b.as_ptr() as *const _);
    let mut c = [_mm512_setzero_si512(); 12];
    for _ in 0..rounds {
        // In assembly so that the compiler can neither merge the identical chains nor hoist
        // their products: the loop is the instruction it measures.
        std::arch::asm!(
            "vpdpbusd {c0}, {a}, {b}",
            "vpdpbusd {c1}, {a}, {b}",
            "vpdpbusd {c2}, {a}, {b}",
            "vpdpbusd {c3}, {a}, {b}",
            "vpdpbusd {c4}, {a}, {b}",
            "vpdpbusd {c5}, {a}, {b}",
            "vpdpbusd {c6}, {a}, {b}",
            "vpdpbusd {c7}, {a}, {b}",
            "vpdpbusd {c8}, {a}, {b}",
            "vpdpbusd {c9}, {a}, {b}",
            "vpdpbusd {c10}, {a}, {b}",
            "vpdpbusd {c11}, {a}, {b}",
            a = in(zmm_reg) va,
            b = in(zmm_reg) vb,
            c0 = inout(zmm_reg) c[0],
            c1 = inout(zmm_reg) c[1],
            c2 = inout(zmm_reg) c[2],
            c3 = inout(zmm_reg) c[3],
            c4 = inout(zmm_reg) c[4],
            c5 = inout(zmm_reg) c[5],
            c6 = inout(zmm_reg) c[6],
            c7 = inout(zmm_reg) c[7],
            c8 = inout(zmm_reg) c[8],
            c9 = inout(zmm_reg) c[9],
            c10 = inout(zmm_reg) c[10],
            c11 = inout(zmm_reg) c[11],
            options(pure, nomem, nostack),
        );
    }
    let mut s = c[0];
    for v in &c[1..] {
        s = _mm512_add_epi32(s, *v);
    }
    std::mem::transmute::<__m512i, [i32; 16]>(s)
}
