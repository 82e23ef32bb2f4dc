//! Int8 compute-peak probe: the multiply-add rate that batch decode and prefill are measured
//! against (their compute roofline), as [`crate::bandwidth`] is batch-1 decode's.
//!
//! Each thread runs independent chains of its ISA level's fastest int8 product on register
//! operands — AVX-512: `vpdpbusd` on 512-bit registers, 64 u8 × i8 products an instruction;
//! AVX2: `vpmaddubsw` on 256-bit registers, 32, accumulated with `vpaddw` as the batched
//! kernels do before they widen — so nothing but the instructions' throughput limits it, and
//! the best of several passes is reported. A kernel's multiply-adds (weights ×
//! tokens) per second over this rate is the share of the core's int8 arithmetic it uses. The
//! `tq1` lookup forms (`lut`, `perm`) and `xnor` (AND and popcount) multiply nothing; quoted
//! against the same rate, their figure is what an int8 kernel would need to match them.

use std::time::{Duration, Instant};

use crate::cpu::IsaLevel;
use crate::error::{Error, Result};
use crate::model::pool::WorkerPool;

/// The result of a compute probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputePeakReport {
    /// The level whose int8 product ran.
    pub isa: IsaLevel,
    /// Threads running the loop at once (a worker pool's, the caller one of them).
    pub threads: usize,
    /// Passes timed (after one untimed calibration pass).
    pub passes: usize,
    /// Multiply-adds (u8 × i8 products) of one pass, all threads.
    pub macs_per_pass: u64,
    /// G multiply-adds per second of the best pass, all threads.
    pub best_gmacs: f64,
    /// G multiply-adds per second of every timed pass, in order.
    pub pass_gmacs: Vec<f64>,
    /// The instruction sequence measured, for people reading a report.
    pub instruction: &'static str,
    /// Whether the threads were pinned to cores (as asked; pinning that fails is an error).
    pub pinned: bool,
}

/// Multiply-adds of one round of the probe's loop at `isa` and the instructions that do them;
/// `None` at the scalar level.
pub fn loop_of(isa: IsaLevel) -> Option<(u64, &'static str)> {
    match isa {
        IsaLevel::Avx512 => Some((12 * 64, "vpdpbusd zmm")),
        IsaLevel::Avx2 => Some((8 * 32, "vpmaddubsw + vpaddw ymm")),
        IsaLevel::Scalar => None,
    }
}

/// How long one timed pass should take: long enough that thread start-up and timer
/// resolution vanish, short enough that a sweep's probes cost well under a second.
const PASS_TIME: Duration = Duration::from_millis(25);

/// The operands: every byte pair different, so a lane's sum checks every product.
fn operands() -> ([u8; 64], [i8; 64]) {
    let a = std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(11));
    let b = std::array::from_fn(|i| (i as i8).wrapping_mul(29).wrapping_sub(64));
    (a, b)
}

/// Runs the probe's loop `rounds` times on every thread of `pool` (released together by one
/// dispatch, as a decode step's matmul is); returns the seconds from the first thread's start
/// to the last one's end.
fn timed_pass(pool: &WorkerPool, isa: IsaLevel, rounds: u64) -> Result<f64> {
    let (a, b) = operands();
    // `measure_int8_peak` ran the loop at this level before: it cannot fail here.
    let (ran, secs) =
        pool.timed_on_each(|_| crate::kernels::int8_mac_chains(isa, rounds, &a, &b).map(std::hint::black_box).is_ok());
    if !ran.iter().all(|ok| *ok) {
        return Err(Error::Unsupported(format!(
            "the int8 compute probe: a thread could not run the {} loop",
            isa.name()
        )));
    }
    Ok(secs)
}

/// Measures the int8 multiply-add peak of `threads` threads at `isa`: one calibration pass on
/// the calling thread sizes the passes to about 25 ms each, then the best of `passes` (≥ 1) is
/// reported. The threads are a worker pool's, pinned to cores with `pin` (where possible) as a
/// pinned decode's are.
pub fn measure_int8_peak(isa: IsaLevel, threads: usize, passes: usize, pin: bool) -> Result<ComputePeakReport> {
    if threads == 0 || passes == 0 {
        return Err(Error::Shape(format!(
            "compute probe needs at least one thread and one pass, got {threads} threads and {passes} passes"
        )));
    }
    let Some((macs_per_round, instruction)) = loop_of(isa) else {
        return Err(Error::Unsupported(
            "the int8 compute probe: the scalar level has no SIMD int8 product to measure".into(),
        ));
    };
    let pool = WorkerPool::new(threads, pin)?;
    const CALIBRATION_ROUNDS: u64 = 1 << 16;
    let (a, b) = operands();
    let t0 = Instant::now();
    // Also where a level this CPU lacks is refused, before any pass.
    std::hint::black_box(crate::kernels::int8_mac_chains(isa, CALIBRATION_ROUNDS, &a, &b)?);
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let rounds = ((PASS_TIME.as_secs_f64() / secs * CALIBRATION_ROUNDS as f64) as u64).clamp(1 << 10, 1 << 32);
    let macs_per_pass = macs_per_round * rounds * threads as u64;
    let pass_gmacs = (0..passes)
        .map(|_| Ok(macs_per_pass as f64 / timed_pass(&pool, isa, rounds)? / 1e9))
        .collect::<Result<Vec<f64>>>()?;
    let best_gmacs = pass_gmacs.iter().copied().fold(0.0, f64::max);
    Ok(ComputePeakReport {
        isa,
        threads,
        passes,
        macs_per_pass,
        best_gmacs,
        pass_gmacs,
        instruction,
        pinned: pool.pinned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the loop's lanes must hold after `rounds`, from the definitions of the
    /// instructions: `vpdpbusd` adds four u8 × i8 products to each i32 lane, wrapping;
    /// `vpmaddubsw` adds two into an i16 with saturation, `vpaddw` accumulates them wrapping.
    fn expected(isa: IsaLevel, rounds: u64, a: &[u8; 64], b: &[i8; 64]) -> Vec<i32> {
        let p = |i: usize| a[i] as i64 * b[i] as i64;
        (0..16)
            .map(|l| match isa {
                IsaLevel::Avx512 => ((0..4).map(|j| p(4 * l + j)).sum::<i64>() * 12 * rounds as i64) as i32,
                _ => {
                    let pair = (p(2 * l) + p(2 * l + 1)).clamp(i16::MIN as i64, i16::MAX as i64);
                    (pair * 8 * rounds as i64) as i16 as i32
                }
            })
            .collect()
    }

    #[test]
    fn the_probe_loops_compute_what_their_instructions_define() {
        let (a, b) = operands();
        // Saturating pairs too: 255 × 127 twice exceeds i16.
        let sat_a = [255u8; 64];
        let sat_b: [i8; 64] = std::array::from_fn(|i| if i % 3 == 0 { -128 } else { 127 });
        for isa in [IsaLevel::Avx2, IsaLevel::Avx512] {
            if !isa.is_supported() {
                continue;
            }
            for rounds in [0u64, 1, 7, 1000, 1 << 20] {
                for (a, b) in [(&a, &b), (&sat_a, &sat_b)] {
                    let got = crate::kernels::int8_mac_chains(isa, rounds, a, b).unwrap();
                    assert_eq!(got, expected(isa, rounds, a, b), "{} rounds {rounds}", isa.name());
                }
            }
        }
        assert!(crate::kernels::int8_mac_chains(IsaLevel::Scalar, 1, &a, &b).is_err());
    }

    #[test]
    fn the_probe_reports_every_pass_and_refuses_what_it_cannot_measure() {
        for isa in [IsaLevel::Avx2, IsaLevel::Avx512] {
            if !isa.is_supported() {
                assert!(measure_int8_peak(isa, 1, 1, false).is_err());
                continue;
            }
            for (threads, pin) in [(1, false), (2, false), (2, true)] {
                if pin && threads > crate::model::pool::pinnable_cores() {
                    assert!(measure_int8_peak(isa, threads, 2, pin).is_err());
                    continue;
                }
                let r = measure_int8_peak(isa, threads, 2, pin).unwrap();
                assert_eq!((r.isa, r.threads, r.passes, r.pass_gmacs.len()), (isa, threads, 2, 2));
                assert_eq!(r.pinned, pin);
                assert_eq!(r.macs_per_pass % (loop_of(isa).unwrap().0 * threads as u64), 0);
                assert!(r.best_gmacs > 0.0 && r.best_gmacs.is_finite());
                assert!(r.pass_gmacs.iter().all(|g| *g <= r.best_gmacs));
            }
        }
        let err = measure_int8_peak(IsaLevel::Scalar, 1, 1, false).unwrap_err().to_string();
        assert!(err.contains("scalar"), "{err}");
        assert!(measure_int8_peak(IsaLevel::best(), 0, 1, false).is_err());
        assert!(measure_int8_peak(IsaLevel::best(), 1, 0, false).is_err());
    }
}
