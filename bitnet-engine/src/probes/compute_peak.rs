//! Int8 compute-peak probe: the multiply-add rate that batch decode and prefill are measured
//! against (their compute roofline), as [`crate::probes::bandwidth`] is batch-1 decode's.
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
use crate::pool::WorkerPool;

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

/// Rounds of a loop that make a pass of about [`PASS_TIME`], from `calibration` rounds having
/// taken `took` (clamped, so a disturbed calibration cannot make a pass absurdly short or long).
fn rounds_per_pass(took: Duration, calibration: u64) -> u64 {
    let secs = took.as_secs_f64().max(1e-9);
    ((PASS_TIME.as_secs_f64() / secs * calibration as f64) as u64).clamp(1 << 10, 1 << 32)
}

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
        pool.timed_on_each(|_| crate::probes::int8_mac_chains(isa, rounds, &a, &b).map(std::hint::black_box).is_ok());
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
    std::hint::black_box(crate::probes::int8_mac_chains(isa, CALIBRATION_ROUNDS, &a, &b)?);
    let rounds = rounds_per_pass(t0.elapsed(), CALIBRATION_ROUNDS);
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

/// An instruction mix of the pipe probe ([`measure_pipe_mixes`]): `vpdpbusd`, alone or
/// interleaved with another family, on one core at AVX-512.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeMix {
    /// 12 `vpdpbusd` a round: the int8 peak, the same run's reference.
    Vnni,
    /// 12 `vdpbf16ps` a round (32 bf16 products each, exact on int8 values).
    Bf16,
    /// 6 `vpdpbusd` + 6 `vdpbf16ps` a round.
    VnniBf16,
    /// 6 lookups a round: `vpermi2b` into a 128-byte table, feeding a `vpdpbusd`.
    Lookup,
    /// 6 `vpdpbusd` + 6 `vpaddd` a round.
    VnniAdd,
    /// 6 `vpdpbusd` + 3 steps of an add-based ternary kernel a round (two masks loaded from
    /// memory, a masked `vpaddw` and a masked `vpsubw` of 32 words).
    VnniMaskedAdd,
}

impl PipeMix {
    pub const ALL: [PipeMix; 6] =
        [PipeMix::Vnni, PipeMix::Bf16, PipeMix::VnniBf16, PipeMix::Lookup, PipeMix::VnniAdd, PipeMix::VnniMaskedAdd];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            PipeMix::Vnni => "vpdpbusd",
            PipeMix::Bf16 => "vdpbf16ps",
            PipeMix::VnniBf16 => "vpdpbusd + vdpbf16ps",
            PipeMix::Lookup => "vpermi2b → vpdpbusd",
            PipeMix::VnniAdd => "vpdpbusd + vpaddd",
            PipeMix::VnniMaskedAdd => "vpdpbusd + masked vpaddw/vpsubw",
        }
    }

    /// The instructions of one round.
    pub fn round(self) -> &'static str {
        match self {
            PipeMix::Vnni => "12 vpdpbusd",
            PipeMix::Bf16 => "12 vdpbf16ps",
            PipeMix::VnniBf16 => "6 vpdpbusd, 6 vdpbf16ps",
            PipeMix::Lookup => "6 × (vmovdqa64, vpermi2b, vpdpbusd)",
            PipeMix::VnniAdd => "6 vpdpbusd, 6 vpaddd",
            PipeMix::VnniMaskedAdd => "6 vpdpbusd, 3 × (2 kmovd from memory, vpaddw{k}, vpsubw{k})",
        }
    }

    /// `vpdpbusd` of one round (each 64 u8 × i8 products; in the lookup, 64 products of
    /// looked-up bytes).
    pub fn vnni_per_round(self) -> u64 {
        match self {
            PipeMix::Vnni => 12,
            PipeMix::Bf16 => 0,
            _ => 6,
        }
    }

    /// Products of one round by the other family, counted as what it would contribute to a
    /// ternary × int8 kernel: `vdpbf16ps` 32; a lookup of two column triples' sums (lo and hi
    /// activation nibbles) 96 for its `vpermi2b` + `vpdpbusd` pair, in place of the 64 of its
    /// `vpdpbusd`; a masked add and sub over 32 columns 32; `vpaddd` none.
    pub fn other_products_per_round(self) -> u64 {
        match self {
            PipeMix::Bf16 => 12 * 32,
            PipeMix::VnniBf16 => 6 * 32,
            PipeMix::Lookup => 6 * (96 - 64),
            PipeMix::VnniMaskedAdd => 3 * 32,
            PipeMix::Vnni | PipeMix::VnniAdd => 0,
        }
    }
}

/// What one mix measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PipeMixReport {
    pub mix: PipeMix,
    /// Rounds a second, best pass.
    pub rounds_per_sec: f64,
    /// G `vpdpbusd` a second (of the best pass).
    pub vnni_g: f64,
    /// G products a second in all: 64 a `vpdpbusd` plus the other family's
    /// ([`PipeMix::other_products_per_round`]).
    pub products_g: f64,
}

/// The operands of the mixes' loops (see the x86 pipe loops (`probes::x86_pipes`) for how each is
/// used): fixed values, every byte pair different where it matters, so that the tests can
/// check every lane.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub(crate) struct MixOperands {
    /// `vpdpbusd`'s u8 operand (in the lookup: the looked-up bytes' weights).
    pub a: [u8; 64],
    pub b: [i8; 64],
    /// bf16 bits.
    pub bf_a: [u16; 32],
    pub bf_b: [u16; 32],
    /// The lookup's two 64-byte tables and its index (bit 6 picks the table).
    pub tables: [[i8; 64]; 2],
    pub index: [u8; 64],
    pub add: [i32; 16],
    pub words: [i16; 32],
    /// Three (+1, −1) mask pairs over 32 columns.
    pub masks: [u32; 6],
}

/// The lane-wise wrapping sum of a loop's integer accumulators, and the sum of its float ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MixLanes {
    pub ints: [i32; 16],
    pub floats: [f32; 16],
}

pub(crate) fn mix_operands() -> MixOperands {
    let (a, b) = operands();
    // bf16 of small integers: exact, as int8 values would be.
    let bf = |v: i32| ((v as f32).to_bits() >> 16) as u16;
    MixOperands {
        a,
        b,
        bf_a: std::array::from_fn(|i| bf(i as i32 % 7 - 3)),
        bf_b: std::array::from_fn(|i| bf(i as i32 % 5 - 2)),
        tables: [
            std::array::from_fn(|i| (i as i8).wrapping_mul(13)),
            std::array::from_fn(|i| (i as i8).wrapping_mul(-7)),
        ],
        index: std::array::from_fn(|i| (i as u8).wrapping_mul(41) & 127),
        add: std::array::from_fn(|i| i as i32 - 5),
        words: std::array::from_fn(|i| i as i16 * 3 - 40),
        masks: [0x5555_5555, 0x3333_3333, 0x0F0F_0F0F, 0x00FF_00FF, 0x1234_5678, 0x9ABC_DEF0],
    }
}

/// Runs every [`PipeMix`] this CPU has on the calling thread: one calibration pass sizes the
/// passes to about 25 ms, then the best of `passes` (≥ 1) counts. Mixes the CPU lacks (no
/// AVX-512, BF16 or VBMI) are left out; with no AVX-512 at all the list is empty.
pub fn measure_pipe_mixes(passes: usize) -> Result<Vec<PipeMixReport>> {
    if passes == 0 {
        return Err(Error::Shape("the pipe probe needs at least one pass, got 0".into()));
    }
    let ops = mix_operands();
    let mut out = Vec::new();
    for mix in PipeMix::ALL {
        const CALIBRATION_ROUNDS: u64 = 1 << 14;
        let t0 = Instant::now();
        if crate::probes::pipe_mix(mix, CALIBRATION_ROUNDS, &ops).map(std::hint::black_box).is_none() {
            continue;
        }
        let rounds = rounds_per_pass(t0.elapsed(), CALIBRATION_ROUNDS);
        let mut best = 0f64;
        for _ in 0..passes {
            let t = Instant::now();
            std::hint::black_box(crate::probes::pipe_mix(mix, rounds, &ops));
            best = best.max(rounds as f64 / t.elapsed().as_secs_f64().max(1e-9));
        }
        out.push(PipeMixReport {
            mix,
            rounds_per_sec: best,
            vnni_g: best * mix.vnni_per_round() as f64 / 1e9,
            products_g: best * (64 * mix.vnni_per_round() + mix.other_products_per_round()) as f64 / 1e9,
        });
    }
    Ok(out)
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
            if !isa.testable() {
                continue;
            }
            for rounds in [0u64, 1, 7, 1000, 1 << 20] {
                for (a, b) in [(&a, &b), (&sat_a, &sat_b)] {
                    let got = crate::probes::int8_mac_chains(isa, rounds, a, b).unwrap();
                    assert_eq!(got, expected(isa, rounds, a, b), "{} rounds {rounds}", isa.name());
                }
            }
        }
        assert!(crate::probes::int8_mac_chains(IsaLevel::Scalar, 1, &a, &b).is_err());
    }

    /// What each pipe loop's lanes must hold after `rounds`, from the instructions'
    /// definitions (see [`expected`] for `vpdpbusd`): `vdpbf16ps` adds two bf16 products to each
    /// f32 lane; `vpermi2b` picks byte `index & 63` of table `index >> 6 & 1`; `vpaddd` adds;
    /// the masked `vpaddw`/`vpsubw` change only the words whose mask bit is set, wrapping.
    fn expected_mix(mix: PipeMix, rounds: u64, o: &MixOperands) -> MixLanes {
        let r = rounds as i64;
        let dot4 = |u: &[u8; 64], s: &dyn Fn(usize) -> i64, l: usize| {
            (0..4).map(|j| u[4 * l + j] as i64 * s(4 * l + j)).sum::<i64>()
        };
        let vnni = |l: usize| dot4(&o.a, &|i| o.b[i] as i64, l);
        let bf = |v: u16| f32::from_bits((v as u32) << 16);
        let mut ints = [0i32; 16];
        let mut floats = [0f32; 16];
        for l in 0..16 {
            let n = mix.vnni_per_round() as i64 * r;
            ints[l] = match mix {
                PipeMix::Lookup => {
                    let t = |i: usize| o.tables[(o.index[i] >> 6 & 1) as usize][(o.index[i] & 63) as usize] as i64;
                    (n * dot4(&o.a, &t, l)) as i32
                }
                PipeMix::VnniAdd => (n * vnni(l) + 6 * r * o.add[l] as i64) as i32,
                _ => (n * vnni(l)) as i32,
            };
            let pair = bf(o.bf_a[2 * l]) * bf(o.bf_b[2 * l]) + bf(o.bf_a[2 * l + 1]) * bf(o.bf_b[2 * l + 1]);
            floats[l] = match mix {
                PipeMix::Bf16 => pair * (12 * rounds) as f32,
                PipeMix::VnniBf16 => pair * (6 * rounds) as f32,
                _ => 0.0,
            };
        }
        if mix == PipeMix::VnniMaskedAdd {
            for (k, m) in o.masks.iter().enumerate() {
                let words: Vec<i16> = (0..32)
                    .map(|i| {
                        let step = if m >> i & 1 == 1 { o.words[i] as i64 } else { 0 };
                        (if k % 2 == 0 { step * r } else { -step * r }) as i16
                    })
                    .collect();
                for l in 0..16 {
                    let lane = (words[2 * l] as u16 as u32 | (words[2 * l + 1] as u16 as u32) << 16) as i32;
                    ints[l] = ints[l].wrapping_add(lane);
                }
            }
        }
        MixLanes { ints, floats }
    }

    #[test]
    fn the_pipe_loops_compute_what_their_instructions_define() {
        let o = mix_operands();
        for mix in PipeMix::ALL {
            for rounds in [0u64, 1, 3, 1000] {
                match crate::probes::pipe_mix(mix, rounds, &o) {
                    Some(got) => assert_eq!(got, expected_mix(mix, rounds, &o), "{} rounds {rounds}", mix.name()),
                    None => assert!(
                        !IsaLevel::Avx512.is_supported()
                            || matches!(mix, PipeMix::Bf16 | PipeMix::VnniBf16 | PipeMix::Lookup)
                    ),
                }
            }
        }
        // The lookup reads both tables, and the masked adds every mask, or the test above
        // could not tell a wrong table or mask.
        assert!(o.index.iter().any(|i| i >> 6 == 1) && o.index.iter().any(|i| i >> 6 == 0));
        assert!(o.masks.iter().all(|m| *m != 0 && *m != u32::MAX));
    }

    #[test]
    fn the_pipe_probe_reports_what_ran() {
        let r = measure_pipe_mixes(1).unwrap();
        if IsaLevel::Avx512.testable() {
            assert_eq!(r[0].mix, PipeMix::Vnni);
            assert!(r.iter().any(|m| m.mix == PipeMix::VnniAdd));
        } else {
            assert!(r.is_empty());
        }
        for m in &r {
            assert!(m.rounds_per_sec > 0.0 && m.products_g.is_finite() && m.products_g > 0.0, "{m:?}");
            assert_eq!(m.vnni_g == 0.0, m.mix == PipeMix::Bf16);
        }
        assert!(measure_pipe_mixes(0).is_err());
    }

    #[test]
    fn the_probe_reports_every_pass_and_refuses_what_it_cannot_measure() {
        for isa in [IsaLevel::Avx2, IsaLevel::Avx512] {
            if !isa.testable() {
                assert!(measure_int8_peak(isa, 1, 1, false).is_err());
                continue;
            }
            for (threads, pin) in [(1, false), (2, false), (2, true)] {
                if pin && threads > crate::pool::pinnable_cores() {
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
