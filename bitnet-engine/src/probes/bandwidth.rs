//! Memory read-bandwidth probe: the roofline that weight-streaming kernels are measured against.
//!
//! STREAM-style "sum" kernel: each thread reads its share of a buffer much larger than the
//! last-level cache with wide loads and independent accumulators; the best of several passes is
//! reported (the least disturbed one on a shared machine), as STREAM does.

use crate::aligned::PageVec;
use crate::error::{Error, Result};

/// The result of a bandwidth probe.
#[derive(Debug, Clone, PartialEq)]
pub struct BandwidthReport {
    /// Bytes read per pass.
    pub bytes: usize,
    /// Reader threads.
    pub threads: usize,
    /// Passes timed (after one untimed warm-up pass that also faults the pages in).
    pub passes: usize,
    /// GB/s (10^9 bytes per second) of the best pass.
    pub best_gbps: f64,
    /// GB/s of every timed pass, in order.
    pub pass_gbps: Vec<f64>,
    /// Checksum of the data read, so the reads cannot be optimised away (and for tests).
    pub checksum: u64,
    /// Whether the reader threads were pinned to cores (as asked; pinning that fails is an
    /// error), as a pinned decode's are: a probe on free-floating threads is not the bus a
    /// pinned run reads.
    pub pinned: bool,
}

/// A buffer of `bytes` (rounded up to 64) filled with a non-constant pattern.
pub struct ProbeBuffer {
    /// In huge pages, like the weights whose streaming it is the roofline of (see `aligned`).
    words: PageVec<u64>,
}

impl ProbeBuffer {
    pub fn new(bytes: usize) -> Result<Self> {
        if bytes < 64 {
            return Err(Error::Shape(format!("bandwidth probe needs at least 64 bytes, got {bytes}")));
        }
        let n = bytes.div_ceil(64) * 8;
        let mut words = PageVec::zeroed(n);
        for (i, w) in words.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        Ok(Self { words })
    }

    pub fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Reads the whole buffer once with `threads` threads (each a contiguous share of whole
    /// cache lines) and returns the wrapping sum of its words.
    pub fn read_once(&self, threads: usize) -> u64 {
        let threads = threads.max(1);
        if threads == 1 {
            return sum_words(&self.words);
        }
        let per = (self.words.len() / 8).div_ceil(threads) * 8;
        std::thread::scope(|s| {
            let handles: Vec<_> = self.words.chunks(per.max(8)).map(|c| s.spawn(move || sum_words(c))).collect();
            handles.into_iter().map(|h| h.join().expect("probe thread panicked")).fold(0u64, |a, b| a.wrapping_add(b))
        })
    }

    /// Reads the whole buffer once with the threads of `pool` (a contiguous share each) and
    /// returns (checksum, GB/s), timed from the first thread's start to the last one's end.
    /// Between decode steps this is the probe to use: the decode's own threads, awake and on
    /// their cores. Threads spawned for each probe between the steps of a decode read very
    /// different figures in alternation while the steps between them ran at a steady speed; the
    /// pool's threads did not (docs/perf-notes.md).
    pub fn read_gbps_on(&self, pool: &crate::pool::WorkerPool) -> (u64, f64) {
        let per = (self.words.len() / 8).div_ceil(pool.threads()) * 8;
        let (sums, secs) = pool.timed_on_each(|i| {
            sum_words(&self.words[(i * per).min(self.words.len())..((i + 1) * per).min(self.words.len())])
        });
        let sum = sums.iter().fold(0u64, |a, s| a.wrapping_add(*s));
        (sum, self.bytes() as f64 / secs / 1e9)
    }

    /// Reads the whole buffer with `threads` threads, `passes` times (plus one warm-up); with
    /// `pin`, on threads pinned as a pinned decode's pool pins them.
    pub fn measure(&self, threads: usize, passes: usize, pin: bool) -> Result<BandwidthReport> {
        if threads == 0 || passes == 0 {
            return Err(Error::Shape(format!(
                "bandwidth probe needs threads ≥ 1 and passes ≥ 1, got {threads} and {passes}"
            )));
        }
        // A persistent pool, as the decode has, its threads spinning between passes.
        let pool = crate::pool::WorkerPool::new(threads, pin)?;
        let mut pass_gbps = Vec::with_capacity(passes);
        let mut checksum = 0;
        for pass in 0..=passes {
            let (sum, gbps) = self.read_gbps_on(&pool);
            checksum = sum;
            if pass > 0 {
                pass_gbps.push(gbps);
            }
        }
        let best_gbps = pass_gbps.iter().copied().fold(0.0, f64::max);
        Ok(BandwidthReport {
            bytes: self.bytes(),
            threads,
            passes,
            best_gbps,
            pass_gbps,
            checksum,
            pinned: pool.pinned(),
        })
    }
}

/// Probes with a fresh buffer of `bytes` (use ≥ 1 GiB for a DRAM figure); `pin` as
/// [`ProbeBuffer::measure`].
pub fn measure_read_bandwidth(bytes: usize, threads: usize, passes: usize, pin: bool) -> Result<BandwidthReport> {
    ProbeBuffer::new(bytes)?.measure(threads, passes, pin)
}

/// Default probe size: 1 GiB, 32× the largest L3 on the machines we target.
pub const DEFAULT_PROBE_BYTES: usize = 1 << 30;

/// Wrapping sum of all words, with the widest loads this CPU has (the SIMD loops live in the
/// kernels' ISA modules).
pub fn sum_words(words: &[u64]) -> u64 {
    crate::probes::sum_words(words)
}

pub(crate) fn sum_words_portable(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = words.chunks_exact(8);
    for c in &mut it {
        for (a, w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*w);
        }
    }
    it.remainder().iter().chain(acc.iter()).fold(0u64, |a, b| a.wrapping_add(*b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_sum_equals_portable_sum() {
        for n in [0, 1, 7, 8, 31, 32, 33, 1000] {
            let w: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0xDEAD_BEEF_1234_5677)).collect();
            assert_eq!(sum_words(&w), sum_words_portable(&w), "n {n}");
        }
    }

    #[test]
    fn probe_reads_everything_and_reports_positive_rates() {
        let buf = ProbeBuffer::new(1 << 20).unwrap();
        let expect = sum_words_portable(&buf.words);
        for (threads, pin) in [(1, false), (2, false), (3, false), (1, true), (2, true)] {
            if pin && threads > crate::pool::pinnable_cores() {
                assert!(buf.measure(threads, 2, pin).is_err(), "more threads than cores cannot be pinned");
                continue;
            }
            let r = buf.measure(threads, 2, pin).unwrap();
            assert_eq!(r.checksum, expect);
            assert_eq!(r.pinned, pin);
            assert_eq!(r.pass_gbps.len(), 2);
            assert!(r.best_gbps > 0.0 && r.pass_gbps.iter().all(|g| *g <= r.best_gbps));
            let (sum, gbps) = buf.read_gbps_on(&crate::pool::WorkerPool::new(threads, false).unwrap());
            assert_eq!(sum, expect);
            assert!(gbps > 0.0 && gbps.is_finite());
        }
        assert!(buf.measure(0, 1, false).is_err());
    }
}
