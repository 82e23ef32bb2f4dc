//! SVG charts of a report, drawn by `plotters` with its SVG backend (text is SVG `<text>`, so
//! no system font is needed); the page that holds them is [`crate::page`]'s.

use std::collections::BTreeMap;

use anyhow::Result;
use plotters::prelude::*;

use bitnet_report::report::{BenchResult, Report};

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

/// The latency chart's title and lines: decode step latency vs context length at the report's
/// smallest batch. With one kind of run (model, kernel, threads and KV precision) a line per
/// percentile (p50, p90, p95, p99); with several, p50 and p99 of each, labelled by what tells
/// the runs apart. Every run at that batch is drawn (a `show` of llama-bench's f16 run beside
/// our int8 one kept only the first result's precision before), and no line joins unlike runs.
fn latency_lines(r: &Report) -> Option<(String, Lines)> {
    let b = r.results.iter().map(|x| x.config.batch).min()?;
    let at_b: Vec<&BenchResult> = r.results.iter().filter(|x| x.config.batch == b).collect();
    // Which of model, kernel, threads and precision differ between the runs: those label the lines.
    let parts: Vec<[String; 4]> = at_b
        .iter()
        .map(|x| {
            let c = &x.config;
            [c.model.clone(), c.kernel.clone(), format!("t{}", c.threads), format!("KV {}", c.kv_precision)]
        })
        .collect();
    let varies: [bool; 4] = std::array::from_fn(|i| parts.iter().any(|p| p[i] != parts[0][i]));
    let mut lat = Lines::new();
    for (x, p) in at_b.iter().zip(&parts) {
        let (l, c) = (&x.decode.latency_ms, &x.config);
        let label: String = p.iter().zip(varies).filter(|(_, v)| *v).map(|(s, _)| format!(" {s}")).collect();
        let percentiles: &[(&str, f64)] = if !varies.contains(&true) {
            &[("p50", l.p50()), ("p90", l.p90()), ("p95", l.p95()), ("p99", l.p99())]
        } else {
            &[("p50", l.p50()), ("p99", l.p99())]
        };
        for (name, v) in percentiles {
            lat.entry(format!("{name}{label}")).or_default().push((c.context_length as f64, *v));
        }
    }
    lat.values_mut().for_each(|v| v.sort_by(|a, b| a.0.total_cmp(&b.0)));
    let t = if varies[3] {
        format!("Inter-token latency vs context length (batch {b})")
    } else {
        format!("Inter-token latency vs context length (batch {b}, KV {})", at_b[0].config.kv_precision)
    };
    Some((t, lat))
}

/// Every chart of the report: (file name, title, SVG).
pub fn charts(r: &Report) -> Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    let several_models = r.results.iter().any(|x| x.config.model != r.results[0].config.model);
    let model = |x: &BenchResult| if several_models { format!("{} ", x.config.model) } else { String::new() };
    // Decode tokens/s vs batch size, a line per KV precision (and context, kernel, threads).
    let mut tg = Lines::new();
    for x in &r.results {
        let c = &x.config;
        let key = format!("{}{} ctx {} {} t{}", model(x), c.kv_precision, c.context_length, c.kernel, c.threads);
        tg.entry(key).or_default().push((c.batch as f64, x.decode.tokens_per_sec.median()));
    }
    tg.values_mut().for_each(|v| v.sort_by(|a, b| a.0.total_cmp(&b.0)));
    // A chart with nothing to draw is left out (a sweep interrupted in its first combination,
    // the roofline of an imported run), not drawn empty.
    if !tg.is_empty() {
        let t = "Decode tokens/s vs batch size";
        out.push(("decode_vs_batch.svg".into(), t.into(), line_chart(t, "batch size", "tokens/s (median)", &tg)?));
    }

    if let Some((t, lat)) = latency_lines(r) {
        out.push(("latency_vs_context.svg".into(), t.clone(), line_chart(&t, "context length", "ms", &lat)?));
    }

    // KV cache bytes and quality cost per precision, at the largest batch × context.
    let mut per_kv: BTreeMap<String, &BenchResult> = BTreeMap::new();
    for x in &r.results {
        let e = per_kv.entry(format!("{}{}", model(x), x.config.kv_precision)).or_insert(x);
        if x.memory.kv_cache_bytes > e.memory.kv_cache_bytes {
            *e = x;
        }
    }
    let kv_bars: Vec<(String, Vec<(String, f64)>)> = per_kv
        .iter()
        .filter_map(|(k, x)| {
            crate::output::kv_cache_known(x).map(|b| (k.clone(), vec![("KV MiB".into(), b as f64 / 1048576.0)]))
        })
        .collect();
    if !kv_bars.is_empty() {
        let t = "KV cache size per precision (largest batch × context)";
        out.push(("kv_bytes.svg".into(), t.into(), bar_chart(t, "MiB", &kv_bars)?));
    }
    let q_bars: Vec<(String, Vec<(String, f64)>)> = per_kv
        .iter()
        .filter_map(|(k, x)| {
            // Synthetic figures estimate no model's quality: not drawn as if they did.
            x.quality.as_ref().filter(|q| q.is_real()).map(|q| (k.clone(), vec![("KL".into(), q.kl_divergence)]))
        })
        .collect();
    if !q_bars.is_empty() {
        let t = "Quality cost per KV precision on real text (KL divergence from f32 KV, nats)";
        out.push(("kv_quality.svg".into(), t.into(), bar_chart(t, "KL (nats)", &q_bars)?));
    }

    // Stage breakdown, stacked shares per combination.
    let stage_bars: Vec<(String, Vec<(String, f64)>)> = r
        .results
        .iter()
        .filter_map(|x| {
            x.stages
                .as_ref()
                .map(|s| (short(x, several_models), s.iter().map(|(k, v)| (k.clone(), v.share * 100.0)).collect()))
        })
        .collect();
    if !stage_bars.is_empty() {
        let t = "Decode time by stage (% of stage time)";
        out.push(("stages.svg".into(), t.into(), bar_chart(t, "%", &stage_bars)?));
    }

    // Roofline fraction per combination (where known: not for an imported llama-bench run).
    let roof: Vec<(String, Vec<(String, f64)>)> = r
        .results
        .iter()
        .filter_map(|x| {
            crate::output::roofline_known(x).map(|f| (short(x, several_models), vec![("roofline".into(), f * 100.0)]))
        })
        .collect();
    if !roof.is_empty() {
        let t = "Decode bandwidth as % of the measured read bandwidth";
        out.push(("roofline.svg".into(), t.into(), bar_chart(t, "% of roofline", &roof)?));
    }

    // Compute fraction per combination (where the sweep measured an int8 peak).
    let compute: Vec<(String, Vec<(String, f64)>)> = r
        .results
        .iter()
        .filter_map(|x| {
            x.decode.compute_fraction.map(|f| (short(x, several_models), vec![("compute".into(), f * 100.0)]))
        })
        .collect();
    if !compute.is_empty() {
        let t = "Decode multiply-adds as % of the measured int8 peak";
        out.push(("compute.svg".into(), t.into(), bar_chart(t, "% of int8 peak", &compute)?));
    }
    Ok(out)
}
