//! The span clock: the time-stamp counter on x86-64 (about 10 ns a read, no system call),
//! `Instant` elsewhere or where the TSC is not invariant. Ticks become seconds only when a
//! report is made, with a frequency calibrated once against `Instant`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What [`now`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// The invariant time-stamp counter (`rdtsc`).
    Tsc,
    /// Nanoseconds of `Instant` since the first read.
    Instant,
}

impl ClockSource {
    pub fn name(self) -> &'static str {
        match self {
            ClockSource::Tsc => "tsc",
            ClockSource::Instant => "instant",
        }
    }
}

/// The clock [`now`] uses on this machine.
pub fn source() -> ClockSource {
    static SOURCE: OnceLock<ClockSource> = OnceLock::new();
    *SOURCE.get_or_init(|| if tsc::invariant() { ClockSource::Tsc } else { ClockSource::Instant })
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The current tick.
#[inline(always)]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if TSC_OK.load(std::sync::atomic::Ordering::Relaxed) {
            return tsc::read();
        }
    }
    epoch().elapsed().as_nanos() as u64
}

/// Set once [`source`] chose the TSC (so `now` does not pay for a `OnceLock` check).
#[cfg(target_arch = "x86_64")]
static TSC_OK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ticks per second of [`now`], calibrated on first use: TSC ticks counted over 20 ms of
/// `Instant` (error well under 0.1%), or exactly 1e9 for the `Instant` clock. Call it before
/// the measured region; it takes 20 ms once.
pub fn ticks_per_second() -> f64 {
    static FREQ: OnceLock<f64> = OnceLock::new();
    *FREQ.get_or_init(|| match source() {
        ClockSource::Instant => 1e9,
        ClockSource::Tsc => {
            let (i0, t0) = (Instant::now(), tsc::read());
            while i0.elapsed() < Duration::from_millis(20) {
                std::hint::spin_loop();
            }
            let (i1, t1) = (Instant::now(), tsc::read());
            #[cfg(target_arch = "x86_64")]
            TSC_OK.store(true, std::sync::atomic::Ordering::Relaxed);
            (t1 - t0) as f64 / (i1 - i0).as_secs_f64()
        }
    })
}

/// Readies the clock: picks the source and calibrates it. Spans recorded before this read
/// `Instant` nanoseconds on every machine.
pub fn init() -> (ClockSource, f64) {
    epoch();
    let f = ticks_per_second();
    (source(), f)
}

/// Converts a tick count to nanoseconds.
pub fn ticks_to_ns(ticks: u64) -> f64 {
    ticks as f64 * 1e9 / ticks_per_second()
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    /// Whether the CPU says its TSC is invariant (CPUID 0x8000_0007 EDX bit 8): constant rate
    /// across frequency changes and running in deep sleep states.
    pub fn invariant() -> bool {
        // SAFETY: CPUID exists on every x86-64 CPU; leaf 0x8000_0000 gives the highest
        // extended leaf, checked before leaf 0x8000_0007 is read.
        #[allow(unused_unsafe)]
        unsafe {
            let max = std::arch::x86_64::__cpuid(0x8000_0000).eax;
            max >= 0x8000_0007 && std::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
        }
    }

    #[inline(always)]
    pub fn read() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 CPU and has no memory effects.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tsc {
    pub fn invariant() -> bool {
        false
    }
    pub fn read() -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_at_the_calibrated_rate() {
        init();
        let (i0, t0) = (Instant::now(), now());
        std::thread::sleep(Duration::from_millis(30));
        let (i1, t1) = (Instant::now(), now());
        let measured = ticks_to_ns(t1 - t0);
        let truth = (i1 - i0).as_nanos() as f64;
        // The calibrated clock agrees with Instant to within 2% over 30 ms (scheduling noise
        // sits between the paired reads, not in the rate).
        assert!((measured / truth - 1.0).abs() < 0.02, "tick clock {measured} ns vs Instant {truth} ns");
    }
}
