//! `inspect` and `run`: a model's tensors, and greedy generation with timings and logits.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bitnet_engine::gguf::load::config_from_gguf;
use bitnet_engine::gguf::GgufFile;
use bitnet_engine::model::{
    bytes_read_per_token, prefill, tensor_layout, FfnActivation, Sampler, SamplingParams, TensorInfo,
};
use bitnet_engine::tokenizer::Tokenizer;
use bitnet_engine::{IsaLevel, Kernel, KernelFamily, KvPrecision, LogitsFor, Model, State, StateOptions, WeightFormat};
use serde_json::json;

pub use bitnet_engine::gguf::ModelSource;

/// The `--model` argument: a preset or a GGUF file.
pub fn resolve(model: &str) -> Result<ModelSource> {
    ModelSource::parse(model).with_context(|| format!("--model {model}"))
}

/// The model, and a description of where it came from; `activation` overrides its FFN gating.
pub fn load(
    model: &str,
    format: WeightFormat,
    seed: u64,
    threads: usize,
    activation: Option<FfnActivation>,
) -> Result<(Model, String)> {
    resolve(model)?
        .load(format, seed, threads, activation)
        .with_context(|| format!("--model {model} (--format {format})"))
}

/// The tokenizer of `--model`: a GGUF file's; a preset has none.
pub fn tokenizer(model: &str) -> Result<Tokenizer> {
    match resolve(model)? {
        ModelSource::Preset(_) => bail!(
            "--model {model}: a preset has synthetic weights and no tokenizer (metadata key 'tokenizer.ggml.model'); give a GGUF file, or token ids with --tokens"
        ),
        ModelSource::Gguf(path) => {
            bitnet_engine::tokenizer::load_tokenizer(&path).with_context(|| format!("--model {}", path.display()))
        }
    }
}

/// A UTF-8 text file given by `flag` (`--file`, `--prompt-file`, `--text`, `--quality-text`).
pub fn read_text(path: &Path, flag: &str) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("{flag} {}: cannot read", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{flag} {}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// What `tokenize` prints: one line per token (`id -> 'piece'`, as llama-tokenize does), or
/// with `ids_only` the ids as one JSON list.
pub fn tokenize_listing(tok: &Tokenizer, ids: &[u32], ids_only: bool) -> String {
    if ids_only {
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        return format!("[{}]\n", list.join(", "));
    }
    let mut s = String::new();
    for id in ids {
        s.push_str(&format!("{id:6} -> '{}'\n", escape_bytes(&tok.piece(*id, true))));
    }
    s
}

/// A token's bytes as text: valid UTF-8 as it is, any other byte as `\xNN` (byte tokens and
/// pieces that end inside a character).
fn escape_bytes(b: &[u8]) -> String {
    let mut out = String::new();
    for chunk in b.utf8_chunks() {
        out.push_str(chunk.valid());
        for x in chunk.invalid() {
            out.push_str(&format!("\\x{x:02X}"));
        }
    }
    out
}

/// What `inspect` reports, as JSON.
pub fn inspect(model: &str, format: WeightFormat, activation: Option<FfnActivation>) -> Result<serde_json::Value> {
    let (mut cfg, source, arch, tensors) = match resolve(model)? {
        ModelSource::Preset(cfg) => {
            let layout = tensor_layout(&cfg, format).with_context(|| format!("--format {format}"))?;
            (cfg, format!("preset (synthetic {format} weights)"), "bitnet".to_string(), layout)
        }
        ModelSource::Gguf(path) => {
            let ctx = || format!("--model {}", path.display());
            let file = std::fs::File::open(&path).with_context(ctx)?;
            // SAFETY: a read-only private map, dropped before returning; see gguf::load_model.
            let map = unsafe { memmap2::Mmap::map(&file) }.with_context(ctx)?;
            let f = GgufFile::parse(&map).with_context(ctx)?;
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let cfg = config_from_gguf(&f, &stem).with_context(ctx)?;
            let arch = f.get("general.architecture").and_then(|v| v.as_str()).unwrap_or("").to_string();
            let t = f
                .tensors
                .iter()
                .map(|t| {
                    let (rows, cols) = t.rows_cols();
                    let shape = if t.dims.len() == 1 { vec![cols] } else { vec![rows, cols] };
                    TensorInfo { name: t.name.clone(), shape, dtype: t.ggml_type.name().to_string(), bytes: t.size }
                })
                .collect::<Vec<_>>();
            (cfg, format!("GGUF file {}", path.display()), arch, t)
        }
    };
    if let Some(a) = activation {
        cfg.override_activation(a);
    }
    let total: usize = tensors.iter().map(|t| t.bytes).sum();
    let linear_params = cfg.linear_params();
    let is_linear = |name: &str| {
        ["attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.", "ffn_down."]
            .iter()
            .any(|p| name.contains(p))
    };
    let linear_bytes: usize = tensors.iter().filter(|t| is_linear(&t.name)).map(|t| t.bytes).sum();
    let read_per_token = bytes_read_per_token(&cfg, &tensors);
    Ok(json!({
        "model": cfg.name,
        "source": source,
        "architecture": arch,
        "hyperparameters": {
            "hidden": cfg.hidden, "ffn": cfg.ffn, "layers": cfg.layers, "heads": cfg.heads,
            "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim(), "vocab": cfg.vocab,
            "max_context": cfg.max_context, "rope_theta": cfg.rope_theta, "norm_eps": cfg.norm_eps,
            "ffn_activation": cfg.activation.name(),
            "ffn_activation_source": cfg.activation_source.to_string(), "sub_norms": cfg.sub_norms,
            "tied_embeddings": cfg.tied_embeddings,
        },
        "tensors": tensors.iter().map(|t| json!({"name": t.name, "shape": t.shape, "type": t.dtype, "bytes": t.bytes})).collect::<Vec<_>>(),
        "total_weight_bytes": total,
        "linear_params": linear_params,
        "linear_bits_per_weight": linear_bytes as f64 * 8.0 / linear_params as f64,
        "bytes_read_per_token": read_per_token,
    }))
}

/// `inspect` as a table.
pub fn inspect_table(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let h = &v["hyperparameters"];
    let _ = writeln!(
        s,
        "model {} ({}), architecture {}",
        v["model"].as_str().unwrap_or(""),
        v["source"].as_str().unwrap_or(""),
        v["architecture"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        s,
        "hidden {}, ffn {}, {} layers, {} heads ({} kv, head dim {}), vocab {}, context {}, rope θ {}, {} FFN ({}), sub-norms {}, tied embeddings {}",
        h["hidden"], h["ffn"], h["layers"], h["heads"], h["kv_heads"], h["head_dim"], h["vocab"], h["max_context"],
        h["rope_theta"], h["ffn_activation"].as_str().unwrap_or(""), h["ffn_activation_source"].as_str().unwrap_or(""),
        h["sub_norms"], h["tied_embeddings"]
    );
    let _ = writeln!(s, "{:<28} {:>16} {:>10} {:>14}", "tensor", "shape", "type", "bytes");
    for t in v["tensors"].as_array().into_iter().flatten() {
        let shape: Vec<String> = t["shape"].as_array().into_iter().flatten().map(|d| d.to_string()).collect();
        let _ = writeln!(
            s,
            "{:<28} {:>16} {:>10} {:>14}",
            t["name"].as_str().unwrap_or(""),
            shape.join("x"),
            t["type"].as_str().unwrap_or(""),
            t["bytes"]
        );
    }
    let mib = |b: &serde_json::Value| b.as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    let _ = writeln!(
        s,
        "total weight bytes {} ({:.1} MiB); linear layers {:.3} bits per weight; bytes read per decoded token {:.1} MiB",
        v["total_weight_bytes"],
        mib(&v["total_weight_bytes"]),
        v["linear_bits_per_weight"].as_f64().unwrap_or(0.0),
        mib(&v["bytes_read_per_token"])
    );
    s
}

/// `--threads`: all available when not given; 0 is an error.
pub fn threads_or_all(threads: Option<usize>) -> Result<usize> {
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        bail!("--threads must be ≥ 1");
    }
    Ok(threads)
}

/// `run`'s kernel and the format of a preset's synthetic weights from `--kernel`, `--isa` and
/// `--format`, each defaulting to what the others imply: the kernel family made for the
/// format (else i2s) at its best ISA here, the kernel's native format (else i2). `None`: the
/// engine picks the kernel for the weights.
pub fn run_kernel_and_format(
    family: Option<KernelFamily>,
    isa: Option<IsaLevel>,
    format: Option<WeightFormat>,
) -> Result<(Option<Kernel>, WeightFormat)> {
    let kernel = match (family, isa) {
        (None, None) => None,
        (family, isa) => {
            let family = family.unwrap_or(format.map_or(KernelFamily::I2s, |f| Kernel::best_for(f).family()));
            let isa = isa.unwrap_or_else(|| Kernel::best(family).isa());
            Some(
                Kernel::new(family, isa, family.default_form(isa))
                    .with_context(|| format!("--kernel {family} --isa {isa}"))?,
            )
        }
    };
    let format = format.unwrap_or_else(|| kernel.map_or(WeightFormat::I2, |k| k.family().native_format()));
    if let Some(k) = kernel {
        if !k.family().accepts(format) {
            bail!(
                "--kernel {} cannot read --format {format} weights (it reads {})",
                k.family(),
                k.family().native_format()
            );
        }
    }
    Ok((kernel, format))
}

/// `--save-format` by default: the model's TQ format, else TQ2_0 (llama.cpp runs both).
pub fn default_save_format(format: WeightFormat) -> WeightFormat {
    if format == WeightFormat::Tq1_0 {
        WeightFormat::Tq1_0
    } else {
        WeightFormat::Tq2_0
    }
}

/// A text prompt as `run` feeds it: its ids, the tokenizer to stream the answer with, and the
/// end-of-generation tokens that end it early.
pub struct TextPrompt {
    pub tokens: Vec<u32>,
    pub tokenizer: Tokenizer,
    pub stop_at: Vec<u32>,
}

/// `text` tokenized with `model`'s tokenizer (BOS where the file adds it, special tokens
/// parsed).
pub fn text_prompt(model: &str, text: &str) -> Result<TextPrompt> {
    let tokenizer = tokenizer(model)?;
    let tokens = tokenizer.encode(text, true, true);
    if tokens.is_empty() {
        bail!("--prompt: the text gives no tokens (and the model adds no BOS)");
    }
    let stop_at = (0..tokenizer.vocab_size() as u32).filter(|id| tokenizer.is_eog(*id)).collect();
    Ok(TextPrompt { tokens, tokenizer, stop_at })
}

/// Options of `run`.
pub struct RunArgs {
    pub model: String,
    /// Overrides the model's FFN gating (`--ffn-activation`).
    pub ffn_activation: Option<FfnActivation>,
    pub format: WeightFormat,
    pub seed: u64,
    pub tokens: Vec<u32>,
    pub n_predict: usize,
    pub kv: KvPrecision,
    pub threads: usize,
    pub kernel: Option<Kernel>,
    pub pin: bool,
    pub logits_out: Option<PathBuf>,
    /// Temperature 0 = greedy.
    pub sampling: SamplingParams,
    /// Also save the model as a GGUF llama.cpp loads, with linear layers in this TQ format.
    pub save_gguf: Option<(PathBuf, WeightFormat)>,
    /// Sequences decoded in lock-step (each fed the same tokens); 1 = a single sequence.
    pub batch: usize,
    /// Generation ends early at the first of these tokens (a text prompt's end-of-generation
    /// tokens; empty for `--tokens`, which always decodes `n_predict`).
    pub stop_at: Vec<u32>,
}

/// What `run` measured.
pub struct RunOutcome {
    pub generated: Vec<u32>,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub decode_steps: usize,
    /// Bytes a decode step reads (weights, read once per step for the whole batch).
    pub bytes_read_per_step: usize,
    pub kernel: Kernel,
}

/// Generation (greedy unless a temperature is given); with `logits_out`, one row of logits
/// per fed and generated token. `on_token` sees each new token of the (first) sequence as it is
/// chosen, to stream text.
pub fn run(a: &RunArgs, mut on_token: impl FnMut(u32)) -> Result<RunOutcome> {
    if a.pin {
        bitnet_engine::pool::check_pinnable(a.threads)
            .map_err(|e| anyhow::anyhow!("--pin with --threads {}: {e} (lower --threads or drop --pin)", a.threads))?;
    }
    let (model, _source) = load(&a.model, a.format, a.seed, a.threads, a.ffn_activation)?;
    let cfg = model.config.clone();
    if a.tokens.is_empty() {
        bail!("--tokens: give at least one token id");
    }
    if let Some(t) = a.tokens.iter().find(|t| **t as usize >= cfg.vocab) {
        bail!("--tokens: token id {t} is outside the vocabulary of {} (0..{})", cfg.name, cfg.vocab);
    }
    let ctx = a.tokens.len() + a.n_predict;
    if ctx > cfg.max_context {
        bail!(
            "{} prompt tokens + --n-predict {} = {ctx} positions exceed the context length of {} ({})",
            a.tokens.len(),
            a.n_predict,
            cfg.name,
            cfg.max_context
        );
    }
    if let Some(path) = &a.logits_out {
        check_writable(path).map_err(|e| anyhow::anyhow!("--logits-out: {e:#}"))?;
    }
    if let Some((path, format)) = &a.save_gguf {
        check_writable(path).map_err(|e| anyhow::anyhow!("--save-gguf: {e:#}"))?;
        bitnet_engine::gguf::save_model(&model, *format, path)
            .with_context(|| format!("--save-gguf {}", path.display()))?;
    }
    if a.batch == 0 {
        bail!("--batch must be ≥ 1");
    }
    if a.batch > 1 && a.logits_out.is_some() {
        bail!("--logits-out needs --batch 1");
    }
    if a.batch > 1 {
        return run_batch(a, &model, ctx, on_token);
    }
    let mut opts = StateOptions::new(1, ctx, a.kv, a.threads);
    opts.kernel = a.kernel;
    opts.pin = a.pin;
    opts.max_rows = a.tokens.len().clamp(1, 128);
    let mut st = State::new(&model, &opts).context("building the run state")?;
    let keep = a.logits_out.is_some();
    let mut logits: Vec<Vec<f32>> = Vec::new();
    let t0 = Instant::now();
    let last = prefill(&model, &mut st, 0, 0, &a.tokens, keep.then_some(&mut logits))?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut sampler = Sampler::new(a.sampling, cfg.vocab).context("sampling options")?;
    let mut next = sampler.sample(st.logits(last).expect("prefill computed the last row's logits"));
    let mut generated = Vec::with_capacity(a.n_predict);
    let t1 = Instant::now();
    let mut steps = 0;
    for i in 0..a.n_predict {
        generated.push(next);
        on_token(next);
        // The last token is fed only when its logits are wanted.
        if (i + 1 == a.n_predict && !keep) || a.stop_at.contains(&next) {
            break;
        }
        st.forward(&model, &[next], &[0], &[a.tokens.len() + i], LogitsFor::All)?;
        steps += 1;
        let l = st.logits(0).expect("decode row has logits");
        if keep {
            logits.push(l.to_vec());
        }
        next = sampler.sample(l);
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    if let Some(path) = &a.logits_out {
        let all: Vec<u32> = a.tokens.iter().chain(&generated).copied().collect();
        let doc = json!({ "tokens": all, "logits": logits });
        bitnet_report::files::write_atomic(path, serde_json::to_vec(&doc)?.as_slice())
            .with_context(|| format!("--logits-out {}", path.display()))?;
    }
    Ok(RunOutcome {
        generated,
        prefill_secs,
        decode_secs,
        decode_steps: steps,
        bytes_read_per_step: model.weights.bytes_read_per_step_by(a.kernel, 1),
        kernel: st.kernel(&model),
    })
}

/// The timings line `run` prints on stderr: kernel, settings, prefill rate, and the decode
/// rate with the bandwidth it implies where there were decode steps.
pub fn run_timings(a: &RunArgs, out: &RunOutcome) -> String {
    let n_prompt = a.tokens.len();
    let prefill = format!(
        "kernel {}, {} threads, kv {}, batch {}: prefill {} tokens in {:.1} ms ({:.1} tok/s)",
        out.kernel,
        a.threads,
        a.kv,
        a.batch,
        n_prompt,
        out.prefill_secs * 1e3,
        n_prompt as f64 / out.prefill_secs,
    );
    let mib = out.bytes_read_per_step as f64 / (1 << 20) as f64;
    if out.decode_steps == 0 {
        // The one new token came from the prefill's logits: there is no decode rate to print.
        format!("{prefill}; no decode steps (the new token came from the prefill); weights read per step {mib:.1} MiB")
    } else {
        let decode_tps = out.decode_steps as f64 / out.decode_secs;
        // Weights are read once per step for the whole batch.
        let gbps = out.bytes_read_per_step as f64 * decode_tps / a.batch as f64 / 1e9;
        format!(
            "{prefill}; decode {} steps {decode_tps:.1} tok/s ({:.2} ms/token); weights read per step {mib:.1} MiB → {gbps:.1} GB/s",
            out.decode_steps,
            1e3 / decode_tps,
        )
    }
}

/// Batched decode: every sequence is prefilled with the same tokens, then all decode in
/// lock-step (one forward call per step for the whole batch, weights read once per step).
/// Decode tokens/s counts the tokens of every sequence.
fn run_batch(a: &RunArgs, model: &Model, ctx: usize, mut on_token: impl FnMut(u32)) -> Result<RunOutcome> {
    let b = a.batch;
    let mut opts = StateOptions::new(b, ctx, a.kv, a.threads);
    opts.kernel = a.kernel;
    opts.pin = a.pin;
    opts.max_rows = a.tokens.len().clamp(b, 128.max(b));
    let mut st = State::new(model, &opts).context("building the run state")?;
    let mut sampler = Sampler::new(a.sampling, model.config.vocab).context("sampling options")?;
    let t0 = Instant::now();
    let mut next = Vec::with_capacity(b);
    for s in 0..b {
        let last = prefill(model, &mut st, s, 0, &a.tokens, None)?;
        next.push(sampler.sample(st.logits(last).expect("prefill computed the last row's logits")));
    }
    let prefill_secs = t0.elapsed().as_secs_f64();
    let seqs: Vec<usize> = (0..b).collect();
    let mut positions = vec![0usize; b];
    let mut generated = vec![next[0]];
    on_token(next[0]);
    let t1 = Instant::now();
    let mut steps = 0;
    for i in 0..a.n_predict.saturating_sub(1) {
        if a.stop_at.contains(&next[0]) {
            break;
        }
        positions.fill(a.tokens.len() + i);
        st.forward(model, &next, &seqs, &positions, LogitsFor::All)?;
        steps += 1;
        for (s, t) in next.iter_mut().enumerate() {
            *t = sampler.sample(st.logits(s).expect("every row has logits"));
        }
        generated.push(next[0]);
        on_token(next[0]);
    }
    Ok(RunOutcome {
        generated,
        prefill_secs: prefill_secs / b as f64,
        decode_secs: t1.elapsed().as_secs_f64() / b as f64,
        decode_steps: steps,
        bytes_read_per_step: model.weights.bytes_read_per_step_by(a.kernel, b),
        kernel: st.kernel(model),
    })
}

/// Fails early (before any work) when `path`'s directory cannot take a new file.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!("{}: directory {} does not exist", path.display(), dir.display());
    }
    let probe = dir.join(format!(".bitnet-write-test-{}", std::process::id()));
    std::fs::File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .with_context(|| format!("{}: directory {} is not writable", path.display(), dir.display()))
}
