//! The comparison as a terminal table, Markdown (summary line first, for PR comments and job
//! summaries), JSON, and an HTML page in the report page's style.

use std::fmt::Write;

use bitnet_report::html::{self, escape, significant, Cell, Column, Table};

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

/// The comparison as a page: the summary and method, warnings and notes as visible notes, what
/// only one side has, then every compared figure in a table sortable by any column and
/// filterable by metric and verdict.
pub fn html(c: &Comparison) -> String {
    let mut body = format!("<h1>bitnet-diff: {}</h1>\n", escape(&c.counts.line()));
    body.push_str(&html::meta(&[("base", escape(&c.base)), ("new", escape(&c.new)), ("method", escape(&method(c)))]));
    for w in &c.env_warnings {
        body.push_str(&html::note(&format!("warning: {w}")));
    }
    for n in &c.notes {
        body.push_str(&html::note(n));
    }
    let names = |v: &[bitnet_report::Config]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    for (what, items) in [
        (format!("Only in {} (added)", c.new), names(&c.added)),
        (format!("Only in {} (removed)", c.base), names(&c.removed)),
        ("Not compared".to_string(), c.not_compared.clone()),
    ] {
        if !items.is_empty() {
            let list: String = items.iter().map(|x| format!("<li>{}</li>", escape(x))).collect();
            let _ = writeln!(body, "<h2>{}</h2>\n<ul>{list}</ul>", escape(&what));
        }
    }
    let columns = vec![
        Column::label("configuration", "the paired configuration (model kernel/isa B ctx kv threads)"),
        Column::label("metric", "the compared figure").filtered(),
        Column::count("base", "median of BASE's samples"),
        Column::count("new", "median of NEW's samples"),
        Column::new("change", "%", "median(new) / median(base) − 1"),
        Column::label("95% CI", "95% bootstrap interval of the change in medians"),
        Column::count("p", "Welch's two-sided p-value on the log samples"),
        Column::label("verdict", "regression, improvement, unchanged or inconclusive").filtered(),
    ];
    let rows = c
        .pairs
        .iter()
        .flat_map(|p| {
            p.metrics.iter().map(move |m| {
                let ci =
                    if m.p_value.is_some() { format!("[{}, {}]", pct(m.ci_low), pct(m.ci_high)) } else { "-".into() };
                vec![
                    Cell::text(pair_label(p)),
                    Cell::text(&m.metric),
                    Cell::number(m.base_median, significant(m.base_median, 4))
                        .titled(format!("{}, n {}", m.base_median, m.n_base)),
                    Cell::number(m.new_median, significant(m.new_median, 4))
                        .titled(format!("{}, n {}", m.new_median, m.n_new)),
                    Cell::number(m.change * 100.0, pct(m.change)),
                    Cell::text(ci),
                    m.p_value.map_or(Cell::none(), |v| Cell::number(v, format!("{v:.3}"))),
                    match &m.note {
                        Some(n) => Cell::text(m.verdict.name()).titled(n.clone()),
                        None => Cell::text(m.verdict.name()),
                    },
                ]
            })
        })
        .collect();
    body.push_str("<h2>Compared</h2>\n");
    body.push_str(&Table { id: "diff".into(), columns, rows }.to_html());
    html::page(&format!("bitnet-diff: {} → {}", c.base, c.new), &body)
}
