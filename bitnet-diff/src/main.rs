//! `bitnet-diff BASE.json NEW.json`: flags regressions between two bitnet-bench reports.
//! Exit 0: no regression; 1: at least one (with `--fail-on regression`); 2: bad input.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use bitnet_diff::{compare, render};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Markdown,
    Json,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum FailOn {
    Regression,
    Never,
}

#[derive(Parser)]
#[command(
    name = "bitnet-diff",
    version,
    about = "Compare two bitnet-bench reports and flag regressions (exit 1), for CI"
)]
struct Cli {
    base: PathBuf,
    new: PathBuf,
    /// Smallest change that matters, e.g. 5% or 0.05.
    #[arg(long, default_value = "5%")]
    threshold: String,
    /// Metrics to compare (comma-separated); default decode.tokens_per_sec,
    /// prefill.tokens_per_sec, prefill.ttft_ms.
    #[arg(long, value_delimiter = ',')]
    metrics: Vec<String>,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Write the output here (atomically) instead of stdout.
    #[arg(long)]
    output: Option<PathBuf>,
    #[arg(long = "fail-on", value_enum, default_value = "regression")]
    fail_on: FailOn,
    /// Treat a different CPU, core count, ISA, thread counts, model or schema version as an
    /// error instead of a warning.
    #[arg(long = "strict-env")]
    strict_env: bool,
    /// Seed of the bootstrap (the output is deterministic for a seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_threshold(s: &str) -> Result<f64> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    }
    .with_context(|| format!("--threshold {s}: expected a percentage like 5% or a fraction like 0.05"))?;
    if !(v > 0.0 && v < 1.0) {
        bail!("--threshold {s}: must be above 0% and below 100%");
    }
    Ok(v)
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
            eprintln!("bitnet-diff: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let threshold = parse_threshold(&cli.threshold)?;
    let base = bitnet_bench::report::load(&cli.base)?;
    let new = bitnet_bench::report::load(&cli.new)?;
    let metrics: Vec<String> = if cli.metrics.is_empty() {
        compare::DEFAULT_METRICS.iter().map(|s| s.to_string()).collect()
    } else {
        cli.metrics.clone()
    };
    let names = (cli.base.display().to_string(), cli.new.display().to_string());
    let c = compare::compare(&base, &new, (&names.0, &names.1), &metrics, threshold, cli.seed)?;
    if cli.strict_env && !c.env_warnings.is_empty() {
        bail!("--strict-env: the reports were measured in different environments: {}", c.env_warnings.join("; "));
    }
    for w in &c.env_warnings {
        eprintln!("bitnet-diff: warning: {w}");
    }
    let text = match cli.format {
        Format::Text => render::text(&c),
        Format::Markdown => render::markdown(&c),
        Format::Json => render::json(&c),
    };
    match &cli.output {
        Some(p) => bitnet_bench::report::write_atomic(p, text.as_bytes())
            .with_context(|| format!("--output {}", p.display()))?,
        None => print!("{text}"),
    }
    Ok(if cli.fail_on == FailOn::Regression && c.counts.regressions > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
