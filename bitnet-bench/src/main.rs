//! `bitnet-bench`: benchmarks of the BitNet b1.58 engine on this machine.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use bitnet_bench::kernel_sweep::{self, SweepOptions};
use bitnet_engine::{IsaLevel, Kernel, KernelFamily, KernelForm};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bitnet-bench", version, about = "Benchmarks of the BitNet b1.58 engine on this machine")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Kernel throughput on BitNet b1.58 2B4T shapes, in cache and streaming, against the
    /// memory-bandwidth probe and the scalar oracle (the default job for now).
    Kernels(KernelArgs),
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

fn names(k: &[Kernel]) -> String {
    k.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
}
