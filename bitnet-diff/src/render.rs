//! The comparison as a terminal table, Markdown (summary line first, for PR comments and job
//! summaries) and JSON.

use std::fmt::Write;

use crate::compare::{Comparison, ConfigDiff, MetricDiff};

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// A pair's label: its configuration, and across tools which kernel of the base it faces
/// (the base's model is named in the notes).
fn pair_label(p: &ConfigDiff) -> String {
    match &p.base_config {
        Some(b) => {
            let c = &p.config;
            format!(
                "{} {}/{} vs {}/{} B={} ctx={} kv={} t={}",
                c.model, c.kernel, c.isa, b.kernel, b.isa, c.batch, c.context_length, c.kv_precision, c.threads
            )
        }
        None => p.config.to_string(),
    }
}

fn row(label: &str, m: &MetricDiff) -> [String; 8] {
    [
        label.to_string(),
        m.metric.clone(),
        format!("{:.4}", m.base_median),
        format!("{:.4}", m.new_median),
        pct(m.change),
        if m.p_value.is_some() { format!("[{}, {}]", pct(m.ci_low), pct(m.ci_high)) } else { "-".into() },
        m.p_value.map_or("-".into(), |p| format!("{p:.3}")),
        match &m.note {
            Some(n) => format!("{} ({n})", m.verdict.name()),
            None => m.verdict.name().to_string(),
        },
    ]
}

const HEAD: [&str; 8] = ["configuration", "metric", "base", "new", "change", "95% CI", "p", "verdict"];

fn table(c: &Comparison) -> String {
    let rows: Vec<[String; 8]> =
        c.pairs.iter().flat_map(|p| p.metrics.iter().map(move |m| row(&pair_label(p), m))).collect();
    let mut w = HEAD.map(str::len);
    for r in &rows {
        for (i, x) in r.iter().enumerate() {
            w[i] = w[i].max(x.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells.iter().enumerate().map(|(i, x)| format!("{x:<width$}", width = w[i])).collect();
        format!("| {} |", parts.join(" | "))
    };
    let mut o = String::new();
    let _ = writeln!(o, "{}", line(&HEAD.map(String::from)));
    let _ = writeln!(o, "|{}|", w.iter().map(|n| "-".repeat(n + 2)).collect::<Vec<_>>().join("|"));
    for r in &rows {
        let _ = writeln!(o, "{}", line(r));
    }
    o
}

fn footer(c: &Comparison, o: &mut String, md: bool) {
    let bullet = if md { "- " } else { "  " };
    if !c.added.is_empty() {
        let _ = writeln!(o, "\nadded (only in {}):", c.new);
        for x in &c.added {
            let _ = writeln!(o, "{bullet}{x}");
        }
    }
    if !c.removed.is_empty() {
        let _ = writeln!(o, "\nremoved (only in {}):", c.base);
        for x in &c.removed {
            let _ = writeln!(o, "{bullet}{x}");
        }
    }
    for n in &c.notes {
        let _ = writeln!(o, "\nnote: {n}");
    }
    for w in &c.env_warnings {
        let _ = writeln!(o, "\nwarning: {w}");
    }
    if !c.not_compared.is_empty() {
        let _ = writeln!(o, "\nnot compared:");
        for x in &c.not_compared {
            let _ = writeln!(o, "{bullet}{x}");
        }
    }
}

fn method(c: &Comparison) -> String {
    format!(
        "threshold ±{:.1}%, symmetric in log ratio (a change beyond {:+.1}% or {:+.1}%); 95% bootstrap CI of the change in medians; Welch's t-test on log samples, p < 0.05",
        c.threshold * 100.0,
        (1.0 / (1.0 + c.threshold) - 1.0) * 100.0,
        c.threshold * 100.0
    )
}

pub fn text(c: &Comparison) -> String {
    let mut o = format!("bitnet-diff: {} → {}\n{}\n{}\n\n", c.base, c.new, c.counts.line(), method(c));
    o.push_str(&table(c));
    footer(c, &mut o, false);
    o
}

pub fn markdown(c: &Comparison) -> String {
    let mut o = format!("**{}**\n\n`{}` → `{}`; {}\n\n", c.counts.line(), c.base, c.new, method(c));
    o.push_str(&table(c));
    footer(c, &mut o, true);
    o
}

pub fn json(c: &Comparison) -> String {
    serde_json::to_string_pretty(c).expect("a comparison serializes") + "\n"
}
