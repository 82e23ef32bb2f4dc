//! The rooflines the kernels are measured against: memory read bandwidth ([`bandwidth`]), the
//! int8 multiply-add peak and the pipe mixes ([`compute_peak`]), with their x86 loops.

pub mod bandwidth;
pub mod compute_peak;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;
#[cfg(target_arch = "x86_64")]
mod x86_pipes;

use crate::cpu::IsaLevel;
use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2::Avx2;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx512::Avx512;

/// Wrapping sum of `words` with the widest loads this CPU has: the bandwidth probe's reader.
pub fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(t) = Avx512::new() {
            return x86_avx512::sum_words(t, words);
        }
        if let Some(t) = Avx2::new() {
            return x86_avx2::sum_words(t, words);
        }
    }
    crate::probes::bandwidth::sum_words_portable(words)
}

/// `rounds` rounds of the pipe probe's loop `mix` (see [`crate::probes::compute_peak::PipeMix`]);
/// `None` where the CPU lacks what the mix needs.
pub(crate) fn pipe_mix(
    mix: crate::probes::compute_peak::PipeMix,
    rounds: u64,
    ops: &crate::probes::compute_peak::MixOperands,
) -> Option<crate::probes::compute_peak::MixLanes> {
    #[cfg(target_arch = "x86_64")]
    return x86_pipes::run_mix(mix, rounds, ops);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (mix, rounds, ops);
        None
    }
}

/// The compute probe's loop at `isa` (see [`crate::probes::compute_peak`]): `rounds` rounds of
/// independent chains of the level's int8 product on `a` (u8) × `b` (i8) — AVX-512: 12
/// `vpdpbusd` on all 64 bytes, i32 lanes; AVX2: 8 × `vpmaddubsw` + `vpaddw` on the first 32,
/// i16 lanes widened — and the lane-wise wrapping sum of the chains' accumulators. Scalar has
/// no such loop, and a level this CPU lacks cannot run it: both are errors.
pub fn int8_mac_chains(isa: IsaLevel, rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> Result<Vec<i32>> {
    #[cfg(target_arch = "x86_64")]
    match isa {
        IsaLevel::Avx512 => {
            if let Some(t) = Avx512::new() {
                return Ok(x86_avx512::int8_mac_chains(t, rounds, a, b).to_vec());
            }
        }
        IsaLevel::Avx2 => {
            if let Some(t) = Avx2::new() {
                let a: &[u8; 32] = a[..32].try_into().expect("32 of 64 bytes");
                let b: &[i8; 32] = b[..32].try_into().expect("32 of 64 bytes");
                return Ok(x86_avx2::int8_mac_chains(t, rounds, a, b).to_vec());
            }
        }
        IsaLevel::Scalar => {}
    }
    let _ = (rounds, a, b);
    Err(Error::Unsupported(match isa {
        IsaLevel::Scalar => "the int8 compute probe: the scalar level has no SIMD int8 product to measure".into(),
        _ => format!("the int8 compute probe at {}: this CPU does not support it", isa.name()),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_isa_sums_words_like_the_portable_loop() {
        for n in [0usize, 1, 7, 15, 16, 31, 32, 33, 1000] {
            let w: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0xDEAD_BEEF_1234_5677)).collect();
            let want = crate::probes::bandwidth::sum_words_portable(&w);
            #[cfg(target_arch = "x86_64")]
            {
                if let Some(t) = super::Avx2::new() {
                    assert_eq!(super::x86_avx2::sum_words(t, &w), want, "avx2, n {n}");
                }
                if let Some(t) = super::Avx512::new() {
                    assert_eq!(super::x86_avx512::sum_words(t, &w), want, "avx512, n {n}");
                }
            }
            assert_eq!(super::sum_words(&w), want);
        }
    }
}
