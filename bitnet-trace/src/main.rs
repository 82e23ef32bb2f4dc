//! `bitnet-trace`: per-stage flamegraphs, timelines, counters and profiles of a BitNet run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use bitnet_engine::instrument::Level;
use bitnet_engine::{IsaLevel, KernelFamily, KernelForm, KvPrecision, WeightFormat};
use bitnet_trace::run::summary_table;
use bitnet_trace::{run_trace, TraceOptions};
use clap::{Parser, Subcommand, ValueEnum};

// dhat's allocator only counts while a `--dhat` profiler runs; otherwise it forwards to the
// system allocator.
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[derive(Parser)]
#[command(
    name = "bitnet-trace",
    version,
    about = "Where the time of a BitNet token goes: per-stage spans (flamegraph, timeline, summary), counters and profiles",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    trace: TraceArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Differential flamegraph of two stages.folded files: which stages grew or shrank.
    Diff {
        before: PathBuf,
        after: PathBuf,
        /// The SVG to write.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// What the spans cost: decode tokens/s with spans off, aggregated and on a timeline, in
    /// interleaved rounds in one process.
    Overhead {
        /// What runs (the trace's options that decide it; `--tokens` is `--steps` here, and
        /// nothing is written, so `--out`, `--level`, `--pprof`... are refused, not ignored).
        #[command(flatten)]
        run: RunArgs,
        /// Timed rounds (each runs every level once, in rotating order).
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Decode steps per level per round.
        #[arg(long, default_value_t = 16)]
        steps: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LevelArg {
    Off,
    Aggregate,
    Timeline,
}

/// The options of a trace: what runs ([`RunArgs`]) and what is recorded and written.
#[derive(clap::Args)]
struct TraceArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Decode steps after the prefill.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Output directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Span level: timeline (also trace.json), aggregate, or off (to measure overhead).
    #[arg(long, value_enum, default_value = "timeline")]
    level: LevelArg,
    /// Also take a sampling profile (profile.pb, pprof-flamegraph.svg).
    #[arg(long)]
    pprof: bool,
    /// Also take a heap profile (dhat-heap.json; allocations per decode step in the summary).
    #[arg(long)]
    dhat: bool,
    /// Do not open performance counters.
    #[arg(long)]
    no_counters: bool,
    /// Print only the file list, not the table.
    #[arg(long)]
    quiet: bool,
    /// Exit 1 when a consistency check fails (after writing every file), for CI jobs that
    /// gate on the instrumentation; without it a failure is printed and the exit is 0, since
    /// on a shared machine a preempted caller thread can fail the wall-time check of a short run.
    #[arg(long)]
    strict_checks: bool,
}

/// What runs: model, shapes, kernel, threads (shared by a trace and `overhead`).
#[derive(clap::Args)]
struct RunArgs {
    /// A preset (bitnet-b1.58-large, bitnet-b1.58-3b, bitnet-b1.58-2b-4t, llama3-8b-1.58, tiny)
    /// or a GGUF file.
    #[arg(long, default_value = "bitnet-b1.58-2b-4t")]
    model: String,
    /// FFN activation (silu, relu2), overriding the file's metadata key and its architecture's
    /// (and a preset's own).
    #[arg(long = "ffn-activation")]
    ffn_activation: Option<bitnet_engine::model::FfnActivation>,
    /// Weight format of a preset's synthetic weights (default: the --kernel's own format, else
    /// i2).
    #[arg(long)]
    format: Option<WeightFormat>,
    /// Sequences decoded in lock-step.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Prompt tokens prefilled per sequence before decoding.
    #[arg(long, default_value_t = 128)]
    context_length: usize,
    /// KV cache precision: f32, f16, bf16, fp8, int8, int4, int2.
    #[arg(long, default_value = "f16")]
    kv: KvPrecision,
    /// Threads in all (the caller is one).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Kernel family: scalar, i2s, tq2, tq1, xnor (default: the one made for the model's
    /// weights: a GGUF file's format, a preset's --format, else i2s).
    #[arg(long)]
    kernel: Option<KernelFamily>,
    /// ISA level: scalar, avx2, avx512 (default: the best this CPU has).
    #[arg(long)]
    isa: Option<IsaLevel>,
    /// Kernel form: split (default; unpack and dot timed apart), fused (one `unpack_dot`
    /// stage), lut or perm (tq1 only: one `lookup` stage).
    #[arg(long)]
    form: Option<KernelForm>,
    /// Events kept per thread on the timeline (more are counted, not kept).
    #[arg(long, default_value_t = 2_000_000)]
    timeline_capacity: usize,
    /// Pin threads to cores.
    #[arg(long)]
    pin: bool,
    /// Seed of synthetic weights and prompts.
    #[arg(long, default_value_t = 42)]
    seed: u64,
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
        Ok(code) => code,
        Err(e) => {
            eprintln!("bitnet-trace: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    if let Some(Command::Diff { before, after, output }) = cli.command {
        let mut svg = Vec::new();
        bitnet_trace::folded::differential(
            &before.to_string_lossy(),
            &after.to_string_lossy(),
            "bitnet-trace diff",
            &mut svg,
        )?;
        bitnet_report::files::write_atomic(&output, &svg).with_context(|| format!("-o {}", output.display()))?;
        eprintln!("bitnet-trace: wrote {}", output.display());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(Command::Overhead { run, rounds, steps }) = cli.command {
        let opts = run_options(run);
        let (results, kernel) = bitnet_trace::overhead::measure(&opts, rounds, steps)?;
        let what = format!(
            "{}, {} kernel, {} threads, batch {}, context {}, KV {}; {rounds} rounds × {steps} decode steps per level",
            opts.model,
            kernel.name(),
            opts.threads,
            opts.batch,
            opts.context_length,
            opts.kv
        );
        print!("{}", bitnet_trace::overhead::table(&results, &what));
        return Ok(ExitCode::SUCCESS);
    }
    let a = cli.trace;
    let out = a.out.clone().context("--out DIR is required (where the trace files go)")?;
    let (quiet, strict) = (a.quiet, a.strict_checks);
    let opts = options(a);
    let outcome = run_trace(&opts, &out)?;
    for n in &outcome.notes {
        eprintln!("bitnet-trace: note: {n}");
    }
    if !quiet {
        print!("{}", summary_table(&outcome.summary));
    }
    for f in &outcome.files {
        eprintln!("bitnet-trace: wrote {}", f.display());
    }
    let failed = outcome.summary.consistency.failures.len();
    if failed > 0 {
        for f in &outcome.summary.consistency.failures {
            eprintln!("bitnet-trace: CHECK FAILED: {f}");
        }
        if strict {
            // The files are written (they show what went wrong); the exit code tells CI.
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn options(a: TraceArgs) -> TraceOptions {
    TraceOptions {
        tokens: a.tokens,
        level: match a.level {
            LevelArg::Off => Level::Off,
            LevelArg::Aggregate => Level::Aggregate,
            LevelArg::Timeline => Level::Timeline,
        },
        pprof: a.pprof,
        dhat: a.dhat,
        counters: !a.no_counters,
        ..run_options(a.run)
    }
}

/// The options of a run that records nothing beyond its spans (`overhead`).
fn run_options(a: RunArgs) -> TraceOptions {
    TraceOptions {
        model: a.model,
        format: a.format,
        ffn_activation: a.ffn_activation,
        batch: a.batch,
        context_length: a.context_length,
        kv: a.kv,
        threads: a.threads,
        kernel: a.kernel,
        isa: a.isa,
        form: a.form,
        tokens: 32,
        level: Level::Timeline,
        timeline_capacity: a.timeline_capacity,
        pprof: false,
        dhat: false,
        counters: false,
        seed: a.seed,
        pin: a.pin,
    }
}
