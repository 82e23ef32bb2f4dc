//! The roofline section of a report (the machine's read bandwidth and int8 compute peak,
//! probed beside the runs) and the fractions of it each result reached.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::report::Report;
use crate::stats::median;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Roofline {
    /// Read bandwidth (GB/s, 10^9 bytes/s) with `threads` threads (the most threads of the
    /// sweep): the higher of the probes before and after the runs, each the best of several
    /// passes over a 1 GiB buffer (64 MiB with `--quick`, which can read partly from a large
    /// last-level cache). The higher one, so a roofline fraction is never flattered by a probe
    /// that ran while the machine was slow.
    pub read_bandwidth_gbps: f64,
    /// Threads of that probe.
    pub threads: usize,
    /// The same for every thread count of the sweep.
    pub by_threads: BTreeMap<String, f64>,
    /// Every probe per thread count, in order (before the runs, and after them when the sweep
    /// finished): how much the machine's bandwidth moved while it was measured.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probes_gbps: BTreeMap<String, Vec<f64>>,
    /// The compute roofline: G int8 multiply-adds per second per `ISA/threads` of the sweep
    /// (`avx512/2`), each the higher of the probes before and after the runs, each the best of
    /// several passes of independent chains of the level's int8 product on registers
    /// (`bitnet_engine::probes::compute_peak`: `vpdpbusd` zmm at avx512; `vpmaddubsw` + `vpaddw` ymm
    /// at avx2); absent for scalar kernels, older and imported reports.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub int8_peak_gmacs: BTreeMap<String, f64>,
    /// Every compute-peak probe per `ISA/threads`, in order (before the runs, and after them
    /// when the sweep finished): how much the peak moved while it was measured. Absent in
    /// older and imported reports.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub int8_peak_probes: BTreeMap<String, Vec<f64>>,
    /// Bytes each pass of the bandwidth probes above reads (1 GiB; 64 MiB with `--quick`,
    /// which a large last-level cache partly holds, so it reads faster).
    /// Absent in older and imported reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_bytes: Option<u64>,
    /// Bytes of the probe that follows each decode step of the roofline runs, the bandwidth
    /// behind `decode.roofline_fraction`. Absent in older and imported reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_probe_bytes: Option<u64>,
}

impl Roofline {
    /// Takes a compute-peak figure for `key` (`ISA/threads`) into account: the peak is the
    /// highest figure seen.
    pub fn raise_peak(&mut self, key: &str, gmacs: f64) {
        let best = self.int8_peak_gmacs.entry(key.to_string()).or_insert(0.0);
        *best = best.max(gmacs);
    }

    /// Takes a bandwidth figure for `threads` into account: the roofline of that thread count
    /// is the highest figure seen (and `read_bandwidth_gbps` follows it for `self.threads`).
    pub fn raise(&mut self, threads: &str, gbps: f64) {
        let best = self.by_threads.entry(threads.to_string()).or_insert(0.0);
        *best = best.max(gbps);
        if threads == self.threads.to_string() {
            self.read_bandwidth_gbps = *best;
        }
    }

    /// Largest relative spread between the probes of one thread count, (max − min) / max.
    pub fn probe_spread(&self) -> f64 {
        self.widest_probe_spread().map_or(0.0, |(_, s)| s)
    }

    /// The thread count whose probes are furthest apart, and their spread (max − min) / max;
    /// the first such count where several tie.
    pub fn widest_probe_spread(&self) -> Option<(&str, f64)> {
        self.probes_gbps
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(t, v)| (t.as_str(), spread(v)))
            .fold(None, |best: Option<(&str, f64)>, x| if best.is_some_and(|b| b.1 >= x.1) { best } else { Some(x) })
    }
}

/// How far apart probes of one thing are: (max − min) / max (0 for none).
pub fn spread(probes: &[f64]) -> f64 {
    let hi = probes.iter().copied().fold(f64::MIN, f64::max);
    let lo = probes.iter().copied().fold(f64::MAX, f64::min);
    if hi > 0.0 {
        (hi - lo) / hi
    } else {
        0.0
    }
}

/// An amount per decode step (bytes read, multiply-adds) per second: × tokens/s ÷ the batch
/// (a step makes one token of each sequence).
pub fn per_second(per_step: f64, tokens_per_sec: f64, batch: usize) -> f64 {
    per_step * tokens_per_sec / batch as f64
}

/// Bytes read per decode step × steps per second ÷ bandwidth (GB/s).
pub fn roofline_fraction(bytes_per_step: f64, tokens_per_sec: f64, batch: usize, bandwidth_gbps: f64) -> f64 {
    per_second(bytes_per_step, tokens_per_sec, batch) / (bandwidth_gbps * 1e9)
}

/// Multiply-adds per decode step × steps per second ÷ the int8 peak (G multiply-adds/s).
pub fn compute_fraction(macs_per_step: f64, tokens_per_sec: f64, batch: usize, peak_gmacs: f64) -> f64 {
    per_second(macs_per_step, tokens_per_sec, batch) / (peak_gmacs * 1e9)
}

/// The key of a compute peak in [`Roofline::int8_peak_gmacs`].
pub fn peak_key(isa: &str, threads: usize) -> String {
    format!("{isa}/{threads}")
}

impl Report {
    /// Recomputes every figure derived from the samples and the roofline section: each
    /// result's `decode.roofline_fraction` (the median of its step fractions, else its bytes
    /// per step at its median speed over the bandwidth of its thread count, else 0 where that
    /// is unknown), its compute fractions (none without a peak for its ISA and threads, or
    /// without multiply-adds) and its stages' shares. Loading and merging call it, and the
    /// sweep after each result and after its closing probes.
    pub fn refresh_derived(&mut self) {
        let roofline = &self.roofline;
        for r in &mut self.results {
            let (batch, threads) = (r.config.batch, r.config.threads);
            let decode_tps = r.decode.tokens_per_sec.median();
            r.decode.roofline_fraction = if !r.decode.step_fractions.is_empty() {
                median(&r.decode.step_fractions)
            } else {
                match roofline.by_threads.get(&threads.to_string()) {
                    Some(&bw) if bw > 0.0 => roofline_fraction(r.decode.bytes_per_step as f64, decode_tps, batch, bw),
                    _ => 0.0,
                }
            };
            let peak = roofline.int8_peak_gmacs.get(&peak_key(&r.config.isa, threads)).copied().filter(|g| *g > 0.0);
            r.decode.compute_fraction = peak
                .filter(|_| r.decode.macs_per_step > 0)
                .map(|g| compute_fraction(r.decode.macs_per_step as f64, decode_tps, batch, g));
            // A prefill is one "step" of batch × context tokens.
            let prompt_tokens = batch * r.config.context_length;
            r.prefill.compute_fraction = peak
                .filter(|_| r.prefill.macs > 0 && prompt_tokens > 0)
                .map(|g| compute_fraction(r.prefill.macs as f64, r.prefill.tokens_per_sec.median(), prompt_tokens, g));
            if let Some(stages) = &mut r.stages {
                let total: f64 = stages.values().map(|s| s.ns).sum();
                for s in stages.values_mut() {
                    s.share = if total > 0.0 { s.ns / total } else { 0.0 };
                }
            }
        }
    }
}
