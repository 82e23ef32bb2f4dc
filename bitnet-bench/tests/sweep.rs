//! The sweep's statistics, report, exporters and interrupt path, measured through a fake
//! runner with fixed timings (no clock, no noise).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use bitnet_bench::output;
use bitnet_bench::sweep::{
    run_sweep, Combo, Diagnostics, Prepared, Progress, RooflinePass, RunSample, Runner, SweepSpec, Traced,
};
use bitnet_engine::{IsaLevel, Kernel, KernelFamily, KernelForm, KvPrecision};
use bitnet_report::report::{self, ModelInfo, Quality, Report};
use bitnet_report::system;

/// Decode step k of run r takes (10 + k + r) ms × (1 + batch / 4); prefill takes 1 ms per
/// prompt token; probe p (from 0) measures 10 × threads + 5p GB/s. Sets `stop` when
/// `stop_after_runs` runs have happened.
struct FakeRunner<'a> {
    combo: Option<Combo>,
    runs: usize,
    probes: usize,
    stop_after_runs: Option<(usize, &'a AtomicBool)>,
}

impl Runner for FakeRunner<'_> {
    fn model_info(&self) -> ModelInfo {
        ModelInfo {
            name: "fake".into(),
            source: "test".into(),
            params: 1000,
            weight_bytes: 1 << 20,
            weight_format: "i2".into(),
            ffn_activation: Some("relu2".into()),
            ffn_activation_source: Some("preset".into()),
        }
    }
    fn max_context(&self) -> usize {
        4096
    }
    fn estimate_bytes(&self, c: &Combo, _max_new: usize) -> u64 {
        (c.batch * c.context_length) as u64
    }
    fn bandwidth_gbps(&mut self, threads: usize) -> Result<f64> {
        self.probes += 1;
        Ok(10.0 * threads as f64 + 5.0 * (self.probes - 1) as f64)
    }
    fn int8_peak_gmacs(&mut self, isa: IsaLevel, threads: usize) -> Result<Option<f64>> {
        // 200 G/s a thread at any SIMD level (so that the report is the same on an AVX2
        // machine, which `sweep` relabels avx512); none for scalar.
        Ok((isa != IsaLevel::Scalar).then_some(200.0 * threads as f64))
    }
    fn prepare(&mut self, combo: &Combo, _max_new: usize) -> Result<Prepared> {
        self.combo = Some(*combo);
        Ok(Prepared {
            weight_bytes: 1 << 20,
            repack_bytes: 0,
            kv_cache_bytes: 4096 * combo.batch as u64,
            bytes_per_step: 100_000_000,
            kv_bytes_per_position: 0,
            macs_per_step: 2_000_000_000 * combo.batch as u64,
            prefill_macs: 100_000_000 * (combo.context_length + 1) as u64 * combo.batch as u64,
        })
    }
    fn run(&mut self, max_new: usize) -> Result<RunSample> {
        let c = self.combo.unwrap();
        let r = self.runs as f64;
        self.runs += 1;
        if let Some((n, stop)) = self.stop_after_runs {
            if self.runs >= n {
                stop.store(true, Ordering::SeqCst);
            }
        }
        let prefill = 1e-3 * (c.batch * c.context_length) as f64;
        let steps = (0..max_new).map(|k| (10.0 + k as f64 + r) * 1e-3 * (1.0 + c.batch as f64 / 4.0)).collect();
        Ok(RunSample { prefill_secs: prefill, ttft_secs: prefill + 1e-3, decode_step_secs: steps })
    }
    fn roofline_pass(&mut self, max_new: usize, _reuse_prompt: bool) -> Result<RooflinePass> {
        // Step k takes (10 + k) ms × (1 + B/4) and its probe reads (20 + k) GB/s.
        let c = self.combo.unwrap();
        Ok(RooflinePass {
            step_secs: (0..max_new).map(|k| (10.0 + k as f64) * 1e-3 * (1.0 + c.batch as f64 / 4.0)).collect(),
            probe_gbps: (0..max_new).map(|k| 20.0 + k as f64).collect(),
        })
    }
    fn diagnose(&mut self, _max_new: usize, trace: bool, _counters: bool) -> Result<Diagnostics> {
        let stages = trace.then(|| BTreeMap::from([("dot".to_string(), 300.0), ("unpack".to_string(), 100.0)]));
        let traced = trace.then(|| Traced {
            folded: "decode;layer.00;ffn.down;dot 300\ndecode;layer.00;ffn.down;unpack 100\n".into(),
            timeline: "{\"traceEvents\": []}".into(),
        });
        Ok(Diagnostics { stages, counters: None, traced })
    }
    fn quality(&mut self, kv: KvPrecision, positions: usize, _threads: usize) -> Result<Quality> {
        let kl = match kv {
            KvPrecision::F16 => 0.001,
            _ => 0.01,
        };
        Ok(Quality {
            kl_divergence: kl,
            top1_agreement: 0.9,
            positions,
            source: "text".into(),
            model: None,
            text: Some("fake.txt (10 bytes, sha256 0123456789abcdef)".into()),
            perplexity_f32: Some(20.0),
            perplexity: Some(20.0 * (1.0 + kl)),
        })
    }
}

fn spec() -> SweepSpec {
    SweepSpec {
        model: "fake".into(),
        batch_sizes: vec![1, 4],
        context_lengths: vec![8],
        kv_precisions: vec![KvPrecision::F16, KvPrecision::Int8],
        threads: vec![2],
        kernels: vec![KernelFamily::I2s],
        max_new_tokens: 3,
        warmup: 1,
        repeat: 3,
        trace: true,
        quality_positions: 16,
        ..SweepSpec::default()
    }
}

fn sweep(stop_after: Option<usize>) -> Report {
    let stop = AtomicBool::new(false);
    let mut runner = FakeRunner { combo: None, runs: 0, probes: 0, stop_after_runs: stop_after.map(|n| (n, &stop)) };
    let mut done = 0;
    let mut r = run_sweep(&spec(), &mut runner, &stop, |p| {
        if let Progress::Done { report, .. } = p {
            done += 1;
            assert_eq!(report.results.len(), done, "the report passed on holds every finished combination");
        }
        Ok(())
    })
    .unwrap();
    // Fix what depends on the machine and the moment, for golden files.
    r.created_at = "2026-01-01T00:00:00Z".into();
    r.tool.git_commit = Some("0123456789abcdef".into());
    r.tool.git_dirty = Some(false);
    r.system = system::System {
        cpu_model: "Test CPU".into(),
        cpu_id: Some(system::CpuIdentity {
            vendor: "AuthenticAMD".into(),
            family: 25,
            model: 17,
            stepping: 1,
            microarchitecture: Some("zen4".into()),
        }),
        physical_cores: 2,
        logical_cpus: 2,
        isa: vec!["avx512".into()],
        cpu_features: vec![],
        l1d_kib: Some(32),
        l2_kib: Some(1024),
        l3_kib: None,
        memory_bytes: Some(1 << 34),
        os: "Test OS".into(),
        kernel: "6.1".into(),
        governor: None,
        turbo: None,
        transparent_hugepage: Some("madvise".into()),
        huge_pages_requested: Some(true),
        pinned: false,
        rustc: "rustc 1.95.0".into(),
    };
    for x in &mut r.results {
        x.memory.peak_rss_bytes = Some(1 << 30);
        // The sweep resolves "best" to the widest level this CPU has (avx2 on Zen 3 VMs).
        x.config.isa = "avx512".into();
    }
    let peaks = std::mem::take(&mut r.roofline.int8_peak_gmacs);
    for (k, g) in peaks {
        let threads = k.rsplit('/').next().unwrap().parse().unwrap();
        r.roofline.int8_peak_gmacs.insert(bitnet_report::roofline::peak_key("avx512", threads), g);
    }
    r.refresh_derived();
    r
}

#[test]
fn compute_fractions_are_each_steps_multiply_adds_over_the_int8_peak() {
    let r = sweep(None);
    assert_eq!(r.roofline.int8_peak_gmacs, BTreeMap::from([("avx512/2".to_string(), 400.0)]));
    for x in &r.results {
        // The fake's 2 G multiply-adds a token, B tokens a step, at the median tokens/s.
        assert_eq!(x.decode.macs_per_step, 2_000_000_000 * x.config.batch as u64);
        let want = 2e9 * x.decode.tokens_per_sec.median() / 400e9;
        let got = x.decode.compute_fraction.unwrap();
        assert!((got - want).abs() < 1e-12 * want, "{}: {got} vs {want}", x.config);
        // Prefill: the fake's (context + 1) × 0.1 G a sequence over the median prefill time.
        let (b, ctx) = (x.config.batch as f64, x.config.context_length as f64);
        let secs = b * ctx / x.prefill.tokens_per_sec.median();
        let want = 1e8 * (ctx + 1.0) * b / secs / 400e9;
        let got = x.prefill.compute_fraction.unwrap();
        assert!((got - want).abs() < 1e-12 * want, "{}: prefill {got} vs {want}", x.config);
    }
    // A scalar sweep has no int8 peak, hence no fraction; nor has an ISA/thread count the
    // roofline section lacks.
    let stop = AtomicBool::new(false);
    let mut runner = FakeRunner { combo: None, runs: 0, probes: 0, stop_after_runs: None };
    let scalar = SweepSpec { isa: Some(IsaLevel::Scalar), quality_positions: 0, trace: false, ..spec() };
    let s = run_sweep(&scalar, &mut runner, &stop, |_| Ok(())).unwrap();
    assert!(s.roofline.int8_peak_gmacs.is_empty());
    assert!(s.results.iter().all(|x| x.decode.compute_fraction.is_none() && x.decode.macs_per_step > 0));
    assert!(s.results.iter().all(|x| x.prefill.compute_fraction.is_none() && x.prefill.macs > 0));
    let mut other = r.clone();
    other.roofline.int8_peak_gmacs = BTreeMap::from([("avx512/1".to_string(), 200.0)]);
    other.refresh_derived();
    assert!(other.results.iter().all(|x| x.decode.compute_fraction.is_none() && x.prefill.compute_fraction.is_none()));
    // Merged runs take the higher peak of the two.
    let mut faster = r.clone();
    faster.roofline.int8_peak_gmacs.insert("avx512/2".into(), 500.0);
    let m = bitnet_report::merge(&[("a".to_string(), r.clone()), ("b".to_string(), faster)]).unwrap();
    assert_eq!(m.roofline.int8_peak_gmacs["avx512/2"], 500.0);
    for x in &m.results {
        let want = 2e9 * x.decode.tokens_per_sec.median() / 500e9;
        assert!((x.decode.compute_fraction.unwrap() - want).abs() < 1e-12 * want);
    }
}

#[test]
fn the_header_names_probes_that_moved_and_missing_huge_pages() {
    let mut r = sweep(None);
    let h = output::header(&r);
    assert!(h.contains("; probes 20.0 → 25.0, 20% apart: bandwidth moved during the sweep"), "{h}");
    assert!(!h.contains("huge pages"), "{h}");
    // A wider spread at another thread count is named with that count's own probes.
    r.roofline.probes_gbps.insert("1".into(), vec![10.0, 15.0]);
    r.system.huge_pages_requested = Some(false);
    let h = output::header(&r);
    assert!(h.contains("; probes 20.0 → 25.0; 1-thread probes 10.0 → 15.0, 33% apart: bandwidth moved"), "{h}");
    assert!(h.contains("no huge pages (BITNET_HUGE_PAGES=0)"), "{h}");
    // The int8 peak's probes (before and after the runs) and, past 10% apart, a warning.
    assert_eq!(r.roofline.int8_peak_probes["avx512/2"], [400.0, 400.0]);
    assert!(!output::warnings(&r).iter().any(|w| w.contains("int8 peak moved")));
    r.roofline.int8_peak_probes.insert("avx512/2".into(), vec![300.0, 400.0]);
    let h = output::header(&r);
    assert!(h.contains("int8 peak avx512/2 400.0 G multiply-adds/s (probes 300.0 → 400.0, 25% apart)"), "{h}");
    let w = output::warnings(&r);
    assert!(
        w.iter()
            .any(|w| w.starts_with("The int8 peak moved during the sweep: the avx512/2 probes read 300.0, 400.0 G")),
        "{w:?}"
    );
    // Merged runs keep every probe.
    let m = bitnet_report::merge(&[("a".to_string(), r.clone()), ("b".to_string(), r.clone())]).unwrap();
    assert_eq!(m.roofline.int8_peak_probes["avx512/2"], [300.0, 400.0, 300.0, 400.0]);
}

/// A fraction above 100% cannot be the machine's: the table says its probe read low.
#[test]
fn fractions_above_their_probes_are_flagged_under_the_table() {
    let mut r = sweep(None);
    assert!(!output::table(&r).contains("WARNING"));
    r.roofline.int8_peak_gmacs.insert("avx512/2".into(), 1.0);
    r.refresh_derived();
    let t = output::table(&r);
    assert!(
        t.contains("WARNING: a compute fraction above 100%: the int8 peak probes read below what the run did"),
        "{t}"
    );
    r.results[0].decode.roofline_fraction = 1.3;
    let t = output::markdown(&r);
    assert!(t.contains("WARNING: roofline and compute fractions above 100%"), "{t}");
    // Lookup and popcount kernels multiply nothing: their compute may pass 100%.
    r.results[0].decode.roofline_fraction = 0.5;
    for x in &mut r.results {
        x.config.kernel = "tq1".into();
    }
    assert!(!output::table(&r).contains("WARNING"), "{}", output::table(&r));
}

#[test]
fn the_header_names_the_largest_kernel_repack() {
    let mut r = sweep(None);
    assert!(!output::header(&r).contains("repack"));
    r.results[0].memory.repack_bytes = Some(3 << 20);
    r.results[1].memory.repack_bytes = Some(5 << 19);
    let h = output::header(&r);
    assert!(h.contains("1 MiB of weights + up to 3 MiB held by kernel repacks,"), "{h}");
}

#[test]
fn statistics_come_from_the_runs_after_warm_up() {
    let r = sweep(None);
    assert!(r.complete);
    assert_eq!(r.results.len(), 4);
    let first = &r.results[0];
    assert_eq!((first.config.batch, first.config.kv_precision.as_str()), (1, "f16"));
    // Runs 1, 2, 3 are measured (run 0 is the warm-up): steps (10+k+r) ms × 1.25 for B=1.
    let tg = &first.decode.tokens_per_sec;
    let expect: Vec<f64> = (1..=3).map(|r| 3.0 / ((30.0 + 3.0 + 3.0 * r as f64) * 1.25e-3)).collect();
    assert_eq!(tg.n(), 3);
    for (a, b) in tg.samples().iter().zip(&expect) {
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    }
    assert!((tg.median() - expect[1]).abs() < 1e-9);
    // Latency: all 9 steps, in ms.
    let lat = &first.decode.latency_ms;
    assert_eq!(lat.samples().len(), 9);
    // Steps 11,12,13 / 12,13,14 / 13,14,15 ms × 1.25: the median is 13 × 1.25.
    assert!((lat.p50() - 16.25).abs() < 1e-9, "got {}", lat.p50());
    // Prefill: 8 tokens in 8 ms.
    assert!((first.prefill.tokens_per_sec.median() - 1000.0).abs() < 1e-9);
    assert!((first.prefill.ttft_ms.median() - 9.0).abs() < 1e-9);
    // Roofline: a pass per measured run (3), each step's fraction 1e8 bytes ÷ the step's time
    // ÷ the probe after it: (10 + k) ms × 1.25 and (20 + k) GB/s for step k; each pass's
    // median, and the median of all, is step 1's. The sweep's probes before (20) and after (25)
    // everything are the header's.
    let want: Vec<f64> = (0..3).map(|k| 1e8 / ((10.0 + k as f64) * 1.25e-3) / ((20.0 + k as f64) * 1e9)).collect();
    assert_eq!(first.decode.probes_gbps, [20.0, 21.0, 22.0].repeat(3));
    assert_eq!(first.decode.step_fractions.len(), 9);
    for (a, b) in first.decode.step_fractions.iter().zip(want.iter().cycle()) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
    assert_eq!(first.decode.pass_fractions.len(), 3);
    for p in &first.decode.pass_fractions {
        assert!((p - want[1]).abs() < 1e-12);
    }
    assert!((first.decode.roofline_fraction - want[1]).abs() < 1e-12);
    assert_eq!(r.roofline.by_threads["2"], 25.0);
    assert_eq!(r.roofline.read_bandwidth_gbps, 25.0);
    assert_eq!(r.roofline.probes_gbps["2"], vec![20.0, 25.0]);
    assert!((r.roofline.probe_spread() - 0.2).abs() < 1e-12);
    // The probes' sizes are recorded: the spec's (1 GiB) and the per-step one.
    assert_eq!(r.roofline.probe_bytes, Some(1 << 30));
    assert_eq!(r.roofline.step_probe_bytes, Some(bitnet_bench::sweep::ROOFLINE_PROBE_BYTES as u64));
    assert_eq!(r.settings.decode_depth, None, "ours decode after their prompt");
    // Quality once per precision; stage shares from the diagnostic run.
    assert_eq!(first.quality.as_ref().unwrap().kl_divergence, 0.001);
    assert_eq!(r.results[2].quality.as_ref().unwrap().kl_divergence, 0.01);
    assert_eq!(first.stages.as_ref().unwrap()["dot"].share, 0.75);
}

#[test]
fn the_report_round_trips_and_validates_against_the_schema() {
    let r = sweep(None);
    let text = serde_json::to_string_pretty(&r).unwrap();
    let back = bitnet_report::parse(&text, "report.json").unwrap();
    assert_eq!(back, r);
    // The committed schema is the one generated from the type.
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/schema.json")).unwrap();
    assert_eq!(
        committed,
        report::schema_json(),
        "reports/schema.json is stale: run `bitnet-bench schema > reports/schema.json`"
    );
}

#[test]
fn malformed_reports_name_the_field() {
    let r = sweep(None);
    let good: serde_json::Value = serde_json::to_value(&r).unwrap();
    type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|v| v["schema_version"] = 99.into()), "schema_version 99"),
        (
            Box::new(|v| v["results"][1]["decode"]["tokens_per_sec"]["n"] = "x".into()),
            "$.results[1].decode.tokens_per_sec.n",
        ),
        (
            Box::new(|v| v["results"][0]["config"].as_object_mut().unwrap().remove("batch").map(|_| ()).unwrap()),
            "$.results[0].config",
        ),
        (
            Box::new(|v| v["results"][0]["prefill"]["ttft_ms"]["samples"] = serde_json::json!([])),
            "$.results[0].prefill.ttft_ms",
        ),
    ];
    for (mutate, needle) in cases {
        let mut v = good.clone();
        mutate(&mut v);
        let e = format!("{:#}", bitnet_report::parse(&v.to_string(), "r.json").unwrap_err());
        assert!(e.contains("r.json") && e.contains(needle), "expected {needle} in: {e}");
    }
    // Summaries are recomputed from the samples: one that says otherwise is read as theirs.
    let mut v = good.clone();
    v["results"][0]["prefill"]["ttft_ms"]["samples"] = serde_json::json!([1.0]);
    let one = bitnet_report::parse(&v.to_string(), "r.json").unwrap();
    assert_eq!(one.results[0].prefill.ttft_ms, bitnet_report::Stat::of(&[1.0]));
    let e = format!("{:#}", bitnet_report::parse("{\"schema_version\": 1, ", "t.json").unwrap_err());
    assert!(e.contains("t.json") && e.contains("not valid JSON"), "{e}");
}

#[test]
fn an_interrupted_sweep_keeps_every_finished_combination() {
    // 4 runs per combination (1 warm-up + 3); stop during the 6th run = in combination 2.
    let r = sweep(Some(6));
    assert!(!r.complete);
    assert_eq!(r.results.len(), 1, "only the finished combination is reported");
    assert_eq!(r.results[0].decode.tokens_per_sec.n(), 3);
    // No closing probe for an interrupted sweep: the opening one is the roofline.
    assert_eq!(r.roofline.probes_gbps["2"], vec![20.0]);
    assert_eq!(r.roofline.by_threads["2"], 20.0);
    let text = serde_json::to_string(&r).unwrap();
    assert!(!bitnet_report::parse(&text, "partial.json").unwrap().complete);
}

fn golden(name: &str, got: &str) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(got, want, "{name} changed; review and rerun with UPDATE_GOLDEN=1");
}

#[test]
fn markdown_and_csv_match_their_golden_files() {
    let r = sweep(None);
    golden("sweep.md", &output::markdown(&r));
    golden("sweep.csv", &output::csv(&r));
    golden("sweep-table.txt", &output::table(&r));
}

#[test]
fn charts_and_page_are_written_for_a_report() {
    let r = sweep(None);
    let scratch = tempfile::Builder::new().prefix("bitnet-bench-plots-").tempdir().unwrap();
    let dir = scratch.path();
    bitnet_bench::page::write_all(&r, dir, &[]).unwrap();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    for f in ["decode_vs_batch.svg", "kv_bytes.svg", "kv_quality.svg", "stages.svg", "roofline.svg", "compute.svg"] {
        let svg = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(svg.contains("<svg"), "{f}");
    }
    // The rooflines as the table's columns: each bar is the result's roofline %, against 100%
    // of its step probes; each compute bar has its own ISA/threads peak drawn across it.
    let roof = std::fs::read_to_string(dir.join("roofline.svg")).unwrap();
    let compute = std::fs::read_to_string(dir.join("compute.svg")).unwrap();
    for x in &r.results {
        let pct = format!(": {:.1}% of the median probe", x.decode.roofline_fraction * 100.0);
        assert!(roof.contains(&pct), "{pct}: {roof}");
    }
    assert!(roof.contains(">100%: the probe's bandwidth</text>"), "{roof}");
    assert_eq!(compute.matches("<title>int8 peak avx512/2: 400 G/s</title>").count(), r.results.len(), "{compute}");
    // One KV precision: its KV bytes and KL are numbers in the table, not one-bar charts.
    let mut one_kv = r.clone();
    one_kv.results.retain(|x| x.config.kv_precision == "f16");
    let charts = bitnet_bench::plots::charts(&one_kv, &[]);
    assert!(!charts.drawn.iter().any(|c| c.0 == "kv_bytes.svg" || c.0 == "kv_quality.svg"));
    assert!(charts.not_drawn.iter().any(|n| n.contains("one precision (f16)")), "{:?}", charts.not_drawn);
    // A line per KV precision, named by it alone: context, kernel and threads are one value.
    let svg = std::fs::read_to_string(dir.join("decode_vs_batch.svg")).unwrap();
    assert!(svg.contains(">KV f16</text>") && svg.contains(">KV int8</text>"), "{svg}");
    assert!(svg.contains("<title>KV int8 ctx 8 i2s t2, batch 4: median "), "the hover names all: {svg}");
    assert_eq!(html.matches("<svg").count(), 6, "every chart inlined: the page needs no other file");
    // One context length: a number in the table, not a one-point chart.
    assert!(!dir.join("latency_vs_context.svg").exists());
    assert!(html.contains("<li>inter-token latency vs context length: one context length (8)"), "{html}");
    // The table as a person reads it: names and units, not CSV column names; values rounded to
    // their interval, the interval shown.
    assert!(!html.contains("decode_tokens_per_sec_median") && !html.contains("_ci95_"), "raw CSV names");
    assert!(html.contains(">tg<br><small>tokens/s</small></th>"), "named with its unit");
    let tg = &r.results[0].decode.tokens_per_sec;
    let cell = bitnet_report::html::with_ci(tg.median(), tg.ci95_low(), tg.ci95_high());
    assert!(cell.contains(" ± ") && html.contains(&format!(">{cell}</td>")), "{cell}");
    // Nothing fetched (the SVG namespace URI is a name, not a fetch).
    for fetch in ["src=\"http", "href=\"http", "<link", "@import", "url(http"] {
        assert!(!html.contains(fetch), "{fetch}");
    }
    // The structure is pinned (the charts' SVG aside: their coordinates follow the timings).
    bitnet_bench::page::write_all(&r, dir, &[dir.join("report.json")]).unwrap();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let mut structure = String::new();
    let mut rest = html.as_str();
    while let Some(i) = rest.find("<svg") {
        structure.push_str(&rest[..i]);
        structure.push_str("<svg/>");
        rest = &rest[i + rest[i..].find("</svg>").expect("closed") + "</svg>".len()..];
    }
    structure.push_str(rest);
    golden("page.html", &structure);
}

#[test]
fn a_model_name_with_a_comma_stays_in_its_cell_of_the_page() {
    // Every row but the last of the odd model, so the model column stays in the table.
    let mut r = sweep(None);
    let n = r.results.len();
    for x in &mut r.results[..n - 1] {
        x.config.model = "bitnet, \"2B\"".into();
    }
    let scratch = tempfile::Builder::new().prefix("bitnet-bench-plots-comma-").tempdir().unwrap();
    let dir = scratch.path();
    bitnet_bench::page::write_all(&r, dir, &[]).unwrap();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    // kernel, isa, threads and context are the same on every row: said once above the table.
    assert!(html.contains(
        "<p class=\"shared\">Every row: kernel <b>i2s</b> · isa <b>avx512</b> · threads <b>2</b> · context <b>8</b></p>"
    ));
    let columns = bitnet_bench::page::results_table(&r).columns.len() - 4;
    let rows: Vec<&str> = html.lines().filter(|l| l.starts_with("<tr><td")).collect();
    assert_eq!(rows.len(), n);
    for row in &rows[..n - 1] {
        assert_eq!(row.matches("<td").count(), columns, "{row}");
        assert!(row.starts_with("<tr><td>bitnet, &quot;2B&quot;</td><td class=\"num\" data-v=\""), "{row}");
    }
    // One model on every row: hoisted too, escaped there.
    for x in &mut r.results {
        x.config.model = "bitnet, \"2B\" <i>".into();
    }
    bitnet_bench::page::write_all(&r, dir, &[]).unwrap();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("Every row: model <b>bitnet, &quot;2B&quot; &lt;i&gt;</b> · kernel"), "{html}");
    // The CSV quotes it: a CSV reader gets the same cells.
    assert!(output::csv(&r).lines().nth(1).unwrap().starts_with("\"bitnet, \"\"2B\"\" <i>\",i2s,"));
}

#[test]
fn the_latency_chart_draws_every_kv_precision_at_the_smallest_batch() {
    let latency = |r: &Report| {
        let charts = bitnet_bench::plots::charts(r, &[]);
        let (_, title, svg) = charts.drawn.into_iter().find(|c| c.0 == "latency_vs_context.svg").unwrap();
        (title, svg)
    };
    // The first result int8, as in a `show` of our int8 run beside llama-bench's f16 one: the
    // chart had drawn the first result's precision only. Two context lengths, so there is an
    // axis to draw.
    let mut r = sweep(None);
    let longer: Vec<_> = r
        .results
        .iter()
        .map(|x| {
            let mut y = x.clone();
            y.config.context_length *= 2;
            y
        })
        .collect();
    r.results.extend(longer);
    r.results.sort_by_key(|x| x.config.kv_precision != "int8");
    let (title, svg) = latency(&r);
    assert_eq!(title, "Inter-token latency vs context length (batch 1)");
    for label in ["p50 KV int8", "p99 KV int8", "p50 KV f16", "p99 KV f16"] {
        assert!(svg.contains(&format!(">{label}</text>")), "{label} missing");
    }
    assert!(!svg.contains("p90"), "two kinds of run: p50 and p99 each");
    // One kind of run: a line per percentile, the precision in the title.
    r.results.retain(|x| x.config.kv_precision == "f16");
    let (title, svg) = latency(&r);
    assert_eq!(title, "Inter-token latency vs context length (batch 1, KV f16)");
    for label in ["p50", "p90", "p95", "p99"] {
        assert!(svg.contains(&format!(">{label}</text>")), "{label} missing");
    }
}

#[test]
fn a_sweep_interrupted_in_its_first_combination_still_gets_a_page() {
    // Stopped in the 2nd run of the first combination: nothing finished.
    let r = sweep(Some(2));
    assert!(r.results.is_empty() && !r.complete);
    let scratch = tempfile::Builder::new().prefix("bitnet-bench-plots-empty-").tempdir().unwrap();
    let dir = scratch.path();
    bitnet_bench::page::write_all(&r, dir, &[]).unwrap();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains(">tg<br><small>tokens/s</small></th>"), "the table header is there");
    assert!(html.contains("class=\"note\">Incomplete"), "and says why it is empty");
    assert_eq!(html.matches("<svg").count(), 0, "no empty charts");
    assert!(!dir.join("decode_vs_batch.svg").exists());
}

#[test]
fn every_schema_field_is_documented_in_reports_readme() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/");
    let schema: serde_json::Value = serde_json::from_str(&report::schema_json()).unwrap();
    let readme = std::fs::read_to_string(format!("{root}README.md")).unwrap();
    let mut objects = vec![("Report".to_string(), &schema)];
    for (name, d) in schema["$defs"].as_object().unwrap() {
        objects.push((name.clone(), d));
    }
    for (name, d) in objects {
        assert!(readme.contains(&format!("### `{name}`")), "reports/README.md has no section for {name}");
        for field in d["properties"].as_object().map(|m| m.keys().collect::<Vec<_>>()).unwrap_or_default() {
            assert!(readme.contains(&format!("| `{field}` |")), "reports/README.md does not document {name}.{field}");
        }
    }
}

#[test]
fn committed_baselines_are_valid_complete_and_of_the_isa_they_name() {
    // CI diffs against these; a stale or hand-edited baseline would make every diff meaningless.
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !(name.starts_with("baseline-") && name.ends_with(".json")) {
            continue;
        }
        seen += 1;
        let r = bitnet_report::load(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(r.complete && !r.results.is_empty(), "{name}: incomplete or empty");
        assert!(readme.contains(&format!("`{name}`")), "reports/README.md does not describe {name}");
        // `baseline-quick-avx2.json` holds AVX2 results only; the unsuffixed ones AVX-512.
        let isa = if name.ends_with("-avx2.json") { "avx2" } else { "avx512" };
        assert!(r.results.iter().all(|x| x.config.isa == isa), "{name}: results of another ISA than {isa}");
    }
    assert!(seen >= 4, "expected the default and quick baselines of both ISAs, found {seen}");
}

#[test]
fn a_value_given_twice_is_swept_once() {
    // `--batch-sizes 1,1-4` gives 1 twice; a report holds each configuration once.
    let once = bitnet_bench::sweep::combos(&spec()).unwrap();
    let mut s = spec();
    s.batch_sizes = s.batch_sizes.iter().chain(&s.batch_sizes).copied().collect();
    s.threads = s.threads.iter().chain(&s.threads).copied().collect();
    assert_eq!(bitnet_bench::sweep::combos(&s).unwrap(), once);
}

#[test]
fn bytes_per_step_is_the_mean_over_the_steps_kv_positions() {
    // Step i of n decodes position ctx + i and attends over ctx + i + 1 cached rows.
    let spec = SweepSpec { model: "tiny".into(), threads: vec![1], kernels: vec![KernelFamily::I2s], ..spec() };
    let mut runner = bitnet_bench::sweep::EngineRunner::load(&spec).unwrap();
    let kernel = Kernel::new(KernelFamily::I2s, IsaLevel::Scalar, KernelForm::Fused).unwrap();
    let combo = Combo { kernel, batch: 2, context_length: 8, kv: KvPrecision::Int8, threads: 1 };
    let p = runner.prepare(&combo, 4).unwrap();
    let cfg = &runner.model().config;
    let kv_pp = 2 * KvPrecision::Int8.bytes_per_token(cfg) as u64;
    assert_eq!(p.kv_bytes_per_position, kv_pp);
    let weights = runner.model().weights.bytes_read_per_step_by(Some(kernel), 2) as u64;
    // Rows read: 9, 10, 11, 12; mean 10.5.
    assert_eq!(p.bytes_per_step, weights + kv_pp * 21 / 2);
    assert_eq!(p.repack_bytes, 0);
}

#[test]
fn pinning_more_threads_than_cores_is_refused_before_anything_runs() {
    let stop = AtomicBool::new(false);
    let mut runner = FakeRunner { combo: None, runs: 0, probes: 0, stop_after_runs: None };
    let cores = bitnet_engine::pool::pinnable_cores();
    let s = SweepSpec { pin: true, threads: vec![1, cores + 1], ..spec() };
    let e = run_sweep(&s, &mut runner, &stop, |_| Ok(())).unwrap_err().to_string();
    assert!(
        e.contains(&format!("--pin with --threads {}", cores + 1)) && e.contains(&format!("{cores} core(s)")),
        "{e}"
    );
    assert_eq!((runner.runs, runner.probes), (0, 0), "refused before any probe or run");
    // Unpinned, the same threads are fine (the fake runner has no cores to share).
    let s = SweepSpec { pin: false, threads: vec![1, cores + 1], quality_positions: 0, trace: false, ..spec() };
    assert!(run_sweep(&s, &mut runner, &stop, |_| Ok(())).is_ok());
}

#[test]
fn a_lookup_form_above_its_batch_limit_counts_the_blocks_the_fused_form_reads() {
    // Batches over LUT_MAX_BATCH run the fused form (`Kernel::for_batch`), which reads the
    // TQ1_0 blocks, not the lookup repack: the step's bytes must say so.
    let spec = SweepSpec { model: "tiny".into(), threads: vec![1], kernels: vec![KernelFamily::Tq1], ..spec() };
    let mut runner = bitnet_bench::sweep::EngineRunner::load(&spec).unwrap();
    if !IsaLevel::Avx2.testable() {
        return;
    }
    let lut = Kernel::new(KernelFamily::Tq1, IsaLevel::Avx2, KernelForm::Lut).unwrap();
    let fused = Kernel::new(KernelFamily::Tq1, IsaLevel::Avx2, KernelForm::Fused).unwrap();
    let max = bitnet_engine::matmul::LUT_MAX_BATCH;
    for (batch, runs) in [(1, lut), (max, lut), (max + 1, fused)] {
        let combo = Combo { kernel: lut, batch, context_length: 8, kv: KvPrecision::F16, threads: 1 };
        let p = runner.prepare(&combo, 4).unwrap();
        let weights = runner.model().weights.bytes_read_per_step_by(Some(runs), 1) as u64;
        assert_eq!(p.bytes_per_step, weights + p.kv_bytes_per_position * 21 / 2, "batch {batch}");
    }
    let w = &runner.model().weights;
    assert_ne!(w.bytes_read_per_step_by(Some(lut), 1), w.bytes_read_per_step_by(Some(fused), 1));
    assert_eq!(w.bytes_read_per_step_by(Some(lut), max + 1), w.bytes_read_per_step_by(Some(fused), 1));
}

#[test]
fn the_avx2_tq2_kernel_reports_its_code_copy() {
    // It holds and reads 64 bytes per 256 weights of every linear (the tiny preset's rows have
    // one scale each), where the blocks are 66.
    let spec = SweepSpec { model: "tiny".into(), threads: vec![1], kernels: vec![KernelFamily::Tq2], ..spec() };
    let mut runner = bitnet_bench::sweep::EngineRunner::load(&spec).unwrap();
    if !IsaLevel::Avx2.testable() {
        return;
    }
    let kernel = Kernel::new(KernelFamily::Tq2, IsaLevel::Avx2, KernelForm::Fused).unwrap();
    let combo = Combo { kernel, batch: 1, context_length: 8, kv: KvPrecision::F16, threads: 1 };
    let p = runner.prepare(&combo, 4).unwrap();
    let w = &runner.model().weights;
    assert_eq!(p.repack_bytes as usize * 66, w.linear_bytes() * 64);
    let split = Kernel::new(KernelFamily::Tq2, IsaLevel::Avx2, KernelForm::Split).unwrap();
    let read = |k| w.bytes_read_per_step_by(Some(k), 1);
    assert_eq!(read(split) - read(kernel), w.linear_bytes() - p.repack_bytes as usize);
}

#[test]
fn each_roofline_step_is_over_its_own_kv_bytes() {
    // Steps whose times grow with their KV bytes at a constant probe run at one fraction of
    // it: every step fraction, and so their median, is that fraction.
    let kernel = Kernel::new(KernelFamily::I2s, IsaLevel::Scalar, KernelForm::Fused).unwrap();
    let combo = Combo { kernel, batch: 1, context_length: 100, kv: KvPrecision::F16, threads: 1 };
    let prepared = Prepared {
        weight_bytes: 0,
        repack_bytes: 0,
        kv_cache_bytes: 0,
        bytes_per_step: 50_000_000,
        kv_bytes_per_position: 1_000_000,
        macs_per_step: 0,
        prefill_macs: 0,
    };
    let (n, gbps, fraction) = (8usize, 20.0, 0.8);
    let mid = (n as f64 - 1.0) / 2.0;
    let step_bytes = |i: usize| 50e6 + 1e6 * (i as f64 - mid);
    let pass = RooflinePass {
        step_secs: (0..n).map(|i| step_bytes(i) / (fraction * gbps * 1e9)).collect(),
        probe_gbps: vec![gbps; n],
    };
    let sample = RunSample { prefill_secs: 1.0, ttft_secs: 1.0, decode_step_secs: pass.step_secs.clone() };
    // A second pass at half the fraction (twice the step times): its own median.
    let slow = RooflinePass { step_secs: pass.step_secs.iter().map(|t| 2.0 * t).collect(), ..pass.clone() };
    let passes = [pass, slow];
    let r = bitnet_bench::sweep::summarize(&combo, "m", &prepared, &[sample], &passes, None, Diagnostics::default());
    assert_eq!(r.decode.step_fractions.len(), 2 * n);
    for (i, f) in r.decode.step_fractions.iter().enumerate() {
        let want = if i < n { fraction } else { fraction / 2.0 };
        assert!((f - want).abs() < 1e-12, "{:?}", r.decode.step_fractions);
    }
    assert_eq!(r.decode.pass_fractions.len(), 2);
    assert!((r.decode.pass_fractions[0] - fraction).abs() < 1e-12);
    assert!((r.decode.pass_fractions[1] - fraction / 2.0).abs() < 1e-12);
}

/// Quality measured on random token ids or weights is not shown as a quality figure: the table
/// and Markdown say `synthetic`, the CSV keeps the values beside their source, and no chart
/// draws them.
#[test]
fn synthetic_quality_is_labelled_not_shown_as_an_estimate() {
    let mut r = sweep(None);
    for x in &mut r.results {
        let q = x.quality.as_mut().unwrap();
        q.source = "synthetic".into();
        q.text = None;
        q.perplexity_f32 = None;
        q.perplexity = None;
    }
    for t in [output::table(&r), output::markdown(&r)] {
        assert!(t.contains("synthetic"), "{t}");
        assert!(!t.contains("/ 90%"), "a synthetic figure printed as an estimate: {t}");
    }
    let csv = output::csv(&r);
    let row = csv.lines().nth(1).unwrap();
    assert!(row.ends_with(",synthetic,,"), "{row}");
    let scratch = tempfile::Builder::new().prefix("bitnet-synthetic-plots-").tempdir().unwrap();
    let dir = scratch.path();
    bitnet_bench::page::write_all(&r, dir, &[]).unwrap();
    assert!(!dir.join("kv_quality.svg").exists());
}

#[test]
fn a_traced_sweep_links_each_rows_flamegraph_and_timeline_from_the_page() {
    let stop = AtomicBool::new(false);
    let mut runner = FakeRunner { combo: None, runs: 0, probes: 0, stop_after_runs: None };
    let scratch = tempfile::Builder::new().prefix("bitnet-bench-flame-").tempdir().unwrap();
    let dir = scratch.path();
    let mut traces = Vec::new();
    let r = run_sweep(&spec(), &mut runner, &stop, |p| {
        if let Progress::Done { result, traced, .. } = p {
            let traced = traced.expect("--trace passes the traced run on");
            traces.push(Some(bitnet_bench::page::write_traced(dir, result, traced)?));
        }
        Ok(())
    })
    .unwrap();
    bitnet_bench::page::write_all_traced(&r, dir, &[], &traces).unwrap();
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let rows: Vec<&str> = html.lines().filter(|l| l.starts_with("<tr><td")).collect();
    assert_eq!(rows.len(), r.results.len());
    for (row, x) in rows.iter().zip(&r.results) {
        let c = &x.config;
        let name = format!("i2s-{}-t2-b{}-c8-{}", c.isa, c.batch, c.kv_precision);
        assert!(
            row.ends_with(&format!(
                "<td><a href=\"traces/{name}.svg\">svg</a></td><td><a href=\"traces/{name}.trace.json\">trace.json</a></td></tr>"
            )),
            "{row}"
        );
        let svg = std::fs::read_to_string(dir.join(format!("traces/{name}.svg"))).unwrap();
        assert!(svg.contains("unpack") && svg.contains("ffn.down"), "the graph draws the stacks");
        let folded = std::fs::read_to_string(dir.join(format!("traces/{name}.folded"))).unwrap();
        assert_eq!(folded, "decode;layer.00;ffn.down;dot 300\ndecode;layer.00;ffn.down;unpack 100\n");
        let timeline = std::fs::read_to_string(dir.join(format!("traces/{name}.trace.json"))).unwrap();
        assert_eq!(timeline, "{\"traceEvents\": []}");
    }
    assert!(html.contains(">flamegraph</th>") && html.contains(">timeline</th>"));
    // A run that recorded no spans (an engine built without them) has no graph to draw: an
    // error naming it (the sweep warns and goes on), and no file half-written.
    let empty = tempfile::Builder::new().prefix("bitnet-bench-flame-empty-").tempdir().unwrap();
    let err = bitnet_bench::page::write_traced(empty.path(), &r.results[0], &Traced::default()).unwrap_err();
    assert!(format!("{err:#}").contains("no spans were recorded"), "{err:#}");
    assert_eq!(std::fs::read_dir(empty.path().join("traces")).unwrap().count(), 0);
    // Without --trace: no column, no stacks passed on.
    let mut untraced = spec();
    untraced.trace = false;
    let mut runner = FakeRunner { combo: None, runs: 0, probes: 0, stop_after_runs: None };
    run_sweep(&untraced, &mut runner, &stop, |p| {
        if let Progress::Done { traced, .. } = p {
            assert!(traced.is_none());
        }
        Ok(())
    })
    .unwrap();
    bitnet_bench::page::write_all(&r, dir, &[]).unwrap();
    assert!(!std::fs::read_to_string(dir.join("index.html")).unwrap().contains(">flamegraph</th>"));
}
