//! Two `bitnet-bench perplexity --json` results of the same text compared: perplexity, and the
//! KL divergence and top-token agreement against a shared `--kl-ref` base where both have one.
//! A change that makes the model worse is a regression even when it is faster.
//!
//! The figures are deterministic for a build, model and text (one value each, no run-to-run
//! noise to test against), so each metric is a plain threshold on the change, with its own
//! default ([`PERPLEXITY_THRESHOLD`], [`KL_THRESHOLD`]); the standard errors printed beside them
//! are those of the text sample, which both runs share.

use std::path::Path;

use anyhow::{bail, Result};
use bitnet_report::perplexity::PerplexityResult;
use serde::Serialize;

pub use crate::compare::{Better, Verdict, KL_FLOOR, KL_THRESHOLD, PERPLEXITY_THRESHOLD};

/// One compared figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub metric: &'static str,
    pub better: Better,
    pub base: f64,
    pub new: f64,
    /// Their standard errors, where the result has one.
    pub base_error: Option<f64>,
    pub new_error: Option<f64>,
    /// new / base − 1.
    pub change: f64,
    pub threshold: f64,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerplexityComparison {
    pub base: String,
    pub new: String,
    /// What both measured: text, ctx, chunks, tokens scored.
    pub measured_on: String,
    /// The two models (name, file, FFN activation, kernel, KV).
    pub base_model: String,
    pub new_model: String,
    pub rows: Vec<Row>,
    pub regressions: usize,
    /// Why a figure was not compared (no KL on one side, different bases).
    pub notes: Vec<String>,
}

/// Whether `path` holds a perplexity result rather than a sweep report.
pub fn is_perplexity_json(v: &serde_json::Value) -> bool {
    v.get("tokens_scored").is_some() && v.get("perplexity").is_some() && v.get("results").is_none()
}

/// Reads and checks a perplexity result (its schema, then its type).
pub fn load(path: &Path) -> Result<PerplexityResult> {
    Ok(bitnet_report::perplexity::load(path)?)
}

fn model_line(r: &PerplexityResult) -> String {
    let m = &r.model;
    format!("{} ({}, {} FFN, {} kernel, {} KV)", m.name, m.file, m.ffn_activation, m.kernel, m.kv)
}

/// A figure of a perplexity result that is compared: its name, which way is better, and the
/// value below which values count as it (0: none).
struct Figure {
    name: &'static str,
    better: Better,
    floor: f64,
}

const PERPLEXITY: Figure = Figure { name: "perplexity", better: Better::Lower, floor: 0.0 };
/// A KL of exactly 0 (a run against its own base) still ratios against a worse one.
const KL_MEAN: Figure = Figure { name: "kl_mean", better: Better::Lower, floor: KL_FLOOR };
const SAME_TOP: Figure = Figure { name: "same_top", better: Better::Higher, floor: 0.0 };

fn row(figure: &Figure, base: f64, new: f64, errs: (Option<f64>, Option<f64>), t: f64) -> Row {
    let (b, n) = (base.max(figure.floor), new.max(figure.floor));
    // One value a side, deterministic: `decide`'s plain threshold on the log ratio.
    let decision = crate::compare::decide(&[b], &[n], figure.better, t, 0);
    Row {
        metric: figure.name,
        better: figure.better,
        base,
        new,
        base_error: errs.0,
        new_error: errs.1,
        change: decision.log_change.exp() - 1.0,
        threshold: t,
        verdict: decision.verdict,
    }
}

/// Compares `new` against `base`. They must have measured the same text in the same chunks
/// (otherwise their perplexities are of different things: an error, exit 2).
pub fn compare(
    base: &PerplexityResult,
    new: &PerplexityResult,
    names: (&str, &str),
    ppl_threshold: f64,
    kl_threshold: f64,
) -> Result<PerplexityComparison> {
    for (what, a, b) in [
        ("text (sha256)", base.text.sha256.clone(), new.text.sha256.clone()),
        ("ctx", base.ctx.to_string(), new.ctx.to_string()),
        ("chunks", base.chunks.to_string(), new.chunks.to_string()),
        ("tokens scored", base.tokens_scored.to_string(), new.tokens_scored.to_string()),
    ] {
        if a != b {
            bail!(
                "{} and {}: measured on different {what} ({a} vs {b}); perplexities compare only on the same text, ctx and chunks",
                names.0,
                names.1
            );
        }
    }
    let mut notes = Vec::new();
    for (r, name) in [(base, names.0), (new, names.1)] {
        if !r.complete {
            notes.push(format!("{name} is incomplete (interrupted): its figures cover the chunks it finished"));
        }
    }
    let mut rows = Vec::new();
    match (base.perplexity, new.perplexity) {
        (Some(b), Some(n)) => {
            rows.push(row(&PERPLEXITY, b, n, (base.standard_error, new.standard_error), ppl_threshold))
        }
        _ => notes.push("perplexity: a result scored no token".into()),
    }
    match (&base.kl, &new.kl) {
        (Some(b), Some(n)) if b.base_file == n.base_file && b.kl_support == n.kl_support => {
            rows.push(row(
                &KL_MEAN,
                b.kl_mean,
                n.kl_mean,
                (Some(b.kl_standard_error), Some(n.kl_standard_error)),
                kl_threshold,
            ));
            rows.push(row(
                &SAME_TOP,
                b.same_top,
                n.same_top,
                (Some(b.same_top_standard_error), Some(n.same_top_standard_error)),
                ppl_threshold,
            ));
        }
        (Some(b), Some(n)) => notes.push(format!(
            "KL not compared: against different bases ({}, {}) or supports ({}, {})",
            b.base_file, n.base_file, b.kl_support, n.kl_support
        )),
        (None, None) => {}
        _ => notes.push("KL not compared: only one result was run with --kl-ref".into()),
    }
    let regressions = rows.iter().filter(|r| r.verdict == Verdict::Regression).count();
    Ok(PerplexityComparison {
        base: names.0.into(),
        new: names.1.into(),
        measured_on: format!(
            "{} ({} bytes), ctx {}, {} chunks, {} tokens scored",
            new.text.file, new.text.bytes, new.ctx, new.chunks, new.tokens_scored
        ),
        base_model: model_line(base),
        new_model: model_line(new),
        rows,
        regressions,
        notes,
    })
}

fn fmt_value(metric: &str, v: f64, err: Option<f64>) -> String {
    let core = match metric {
        "same_top" => format!("{:.2}%", v * 100.0),
        "kl_mean" => format!("{v:.6}"),
        _ => format!("{v:.4}"),
    };
    match err {
        Some(e) if metric == "same_top" => format!("{core} ± {:.2}%", e * 100.0),
        Some(e) if metric == "kl_mean" => format!("{core} ± {e:.6}"),
        Some(e) => format!("{core} ± {e:.4}"),
        None => core,
    }
}

/// The comparison as a Markdown table (also what the terminal shows).
pub fn markdown(c: &PerplexityComparison) -> String {
    let mut s = format!(
        "**{} regression{}** — perplexity of {} against {}\n\nmeasured on {}\n\n- base: {}\n- new: {}\n\n| metric | base | new | change | threshold | verdict |\n|---|---:|---:|---:|---:|---|\n",
        c.regressions,
        if c.regressions == 1 { "" } else { "s" },
        c.new,
        c.base,
        c.measured_on,
        c.base_model,
        c.new_model
    );
    for r in &c.rows {
        s.push_str(&format!(
            "| {} ({} is better) | {} | {} | {:+.2}% | {:.1}% | {} |\n",
            r.metric,
            if r.better == Better::Lower { "lower" } else { "higher" },
            fmt_value(r.metric, r.base, r.base_error),
            fmt_value(r.metric, r.new, r.new_error),
            r.change * 100.0,
            r.threshold * 100.0,
            r.verdict.name()
        ));
    }
    for n in &c.notes {
        s.push_str(&format!("\nnote: {n}\n"));
    }
    s
}

/// [`markdown`]'s content as a page in the report page's style.
pub fn html(c: &PerplexityComparison) -> String {
    use bitnet_report::html::{self, escape, Cell, Column, Table};
    let title = format!("{} regression{}", c.regressions, if c.regressions == 1 { "" } else { "s" });
    let mut body = format!("<h1>bitnet-diff: {}</h1>\n", escape(&title));
    body.push_str(&html::meta(&[
        ("base", escape(&format!("{} ({})", c.base, c.base_model))),
        ("new", escape(&format!("{} ({})", c.new, c.new_model))),
        ("measured on", escape(&c.measured_on)),
    ]));
    for n in &c.notes {
        body.push_str(&html::note(n));
    }
    let columns = vec![
        Column::label("metric", "the compared figure, and which way is better"),
        Column::label("base", "BASE's value ± its standard error"),
        Column::label("new", "NEW's value ± its standard error"),
        Column::new("change", "%", "new / base − 1"),
        Column::new("threshold", "%", "smallest change that is a regression"),
        Column::label("verdict", "regression, improvement or unchanged").filtered(),
    ];
    let rows = c
        .rows
        .iter()
        .map(|r| {
            vec![
                Cell::text(format!(
                    "{} ({} is better)",
                    r.metric,
                    if r.better == Better::Lower { "lower" } else { "higher" }
                )),
                Cell::text(fmt_value(r.metric, r.base, r.base_error)),
                Cell::text(fmt_value(r.metric, r.new, r.new_error)),
                Cell::number(r.change * 100.0, format!("{:+.2}%", r.change * 100.0)),
                Cell::number(r.threshold * 100.0, format!("{:.1}%", r.threshold * 100.0)),
                Cell::text(r.verdict.name()),
            ]
        })
        .collect();
    body.push_str(&Table { id: "diff".into(), columns, rows }.to_html());
    html::page(&format!("bitnet-diff: {} → {}", c.base, c.new), &body)
}

pub fn json(c: &PerplexityComparison) -> String {
    serde_json::to_string_pretty(c).expect("a comparison serializes") + "\n"
}
