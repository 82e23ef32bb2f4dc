//! The report page (`--plots DIR` → `DIR/index.html`): what ran, where and when; warnings as
//! visible notes; links to what else the run wrote; the results table as a person reads it
//! (the terminal table's columns and names, with units, numbers rounded to their confidence
//! interval, sortable and filterable; the legend below it is the terminal's); then the charts.
//! One self-contained file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bitnet_report::html::{self, escape, with_ci, Cell, Column, Table};
use bitnet_report::report::{BenchResult, Report};

use crate::output;
use crate::sweep::Traced;

/// The results table: one row per combination.
pub fn results_table(r: &Report) -> Table {
    let columns = vec![
        Column::label("model", "model name (as in model.name)").filtered().hoisted(),
        Column::label("kernel", "kernel family").filtered().hoisted(),
        Column::label("isa", "ISA level of the kernels").hoisted(),
        Column::count("threads", "threads in all").hoisted(),
        Column::count("batch", "sequences decoded in lock-step").filtered().hoisted(),
        Column::new("context", "tokens", "prompt tokens prefilled per sequence before decoding").hoisted(),
        Column::label("kv", "KV cache precision").filtered().hoisted(),
        Column::new("pp", "tokens/s", "prompt tokens per second: median ± half the 95% CI of the mean"),
        Column::new("ttft", "ms", "time to first token: median ± half the 95% CI of the mean"),
        Column::new("tg", "tokens/s", "generated tokens per second: median ± half the 95% CI of the mean"),
        Column::new("p50", "ms", "inter-token latency, median"),
        Column::new("p99", "ms", "inter-token latency, 99th percentile (* from fewer than 100 steps)"),
        Column::new(
            "roofline",
            "% of read bandwidth",
            "bytes read per decode step × steps/s ÷ the read bandwidth of a probe right after each step",
        ),
        Column::new("compute", "% of int8 peak", "multiply-adds per decode step × steps/s ÷ the int8 peak"),
        Column::new("kv cache", "MiB", "bytes of the KV cache of this combination"),
        Column::new("kl", "nats", "KV precision's KL divergence from f32 KV on real text"),
        Column::new("top1", "%", "positions whose most likely next token matches f32 KV's"),
    ];
    Table { id: "results".into(), columns, rows: r.results.iter().map(row).collect() }
}

fn row(x: &BenchResult) -> Vec<Cell> {
    let c = &x.config;
    let stat = |s: &bitnet_report::Stat| {
        Cell::number(s.median(), with_ci(s.median(), s.ci95_low(), s.ci95_high())).titled(format!(
            "median {}, mean {}, n {}",
            s.median(),
            s.mean(),
            s.n()
        ))
    };
    let l = &x.decode.latency_ms;
    let few = (1..100).contains(&l.samples().len());
    let pct = |f: Option<f64>| f.map_or(Cell::none(), |f| Cell::number(f * 100.0, format!("{:.0}%", f * 100.0)));
    let roofline = match (output::roofline_known(x), output::step_probe_median(x)) {
        (Some(f), Some(g)) => pct(Some(f)).titled(format!("{:.1}% of a median step probe of {g:.1} GB/s", f * 100.0)),
        (f, _) => pct(f),
    };
    let real = x.quality.as_ref().filter(|q| q.is_real());
    vec![
        Cell::text(&c.model),
        Cell::text(&c.kernel),
        Cell::text(&c.isa),
        Cell::number(c.threads as f64, c.threads.to_string()),
        Cell::number(c.batch as f64, c.batch.to_string()),
        Cell::number(c.context_length as f64, c.context_length.to_string()),
        Cell::text(&c.kv_precision),
        stat(&x.prefill.tokens_per_sec),
        stat(&x.prefill.ttft_ms),
        stat(&x.decode.tokens_per_sec),
        Cell::number(l.p50(), format!("{:.2}", l.p50())),
        Cell::number(l.p99(), format!("{:.2}{}", l.p99(), if few { "*" } else { "" })),
        roofline,
        pct(x.decode.compute_fraction),
        output::kv_cache_known(x)
            .map_or(Cell::none(), |b| Cell::number(b as f64, format!("{:.1}", b as f64 / 1048576.0))),
        match (real, &x.quality) {
            (Some(q), _) => Cell::number(q.kl_divergence, format!("{:.4}", q.kl_divergence)),
            (None, Some(_)) => Cell::none().titled("synthetic: measured on random token ids or weights"),
            (None, None) => Cell::none(),
        },
        real.map_or(Cell::none(), |q| {
            Cell::number(q.top1_agreement * 100.0, format!("{:.0}%", q.top1_agreement * 100.0))
        }),
    ]
}

/// What ran, where and when, as a list of (term, HTML).
fn about(r: &Report) -> String {
    let s = &r.system;
    let m = &r.model;
    let mut items: Vec<(&str, String)> = vec![
        (
            "model",
            escape(&format!(
                "{} ({}{}, {:.0} MiB of weights)",
                m.name,
                m.weight_format,
                m.ffn_activation.as_ref().map_or(String::new(), |a| format!(", {a} FFN")),
                m.weight_bytes as f64 / 1048576.0
            )),
        ),
        ("weights", escape(&m.source)),
        ("machine", escape(&machine(s))),
        ("read bandwidth", escape(&bandwidth(r))),
    ];
    if let Some(peaks) = output::peaks_text(&r.roofline) {
        items.push(("int8 peak", escape(&peaks)));
    }
    if let Some(q) = output::quality_source(r) {
        items.push(("KV quality on", escape(&q)));
    }
    items.push((
        "settings",
        escape(&format!(
            "{} warm-up + {} measured runs × {} new tokens, seed {}",
            r.settings.warmup, r.settings.repeat, r.settings.max_new_tokens, r.settings.seed
        )),
    ));
    let t = &r.tool;
    items.push((
        "build",
        escape(&format!(
            "{} {}, commit {}{}{}",
            t.name,
            t.version,
            t.git_commit.as_deref().unwrap_or("unknown"),
            if t.git_dirty == Some(true) { " with uncommitted changes" } else { "" },
            if s.rustc.is_empty() { String::new() } else { format!(", {}", s.rustc) }
        )),
    ));
    items.push(("measured", escape(&format!("{}{}", r.created_at, if r.complete { "" } else { ", INCOMPLETE" }))));
    html::meta(&items)
}

/// The CPU, its cores, the kernels' ISA, the OS and THP mode, leaving out what a report does
/// not know (an imported llama-bench run records its CPU's name only).
fn machine(s: &bitnet_report::system::System) -> String {
    let mut parts =
        vec![format!("{}{}", s.cpu_model, s.cpu_id.as_ref().map_or(String::new(), |id| format!(" ({id})")))];
    if s.physical_cores > 0 {
        parts.push(format!("{} cores / {} CPUs", s.physical_cores, s.logical_cpus));
    }
    if !s.isa.is_empty() {
        parts.push(format!("kernels {}", s.isa.join(", ")));
    }
    let caches: Vec<String> = [("L1d", s.l1d_kib), ("L2", s.l2_kib), ("L3", s.l3_kib)]
        .iter()
        .filter_map(|(n, k)| k.map(|k| format!("{n} {k} KiB")))
        .collect();
    if !caches.is_empty() {
        parts.push(caches.join(" / "));
    }
    parts.extend(s.memory_bytes.map(|b| format!("{:.1} GiB RAM", b as f64 / (1u64 << 30) as f64)));
    parts.extend([s.os.clone()].into_iter().filter(|o| !o.is_empty()));
    parts.extend([s.kernel.clone()].into_iter().filter(|k| !k.is_empty()).map(|k| format!("Linux {k}")));
    parts.extend(s.governor.as_ref().map(|g| format!("governor {g}")));
    parts.extend(s.turbo.as_ref().map(|t| format!("turbo {t}")));
    parts.extend(s.transparent_hugepage.as_ref().map(|t| format!("THP {t}")));
    if s.pinned {
        parts.push("threads pinned".into());
    }
    parts.join(", ")
}

/// `30.4 GB/s with 2 threads (1 GiB probe; probes 27.1, 30.4: 11% apart)`; "not measured"
/// for an imported run.
fn bandwidth(r: &Report) -> String {
    let f = &r.roofline;
    if f.read_bandwidth_gbps <= 0.0 {
        return "not measured".into();
    }
    let probes = f.probes_gbps.get(&f.threads.to_string()).filter(|p| p.len() > 1).map(|p| {
        let list: Vec<String> = p.iter().map(|g| format!("{g:.1}")).collect();
        format!("; probes {}: {:.0}% apart", list.join(", "), bitnet_report::roofline::spread(p) * 100.0)
    });
    format!(
        "{:.1} GB/s with {} thread{} ({}{})",
        f.read_bandwidth_gbps,
        f.threads,
        if f.threads == 1 { "" } else { "s" },
        f.probe_bytes.map_or("probe size not recorded".into(), |b| format!("{} probe", output::mib(b))),
        probes.unwrap_or_default()
    )
}

/// Writes the page and every chart into `dir` (created if needed). `links` are the other
/// files the run wrote (JSON, CSV, Markdown), linked relative to `dir` where they can be.
pub fn write_all(r: &Report, dir: &Path, links: &[PathBuf]) -> Result<()> {
    write_all_traced(r, dir, links, &[])
}

/// [`write_all`] with each result's traced run ([`write_traced`]; `traces[i]` is result i's,
/// where `--trace` recorded one) linked from its row.
pub fn write_all_traced(r: &Report, dir: &Path, links: &[PathBuf], traces: &[Option<TraceFiles>]) -> Result<()> {
    let body = format!("{}{}", about(r), notes(r));
    write_page(&r.model.name, &body, r, &[], dir, links, traces)
}

/// Where [`write_traced`] put a combination's traced run.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceFiles {
    pub flamegraph: PathBuf,
    pub timeline: PathBuf,
}

/// Writes a combination's traced run (`--trace`) into `DIR/traces/`: `NAME.svg`, its
/// flamegraph; `NAME.folded`, the stacks it draws (for inferno, speedscope or
/// `bitnet-trace diff`); `NAME.trace.json`, its timeline (Perfetto, chrome://tracing). NAME is
/// the configuration, `i2s-avx512-t2-b1-c128-f16`.
pub fn write_traced(dir: &Path, x: &BenchResult, traced: &Traced) -> Result<TraceFiles> {
    let c = &x.config;
    let name = format!("{}-{}-t{}-b{}-c{}-{}", c.kernel, c.isa, c.threads, c.batch, c.context_length, c.kv_precision);
    let name: String = name.chars().map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' { ch } else { '_' }).collect();
    let sub = dir.join("traces");
    std::fs::create_dir_all(&sub).with_context(|| format!("--plots {}: cannot create the directory", sub.display()))?;
    let mut svg = Vec::new();
    let title = format!("{} {}/{}: one traced run, prefill and decode", c.model, c.kernel, c.isa);
    let subtitle = format!(
        "batch {}, context {}, KV {}; nanoseconds summed over {} threads",
        c.batch, c.context_length, c.kv_precision, c.threads
    );
    bitnet_trace::folded::flamegraph(&traced.folded, &title, &subtitle, &mut svg)
        .with_context(|| format!("flamegraph of {name}"))?;
    let write = |ext: &str, bytes: &[u8]| -> Result<PathBuf> {
        let path = sub.join(format!("{name}.{ext}"));
        bitnet_report::files::write_atomic(&path, bytes)?;
        Ok(path)
    };
    write("folded", traced.folded.as_bytes())?;
    Ok(TraceFiles { flamegraph: write("svg", &svg)?, timeline: write("trace.json", traced.timeline.as_bytes())? })
}

/// [`write_all`] for several reports shown as one (`show`; `all` is
/// [`output::side_by_side`]'s): each report's details under its file name, and the charts'
/// series labelled by report.
pub fn write_all_with(
    title: &str,
    reports: &[(String, Report)],
    all: &Report,
    dir: &Path,
    links: &[PathBuf],
) -> Result<()> {
    let mut body = String::new();
    let mut sources = Vec::new();
    for (name, r) in reports {
        body.push_str(&format!("<h3>{}</h3>\n{}", escape(name), about(r)));
        let stem = Path::new(name).file_stem().map_or(name.clone(), |s| s.to_string_lossy().into_owned());
        sources.extend(std::iter::repeat_n(stem, r.results.len()));
    }
    body.push_str(&notes(all));
    write_page(title, &body, all, &sources, dir, links, &[])
}

fn notes(r: &Report) -> String {
    output::warnings(r).iter().map(|w| html::note(w)).collect()
}

fn write_page(
    title: &str,
    about: &str,
    r: &Report,
    sources: &[String],
    dir: &Path,
    links: &[PathBuf],
    traces: &[Option<TraceFiles>],
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--plots {}: cannot create the directory", dir.display()))?;
    let crate::plots::Charts { drawn: charts, not_drawn } = crate::plots::charts(r, sources);
    let mut body = format!("<h1>bitnet-bench: {}</h1>\n{about}", escape(title));
    let mut all_links: Vec<(String, String)> = links.iter().map(|p| (relative(p, dir), file_name(p))).collect();
    all_links.extend(charts.iter().map(|(file, _, _)| (file.clone(), file.clone())));
    if !all_links.is_empty() {
        body.push_str("<p class=\"links\">Also written: ");
        for (href, name) in &all_links {
            body.push_str(&format!("<a href=\"{}\">{}</a>", escape(href), escape(name)));
        }
        body.push_str("</p>\n");
    }
    body.push_str("<h2>Results</h2>\n");
    let mut table = results_table(r);
    // Several reports (`show`): each row says which it came from.
    if sources.iter().any(|s| *s != sources[0]) {
        table.columns.insert(0, Column::label("report", "the report file (its stem) the row comes from").filtered());
        for (row, source) in table.rows.iter_mut().zip(sources) {
            row.insert(0, Cell::text(source));
        }
    }
    if traces.iter().any(Option::is_some) {
        table
            .columns
            .push(Column::label("flamegraph", "the traced run's flamegraph (--trace); its folded stacks beside it"));
        table.columns.push(Column::label(
            "timeline",
            "the traced run's timeline from its start (the prefill and first decode steps; bitnet-trace records whole runs) in Chrome's trace-event JSON: open it in Perfetto or chrome://tracing",
        ));
        for (i, row) in table.rows.iter_mut().enumerate() {
            match traces.get(i).and_then(Option::as_ref) {
                Some(t) => row.extend([
                    Cell::text("svg").linked(relative(&t.flamegraph, dir)),
                    Cell::text("trace.json").linked(relative(&t.timeline, dir)),
                ]),
                None => row.extend([Cell::none(), Cell::none()]),
            }
        }
    }
    // What every row shares (one model, kernel, thread count...) is said once above the table,
    // which then fits the window better.
    let shared = table.hoist_constant();
    if !shared.is_empty() {
        let list: Vec<String> = shared.iter().map(|(k, v)| format!("{} <b>{}</b>", escape(k), escape(v))).collect();
        body.push_str(&format!("<p class=\"shared\">Every row: {}</p>\n", list.join(" · ")));
    }
    body.push_str(&table.to_html());
    body.push_str(&format!("<p class=\"legend\">{}</p>\n", escape(&output::legend(r))));
    if !charts.is_empty() || !not_drawn.is_empty() {
        body.push_str("<h2>Charts</h2>\n");
    }
    for (file, title, svg) in &charts {
        bitnet_report::files::write_atomic(&dir.join(file), svg.as_bytes())?;
        body.push_str(&format!("<figure><figcaption>{}</figcaption>\n{svg}\n</figure>\n", escape(title)));
    }
    if !not_drawn.is_empty() {
        let list: String = not_drawn.iter().map(|n| format!("<li>{}</li>", escape(n))).collect();
        body.push_str(&format!("<p class=\"legend\">Not drawn:</p><ul class=\"legend\">{list}</ul>\n"));
    }
    let page = html::page(&format!("bitnet-bench: {title}"), &body);
    bitnet_report::files::write_atomic(&dir.join("index.html"), page.as_bytes())?;
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// `p` as a link from a page in `dir`: relative where both are in one tree, else absolute;
/// each segment percent-encoded, so a space, `#` or `%` in a name stays in the link.
fn relative(p: &Path, dir: &Path) -> String {
    let (p, dir) = (resolved(p), resolved(dir));
    let common = p.components().zip(dir.components()).take_while(|(a, b)| a == b).count();
    let segments: Vec<String> =
        p.components().skip(common).map(|c| url_segment(&c.as_os_str().to_string_lossy())).collect();
    if common == 0 {
        return format!("/{}", segments.join("/"));
    }
    let ups = dir.components().count() - common;
    std::iter::repeat_n("..".to_string(), ups).chain(segments).collect::<Vec<_>>().join("/")
}

/// Where `q` really is: through symlinks and `..` where it exists, else its absolute form with
/// `.` and `..` resolved by name (`--plots ../out` must not count `..` as a directory to climb).
fn resolved(q: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(q) {
        return c;
    }
    let abs = std::path::absolute(q).unwrap_or_else(|_| q.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// A path segment for a URL: unreserved characters as they are, every other byte as `%XX`.
fn url_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_to_the_page() {
        assert_eq!(relative(Path::new("/a/b/r.json"), Path::new("/a/b/plots")), "../r.json");
        assert_eq!(relative(Path::new("/a/b/plots/x.svg"), Path::new("/a/b/plots")), "x.svg");
        assert_eq!(relative(Path::new("/c/r.json"), Path::new("/a/b")), "../../c/r.json");
        // `..` in the page's directory is climbed by name, not counted as a directory.
        assert_eq!(relative(Path::new("/a/r.json"), Path::new("/a/b/../plots")), "../r.json");
        // A space, `#` or `%` in a name is encoded, or the browser would cut the link there.
        assert_eq!(relative(Path::new("/a/b c/r#1%.json"), Path::new("/a/plots")), "../b%20c/r%231%25.json");
    }
}
