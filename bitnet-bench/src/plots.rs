//! The charts of a report's page ([`crate::page`]): lines on log₂ axes and labelled bars with
//! their ceilings, drawn by `bitnet_report::svg`; the stage breakdown and the history trend
//! (`bitnet-diff --history --plot`) by `plotters` with its SVG backend.

use std::collections::BTreeMap;

use anyhow::Result;
use plotters::prelude::*;

use bitnet_report::html::significant;
use bitnet_report::report::{BenchResult, Report};
use bitnet_report::roofline::per_second;
use bitnet_report::svg::{Bar, BarChart, Ceiling, LineChart, Point, Series};

const W: u32 = 760;
const H: u32 = 440;
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("drawing {what}: {e:?}")
}

/// Named series of (x, y) points.
pub type Lines = BTreeMap<String, Vec<(f64, f64)>>;

/// Lines of `y` against `x`, one per series.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &Lines) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(err(title))?;
        let xs = series.values().flatten().map(|p| p.0);
        let ys = series.values().flatten().map(|p| p.1);
        let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        let y1 = ys.fold(0f64, f64::max);
        // One x value gets a unit-wide range around it; no points at all (callers skip such
        // charts) a unit range at 0, not an infinite one.
        let (x0, x1) = match (x0.is_finite(), x0 < x1) {
            (true, true) => (x0, x1),
            (true, false) => (x0 - 1.0, x0 + 1.0),
            (false, _) => (0.0, 1.0),
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, 0f64..(y1 * 1.15).max(1e-9))
            .map_err(err(title))?;
        chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw().map_err(err(title))?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(err(title))?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled()))).map_err(err(title))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err(title))?;
        root.present().map_err(err(title))?;
    }
    Ok(svg)
}

/// Bars (one per label), each a stack of named parts.
fn bar_chart(title: &str, y_label: &str, bars: &[(String, Vec<(String, f64)>)]) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W.max(120 * bars.len() as u32), H)).into_drawing_area();
        root.fill(&WHITE).map_err(err(title))?;
        let top = bars.iter().map(|(_, parts)| parts.iter().map(|p| p.1).sum::<f64>()).fold(0f64, f64::max);
        let n = bars.len().max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(60)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n as f64, 0f64..(top * 1.15).max(1e-9))
            .map_err(err(title))?;
        let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| labels.get(x.floor() as usize).cloned().unwrap_or_default())
            .y_desc(y_label)
            .draw()
            .map_err(err(title))?;
        let mut part_names: Vec<String> = Vec::new();
        for (_, parts) in bars {
            for (p, _) in parts {
                if !part_names.contains(p) {
                    part_names.push(p.clone());
                }
            }
        }
        for (pi, pname) in part_names.iter().enumerate() {
            let c = COLORS[pi % COLORS.len()];
            let rects = bars.iter().enumerate().filter_map(|(i, (_, parts))| {
                let below: f64 = parts.iter().take_while(|p| &p.0 != pname).map(|p| p.1).sum();
                let v = parts.iter().find(|p| &p.0 == pname)?.1;
                Some(Rectangle::new([(i as f64 + 0.15, below), (i as f64 + 0.85, below + v)], c.filled()))
            });
            let s = chart.draw_series(rects).map_err(err(title))?;
            if part_names.len() > 1 {
                s.label(pname.clone()).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
            }
        }
        if part_names.len() > 1 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(err(title))?;
        }
        root.present().map_err(err(title))?;
    }
    Ok(svg)
}

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
    let varies: [bool; 5] = std::array::from_fn(|i| parts.iter().any(|p| p[i] != parts[0][i]));
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

/// A point of a [`Stat`](bitnet_report::Stat) at `x`: its median, its 95% interval, its values on hover.
fn stat_point(x: f64, s: &bitnet_report::Stat, what: &str) -> Point {
    Point {
        x,
        y: s.median(),
        ci: (s.n() > 1).then(|| (s.ci95_low(), s.ci95_high())),
        hover: format!(
            "{what}: median {}, 95% CI {} to {}, {} runs",
            significant(s.median(), 5),
            significant(s.ci95_low(), 5),
            significant(s.ci95_high(), 5),
            s.n()
        ),
    }
}

/// Every chart of the report. `sources` names the report each result came from (`show` of
/// several: their series are labelled by it); empty for one report.
pub fn charts(r: &Report, sources: &[String]) -> Result<Charts> {
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
        return Ok(out);
    }
    // Decode tokens/s vs batch size, a line per KV precision (and context, kernel, threads).
    let batches = distinct(r.results.iter().map(|x| x.config.batch));
    if batches.len() > 1 {
        let mut tg: BTreeMap<String, Vec<Point>> = BTreeMap::new();
        for (i, x) in r.results.iter().enumerate() {
            let c = &x.config;
            let key = format!("{}{} ctx {} {} t{}", who[i], c.kv_precision, c.context_length, c.kernel, c.threads);
            let what = format!("{key}, batch {}", c.batch);
            tg.entry(key).or_default().push(stat_point(c.batch as f64, &x.decode.tokens_per_sec, &what));
        }
        let t = "Decode tokens/s vs batch size";
        let chart = LineChart {
            title: t.into(),
            x_label: "batch size".into(),
            y_label: "tokens/s (median, 95% CI)".into(),
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
            })
        })
        .collect();
    if !kv_bars.is_empty() {
        let t = "KV cache size per precision (largest batch × context)";
        let chart = BarChart { title: t.into(), y_label: "MiB".into(), bars: kv_bars, ceilings: vec![] };
        out.drawn.push(("kv_bytes.svg".into(), t.into(), chart.to_svg()));
    }
    // Synthetic figures estimate no model's quality: not drawn as if they did.
    let real: Vec<(&String, &bitnet_report::report::Quality)> =
        per_kv.iter().filter_map(|(k, x)| x.quality.as_ref().filter(|q| q.is_real()).map(|q| (k, q))).collect();
    if let Some((_, q0)) = real.first() {
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

    // Stage breakdown, stacked shares per combination.
    let stage_bars: Vec<(String, Vec<(String, f64)>)> = r
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            x.stages.as_ref().map(|s| (label(i, x), s.iter().map(|(k, v)| (k.clone(), v.share * 100.0)).collect()))
        })
        .collect();
    if !stage_bars.is_empty() {
        let t = "Decode time by stage (% of stage time)";
        out.drawn.push(("stages.svg".into(), t.into(), bar_chart(t, "%", &stage_bars)?));
    }

    // The bandwidth roofline: each combination's decode read rate against the measured bandwidth.
    let roof: Vec<Bar> = r
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            crate::output::roofline_known(x).map(|f| {
                let gbps =
                    per_second(x.decode.bytes_per_step as f64, x.decode.tokens_per_sec.median(), x.config.batch) / 1e9;
                Bar {
                    label: label(i, x),
                    value: gbps,
                    ci: None,
                    hover: format!("{}: {gbps:.2} GB/s read, {:.1}% of the roofline", label(i, x), f * 100.0),
                }
            })
        })
        .collect();
    if !roof.is_empty() {
        let t = "Decode read rate against the measured read bandwidth";
        let ceilings = r
            .roofline
            .by_threads
            .iter()
            .map(|(t, g)| Ceiling { label: format!("read bandwidth {g:.1} GB/s ({t} threads)"), y: *g })
            .collect();
        let chart = BarChart { title: t.into(), y_label: "GB/s".into(), bars: roof, ceilings };
        out.drawn.push(("roofline.svg".into(), t.into(), chart.to_svg()));
    }

    // The compute roofline: multiply-adds per second against the int8 peak.
    let compute: Vec<Bar> = r
        .results
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            x.decode.compute_fraction.map(|f| {
                let g =
                    per_second(x.decode.macs_per_step as f64, x.decode.tokens_per_sec.median(), x.config.batch) / 1e9;
                Bar {
                    label: label(i, x),
                    value: g,
                    ci: None,
                    hover: format!("{}: {g:.1} G multiply-adds/s, {:.1}% of the int8 peak", label(i, x), f * 100.0),
                }
            })
        })
        .collect();
    if !compute.is_empty() {
        let t = "Decode multiply-adds against the measured int8 peak";
        let ceilings = r
            .roofline
            .int8_peak_gmacs
            .iter()
            .map(|(k, g)| Ceiling { label: format!("int8 peak {k} {g:.0} G/s"), y: *g })
            .collect();
        let chart = BarChart { title: t.into(), y_label: "G multiply-adds/s".into(), bars: compute, ceilings };
        out.drawn.push(("compute.svg".into(), t.into(), chart.to_svg()));
    }
    Ok(out)
}
