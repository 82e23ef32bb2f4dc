//! The pipe probe's loops ([`crate::probes::compute_peak::measure_pipe_mixes`]): on AVX-512, rounds of
//! `vpdpbusd` interleaved with another instruction family, on register operands (masks from
//! memory where a kernel would load them), so that the rate of each mix shows whether that
//! family runs beside `vpdpbusd` or takes its issue slots. They bound what lookup, bf16 and
//! add-based batch kernels could add to the int8 peak.
//!
//! Each loop is assembly, so the compiler can neither merge its identical chains nor hoist
//! them: the loop is the instructions it measures. Each returns the lane-wise wrapping sum of
//! its integer accumulators and the sum of its float ones, which the tests check against the
//! instructions' definitions.

use std::arch::asm;
use std::arch::x86_64::*;

use crate::probes::compute_peak::{MixLanes, MixOperands, PipeMix};
use crate::simd::x86_avx512::Avx512;

/// Whether the CPU has what `mix` needs: AVX-512 with VNNI, and BF16 for the `vdpbf16ps`
/// mixes, VBMI for the byte-permute lookup.
pub(crate) fn supported(mix: PipeMix) -> bool {
    Avx512::new().is_some()
        && match mix {
            PipeMix::Bf16 | PipeMix::VnniBf16 => std::arch::is_x86_feature_detected!("avx512bf16"),
            PipeMix::Lookup => std::arch::is_x86_feature_detected!("avx512vbmi"),
            PipeMix::Vnni | PipeMix::VnniAdd | PipeMix::VnniMaskedAdd => true,
        }
}

/// `rounds` rounds of `mix` on `ops`; `None` where [`supported`] says no.
pub(crate) fn run_mix(mix: PipeMix, rounds: u64, ops: &MixOperands) -> Option<MixLanes> {
    if !supported(mix) {
        return None;
    }
    // SAFETY: `supported` proved AVX-512 F/BW/VNNI and the family `mix` adds; the loops read
    // only their operands (registers) and, for the masked adds, the six u32 of `ops.masks`.
    Some(unsafe {
        match mix {
            // The int8 peak's own loop, as the same run's reference.
            PipeMix::Vnni => MixLanes {
                ints: super::x86_avx512::int8_mac_chains(Avx512::new()?, rounds, &ops.a, &ops.b),
                floats: [0.0; 16],
            },
            PipeMix::Bf16 => bf16(rounds, ops),
            PipeMix::VnniBf16 => vnni_bf16(rounds, ops),
            PipeMix::Lookup => lookup(rounds, ops),
            PipeMix::VnniAdd => vnni_add(rounds, ops),
            PipeMix::VnniMaskedAdd => vnni_masked_add(rounds, ops),
        }
    })
}

#[inline(always)]
unsafe fn zmm<T>(v: &T) -> __m512i {
    _mm512_loadu_si512(v as *const T as *const _)
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn lanes(ints: &[__m512i], floats: &[__m512]) -> MixLanes {
    let (mut i, mut f) = (_mm512_setzero_si512(), _mm512_setzero_ps());
    for v in ints {
        i = _mm512_add_epi32(i, *v);
    }
    for v in floats {
        f = _mm512_add_ps(f, *v);
    }
    MixLanes { ints: std::mem::transmute::<__m512i, [i32; 16]>(i), floats: std::mem::transmute::<__m512, [f32; 16]>(f) }
}

/// 12 independent `vdpbf16ps` a round: 32 bf16 pairs each, into f32 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn bf16(rounds: u64, ops: &MixOperands) -> MixLanes {
    let (a, b) = (zmm(&ops.bf_a), zmm(&ops.bf_b));
    let mut f = [_mm512_setzero_ps(); 12];
    for _ in 0..rounds {
        asm!(
            "vdpbf16ps {f0}, {a}, {b}", "vdpbf16ps {f1}, {a}, {b}", "vdpbf16ps {f2}, {a}, {b}",
            "vdpbf16ps {f3}, {a}, {b}", "vdpbf16ps {f4}, {a}, {b}", "vdpbf16ps {f5}, {a}, {b}",
            "vdpbf16ps {f6}, {a}, {b}", "vdpbf16ps {f7}, {a}, {b}", "vdpbf16ps {f8}, {a}, {b}",
            "vdpbf16ps {f9}, {a}, {b}", "vdpbf16ps {f10}, {a}, {b}", "vdpbf16ps {f11}, {a}, {b}",
            a = in(zmm_reg) a, b = in(zmm_reg) b,
            f0 = inout(zmm_reg) f[0], f1 = inout(zmm_reg) f[1], f2 = inout(zmm_reg) f[2],
            f3 = inout(zmm_reg) f[3], f4 = inout(zmm_reg) f[4], f5 = inout(zmm_reg) f[5],
            f6 = inout(zmm_reg) f[6], f7 = inout(zmm_reg) f[7], f8 = inout(zmm_reg) f[8],
            f9 = inout(zmm_reg) f[9], f10 = inout(zmm_reg) f[10], f11 = inout(zmm_reg) f[11],
            options(pure, nomem, nostack),
        );
    }
    lanes(&[], &f)
}

/// 6 `vpdpbusd` and 6 `vdpbf16ps` a round, interleaved, on separate accumulators.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512bf16")]
unsafe fn vnni_bf16(rounds: u64, ops: &MixOperands) -> MixLanes {
    let (a, b, fa, fb) = (zmm(&ops.a), zmm(&ops.b), zmm(&ops.bf_a), zmm(&ops.bf_b));
    let mut c = [_mm512_setzero_si512(); 6];
    let mut f = [_mm512_setzero_ps(); 6];
    for _ in 0..rounds {
        asm!(
            "vpdpbusd {c0}, {a}, {b}", "vdpbf16ps {f0}, {fa}, {fb}",
            "vpdpbusd {c1}, {a}, {b}", "vdpbf16ps {f1}, {fa}, {fb}",
            "vpdpbusd {c2}, {a}, {b}", "vdpbf16ps {f2}, {fa}, {fb}",
            "vpdpbusd {c3}, {a}, {b}", "vdpbf16ps {f3}, {fa}, {fb}",
            "vpdpbusd {c4}, {a}, {b}", "vdpbf16ps {f4}, {fa}, {fb}",
            "vpdpbusd {c5}, {a}, {b}", "vdpbf16ps {f5}, {fa}, {fb}",
            a = in(zmm_reg) a, b = in(zmm_reg) b, fa = in(zmm_reg) fa, fb = in(zmm_reg) fb,
            c0 = inout(zmm_reg) c[0], c1 = inout(zmm_reg) c[1], c2 = inout(zmm_reg) c[2],
            c3 = inout(zmm_reg) c[3], c4 = inout(zmm_reg) c[4], c5 = inout(zmm_reg) c[5],
            f0 = inout(zmm_reg) f[0], f1 = inout(zmm_reg) f[1], f2 = inout(zmm_reg) f[2],
            f3 = inout(zmm_reg) f[3], f4 = inout(zmm_reg) f[4], f5 = inout(zmm_reg) f[5],
            options(pure, nomem, nostack),
        );
    }
    lanes(&c, &f)
}

/// 6 lookups a round, each a `vpermi2b` of the index into the two 64-byte tables (a copy of
/// the index first, as `vpermi2b` overwrites it) feeding a `vpdpbusd` of the weights by the
/// looked-up bytes: the step of a lookup kernel whose tables hold sums of column groups.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi")]
unsafe fn lookup(rounds: u64, ops: &MixOperands) -> MixLanes {
    let (w, idx, ta, tb) = (zmm(&ops.a), zmm(&ops.index), zmm(&ops.tables[0]), zmm(&ops.tables[1]));
    let mut c = [_mm512_setzero_si512(); 6];
    for _ in 0..rounds {
        asm!(
            "vmovdqa64 {t0}, {idx}", "vpermi2b {t0}, {ta}, {tb}", "vpdpbusd {c0}, {w}, {t0}",
            "vmovdqa64 {t1}, {idx}", "vpermi2b {t1}, {ta}, {tb}", "vpdpbusd {c1}, {w}, {t1}",
            "vmovdqa64 {t2}, {idx}", "vpermi2b {t2}, {ta}, {tb}", "vpdpbusd {c2}, {w}, {t2}",
            "vmovdqa64 {t3}, {idx}", "vpermi2b {t3}, {ta}, {tb}", "vpdpbusd {c3}, {w}, {t3}",
            "vmovdqa64 {t4}, {idx}", "vpermi2b {t4}, {ta}, {tb}", "vpdpbusd {c4}, {w}, {t4}",
            "vmovdqa64 {t5}, {idx}", "vpermi2b {t5}, {ta}, {tb}", "vpdpbusd {c5}, {w}, {t5}",
            w = in(zmm_reg) w, idx = in(zmm_reg) idx, ta = in(zmm_reg) ta, tb = in(zmm_reg) tb,
            t0 = out(zmm_reg) _, t1 = out(zmm_reg) _, t2 = out(zmm_reg) _,
            t3 = out(zmm_reg) _, t4 = out(zmm_reg) _, t5 = out(zmm_reg) _,
            c0 = inout(zmm_reg) c[0], c1 = inout(zmm_reg) c[1], c2 = inout(zmm_reg) c[2],
            c3 = inout(zmm_reg) c[3], c4 = inout(zmm_reg) c[4], c5 = inout(zmm_reg) c[5],
            options(pure, nomem, nostack),
        );
    }
    lanes(&c, &[])
}

/// 6 `vpdpbusd` and 6 `vpaddd` a round, interleaved, on separate accumulators.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_add(rounds: u64, ops: &MixOperands) -> MixLanes {
    let (a, b, x) = (zmm(&ops.a), zmm(&ops.b), zmm(&ops.add));
    let mut c = [_mm512_setzero_si512(); 6];
    let mut d = [_mm512_setzero_si512(); 6];
    for _ in 0..rounds {
        asm!(
            "vpdpbusd {c0}, {a}, {b}", "vpaddd {d0}, {d0}, {x}",
            "vpdpbusd {c1}, {a}, {b}", "vpaddd {d1}, {d1}, {x}",
            "vpdpbusd {c2}, {a}, {b}", "vpaddd {d2}, {d2}, {x}",
            "vpdpbusd {c3}, {a}, {b}", "vpaddd {d3}, {d3}, {x}",
            "vpdpbusd {c4}, {a}, {b}", "vpaddd {d4}, {d4}, {x}",
            "vpdpbusd {c5}, {a}, {b}", "vpaddd {d5}, {d5}, {x}",
            a = in(zmm_reg) a, b = in(zmm_reg) b, x = in(zmm_reg) x,
            c0 = inout(zmm_reg) c[0], c1 = inout(zmm_reg) c[1], c2 = inout(zmm_reg) c[2],
            c3 = inout(zmm_reg) c[3], c4 = inout(zmm_reg) c[4], c5 = inout(zmm_reg) c[5],
            d0 = inout(zmm_reg) d[0], d1 = inout(zmm_reg) d[1], d2 = inout(zmm_reg) d[2],
            d3 = inout(zmm_reg) d[3], d4 = inout(zmm_reg) d[4], d5 = inout(zmm_reg) d[5],
            options(pure, nomem, nostack),
        );
    }
    lanes(&[c[0], c[1], c[2], c[3], c[4], c[5], d[0], d[1], d[2], d[3], d[4], d[5]], &[])
}

/// 6 `vpdpbusd` a round, interleaved with 3 steps of an add-based ternary kernel: two masks
/// (+1 and −1 weights of 32 columns) loaded from memory, a masked `vpaddw` and a masked
/// `vpsubw` of 32 i16 activations.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_masked_add(rounds: u64, ops: &MixOperands) -> MixLanes {
    let (a, b, x) = (zmm(&ops.a), zmm(&ops.b), zmm(&ops.words));
    let m = ops.masks.as_ptr();
    let mut c = [_mm512_setzero_si512(); 6];
    let mut d = [_mm512_setzero_si512(); 6];
    for _ in 0..rounds {
        asm!(
            "vpdpbusd {c0}, {a}, {b}", "kmovd {k0}, dword ptr [{m}]", "kmovd {k1}, dword ptr [{m} + 4]",
            "vpdpbusd {c1}, {a}, {b}", "vpaddw {d0} {{{k0}}}, {d0}, {x}", "vpsubw {d1} {{{k1}}}, {d1}, {x}",
            "vpdpbusd {c2}, {a}, {b}", "kmovd {k2}, dword ptr [{m} + 8]", "kmovd {k3}, dword ptr [{m} + 12]",
            "vpdpbusd {c3}, {a}, {b}", "vpaddw {d2} {{{k2}}}, {d2}, {x}", "vpsubw {d3} {{{k3}}}, {d3}, {x}",
            "vpdpbusd {c4}, {a}, {b}", "kmovd {k4}, dword ptr [{m} + 16]", "kmovd {k5}, dword ptr [{m} + 20]",
            "vpdpbusd {c5}, {a}, {b}", "vpaddw {d4} {{{k4}}}, {d4}, {x}", "vpsubw {d5} {{{k5}}}, {d5}, {x}",
            a = in(zmm_reg) a, b = in(zmm_reg) b, x = in(zmm_reg) x, m = in(reg) m,
            k0 = out(kreg) _, k1 = out(kreg) _, k2 = out(kreg) _,
            k3 = out(kreg) _, k4 = out(kreg) _, k5 = out(kreg) _,
            c0 = inout(zmm_reg) c[0], c1 = inout(zmm_reg) c[1], c2 = inout(zmm_reg) c[2],
            c3 = inout(zmm_reg) c[3], c4 = inout(zmm_reg) c[4], c5 = inout(zmm_reg) c[5],
            d0 = inout(zmm_reg) d[0], d1 = inout(zmm_reg) d[1], d2 = inout(zmm_reg) d[2],
            d3 = inout(zmm_reg) d[3], d4 = inout(zmm_reg) d[4], d5 = inout(zmm_reg) d[5],
            options(pure, readonly, nostack),
        );
    }
    lanes(&[c[0], c[1], c[2], c[3], c[4], c[5], d[0], d[1], d[2], d[3], d[4], d[5]], &[])
}
