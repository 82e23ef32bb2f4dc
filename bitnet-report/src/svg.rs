//! Charts as inline SVG, drawn by hand because what the figures need is what general plotting
//! does not give by default: batch sizes and context lengths on log₂ axes with ticks at the
//! measured values, error bars from the confidence intervals, every bar labelled, ceilings
//! (the measured bandwidth, the int8 peak) as lines, and each point's exact value on hover (an
//! SVG `<title>`). Text is SVG text, so no font file is needed.

use std::fmt::Write;

use crate::html::{escape, significant};

const W: f64 = 760.0;
const H: f64 = 420.0;
/// Margins around the plot area: left (y ticks), right (legend), top (title), bottom (x ticks).
const L: f64 = 72.0;
const R: f64 = 190.0;
const T: f64 = 36.0;
const B: f64 = 56.0;
const COLORS: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// One measured point: `y` with its 95% interval where there is one, and its hover text.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub ci: Option<(f64, f64)>,
    pub hover: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

/// A horizontal line the points cannot pass (a measured bandwidth or peak), labelled.
#[derive(Debug, Clone, PartialEq)]
pub struct Ceiling {
    pub label: String,
    pub y: f64,
}

/// Lines of `y` against an `x` drawn on a log₂ scale (batch sizes, context lengths), with a
/// tick at every measured `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub ceilings: Vec<Ceiling>,
}

/// Round numbers for a 0..`top` axis: about five ticks at 1, 2 or 5 × 10ⁿ.
pub fn nice_ticks(top: f64) -> Vec<f64> {
    if !(top.is_finite() && top > 0.0) {
        return vec![0.0, 1.0];
    }
    let raw = top / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let n = (top / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// A tick's number as short as it is exact (`0.5`, `250`, `0.02`).
fn tick_text(v: f64) -> String {
    format!("{}", (v * 1e9).round() / 1e9)
}

/// The chart's canvas (`height` below [`H`] for room under the axis) and title.
fn frame(o: &mut String, title: &str, width: f64, height: f64) {
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {height:.0}\" width=\"{width}\" height=\"{height:.0}\" role=\"img\" font-family=\"sans-serif\" font-size=\"12\"><title>{}</title><rect width=\"{width}\" height=\"{height:.0}\" fill=\"white\"/><text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        escape(title),
        width / 2.0,
        escape(title)
    );
}

/// The y axis: ticks, grid and label; returns the map from a value to its pixel row.
fn y_axis(o: &mut String, label: &str, top: f64, right: f64) -> impl Fn(f64) -> f64 {
    let ticks = nice_ticks(top);
    let ymax = *ticks.last().unwrap_or(&1.0);
    let y = move |v: f64| H - B - (v / ymax) * (H - B - T);
    for t in &ticks {
        let py = y(*t);
        let _ = write!(
            o,
            "<line x1=\"{L}\" x2=\"{right}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#e6e6e6\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            L - 6.0,
            py + 4.0,
            tick_text(*t)
        );
    }
    let _ = write!(
        o,
        "<line x1=\"{L}\" x2=\"{L}\" y1=\"{T}\" y2=\"{}\" stroke=\"#333\"/><text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        H - B,
        (H - B + T) / 2.0,
        escape(label)
    );
    y
}

impl LineChart {
    /// The distinct x values of all series, ascending.
    pub fn xs(&self) -> Vec<f64> {
        let mut xs: Vec<f64> = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs
    }

    pub fn to_svg(&self) -> String {
        let mut o = String::new();
        // The canvas grows to the right to hold the longest series name in the legend.
        let longest = self.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0);
        frame(&mut o, &self.title, (W - R + 34.0 + 6.5 * longest as f64).max(W), H);
        let xs = self.xs();
        let top = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.ci.map_or(p.y, |c| c.1.max(p.y))))
            .chain(self.ceilings.iter().map(|c| c.y))
            .fold(0f64, f64::max);
        let y = y_axis(&mut o, &self.y_label, top * 1.05, W - R);
        let (lo, hi) = (xs.first().copied().unwrap_or(1.0).log2(), xs.last().copied().unwrap_or(1.0).log2());
        let span = if hi > lo { hi - lo } else { 1.0 };
        let x = |v: f64| L + 20.0 + (v.log2() - lo) / span * (W - R - L - 40.0);
        for v in &xs {
            let px = x(*v);
            let _ = write!(
                o,
                "<line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\"/><text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                H - B,
                H - B + 5.0,
                H - B + 19.0,
                tick_text(*v)
            );
        }
        let _ = write!(
            o,
            "<line x1=\"{L}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{} (log₂ scale)</text>",
            W - R,
            H - B,
            H - B,
            (L + W - R) / 2.0,
            H - 14.0,
            escape(&self.x_label)
        );
        for c in &self.ceilings {
            let py = y(c.y);
            let _ = write!(
                o,
                "<line x1=\"{L}\" x2=\"{}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#444\" stroke-dasharray=\"6 4\"><title>{}</title></line><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">{}</text>",
                W - R,
                escape(&c.label),
                W - R - 4.0,
                py - 5.0,
                escape(&c.label)
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut pts = s.points.clone();
            pts.sort_by(|a, b| a.x.total_cmp(&b.x));
            let path: Vec<String> = pts.iter().map(|p| format!("{:.1},{:.1}", x(p.x), y(p.y))).collect();
            if pts.len() > 1 {
                let _ = write!(
                    o,
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                    path.join(" ")
                );
            }
            for p in &pts {
                let (px, py) = (x(p.x), y(p.y));
                if let Some((clo, chi)) = p.ci {
                    let (a, b) = (y(clo), y(chi));
                    let _ = write!(
                        o,
                        "<path d=\"M{px:.1},{a:.1}V{b:.1}M{:.1},{a:.1}h8M{:.1},{b:.1}h8\" stroke=\"{color}\" fill=\"none\"/>",
                        px - 4.0,
                        px - 4.0
                    );
                }
                let _ = write!(
                    o,
                    "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{color}\"><title>{}</title></circle>",
                    escape(&p.hover)
                );
            }
        }
        legend(&mut o, self.series.iter().map(|s| s.name.as_str()));
        o.push_str("</svg>");
        o
    }
}

/// The series' names beside the plot, one colour each.
fn legend<'a>(o: &mut String, names: impl Iterator<Item = &'a str>) {
    for (i, name) in names.enumerate() {
        let (lx, ly) = (W - R + 14.0, T + 10.0 + 18.0 * i as f64);
        let _ = write!(
            o,
            "<rect x=\"{lx}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{ly:.1}\">{}</text>",
            ly - 10.0,
            COLORS[i % COLORS.len()],
            lx + 16.0,
            escape(name)
        );
    }
}

/// One bar: its label (drawn under it), value, 95% interval where there is one, hover text.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub ci: Option<(f64, f64)>,
    pub hover: String,
}

/// Bars with every one labelled and its value written above it.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub bars: Vec<Bar>,
    /// A line across the bars (e.g. 100%), labelled.
    pub ceilings: Vec<Ceiling>,
}

impl BarChart {
    pub fn to_svg(&self) -> String {
        let n = self.bars.len().max(1) as f64;
        let width = (L + 30.0 + 90.0 * n).max(W - R + 40.0);
        let right = width - 20.0;
        // Labels wider than their slot (about 6.5 px a character) are slanted so that
        // neighbours do not overlap; the canvas grows below the axis to hold them.
        let slot = (right - L) / n;
        let slanted = |label: &str| 6.5 * label.chars().count() as f64 > slot;
        let longest = self.bars.iter().filter(|b| slanted(&b.label)).map(|b| b.label.chars().count()).max();
        let height = H + longest.map_or(0.0, |c| 6.5 * c as f64 * 0.5);
        let mut o = String::new();
        frame(&mut o, &self.title, width, height);
        let top = self
            .bars
            .iter()
            .map(|b| b.ci.map_or(b.value, |c| c.1.max(b.value)))
            .chain(self.ceilings.iter().map(|c| c.y))
            .fold(0f64, f64::max);
        let y = y_axis(&mut o, &self.y_label, top * 1.1, right);
        for (i, b) in self.bars.iter().enumerate() {
            let (x0, color) = (L + slot * i as f64, COLORS[0]);
            let (bx, bw) = (x0 + slot * 0.15, slot * 0.7);
            let (py, base) = (y(b.value), y(0.0));
            let _ = write!(
                o,
                "<rect x=\"{bx:.1}\" y=\"{py:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{color}\"><title>{}</title></rect>",
                base - py,
                escape(&b.hover)
            );
            if let Some((clo, chi)) = b.ci {
                let (cx, a, c) = (bx + bw / 2.0, y(clo), y(chi));
                let _ = write!(
                    o,
                    "<path d=\"M{cx:.1},{a:.1}V{c:.1}M{:.1},{a:.1}h8M{:.1},{c:.1}h8\" stroke=\"#222\" fill=\"none\"/>",
                    cx - 4.0,
                    cx - 4.0
                );
            }
            let _ = write!(
                o,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                bx + bw / 2.0,
                py - 4.0,
                significant(b.value, 3)
            );
            let (lx, ly) = (bx + bw / 2.0, H - B + 16.0);
            if slanted(&b.label) {
                let _ = write!(
                    o,
                    "<text x=\"{lx:.1}\" y=\"{ly}\" text-anchor=\"end\" font-size=\"11\" transform=\"rotate(-30 {lx:.1} {ly})\">{}</text>",
                    escape(&b.label)
                );
            } else {
                let _ = write!(
                    o,
                    "<text x=\"{lx:.1}\" y=\"{ly}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
                    escape(&b.label)
                );
            }
        }
        for c in &self.ceilings {
            let py = y(c.y);
            let _ = write!(
                o,
                "<line x1=\"{L}\" x2=\"{right}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#444\" stroke-dasharray=\"6 4\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">{}</text>",
                right - 4.0,
                py - 5.0,
                escape(&c.label)
            );
        }
        let _ = write!(o, "<line x1=\"{L}\" x2=\"{right}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\"/>", H - B, H - B);
        o.push_str("</svg>");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(x: f64, y: f64) -> Point {
        Point { x, y, ci: Some((y * 0.9, y * 1.1)), hover: format!("x {x}: {y}") }
    }

    #[test]
    fn ticks_are_round_and_cover_the_top() {
        assert_eq!(nice_ticks(9.3), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(100.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ticks(0.0), vec![0.0, 1.0]);
        assert_eq!(nice_ticks(1.6).iter().map(|t| tick_text(*t)).collect::<Vec<_>>(), ["0", "0.5", "1", "1.5", "2"]);
    }

    #[test]
    fn a_log2_axis_has_a_tick_at_each_measured_value_and_nothing_between() {
        let c = LineChart {
            title: "tg vs batch".into(),
            x_label: "batch size".into(),
            y_label: "tokens/s".into(),
            series: vec![Series {
                name: "f16".into(),
                points: vec![point(1.0, 10.0), point(8.0, 40.0), point(4.0, 30.0)],
            }],
            ceilings: vec![Ceiling { label: "peak 50".into(), y: 50.0 }],
        };
        let svg = c.to_svg();
        for t in ["1", "4", "8"] {
            assert!(svg.contains(&format!("text-anchor=\"middle\">{t}</text>")), "tick {t}");
        }
        assert!(!svg.contains(">2</text>") && !svg.contains(">1.5</text>"), "no ticks between measured values");
        // Equal steps of log₂: 1 → 4 is twice 4 → 8.
        let at = |t: &str| -> f64 {
            let i = svg.find(&format!("text-anchor=\"middle\">{t}</text>")).unwrap();
            let x = &svg[..i].rsplit("<text x=\"").next().unwrap();
            x.split('"').next().unwrap().parse().unwrap()
        };
        assert!(((at("4") - at("1")) - 2.0 * (at("8") - at("4"))).abs() < 0.2);
        assert_eq!(svg.matches("<title>x ").count(), 3, "every point has its hover text");
        assert_eq!(svg.matches("h8M").count(), 3, "every point has its error bar");
        assert!(svg.contains("stroke-dasharray") && svg.contains(">peak 50</text>"), "the ceiling is drawn");
        assert!(svg.contains("<polyline"), "points joined in x order");
        // A long series name widens the canvas instead of being cut.
        let mut wide = c.clone();
        wide.series[0].name = "x".repeat(60);
        assert!(wide.to_svg().contains(&format!("width=\"{}\"", W - R + 34.0 + 6.5 * 60.0)));
    }

    #[test]
    fn every_bar_is_labelled() {
        let bars = ["f16", "int8", "int4"].map(|l| Bar { label: l.into(), value: 2.0, ci: None, hover: l.into() });
        let svg = BarChart { title: "t".into(), y_label: "MiB".into(), bars: bars.to_vec(), ceilings: vec![] }.to_svg();
        for l in ["f16", "int8", "int4"] {
            assert!(svg.contains(&format!("font-size=\"11\">{l}</text>")), "{l}");
        }
        // Twelve long labels: slanted, with the canvas grown below the axis to hold them.
        let long: Vec<Bar> = (0..12)
            .map(|i| Bar { label: format!("i2s B{i} c128 int8 t2"), value: 1.0, ci: None, hover: String::new() })
            .collect();
        let svg = BarChart { title: "t".into(), y_label: "GB/s".into(), bars: long, ceilings: vec![] }.to_svg();
        assert_eq!(svg.matches("rotate(-30").count(), 12);
        assert!(svg.contains(&format!("height=\"{:.0}\"", H + 6.5 * 20.0 * 0.5)), "{svg}");
    }
}
