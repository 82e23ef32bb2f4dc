//! Pairing two reports by configuration and deciding, per metric, whether it regressed.
//!
//! The decision works on the log of the ratio of medians, `d = ln(median(new) / median(base))`,
//! with the threshold `τ = ln(1 + threshold)`, so that swapping BASE and NEW turns every
//! regression into an improvement with exactly mirrored figures:
//! - `regression`: Welch's test on the log samples is significant (p < 0.05) and the whole 95%
//!   bootstrap interval of `d` lies beyond τ in the bad direction; `improvement` symmetrically;
//! - `unchanged`: the interval lies inside ±τ;
//! - `inconclusive` otherwise, with the repetitions that would likely settle it;
//! - one sample on either side: a plain threshold on `d`, said so in the note.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use bitnet_report::report::{BenchResult, Config, Report};
use serde::Serialize;

use crate::stats::{bootstrap_log_ratio, median, welch_p};

/// Bootstrap resamples per metric.
pub const RESAMPLES: usize = 4000;
/// Significance level of the test.
pub const ALPHA: f64 = 0.05;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Higher,
    Lower,
}

/// Which threshold a metric's change is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    /// `--threshold`: speed and memory figures, which vary by a few percent from run to run.
    Run,
    /// `--ppl-threshold` ([`PERPLEXITY_THRESHOLD`] by default): quality figures are
    /// deterministic and far more sensitive than speed's 5%.
    Perplexity,
    /// `--kl-threshold` ([`KL_THRESHOLD`] by default).
    Kl,
}

/// A metric that can be compared: what it reads from a result and how its change is judged.
#[derive(Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub better: Better,
    pub samples: fn(&BenchResult) -> Option<Vec<f64>>,
    pub threshold: Threshold,
    /// Values below this count as it (0: none): a KL divergence of exactly 0 (a run against
    /// itself) still ratios against a worse one.
    pub floor: f64,
    /// Whether the metric is a quality figure, which is compared only when both results
    /// measured it on real text (synthetic quality estimates no model).
    pub quality: bool,
    /// Why a regression or improvement of this metric between two results may not be the
    /// code's (something else it follows moved between the runs): the verdict is then
    /// inconclusive, with this reason as its note.
    pub not_like_for_like: Option<fn(base: &BenchResult, new: &BenchResult) -> Option<String>>,
}

/// Perplexity's own threshold: a 1% rise is a real loss of quality for a model.
pub const PERPLEXITY_THRESHOLD: f64 = 0.01;
/// KL divergence's own threshold (relative; KL values are small, their changes large).
pub const KL_THRESHOLD: f64 = 0.10;
/// KL divergences below this (nats) are not told apart.
pub const KL_FLOOR: f64 = 1e-6;

impl Metric {
    const fn speed(name: &'static str, better: Better, samples: fn(&BenchResult) -> Option<Vec<f64>>) -> Self {
        Metric { name, better, samples, threshold: Threshold::Run, floor: 0.0, quality: false, not_like_for_like: None }
    }

    /// The threshold this metric's change is held to, of `--threshold` and the quality ones.
    pub fn resolve_threshold(&self, run: f64, quality: QualityThresholds) -> f64 {
        match self.threshold {
            Threshold::Run => run,
            Threshold::Perplexity => quality.perplexity,
            Threshold::Kl => quality.kl,
        }
    }
}

/// Every metric `--metrics` accepts.
pub fn metrics() -> Vec<Metric> {
    vec![
        Metric::speed("decode.tokens_per_sec", Better::Higher, |r| Some(r.decode.tokens_per_sec.samples().to_vec())),
        Metric::speed("prefill.tokens_per_sec", Better::Higher, |r| Some(r.prefill.tokens_per_sec.samples().to_vec())),
        Metric::speed("prefill.ttft_ms", Better::Lower, |r| Some(r.prefill.ttft_ms.samples().to_vec())),
        Metric::speed("decode.latency_ms", Better::Lower, |r| Some(r.decode.latency_ms.samples().to_vec())),
        Metric {
            not_like_for_like: Some(probe_levels_apart),
            ..Metric::speed(
                "decode.roofline_fraction",
                Better::Higher,
                // Each roofline pass's median (a pass per measured run; each step over the probe
                // taken right after it, so the samples stay comparable when the machine's
                // bandwidth moved between the two runs). A report with one pass
                // (`step_fractions` only) or none is one sample: a run's steps are not
                // independent samples.
                |r| {
                    Some(if !r.decode.pass_fractions.is_empty() {
                        r.decode.pass_fractions.clone()
                    } else if !r.decode.step_fractions.is_empty() {
                        vec![crate::stats::median(&r.decode.step_fractions)]
                    } else {
                        vec![r.decode.roofline_fraction]
                    })
                },
            )
        },
        Metric::speed(
            "decode.compute_fraction",
            Better::Higher,
            // Each run's decode speed over its report's own int8 peak (the fraction's median
            // scales every run's tokens/s by the same multiply-adds ÷ batch ÷ peak), so the
            // samples stay comparable when the core's clock moved between the two runs.
            |r| {
                let f = r.decode.compute_fraction?;
                let median = r.decode.tokens_per_sec.median();
                (median > 0.0).then(|| r.decode.tokens_per_sec.samples().iter().map(|t| t / median * f).collect())
            },
        ),
        Metric::speed("memory.kv_cache_bytes", Better::Lower, |r| Some(vec![r.memory.kv_cache_bytes as f64])),
        Metric::speed("memory.peak_rss_bytes", Better::Lower, |r| r.memory.peak_rss_bytes.map(|b| vec![b as f64])),
        Metric {
            name: "quality.kl_divergence",
            better: Better::Lower,
            samples: |r| r.quality.as_ref().map(|q| vec![q.kl_divergence]),
            threshold: Threshold::Kl,
            floor: KL_FLOOR,
            quality: true,
            not_like_for_like: None,
        },
        Metric {
            name: "quality.perplexity",
            better: Better::Lower,
            samples: |r| r.quality.as_ref().and_then(|q| q.perplexity).map(|p| vec![p]),
            threshold: Threshold::Perplexity,
            floor: 0.0,
            quality: true,
            not_like_for_like: None,
        },
    ]
}

/// The metrics compared without `--metrics`: [`DEFAULT_METRICS`], and the quality metrics
/// where both reports measured quality on real text.
pub fn default_metrics(base: &Report, new: &Report) -> Vec<String> {
    let mut m: Vec<String> = DEFAULT_METRICS.iter().map(|s| s.to_string()).collect();
    let real = |r: &Report| r.results.iter().any(|x| x.quality.as_ref().is_some_and(|q| q.is_real()));
    if real(base) && real(new) {
        m.extend(metrics().iter().filter(|x| x.quality).map(|x| x.name.to_string()));
    }
    m
}

/// Metrics compared when `--metrics` is not given: the per-run throughputs and TTFT (decode
/// step latencies within a run are correlated, so they are opt-in).
pub const DEFAULT_METRICS: [&str; 3] = ["decode.tokens_per_sec", "prefill.tokens_per_sec", "prefill.ttft_ms"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Regression,
    Improvement,
    Unchanged,
    Inconclusive,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Regression => "regression",
            Verdict::Improvement => "improvement",
            Verdict::Unchanged => "unchanged",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricDiff {
    pub metric: String,
    pub better: Better,
    pub base_median: f64,
    pub new_median: f64,
    pub n_base: usize,
    pub n_new: usize,
    /// median(new) / median(base) − 1.
    pub change: f64,
    /// The 95% bootstrap interval of `change` (equal to it with one sample per side).
    pub ci_low: f64,
    pub ci_high: f64,
    /// Welch's two-sided p-value on the log samples; null with fewer than 2 samples a side.
    pub p_value: Option<f64>,
    pub verdict: Verdict,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigDiff {
    /// The configuration (NEW's, when the reports come from different tools).
    pub config: Config,
    /// BASE's configuration paired with it when the reports come from different tools (see
    /// [`across_tools`]); null when it is `config` itself.
    pub base_config: Option<Config>,
    pub metrics: Vec<MetricDiff>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub regressions: usize,
    pub improvements: usize,
    pub unchanged: usize,
    pub inconclusive: usize,
}

impl Counts {
    /// "2 regressions, 1 improvement, 14 unchanged, 1 inconclusive".
    pub fn line(&self) -> String {
        let p = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        format!(
            "{}, {}, {} unchanged, {} inconclusive",
            p(self.regressions, "regression", "regressions"),
            p(self.improvements, "improvement", "improvements"),
            self.unchanged,
            self.inconclusive
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub base: String,
    pub new: String,
    pub threshold: f64,
    pub metrics: Vec<String>,
    pub counts: Counts,
    pub pairs: Vec<ConfigDiff>,
    /// Configurations only in NEW / only in BASE.
    pub added: Vec<Config>,
    pub removed: Vec<Config>,
    pub env_warnings: Vec<String>,
    /// How the reports were paired when they come from different tools, and what that leaves
    /// unlike (e.g. llama-bench's tg test decoding from an empty cache); and where the memory
    /// bandwidth probed beside the runs moved by more than the threshold (see
    /// [`bandwidth_notes`]).
    pub notes: Vec<String>,
    /// Metrics of paired configurations that could not be compared, and why (missing, zero or
    /// negative samples: a ratio of them means nothing).
    pub not_compared: Vec<String>,
}

/// What [`decide`] concluded about one metric, and the figures behind it. Changes are in log
/// space, `ln(median(new) / median(base))`, where swapping the sides only flips their signs.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// ln(median(new) / median(base)).
    pub log_change: f64,
    /// The 95% bootstrap interval of `log_change` (both ends equal to it with one sample on
    /// a side).
    pub log_ci_low: f64,
    pub log_ci_high: f64,
    /// Welch's two-sided p-value on the log samples; `None` with one sample on a side.
    pub p_value: Option<f64>,
    pub verdict: Verdict,
    /// With one sample on a side, that the verdict is a plain threshold; when inconclusive,
    /// what would likely settle it.
    pub note: Option<String>,
}

/// Compares one metric's samples.
pub fn decide(base: &[f64], new: &[f64], better: Better, threshold: f64, seed: u64) -> Decision {
    let tau = (1.0 + threshold).ln();
    let sign = if better == Better::Higher { 1.0 } else { -1.0 };
    if base.len() < 2 || new.len() < 2 {
        let d = median(new).ln() - median(base).ln();
        let g = sign * d;
        let v = if g < -tau {
            Verdict::Regression
        } else if g > tau {
            Verdict::Improvement
        } else {
            Verdict::Unchanged
        };
        let note = format!("{} sample(s) vs {}: plain threshold, no statistics", base.len(), new.len());
        return Decision { log_change: d, log_ci_low: d, log_ci_high: d, p_value: None, verdict: v, note: Some(note) };
    }
    let (d, lo, hi) = bootstrap_log_ratio(base, new, RESAMPLES, seed);
    let logs = |v: &[f64]| v.iter().map(|x| x.ln()).collect::<Vec<_>>();
    let p = welch_p(&logs(base), &logs(new));
    let (g_lo, g_hi) = if sign > 0.0 { (lo, hi) } else { (-hi, -lo) };
    let significant = p < ALPHA;
    let (verdict, note) = if significant && g_hi < -tau {
        (Verdict::Regression, None)
    } else if significant && g_lo > tau {
        (Verdict::Improvement, None)
    } else if g_lo > -tau && g_hi < tau {
        (Verdict::Unchanged, None)
    } else {
        let g = sign * d;
        let half = (g_hi - g_lo) / 2.0;
        let margin = (g.abs() - tau).abs();
        let n = base.len().max(new.len());
        let hint = if margin < 1e-3 {
            "the change sits at the threshold: more repetitions will not settle it".to_string()
        } else {
            let need = ((n as f64) * (half / margin).powi(2)).ceil() as usize;
            format!("about {} repetitions per side (now {n}) would likely settle it", need.max(n + 1))
        };
        (Verdict::Inconclusive, Some(hint))
    };
    Decision { log_change: d, log_ci_low: lo, log_ci_high: hi, p_value: Some(p), verdict, note }
}

/// Whether two reports come from different tools: an imported `llama-bench` report beside one
/// of ours. Their kernel, ISA and model labels never match (`llama.cpp`/`cpu` and llama.cpp's
/// model description against ours), so their configurations pair by batch, context length, KV
/// precision and threads alone ([`compare`]).
pub fn across_tools(a: &Report, b: &Report) -> bool {
    a.tool.name != b.tool.name
}

/// Which environment differences make two reports hard to compare. Fields a report does not
/// know (an imported llama-bench report has no ISA list, core counts or caches) are skipped.
/// Across tools the model names are not compared (each tool names a model its own way), nor
/// the weight bytes (llama-bench counts the file's tensors, bitnet-bench the weights as it
/// holds them, e.g. an F16 embedding as int8 rows); the GGUF file name and weight format are.
pub fn environment_differences(a: &Report, b: &Report) -> Vec<String> {
    let across = across_tools(a, b);
    let mut w = Vec::new();
    let mut diff = |what: &str, x: String, y: String| {
        if x != y {
            w.push(format!("{what} differs: {x} vs {y}"));
        }
    };
    diff("CPU model", a.system.cpu_model.clone(), b.system.cpu_model.clone());
    if let (Some(x), Some(y)) = (&a.system.cpu_id, &b.system.cpu_id) {
        diff("CPU (CPUID)", x.to_string(), y.to_string());
    }
    // VMs may give several CPU generations one name, with very different bandwidth and
    // multiply-add rates (docs/perf-notes.md); CPUID (above, in newer reports), caches and
    // features tell them apart. Compared only where both reports know them (an
    // imported llama-bench report doesn't).
    for (what, x, y) in [
        ("L1d cache", a.system.l1d_kib, b.system.l1d_kib),
        ("L2 cache", a.system.l2_kib, b.system.l2_kib),
        ("L3 cache", a.system.l3_kib, b.system.l3_kib),
    ] {
        if let (Some(x), Some(y)) = (x, y) {
            diff(what, format!("{x} KiB"), format!("{y} KiB"));
        }
    }
    if !a.system.cpu_features.is_empty() && !b.system.cpu_features.is_empty() {
        let features = |r: &Report| {
            let mut f = r.system.cpu_features.clone();
            f.sort();
            f.join(",")
        };
        diff("CPU feature list", features(a), features(b));
    }
    for (what, x, y) in [
        ("physical cores", a.system.physical_cores, b.system.physical_cores),
        ("logical CPUs", a.system.logical_cpus, b.system.logical_cpus),
    ] {
        if x > 0 && y > 0 {
            diff(what, x.to_string(), y.to_string());
        }
    }
    if !a.system.isa.is_empty() && !b.system.isa.is_empty() {
        diff("ISA", a.system.isa.join(","), b.system.isa.join(","));
    }
    if across {
        let file = |r: &Report| {
            bitnet_report::report::source_gguf_name(&r.model.source)
                .unwrap_or_else(|| format!("{} (not a GGUF file)", r.model.source))
        };
        diff("model file", file(a), file(b));
    } else {
        diff("model", a.model.name.clone(), b.model.name.clone());
        // One name covers a preset's synthetic weights and a GGUF file of the same shapes,
        // whose LM heads (and so bytes per token) differ.
        let source = |r: &Report| bitnet_report::report::source_identity(&r.model.source);
        diff("model source", source(a), source(b));
    }
    diff("weight format", a.model.weight_format.clone(), b.model.weight_format.clone());
    if !across {
        diff("weight bytes", a.model.weight_bytes.to_string(), b.model.weight_bytes.to_string());
    }
    diff("schema version", a.schema_version.to_string(), b.schema_version.to_string());
    // Settings that move the figures: decode tokens/s is a mean over the steps' positions (and
    // llama-bench's tg over its -n), and a run's first repetitions warm caches and clocks.
    diff("new tokens per run", a.settings.max_new_tokens.to_string(), b.settings.max_new_tokens.to_string());
    if !across {
        diff("warm-up runs", a.settings.warmup.to_string(), b.settings.warmup.to_string());
    }
    // Weights, KV cache and probe buffers ask for huge pages; without them one thread reads
    // about a quarter less (see the engine's `aligned` module).
    if let (Some(x), Some(y)) = (&a.system.transparent_hugepage, &b.system.transparent_hugepage) {
        diff("transparent huge pages", x.clone(), y.clone());
    }
    if let (Some(x), Some(y)) = (a.system.huge_pages_requested, b.system.huge_pages_requested) {
        let asked = |on: bool| if on { "asked for" } else { "not asked for (BITNET_HUGE_PAGES=0)" }.to_string();
        diff("huge pages", asked(x), asked(y));
    }
    let threads = |r: &Report| {
        let mut t: Vec<usize> = r.results.iter().map(|x| x.config.threads).collect();
        t.sort();
        t.dedup();
        format!("{t:?}")
    };
    diff("thread counts", threads(a), threads(b));
    w
}

/// What pairs two configurations: all of it, or across tools ([`across_tools`]) all but the
/// model, kernel and ISA labels.
fn pair_key(c: &Config, across: bool) -> Config {
    if across {
        Config { model: String::new(), kernel: String::new(), isa: String::new(), ..c.clone() }
    } else {
        c.clone()
    }
}

/// A report's results by [`pair_key`]. Across tools two configurations of one report may share
/// a key (two kernels of ours at one setting); pairing would then pick one silently, so that
/// is an error naming both.
fn index(r: &Report, name: &str, other: Option<&Report>) -> Result<BTreeMap<Config, BenchResult>> {
    let across = other.is_some();
    let mut m: BTreeMap<Config, BenchResult> = BTreeMap::new();
    for x in &r.results {
        if let Some(prev) = m.insert(pair_key(&x.config, across), x.clone()) {
            match other {
                Some(o) if prev.config != x.config => bail!(
                    "{name}: {} and {} have the same batch, context length, KV precision and threads; against a {} report configurations pair by those alone, so each setting may occur once (a sweep of one --kernels)",
                    prev.config,
                    x.config,
                    o.tool.name
                ),
                _ => bail!(
                    "{name}: {} occurs twice; each configuration may occur once (`bitnet-bench merge` pools the runs of one build)",
                    x.config
                ),
            }
        }
    }
    Ok(m)
}

/// The notes of a comparison across tools: how it paired and what stays unlike.
fn across_notes(base: &Report, new: &Report) -> Vec<String> {
    let labels = |r: &Report| {
        let mut l: Vec<String> =
            r.results.iter().map(|x| format!("{} {}/{}", x.config.model, x.config.kernel, x.config.isa)).collect();
        l.sort();
        l.dedup();
        l.join(", ")
    };
    let mut notes = vec![format!(
        "across tools: {} ({}) against {} ({}), paired by batch, context length, KV precision and threads",
        base.tool.name,
        labels(base),
        new.tool.name,
        labels(new)
    )];
    if let Some(peer) = [base, new].into_iter().find(|r| r.tool.name == "llama-bench") {
        let depth = match peer.settings.decode_depth {
            Some(d) => format!("from a cache of {d} tokens (its -d)"),
            None => "from a cache of its -d depth (0 by default)".into(),
        };
        notes.push(format!(
            "decode: llama-bench's tg test decodes {depth}, bitnet-bench after a prompt of the context length, so at long contexts ours also pays attention over the prompt; prefill and TTFT are like for like"
        ));
    }
    notes
}

/// The keys of two probe maps whose figures differ by more than `threshold` (symmetric in
/// log ratio, like the verdicts), with both figures; keys in one map only, and figures that
/// are not positive, are skipped.
fn probes_apart<'a>(
    base: &'a BTreeMap<String, f64>,
    new: &'a BTreeMap<String, f64>,
    threshold: f64,
) -> impl Iterator<Item = (&'a str, f64, f64)> + 'a {
    let tau = (1.0 + threshold).ln();
    base.iter().filter_map(move |(key, &b)| {
        let n = *new.get(key)?;
        let positive = b.is_finite() && n.is_finite() && b > 0.0 && n > 0.0;
        (positive && (n / b).ln().abs() > tau).then_some((key.as_str(), b, n))
    })
}

/// Step probes whose medians are this far apart (the larger over the smaller) were taken with
/// the bus at another level: shared VMs move between levels far more than 20% apart, and
/// within a level the medians stay within a few percent (levels measured: docs/perf-notes.md).
pub const PROBE_LEVELS_APART: f64 = 1.2;

/// Why a roofline fraction's change is not like for like, where the step probes behind the two
/// fractions read at different levels: the fraction itself moves with the level (on a fast bus
/// the cores and not the bus become the limit, so batch-1 decode reaches a smaller share of
/// it; measured on Zen 4: docs/perf-notes.md). `None` where either report lacks the
/// probes (older or imported reports) or they agree.
fn probe_levels_apart(base: &BenchResult, new: &BenchResult) -> Option<String> {
    let (pb, pn) = (&base.decode.probes_gbps, &new.decode.probes_gbps);
    if pb.is_empty() || pn.is_empty() {
        return None;
    }
    let (b, n) = (median(pb), median(pn));
    (b.max(n) / b.min(n) > PROBE_LEVELS_APART).then(|| {
        format!(
            "step probes read {b:.1} → {n:.1} GB/s (median): the bus was at another level, and the fraction moves with the level, so this change is not like for like (inconclusive, not a regression or an improvement)"
        )
    })
}

/// Notes where the read bandwidth each report probed beside its runs (`roofline.by_threads`)
/// differs by more than `threshold`. On a shared machine it moves by tens of percent between
/// hours while the code stays the same, and decode tokens/s follows it: a "regression" of
/// that size may be the machine's. Not an environment warning (`--strict-env` would then
/// refuse most pairs of runs on such machines). Also notes probes that read buffers of
/// different sizes (`roofline.probe_bytes`, `step_probe_bytes`), where both reports say.
pub fn bandwidth_notes(base: &Report, new: &Report, threshold: f64) -> Vec<String> {
    let mut notes: Vec<String> = probes_apart(&base.roofline.by_threads, &new.roofline.by_threads, threshold)
        .map(|(threads, b, n)| format!(
            "the memory read bandwidth probed beside the runs differs: {b:.1} → {n:.1} GB/s with {threads} thread(s) ({:+.1}%, beyond the ±{:.1}% threshold); decode tokens/s follows the machine's bandwidth, so a change of that size may be the machine's, not the code's; decode.roofline_fraction (each step over a probe taken right after it) is compared across such runs",
            (n / b - 1.0) * 100.0,
            threshold * 100.0
        ))
        .collect();
    // Probes of different sizes measure different things: one the last-level cache partly
    // holds (--quick's 64 MiB on a 32 MiB L3) reads faster than DRAM.
    for (field, b, n, figure) in [
        (
            "probe_bytes",
            base.roofline.probe_bytes,
            new.roofline.probe_bytes,
            "the bandwidths they probed (roofline.by_threads)",
        ),
        ("step_probe_bytes", base.roofline.step_probe_bytes, new.roofline.step_probe_bytes, "decode.roofline_fraction"),
    ] {
        if let (Some(b), Some(n)) = (b, n) {
            if b != n {
                notes.push(format!(
                    "the bandwidth probes read buffers of different sizes (roofline.{field}: {b} → {n} bytes): a probe the last-level cache partly holds reads faster than one from memory, so {figure} of the two reports are not like for like"
                ));
            }
        }
    }
    notes
}

/// Notes where the int8 compute peak each report probed (`roofline.int8_peak_gmacs`, per ISA
/// and threads) differs by more than `threshold`: batch decode and prefill follow the cores'
/// clock as batch-1 decode follows the bus, so a change of that size may be the machine's.
pub fn compute_peak_notes(base: &Report, new: &Report, threshold: f64) -> Vec<String> {
    probes_apart(&base.roofline.int8_peak_gmacs, &new.roofline.int8_peak_gmacs, threshold)
        .map(|(key, b, n)| format!(
            "the int8 compute peak probed beside the runs differs: {b:.1} → {n:.1} G multiply-adds/s at {key} ({:+.1}%, beyond the ±{:.1}% threshold); batch decode and prefill follow the cores' clock, so a change of that size may be the machine's, not the code's; decode.compute_fraction (each run over its own report's peak) is compared across such runs",
            (n / b - 1.0) * 100.0,
            threshold * 100.0
        ))
        .collect()
}

/// Compares NEW against BASE on `metric_names`.
pub fn compare(
    base: &Report,
    new: &Report,
    names: (&str, &str),
    metric_names: &[String],
    threshold: f64,
    seed: u64,
) -> Result<Comparison> {
    compare_with(base, new, names, metric_names, threshold, QualityThresholds::default(), seed)
}

/// The quality metrics' own thresholds (`--ppl-threshold`, `--kl-threshold`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QualityThresholds {
    pub perplexity: f64,
    pub kl: f64,
}

impl Default for QualityThresholds {
    fn default() -> Self {
        QualityThresholds { perplexity: PERPLEXITY_THRESHOLD, kl: KL_THRESHOLD }
    }
}

/// [`compare`] with the quality metrics' thresholds given.
pub fn compare_with(
    base: &Report,
    new: &Report,
    names: (&str, &str),
    metric_names: &[String],
    threshold: f64,
    quality: QualityThresholds,
    seed: u64,
) -> Result<Comparison> {
    if !(threshold > 0.0 && threshold < 1.0) {
        bail!("--threshold must be between 0% and 100% (exclusive)");
    }
    let all = metrics();
    let mut chosen = Vec::new();
    for m in metric_names {
        match all.iter().find(|x| x.name == m) {
            Some(x) => chosen.push(*x),
            None => bail!(
                "--metrics {m}: unknown metric (known: {})",
                all.iter().map(|x| x.name).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    for (r, name) in [(base, names.0), (new, names.1)] {
        if r.results.is_empty() {
            bail!("{name}: $.results is empty: nothing to compare");
        }
    }
    let across = across_tools(base, new);
    let (bi, ni) = (index(base, names.0, across.then_some(new))?, index(new, names.1, across.then_some(base))?);
    let added: Vec<Config> = ni.iter().filter(|(k, _)| !bi.contains_key(*k)).map(|(_, x)| x.config.clone()).collect();
    let removed: Vec<Config> = bi.iter().filter(|(k, _)| !ni.contains_key(*k)).map(|(_, x)| x.config.clone()).collect();
    let mut pairs = Vec::new();
    let mut counts = Counts::default();
    let mut not_compared = Vec::new();
    for (key, b) in &bi {
        let Some(n) = ni.get(key) else { continue };
        let cfg = &n.config;
        let mut ms = Vec::new();
        for m in &chosen {
            if m.quality {
                let real = |r: &BenchResult| r.quality.as_ref().map(|q| q.is_real());
                if let (Some(rb), Some(rn)) = (real(b), real(n)) {
                    if !(rb && rn) {
                        not_compared.push(format!(
                            "{cfg} {}: measured on synthetic tokens or weights in {}, which estimate no model's quality: not gated",
                            m.name,
                            if !rb && !rn { "both reports" } else if !rb { "the base" } else { "the new report" }
                        ));
                        continue;
                    }
                }
            }
            let at_floor = |s: Vec<f64>| s.into_iter().map(|v| v.max(m.floor)).collect::<Vec<_>>();
            let (sb, sn) = (at_floor((m.samples)(b).unwrap_or_default()), at_floor((m.samples)(n).unwrap_or_default()));
            let unusable = |s: &[f64]| s.is_empty() || s.iter().any(|v| !(v.is_finite() && *v > 0.0));
            if unusable(&sb) || unusable(&sn) {
                // Zero, negative or missing values (e.g. an imported report's roofline) cannot
                // be ratioed; say so rather than drop the row unseen.
                let which = match (unusable(&sb), unusable(&sn)) {
                    (true, true) => "both reports have",
                    (true, false) => "the base has",
                    _ => "the new report has",
                };
                not_compared.push(format!("{cfg} {}: {which} no samples or samples that are not positive", m.name));
                continue;
            }
            let mut decision = decide(&sb, &sn, m.better, m.resolve_threshold(threshold, quality), seed);
            if matches!(decision.verdict, Verdict::Regression | Verdict::Improvement) {
                if let Some(why) = m.not_like_for_like.and_then(|unlike| unlike(b, n)) {
                    decision.verdict = Verdict::Inconclusive;
                    decision.note = Some(why);
                }
            }
            let Decision { log_change, log_ci_low, log_ci_high, p_value, verdict, note } = decision;
            match verdict {
                Verdict::Regression => counts.regressions += 1,
                Verdict::Improvement => counts.improvements += 1,
                Verdict::Unchanged => counts.unchanged += 1,
                Verdict::Inconclusive => counts.inconclusive += 1,
            }
            ms.push(MetricDiff {
                metric: m.name.into(),
                better: m.better,
                base_median: median(&sb),
                new_median: median(&sn),
                n_base: sb.len(),
                n_new: sn.len(),
                change: log_change.exp() - 1.0,
                ci_low: log_ci_low.exp() - 1.0,
                ci_high: log_ci_high.exp() - 1.0,
                p_value,
                verdict,
                note,
            });
        }
        let base_config = (b.config != n.config).then(|| b.config.clone());
        pairs.push(ConfigDiff { config: cfg.clone(), base_config, metrics: ms });
    }
    if pairs.is_empty() {
        bail!(
            "{} and {}: no configuration in common ({} only in the first, {} only in the second{})",
            names.0,
            names.1,
            removed.len(),
            added.len(),
            if across { "; across tools they pair by batch, context length, KV precision and threads" } else { "" }
        );
    }
    Ok(Comparison {
        base: names.0.into(),
        new: names.1.into(),
        threshold,
        metrics: chosen.iter().map(|m| m.name.to_string()).collect(),
        counts,
        pairs,
        added,
        removed,
        env_warnings: environment_differences(base, new),
        notes: {
            let mut notes = if across { across_notes(base, new) } else { Vec::new() };
            notes.extend(bandwidth_notes(base, new, threshold));
            notes.extend(compute_peak_notes(base, new, threshold));
            // What a report's missing configurations are listed as, and what that does.
            for (which, r, lacks, effect) in
                [("BASE", base, "added", ""), ("NEW", new, "removed", "; with --fail-on regression the gate fails")]
            {
                if !r.complete {
                    notes.push(format!(
                        "{which} is incomplete (its run was interrupted): configurations it lacks are listed as {lacks}{effect}"
                    ));
                }
                if r.tool.git_dirty == Some(true) {
                    notes.push(format!(
                        "{which} was built from a tree with uncommitted changes (tool.git_dirty): commit {} does not name the code it measured",
                        r.tool.git_commit.as_deref().unwrap_or("(unknown)")
                    ));
                }
            }
            notes
        },
        not_compared,
    })
}
