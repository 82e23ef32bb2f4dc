//! One traced run: warm-up, then a prefill of `context_length` tokens for each of `batch`
//! sequences and `tokens` batched decode steps, with spans, counters and the optional
//! profilers on; then every output written into the output directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bitnet_engine::gguf::ModelSource;
use bitnet_engine::instrument::{clock, Level, Phase, Stage};
use bitnet_engine::model::{argmax, prefill, FfnActivation};
use bitnet_engine::probes::compute_peak;
use bitnet_engine::{
    IsaLevel, Kernel, KernelFamily, KernelForm, KvPrecision, LogitsFor, Model, State, StateOptions, WeightFormat,
};

use crate::counters::{derived, CounterValue, Counters};
use crate::folded::{self, Weight};
use crate::profile;
use crate::spans::Spans;
use crate::summary::{
    compute_rows, stage_rows, table, thread_rows, wall_check, ComputeReport, ComputeRow, Consistency, CounterReport,
    HeapInfo, PprofCheck, PprofRow, RunInfo, Summary, TimelineInfo, Wall, PPROF_MIN_SAMPLES,
};

/// What to trace.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// A preset name or a GGUF file.
    pub model: String,
    /// Weight format of a preset's synthetic weights (default: the kernel family's).
    pub format: Option<WeightFormat>,
    /// Overrides the model's FFN gating (`--ffn-activation`).
    pub ffn_activation: Option<FfnActivation>,
    pub batch: usize,
    pub context_length: usize,
    pub kv: KvPrecision,
    pub threads: usize,
    /// Default: the family made for the model's weights (a GGUF file's own format; a preset's
    /// `format`, else I2_S).
    pub kernel: Option<KernelFamily>,
    /// Default: the best level this CPU has for the family.
    pub isa: Option<IsaLevel>,
    /// Default: split where the family has it, so `unpack` and `dot` are told apart.
    pub form: Option<KernelForm>,
    /// Decode steps.
    pub tokens: usize,
    pub level: Level,
    pub timeline_capacity: usize,
    pub pprof: bool,
    pub dhat: bool,
    pub counters: bool,
    pub seed: u64,
    pub pin: bool,
}

impl Default for TraceOptions {
    fn default() -> Self {
        Self {
            model: "bitnet-b1.58-2b-4t".into(),
            format: None,
            ffn_activation: None,
            batch: 1,
            context_length: 128,
            kv: KvPrecision::F16,
            threads: 2,
            kernel: None,
            isa: None,
            form: None,
            tokens: 32,
            level: Level::Timeline,
            timeline_capacity: 2_000_000,
            pprof: false,
            dhat: false,
            counters: true,
            seed: 42,
            pin: false,
        }
    }
}

/// What a traced run produced.
pub struct TraceOutcome {
    pub summary: Summary,
    /// Files written into the output directory.
    pub files: Vec<PathBuf>,
    /// Notes for the user (e.g. the counter fallback line).
    pub notes: Vec<String>,
}

/// A staging directory beside `out`, moved into place file by file when everything is
/// written, so a failed run leaves nothing half-written in `out`.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn new(out: &Path) -> Result<Self> {
        if out.exists() && !out.is_dir() {
            bail!("--out {}: exists and is not a directory", out.display());
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
        let dir = parent.join(format!(".{name}.bitnet-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| {
            format!("--out {}: cannot create files beside it in {}", out.display(), parent.display())
        })?;
        Ok(Self { dir })
    }

    fn commit(&self, out: &Path) -> Result<Vec<PathBuf>> {
        let earlier_trace = std::fs::read(out.join("summary.json")).ok().is_some_and(|b| {
            serde_json::from_slice::<serde_json::Value>(&b)
                .is_ok_and(|v| v["tool"].as_str().is_some_and(|t| t.starts_with("bitnet-trace ")))
        });
        std::fs::create_dir_all(out)
            .with_context(|| format!("--out {}: cannot create the directory", out.display()))?;
        let mut files = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(&self.dir)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let dst = out.join(e.file_name());
            std::fs::rename(e.path(), &dst).with_context(|| format!("moving {} into place", dst.display()))?;
            files.push(dst);
        }
        // A file an earlier trace wrote into `out` that this one did not (its profile.pb, say,
        // beside a new summary.json) would read as part of this run: remove it, if `out` held
        // an earlier trace (its summary.json, overwritten above, was bitnet-trace's). Other
        // files, and any file of a directory that held no trace, are left alone.
        for name in OUTPUT_FILES.iter().filter(|_| earlier_trace) {
            let stale = out.join(name);
            if !files.contains(&stale) && stale.is_file() {
                std::fs::remove_file(&stale)
                    .with_context(|| format!("--out {}: cannot remove the earlier run's {name}", out.display()))?;
            }
        }
        Ok(files)
    }
}

/// Every file a trace may write into `--out`.
const OUTPUT_FILES: [&str; 7] = [
    "summary.json",
    "stages.folded",
    "flamegraph.svg",
    "trace.json",
    "profile.pb",
    "pprof-flamegraph.svg",
    "dhat-heap.json",
];

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn check(opts: &TraceOptions, model: &Model) -> Result<()> {
    for (flag, v) in [
        ("--batch", opts.batch),
        ("--context-length", opts.context_length),
        ("--threads", opts.threads),
        ("--tokens", opts.tokens),
    ] {
        if v == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    if opts.pin {
        bitnet_engine::pool::check_pinnable(opts.threads).map_err(|e| {
            anyhow::anyhow!("--pin with --threads {}: {e} (lower --threads or drop --pin)", opts.threads)
        })?;
    }
    let max = model.config.max_context;
    if opts.context_length + opts.tokens > max {
        bail!(
            "--context-length {} + --tokens {} = {} positions exceeds {}'s maximum context of {max}",
            opts.context_length,
            opts.tokens,
            opts.context_length + opts.tokens,
            model.config.name
        );
    }
    Ok(())
}

/// The prompt of sequence `s`: deterministic token ids from the seed.
pub(crate) fn prompt(seed: u64, s: usize, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = bitnet_engine::rng::SplitMix64::new(seed ^ (s as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..len).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

/// The model of the options and the kernel that runs it: `kernel`, or the family made for the
/// weights, so that a GGUF file is traced with the kernel for its format without being told.
pub(crate) fn load_model(opts: &TraceOptions) -> Result<(Model, String, Kernel)> {
    let source = ModelSource::parse(&opts.model).with_context(|| format!("--model {}", opts.model))?;
    let format = opts.format.or(opts.kernel.map(|k| k.native_format())).unwrap_or(WeightFormat::I2);
    let (model, desc) = source
        .load(format, opts.seed, opts.threads, opts.ffn_activation)
        .with_context(|| format!("--model {}", opts.model))?;
    let loaded = model.weights.layers[0].wq.format();
    if let (ModelSource::Gguf(_), Some(f)) = (&source, opts.format) {
        if f != loaded {
            bail!("--format {f}: sets a preset's synthetic weights; {} holds {loaded} weights", opts.model);
        }
    }
    let family = match opts.kernel {
        Some(k) => k,
        None => model.weights.kernel_family().with_context(|| format!("--model {}", opts.model))?,
    };
    let kernel = kernel_for(opts, family)?;
    Ok((model, desc, kernel))
}

/// `family` at the chosen (or best) ISA level, in the chosen form (default split where the
/// family has one).
fn kernel_for(opts: &TraceOptions, family: KernelFamily) -> Result<Kernel> {
    let isa = match opts.isa {
        Some(i) => i,
        None => family.isa_levels().iter().rev().copied().find(|l| l.is_supported()).unwrap_or(IsaLevel::Scalar),
    };
    let form = opts.form.unwrap_or(if family.forms().contains(&KernelForm::Split) {
        KernelForm::Split
    } else {
        KernelForm::Fused
    });
    Kernel::new(family, isa, form).context("--kernel/--isa/--form")
}

/// The state for the options (checked against the model).
pub(crate) fn state_options(opts: &TraceOptions, kernel: Kernel, model: &Model) -> Result<StateOptions> {
    check(opts, model)?;
    let mut so = StateOptions::new(opts.batch, opts.context_length + opts.tokens, opts.kv, opts.threads);
    so.kernel = Some(kernel);
    so.pin = opts.pin;
    Ok(so)
}

/// Runs the trace and writes every output into `out`.
pub fn run_trace(opts: &TraceOptions, out: &Path) -> Result<TraceOutcome> {
    let staging = Staging::new(out)?;
    let (model, source_desc, kernel) = load_model(opts)?;
    let so = state_options(opts, kernel, &model)?;
    let mut state = State::new(&model, &so).context("--kernel")?;
    let (clock_source, ticks_per_sec) = clock::init();
    state.set_instrument(opts.level, opts.timeline_capacity);
    let vocab = model.config.vocab;
    let prompts: Vec<Vec<u32>> = (0..opts.batch).map(|s| prompt(opts.seed, s, opts.context_length, vocab)).collect();

    // Warm-up (not traced): the first prefill chunk and two decode steps touch every buffer
    // and code path; the traced run then overwrites the same cache positions.
    let warm = &prompts[0][..opts.context_length.min(state.max_rows())];
    prefill(&model, &mut state, 0, 0, warm, None)?;
    for p in 0..2.min(opts.tokens) {
        let pos = warm.len() + p;
        if pos < opts.context_length + opts.tokens {
            state.forward(&model, &[warm[0]], &[0], &[pos], LogitsFor::All)?;
        }
    }
    state.reset_instrument();

    let mut notes = Vec::new();
    let mut counters = if opts.counters {
        let c = Counters::open(&crate::counters::thread_ids());
        if let Some(n) = c.fallback_note() {
            notes.push(n);
        }
        Some(c)
    } else {
        None
    };
    let dhat_profiler = if opts.dhat {
        Some(dhat::Profiler::builder().file_name(staging.dir.join("dhat-heap.json")).build())
    } else {
        None
    };
    let pprof_guard = if opts.pprof { Some(profile::start()?) } else { None };

    // The traced region.
    let mut prefill_wall = 0.0;
    let mut decode_wall = 0.0;
    let mut next = vec![0u32; opts.batch];
    let mut prefill_counters = BTreeMap::new();
    let mut decode_counters: BTreeMap<String, CounterValue> = BTreeMap::new();
    let mut per_step = Vec::new();
    if let Some(c) = counters.as_mut() {
        c.delta();
    }
    for (s, p) in prompts.iter().enumerate() {
        let t = Instant::now();
        let row = prefill(&model, &mut state, s, 0, p, None)?;
        next[s] = state.time_sample(|st| argmax(st.logits(row).expect("last prompt row has logits")));
        prefill_wall += t.elapsed().as_secs_f64();
    }
    if let Some(c) = counters.as_mut() {
        add(&mut prefill_counters, &c.delta());
    }
    let seqs: Vec<usize> = (0..opts.batch).collect();
    let mut positions = vec![0usize; opts.batch];
    // Heap figures count the engine's calls only, not the tool's bookkeeping between them.
    let (mut heap_blocks, mut heap_bytes) = (0u64, 0u64);
    for step in 0..opts.tokens {
        positions.fill(opts.context_length + step);
        let heap_before = opts.dhat.then(dhat::HeapStats::get);
        let t = Instant::now();
        state.forward(&model, &next, &seqs, &positions, LogitsFor::All)?;
        state.time_sample(|st| {
            for (b, n) in next.iter_mut().enumerate() {
                *n = argmax(st.logits(b).expect("every decode row has logits"));
            }
        });
        decode_wall += t.elapsed().as_secs_f64();
        if let Some(b) = heap_before {
            let a = dhat::HeapStats::get();
            heap_blocks += a.total_blocks - b.total_blocks;
            heap_bytes += a.total_bytes - b.total_bytes;
        }
        if let Some(c) = counters.as_mut() {
            let d = c.delta();
            let mut m = BTreeMap::new();
            add(&mut m, &d);
            add(&mut decode_counters, &d);
            per_step.push(m);
        }
    }
    let heap = opts.dhat.then(|| {
        let steps = opts.tokens as f64;
        HeapInfo {
            allocations_per_decode_step: heap_blocks as f64 / steps,
            bytes_per_decode_step: heap_bytes as f64 / steps,
            max_bytes: dhat::HeapStats::get().max_bytes as u64,
        }
    });
    let sampled = match pprof_guard {
        Some(g) => Some(profile::finish(
            g,
            &staging.dir,
            &["unpack_stage", "dot_stage", "unpack_stage|dot_stage", "xnor_stage", "popcount_stage"],
        )?),
        None => None,
    };
    drop(dhat_profiler); // writes dhat-heap.json

    // Outputs.
    let spans = Spans::collect(&state);
    let title = format!(
        "{} · {} · {} threads · B={} ctx {} · KV {}",
        model.config.name,
        kernel.name(),
        opts.threads,
        opts.batch,
        opts.context_length,
        opts.kv
    );
    let folded_ns = folded::folded(&spans, Weight::Nanos);
    std::fs::write(staging.dir.join("stages.folded"), &folded_ns).context("stages.folded")?;
    if !folded_ns.is_empty() {
        let svg = std::fs::File::create(staging.dir.join("flamegraph.svg")).context("flamegraph.svg")?;
        folded::flamegraph(
            &folded_ns,
            &format!("bitnet-trace: {title}"),
            "per-stage spans, ns summed over threads; stage colours are fixed across graphs",
            std::io::BufWriter::new(svg),
        )?;
    }
    if opts.level == Level::Timeline {
        let doc = crate::chrome::trace_json(&spans, &title);
        std::fs::write(staging.dir.join("trace.json"), serde_json::to_vec(&doc)?).context("trace.json")?;
    }

    let (prefill_ms, decode_ms) = (prefill_wall * 1e3, decode_wall * 1e3);
    let wall_ms = prefill_ms + decode_ms;
    let mut stages = BTreeMap::new();
    for (phase, ms) in [(Phase::Prefill, prefill_ms), (Phase::Decode, decode_ms)] {
        let rows = stage_rows(&spans, phase, ms);
        if !rows.is_empty() {
            stages.insert(phase.name().to_string(), rows);
        }
    }
    let (caller_ms, diff_pct, wall_ok) = wall_check(&spans, wall_ms);
    let (mut failures, mut not_run) = (Vec::new(), Vec::new());
    if opts.level != Level::Off && !wall_ok {
        failures.push(format!(
            "caller-thread spans sum to {caller_ms:.2} ms but the wall time is {wall_ms:.2} ms ({diff_pct:+.1}%): the spans miss or double-count time"
        ));
    }
    let pprof = sampled.map(|s| {
        // The spans' share of the time the samples are a share of: the process's CPU time
        // while sampled (threads asleep take no samples), else the threads' wall time.
        let sampled_ns = s.cpu_ns.filter(|&ns| ns > 0.0).unwrap_or(wall_ms * 1e6 * opts.threads as f64);
        let mut rows = Vec::new();
        let split_stage = |st: Stage| matches!(st, Stage::Unpack | Stage::Dot);
        for (stages, name, function) in [
            (&[Stage::Unpack][..], "unpack", "unpack_stage"),
            (&[Stage::Dot][..], "dot", "dot_stage"),
            (&[Stage::Unpack, Stage::Dot][..], "unpack+dot", "unpack_stage|dot_stage"),
            (&[Stage::Xnor][..], "xnor", "xnor_stage"),
            (&[Stage::Popcount][..], "popcount", "popcount_stage"),
        ] {
            let ns = spans.sum(|t| stages.contains(&t.stage), |t| t.ns);
            if ns == 0.0 {
                continue;
            }
            let span_pct = ns / sampled_ns * 100.0;
            let sampled_pct = s.shares.iter().find(|(f, _)| f == function).map_or(0.0, |(_, v)| v * 100.0);
            // One stage of the split form: the two methods may split unpack | dot differently;
            // their sum gets the plain limit.
            let boundary = if stages.len() == 1 && split_stage(stages[0]) {
                crate::summary::PPROF_BOUNDARY_PP
            } else {
                0.0
            };
            let limit_pp = crate::summary::pprof_limit_pp(span_pct, s.samples) + boundary;
            let ok = (span_pct - sampled_pct).abs() <= limit_pp;
            if s.samples < PPROF_MIN_SAMPLES {
                continue;
            }
            if !ok {
                failures.push(format!(
                    "{name}: spans give {span_pct:.1}% of CPU time but pprof finds {sampled_pct:.1}% of {} samples in {function} (limit ±{limit_pp:.1} pp)",
                    s.samples
                ));
            }
            rows.push(PprofRow { stage: name.into(), function: function.into(), span_pct, sampled_pct, limit_pp, ok });
        }
        if s.samples < PPROF_MIN_SAMPLES {
            not_run.push(format!(
                "pprof took only {} samples (needs {PPROF_MIN_SAMPLES} to compare shares within about 11 pp): trace more --tokens or a larger model",
                s.samples
            ));
        }
        // `ok` is about failures: a check that could not run (too few samples, no rows) is
        // listed in `not_run`, not failed.
        PprofCheck { samples: s.samples, ok: rows.iter().all(|r| r.ok), rows }
    });
    let isolated =
        if counters.is_some() { crate::counters::isolated_stages(&model, kernel, opts.batch) } else { Vec::new() };
    let counter_report = counters.map(|c| {
        let list: Vec<(String, CounterValue)> = decode_counters.iter().map(|(k, v)| (k.clone(), *v)).collect();
        CounterReport {
            counters: c.status.clone(),
            note: c.fallback_note(),
            prefill: prefill_counters,
            decode_derived: derived(&list).into_iter().collect(),
            decode: decode_counters,
            per_decode_step: per_step,
            isolated_stages: isolated,
        }
    });
    let decode_tokens = (opts.tokens * opts.batch) as f64;
    let compute = compute_report(&spans, &model, kernel, opts)?;
    let summary = Summary {
        tool: format!("bitnet-trace {}", env!("CARGO_PKG_VERSION")),
        run: RunInfo {
            model: model.config.name.clone(),
            source: source_desc,
            weight_format: model.weights.layers[0].wq.format().name().into(),
            ffn_activation: model.config.activation.name().into(),
            ffn_activation_source: model.config.activation_source.to_string(),
            kernel: kernel.family().name().into(),
            isa: kernel.isa().name().into(),
            form: kernel.form().name().into(),
            threads: opts.threads,
            batch: opts.batch,
            context_length: opts.context_length,
            decode_steps: opts.tokens,
            kv_precision: opts.kv.name().into(),
            level: opts.level.name().into(),
            clock: clock_source.name().into(),
            clock_ghz: ticks_per_sec / 1e9,
        },
        wall: Wall {
            prefill_ms,
            decode_ms,
            prefill_tokens_per_sec: (opts.batch * opts.context_length) as f64 / prefill_wall,
            decode_tokens_per_sec: decode_tokens / decode_wall,
        },
        stages,
        threads: thread_rows(&spans, wall_ms),
        consistency: Consistency {
            caller_span_ms: caller_ms,
            wall_ms,
            difference_pct: diff_pct,
            wall_ok,
            pprof,
            failures,
            not_run,
        },
        counters: counter_report,
        timeline: (opts.level == Level::Timeline)
            .then(|| TimelineInfo { events: spans.events.len(), overflow: spans.overflow.iter().sum() }),
        heap,
        compute,
    };
    std::fs::write(staging.dir.join("summary.json"), serde_json::to_vec_pretty(&summary)?).context("summary.json")?;
    let files = staging.commit(out)?;
    Ok(TraceOutcome { summary, files, notes })
}

/// The linear layers' and the head's multiply-adds per second in each phase against the int8
/// peak of the kernel's ISA, probed with the run's threads after the traced region; none at the
/// scalar level. Prefill takes every prompt token through the linear layers and the head once
/// per sequence (its last position); decode, every token through both.
fn compute_report(spans: &Spans, model: &Model, kernel: Kernel, opts: &TraceOptions) -> Result<Option<ComputeReport>> {
    let Some((_, instruction)) = compute_peak::loop_of(kernel.isa()) else {
        return Ok(None);
    };
    let (linear, head) = (model.weights.linear_macs_per_token(), model.weights.head_macs_per_token());
    let (b, ctx, steps) = (opts.batch as u64, opts.context_length as u64, opts.tokens as u64);
    let rows_at = |per_thread: f64| {
        let mut rows = compute_rows(spans, Phase::Prefill, linear * ctx * b, head * b, per_thread);
        rows.extend(compute_rows(spans, Phase::Decode, linear * steps * b, head * steps * b, per_thread));
        rows
    };
    // Kernels that multiply cannot outrun the int8 arithmetic: a probe below them was disturbed
    // (on these VMs another tenant on the core halved it for seconds, and the line read 176%),
    // so it is taken again, and the best probe kept; a peak still below is flagged. The lookup
    // and popcount forms multiply nothing and may pass 100% (the int8 rate they match); the
    // LM head always multiplies.
    let multiplies = !kernel.uses_lut() && kernel.family() != bitnet_engine::KernelFamily::Xnor;
    let above = |rows: &[ComputeRow]| rows.iter().any(|r| (multiplies || r.part == "lm_head") && r.pct_of_peak > 100.0);
    let mut per_thread = 0.0f64;
    for _ in 0..PEAK_PROBES {
        let peak = compute_peak::measure_int8_peak(kernel.isa(), opts.threads, 5, opts.pin).context("compute probe")?;
        per_thread = per_thread.max(peak.best_gmacs / opts.threads as f64);
        if !above(&rows_at(per_thread)) {
            break;
        }
    }
    let rows = rows_at(per_thread);
    Ok(Some(ComputeReport {
        isa: kernel.isa().name().into(),
        instruction: instruction.into(),
        peak_gmacs_per_thread: per_thread,
        peak_below_stages: above(&rows),
        rows,
    }))
}

/// Compute probes at most, while the stages' rate is above the best of them.
const PEAK_PROBES: usize = 3;

/// Adds counter deltas into totals.
fn add(m: &mut BTreeMap<String, CounterValue>, d: &[(&'static str, CounterValue)]) {
    for (k, v) in d {
        let e = m.entry(k.to_string()).or_default();
        e.value += v.value;
        e.scaled |= v.scaled;
    }
}

/// The summary table (re-exported for the binary).
pub fn summary_table(s: &Summary) -> String {
    table(s)
}
