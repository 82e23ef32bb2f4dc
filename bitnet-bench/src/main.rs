//! `bitnet-bench`: benchmarks of the BitNet b1.58 engine on this machine.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use bitnet_bench::kernel_sweep::{self, SweepOptions};
use bitnet_bench::model_cmds;
use bitnet_engine::{IsaLevel, Kernel, KernelFamily, KernelForm, KvPrecision, WeightFormat};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bitnet-bench", version, about = "Benchmarks of the BitNet b1.58 engine on this machine")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// A model's architecture, hyperparameters and tensors (name, shape, type, bytes).
    Inspect(InspectArgs),
    /// Feed token ids, generate (greedy, or sampled with --temperature), print the new token
    /// ids (timings on stderr).
    Run(RunCmd),
    /// Kernel throughput on BitNet b1.58 2B4T shapes, in cache and streaming, against the
    /// memory-bandwidth probe and the scalar oracle (the default job for now).
    Kernels(KernelArgs),
}

#[derive(clap::Args)]
struct InspectArgs {
    /// A GGUF file, or a preset (bitnet-b1.58-large, bitnet-b1.58-3b, bitnet-b1.58-2b-4t,
    /// llama3-8b-1.58, tiny).
    model: String,
    /// Format of a preset's linear layers (i2, tq2_0, tq1_0, bitplanes).
    #[arg(long, default_value = "i2")]
    format: WeightFormat,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct RunCmd {
    /// A GGUF file, or a preset with synthetic weights (see `inspect`).
    #[arg(long)]
    model: String,
    /// Token ids to feed, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
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
    /// Seed of the synthetic weights.
    #[arg(long, default_value_t = 1)]
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
    /// Save the model as a GGUF file llama.cpp loads (architecture bitnet), to run the very same
    /// weights with llama-bench.
    #[arg(long)]
    save_gguf: Option<std::path::PathBuf>,
    /// Linear-layer format of --save-gguf (tq2_0 or tq1_0); default: the model's, else tq2_0.
    #[arg(long)]
    save_format: Option<WeightFormat>,
    /// Decode this many sequences in lock-step (each fed --tokens); prints the first one's
    /// tokens, and tokens/s over all of them.
    #[arg(long, default_value_t = 1)]
    batch: usize,
}

#[derive(clap::Args, Default)]
struct KernelArgs {
    /// Batch sizes (activation vectors per call).
    #[arg(long = "batch", value_delimiter = ',', default_values_t = [1usize, 8])]
    batch: Vec<usize>,
    /// Kernel families to run (scalar, i2s, tq2, tq1, xnor); default all.
    #[arg(long = "kernels", value_delimiter = ',')]
    kernels: Vec<KernelFamily>,
    /// ISA levels to run (scalar, avx2, avx512); default every level this CPU has.
    #[arg(long = "isa", value_delimiter = ',')]
    isa: Vec<IsaLevel>,
    /// Forms to run (fused, split); default both.
    #[arg(long = "form", value_delimiter = ',')]
    form: Vec<KernelForm>,
    /// MiB of weights in the streaming case (0 skips it).
    #[arg(long, default_value_t = 512)]
    streaming_mib: usize,
    /// MiB read by the bandwidth probe.
    #[arg(long, default_value_t = 1024)]
    probe_mib: usize,
    /// Quick run: shorter timings, 64 MiB probe, no streaming case (for smoke tests only).
    #[arg(long)]
    quick: bool,
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
            let v = model_cmds::inspect(&a.model, a.format)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", model_cmds::inspect_table(&v));
            }
            return Ok(());
        }
        Some(Command::Run(a)) => return run_model(a),
        Some(Command::Kernels(a)) => a,
        None => KernelArgs { batch: vec![1, 8], streaming_mib: 512, probe_mib: 1024, ..Default::default() },
    };
    let mut opts = SweepOptions { batches: args.batch.clone(), ..Default::default() };
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
        "bitnet-bench kernels: {} kernels × {} shapes × B {:?}; CPU ISA best: {}",
        opts.kernels.len(),
        opts.shapes.len(),
        opts.batches,
        IsaLevel::best()
    );
    let report = kernel_sweep::run(&opts, |r| {
        eprintln!("  {:<24} {:<26} B={:<3} {:>8.2} GB/s", r.kernel, r.shape, r.batch, r.gbps);
    })
    .context("kernel sweep")?;
    println!("{}", kernel_sweep::table(&report));
    Ok(())
}

fn run_model(a: RunCmd) -> Result<()> {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        anyhow::bail!("--threads must be ≥ 1");
    }
    let kernel = match (a.kernel, a.isa) {
        (None, None) => None,
        (family, isa) => {
            let family = family.unwrap_or(a.format.map_or(KernelFamily::I2s, |f| Kernel::best_for(f).family()));
            let isa = isa.unwrap_or_else(|| Kernel::best(family).isa());
            Some(
                Kernel::new(family, isa, family.default_form())
                    .with_context(|| format!("--kernel {family} --isa {isa}"))?,
            )
        }
    };
    let format = a.format.unwrap_or_else(|| kernel.map_or(WeightFormat::I2, |k| k.family().native_format()));
    if let Some(k) = kernel {
        if !k.family().accepts(format) {
            anyhow::bail!(
                "--kernel {} cannot read --format {format} weights (it reads {})",
                k.family(),
                k.family().native_format()
            );
        }
    }
    let out = model_cmds::run(&model_cmds::RunArgs {
        model: a.model,
        format,
        seed: a.seed,
        tokens: a.tokens.clone(),
        n_predict: a.n_predict,
        kv: a.kv,
        threads,
        kernel,
        pin: a.pin,
        logits_out: a.logits_out,
        batch: a.batch,
        save_gguf: a.save_gguf.map(|p| {
            let f = a.save_format.unwrap_or(if format == WeightFormat::Tq1_0 {
                WeightFormat::Tq1_0
            } else {
                WeightFormat::Tq2_0
            });
            (p, f)
        }),
        sampling: bitnet_engine::model::SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.sample_seed,
        },
    })?;
    println!("{}", out.generated.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(","));
    let decode_tps = out.decode_steps as f64 / out.decode_secs;
    eprintln!(
        "kernel {}, {} threads, kv {}, batch {}: prefill {} tokens in {:.1} ms ({:.1} tok/s); decode {} steps {:.1} tok/s ({:.2} ms/token); weights read per step {:.1} MiB → {:.1} GB/s",
        out.kernel,
        threads,
        a.kv,
        a.batch,
        a.tokens.len(),
        out.prefill_secs * 1e3,
        a.tokens.len() as f64 / out.prefill_secs,
        out.decode_steps,
        decode_tps,
        1e3 / decode_tps,
        out.bytes_read_per_token as f64 / (1 << 20) as f64,
        // Weights are read once per step for the whole batch.
        out.bytes_read_per_token as f64 * decode_tps / a.batch as f64 / 1e9
    );
    Ok(())
}

fn names(k: &[Kernel]) -> String {
    k.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
}
