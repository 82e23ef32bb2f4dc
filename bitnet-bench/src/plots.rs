//! The charts of a report's page ([`crate::page`]): lines on log₂ axes, labelled bars with
//! their ceilings and stacked stage bars, drawn by `bitnet_report::svg`.

use std::collections::BTreeMap;

use bitnet_report::report::{BenchResult, Report};
use bitnet_report::roofline::{peak_key, per_second};
use bitnet_report::svg::{Bar, BarChart, Ceiling, LineChart, Point, Series, Stack, StackedBarChart, XAxis};

/// A combination's short label; with the model first when a chart holds several
/// (`bitnet-bench show` of two models).
fn short(r: &BenchResult, with_model: bool) -> String {
    let c = &r.config;
    let s = format!("{} B{} c{} {} t{}", c.kernel, c.batch, c.context_length, c.kv_precision, c.threads);
    if with_model {
        format!("{} {s}", c.model)
    } else {
        s
    }
}

/// The latency chart's title and series: decode step latency vs context length at the
/// report's smallest batch. With one kind of run (model, kernel, threads and KV precision) a
/// series per percentile (p50, p90, p95, p99); with several, p50 and p99 of each, labelled by
/// what tells the runs apart. Every run at that batch is drawn (a `show` of llama-bench's f16
/// run beside our int8 one kept only the first result's precision before), and no line joins
/// unlike runs.
fn latency_series(r: &Report, sources: &[String]) -> Option<(String, Vec<Series>)> {
    let b = r.results.iter().map(|x| x.config.batch).min()?;
    let at_b: Vec<(usize, &BenchResult)> = r.results.iter().enumerate().filter(|(_, x)| x.config.batch == b).collect();
    // Which of report, model, kernel, threads and precision differ between the runs: those
    // label the lines.
    let parts: Vec<[String; 5]> = at_b
        .iter()
        .map(|(i, x)| {
            let c = &x.config;
            let source = sources.get(*i).cloned().unwrap_or_default();
            [source, c.model.clone(), c.kernel.clone(), format!("t{}", c.threads), format!("KV {}", c.kv_precision)]
        })
        .collect();
    let varies = varying(&parts);
    let at_b: Vec<&BenchResult> = at_b.into_iter().map(|(_, x)| x).collect();
    let mut lat: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for (x, p) in at_b.iter().zip(&parts) {
        let (l, c) = (&x.decode.latency_ms, &x.config);
        let label: String = p.iter().zip(varies).filter(|(_, v)| *v).map(|(s, _)| format!(" {s}")).collect();
        let percentiles: &[(&str, f64)] = if !varies.contains(&true) {
            &[("p50", l.p50()), ("p90", l.p90()), ("p95", l.p95()), ("p99", l.p99())]
        } else {
            &[("p50", l.p50()), ("p99", l.p99())]
        };
        for (name, v) in percentiles {
            let hover =
                format!("{name}{label} at context {}: {v:.3} ms ({} steps)", c.context_length, l.samples().len());
            lat.entry(format!("{name}{label}")).or_default().push(Point {
                x: c.context_length as f64,
                y: *v,
                ci: None,
                hover,
            });
        }
    }
    let t = if varies[4] {
        format!("Inter-token latency vs context length (batch {b})")
    } else {
        format!("Inter-token latency vs context length (batch {b}, KV {})", at_b[0].config.kv_precision)
    };
    Some((t, lat.into_iter().map(|(name, points)| Series { name, points }).collect()))
}

/// Which of the parts of the runs' descriptions differ between them: those name their lines.
fn varying<const N: usize>(parts: &[[String; N]]) -> [bool; N] {
    std::array::from_fn(|k| parts.iter().any(|p| p[k] != parts[0][k]))
}

/// The charts of a report, and a sentence for each one left out because its axis has one value
/// (the table holds that number) or it has nothing to draw.
pub struct Charts {
    /// (file name, title, SVG).
    pub drawn: Vec<(String, String, String)>,
    pub not_drawn: Vec<String>,
}

fn distinct(v: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<usize> = v.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Every chart of the report. `sources` names the report each result came from (`show` of
/// several: their series are labelled by it); empty for one report.
pub fn charts(r: &Report, sources: &[String]) -> Charts {
    let mut out = Charts { drawn: Vec::new(), not_drawn: Vec::new() };
    let several_models = r.results.iter().any(|x| x.config.model != r.results[0].config.model);
    let several_sources = sources.iter().any(|s| *s != sources[0]);
    let sources: &[String] = if several_sources { sources } else { &[] };
    // A result's series label starts with its report (several reports) and model (several
    // models); `who[i]` is result i's.
    let who: Vec<String> = r
        .results
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let source = sources.get(i).map_or(String::new(), |s| format!("{s}: "));
            let model = if several_models { format!("{} ", x.config.model) } else { String::new() };
            format!("{source}{model}")
        })
        .collect();
    let label = |i: usize, x: &BenchResult| format!("{}{}", who[i], short(x, false));
    if r.results.is_empty() {
        return out;
    }
    // Decode tokens/s vs batch size, a line per KV precision, context, kernel and thread count,
    // named by those of them that differ between the lines (the page says the rest once).
    let batches = distinct(r.results.iter().map(|x| x.config.batch));
    if batches.len() > 1 {
        let parts: Vec<[String; 4]> = r
            .results
            .iter()
            .map(|x| {
                let c = &x.config;
                [
                    format!("KV {}", c.kv_precision),
                    format!("ctx {}", c.context_length),
                    c.kernel.clone(),
                    format!("t{}", c.threads),
                ]
            })
            .collect();
        let varies = varying(&parts);
        let mut tg: BTreeMap<String, Vec<Point>> = BTreeMap::new();
        for (i, (x, p)) in r.results.iter().zip(&parts).enumerate() {
            let named: Vec<&str> = p.iter().zip(varies).filter(|(_, v)| *v).map(|(s, _)| s.as_str()).collect();
            let key = format!("{}{}", who[i], if named.is_empty() { p[0].clone() } else { named.join(" ") });
            let what = format!("{}{}, batch {}", who[i], p.join(" "), x.config.batch);
            tg.entry(key).or_default().push(Point::of_stat(x.config.batch as f64, &x.decode.tokens_per_sec, &what));
        }
        let t = "Decode tokens/s vs batch size";
        let chart = LineChart {
            title: t.into(),
            x_label: "batch size".into(),
            x_axis: XAxis::Log2,
            y_label: "tokens/s (median; bars: 95% CI of the mean)".into(),
            series: tg.into_iter().map(|(name, points)| Series { name, points }).collect(),
            ceilings: vec![],
        };
        out.drawn.push(("decode_vs_batch.svg".into(), t.into(), chart.to_svg()));
    } else {
        out.not_drawn
            .push(format!("decode tokens/s vs batch size: one batch size ({}); the table has its figures", batches[0]));
    }

    let contexts = distinct(r.results.iter().map(|x| x.config.context_length));
    match latency_series(r, sources) {
        Some((t, series)) if contexts.len() > 1 => {
            let chart = LineChart {
                title: t.clone(),
                x_label: "context length".into(),
                x_axis: XAxis::Log2,
                y_label: "ms per step".into(),
                series,
                ceilings: vec![],
            };
            out.drawn.push(("latency_vs_context.svg".into(), t, chart.to_svg()));
        }
        _ => out.not_drawn.push(format!(
            "inter-token latency vs context length: one context length ({}); the table has p50 and p99",
            contexts[0]
        )),
    }

    // KV cache bytes and quality cost per precision, at the largest batch × context.
    let mut per_kv: BTreeMap<String, &BenchResult> = BTreeMap::new();
    for (i, x) in r.results.iter().enumerate() {
        let e = per_kv.entry(format!("{}{}", who[i], x.config.kv_precision)).or_insert(x);
        if x.memory.kv_cache_bytes > e.memory.kv_cache_bytes {
            *e = x;
        }
    }
    let kv_bars: Vec<Bar> = per_kv
        .iter()
        .filter_map(|(k, x)| {
            crate::output::kv_cache_known(x).map(|b| Bar {
                label: k.clone(),
                value: b as f64 / 1048576.0,
                ci: None,
                hover: format!("{k}: {b} bytes at batch {} × context {}", x.config.batch, x.config.context_length),
                limit: None,
            })
        })
        .collect();
    // One precision is a number, not a comparison: the table has it.
    if kv_bars.len() == 1 {
        out.not_drawn.push(format!(
            "KV cache size and quality per precision: one precision ({}); the table has its figures",
            kv_bars[0].label
        ));
    }
    if kv_bars.len() > 1 {
        let t = "KV cache size per precision (largest batch × context)";
        let chart = BarChart { title: t.into(), y_label: "MiB".into(), bars: kv_bars, ceilings: vec![] };
        out.drawn.push(("kv_bytes.svg".into(), t.into(), chart.to_svg()));
    }
    // Synthetic figures estimate no model's quality: not drawn as if they did.
    let real: Vec<(&String, &bitnet_report::report::Quality)> =
        per_kv.iter().filter_map(|(k, x)| x.quality.as_ref().filter(|q| q.is_real()).map(|q| (k, q))).collect();
    if let Some((_, q0)) = real.first().filter(|_| real.len() > 1) {
        let bars = real
            .iter()
            .map(|(k, q)| Bar {
                label: (*k).clone(),
                value: q.kl_divergence,
                ci: None,
                hover: format!(
                    "{k}: KL {:.5} nats, top-1 agreement {:.1}%, {} positions",
                    q.kl_divergence,
                    q.top1_agreement * 100.0,
                    q.positions
                ),
                limit: None,
            })
            .collect();
        let source = match (&q0.text, &q0.model) {
            (Some(t), Some(m)) => format!(" ({t}, model {m})"),
            (Some(t), None) => format!(" ({t})"),
            _ => String::new(),
        };
        let t = format!("Quality cost per KV precision: KL divergence from f32 KV on real text{source}");
        let chart = BarChart { title: t.clone(), y_label: "KL divergence (nats)".into(), bars, ceilings: vec![] };
        out.drawn.push(("kv_quality.svg".into(), t, chart.to_svg()));
    }

    // Stage breakdown: each combination's decode step as stacked shares of its stages.
    // Stages by their summed share, the largest at the bottom of each bar.
    let mut total: BTreeMap<&String, f64> = BTreeMap::new();
    for s in r.results.iter().filter_map(|x| x.stages.as_ref()) {
        for (k, v) in s {
            *total.entry(k).or_default() += v.share;
        }
    }
    let mut total: Vec<(&String, f64)> = total.into_iter().collect();
    total.sort_by(|a, b| b.1.total_cmp(&a.1));
    let parts: Vec<String> = total.into_iter().map(|(k, _)| k.clone()).collect();
    let stacks: Vec<Stack> = r
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            let s = x.stages.as_ref()?;
            let values = parts.iter().map(|p| s.get(p).map_or(0.0, |v| v.share * 100.0)).collect();
            Some(Stack { label: label(i, x), values })
        })
        .collect();
    if !stacks.is_empty() {
        let t = "Decode time by stage (% of stage time)";
        let chart = StackedBarChart { title: t.into(), y_label: "%".into(), parts, bars: stacks };
        out.drawn.push(("stages.svg".into(), t.into(), chart.to_svg()));
    }

    // The bandwidth roofline, as the table's roofline column: each combination's median over
    // its steps of the bytes a step reads ÷ its time ÷ the bandwidth probed right after it. The
    // ceiling is 100% of that probe; the header's best long probe is another bus level on a
    // shared machine, so a bar against it would not be the table's figure.
    let roof: Vec<Bar> = r
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            crate::output::roofline_known(x).map(|f| {
                let probe = crate::output::step_probe_median(x)
                    .map_or(String::new(), |g| format!(" of the median probe right after its steps, {g:.1} GB/s"));
                Bar {
                    label: label(i, x),
                    value: f * 100.0,
                    ci: None,
                    hover: format!(
                        "{}: {:.1}%{probe} (median of {} steps)",
                        label(i, x),
                        f * 100.0,
                        x.decode.step_fractions.len()
                    ),
                    limit: None,
                }
            })
        })
        .collect();
    if !roof.is_empty() {
        let t = "Decode read rate as a share of the bandwidth probed right after each step";
        let ceilings = vec![Ceiling { label: "100%: the probe's bandwidth".into(), y: 100.0 }];
        let chart = BarChart { title: t.into(), y_label: "% of read bandwidth".into(), bars: roof, ceilings };
        out.drawn.push(("roofline.svg".into(), t.into(), chart.to_svg()));
    }

    // The compute roofline: multiply-adds per second (with the interval of the tokens/s it
    // follows), each bar against its own ISA and thread count's int8 peak (red), as the
    // table's compute column is.
    let rate = |x: &BenchResult, v: f64| per_second(x.decode.macs_per_step as f64, v, x.config.batch) / 1e9;
    let compute: Vec<Bar> = r
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            x.decode.compute_fraction.map(|f| {
                let s = &x.decode.tokens_per_sec;
                let g = rate(x, s.median());
                let key = peak_key(&x.config.isa, x.config.threads);
                let peak = r.roofline.int8_peak_gmacs.get(&key).copied();
                Bar {
                    label: label(i, x),
                    value: g,
                    ci: (s.n() > 1).then(|| (rate(x, s.ci95_low()), rate(x, s.ci95_high()))),
                    hover: format!(
                        "{}: {g:.1} G multiply-adds/s, {:.1}% of the {key} int8 peak",
                        label(i, x),
                        f * 100.0
                    ),
                    limit: peak.map(|p| Ceiling { label: format!("int8 peak {key}: {p:.0} G/s"), y: p }),
                }
            })
        })
        .collect();
    if !compute.is_empty() {
        let t = "Decode multiply-adds against the int8 peak of their ISA and threads (red)";
        let chart = BarChart {
            title: t.into(),
            y_label: "G multiply-adds/s (bars: 95% CI of the mean)".into(),
            bars: compute,
            ceilings: vec![],
        };
        out.drawn.push(("compute.svg".into(), t.into(), chart.to_svg()));
    }
    out
}
