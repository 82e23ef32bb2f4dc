//! The sampling profile of the traced run (`pprof`), and the share of samples in given
//! functions — the independent measurement the span shares are checked against.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use pprof::protos::Message;
use pprof::ProfilerGuard;

/// Sampling frequency asked of the kernel (SIGPROF). Kernels with a 250 Hz tick deliver at
/// most about 250 samples per CPU-second whatever is asked.
pub const FREQUENCY_HZ: i32 = 997;

/// A running sampler, and the process's CPU time when it started.
pub struct Sampler {
    guard: ProfilerGuard<'static>,
    cpu_ns_at_start: Option<u64>,
}

pub fn start() -> Result<Sampler> {
    let cpu_ns_at_start = process_cpu_ns();
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY_HZ)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .context("starting the pprof sampler")?;
    Ok(Sampler { guard, cpu_ns_at_start })
}

/// CPU time all threads of this process have run, in ns: the first field of each
/// `/proc/self/task/*/schedstat`. `None` where that is not readable (not Linux, or no
/// schedstats).
pub fn process_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// What the sampler saw (`functions` fragments may join alternatives with `|`).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub samples: u64,
    /// (function-name fragment, share of samples with that function anywhere on the stack).
    pub shares: Vec<(String, f64)>,
    /// CPU time (ns) the process ran while sampled: the time the samples are a share of (the
    /// kernel's SIGPROF timer counts CPU time, not wall time), where readable.
    pub cpu_ns: Option<f64>,
}

/// Stops the sampler, writes `profile.pb` (gzipped pprof protobuf) and `pprof-flamegraph.svg`
/// into `dir`, and returns the share of samples in each function of `functions`.
pub fn finish(sampler: Sampler, dir: &Path, functions: &[&str]) -> Result<Sampled> {
    let Sampler { guard, cpu_ns_at_start } = sampler;
    let cpu_ns = cpu_ns_at_start.zip(process_cpu_ns()).map(|(a, b)| b.saturating_sub(a) as f64);
    let report = guard.report().build().context("building the pprof report")?;
    let svg = std::fs::File::create(dir.join("pprof-flamegraph.svg")).context("pprof-flamegraph.svg")?;
    report.flamegraph(svg).context("rendering pprof-flamegraph.svg")?;
    let profile = report.pprof().context("encoding the pprof profile")?;
    let mut raw = Vec::new();
    profile.encode(&mut raw).context("encoding the pprof profile")?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)?;
    std::fs::write(dir.join("profile.pb"), gz.finish()?).context("profile.pb")?;

    let mut total = 0u64;
    let mut hits = vec![0u64; functions.len()];
    for (frames, &count) in &report.data {
        let count = count.max(0) as u64;
        total += count;
        let names: Vec<String> = frames.frames.iter().flatten().map(|s| s.name()).collect();
        for (f, h) in functions.iter().zip(hits.iter_mut()) {
            // `a|b`: a sample with either function on its stack, counted once.
            if names.iter().any(|n| f.split('|').any(|part| n.contains(part))) {
                *h += count;
            }
        }
    }
    let shares =
        functions.iter().zip(hits).map(|(f, h)| (f.to_string(), if total > 0 { h as f64 / total as f64 } else { 0.0 }));
    Ok(Sampled { samples: total, shares: shares.collect(), cpu_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_time_grows_with_work_and_stays_within_wall_time() {
        let Some(before) = process_cpu_ns() else {
            eprintln!("no /proc/self/task/*/schedstat here: nothing to check");
            return;
        };
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = process_cpu_ns().unwrap();
        let wall = t0.elapsed().as_nanos() as u64;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        assert!(after > before, "{before} → {after}");
        // Tests run in parallel threads of this process: at most every CPU for the wall time
        // (plus the schedstat reads' own slack).
        assert!(after - before <= (wall + 10_000_000) * cpus, "{} ns in {wall} ns", after - before);
    }
}
