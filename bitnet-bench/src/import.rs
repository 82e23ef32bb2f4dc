//! `import-llama-bench`: llama.cpp's `llama-bench -o json` output as our report, so a
//! llama.cpp or bitnet.cpp run on the same GGUF can be tabled, plotted and diffed beside ours.
//!
//! llama-bench writes one entry per test: prompt processing (`n_prompt > 0`, `n_gen = 0`) and
//! text generation (`n_gen > 0`). Entries of one configuration (model, threads, K type, batch)
//! are paired into one result: prefill from the pp test (`samples_ts`, and `samples_ns` as
//! TTFT), decode from the tg test (`samples_ts`). Mapping limits, stated in the fields:
//! `context_length` is the pp test's `n_prompt`, while llama-bench decodes from a cache of
//! `n_depth` tokens (0 unless `-d` was given); latency percentiles are over per-run mean token
//! times (llama-bench keeps no per-token times); the roofline is unknown (0).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::report::{
    BenchResult, Config, Decode, Latency, Memory, ModelInfo, Prefill, Report, Roofline, Settings, Tool, SCHEMA_VERSION,
};
use crate::stats::Stat;
use crate::system::System;

/// The fields of a llama-bench JSON entry that we read.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaBenchEntry {
    #[serde(default)]
    pub build_commit: String,
    #[serde(default)]
    pub cpu_info: String,
    #[serde(default)]
    pub backends: String,
    #[serde(default)]
    pub model_filename: String,
    #[serde(default)]
    pub model_type: String,
    #[serde(default)]
    pub model_size: u64,
    #[serde(default)]
    pub model_n_params: u64,
    #[serde(default = "one")]
    pub n_batch: usize,
    pub n_threads: usize,
    #[serde(default)]
    pub type_k: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    #[serde(default)]
    pub n_depth: usize,
    #[serde(default)]
    pub test_time: String,
    pub samples_ns: Vec<f64>,
    pub samples_ts: Vec<f64>,
}

fn one() -> usize {
    1
}

/// Converts llama-bench entries into a report.
pub fn import(entries: &[LlamaBenchEntry], name: &str) -> Result<Report> {
    if entries.is_empty() {
        bail!("{name}: no llama-bench entries");
    }
    type Key = (String, usize, String, usize);
    let mut groups: BTreeMap<Key, (Option<&LlamaBenchEntry>, Option<&LlamaBenchEntry>)> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        if e.samples_ts.is_empty() || e.samples_ts.len() != e.samples_ns.len() {
            bail!("{name}: [{i}].samples_ts: needs one or more samples, as many as samples_ns");
        }
        if e.samples_ts.iter().chain(&e.samples_ns).any(|v| !v.is_finite() || *v <= 0.0) {
            bail!("{name}: [{i}]: samples must be positive numbers");
        }
        let key = (e.model_type.clone(), e.n_threads, e.type_k.clone(), e.n_depth);
        let g = groups.entry(key).or_default();
        match (e.n_prompt > 0, e.n_gen > 0) {
            (true, false) => g.0 = Some(e),
            (false, true) => g.1 = Some(e),
            _ => {} // combined pp+tg tests have no split to map
        }
    }
    let mut results = Vec::new();
    for ((model, threads, type_k, _), (pp, tg)) in &groups {
        let (Some(pp), Some(tg)) = (pp, tg) else { continue };
        let token_ms: Vec<f64> = tg.samples_ns.iter().map(|ns| ns / 1e6 / tg.n_gen as f64).collect();
        results.push(BenchResult {
            config: Config {
                model: model.clone(),
                kernel: "llama.cpp".into(),
                isa: if pp.backends.is_empty() { "cpu".into() } else { pp.backends.to_lowercase() },
                batch: 1,
                context_length: pp.n_prompt,
                kv_precision: type_k.clone(),
                threads: *threads,
            },
            prefill: Prefill {
                tokens_per_sec: Stat::of(&pp.samples_ts),
                ttft_ms: Stat::of(&pp.samples_ns.iter().map(|ns| ns / 1e6).collect::<Vec<_>>()),
            },
            decode: Decode {
                tokens_per_sec: Stat::of(&tg.samples_ts),
                latency_ms: Latency::of(token_ms),
                bytes_per_token: 0,
                bytes_per_step: 0,
                roofline_fraction: 0.0,
                probes_gbps: Vec::new(),
                step_fractions: Vec::new(),
            },
            memory: Memory { weight_bytes: pp.model_size, kv_cache_bytes: 0, peak_rss_bytes: None },
            quality: None,
            stages: None,
            counters: None,
        });
    }
    if results.is_empty() {
        bail!("{name}: no configuration has both a prompt (n_prompt > 0) and a generation (n_gen > 0) test");
    }
    let first = &entries[0];
    let reps = first.samples_ts.len();
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        complete: true,
        created_at: if first.test_time.is_empty() { crate::sweep::now_rfc3339() } else { first.test_time.clone() },
        tool: Tool {
            name: "llama-bench".into(),
            version: "imported".into(),
            git_commit: (!first.build_commit.is_empty()).then(|| first.build_commit.clone()),
            git_dirty: None,
        },
        system: System {
            cpu_model: first.cpu_info.clone(),
            physical_cores: 0,
            logical_cpus: 0,
            isa: vec![],
            cpu_features: vec![],
            l1d_kib: None,
            l2_kib: None,
            l3_kib: None,
            memory_bytes: None,
            os: String::new(),
            kernel: String::new(),
            governor: None,
            turbo: None,
            transparent_hugepage: None,
            pinned: false,
            rustc: String::new(),
        },
        model: ModelInfo {
            name: first.model_type.clone(),
            source: format!("llama-bench on {}", first.model_filename),
            params: first.model_n_params,
            weight_bytes: first.model_size,
            weight_format: ["TQ1_0", "TQ2_0", "I2_S", "Q6_K", "Q4_0", "Q8_0", "BF16", "F16", "F32"]
                .iter()
                .find(|t| first.model_type.split_whitespace().any(|w| w == **t))
                .map_or("unknown".into(), |t| t.to_lowercase()),
        },
        settings: Settings {
            warmup: 1,
            repeat: reps,
            max_new_tokens: entries.iter().map(|e| e.n_gen).max().unwrap_or(0),
            seed: 0,
        },
        roofline: Roofline {
            read_bandwidth_gbps: 0.0,
            threads: 0,
            by_threads: BTreeMap::new(),
            probes_gbps: BTreeMap::new(),
        },
        results,
    })
}

/// Reads a llama-bench JSON file (an array of entries).
pub fn import_file(path: &Path) -> Result<Report> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("{name}: cannot read"))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let entries: Vec<LlamaBenchEntry> = serde_path_to_error::deserialize(de).map_err(|e| {
        anyhow::anyhow!("{name}: at $.{}: {} (expected llama-bench -o json output)", e.path(), e.inner())
    })?;
    import(&entries, &name)
}
