//! The versioned benchmark report: one `Report` type, serialized as JSON, documented field by
//! field in `reports/README.md` and published as a JSON Schema (`reports/schema.json`)
//! generated from this type.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::stats::Stat;
use crate::system::System;

/// Bumped whenever a field changes meaning or a required field is added.
pub const SCHEMA_VERSION: u32 = 1;

/// A `bitnet-bench` report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Version of this format (see `SCHEMA_VERSION`).
    pub schema_version: u32,
    /// False if the sweep was interrupted (or is still running): `results` holds the
    /// combinations that finished.
    pub complete: bool,
    /// When the sweep started, RFC 3339 UTC.
    pub created_at: String,
    /// The program that measured (or the peer a report was imported from).
    pub tool: Tool,
    /// The machine it ran on.
    pub system: System,
    /// The model measured.
    pub model: ModelInfo,
    /// Repetitions, lengths and seed of the sweep.
    pub settings: Settings,
    /// The memory read bandwidth decode is measured against.
    pub roofline: Roofline,
    /// One entry per finished combination, in sweep order.
    pub results: Vec<BenchResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// `bitnet-bench`, or the peer a report was imported from (e.g. `llama-bench`).
    pub name: String,
    pub version: String,
    /// Commit the tool was built from; null when unknown.
    pub git_commit: Option<String>,
    /// Whether the build had uncommitted changes to tracked files; null when unknown.
    pub git_dirty: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// Preset name or the GGUF's model name.
    pub name: String,
    /// `preset (synthetic ...)` or `GGUF file PATH`.
    pub source: String,
    /// Parameters (weights) in all.
    pub params: u64,
    /// Bytes of all weights as held in memory.
    pub weight_bytes: u64,
    /// Format of the linear layers (i2, tq2_0, tq1_0, bitplanes).
    pub weight_format: String,
    /// The FFN gating that ran (`silu` or `relu2`); absent in imported reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn_activation: Option<String>,
    /// Which rule chose it: `metadata key K`, `architecture A`, `--ffn-activation` or `preset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn_activation_source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Runs per combination discarded before measuring.
    pub warmup: usize,
    /// Measured runs per combination.
    pub repeat: usize,
    /// Decode steps per run.
    pub max_new_tokens: usize,
    /// Seed of synthetic weights and prompts.
    pub seed: u64,
    /// Tokens in the KV cache when decoding began, where that is not the context length: an
    /// imported llama-bench tg test decodes from a cache of its `-d` depth (0 unless `-d` was
    /// given), whatever its pp test's prompt. Absent in bitnet-bench's own reports, whose runs
    /// decode right after a prompt of `context_length` tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_depth: Option<usize>,
}

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

impl Report {
    /// Sets every result's `decode.compute_fraction` and `prefill.compute_fraction` from its
    /// multiply-adds, its median speed and the roofline section's compute peak for its ISA and
    /// threads (none without either).
    pub fn refresh_compute_fractions(&mut self) {
        for r in &mut self.results {
            let peak = self.roofline.int8_peak_gmacs.get(&peak_key(&r.config.isa, r.config.threads)).copied();
            let peak = peak.filter(|g| *g > 0.0);
            r.decode.compute_fraction = peak.filter(|_| r.decode.macs_per_step > 0).map(|g| {
                compute_fraction(r.decode.macs_per_step as f64, r.decode.tokens_per_sec.median, r.config.batch, g)
            });
            // A prefill is one "step" of batch × context tokens.
            let prompt_tokens = r.config.batch * r.config.context_length;
            r.prefill.compute_fraction = peak
                .filter(|_| r.prefill.macs > 0 && prompt_tokens > 0)
                .map(|g| compute_fraction(r.prefill.macs as f64, r.prefill.tokens_per_sec.median, prompt_tokens, g));
        }
    }
}

/// Multiply-adds per decode step × steps per second ÷ the int8 peak (G multiply-adds/s).
pub fn compute_fraction(macs_per_step: f64, tokens_per_sec: f64, batch: usize, peak_gmacs: f64) -> f64 {
    macs_per_step * tokens_per_sec / batch as f64 / (peak_gmacs * 1e9)
}

/// The key of a compute peak in [`Roofline::int8_peak_gmacs`].
pub fn peak_key(isa: &str, threads: usize) -> String {
    format!("{isa}/{threads}")
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
        let spread = |v: &[f64]| {
            let hi = v.iter().copied().fold(f64::MIN, f64::max);
            let lo = v.iter().copied().fold(f64::MAX, f64::min);
            if hi > 0.0 {
                (hi - lo) / hi
            } else {
                0.0
            }
        };
        self.probes_gbps
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(t, v)| (t.as_str(), spread(v)))
            .fold(None, |best: Option<(&str, f64)>, x| if best.is_some_and(|b| b.1 >= x.1) { best } else { Some(x) })
    }
}

/// One combination's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchResult {
    pub config: Config,
    /// Prompt processing.
    pub prefill: Prefill,
    /// Token generation after the prompt.
    pub decode: Decode,
    /// Bytes held.
    pub memory: Memory,
    /// Quality cost of the KV precision against f32 KV; null when not measured.
    pub quality: Option<Quality>,
    /// Share of decode time per stage (with `--trace`); null otherwise.
    pub stages: Option<BTreeMap<String, StageShare>>,
    /// Counters per decode step (with `--counters`), summed over threads; null otherwise.
    pub counters: Option<BTreeMap<String, f64>>,
}

/// What identifies a combination (results of two reports are paired on all of it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Model name (as in `model.name`).
    pub model: String,
    /// Kernel family (i2s, tq2, tq1, xnor).
    pub kernel: String,
    /// ISA level (scalar, avx2, avx512).
    pub isa: String,
    /// Sequences decoded in lock-step.
    pub batch: usize,
    /// Prompt tokens prefilled per sequence before decoding.
    pub context_length: usize,
    /// KV cache precision (f32, f16, bf16, fp8, int8, int4, int2).
    pub kv_precision: String,
    /// Threads in all.
    pub threads: usize,
}

impl std::fmt::Display for Config {
    /// `model kernel/isa B=1 ctx=128 kv=f16 t=2`, as tables and messages name a combination.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} B={} ctx={} kv={} t={}",
            self.model, self.kernel, self.isa, self.batch, self.context_length, self.kv_precision, self.threads
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prefill {
    /// batch × context_length prompt tokens / prefill seconds, one sample per run.
    pub tokens_per_sec: Stat,
    /// Time to first token: prefill of every sequence's prompt plus choosing the first token.
    pub ttft_ms: Stat,
    /// Multiply-adds of a run's prefill: every prompt token through the linear layers, and
    /// the LM head once per sequence (for its last position); absent where unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub macs: u64,
    /// Prefill's share of the int8 compute peak: `macs` ÷ the median prefill time ÷ the
    /// roofline section's `int8_peak_gmacs` for the same ISA and threads; absent where there is
    /// no peak (scalar kernels, older and imported reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_fraction: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decode {
    /// batch × steps / decode seconds, one sample per run.
    pub tokens_per_sec: Stat,
    /// Inter-token latency: the time of each decode step (all sequences advance one token).
    pub latency_ms: Latency,
    /// Bytes read per decode step (weights once for the whole batch, plus every sequence's
    /// KV cache at its mean position) divided by the batch size.
    pub bytes_per_token: u64,
    /// Bytes read per decode step, the mean over the run's steps (step i attends over
    /// context_length + i + 1 cached positions).
    pub bytes_per_step: u64,
    /// Decode's share of the read bandwidth: the median of `step_fractions`; in reports
    /// without them, bytes_per_step × steps per second (median) / the roofline section's
    /// bandwidth for the same threads.
    pub roofline_fraction: f64,
    /// The roofline pass's probes (GB/s, same threads, 128 MiB each), one right after each of
    /// its decode steps. The bandwidth of a shared machine can jump between levels every few
    /// seconds, so a probe seconds away from a step says little about it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes_gbps: Vec<f64>,
    /// Each roofline-pass step's bytes (bytes_per_step with that step's own KV positions) ÷ its
    /// time ÷ the probe right after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_fractions: Vec<f64>,
    /// The median of each roofline pass's step fractions, one pass per measured run: the
    /// independent samples `bitnet-diff` compares (one run's steps are not independent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_fractions: Vec<f64>,
    /// Multiply-adds of a decode step: every weight of the linear layers and the LM head once
    /// per sequence (attention's float work is not counted); absent where unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub macs_per_step: u64,
    /// Decode's share of the int8 compute peak: macs_per_step × steps per second (median)
    /// ÷ the roofline section's `int8_peak_gmacs` for the same ISA and threads. Batch decode
    /// is bound by it as batch-1 decode is by the bandwidth; absent where there is no peak
    /// (scalar kernels, older and imported reports). The `tq1` lookup forms and `xnor`
    /// (AND and popcount) multiply nothing: their figure is what an int8 kernel would need
    /// to match them, not a share of arithmetic used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_fraction: Option<f64>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Percentiles (ms) of the step latencies, linear interpolation.
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    /// Every step's latency, runs in order.
    pub samples: Vec<f64>,
}

impl Latency {
    /// Percentiles of `samples` (ms), which are kept.
    pub fn of(samples: Vec<f64>) -> Latency {
        use crate::stats::percentile;
        Latency {
            p50: percentile(&samples, 50.0),
            p90: percentile(&samples, 90.0),
            p95: percentile(&samples, 95.0),
            p99: percentile(&samples, 99.0),
            samples,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Bytes of all weights as loaded, without kernel repacks (`repack_bytes`).
    pub weight_bytes: u64,
    /// Exact bytes of the KV cache of this combination.
    pub kv_cache_bytes: u64,
    /// Peak resident set size of the process so far (VmHWM); null where unreadable.
    pub peak_rss_bytes: Option<u64>,
    /// Bytes the combination's kernels hold beside the weights, made from them at load: the
    /// `tq1` `lut` form's lookup repack, the AVX2 `tq2` kernel's copy of the codes, and from
    /// batch 2 at AVX-512 a Q6_K LM head's copy in 16-row groups; 0 for the others (absent from
    /// older and imported reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repack_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quality {
    /// Mean KL(p_f32 ‖ p_this) of next-token distributions over the positions (nats).
    pub kl_divergence: f64,
    /// Fraction of positions whose most likely next token matches f32 KV's.
    pub top1_agreement: f64,
    /// Positions compared (a teacher-forced prompt; at most the measuring model's context).
    pub positions: usize,
    /// What the figures were measured on: `text` (a real model's own tokenizer on
    /// `--quality-text`, or on the committed trained model's held-out text for a preset's
    /// sweep), or `synthetic` (random token ids, or a preset's random weights):
    /// synthetic figures exercise the KV precisions' code but estimate no model's quality, so
    /// they are shown as `synthetic` and never gated.
    #[serde(default = "synthetic")]
    pub source: String,
    /// The model the figures were measured on when it is not the report's (`--quality-model`,
    /// or the committed trained model for a preset's sweep): its file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text file (name, bytes and the first 16 hex digits of its SHA-256), for `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Perplexity of the text's next tokens over the positions with f32 KV, and with this
    /// precision (`text` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity_f32: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
}

fn synthetic() -> String {
    "synthetic".into()
}

impl Quality {
    /// Whether the figures estimate a real model's quality (and may be gated).
    pub fn is_real(&self) -> bool {
        self.source == "text"
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageShare {
    /// Nanoseconds per decode step, summed over threads.
    pub ns: f64,
    /// Of all stage time.
    pub share: f64,
}

/// The JSON Schema of [`Report`], as committed in `reports/schema.json`.
pub fn schema_json() -> String {
    let schema = schemars::schema_for!(Report);
    serde_json::to_string_pretty(&schema).expect("a schema serializes") + "\n"
}

/// Parses and checks a report: the schema version, then the typed structure (unknown or
/// missing fields are errors naming their JSON path), then what types cannot say (finite
/// numbers, sample counts, ordering of statistics).
pub fn parse(text: &str, name: &str) -> Result<Report> {
    let value: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{name}: not valid JSON"))?;
    match value.get("schema_version").and_then(|v| v.as_u64()) {
        Some(v) if v == SCHEMA_VERSION as u64 => {}
        Some(v) => bail!("{name}: schema_version {v} is not supported (this tool reads {SCHEMA_VERSION})"),
        None => bail!("{name}: $.schema_version is missing or not a number"),
    }
    validate_schema(&value).with_context(|| name.to_string())?;
    let de = &mut serde_json::Deserializer::from_str(text);
    let report: Report = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        anyhow::anyhow!("{name}: at $.{path}: {}", e.into_inner())
    })?;
    check(&report).with_context(|| name.to_string())?;
    Ok(report)
}

/// Validates a JSON value against this build's JSON Schema (the one in `reports/schema.json`).
pub fn validate_schema(value: &serde_json::Value) -> Result<()> {
    let schema: serde_json::Value = serde_json::from_str(&schema_json()).expect("the generated schema is JSON");
    let validator =
        jsonschema::validator_for(&schema).map_err(|e| anyhow::anyhow!("the report schema is invalid: {e}"))?;
    if let Err(e) = validator.validate(value) {
        let path: String = e
            .instance_path()
            .to_string()
            .split('/')
            .filter(|p| !p.is_empty())
            .map(|p| if p.bytes().all(|b| b.is_ascii_digit()) { format!("[{p}]") } else { format!(".{p}") })
            .collect();
        bail!("at ${path}: {e} (does not match the report schema)");
    }
    Ok(())
}

/// Reads and checks a report file.
pub fn load(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    parse(&text, &path.display().to_string())
}

fn check_stat(path: &str, s: &Stat) -> Result<()> {
    let all = [s.mean, s.median, s.stddev, s.min, s.max, s.ci95_low, s.ci95_high];
    if all.iter().chain(&s.samples).any(|v| !v.is_finite()) {
        bail!("{path}: non-finite value");
    }
    if s.n == 0 || s.n != s.samples.len() {
        bail!("{path}: n = {} but {} samples", s.n, s.samples.len());
    }
    if s.min > s.median || s.median > s.max || s.stddev < 0.0 {
        bail!("{path}: min ≤ median ≤ max and stddev ≥ 0 do not hold");
    }
    // The summary must be that of the samples (bitnet-diff decides from the samples, tables
    // print the summary): an edited or mis-merged report would otherwise say two things.
    let want = Stat::of(&s.samples);
    // Relative to the samples' magnitude, not each field's: a CI bound near zero (mean minus a
    // half-width) is a difference of large numbers and carries their rounding.
    let scale = s.samples.iter().fold(want.mean.abs(), |m, v| m.max(v.abs())).max(1e-300);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * scale;
    for (field, got, want) in [
        ("mean", s.mean, want.mean),
        ("median", s.median, want.median),
        ("stddev", s.stddev, want.stddev),
        ("min", s.min, want.min),
        ("max", s.max, want.max),
        ("ci95_low", s.ci95_low, want.ci95_low),
        ("ci95_high", s.ci95_high, want.ci95_high),
    ] {
        if !close(got, want) {
            bail!("{path}.{field}: {got} is not that of the {} samples ({want})", s.samples.len());
        }
    }
    Ok(())
}

/// Invariants the types cannot express.
pub fn check(r: &Report) -> Result<()> {
    for (i, res) in r.results.iter().enumerate() {
        let p = format!("$.results[{i}]");
        check_stat(&format!("{p}.prefill.tokens_per_sec"), &res.prefill.tokens_per_sec)?;
        check_stat(&format!("{p}.prefill.ttft_ms"), &res.prefill.ttft_ms)?;
        check_stat(&format!("{p}.decode.tokens_per_sec"), &res.decode.tokens_per_sec)?;
        let l = &res.decode.latency_ms;
        if [l.p50, l.p90, l.p95, l.p99].iter().chain(&l.samples).any(|v| !v.is_finite()) {
            bail!("{p}.decode.latency_ms: non-finite value");
        }
        if !l.samples.is_empty() {
            let want = Latency::of(l.samples.clone());
            let scale = l.samples.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-300);
            for (field, got, want) in
                [("p50", l.p50, want.p50), ("p90", l.p90, want.p90), ("p95", l.p95, want.p95), ("p99", l.p99, want.p99)]
            {
                if (got - want).abs() > 1e-9 * scale {
                    bail!(
                        "{p}.decode.latency_ms.{field}: {got} is not that of the {} samples ({want})",
                        l.samples.len()
                    );
                }
            }
        }
        if !res.decode.roofline_fraction.is_finite() {
            bail!("{p}.decode.roofline_fraction: non-finite value");
        }
        if let Some(g) = res.decode.probes_gbps.iter().find(|g| !(g.is_finite() && **g > 0.0)) {
            bail!("{p}.decode.probes_gbps: {g} is not a positive bandwidth");
        }
        if res.decode.step_fractions.len() != res.decode.probes_gbps.len()
            || res.decode.step_fractions.iter().any(|f| !(f.is_finite() && *f >= 0.0))
        {
            bail!("{p}.decode.step_fractions: needs one finite, non-negative value per probe in probes_gbps");
        }
        if res.decode.pass_fractions.len() > res.decode.step_fractions.len()
            || res.decode.pass_fractions.iter().any(|f| !(f.is_finite() && *f >= 0.0))
        {
            bail!("{p}.decode.pass_fractions: needs finite, non-negative values, at most one per step fraction");
        }
        for (phase, f) in [("decode", res.decode.compute_fraction), ("prefill", res.prefill.compute_fraction)] {
            if let Some(f) = f.filter(|f| !(f.is_finite() && *f >= 0.0)) {
                bail!("{p}.{phase}.compute_fraction: {f} is not a finite, non-negative fraction");
            }
        }
        if res.config.batch == 0 || res.config.threads == 0 {
            bail!("{p}.config: batch and threads must be at least 1");
        }
    }
    if !r.roofline.read_bandwidth_gbps.is_finite() {
        bail!("$.roofline.read_bandwidth_gbps: non-finite value");
    }
    if let Some((k, g)) = r.roofline.int8_peak_gmacs.iter().find(|(_, g)| !(g.is_finite() && **g > 0.0)) {
        bail!("$.roofline.int8_peak_gmacs.{k}: {g} is not a positive rate");
    }
    Ok(())
}

/// Writes `bytes` atomically (temporary file and rename); see [`crate::model_cmds::write_atomic`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::model_cmds::write_atomic(path, bytes)
}

/// What a report's `model.source` says about the weights, without where the file was: a
/// preset's description as it is (it names the synthetic format and seed), a file by its name
/// alone, so that one GGUF reached by two paths (or on two machines) is one source.
pub fn source_identity(source: &str) -> String {
    for prefix in SOURCE_FILE_PREFIXES {
        if let Some(path) = source.strip_prefix(prefix) {
            return format!("{prefix}{}", file_name(path));
        }
    }
    source.to_string()
}

/// How `model.source` names a GGUF file: ours, and an imported llama-bench run's.
const SOURCE_FILE_PREFIXES: [&str; 2] = ["GGUF file ", "llama-bench on "];

fn file_name(path: &str) -> String {
    std::path::Path::new(path).file_name().map_or(path.into(), |n| n.to_string_lossy().into_owned())
}

/// The name of the GGUF file a report's `model.source` ran (ours or llama-bench's), without
/// its directory; `None` for a preset. Reports of two tools on one file share it.
pub fn source_gguf_name(source: &str) -> Option<String> {
    SOURCE_FILE_PREFIXES.iter().find_map(|p| source.strip_prefix(p)).map(file_name)
}

/// Merges reports of the same build, model and machine (e.g. interleaved runs of a CI job)
/// into one: the samples of equal configurations are concatenated and their statistics
/// recomputed; a configuration present in only some reports keeps the samples it has.
pub fn merge(reports: &[(String, Report)]) -> Result<Report> {
    let Some((first_name, first)) = reports.first() else { bail!("merge: no reports given") };
    let mut out = first.clone();
    for (name, r) in &reports[1..] {
        let commit = |r: &Report| r.tool.git_commit.clone().unwrap_or_else(|| "unknown".into());
        if r.model.name != first.model.name || r.tool.git_commit != first.tool.git_commit {
            bail!(
                "{name}: model {} at commit {} cannot be merged with {first_name} (model {} at commit {})",
                r.model.name,
                commit(r),
                first.model.name,
                commit(first)
            );
        }
        // Samples pool only if they measured the same weights the same way.
        for (field, a, b) in [
            ("model.source", &source_identity(&r.model.source), &source_identity(&first.model.source)),
            ("model.weight_format", &r.model.weight_format, &first.model.weight_format),
        ] {
            if a != b {
                bail!("{name}: {field} is {a:?}, {first_name}'s is {b:?}: not the same weights");
            }
        }
        for (field, a, b) in [
            ("settings.max_new_tokens", r.settings.max_new_tokens, first.settings.max_new_tokens),
            ("settings.warmup", r.settings.warmup, first.settings.warmup),
            ("settings.seed", r.settings.seed as usize, first.settings.seed as usize),
            ("model.weight_bytes", r.model.weight_bytes as usize, first.model.weight_bytes as usize),
        ] {
            if a != b {
                bail!("{name}: {field} is {a}, {first_name}'s is {b}");
            }
        }
        // The roofline of merged runs is the best probe of any of them: only probes of one size
        // (a small one partly reads the cache) and decodes from one depth pool.
        let shown = |v: Option<u64>| v.map_or("absent".to_string(), |b| b.to_string());
        for (field, a, b) in [
            ("roofline.probe_bytes", r.roofline.probe_bytes, first.roofline.probe_bytes),
            ("roofline.step_probe_bytes", r.roofline.step_probe_bytes, first.roofline.step_probe_bytes),
            (
                "settings.decode_depth",
                r.settings.decode_depth.map(|d| d as u64),
                first.settings.decode_depth.map(|d| d as u64),
            ),
        ] {
            if a != b {
                bail!("{name}: {field} is {}, {first_name}'s is {}", shown(a), shown(b));
            }
        }
        out.complete &= r.complete;
        out.settings.repeat += r.settings.repeat;
        // The roofline of merged runs is the best bandwidth any of them measured.
        for (t, gbps) in &r.roofline.by_threads {
            out.roofline.raise(t, *gbps);
        }
        for (t, probes) in &r.roofline.probes_gbps {
            out.roofline.probes_gbps.entry(t.clone()).or_default().extend(probes);
        }
        for (k, g) in &r.roofline.int8_peak_gmacs {
            out.roofline.raise_peak(k, *g);
        }
        for x in &r.results {
            match out.results.iter_mut().find(|o| o.config == x.config) {
                None => out.results.push(x.clone()),
                Some(o) => {
                    let cat = |a: &Stat, b: &Stat| Stat::of(&[a.samples.clone(), b.samples.clone()].concat());
                    o.prefill.tokens_per_sec = cat(&o.prefill.tokens_per_sec, &x.prefill.tokens_per_sec);
                    o.prefill.ttft_ms = cat(&o.prefill.ttft_ms, &x.prefill.ttft_ms);
                    o.decode.tokens_per_sec = cat(&o.decode.tokens_per_sec, &x.decode.tokens_per_sec);
                    let lat = [o.decode.latency_ms.samples.clone(), x.decode.latency_ms.samples.clone()].concat();
                    o.decode.latency_ms = Latency::of(lat);
                    o.decode.probes_gbps.extend(&x.decode.probes_gbps);
                    o.decode.step_fractions.extend(&x.decode.step_fractions);
                    o.decode.pass_fractions.extend(&x.decode.pass_fractions);
                    o.memory.peak_rss_bytes = o.memory.peak_rss_bytes.max(x.memory.peak_rss_bytes);
                }
            }
        }
    }
    // The roofline fractions follow the merged medians.
    out.refresh_compute_fractions();
    for o in &mut out.results {
        if !o.decode.step_fractions.is_empty() {
            o.decode.roofline_fraction = crate::stats::percentile(&o.decode.step_fractions, 50.0);
            continue;
        }
        let bw = out.roofline.by_threads.get(&o.config.threads.to_string()).copied().unwrap_or(0.0);
        if bw > 0.0 {
            o.decode.roofline_fraction = crate::sweep::roofline_fraction(
                o.decode.bytes_per_step as f64,
                o.decode.tokens_per_sec.median,
                o.config.batch,
                bw,
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod merge_tests {
    use super::*;

    fn baseline() -> Report {
        serde_json::from_str(include_str!("../../reports/baseline-quick-avx2.json")).unwrap()
    }

    #[test]
    fn equal_configurations_pool_their_samples() {
        let (a, b) = (baseline(), baseline());
        let m = merge(&[("a.json".into(), a.clone()), ("b.json".into(), b)]).unwrap();
        assert_eq!(m.results.len(), a.results.len());
        assert_eq!(m.settings.repeat, 2 * a.settings.repeat);
        for (x, y) in m.results.iter().zip(&a.results) {
            let s = &y.decode.tokens_per_sec.samples;
            assert_eq!(x.decode.tokens_per_sec.samples, [s.clone(), s.clone()].concat());
        }
    }

    #[test]
    fn reports_of_other_weights_or_settings_are_refused() {
        type Edit = fn(&mut Report);
        let cases: [(&str, Edit); 9] = [
            ("roofline.probe_bytes", |r| r.roofline.probe_bytes = Some(64 << 20)),
            ("roofline.step_probe_bytes", |r| r.roofline.step_probe_bytes = Some(1 << 20)),
            ("settings.decode_depth", |r| r.settings.decode_depth = Some(0)),
            ("settings.seed", |r| r.settings.seed += 1),
            ("settings.warmup", |r| r.settings.warmup += 1),
            ("settings.max_new_tokens", |r| r.settings.max_new_tokens += 1),
            ("model.source", |r| r.model.source = "GGUF file m.gguf".into()),
            ("model.weight_format", |r| r.model.weight_format = "tq1_0".into()),
            ("model.weight_bytes", |r| r.model.weight_bytes += 1),
        ];
        for (field, edit) in cases {
            let mut b = baseline();
            edit(&mut b);
            let err = merge(&[("a.json".into(), baseline()), ("b.json".into(), b)]).unwrap_err().to_string();
            assert!(err.starts_with("b.json: ") && err.contains(field), "{field}: {err}");
        }
        // One GGUF file by two paths is one source.
        let (mut a, mut b) = (baseline(), baseline());
        a.model.source = "GGUF file /data/m.gguf".into();
        b.model.source = "GGUF file ./m.gguf".into();
        merge(&[("a.json".into(), a), ("b.json".into(), b)]).unwrap();
        let mut other = baseline();
        other.tool.git_commit = None;
        let err = merge(&[("a.json".into(), baseline()), ("b.json".into(), other)]).unwrap_err().to_string();
        assert!(err.contains("at commit unknown") && !err.contains("Some("), "{err}");
    }
}
