//! `import-llama-bench`: llama.cpp's `llama-bench -o json` output as our report, so a
//! llama.cpp or bitnet.cpp run on the same GGUF can be tabled, plotted and diffed beside ours.
//!
//! llama-bench writes one entry per test: prompt processing (`n_prompt > 0`, `n_gen = 0`) and
//! text generation (`n_gen > 0`). The tests of one configuration (threads, K type) are paired
//! into one result per pp test (one per `-p` value): prefill from the pp test (`samples_ts`, and
//! `samples_ns` as TTFT), decode from the configuration's one tg test (`samples_ts`). A report
//! holds one model, one `-n` and one `-d`, and no field for llama-bench's other settings (`-fa`,
//! `-b`, `-ub`, `-ctv`, ...): files with several of any are refused, not merged. Mapping
//! limits, stated in the fields: `context_length` is the pp test's `n_prompt`, while llama-bench decodes from a cache of
//! `n_depth` tokens (0 unless `-d` was given); latency percentiles are over per-run mean token
//! times (llama-bench keeps no per-token times); the roofline is unknown (0).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use bitnet_report::report::{
    BenchResult, Config, Decode, Memory, ModelInfo, Prefill, Report, Settings, Tool, SCHEMA_VERSION,
};
use bitnet_report::roofline::Roofline;
use bitnet_report::stats::{Latency, Stat};
use bitnet_report::system::System;

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
    /// Every other field: the settings llama-bench can sweep besides those above (`-fa`, `-b`,
    /// `-ub`, `-ctv`, ...), which tell configurations apart.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Fields of an entry that describe the test's result, not its configuration.
const PER_TEST_FIELDS: [&str; 4] = ["avg_ns", "stddev_ns", "avg_ts", "stddev_ts"];

impl LlamaBenchEntry {
    /// The settings beyond threads, K type and depth, for grouping.
    fn settings(&self) -> BTreeMap<&str, &serde_json::Value> {
        self.other
            .iter()
            .filter(|(k, _)| !PER_TEST_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v))
            .collect()
    }
}

/// Converts llama-bench entries into a report.
pub fn import(entries: &[LlamaBenchEntry], name: &str) -> Result<Report> {
    if entries.is_empty() {
        bail!("{name}: no llama-bench entries");
    }
    // One report holds one model: llama-bench's `model_type` is the same for every BitNet
    // file of one quantization type, so the file name tells models apart.
    let mut files: Vec<&str> = entries.iter().map(|e| e.model_filename.as_str()).collect();
    files.sort_unstable();
    files.dedup();
    if files.len() > 1 {
        bail!(
            "{name}: entries of {} models ({}); a report holds one model: run llama-bench with one -m at a time",
            files.len(),
            files.join(", ")
        );
    }
    // Tests of one configuration (threads, K type, depth): every pp test (one per -p value) is
    // paired with the one tg test.
    /// llama-bench's settings other than threads, K type and depth, by field name.
    type Knobs<'e> = BTreeMap<&'e str, &'e serde_json::Value>;
    type Key<'e> = (usize, String, usize, Knobs<'e>);
    /// The pp tests, and the tg tests with their entry index.
    type Tests<'e> = (Vec<&'e LlamaBenchEntry>, Vec<(usize, &'e LlamaBenchEntry)>);
    let mut groups: Vec<(Key, Tests)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.samples_ts.is_empty() || e.samples_ts.len() != e.samples_ns.len() {
            bail!("{name}: [{i}].samples_ts: needs one or more samples, as many as samples_ns");
        }
        if e.samples_ts.iter().chain(&e.samples_ns).any(|v| !v.is_finite() || *v <= 0.0) {
            bail!("{name}: [{i}]: samples must be positive numbers");
        }
        let key = (e.n_threads, e.type_k.clone(), e.n_depth, e.settings());
        let g = match groups.iter().position(|(k, _)| *k == key) {
            Some(at) => &mut groups[at].1,
            None => {
                groups.push((key, Tests::default()));
                &mut groups.last_mut().expect("just pushed").1
            }
        };
        match (e.n_prompt > 0, e.n_gen > 0) {
            (true, false) => g.0.push(e),
            (false, true) => g.1.push((i, e)),
            _ => {} // combined pp+tg (-pg) tests have no split to map
        }
    }
    let depths: Vec<usize> =
        groups.iter().map(|(k, _)| k.2).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    if depths.len() > 1 {
        bail!(
            "{name}: tests at several depths (-d {}); a report's configuration has no depth: import one -d at a time",
            depths.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
        );
    }
    let mut results = Vec::new();
    // Configurations that would become the same result configuration differ in a setting the
    // report has no field for.
    let mut seen: Vec<((usize, &str), &Knobs)> = Vec::new();
    for ((threads, type_k, _, settings), _) in &groups {
        if let Some((_, other)) = seen.iter().find(|(k, _)| *k == (*threads, type_k.as_str())) {
            let differ: std::collections::BTreeSet<&str> =
                settings.keys().chain(other.keys()).filter(|k| settings.get(*k) != other.get(*k)).copied().collect();
            bail!(
                "{name}: tests at {threads} threads differ in {}, which a report's configuration has no field for: import one value at a time",
                differ.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        seen.push(((*threads, type_k.as_str()), settings));
    }
    for ((threads, type_k, _, _), (pps, tgs)) in &groups {
        let tg = match tgs[..] {
            [] => continue,
            [(_, tg)] => tg,
            [(i, a), (j, b), ..] => bail!(
                "{name}: [{i}] and [{j}]: tg tests of {} and {} tokens at {threads} threads; a report decodes one number of new tokens: import one -n at a time",
                a.n_gen,
                b.n_gen
            ),
        };
        for pp in pps {
            let token_ms: Vec<f64> = tg.samples_ns.iter().map(|ns| ns / 1e6 / tg.n_gen as f64).collect();
            results.push(BenchResult {
                config: Config {
                    model: tg.model_type.clone(),
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
                    macs: 0,
                    compute_fraction: None,
                },
                decode: Decode {
                    tokens_per_sec: Stat::of(&tg.samples_ts),
                    latency_ms: Latency::of(token_ms),
                    bytes_per_token: 0,
                    bytes_per_step: 0,
                    roofline_fraction: 0.0,
                    probes_gbps: Vec::new(),
                    step_fractions: Vec::new(),
                    pass_fractions: Vec::new(),
                    macs_per_step: 0,
                    compute_fraction: None,
                },
                memory: Memory {
                    weight_bytes: pp.model_size,
                    kv_cache_bytes: 0,
                    peak_rss_bytes: None,
                    repack_bytes: None,
                },
                quality: None,
                stages: None,
                counters: None,
            });
        }
    }
    if results.is_empty() {
        bail!(
            "{name}: no configuration has both a pp test (n_prompt > 0, n_gen = 0) and a tg test (n_gen > 0, n_prompt = 0) at the same threads, K type and depth (combined -pg tests are not imported)"
        );
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
            cpu_id: None,
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
            huge_pages_requested: None,
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
                // bitnet.cpp's I2_S is what our loader holds as `i2`: one name, so a diff
                // of the two on one file does not warn of a format difference.
                .map_or("unknown".into(), |t| if *t == "I2_S" { "i2".into() } else { t.to_lowercase() }),
            ffn_activation: None,
            ffn_activation_source: None,
        },
        settings: Settings {
            warmup: 1,
            repeat: reps,
            // The tg tests' (combined -pg tests are not imported).
            max_new_tokens: entries.iter().filter(|e| e.n_prompt == 0).map(|e| e.n_gen).max().unwrap_or(0),
            seed: 0,
            // One depth per import (several are refused above).
            decode_depth: depths.first().copied(),
        },
        roofline: Roofline {
            read_bandwidth_gbps: 0.0,
            threads: 0,
            by_threads: BTreeMap::new(),
            probes_gbps: BTreeMap::new(),
            int8_peak_gmacs: BTreeMap::new(),
            int8_peak_probes: BTreeMap::new(),
            probe_bytes: None,
            step_probe_bytes: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(file: &str, threads: usize, n_prompt: usize, n_gen: usize, depth: usize, ts: f64) -> LlamaBenchEntry {
        LlamaBenchEntry {
            build_commit: "abc".into(),
            cpu_info: "cpu".into(),
            backends: "CPU".into(),
            model_filename: file.into(),
            model_type: "bitnet ?B TQ2_0 - 2.06 bpw ternary".into(),
            model_size: 1000,
            model_n_params: 10,
            n_threads: threads,
            type_k: "f16".into(),
            n_prompt,
            n_gen,
            n_depth: depth,
            test_time: String::new(),
            samples_ns: vec![1e6, 1.1e6],
            samples_ts: vec![ts, ts * 1.1],
            other: BTreeMap::from([("avg_ts".to_string(), ts.into()), ("flash_attn".to_string(), false.into())]),
        }
    }

    #[test]
    fn weight_formats_take_our_names() {
        let format = |model_type: &str| {
            let e: Vec<_> = [entry("m.gguf", 2, 16, 0, 0, 100.0), entry("m.gguf", 2, 0, 4, 0, 10.0)]
                .into_iter()
                .map(|mut x| {
                    x.model_type = model_type.into();
                    x
                })
                .collect();
            import(&e, "lb.json").unwrap().model.weight_format
        };
        // bitnet.cpp's I2_S is our loader's `i2`; llama.cpp's types are ours lower-cased.
        assert_eq!(format("bitnet-b1.58 2B I2_S - 2 bpw ternary"), "i2");
        assert_eq!(format("bitnet ?B TQ1_0 - 1.69 bpw ternary"), "tq1_0");
        assert_eq!(format("bitnet ?B TQ2_0 - 2.06 bpw ternary"), "tq2_0");
        assert_eq!(format("llama 8B"), "unknown");
    }

    #[test]
    fn every_prompt_length_becomes_a_result_with_the_configurations_tg_test() {
        // llama-bench -p 16,32 -n 4 -t 1,2: two pp tests and one tg test per thread count.
        let e: Vec<_> = [1, 2]
            .iter()
            .flat_map(|&t| {
                let f = t as f64;
                [
                    entry("m.gguf", t, 16, 0, 0, 100.0 * f),
                    entry("m.gguf", t, 32, 0, 0, 200.0 * f),
                    entry("m.gguf", t, 0, 4, 0, 10.0 * f),
                ]
            })
            .collect();
        let r = import(&e, "lb.json").unwrap();
        let got: Vec<(usize, usize, f64, f64)> = r
            .results
            .iter()
            .map(|x| {
                let c = &x.config;
                (
                    c.threads,
                    c.context_length,
                    x.prefill.tokens_per_sec.samples()[0],
                    x.decode.tokens_per_sec.samples()[0],
                )
            })
            .collect();
        assert_eq!(got, [(1, 16, 100.0, 10.0), (1, 32, 200.0, 10.0), (2, 16, 200.0, 20.0), (2, 32, 400.0, 20.0)]);
        assert_eq!(r.settings.max_new_tokens, 4);
    }

    #[test]
    fn several_models_depths_or_generation_lengths_are_refused_not_merged() {
        let two_models = [
            entry("large.gguf", 2, 16, 0, 0, 1.0),
            entry("large.gguf", 2, 0, 4, 0, 1.0),
            entry("2b.gguf", 2, 16, 0, 0, 1.0),
            entry("2b.gguf", 2, 0, 4, 0, 1.0),
        ];
        let err = import(&two_models, "lb.json").unwrap_err().to_string();
        assert!(err.contains("2 models") && err.contains("large.gguf") && err.contains("2b.gguf"), "{err}");
        let two_depths = [
            entry("m", 2, 16, 0, 0, 1.0),
            entry("m", 2, 0, 4, 0, 1.0),
            entry("m", 2, 16, 0, 8, 1.0),
            entry("m", 2, 0, 4, 8, 1.0),
        ];
        let err = import(&two_depths, "lb.json").unwrap_err().to_string();
        assert!(err.contains("-d 0,8"), "{err}");
        let two_gens = [entry("m", 2, 16, 0, 0, 1.0), entry("m", 2, 0, 4, 0, 1.0), entry("m", 2, 0, 8, 0, 1.0)];
        let err = import(&two_gens, "lb.json").unwrap_err().to_string();
        assert!(err.contains("[1] and [2]") && err.contains("-n"), "{err}");
        // -fa 0,1: a setting our configuration cannot tell apart.
        let mut fa = vec![entry("m", 2, 16, 0, 0, 1.0), entry("m", 2, 0, 4, 0, 1.0)];
        for mut e in [entry("m", 2, 16, 0, 0, 2.0), entry("m", 2, 0, 4, 0, 2.0)] {
            e.other.insert("flash_attn".into(), true.into());
            fa.push(e);
        }
        let err = import(&fa, "lb.json").unwrap_err().to_string();
        assert!(err.contains("differ in flash_attn"), "{err}");
        // A -pg test's generation length is not the report's.
        let pg = [entry("m", 2, 16, 0, 0, 1.0), entry("m", 2, 0, 4, 0, 1.0), entry("m", 2, 16, 8, 0, 1.0)];
        assert_eq!(import(&pg, "lb.json").unwrap().settings.max_new_tokens, 4);
        let pg_only = [entry("m", 2, 16, 4, 0, 1.0)];
        let err = import(&pg_only, "lb.json").unwrap_err().to_string();
        assert!(err.contains("-pg"), "{err}");
    }
}
