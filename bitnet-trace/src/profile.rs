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

pub fn start() -> Result<ProfilerGuard<'static>> {
    pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY_HZ)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .context("starting the pprof sampler")
}

/// What the sampler saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub samples: u64,
    /// (function-name fragment, share of samples with that function anywhere on the stack).
    pub shares: Vec<(String, f64)>,
}

/// Stops the sampler, writes `profile.pb` (gzipped pprof protobuf) and `pprof-flamegraph.svg`
/// into `dir`, and returns the share of samples in each function of `functions`.
pub fn finish(guard: ProfilerGuard<'static>, dir: &Path, functions: &[&str]) -> Result<Sampled> {
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
            if names.iter().any(|n| n.contains(f)) {
                *h += count;
            }
        }
    }
    let shares =
        functions.iter().zip(hits).map(|(f, h)| (f.to_string(), if total > 0 { h as f64 / total as f64 } else { 0.0 }));
    Ok(Sampled { samples: total, shares: shares.collect() })
}
