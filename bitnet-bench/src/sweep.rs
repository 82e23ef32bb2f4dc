//! The model sweep: every combination of kernel × threads × KV precision × context length ×
//! batch size, each warmed up and measured `repeat` times, with statistics, roofline and
//! quality. The engine sits behind the [`Runner`] seam so statistics, the report and the
//! interrupt path are tested without timing noise.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bitnet_engine::formats::tq1_lut::lut_table_bytes;
use bitnet_engine::formats::tq1_perm::perm_table_bytes;
use bitnet_engine::gguf::ModelSource;
use bitnet_engine::instrument::{Level, Phase};
use bitnet_engine::matmul::LUT_MAX_BATCH;
use bitnet_engine::model::{argmax, kv_quality, prefill, FfnActivation};
use bitnet_engine::probes::bandwidth::{measure_read_bandwidth, ProbeBuffer};
use bitnet_engine::probes::compute_peak;
use bitnet_engine::{IsaLevel, Kernel, KernelFamily, KvPrecision, LogitsFor, Model, State, StateOptions, WeightFormat};

use crate::system::{available_memory, fingerprint, peak_rss};
use bitnet_report::report::{
    BenchResult, Config, Decode, Memory, ModelInfo, Prefill, Quality, Report, Settings, StageShare, Tool,
    SCHEMA_VERSION,
};
use bitnet_report::roofline::{peak_key, roofline_fraction, Roofline};
use bitnet_report::stats::{median, Latency, Stat};

/// What to sweep.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    pub model: String,
    /// Overrides the FFN activation the file or preset gives (`--ffn-activation`).
    pub ffn_activation: Option<FfnActivation>,
    /// Synthetic weight format of a preset (default: the first kernel's native format).
    pub format: Option<WeightFormat>,
    pub batch_sizes: Vec<usize>,
    pub context_lengths: Vec<usize>,
    pub kv_precisions: Vec<KvPrecision>,
    pub threads: Vec<usize>,
    /// Empty: the family made for the model's weights (a GGUF file's format; a preset's
    /// `format`, else I2_S), which [`EngineRunner::load`] picks ([`EngineRunner::kernels`]);
    /// [`run_sweep`] needs the list filled in.
    pub kernels: Vec<KernelFamily>,
    pub isa: Option<IsaLevel>,
    pub max_new_tokens: usize,
    pub warmup: usize,
    pub repeat: usize,
    pub seed: u64,
    /// Stage breakdown of one extra (unmeasured) run per combination.
    pub trace: bool,
    /// Counters of that extra run.
    pub counters: bool,
    /// Positions of the KV quality measurement (0 = none).
    pub quality_positions: usize,
    /// Real text for the KV quality measurement, tokenized by the model that measures it;
    /// without it a preset is measured on the committed trained model and its held-out text
    /// ([`crate::trained::quality_default`]), and a GGUF model on random token ids (`synthetic`).
    pub quality_text: Option<std::path::PathBuf>,
    /// The GGUF model (with a tokenizer) the quality is measured on, when not the swept model.
    pub quality_model: Option<std::path::PathBuf>,
    pub pin: bool,
    /// Bytes the bandwidth probe reads.
    pub probe_bytes: usize,
}

/// The default sweep: a real-shaped preset, batch sizes × context lengths × three KV
/// precisions, in under two minutes on a 2-core machine.
impl Default for SweepSpec {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Self {
            model: "bitnet-b1.58-large".into(),
            ffn_activation: None,
            format: None,
            batch_sizes: vec![1, 4],
            context_lengths: vec![32, 128],
            kv_precisions: vec![KvPrecision::F16, KvPrecision::Int8, KvPrecision::Int4],
            threads: vec![threads],
            kernels: Vec::new(),
            isa: None,
            max_new_tokens: 16,
            warmup: 1,
            repeat: 3,
            seed: 42,
            trace: false,
            counters: false,
            quality_positions: 256,
            quality_text: None,
            quality_model: None,
            pin: false,
            probe_bytes: 1 << 30,
        }
    }
}

impl SweepSpec {
    /// A smoke sweep (`--quick`): one batch size, one short context, two KV precisions, a few
    /// tokens and a small bandwidth probe, to check in seconds that everything runs end to end.
    /// CI and the committed baselines run it, so its settings live here and not in the binary.
    pub fn quick() -> Self {
        Self {
            batch_sizes: vec![1],
            context_lengths: vec![16],
            kv_precisions: vec![KvPrecision::F16, KvPrecision::Int8],
            max_new_tokens: 4,
            warmup: 1,
            repeat: 2,
            quality_positions: 16,
            probe_bytes: 64 << 20,
            ..Self::default()
        }
    }
}

/// One combination to measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Combo {
    pub kernel: Kernel,
    pub batch: usize,
    pub context_length: usize,
    pub kv: KvPrecision,
    pub threads: usize,
}

/// Sizes of a combination, known before it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prepared {
    pub weight_bytes: u64,
    /// Bytes the kernels hold beside the weights ([`bitnet_engine::model::Weights::repack_bytes`],
    /// and [`bitnet_engine::model::Weights::head_repack_bytes`] for the LM head).
    pub repack_bytes: u64,
    pub kv_cache_bytes: u64,
    /// Bytes a decode step reads, the mean over the run's steps (the KV cache grows by a
    /// position a step).
    pub bytes_per_step: u64,
    /// KV bytes read per cached position in a step, all sequences: step i of n reads
    /// `bytes_per_step + kv_bytes_per_position × (i − (n − 1)/2)`.
    pub kv_bytes_per_position: u64,
    /// Multiply-adds of a decode step (linear layers and head, every sequence).
    pub macs_per_step: u64,
    /// Multiply-adds of a run's prefill (every prompt token through the linear layers, the
    /// head once per sequence).
    pub prefill_macs: u64,
}

/// One measured run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunSample {
    pub prefill_secs: f64,
    /// Prefill plus choosing the first token.
    pub ttft_secs: f64,
    pub decode_step_secs: Vec<f64>,
}

/// A roofline pass: decode steps, each followed by a short bandwidth probe with the same
/// threads (see [`Runner::roofline_pass`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RooflinePass {
    pub step_secs: Vec<f64>,
    /// GB/s of the probe right after each step.
    pub probe_gbps: Vec<f64>,
}

/// Bytes of each probe of a roofline pass: 4× the L3 of the machines we target, so it reads
/// DRAM, and a few milliseconds, so that it sees the bandwidth of the step it follows.
pub const ROOFLINE_PROBE_BYTES: usize = 128 << 20;

/// Stage times and counters of a diagnostic run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Diagnostics {
    /// Decode ns per step per stage, summed over threads.
    pub stages: Option<BTreeMap<String, f64>>,
    /// Counter values per decode step.
    pub counters: Option<BTreeMap<String, f64>>,
    /// What the traced run recorded (`--trace`).
    pub traced: Option<Traced>,
}

/// A combination's traced run (prefill and decode), as files a profiler reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Traced {
    /// Folded stacks, nanoseconds summed over threads (the flamegraph's input).
    pub folded: String,
    /// The timeline in Chrome's trace-event JSON (Perfetto, chrome://tracing).
    pub timeline: String,
}

/// Events a traced run keeps per thread for its timeline, from its start (more are counted in
/// the file's `otherData.overflow_events`, not kept): the prefill and the first decode steps
/// (a large-preset step records ~2000 per thread), at most ~3 MB of JSON per thread.
pub const TIMELINE_EVENTS: usize = 16_384;

/// The measurement seam: the engine in production, a fake in tests.
pub trait Runner {
    fn model_info(&self) -> ModelInfo;
    fn max_context(&self) -> usize;
    /// Bytes a state for `combo` would allocate (KV cache and buffers), for the memory check.
    fn estimate_bytes(&self, combo: &Combo, max_new: usize) -> u64;
    fn bandwidth_gbps(&mut self, threads: usize) -> Result<f64>;
    /// The int8 multiply-add peak (G/s) of `threads` threads at `isa`; `None` where there is
    /// none to measure (scalar).
    fn int8_peak_gmacs(&mut self, isa: IsaLevel, threads: usize) -> Result<Option<f64>>;
    fn prepare(&mut self, combo: &Combo, max_new: usize) -> Result<Prepared>;
    fn run(&mut self, max_new: usize) -> Result<RunSample>;
    /// Another run whose decode steps each have a bandwidth probe right after them, for the
    /// roofline fraction: on a shared machine the bandwidth can jump between levels every few
    /// seconds, so probes seconds away from a step say little about it.
    /// With `reuse_prompt`, decodes again after the last run's prompt (its KV rows are still in
    /// the cache) instead of prefilling it anew.
    fn roofline_pass(&mut self, max_new: usize, reuse_prompt: bool) -> Result<RooflinePass>;
    fn diagnose(&mut self, max_new: usize, trace: bool, counters: bool) -> Result<Diagnostics>;
    fn quality(&mut self, kv: KvPrecision, positions: usize, threads: usize) -> Result<Quality>;
}

/// Every combination, in a stable order (kernel, threads, KV, context, batch).
pub fn combos(spec: &SweepSpec) -> Result<Vec<Combo>> {
    if spec.kernels.is_empty() {
        bail!("--kernels: no kernel family to sweep (EngineRunner::kernels gives the one for the model)");
    }
    let mut v = Vec::new();
    for &family in &spec.kernels {
        let isa = match spec.isa {
            Some(i) => i,
            None => family.isa_levels().iter().rev().copied().find(|l| l.is_supported()).unwrap_or(IsaLevel::Scalar),
        };
        let kernel =
            Kernel::new(family, isa, family.default_form(isa)).with_context(|| format!("--kernels {family}"))?;
        for &threads in &spec.threads {
            for &kv in &spec.kv_precisions {
                for &context_length in &spec.context_lengths {
                    for &batch in &spec.batch_sizes {
                        let c = Combo { kernel, batch, context_length, kv, threads };
                        // A value given twice (`--batch-sizes 1,1-4`) is run once: a report
                        // holds each configuration once.
                        if !v.contains(&c) {
                            v.push(c);
                        }
                    }
                }
            }
        }
    }
    Ok(v)
}

/// Checks that every combination fits the model and this machine before anything runs.
pub fn preflight(spec: &SweepSpec, runner: &dyn Runner, combos: &[Combo]) -> Result<()> {
    for (flag, v) in [("--max-new-tokens", spec.max_new_tokens), ("--repeat", spec.repeat)] {
        if v == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    for t in spec.threads.iter().filter(|_| spec.pin) {
        bitnet_engine::pool::check_pinnable(*t)
            .map_err(|e| anyhow::anyhow!("--pin with --threads {t}: {e} (lower --threads or drop --pin)"))?;
    }
    let max = runner.max_context();
    if let Some(c) = spec.context_lengths.iter().find(|c| **c + spec.max_new_tokens > max) {
        bail!(
            "--context-lengths {c}: {c} prompt + {} new tokens exceeds the model's maximum context of {max}",
            spec.max_new_tokens
        );
    }
    if let Some(avail) = available_memory() {
        let weights = runner.model_info().weight_bytes;
        if let Some(worst) = combos.iter().max_by_key(|c| runner.estimate_bytes(c, spec.max_new_tokens)) {
            let need = runner.estimate_bytes(worst, spec.max_new_tokens);
            // Leave a tenth of what is available to the OS and the rest of the process.
            if need as f64 > 0.9 * avail as f64 {
                bail!(
                    "--batch-sizes {} with --context-lengths {} and --kv-precisions {} needs about {:.1} GiB for the KV cache and buffers (weights: {:.1} GiB, already loaded) but {:.1} GiB are available",
                    worst.batch,
                    worst.context_length,
                    worst.kv,
                    need as f64 / (1u64 << 30) as f64,
                    weights as f64 / (1u64 << 30) as f64,
                    avail as f64 / (1u64 << 30) as f64
                );
            }
        }
    }
    Ok(())
}

/// What the sweep reports as it goes.
pub enum Progress<'a> {
    /// About to measure combination `index` of `total`.
    Start { index: usize, total: usize, combo: &'a Combo },
    /// Finished it; the report now holds it. `traced`: its traced run (`--trace`).
    Done { index: usize, total: usize, result: &'a BenchResult, report: &'a Report, traced: Option<&'a Traced> },
}

/// UTC now in RFC 3339 (seconds).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The tool section of reports this build writes.
pub fn tool() -> Tool {
    let commit = env!("BITNET_GIT_COMMIT");
    let dirty = env!("BITNET_GIT_DIRTY");
    Tool {
        name: "bitnet-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        git_commit: (!commit.is_empty()).then(|| commit.to_string()),
        git_dirty: match dirty {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
    }
}

/// Runs the sweep. `stop` is checked before every run: when set, the combination in progress
/// is dropped and the report returned with `complete: false` and every finished combination.
pub fn run_sweep(
    spec: &SweepSpec,
    runner: &mut dyn Runner,
    stop: &AtomicBool,
    mut progress: impl FnMut(Progress<'_>) -> Result<()>,
) -> Result<Report> {
    let combos = combos(spec)?;
    preflight(spec, runner, &combos)?;
    let mut by_threads = BTreeMap::new();
    let mut probes_gbps = BTreeMap::new();
    let mut threads_sorted = spec.threads.clone();
    threads_sorted.sort();
    threads_sorted.dedup();
    for &t in &threads_sorted {
        let gbps = runner.bandwidth_gbps(t).context("bandwidth probe")?;
        by_threads.insert(t.to_string(), gbps);
        probes_gbps.insert(t.to_string(), vec![gbps]);
    }
    let max_t = *threads_sorted.last().context("--threads: needs at least one value")?;
    let isa_used: Vec<IsaLevel> = combos.iter().map(|c| c.kernel.isa()).collect();
    // The compute roofline of every ISA and thread count the combinations run.
    let mut peak_cases: Vec<(IsaLevel, usize)> = combos.iter().map(|c| (c.kernel.isa(), c.threads)).collect();
    peak_cases.sort();
    peak_cases.dedup();
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        complete: false,
        created_at: now_rfc3339(),
        tool: tool(),
        system: fingerprint(&isa_used, spec.pin),
        model: runner.model_info(),
        settings: Settings {
            warmup: spec.warmup,
            repeat: spec.repeat,
            max_new_tokens: spec.max_new_tokens,
            seed: spec.seed,
            decode_depth: None,
        },
        roofline: Roofline {
            read_bandwidth_gbps: by_threads[&max_t.to_string()],
            threads: max_t,
            by_threads,
            probes_gbps,
            int8_peak_gmacs: BTreeMap::new(),
            int8_peak_probes: BTreeMap::new(),
            probe_bytes: Some(spec.probe_bytes as u64),
            step_probe_bytes: Some(ROOFLINE_PROBE_BYTES as u64),
        },
        results: Vec::new(),
    };
    probe_peaks(runner, &peak_cases, &mut report.roofline, "compute probe")?;
    let mut quality_cache: BTreeMap<(String, usize), Quality> = BTreeMap::new();
    let total = combos.len();
    'combos: for (index, combo) in combos.iter().enumerate() {
        progress(Progress::Start { index, total, combo })?;
        let prepared = runner.prepare(combo, spec.max_new_tokens)?;
        let mut samples = Vec::with_capacity(spec.repeat);
        for i in 0..spec.warmup + spec.repeat {
            if stop.load(Ordering::SeqCst) {
                break 'combos;
            }
            let s = runner.run(spec.max_new_tokens)?;
            if i >= spec.warmup {
                samples.push(s);
            }
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        // A roofline pass per measured run: the runs, not one run's steps, are the independent
        // samples `bitnet-diff` tests (`pass_fractions`).
        let mut passes = Vec::with_capacity(spec.repeat);
        for i in 0..spec.repeat {
            passes.push(runner.roofline_pass(spec.max_new_tokens, i > 0).context("roofline pass")?);
        }
        let mut diag = if spec.trace || spec.counters {
            runner.diagnose(spec.max_new_tokens, spec.trace, spec.counters)?
        } else {
            Diagnostics::default()
        };
        let quality = if spec.quality_positions > 0 {
            let key = (format!("{} {}", combo.kernel.name(), combo.kv.name()), combo.threads);
            if !quality_cache.contains_key(&key) {
                let q = runner.quality(combo.kv, spec.quality_positions, combo.threads)?;
                quality_cache.insert(key.clone(), q);
            }
            quality_cache.get(&key).cloned()
        } else {
            None
        };
        let traced = diag.traced.take();
        let result = summarize(combo, &report.model.name, &prepared, &samples, &passes, quality, diag);
        report.results.push(result);
        report.refresh_derived();
        let last = report.results.last().expect("just pushed");
        progress(Progress::Done { index, total, result: last, report: &report, traced: traced.as_ref() })?;
    }
    report.complete = report.results.len() == total;
    if report.complete {
        // Probe again: the machine's bandwidth moves, and the roofline is the higher figure.
        for &t in &threads_sorted {
            let key = t.to_string();
            let gbps = runner.bandwidth_gbps(t).context("bandwidth probe after the runs")?;
            report.roofline.probes_gbps.entry(key.clone()).or_default().push(gbps);
            report.roofline.raise(&key, gbps);
        }
        probe_peaks(runner, &peak_cases, &mut report.roofline, "compute probe after the runs")?;
        report.refresh_derived();
    }
    Ok(report)
}

/// Probes the int8 peak of every (ISA, threads) in `cases` and raises `roofline`'s figures to
/// what it measured (levels without a peak, scalar, are skipped).
fn probe_peaks(
    runner: &mut dyn Runner,
    cases: &[(IsaLevel, usize)],
    roofline: &mut Roofline,
    what: &str,
) -> Result<()> {
    for &(isa, t) in cases {
        if let Some(g) = runner.int8_peak_gmacs(isa, t).context(what.to_string())? {
            let key = peak_key(isa.name(), t);
            roofline.int8_peak_probes.entry(key.clone()).or_default().push(g);
            roofline.raise_peak(&key, g);
        }
    }
    Ok(())
}

/// The statistics of one combination's runs (the fractions derived from them and the roofline
/// are [`Report::refresh_derived`]'s, once the result is in its report).
pub fn summarize(
    combo: &Combo,
    model: &str,
    prepared: &Prepared,
    samples: &[RunSample],
    passes: &[RooflinePass],
    quality: Option<Quality>,
    diag: Diagnostics,
) -> BenchResult {
    let b = combo.batch as f64;
    let pp: Vec<f64> = samples.iter().map(|s| b * combo.context_length as f64 / s.prefill_secs).collect();
    let ttft: Vec<f64> = samples.iter().map(|s| s.ttft_secs * 1e3).collect();
    let tg: Vec<f64> =
        samples.iter().map(|s| b * s.decode_step_secs.len() as f64 / s.decode_step_secs.iter().sum::<f64>()).collect();
    let lat: Vec<f64> = samples.iter().flat_map(|s| s.decode_step_secs.iter().map(|t| t * 1e3)).collect();
    // Each step over its own bytes (its position's KV rows), its time and the probe after it.
    let fractions = |pass: &RooflinePass| -> Vec<f64> {
        let mid = (pass.step_secs.len() as f64 - 1.0) / 2.0;
        pass.step_secs
            .iter()
            .zip(&pass.probe_gbps)
            .enumerate()
            .map(|(i, (t, g))| {
                let bytes = prepared.bytes_per_step as f64 + prepared.kv_bytes_per_position as f64 * (i as f64 - mid);
                roofline_fraction(bytes, combo.batch as f64 / t, combo.batch, *g)
            })
            .collect()
    };
    let per_pass: Vec<Vec<f64>> = passes.iter().map(fractions).filter(|f| !f.is_empty()).collect();
    let pass_fractions: Vec<f64> = per_pass.iter().map(|f| median(f)).collect();
    let step_fractions: Vec<f64> = per_pass.concat();
    let stages = diag.stages.map(|m| m.into_iter().map(|(k, ns)| (k, StageShare { ns, share: 0.0 })).collect());
    BenchResult {
        config: Config {
            model: model.to_string(),
            kernel: combo.kernel.family().name().into(),
            isa: combo.kernel.isa().name().into(),
            batch: combo.batch,
            context_length: combo.context_length,
            kv_precision: combo.kv.name().into(),
            threads: combo.threads,
        },
        prefill: Prefill {
            tokens_per_sec: Stat::of(&pp),
            ttft_ms: Stat::of(&ttft),
            macs: prepared.prefill_macs,
            compute_fraction: None,
        },
        decode: Decode {
            tokens_per_sec: Stat::of(&tg),
            latency_ms: Latency::of(lat),
            bytes_per_token: prepared.bytes_per_step / combo.batch as u64,
            bytes_per_step: prepared.bytes_per_step,
            roofline_fraction: 0.0,
            probes_gbps: passes.iter().flat_map(|p| p.probe_gbps.iter().copied()).collect(),
            step_fractions,
            pass_fractions,
            macs_per_step: prepared.macs_per_step,
            compute_fraction: None,
        },
        memory: Memory {
            weight_bytes: prepared.weight_bytes,
            kv_cache_bytes: prepared.kv_cache_bytes,
            peak_rss_bytes: peak_rss(),
            repack_bytes: Some(prepared.repack_bytes),
        },
        quality,
        stages,
        counters: diag.counters,
    }
}

/// Which model and text measure KV quality (see [`SweepSpec::quality_text`]): the measuring
/// model when it is not the swept one, and the text's tokens with its name for the report.
#[allow(clippy::type_complexity)]
fn quality_source(
    spec: &SweepSpec,
    source: &ModelSource,
) -> Result<(Option<(Model, String)>, Option<(Vec<u32>, String)>)> {
    let (model_path, text) = match (&spec.quality_model, &spec.quality_text, source) {
        (Some(m), None, _) => bail!("--quality-model {}: needs --quality-text, the text to measure on", m.display()),
        (Some(m), Some(t), _) => (Some(m.clone()), t.clone()),
        (None, Some(t), ModelSource::Gguf(_)) => (None, t.clone()),
        (None, Some(t), ModelSource::Preset(_)) => bail!(
            "--quality-text {}: {} is a preset with random weights and no tokenizer, whose quality figures estimate no model; give a GGUF model (--model or --quality-model)",
            t.display(),
            spec.model
        ),
        (None, None, ModelSource::Preset(_)) if spec.quality_positions > 0 => match crate::trained::quality_default() {
            Some((m, t)) => (Some(m), t),
            None => return Ok((None, None)),
        },
        (None, None, _) => return Ok((None, None)),
    };
    // Which flag (or default) named the measuring model, for errors; the engine's name the file.
    let (tok_path, who) = match (&model_path, source) {
        (Some(m), _) if spec.quality_model.is_some() => (m.clone(), "--quality-model"),
        (Some(m), _) => (m.clone(), "the committed trained model (models/)"),
        (None, ModelSource::Gguf(p)) => (p.clone(), "--model"),
        (None, ModelSource::Preset(_)) => unreachable!("a preset's text needs a quality model"),
    };
    let tok = bitnet_engine::tokenizer::load_tokenizer(&tok_path)
        .with_context(|| format!("{who}: the quality text needs the measuring model's tokenizer"))?;
    let tokens = quality_tokens(&tok, &text)?;
    let model = match model_path {
        Some(p) => {
            let m = bitnet_engine::gguf::load_model(&p).with_context(|| who.to_string())?;
            let name = p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned());
            Some((m, name))
        }
        None => None,
    };
    Ok((model, Some(tokens)))
}

/// `path`'s text as the model's tokens (BOS where the file adds one, special-looking text kept
/// as text), and a name for the report: file name, bytes and the first 16 hex digits of its
/// SHA-256, so two reports say whether they measured the same text.
pub fn quality_tokens(tok: &bitnet_engine::tokenizer::Tokenizer, path: &std::path::Path) -> Result<(Vec<u32>, String)> {
    use sha2::Digest;
    let text = crate::model_cmds::read_text(path, "--quality-text")?;
    let bytes = text.as_bytes();
    let tokens = tok.encode(&text, true, false);
    if tokens.len() < 2 {
        bail!("--quality-text {}: {} token(s); the measurement needs at least 2", path.display(), tokens.len());
    }
    let sha: String = sha2::Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    Ok((tokens, format!("{name} ({} bytes, sha256 {sha})", bytes.len())))
}

/// The real engine behind the seam.
pub struct EngineRunner {
    model: Model,
    source: String,
    /// Where the model comes from, to regenerate a preset in another kernel's format.
    model_source: ModelSource,
    /// The one format every kernel reads when it is fixed (`--format`, or a GGUF file's own).
    format: Option<WeightFormat>,
    /// Formats of the sweep's kernels, for the report (`i2`, or e.g. `i2,bitplanes`).
    formats: String,
    kernels: Vec<KernelFamily>,
    gen_threads: usize,
    seed: u64,
    /// `--ffn-activation`, kept for models regenerated in another kernel's format.
    ffn_activation: Option<FfnActivation>,
    /// The quality text tokenized by the measuring model's tokenizer, and how to name it in the
    /// report.
    quality_text: Option<(Vec<u32>, String)>,
    /// The model that measures quality when it is not the swept one, and its file name.
    quality_model: Option<(Model, String)>,
    pin: bool,
    probe_bytes: usize,
    state: Option<(Combo, State)>,
    prompts: Vec<Vec<u32>>,
    /// The roofline pass's probe buffer, made on first use.
    roofline_probe: Option<ProbeBuffer>,
    /// The tokens each prompt's prefill chose, from the last run of this combination that
    /// prefilled (for roofline passes that decode again after the same prompt).
    after_prompt: Option<Vec<u32>>,
}

impl EngineRunner {
    /// Loads the model. A preset gets synthetic weights in each kernel's own format (one model
    /// in memory at a time; combinations run kernel by kernel), or all in `--format`; a GGUF
    /// file has one format, which every kernel must read. With no `spec.kernels`, the family
    /// made for the weights is swept; [`EngineRunner::kernels`] says which.
    pub fn load(spec: &SweepSpec) -> Result<Self> {
        let source = ModelSource::parse(&spec.model).with_context(|| format!("--model {}", spec.model))?;
        let format = spec.format.or(spec.kernels.first().map(|k| k.native_format())).unwrap_or(WeightFormat::I2);
        let gen_threads = spec.threads.iter().copied().max().unwrap_or(1);
        let gguf = matches!(source, ModelSource::Gguf(_));
        let (model, desc) = source.load(format, spec.seed, gen_threads, spec.ffn_activation).with_context(|| {
            if gguf {
                format!("--model {}", spec.model)
            } else {
                format!("--model {} (format {format})", spec.model)
            }
        })?;
        let (quality_model, quality_text) = quality_source(spec, &source)?;
        let fixed = spec.format.is_some() || gguf;
        let loaded = model.weights.layers[0].wq.format();
        if let (true, Some(f)) = (gguf, spec.format) {
            if f != loaded {
                bail!("--format {f}: sets a preset's synthetic weights; {} holds {loaded} weights", spec.model);
            }
        }
        // A sweep runs one kernel family over every layer.
        let family = model.weights.kernel_family().with_context(|| format!("--model {}", spec.model))?;
        let kernels = if spec.kernels.is_empty() { vec![family] } else { spec.kernels.clone() };
        let mut formats: Vec<WeightFormat> = Vec::new();
        for k in &kernels {
            let f = if fixed { loaded } else { k.native_format() };
            if !k.accepts(f) {
                bail!(
                    "--kernels {k}: cannot read this model's {f} weights (use --kernels {})",
                    Kernel::best_for(f).family()
                );
            }
            if !formats.contains(&f) {
                formats.push(f);
            }
        }
        Ok(Self {
            model,
            source: desc,
            model_source: source,
            format: fixed.then_some(loaded),
            formats: formats.iter().map(|f| f.name()).collect::<Vec<_>>().join(","),
            kernels,
            gen_threads,
            seed: spec.seed,
            ffn_activation: spec.ffn_activation,
            quality_text,
            quality_model,
            pin: spec.pin,
            probe_bytes: spec.probe_bytes,
            state: None,
            roofline_probe: None,
            prompts: Vec::new(),
            after_prompt: None,
        })
    }

    /// The loaded model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The kernel families to sweep: `--kernels`, or the one made for the model's weights.
    pub fn kernels(&self) -> &[KernelFamily] {
        &self.kernels
    }

    fn state(&mut self) -> Result<(&Model, &mut State, Combo)> {
        let (combo, st) = self.state.as_mut().context("prepare() was not called")?;
        Ok((&self.model, st, *combo))
    }

    /// One run: prefill, then decode steps, with a bandwidth probe after each step when
    /// `probe` is given (outside the step's time); returns the run and the probes' GB/s.
    /// `decode_starts` is called between the prefill and the first decode step. With
    /// `reuse_prompt` and a run of this combination before it, the prefill is skipped: the
    /// prompts' KV rows are still in the cache (decode steps write only after them), so
    /// decoding from the same first tokens repeats the same steps (prefill and TTFT read 0).
    fn run_probing(
        &mut self,
        max_new: usize,
        probe: Option<&ProbeBuffer>,
        decode_starts: &mut dyn FnMut(),
        reuse_prompt: bool,
    ) -> Result<(RunSample, Vec<f64>)> {
        let prompts = std::mem::take(&mut self.prompts);
        let after_prompt = if reuse_prompt { self.after_prompt.clone() } else { None };
        let r = (|| -> Result<(RunSample, Vec<f64>, Vec<u32>)> {
            let (model, st, combo) = self.state()?;
            let t0 = Instant::now();
            let mut prefill_secs = 0.0;
            let next = match after_prompt {
                Some(next) => next,
                None => {
                    let mut next = vec![0u32; combo.batch];
                    for (s, p) in prompts.iter().enumerate() {
                        let t = Instant::now();
                        let row = prefill(model, st, s, 0, p, None)?;
                        prefill_secs += t.elapsed().as_secs_f64();
                        next[s] = argmax(st.logits(row).expect("last prompt row has logits"));
                    }
                    next
                }
            };
            let first = next.clone();
            let mut next = next;
            let ttft = if prefill_secs > 0.0 { t0.elapsed().as_secs_f64() } else { 0.0 };
            decode_starts();
            let seqs: Vec<usize> = (0..combo.batch).collect();
            let mut positions = vec![0; combo.batch];
            let mut steps = Vec::with_capacity(max_new);
            let mut probes = Vec::with_capacity(if probe.is_some() { max_new } else { 0 });
            for step in 0..max_new {
                positions.fill(combo.context_length + step);
                let t = Instant::now();
                st.forward(model, &next, &seqs, &positions, LogitsFor::All)?;
                for (b, n) in next.iter_mut().enumerate() {
                    *n = argmax(st.logits(b).expect("decode rows have logits"));
                }
                steps.push(t.elapsed().as_secs_f64());
                if let Some(p) = probe {
                    probes.push(p.read_gbps_on(st.pool()).1);
                }
            }
            Ok((RunSample { prefill_secs, ttft_secs: ttft, decode_step_secs: steps }, probes, first))
        })();
        self.prompts = prompts;
        let (sample, probes, first) = r?;
        self.after_prompt = Some(first);
        Ok((sample, probes))
    }
}

fn params(m: &Model) -> u64 {
    let c = &m.config;
    let per_layer = c.hidden * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.hidden + 3 * c.hidden * c.ffn;
    let emb = c.vocab * c.hidden * if c.tied_embeddings { 1 } else { 2 };
    (c.layers * per_layer + emb) as u64
}

impl Runner for EngineRunner {
    fn model_info(&self) -> ModelInfo {
        let bytes = self.model.weights.total_bytes();
        ModelInfo {
            name: self.model.config.name.clone(),
            source: self.source.clone(),
            params: params(&self.model),
            weight_bytes: bytes as u64,
            weight_format: self.formats.clone(),
            ffn_activation: Some(self.model.config.activation.name().into()),
            ffn_activation_source: Some(self.model.config.activation_source.to_string()),
        }
    }

    fn max_context(&self) -> usize {
        self.model.config.max_context
    }

    fn estimate_bytes(&self, c: &Combo, max_new: usize) -> u64 {
        let cfg = &self.model.config;
        let kv = c.kv.bytes_per_token(cfg) * (c.context_length + max_new) * c.batch;
        let rows = c.batch.max(64);
        let buffers = rows * (cfg.vocab * 2 + 4 * cfg.hidden + 2 * cfg.ffn) * 4;
        // Encoded caches: each thread decodes a head's keys and values for prompt attention.
        let prompt =
            if c.kv.is_encoded() { c.threads * 2 * (c.context_length + max_new) * cfg.head_dim() * 4 } else { 0 };
        // The `lut` form of tq1 keeps a repack of the linear weights beside them (the AVX2 tq2
        // kernel a copy of their codes), and with `lut` each activation buffer one table per
        // group of three columns for up to LUT_MAX_BATCH rows (larger batches run the fused
        // form, without tables).
        let repack = self.model.weights.repack_bytes(Some(c.kernel))
            + self.model.weights.head_repack_bytes(Some(c.kernel), c.batch);
        let table_rows = rows.min(LUT_MAX_BATCH);
        let tables = if c.kernel.uses_perm() {
            table_rows * (perm_table_bytes(cfg.hidden) + perm_table_bytes(cfg.ffn))
        } else if c.kernel.uses_lut() {
            table_rows * (lut_table_bytes(cfg.hidden) + lut_table_bytes(cfg.ffn))
        } else {
            0
        };
        (kv + buffers + prompt + repack + tables) as u64
    }

    fn bandwidth_gbps(&mut self, threads: usize) -> Result<f64> {
        Ok(measure_read_bandwidth(self.probe_bytes, threads, 5, self.pin)?.best_gbps)
    }

    fn int8_peak_gmacs(&mut self, isa: IsaLevel, threads: usize) -> Result<Option<f64>> {
        if compute_peak::loop_of(isa).is_none() {
            return Ok(None);
        }
        Ok(Some(compute_peak::measure_int8_peak(isa, threads, 5, self.pin)?.best_gmacs))
    }

    fn prepare(&mut self, combo: &Combo, max_new: usize) -> Result<Prepared> {
        self.state = None; // free the previous combination's cache first
        self.after_prompt = None;
        let want = self.format.unwrap_or(combo.kernel.family().native_format());
        if self.model.weights.layers[0].wq.format() != want {
            let (model, desc) = self.model_source.load(want, self.seed, self.gen_threads, self.ffn_activation)?;
            self.model = model;
            self.source = desc;
        }
        let mut so = StateOptions::new(combo.batch, combo.context_length + max_new, combo.kv, combo.threads);
        so.kernel = Some(combo.kernel);
        so.pin = self.pin;
        let st = State::new(&self.model, &so)?;
        let cfg = &self.model.config;
        let vocab = cfg.vocab as u64;
        self.prompts = (0..combo.batch)
            .map(|s| {
                let mut rng =
                    bitnet_engine::rng::SplitMix64::new(self.seed ^ (s as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                (0..combo.context_length).map(|_| (rng.next_u64() % vocab) as u32).collect()
            })
            .collect();
        // Step i (of max_new) decodes position ctx + i and attends over its ctx + i + 1 rows:
        // on average ctx + (max_new + 1)/2.
        let kv_bytes_per_position = combo.batch as u64 * combo.kv.bytes_per_token(cfg) as u64;
        let twice_mean_rows = 2 * combo.context_length as u64 + max_new as u64 + 1;
        let bytes_per_step = self.model.weights.bytes_read_per_step_by(Some(combo.kernel), combo.batch) as u64
            + kv_bytes_per_position * twice_mean_rows / 2;
        let prepared = Prepared {
            weight_bytes: self.model_info().weight_bytes,
            repack_bytes: (self.model.weights.repack_bytes(Some(combo.kernel))
                + self.model.weights.head_repack_bytes(Some(combo.kernel), combo.batch))
                as u64,
            kv_cache_bytes: st.kv_cache().byte_len() as u64,
            bytes_per_step,
            macs_per_step: self.model.weights.macs_per_token() * combo.batch as u64,
            prefill_macs: (self.model.weights.linear_macs_per_token() * combo.context_length as u64
                + self.model.weights.head_macs_per_token())
                * combo.batch as u64,
            kv_bytes_per_position,
        };
        self.state = Some((*combo, st));
        Ok(prepared)
    }

    fn run(&mut self, max_new: usize) -> Result<RunSample> {
        Ok(self.run_probing(max_new, None, &mut || {}, false)?.0)
    }

    fn roofline_pass(&mut self, max_new: usize, reuse_prompt: bool) -> Result<RooflinePass> {
        let probe = match self.roofline_probe.take() {
            Some(p) => p,
            None => ProbeBuffer::new(ROOFLINE_PROBE_BYTES)?,
        };
        // One untimed pass faults the pages in.
        probe.read_gbps_on(self.state()?.1.pool());
        let r = self.run_probing(max_new, Some(&probe), &mut || {}, reuse_prompt);
        self.roofline_probe = Some(probe);
        let (sample, probe_gbps) = r?;
        Ok(RooflinePass { step_secs: sample.decode_step_secs, probe_gbps })
    }

    fn diagnose(&mut self, max_new: usize, trace: bool, counters: bool) -> Result<Diagnostics> {
        let (_, st, _) = self.state()?;
        // On a timeline, as `bitnet-trace` records by default: its stage shares are the same
        // kind of figure, and the run gives the page its timeline.
        st.set_instrument(if trace { Level::Timeline } else { Level::Off }, if trace { TIMELINE_EVENTS } else { 0 });
        let mut c = counters.then(|| bitnet_trace::counters::Counters::open(&bitnet_trace::counters::thread_ids()));
        // The counts of the prefill are read and dropped when decode starts, so what is left
        // is the decode steps' alone.
        let sample = self.run_probing(
            max_new,
            None,
            &mut || {
                if let Some(c) = c.as_mut() {
                    c.delta();
                }
            },
            false,
        );
        let (_, st, _) = self.state()?;
        let counted = c.as_mut().map(|c| c.delta());
        let spans = trace.then(|| bitnet_trace::spans::Spans::collect(st));
        st.set_instrument(Level::Off, 0);
        sample?;
        let steps = max_new.max(1) as f64;
        let traced = spans.as_ref().map(|s| Traced {
            folded: bitnet_trace::folded::folded(s, bitnet_trace::folded::Weight::Nanos),
            timeline: bitnet_trace::chrome::trace_json(s, "bitnet-bench --trace").to_string(),
        });
        let stages = spans.map(|s| {
            let mut m = BTreeMap::new();
            for t in s.totals.iter().filter(|t| t.phase == Phase::Decode) {
                *m.entry(t.stage.name().to_string()).or_insert(0.0) += t.ns / steps;
            }
            m
        });
        let counters = counted.map(|d| d.into_iter().map(|(k, v)| (k.to_string(), v.value / steps)).collect());
        Ok(Diagnostics { stages, counters, traced })
    }

    fn quality(&mut self, kv: KvPrecision, positions: usize, threads: usize) -> Result<Quality> {
        if let Some((text_tokens, name)) = &self.quality_text {
            let (model, model_name) = match &self.quality_model {
                Some((m, name)) => (m, Some(name.clone())),
                None => (&self.model, None),
            };
            let n = positions.min(model.config.max_context);
            let tokens = &text_tokens[..n.min(text_tokens.len())];
            let q = kv_quality(model, tokens, kv, threads)?;
            return Ok(Quality {
                model: model_name,
                kl_divergence: q.kl_divergence,
                top1_agreement: q.top1_agreement,
                positions: q.positions,
                source: "text".into(),
                text: Some(name.clone()),
                perplexity_f32: Some(q.perplexity_f32),
                perplexity: Some(q.perplexity),
            });
        }
        let n = positions.min(self.model.config.max_context);
        let vocab = self.model.config.vocab as u64;
        let mut rng = bitnet_engine::rng::SplitMix64::new(self.seed ^ 0x5eed);
        let tokens: Vec<u32> = (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect();
        let q = kv_quality(&self.model, &tokens, kv, threads)?;
        Ok(Quality {
            kl_divergence: q.kl_divergence,
            top1_agreement: q.top1_agreement,
            positions: q.positions,
            source: "synthetic".into(),
            model: None,
            text: None,
            perplexity_f32: None,
            perplexity: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `quick()` changes only the sizes of the sweep; the model, seed, threads and flags stay
    /// the default's, so `--quick` with other flags means what the flags say.
    #[test]
    fn quick_differs_from_default_only_in_its_sizes() {
        let (q, d) = (SweepSpec::quick(), SweepSpec::default());
        assert_eq!(q.batch_sizes, vec![1]);
        assert_eq!(q.context_lengths, vec![16]);
        assert_eq!(q.kv_precisions, vec![KvPrecision::F16, KvPrecision::Int8]);
        assert_eq!((q.max_new_tokens, q.warmup, q.repeat), (4, 1, 2));
        assert_eq!((q.quality_positions, q.probe_bytes), (16, 64 << 20));
        // Every other field as the default's: put the quick fields back and compare the whole
        // (SweepSpec has no PartialEq; its Debug form lists every field).
        let restored = SweepSpec {
            batch_sizes: d.batch_sizes.clone(),
            context_lengths: d.context_lengths.clone(),
            kv_precisions: d.kv_precisions.clone(),
            max_new_tokens: d.max_new_tokens,
            warmup: d.warmup,
            repeat: d.repeat,
            quality_positions: d.quality_positions,
            probe_bytes: d.probe_bytes,
            ..q
        };
        assert_eq!(format!("{restored:?}"), format!("{d:?}"));
    }
}
