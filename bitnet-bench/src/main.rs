//! `bitnet-bench`: benchmarks of the BitNet b1.58 engine on this machine.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bitnet_bench::kernel_sweep::{self, SweepOptions};
use bitnet_bench::listarg::{parse_list, parse_usize_list};
use bitnet_bench::sweep::{run_sweep, EngineRunner, Progress, SweepSpec};
use bitnet_bench::{model_cmds, output};
use bitnet_engine::model::FfnActivation;
use bitnet_engine::{IsaLevel, Kernel, KernelFamily, KernelForm, KvPrecision, WeightFormat};
use bitnet_report::files::write_atomic;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bitnet-bench",
    version,
    about = "Benchmarks of the BitNet b1.58 engine on this machine. With no subcommand: the model sweep (the main job).",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    sweep: SweepArgs,
}

/// The model sweep's flags (llama-bench's names where they exist). Lists take spaces or
/// commas and ranges: `1-16*2`, `128-512+128`.
#[derive(clap::Args)]
struct SweepArgs {
    /// A preset (bitnet-b1.58-large, bitnet-b1.58-3b, bitnet-b1.58-2b-4t, llama3-8b-1.58, tiny)
    /// or a GGUF file. Default: bitnet-b1.58-large.
    #[arg(long)]
    model: Option<String>,
    /// FFN activation (silu, relu2), overriding the file's metadata key and its architecture's
    /// (and a preset's own).
    #[arg(long = "ffn-activation")]
    ffn_activation: Option<FfnActivation>,
    /// Format of a preset's synthetic linear weights (default: the first --kernels' own, else i2).
    #[arg(long)]
    format: Option<WeightFormat>,
    #[arg(long = "batch-sizes", num_args = 1.., value_name = "N", allow_negative_numbers = true)]
    batch_sizes: Vec<String>,
    /// Prompt tokens prefilled per sequence before decoding.
    #[arg(long = "context-lengths", num_args = 1.., value_name = "N", allow_negative_numbers = true)]
    context_lengths: Vec<String>,
    /// KV cache precisions: f32, f16, bf16, fp8, int8, int4, int2.
    #[arg(long = "kv-precisions", num_args = 1.., value_name = "P")]
    kv_precisions: Vec<String>,
    #[arg(long, num_args = 1.., value_name = "N", allow_negative_numbers = true)]
    threads: Vec<String>,
    /// Kernel families: i2s, tq2, tq1, xnor (each at its default form). Default: the one made
    /// for the model's weights (a GGUF file's format, a preset's --format, else i2s).
    #[arg(long, num_args = 1.., value_name = "K")]
    kernels: Vec<String>,
    /// ISA level for every kernel (default: the best this CPU has).
    #[arg(long)]
    isa: Option<IsaLevel>,
    #[arg(long = "max-new-tokens")]
    max_new_tokens: Option<usize>,
    /// Runs per combination discarded before measuring.
    #[arg(long)]
    warmup: Option<usize>,
    /// Measured runs per combination.
    #[arg(long)]
    repeat: Option<usize>,
    /// Write the JSON report here (atomically, after every combination).
    #[arg(long = "json-report")]
    json_report: Option<PathBuf>,
    #[arg(long)]
    csv: Option<PathBuf>,
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write SVG charts and index.html into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Seed of a preset's synthetic weights and of the prompts (default 42).
    #[arg(long)]
    seed: Option<u64>,
    /// Stage breakdown of each combination (one extra, unmeasured run with spans on); with
    /// --plots, that run's flamegraph, folded stacks and timeline in DIR/traces/, linked from
    /// the page.
    #[arg(long)]
    trace: bool,
    /// Performance counters of that extra run.
    #[arg(long)]
    counters: bool,
    /// Positions of the KV quality measurement (0: none; at most the measuring model's context).
    #[arg(long = "quality-positions")]
    quality_positions: Option<usize>,
    /// Measure each KV precision's quality (KL divergence, top-1 agreement and perplexity
    /// against f32 KV) on this text with the measuring model's tokenizer. Without it, a preset
    /// is measured on the committed trained model (models/) and its held-out text, and a GGUF
    /// model on random token ids (marked `synthetic`).
    #[arg(long = "quality-text", value_name = "FILE")]
    quality_text: Option<PathBuf>,
    /// Measure quality on this GGUF model (with --quality-text) instead of the swept one.
    #[arg(long = "quality-model", value_name = "GGUF")]
    quality_model: Option<PathBuf>,
    /// A fast smoke sweep (1 batch size, 1 short context, 2 precisions, 4 tokens, small probe).
    #[arg(long)]
    quick: bool,
    /// Print nothing but errors.
    #[arg(long)]
    quiet: bool,
    /// Pin threads to cores: the decode's and the bandwidth and compute probes' alike (an
    /// error where this process may run on fewer cores than --threads).
    #[arg(long)]
    pin: bool,
    /// Append the report to this SQLite history database (created if missing).
    #[arg(long)]
    db: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// A model's architecture, hyperparameters and tensors (name, shape, type, bytes).
    Inspect(InspectArgs),
    /// Generate from a text prompt (streamed as it decodes) or token ids (prints the new ids),
    /// greedy or sampled with --temperature; timings on stderr.
    Run(RunCmd),
    /// Text to token ids with the model's own tokenizer, as llama.cpp's llama-tokenize: each
    /// token as `id -> 'piece'`, or with --ids one JSON list (BOS included where the file adds it).
    Tokenize(TokenizeArgs),
    /// Kernel throughput on a model's matrix shapes (2B4T's unless --shapes), in cache and
    /// streaming, against the memory-bandwidth probe and the scalar oracle.
    Kernels(KernelArgs),
    /// Instruction mixes on one core: whether lookups (vpermi2b), bf16 products or adds run
    /// beside vpdpbusd or take its issue slots, i.e. whether any of them could lift batched
    /// decode past the int8 peak on this CPU.
    Pipes {
        /// Timed passes per mix (the best counts)
        #[arg(long, default_value_t = 5)]
        passes: usize,
    },
    /// Check a report against the schema and its invariants.
    Validate { file: PathBuf },
    /// Print the report's JSON Schema; with --check FILE, fail if FILE differs from it.
    Schema {
        #[arg(long)]
        check: Option<PathBuf>,
    },
    /// Merge reports of the same build and model (e.g. interleaved CI runs) into one: equal
    /// configurations pool their samples.
    Merge {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long = "json-report", required = true)]
        json_report: PathBuf,
    },
    /// Show reports side by side: one table (and --markdown, --csv, --plots) over all their
    /// results, e.g. ours beside an imported llama-bench run on the same GGUF.
    Show {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        markdown: Option<PathBuf>,
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Write SVG charts and index.html into this directory
        #[arg(long)]
        plots: Option<PathBuf>,
    },
    /// Perplexity of a text, by llama-perplexity's method (chunks of --ctx tokens, the second
    /// half of each scored); with --kl-base/--kl-ref, KL divergence against a reference run.
    Perplexity(PerplexityArgs),
    /// Convert llama.cpp's `llama-bench -o json` output into our report format.
    ImportLlamaBench {
        file: PathBuf,
        /// Where to write the report (default: stdout).
        #[arg(long = "json-report")]
        json_report: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct InspectArgs {
    /// A GGUF file, or a preset (bitnet-b1.58-large, bitnet-b1.58-3b, bitnet-b1.58-2b-4t,
    /// llama3-8b-1.58, tiny).
    model: String,
    /// Format of a preset's linear layers (i2, tq2_0, tq1_0, bitplanes).
    #[arg(long, default_value = "i2")]
    format: WeightFormat,
    /// FFN activation (silu, relu2), overriding the file's metadata key and its architecture's
    /// (and a preset's own).
    #[arg(long = "ffn-activation")]
    ffn_activation: Option<FfnActivation>,

    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("text").required(true).args(["prompt", "file"])))]
struct TokenizeArgs {
    /// A GGUF file with a tokenizer.
    #[arg(long)]
    model: String,
    /// The text, taken as it is (no escape processing).
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// A file holding the text (UTF-8).
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// Print only the ids, as one JSON list.
    #[arg(long)]
    ids: bool,
    /// Treat text that looks like a special token (`<|begin_of_text|>`, `<s>`) as plain text.
    #[arg(long)]
    no_parse_special: bool,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["tokens", "prompt", "prompt_file"])))]
struct RunCmd {
    /// A GGUF file, or a preset with synthetic weights (see `inspect`).
    #[arg(long)]
    model: String,
    /// FFN activation (silu, relu2), overriding the file's metadata key and its architecture's
    /// (and a preset's own).
    #[arg(long = "ffn-activation")]
    ffn_activation: Option<FfnActivation>,
    /// Token ids to feed, e.g. 1,2,3 (prints the new ids).
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<u32>,
    /// A text prompt, tokenized with the model's tokenizer (BOS where the file adds it, special
    /// tokens parsed); the generated text is streamed to stdout, ending early at an
    /// end-of-generation token.
    #[arg(long)]
    prompt: Option<String>,
    /// The prompt from a file (UTF-8).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 16)]
    n_predict: usize,
    /// KV cache precision (f32, f16, bf16, fp8, int8, int4, int2).
    #[arg(long, default_value = "f16")]
    kv: KvPrecision,
    /// Threads (default: all available).
    #[arg(long)]
    threads: Option<usize>,
    /// Kernel family for the linear layers (i2s, tq2, tq1, xnor); default: the format's best.
    #[arg(long)]
    kernel: Option<KernelFamily>,
    /// ISA level of the kernel (scalar, avx2, avx512); default: the best this CPU has.
    #[arg(long)]
    isa: Option<IsaLevel>,
    /// Format of the synthetic linear weights (i2, tq2_0, tq1_0, bitplanes); default: the
    /// kernel's native format, else i2.
    #[arg(long)]
    format: Option<WeightFormat>,
    /// Seed of the synthetic weights: 42, as the sweep's and bitnet-trace's, so that `run
    /// --save-gguf` writes the weights they measure.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Pin worker threads to cores.
    #[arg(long)]
    pin: bool,
    /// Write {"tokens": [...], "logits": [[...], ...]}: one row per fed and generated token.
    #[arg(long)]
    logits_out: Option<std::path::PathBuf>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample only from the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample only from the most likely tokens whose probabilities reach p.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    sample_seed: u64,
    /// Save the model as a GGUF file, to run the very same weights with llama.cpp or bitnet.cpp:
    /// TQ formats under `bitnet` (SiLU models; llama.cpp runs them) or `bitnet-25` (ReLU²
    /// models, which llama.cpp's SiLU-only `bitnet` graph would run as another function), i2 as
    /// I2_S under `bitnet-b1.58`, the official 2B4T layout.
    #[arg(long)]
    save_gguf: Option<std::path::PathBuf>,
    /// Linear-layer format of --save-gguf (tq2_0, tq1_0, or i2 for I2_S); default: the
    /// model's TQ format, else tq2_0.
    #[arg(long)]
    save_format: Option<WeightFormat>,
    /// Decode this many sequences in lock-step (each fed --tokens); prints the first one's
    /// tokens, and tokens/s over all of them.
    #[arg(long, default_value_t = 1)]
    batch: usize,
}

#[derive(clap::Args)]
struct PerplexityArgs {
    /// A GGUF file with a tokenizer (presets have none).
    #[arg(long)]
    model: String,
    /// The text to score (UTF-8).
    #[arg(long)]
    text: PathBuf,
    /// Tokens per chunk (llama-perplexity's -c); at most the model's context length.
    #[arg(long, default_value_t = bitnet_bench::perplexity::DEFAULT_CTX)]
    ctx: usize,
    /// Score at most this many chunks (default: all the text holds).
    #[arg(long)]
    chunks: Option<usize>,
    /// Tokens per forward call (default: min(ctx, 128)).
    #[arg(long)]
    batch: Option<usize>,
    /// Threads (default: all available).
    #[arg(long)]
    threads: Option<usize>,
    /// KV cache precision (f32, f16, bf16, fp8, int8, int4, int2).
    #[arg(long, default_value = "f16")]
    kv: KvPrecision,
    /// Kernel family for the linear layers (i2s, tq2, tq1, xnor); default: the format's best.
    #[arg(long)]
    kernel: Option<KernelFamily>,
    /// FFN activation (silu, relu2), overriding the file's metadata key and its architecture's.
    #[arg(long = "ffn-activation")]
    ffn_activation: Option<FfnActivation>,
    /// Save this run's log-probabilities as a KL base (see docs/perplexity.md).
    #[arg(long = "kl-base", conflicts_with = "kl_ref")]
    kl_base: Option<PathBuf>,
    /// Compare this run with a KL base: KL divergence, top-token agreement, Δp.
    #[arg(long = "kl-ref")]
    kl_ref: Option<PathBuf>,
    /// Tokens kept per position in a KL base of a vocabulary larger than 4096 (smaller ones
    /// are kept whole).
    #[arg(long = "kl-top-k", default_value_t = bitnet_bench::perplexity::DEFAULT_KL_TOP_K)]
    kl_top_k: usize,
    /// Write the result as JSON (reports/perplexity.schema.json).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::Args, Default)]
struct KernelArgs {
    /// Batch sizes (activation vectors per call).
    #[arg(long = "batch", value_delimiter = ',', num_args = 1.., default_values_t = [1usize, 8])]
    batch: Vec<usize>,
    /// Kernel families to run (scalar, i2s, tq2, tq1, xnor); default all.
    #[arg(long = "kernels", value_delimiter = ',', num_args = 1..)]
    kernels: Vec<KernelFamily>,
    /// ISA levels to run (scalar, avx2, avx512); default every level this CPU has.
    #[arg(long = "isa", value_delimiter = ',', num_args = 1..)]
    isa: Vec<IsaLevel>,
    /// Forms to run (fused, split, lut and perm — tq1 only); default all.
    #[arg(long = "form", value_delimiter = ',', num_args = 1..)]
    form: Vec<KernelForm>,
    /// MiB of weights in the streaming case (0 skips it).
    #[arg(long, default_value_t = 512)]
    streaming_mib: usize,
    /// MiB read by the bandwidth probe.
    #[arg(long, default_value_t = 1024)]
    probe_mib: usize,
    /// Run the linear-layer shapes of this preset (e.g. bitnet-b1.58-large).
    #[arg(long, default_value = kernel_sweep::DEFAULT_SHAPES)]
    shapes: String,
    /// Quick run: shorter timings, 64 MiB probe, no streaming case (for smoke tests only).
    #[arg(long)]
    quick: bool,
    /// Also run the LM head (Q6_K rows, the --shapes preset's vocabulary × hidden): 2048 rows
    /// in cache and the whole head streamed. On by default when --kernels is not given.
    #[arg(long, conflicts_with = "no_head")]
    head: bool,
    /// Skip the LM head.
    #[arg(long)]
    no_head: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(()) if INTERRUPTED.load(Ordering::SeqCst) => ExitCode::from(130),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bitnet-bench: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let args = match cli.command {
        Some(Command::Inspect(a)) => {
            let v = model_cmds::inspect(&a.model, a.format, a.ffn_activation)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", model_cmds::inspect_table(&v));
            }
            return Ok(());
        }
        Some(Command::Run(a)) => return run_model(a),
        Some(Command::Tokenize(a)) => {
            let text = match (&a.prompt, &a.file) {
                (Some(p), _) => p.clone(),
                (None, Some(f)) => model_cmds::read_text(f, "--file")?,
                (None, None) => unreachable!("clap requires one"),
            };
            let tok = model_cmds::tokenizer(&a.model)?;
            let ids = tok.encode(&text, true, !a.no_parse_special);
            print!("{}", model_cmds::tokenize_listing(&tok, &ids, a.ids));
            return Ok(());
        }
        Some(Command::Perplexity(a)) => return perplexity(a),
        Some(Command::Kernels(a)) => a,
        Some(Command::Pipes { passes }) => {
            let r = bitnet_engine::probes::compute_peak::measure_pipe_mixes(passes).context("--passes")?;
            print!("{}", bitnet_bench::pipes::table(&r));
            return Ok(());
        }
        Some(Command::Validate { file }) => {
            let r = bitnet_report::load(&file)?;
            println!(
                "{}: valid (schema {}, {} results, {})",
                file.display(),
                r.schema_version,
                r.results.len(),
                if r.complete { "complete" } else { "incomplete" }
            );
            return Ok(());
        }
        Some(Command::Schema { check }) => {
            let schema = bitnet_report::report::schema_json();
            match check {
                None => print!("{schema}"),
                Some(f) => {
                    let committed =
                        std::fs::read_to_string(&f).with_context(|| format!("{}: cannot read", f.display()))?;
                    if committed != schema {
                        anyhow::bail!(
                            "{} is not the schema of this build's Report type: regenerate it with `bitnet-bench schema > {}`",
                            f.display(),
                            f.display()
                        );
                    }
                    eprintln!("{}: current", f.display());
                }
            }
            return Ok(());
        }
        Some(Command::Merge { files, json_report }) => {
            let reports = files
                .iter()
                .map(|f| bitnet_report::load(f).map(|r| (f.display().to_string(), r)))
                .collect::<Result<Vec<_>, _>>()?;
            let merged = bitnet_report::merge(&reports)?;
            write_atomic(&json_report, (serde_json::to_string_pretty(&merged)? + "\n").as_bytes())?;
            eprintln!("bitnet-bench: merged {} reports into {}", files.len(), json_report.display());
            return Ok(());
        }
        Some(Command::Show { files, markdown, csv, plots }) => {
            let reports = files
                .iter()
                .map(|f| bitnet_report::load(f).map(|r| (f.display().to_string(), r)))
                .collect::<Result<Vec<_>, _>>()?;
            let (all, headers) = output::side_by_side(&reports)?;
            let mut models: Vec<&str> = Vec::new();
            for (_, r) in &reports {
                if !models.contains(&r.model.name.as_str()) {
                    models.push(&r.model.name);
                }
            }
            let title = models.join(" / ");
            println!("{}", output::table_with(&headers, &all));
            if let Some(p) = &csv {
                write_atomic(p, output::csv(&all).as_bytes()).with_context(|| format!("--csv {}", p.display()))?;
            }
            if let Some(p) = &markdown {
                write_atomic(p, output::markdown_with(&title, &headers, &all).as_bytes())
                    .with_context(|| format!("--markdown {}", p.display()))?;
            }
            if let Some(d) = &plots {
                let links: Vec<PathBuf> = csv.iter().chain(&markdown).cloned().collect();
                bitnet_bench::page::write_all_with(&title, &reports, &all, d, &links)?;
            }
            return Ok(());
        }
        Some(Command::ImportLlamaBench { file, json_report }) => {
            let r = bitnet_bench::import::import_file(&file)?;
            let text = serde_json::to_string_pretty(&r)? + "\n";
            match json_report {
                Some(p) => write_atomic(&p, text.as_bytes())?,
                None => print!("{text}"),
            }
            return Ok(());
        }
        None => return model_sweep(cli.sweep),
    };
    let run_head = args.head || (args.kernels.is_empty() && !args.no_head);
    let mut head_isas = vec![IsaLevel::Scalar];
    head_isas.extend(args.isa.iter().filter(|i| i.is_supported()));
    if args.isa.is_empty() {
        head_isas.push(IsaLevel::best());
    }
    let mut opts = SweepOptions {
        batches: args.batch.clone(),
        shapes: kernel_sweep::preset_shapes(&args.shapes)?,
        head: if run_head { Some(kernel_sweep::preset_head(&args.shapes)?) } else { None },
        head_isas,
        ..Default::default()
    };
    opts.kernels.retain(|k| {
        (args.kernels.is_empty() || args.kernels.contains(&k.family()) || k.family() == KernelFamily::Scalar)
            && (args.isa.is_empty() || args.isa.contains(&k.isa()) || k.family() == KernelFamily::Scalar)
            && (args.form.is_empty() || args.form.contains(&k.form()))
    });
    for isa in &args.isa {
        if let Some(why) = isa.unsupported_reason() {
            eprintln!("bitnet-bench: note: --isa {isa} skipped: {why}");
        }
    }
    opts.streaming_bytes = args.streaming_mib << 20;
    opts.probe_bytes = args.probe_mib << 20;
    if args.quick {
        opts.min_time = Duration::from_millis(5);
        opts.samples = 3;
        opts.streaming_bytes = 0;
        opts.probe_bytes = 64 << 20;
        opts.shapes.truncate(2);
    }
    if opts.kernels.iter().all(|k| k.family() == KernelFamily::Scalar) {
        anyhow::bail!(
            "no kernel matches --kernels/--isa/--form on this CPU (available: {})",
            names(&Kernel::all_supported())
        );
    }
    eprintln!(
        "bitnet-bench kernels: {} kernels × {} shapes × B {:?}{}; CPU ISA best: {}",
        opts.kernels.len(),
        opts.shapes.len(),
        opts.batches,
        if opts.head.is_some() { ", and the LM head" } else { "" },
        IsaLevel::best()
    );
    let report = kernel_sweep::run(&opts, |r| {
        eprintln!("  {:<24} {:<26} B={:<3} {:>8.2} GB/s", r.kernel, r.shape, r.batch, r.gbps);
    })
    .context("kernel sweep")?;
    println!("{}", kernel_sweep::table(&report));
    Ok(())
}

/// `run`: a text prompt's answer is streamed to stdout as it decodes (token ids are printed
/// at the end); the timings go to stderr.
fn run_model(a: RunCmd) -> Result<()> {
    let threads = model_cmds::threads_or_all(a.threads)?;
    let (kernel, format) = model_cmds::run_kernel_and_format(a.kernel, a.isa, a.format)?;
    let prompt_text = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(model_cmds::read_text(f, "--prompt-file")?),
        (None, None) => None,
    };
    let prompt = prompt_text.as_deref().map(|text| model_cmds::text_prompt(&a.model, text)).transpose()?;
    let mut stream = prompt.as_ref().map(|p| bitnet_engine::tokenizer::StreamDecoder::new(&p.tokenizer));
    if let Some(text) = &prompt_text {
        print!("{text}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    let on_token = |id: u32| {
        if let Some(s) = stream.as_mut() {
            print!("{}", s.push(id));
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
    };
    let (tokens, stop_at) = match &prompt {
        Some(p) => (p.tokens.clone(), p.stop_at.clone()),
        None => (a.tokens, Vec::new()),
    };
    let args = model_cmds::RunArgs {
        model: a.model,
        ffn_activation: a.ffn_activation,
        format,
        seed: a.seed,
        tokens,
        stop_at,
        n_predict: a.n_predict,
        kv: a.kv,
        threads,
        kernel,
        pin: a.pin,
        logits_out: a.logits_out,
        batch: a.batch,
        save_gguf: a.save_gguf.map(|p| (p, a.save_format.unwrap_or(model_cmds::default_save_format(format)))),
        sampling: bitnet_engine::model::SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.sample_seed,
        },
    };
    let out = model_cmds::run(&args, on_token)?;
    match stream {
        Some(s) => println!("{}", s.finish()),
        None => println!("{}", out.generated.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")),
    }
    eprintln!("{}", model_cmds::run_timings(&args, &out));
    Ok(())
}

/// `perplexity`: every input is checked (files, tokenizer, ctx, text length, KL base) before
/// the model loads; Ctrl-C stops after the chunk in progress and reports what was scored.
fn perplexity(a: PerplexityArgs) -> Result<()> {
    use bitnet_bench::perplexity::{self as ppl, TextPerplexityOptions};
    let prepared = ppl::prepare(&TextPerplexityOptions {
        model: a.model,
        text: a.text,
        ctx: a.ctx,
        chunks: a.chunks,
        batch: a.batch,
        threads: a.threads,
        kv: a.kv,
        kernel: a.kernel,
        ffn_activation: a.ffn_activation,
        kl_base: a.kl_base,
        kl_ref: a.kl_ref,
        kl_top_k: a.kl_top_k,
        json: a.json.clone(),
    })?;
    let stop = stop_on_ctrl_c("reporting the chunks scored so far");
    let (chunks, o) = (prepared.chunks, &prepared.options);
    eprintln!(
        "bitnet-bench perplexity: {} tokens, {chunks} of {} chunks × ctx {}, batch {}, kv {}, {} threads",
        prepared.tokens, prepared.chunks_available, o.ctx, o.batch, o.kv, o.threads
    );
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(chunks as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} chunks, ETA {eta}")
                .expect("a valid template"),
        );
        b
    });
    let outcome = prepared.run(&stop, &mut |e| {
        let line = ppl::chunk_line(e, chunks);
        match &bar {
            // On stdout as without a bar (b.println would put it on stderr).
            Some(b) => {
                b.suspend(|| println!("{line}"));
                b.inc(1);
            }
            None => println!("{line}"),
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let outcome = outcome?;
    if outcome.kl_base_empty {
        eprintln!("bitnet-bench: --kl-base: no chunk finished, nothing written");
    }
    print!("{}", ppl::summary(&outcome.result));
    if let Some(p) = &a.json {
        write_atomic(p, (serde_json::to_string_pretty(&outcome.result)? + "\n").as_bytes())?;
    }
    Ok(())
}

fn names(k: &[Kernel]) -> String {
    k.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
}

/// Set by Ctrl-C: the sweep stops after the run in progress and writes what finished.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// A flag Ctrl-C sets (saying `what` happens next); a second Ctrl-C ends the process at once.
fn stop_on_ctrl_c(what: &'static str) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        INTERRUPTED.store(true, Ordering::SeqCst);
        eprintln!("\nbitnet-bench: interrupted: {what}");
    });
    stop
}

impl SweepArgs {
    /// The sweep these flags ask for: [`SweepSpec::quick`] or the default, with every flag
    /// given replacing its field. Output flags (reports, plots, --db, --quiet) are not part of
    /// it: [`model_sweep`] checks and writes them.
    fn spec(&self) -> Result<SweepSpec> {
        let mut spec = if self.quick { SweepSpec::quick() } else { SweepSpec::default() };
        if let Some(m) = &self.model {
            spec.model = m.clone();
        }
        spec.ffn_activation = self.ffn_activation;
        spec.format = self.format;
        if !self.batch_sizes.is_empty() {
            spec.batch_sizes = parse_usize_list("--batch-sizes", &self.batch_sizes)?;
        }
        if !self.context_lengths.is_empty() {
            spec.context_lengths = parse_usize_list("--context-lengths", &self.context_lengths)?;
        }
        if !self.kv_precisions.is_empty() {
            spec.kv_precisions = parse_list("--kv-precisions", &self.kv_precisions)?;
        }
        if !self.threads.is_empty() {
            spec.threads = parse_usize_list("--threads", &self.threads)?;
        }
        if !self.kernels.is_empty() {
            spec.kernels = parse_list("--kernels", &self.kernels)?;
            if spec.kernels.contains(&KernelFamily::Scalar) {
                anyhow::bail!(
                    "--kernels scalar: the oracle is for tests, not a model sweep (use i2s, tq2, tq1 or xnor)"
                );
            }
        }
        spec.isa = self.isa;
        spec.max_new_tokens = self.max_new_tokens.unwrap_or(spec.max_new_tokens);
        spec.warmup = self.warmup.unwrap_or(spec.warmup);
        spec.repeat = self.repeat.unwrap_or(spec.repeat);
        spec.seed = self.seed.unwrap_or(spec.seed);
        spec.quality_positions = self.quality_positions.unwrap_or(spec.quality_positions);
        spec.quality_text = self.quality_text.clone();
        spec.quality_model = self.quality_model.clone();
        spec.trace = self.trace;
        spec.counters = self.counters;
        spec.pin = self.pin;
        Ok(spec)
    }
}

/// The model sweep: build the spec from the flags, check the outputs can be written (before
/// minutes of measuring, not after), run, write the reports.
fn model_sweep(a: SweepArgs) -> Result<()> {
    let mut spec = a.spec()?;
    for p in [&a.json_report, &a.csv, &a.markdown].into_iter().flatten() {
        model_cmds::check_writable(p)?;
    }
    if let Some(d) = &a.plots {
        if d.exists() && !d.is_dir() {
            anyhow::bail!("--plots {}: exists and is not a directory", d.display());
        }
        // Before the sweep, not after it: the directory, or the nearest part of its path that
        // exists (the rest is made when the plots are written), must take files.
        let existing = d.ancestors().find(|p| p.is_dir()).unwrap_or(std::path::Path::new("."));
        model_cmds::check_writable(&existing.join("index.html")).with_context(|| format!("--plots {}", d.display()))?;
    }

    let quiet = a.quiet;
    let mut runner = EngineRunner::load(&spec)?;
    spec.kernels = runner.kernels().to_vec();
    if !quiet {
        eprintln!(
            "bitnet-bench: {} — batch {:?} × context {:?} × KV {:?} × threads {:?} × kernels {:?}; {} warm-up + {} runs × {} new tokens",
            spec.model,
            spec.batch_sizes,
            spec.context_lengths,
            spec.kv_precisions.iter().map(|k| k.name()).collect::<Vec<_>>(),
            spec.threads,
            spec.kernels.iter().map(|k| k.name()).collect::<Vec<_>>(),
            spec.warmup,
            spec.repeat,
            spec.max_new_tokens
        );
    }
    if spec.counters && !quiet {
        // Said once, up front: the report's counters then hold only what could be opened.
        let probe = bitnet_trace::counters::Counters::open(&bitnet_trace::counters::thread_ids());
        if let Some(note) = probe.fallback_note() {
            eprintln!("bitnet-bench: --counters: {note}");
        }
    }
    let stop = stop_on_ctrl_c("finishing the run in progress, then writing the finished combinations");
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} combinations, ETA {eta} — {msg}")
                .expect("a valid template"),
        );
        b
    });
    let json_path = a.json_report.clone();
    let mut traces: Vec<Option<bitnet_bench::page::TraceFiles>> = Vec::new();
    let report = run_sweep(&spec, &mut runner, &stop, |p| {
        match p {
            Progress::Start { index, total, combo } => {
                let what = format!(
                    "{} B={} ctx={} kv={} threads={}",
                    combo.kernel.name(),
                    combo.batch,
                    combo.context_length,
                    combo.kv,
                    combo.threads
                );
                if let Some(b) = &bar {
                    b.set_length(total as u64);
                    b.set_position(index as u64);
                    b.set_message(what);
                } else if !quiet {
                    eprintln!("[{}/{total}] {what}", index + 1);
                }
            }
            Progress::Done { index, total, result, report, traced } => {
                // After every combination, so an interruption or crash loses nothing finished.
                if let Some(p) = &json_path {
                    write_atomic(p, (serde_json::to_string_pretty(report)? + "\n").as_bytes())?;
                }
                // A trace that cannot be drawn (an engine built without spans records none)
                // costs its links, not the sweep.
                if let (Some(d), Some(t)) = (&a.plots, traced) {
                    traces.resize(report.results.len(), None);
                    match bitnet_bench::page::write_traced(d, result, t) {
                        Ok(files) => traces[report.results.len() - 1] = Some(files),
                        Err(e) => eprintln!("bitnet-bench: warning: {}: no trace files: {e:#}", result.config),
                    }
                }
                if let Some(b) = &bar {
                    b.set_position(index as u64 + 1);
                } else if !quiet {
                    eprintln!(
                        "[{}/{total}] done: pp {:.1} tok/s, tg {:.2} tok/s, {:.0}% of roofline{}",
                        index + 1,
                        result.prefill.tokens_per_sec.median(),
                        result.decode.tokens_per_sec.median(),
                        result.decode.roofline_fraction * 100.0,
                        result
                            .decode
                            .compute_fraction
                            .map_or(String::new(), |f| format!(", {:.0}% of int8 peak", f * 100.0))
                    );
                }
            }
        }
        Ok(())
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(p) = &a.json_report {
        write_atomic(p, (serde_json::to_string_pretty(&report)? + "\n").as_bytes())?;
    }
    if let Some(p) = &a.csv {
        write_atomic(p, output::csv(&report).as_bytes())?;
    }
    if let Some(p) = &a.markdown {
        write_atomic(p, output::markdown(&report).as_bytes())?;
    }
    if let Some(d) = &a.plots {
        let links: Vec<PathBuf> = a.json_report.iter().chain(&a.csv).chain(&a.markdown).cloned().collect();
        bitnet_bench::page::write_all_traced(&report, d, &links, &traces)?;
    }
    if let Some(db) = &a.db {
        let id = bitnet_bench::history::append(db, &report)?;
        if !quiet {
            eprintln!("bitnet-bench: appended as run {id} to {}", db.display());
        }
    }
    if !quiet {
        println!("{}", output::table(&report));
    }
    if !report.complete {
        eprintln!(
            "bitnet-bench: interrupted: {} finished combinations written (report marked incomplete)",
            report.results.len()
        );
    }
    Ok(())
}
