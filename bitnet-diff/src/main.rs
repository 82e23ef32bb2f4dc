//! `bitnet-diff BASE.json NEW.json`: flags regressions between two bitnet-bench reports.
//! Exit 0: no regression; 1: at least one (with `--fail-on regression`); 2: bad input.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use bitnet_diff::{compare, render};
use bitnet_report::files::write_atomic;
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Markdown,
    Json,
    /// A self-contained page in the report page's style (sortable, filterable).
    Html,
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
    /// The reference report (or use --db with --base).
    base: Option<PathBuf>,
    /// The report to judge (or use --db with --head).
    new: Option<PathBuf>,
    /// A bitnet-bench history database (`bitnet-bench --db`).
    #[arg(long)]
    db: Option<PathBuf>,
    /// With --db: the commit (hash or prefix) of the reference run.
    #[arg(long = "base", value_name = "REV")]
    base_rev: Option<String>,
    /// With --db: the commit of the run to judge.
    #[arg(long = "head", value_name = "REV")]
    head_rev: Option<String>,
    /// With --db: print the trend of --metric over the stored runs.
    #[arg(long)]
    history: bool,
    /// The metric of --history (default decode.tokens_per_sec).
    #[arg(long, default_value = "decode.tokens_per_sec")]
    metric: String,
    /// With --history: also draw the trend as an SVG chart.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Smallest change that matters, e.g. 5% or 0.05 (speed and memory metrics).
    #[arg(long, default_value = "5%")]
    threshold: String,
    /// Smallest perplexity rise (and top-token agreement drop) that is a regression.
    #[arg(long = "ppl-threshold", default_value = "1%")]
    ppl_threshold: String,
    /// Smallest KL divergence rise that is a regression (relative).
    #[arg(long = "kl-threshold", default_value = "10%")]
    kl_threshold: String,
    /// Metrics to compare (comma-separated); default decode.tokens_per_sec,
    /// prefill.tokens_per_sec, prefill.ttft_ms, and quality.kl_divergence and
    /// quality.perplexity where both reports measured quality on real text (with their own
    /// thresholds: 10% and 1%); also decode.latency_ms, decode.roofline_fraction,
    /// decode.compute_fraction, memory.kv_cache_bytes, memory.peak_rss_bytes.
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
    parse_threshold_of("--threshold", s)
}

fn parse_threshold_of(flag: &str, s: &str) -> Result<f64> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    }
    .with_context(|| format!("{flag} {s}: expected a percentage like 5% or a fraction like 0.05"))?;
    if !(v > 0.0 && v < 1.0) {
        bail!("{flag} {s}: must be above 0% and below 100%");
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
    let quality = compare::QualityThresholds {
        perplexity: parse_threshold_of("--ppl-threshold", &cli.ppl_threshold)?,
        kl: parse_threshold_of("--kl-threshold", &cli.kl_threshold)?,
    };
    if let (None, Some(b), Some(n)) = (&cli.db, &cli.base, &cli.new) {
        if let Some(code) = perplexity_diff(&cli, b, n, quality)? {
            return Ok(code);
        }
    }
    if cli.history {
        let db = cli.db.as_ref().context("--history needs --db FILE")?;
        return stored::history(db, &cli.metric, cli.plot.as_deref());
    }
    let (base, new, names) = match (&cli.db, &cli.base, &cli.new, &cli.base_rev, &cli.head_rev) {
        (Some(db), None, None, Some(b), Some(h)) => (
            stored::latest_of(db, b).with_context(|| format!("--base {b}"))?,
            stored::latest_of(db, h).with_context(|| format!("--head {h}"))?,
            (format!("{}@{b}", db.display()), format!("{}@{h}", db.display())),
        ),
        (None, Some(b), Some(n), None, None) => {
            (bitnet_report::load(b)?, bitnet_report::load(n)?, (b.display().to_string(), n.display().to_string()))
        }
        _ => bail!("give BASE.json NEW.json, or --db FILE --base REV --head REV, or --db FILE --history"),
    };
    let metrics: Vec<String> =
        if cli.metrics.is_empty() { compare::default_metrics(&base, &new) } else { cli.metrics.clone() };
    let c = compare::compare_with(&base, &new, (&names.0, &names.1), &metrics, threshold, quality, cli.seed)?;
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
        Format::Html => render::html(&c),
    };
    match &cli.output {
        Some(p) => write_atomic(p, text.as_bytes()).with_context(|| format!("--output {}", p.display()))?,
        None => print!("{text}"),
    }
    if cli.fail_on == FailOn::Regression && !new.complete {
        // An interrupted NEW run would otherwise pass with its missing configurations unseen.
        eprintln!("bitnet-diff: failing: {} is incomplete (its run was interrupted)", names.1);
        return Ok(ExitCode::from(1));
    }
    Ok(if cli.fail_on == FailOn::Regression && c.counts.regressions > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Two `bitnet-bench perplexity --json` files: compared as such (exit 1 on a regression).
/// `None` when they are sweep reports; an error when only one of them is a perplexity result.
fn perplexity_diff(
    cli: &Cli,
    b: &std::path::Path,
    n: &std::path::Path,
    quality: compare::QualityThresholds,
) -> Result<Option<ExitCode>> {
    use bitnet_diff::perplexity as ppl;
    let kind = |p: &std::path::Path| -> Result<bool> {
        let text = std::fs::read_to_string(p).with_context(|| format!("{}: cannot read", p.display()))?;
        Ok(serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| ppl::is_perplexity_json(&v)))
    };
    match (kind(b)?, kind(n)?) {
        (false, false) => return Ok(None),
        (true, true) => {}
        (x, _) => bail!(
            "{} is a perplexity result and {} a sweep report: compare two of a kind",
            if x { b.display() } else { n.display() },
            if x { n.display() } else { b.display() }
        ),
    }
    let (base, new) = (ppl::load(b)?, ppl::load(n)?);
    let c = ppl::compare(
        &base,
        &new,
        (&b.display().to_string(), &n.display().to_string()),
        quality.perplexity,
        quality.kl,
    )?;
    let text = match cli.format {
        Format::Json => ppl::json(&c),
        Format::Html => ppl::html(&c),
        Format::Text | Format::Markdown => ppl::markdown(&c),
    };
    match &cli.output {
        Some(p) => write_atomic(p, text.as_bytes()).with_context(|| format!("--output {}", p.display()))?,
        None => print!("{text}"),
    }
    let fail = cli.fail_on == FailOn::Regression && (c.regressions > 0 || !new.complete);
    Ok(Some(if fail { ExitCode::from(1) } else { ExitCode::SUCCESS }))
}

/// The run history database (`--db`): with the `history` feature (SQLite and bitnet-bench's
/// history module); without it, `--db` is refused with what to rebuild.
#[cfg(feature = "history")]
mod stored {
    use std::process::ExitCode;

    use anyhow::{bail, Context, Result};
    use bitnet_diff::compare;
    use bitnet_report::files::write_atomic;
    use bitnet_report::stats::Stat;
    use bitnet_report::svg::{LineChart, Point, Series, XAxis};

    pub use bitnet_bench::history::latest_of;

    /// Prints the trend of `metric` (its median) over the stored runs, one line per run and
    /// configuration; with `plot`, draws it (a line per configuration).
    pub fn history(db: &std::path::Path, metric: &str, plot: Option<&std::path::Path>) -> Result<ExitCode> {
        let m = compare::metrics()
            .into_iter()
            .find(|m| m.name == metric)
            .with_context(|| format!("--metric {metric}: unknown metric"))?;
        let runs = bitnet_bench::history::runs(db)?;
        if runs.is_empty() {
            bail!("--db {}: no runs stored yet", db.display());
        }
        println!("{metric} (median) over {} runs of {}", runs.len(), db.display());
        println!("| run | created_at | commit | configuration | {metric} |");
        println!("|---|---|---|---|---|");
        let mut series: std::collections::BTreeMap<String, Vec<Point>> = Default::default();
        let mut names = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            let commit = r.report.tool.git_commit.as_deref().map_or("-".to_string(), |c| c.chars().take(10).collect());
            names.push(format!("#{} {}", r.id, commit.chars().take(7).collect::<String>()));
            for x in &r.report.results {
                let Some(s) = (m.samples)(x) else { continue };
                if s.is_empty() {
                    continue;
                }
                let stat = Stat::of(&s);
                let med = stat.median();
                let c = &x.config;
                // The model and where its weights came from (a preset, or a file by name) are part
                // of the series: one database may hold runs of several, and a preset and a GGUF
                // file of its shapes share a model name.
                let from = bitnet_report::report::source_gguf_name(&r.report.model.source).unwrap_or("preset".into());
                let cfg = format!(
                    "{} [{from}] {}/{} B={} ctx={} kv={} t={}",
                    c.model, c.kernel, c.isa, c.batch, c.context_length, c.kv_precision, c.threads
                );
                println!("| {} | {} | {commit} | {cfg} | {med:.4} |", r.id, r.report.created_at);
                let what = format!("run {} ({commit}, {}): {cfg}", r.id, r.report.created_at);
                series.entry(cfg).or_default().push(Point::of_stat(i as f64, &stat, &what));
            }
        }
        if let Some(p) = plot {
            let chart = LineChart {
                title: format!("{metric} over runs"),
                x_label: "run (oldest first)".into(),
                x_axis: XAxis::Names(names),
                y_label: format!("{metric} (median, 95% CI)"),
                series: series.into_iter().map(|(name, points)| Series { name, points }).collect(),
                ceilings: vec![],
            };
            write_atomic(p, chart.to_svg().as_bytes()).with_context(|| format!("--plot {}", p.display()))?;
            eprintln!("bitnet-diff: wrote {}", p.display());
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(not(feature = "history"))]
mod stored {
    use std::process::ExitCode;

    use anyhow::{bail, Result};
    use bitnet_report::Report;

    const MISSING: &str = "this bitnet-diff was built without the `history` feature (SQLite): rebuild it with default features to read a history database";

    pub fn latest_of(db: &std::path::Path, _rev: &str) -> Result<Report> {
        bail!("--db {}: {MISSING}", db.display())
    }

    pub fn history(db: &std::path::Path, _metric: &str, _plot: Option<&std::path::Path>) -> Result<ExitCode> {
        bail!("--db {}: {MISSING}", db.display())
    }
}
