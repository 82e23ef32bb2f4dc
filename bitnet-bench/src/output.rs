//! What people read: the terminal table (in the spirit of llama-bench's), Markdown for PR
//! comments and CSV for spreadsheets — all from a report, so they agree with the JSON.

use std::fmt::Write;

use bitnet_report::report::{BenchResult, Report};
use bitnet_report::roofline::spread;

/// Column headers shared by the table, Markdown and CSV.
const HEADERS: [&str; 17] = [
    "model",
    "kernel",
    "isa",
    "threads",
    "batch",
    "context",
    "kv",
    "pp t/s",
    "ttft ms",
    "tg t/s",
    "± ci95",
    "p50 ms",
    "p99 ms",
    "roofline",
    "compute",
    "kv MiB",
    "kl / top1",
];

/// Steps below which a p99 is marked: from fewer, it is about the slowest step.
const P99_MIN_STEPS: usize = 100;

/// The p99 cell, marked `*` when it comes from fewer than [`P99_MIN_STEPS`] steps.
fn p99_cell(l: &bitnet_report::stats::Latency) -> String {
    let few = (1..P99_MIN_STEPS).contains(&l.samples().len());
    format!("{:.2}{}", l.p99(), if few { "*" } else { "" })
}

fn row(r: &BenchResult) -> [String; 17] {
    let c = &r.config;
    let tg = &r.decode.tokens_per_sec;
    [
        c.model.clone(),
        c.kernel.clone(),
        c.isa.clone(),
        c.threads.to_string(),
        c.batch.to_string(),
        c.context_length.to_string(),
        c.kv_precision.clone(),
        format!("{:.1}", r.prefill.tokens_per_sec.median()),
        format!("{:.1}", r.prefill.ttft_ms.median()),
        format!("{:.2}", tg.median()),
        format!("{:.2}", (tg.ci95_high() - tg.ci95_low()) / 2.0),
        format!("{:.2}", r.decode.latency_ms.p50()),
        p99_cell(&r.decode.latency_ms),
        roofline_cell(r),
        r.decode.compute_fraction.map_or("-".into(), |f| format!("{:.0}%", f * 100.0)),
        kv_cache_known(r).map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
        r.quality.as_ref().map_or("-".into(), |q| {
            if q.is_real() {
                format!("{:.4} / {:.0}%", q.kl_divergence, q.top1_agreement * 100.0)
            } else {
                "synthetic".into()
            }
        }),
    ]
}

/// The lines above the table: what was measured, on what.
pub fn header(r: &Report) -> String {
    let s = &r.system;
    format!(
        "{} ({}{}, {:.0} MiB of weights{}, {}) on {}{} cores / {} CPUs); read bandwidth {:.1} GB/s ({} threads{}{}){}; {} warm-up + {} runs × {} new tokens{}{}{}",
        r.model.name,
        r.model.weight_format,
        match (&r.model.ffn_activation, &r.model.ffn_activation_source) {
            (Some(a), Some(src)) => format!(", {a} FFN ({src})"),
            (Some(a), None) => format!(", {a} FFN"),
            _ => String::new(),
        },
        r.model.weight_bytes as f64 / 1048576.0,
        match r.results.iter().filter_map(|x| x.memory.repack_bytes).max() {
            Some(b) if b > 0 => format!(" + up to {:.0} MiB held by kernel repacks", b as f64 / 1048576.0),
            _ => String::new(),
        },
        r.model.source,
        match &s.cpu_id {
            Some(id) => format!("{} ({id}; ", s.cpu_model),
            None => format!("{} (", s.cpu_model),
        },
        s.physical_cores,
        s.logical_cpus,
        r.roofline.read_bandwidth_gbps,
        r.roofline.threads,
        r.roofline.probe_bytes.map_or(String::new(), |b| format!(", {} probe", mib(b))),
        probes_note(&r.roofline),
        peaks_note(&r.roofline),
        r.settings.warmup,
        r.settings.repeat,
        r.settings.max_new_tokens,
        quality_note(r),
        if s.huge_pages_requested == Some(false) { "; no huge pages (BITNET_HUGE_PAGES=0)" } else { "" },
        if r.complete { "" } else { " — INCOMPLETE (interrupted)" }
    )
}

/// What the quality columns were measured on, when on real text: `; KV quality on
/// rustdocs-heldout.txt (72788 bytes, sha256 …), 256 positions, model rustdocs-bitnet-i2_s.gguf`.
fn quality_note(r: &Report) -> String {
    quality_source(r).map_or(String::new(), |q| format!("; KV quality on {q}"))
}

/// The text, positions and model of a report's real-text quality figures, if it has any.
pub fn quality_source(r: &Report) -> Option<String> {
    let q = r.results.iter().filter_map(|x| x.quality.as_ref()).find(|q| q.is_real())?;
    Some(format!(
        "{}, {} positions{}",
        q.text.as_deref().unwrap_or("text"),
        q.positions,
        q.model.as_ref().map_or(String::new(), |m| format!(", model {m}"))
    ))
}

/// A probe's size: `1 GiB`, `64 MiB`, `1.5 MiB`.
pub fn mib(bytes: u64) -> String {
    let m = bytes as f64 / 1048576.0;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if m.fract() == 0.0 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}

/// The compute rooflines: `; int8 peak avx512/1 233.0 G multiply-adds/s, avx512/2 466.1 G multiply-adds/s`.
fn peaks_note(r: &bitnet_report::roofline::Roofline) -> String {
    peaks_text(r).map_or(String::new(), |t| format!("; int8 peak {t}"))
}

/// The compute rooflines with their probes where there were several:
/// `avx512/2 466.1 G multiply-adds/s (probes 452.0 → 466.1, 3% apart)`.
pub fn peaks_text(r: &bitnet_report::roofline::Roofline) -> Option<String> {
    if r.int8_peak_gmacs.is_empty() {
        return None;
    }
    let each: Vec<String> = r
        .int8_peak_gmacs
        .iter()
        .map(|(k, g)| {
            let probes = r.int8_peak_probes.get(k).filter(|p| p.len() > 1).map_or(String::new(), |p| {
                let list: Vec<String> = p.iter().map(|g| format!("{g:.1}")).collect();
                format!(" (probes {}, {:.0}% apart)", list.join(" → "), spread(p) * 100.0)
            });
            format!("{k} {g:.1} G multiply-adds/s{probes}")
        })
        .collect();
    Some(each.join(", "))
}

/// The probes behind the roofline when there were several: `; probes 27.1 → 30.4`, and a
/// warning when the probes of one thread count are more than 10% apart (the roofline
/// fractions are then uncertain), with that count's probes where it is not the header's.
fn probes_note(r: &bitnet_report::roofline::Roofline) -> String {
    let top = r.threads.to_string();
    let list = |p: &[f64]| p.iter().map(|g| format!("{g:.1}")).collect::<Vec<_>>().join(" → ");
    let mut note = match r.probes_gbps.get(&top).filter(|p| p.len() > 1) {
        Some(p) => format!("; probes {}", list(p)),
        None => String::new(),
    };
    if let Some((threads, spread)) = r.widest_probe_spread().filter(|w| w.1 > 0.10) {
        let pct = spread * 100.0;
        if threads == top {
            let _ = write!(note, ", {pct:.0}% apart: bandwidth moved during the sweep");
        } else {
            let _ = write!(
                note,
                "; {threads}-thread probes {}, {pct:.0}% apart: bandwidth moved during the sweep",
                list(&r.probes_gbps[threads])
            );
        }
    }
    note
}

fn aligned(rows: &[[String; 17]], sep: &str, edge: bool) -> String {
    let mut w = HEADERS.map(str::len);
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let numeric = |i: usize| i >= 3 && i != 6;
    let line = |cells: &[String]| {
        let parts: Vec<String> =
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if numeric(i) {
                        format!("{c:>width$}", width = w[i])
                    } else {
                        format!("{c:<width$}", width = w[i])
                    }
                })
                .collect();
        if edge {
            format!("| {} |", parts.join(sep))
        } else {
            parts.join(sep)
        }
    };
    let mut o = String::new();
    let _ = writeln!(o, "{}", line(&HEADERS.map(String::from)));
    let rule: Vec<String> = w
        .iter()
        .enumerate()
        .map(|(i, n)| if numeric(i) { format!("{}:", "-".repeat(n - 1)) } else { "-".repeat(*n) })
        .collect();
    let _ = writeln!(o, "{}", if edge { format!("| {} |", rule.join(sep)) } else { rule.join(sep) });
    for r in rows {
        let _ = writeln!(o, "{}", line(r));
    }
    o
}

/// A result's KV cache bytes, `None` where they are unknown: every run of ours has a cache, so
/// 0 is an imported run's "not measured".
pub fn kv_cache_known(r: &BenchResult) -> Option<u64> {
    (r.memory.kv_cache_bytes > 0).then_some(r.memory.kv_cache_bytes)
}

/// The median of the probes a result's roofline fraction was taken against (GB/s), `None`
/// where there were none (an imported or older report).
pub fn step_probe_median(r: &BenchResult) -> Option<f64> {
    let p = &r.decode.probes_gbps;
    (!p.is_empty()).then(|| bitnet_report::stats::median(p))
}

/// The roofline cell: the fraction and the median step probe it is of (`73% of 56.9`), since
/// on a shared bus the probes move between levels and a fraction alone does not say at which
/// the decode ran; the fraction alone where the report has no probes, "-" where unknown.
fn roofline_cell(r: &BenchResult) -> String {
    match (roofline_known(r), step_probe_median(r)) {
        (Some(f), Some(g)) => format!("{:.0}% of {g:.1}", f * 100.0),
        (Some(f), None) => format!("{:.0}%", f * 100.0),
        (None, _) => "-".into(),
    }
}

/// A result's roofline fraction, `None` where it is unknown (an imported llama-bench result
/// has no bytes per step): printed as "-", not as 0%.
pub fn roofline_known(r: &BenchResult) -> Option<f64> {
    (r.decode.bytes_per_step > 0).then_some(r.decode.roofline_fraction)
}

/// The terminal table.
pub fn table(r: &Report) -> String {
    table_with(&[header(r)], r)
}

/// The terminal table under `headers` (one line per report shown, see [`side_by_side`]).
pub fn table_with(headers: &[String], r: &Report) -> String {
    let rows: Vec<_> = r.results.iter().map(row).collect();
    format!("{}\n\n{}\n{}", headers.join("\n"), aligned(&rows, " | ", true), legend(r))
}

/// What the columns are, under the terminal and Markdown tables (with `r`'s step probe size,
/// this build's where an older report does not say).
pub fn legend(r: &Report) -> String {
    format!(
        "pp: prefill tokens/s (median); ttft: time to first token (median; with batch B, the B prompts prefilled one after another); tg: decode tokens/s (median, ± half the 95% CI of the mean); p50/p99: inter-token latency (p99* from fewer than {P99_MIN_STEPS} steps, where it is about the slowest one); roofline: bytes read per decode step × steps/s ÷ read bandwidth (median over the steps of further runs, one per measured run, each step against a {} probe right after it, not the header's bandwidth, which is the best of longer probes; \"of\" gives those probes' median GB/s, as the bus moves between levels); compute: multiply-adds per decode step (every weight of the linear layers and the LM head, once per sequence) × steps/s ÷ the header's int8 peak for the ISA and threads (batch decode's roofline, as bandwidth is batch 1's); kl / top1: KV precision's quality cost against f32 KV on real text (the header says which text and model: --quality-text, or for a preset the committed trained model's held-out text; perplexities in the JSON and CSV), or `synthetic` where measured on random token ids or weights, which estimate no model's quality.",
        mib(r.roofline.step_probe_bytes.unwrap_or(crate::sweep::ROOFLINE_PROBE_BYTES as u64))
    ) + &above_probe_warning(r).map_or(String::new(), |w| format!(" WARNING: {w}"))
}

/// A warning where a roofline or compute fraction is above 100%: a run cannot outrun the bus
/// or the int8 arithmetic, so the probe it is measured against read low (on a shared VM
/// another tenant on the core or the bus while it ran), and such a figure is not of this
/// machine. Not for the compute of `tq1` and `xnor`, whose lookup and popcount forms multiply
/// nothing and may pass 100% (see docs/kernels.md).
fn above_probe_warning(r: &Report) -> Option<String> {
    let roofline = r.results.iter().any(|x| roofline_known(x).is_some_and(|f| f > 1.0));
    let multiplies = |x: &&BenchResult| !matches!(x.config.kernel.as_str(), "tq1" | "xnor");
    let compute = r.results.iter().filter(multiplies).any(|x| {
        x.decode.compute_fraction.is_some_and(|f| f > 1.0) || x.prefill.compute_fraction.is_some_and(|f| f > 1.0)
    });
    let what = match (roofline, compute) {
        (false, false) => return None,
        (true, false) => "a roofline above 100%: its step probes",
        (false, true) => "a compute fraction above 100%: the int8 peak probes",
        (true, true) => "roofline and compute fractions above 100%: their probes",
    };
    Some(format!(
        "{what} read below what the run did (disturbed: another tenant or throttling while they ran), \
         so those figures are not of this machine; rerun on a quiet one."
    ))
}

/// What a reader must not miss, one sentence each: an interrupted sweep, a bandwidth that moved
/// while it ran, fractions above 100%, quality figures that are synthetic, huge pages off.
pub fn warnings(r: &Report) -> Vec<String> {
    let mut w = Vec::new();
    if !r.complete {
        w.push("Incomplete: the sweep was interrupted; the table holds the combinations that finished.".into());
    }
    if let Some((threads, spread)) = r.roofline.widest_probe_spread().filter(|w| w.1 > 0.10) {
        let list: Vec<String> = r.roofline.probes_gbps[threads].iter().map(|g| format!("{g:.1}")).collect();
        w.push(format!(
            "The read bandwidth moved during the sweep: the {threads}-thread probes read {} GB/s, {:.0}% apart, so figures against it are uncertain.",
            list.join(", "),
            spread * 100.0
        ));
    }
    for (key, p) in r.roofline.int8_peak_probes.iter().filter(|(_, p)| spread(p) > 0.10) {
        let list: Vec<String> = p.iter().map(|g| format!("{g:.1}")).collect();
        w.push(format!(
            "The int8 peak moved during the sweep: the {key} probes read {} G multiply-adds/s, {:.0}% apart, so compute fractions against it are uncertain.",
            list.join(", "),
            spread(p) * 100.0
        ));
    }
    w.extend(above_probe_warning(r));
    if r.results.iter().any(|x| x.quality.as_ref().is_some_and(|q| !q.is_real())) {
        w.push(
            "KV quality was measured on random token ids or weights (synthetic): it exercises the KV precisions' code but estimates no model's quality, so it is not shown as a figure."
                .into(),
        );
    }
    if r.system.huge_pages_requested == Some(false) {
        w.push("The engine did not ask for huge pages (BITNET_HUGE_PAGES=0): weights and KV cache streamed from 4 KiB pages.".into());
    }
    w
}

/// Markdown for PR comments: a summary line, then the table.
pub fn markdown(r: &Report) -> String {
    markdown_with(&r.model.name, &[header(r)], r)
}

/// [`markdown`] titled `title`, under `headers` (one paragraph each).
pub fn markdown_with(title: &str, headers: &[String], r: &Report) -> String {
    let rows: Vec<_> = r.results.iter().map(row).collect();
    let mut o = String::new();
    let _ = writeln!(o, "### bitnet-bench: {title}\n");
    for h in headers {
        let _ = writeln!(o, "{h}\n");
    }
    o.push_str(&aligned(&rows, " | ", true));
    let _ = writeln!(o, "\n{}", legend(r));
    o
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV's header: machine-friendly units in the column names.
pub const CSV_HEADER: &str = "model,kernel,isa,threads,batch,context_length,kv_precision,prefill_tokens_per_sec_median,ttft_ms_median,decode_tokens_per_sec_median,decode_tokens_per_sec_ci95_low,decode_tokens_per_sec_ci95_high,latency_ms_p50,latency_ms_p90,latency_ms_p95,latency_ms_p99,bytes_per_token,roofline_fraction,weight_bytes,kv_cache_bytes,kl_divergence,top1_agreement,macs_per_step,compute_fraction,prefill_compute_fraction,step_probe_gbps_median,quality_source,perplexity_f32,perplexity";

/// CSV: one row per combination ([`csv_cells`], quoted where needed), [`CSV_HEADER`] first.
pub fn csv(r: &Report) -> String {
    let mut o = format!("{CSV_HEADER}\n");
    for cells in csv_cells(r) {
        let quoted: Vec<String> = cells.iter().map(|c| csv_field(c)).collect();
        let _ = writeln!(o, "{}", quoted.join(","));
    }
    o
}

/// Each result's CSV cells, unquoted, in [`CSV_HEADER`]'s order (for pages that show the same
/// table: a model name may hold a comma).
pub fn csv_cells(r: &Report) -> Vec<Vec<String>> {
    let mut rows = Vec::with_capacity(r.results.len());
    for x in &r.results {
        let c = &x.config;
        let (kl, top1) = x.quality.as_ref().map_or((String::new(), String::new()), |q| {
            (format!("{}", q.kl_divergence), format!("{}", q.top1_agreement))
        });
        let fields = vec![
            c.model.clone(),
            c.kernel.clone(),
            c.isa.clone(),
            c.threads.to_string(),
            c.batch.to_string(),
            c.context_length.to_string(),
            c.kv_precision.clone(),
            format!("{}", x.prefill.tokens_per_sec.median()),
            format!("{}", x.prefill.ttft_ms.median()),
            format!("{}", x.decode.tokens_per_sec.median()),
            format!("{}", x.decode.tokens_per_sec.ci95_low()),
            format!("{}", x.decode.tokens_per_sec.ci95_high()),
            format!("{}", x.decode.latency_ms.p50()),
            format!("{}", x.decode.latency_ms.p90()),
            format!("{}", x.decode.latency_ms.p95()),
            format!("{}", x.decode.latency_ms.p99()),
            x.decode.bytes_per_token.to_string(),
            roofline_known(x).map_or(String::new(), |f| format!("{f}")),
            x.memory.weight_bytes.to_string(),
            kv_cache_known(x).map_or(String::new(), |b| b.to_string()),
            kl,
            top1,
            if x.decode.macs_per_step > 0 { x.decode.macs_per_step.to_string() } else { String::new() },
            x.decode.compute_fraction.map_or(String::new(), |f| format!("{f}")),
            x.prefill.compute_fraction.map_or(String::new(), |f| format!("{f}")),
            step_probe_median(x).map_or(String::new(), |g| format!("{g}")),
            x.quality.as_ref().map_or(String::new(), |q| q.source.clone()),
            x.quality.as_ref().and_then(|q| q.perplexity_f32).map_or(String::new(), |p| format!("{p}")),
            x.quality.as_ref().and_then(|q| q.perplexity).map_or(String::new(), |p| format!("{p}")),
        ];
        rows.push(fields);
    }
    rows
}

/// Several reports shown as one (`bitnet-bench show`: ours beside an imported llama-bench run,
/// or sweeps of two models): the first report with every report's results, and a header line
/// per report naming its file. Results are told apart by their configuration (model, kernel,
/// ISA, ...), so two reports with an equal configuration are refused: pool runs of one build
/// with `merge`, judge two builds with `bitnet-diff`.
pub fn side_by_side(reports: &[(String, Report)]) -> anyhow::Result<(Report, Vec<String>)> {
    let Some((_, first)) = reports.first() else { anyhow::bail!("show: no reports given") };
    let mut all = first.clone();
    all.results.clear();
    all.complete = reports.iter().all(|(_, r)| r.complete);
    let mut seen: std::collections::BTreeMap<&bitnet_report::report::Config, (usize, &str)> = Default::default();
    let mut headers = Vec::new();
    for (i, (name, r)) in reports.iter().enumerate() {
        for x in &r.results {
            if let Some((j, other)) = seen.insert(&x.config, (i, name)) {
                let whose =
                    if i == j { format!("{name} holds twice") } else { format!("{other} and {name} both hold") };
                anyhow::bail!(
                    "{whose} {}: one table cannot tell them apart (pool runs of one build with `bitnet-bench merge`, compare two with `bitnet-diff`)",
                    x.config
                );
            }
            all.results.push(x.clone());
        }
        headers.push(if r.tool.name == "bitnet-bench" {
            format!("{name}: {}", header(r))
        } else {
            format!(
                "{name}: {} {} ({}), {} {} (commit {}) on {}; {} runs × {} new tokens{}",
                r.model.name,
                r.model.weight_format,
                r.model.source,
                r.tool.name,
                r.tool.version,
                r.tool.git_commit.as_deref().unwrap_or("unknown"),
                r.system.cpu_model,
                r.settings.repeat,
                r.settings.max_new_tokens,
                // Its tg rows decoded from this cache, not after a prompt of their context.
                r.settings.decode_depth.map_or(String::new(), |d| format!(
                    " decoded from a cache of {d} tokens (its tg rows' context column is the pp prompt's)"
                ))
            )
        });
    }
    Ok((all, headers))
}
