//! Charts as inline SVG, drawn by hand because what the figures need is what general plotting
//! does not give by default: batch sizes and context lengths on log₂ axes with ticks at the
//! measured values, error bars from the confidence intervals, every bar labelled, ceilings
//! (the measured bandwidth, the int8 peak) as lines, and each point's exact value on hover (an
//! SVG `<title>`). Text is SVG text, so no font file is needed.

use std::fmt::Write;

use crate::html::{escape, significant};
use crate::stats::Stat;

const W: f64 = 760.0;
const H: f64 = 420.0;
/// Margins around the plot area: left (y ticks), right (legend), top (title), bottom (x ticks).
const L: f64 = 72.0;
const R: f64 = 190.0;
const T: f64 = 36.0;
const B: f64 = 56.0;
const COLORS: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
/// Twenty colours in ten pairs, for a stack's parts (a decode step has fourteen stages).
const PART_COLORS: [&str; 20] = [
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd", "#c5b0d5",
    "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
];

/// One measured point: `y` with its 95% interval where there is one, and its hover text.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub ci: Option<(f64, f64)>,
    pub hover: String,
}

impl Point {
    /// A statistic at `x`: its median, the 95% interval of its mean (none from one sample),
    /// and on hover `what` with those figures and the sample count.
    pub fn of_stat(x: f64, s: &Stat, what: &str) -> Point {
        Point {
            x,
            y: s.median(),
            ci: (s.n() > 1).then(|| (s.ci95_low(), s.ci95_high())),
            hover: format!(
                "{what}: median {}, 95% CI of the mean {} to {}, {} samples",
                significant(s.median(), 5),
                significant(s.ci95_low(), 5),
                significant(s.ci95_high(), 5),
                s.n()
            ),
        }
    }
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

/// How a line chart places its points' `x`.
#[derive(Debug, Clone, PartialEq)]
pub enum XAxis {
    /// On a log₂ scale (batch sizes, context lengths), with a tick at every measured value.
    Log2,
    /// `x` is an index into these names (runs of a history, oldest first), evenly spaced, each
    /// with its tick.
    Names(Vec<String>),
}

/// Lines of `y` against `x`, with a tick at every measured `x`.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub x_axis: XAxis,
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
    // A top a rounding error above a round number (shares summing to 100.0000001) ends there.
    let raw = raw * (1.0 - 1e-6);
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let n = (top * (1.0 - 1e-6) / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// About the width of a character of the charts' 12 px sans-serif text: what decides whether a
/// label fits its slot or a legend its margin (no font metrics in an SVG written blind).
const CHAR_W: f64 = 6.5;

fn text_width(chars: usize) -> f64 {
    CHAR_W * chars as f64
}

/// Room below the axis for labels of up to `longest` characters slanted by 30° (sin 30° = ½).
fn slant_room(longest: Option<usize>) -> f64 {
    longest.map_or(0.0, |c| text_width(c) * 0.5)
}

/// An error bar from `lo` to `hi` (pixel rows) at column `x`, with 8 px caps.
fn error_bar(o: &mut String, x: f64, lo: f64, hi: f64, color: &str) {
    let _ = write!(
        o,
        "<path d=\"M{x:.1},{lo:.1}V{hi:.1}M{:.1},{lo:.1}h8M{:.1},{hi:.1}h8\" stroke=\"{color}\" fill=\"none\"/>",
        x - 4.0,
        x - 4.0
    );
}

/// A tick's number as short as it is exact (`0.5`, `250`, `0.02`).
fn tick_text(v: f64) -> String {
    format!("{}", (v * 1e9).round() / 1e9)
}

/// The chart's canvas (`height` below [`H`] for room under the axis) and title.
fn frame(o: &mut String, title: &str, width: f64, height: f64) {
    // The canvas widens to hold a long title (about 8 px a character at 15 px).
    let width = width.max(8.0 * title.chars().count() as f64 + 20.0);
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {height:.0}\" width=\"{width}\" height=\"{height:.0}\" role=\"img\" font-family=\"sans-serif\" font-size=\"12\"><title>{}</title><rect width=\"{width}\" height=\"{height:.0}\" fill=\"white\"/><text class=\"title\" x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
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
        let xs = self.xs();
        let tick = |v: f64| match &self.x_axis {
            XAxis::Log2 => tick_text(v),
            XAxis::Names(n) => n.get(v as usize).cloned().unwrap_or_default(),
        };
        // Names wider than their spacing are slanted, and the canvas grows below to hold them.
        let spacing = (W - R - L - 40.0) / (xs.len().max(2) - 1) as f64;
        let slant = xs.iter().map(|v| tick(*v).chars().count()).max().filter(|c| text_width(*c) > spacing);
        let height = H + slant_room(slant);
        // The canvas grows to the right to hold the longest series name in the legend.
        let longest = self.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0);
        frame(&mut o, &self.title, (W - R + 34.0 + text_width(longest)).max(W), height);
        let top = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.ci.map_or(p.y, |c| c.1.max(p.y))))
            .chain(self.ceilings.iter().map(|c| c.y))
            .fold(0f64, f64::max);
        let y = y_axis(&mut o, &self.y_label, top * 1.05, W - R);
        let scale = |v: f64| match self.x_axis {
            XAxis::Log2 => v.log2(),
            XAxis::Names(_) => v,
        };
        let (lo, hi) = (scale(xs.first().copied().unwrap_or(1.0)), scale(xs.last().copied().unwrap_or(1.0)));
        let span = if hi > lo { hi - lo } else { 1.0 };
        let x = |v: f64| L + 20.0 + (scale(v) - lo) / span * (W - R - L - 40.0);
        for v in &xs {
            let (px, ly) = (x(*v), H - B + 19.0);
            let anchor = match slant {
                Some(_) => format!("end\" transform=\"rotate(-30 {px:.1} {ly})"),
                None => "middle".into(),
            };
            let _ = write!(
                o,
                "<line x1=\"{px:.1}\" x2=\"{px:.1}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\"/><text x=\"{px:.1}\" y=\"{ly}\" text-anchor=\"{anchor}\">{}</text>",
                H - B,
                H - B + 5.0,
                escape(&tick(*v))
            );
        }
        x_axis_line(&mut o, W - R);
        let scale_note = if self.x_axis == XAxis::Log2 { " (log₂ scale)" } else { "" };
        let _ = write!(
            o,
            "<text x=\"{}\" y=\"{:.0}\" text-anchor=\"middle\">{}{scale_note}</text>",
            (L + W - R) / 2.0,
            height - 14.0,
            escape(&self.x_label)
        );
        ceiling_lines(&mut o, &self.ceilings, W - R, &y);
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
                    error_bar(&mut o, px, y(clo), y(chi), color);
                }
                let _ = write!(
                    o,
                    "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{color}\"><title>{}</title></circle>",
                    escape(&p.hover)
                );
            }
        }
        legend(&mut o, W - R, self.series.iter().zip(COLORS.iter().cycle()).map(|(s, c)| (s.name.as_str(), *c)));
        o.push_str("</svg>");
        o
    }
}

/// The series' names beside the plot (right of `right`), one colour each.
fn legend<'a>(o: &mut String, right: f64, entries: impl Iterator<Item = (&'a str, &'a str)>) {
    for (i, (name, color)) in entries.enumerate() {
        let (lx, ly) = (right + 14.0, T + 10.0 + 18.0 * i as f64);
        let _ = write!(
            o,
            "<rect x=\"{lx}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{ly:.1}\">{}</text>",
            ly - 10.0,
            color,
            lx + 16.0,
            escape(name)
        );
    }
}

/// One bar: its label (drawn under it), value, 95% interval where there is one, hover text,
/// and its own ceiling where it has one (the bandwidth probed beside that run), drawn as a
/// dashed line across its slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub ci: Option<(f64, f64)>,
    pub hover: String,
    pub limit: Option<Ceiling>,
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

/// Bars side by side with a label under each: the canvas, the y axis to `top` and the labels.
/// Labels wider than their slot (about 6.5 px a character) are slanted so that neighbours do
/// not overlap, and the canvas grows below the axis to hold them; `legend` more pixels on the
/// right hold a legend. Returns the slot width, the plot's right edge and the value→row map.
fn bar_axes<'a>(
    o: &mut String,
    title: &str,
    y_label: &str,
    labels: impl Iterator<Item = &'a str> + Clone,
    top: f64,
    legend: f64,
) -> (f64, f64, impl Fn(f64) -> f64) {
    let n = labels.clone().count().max(1) as f64;
    let right = (L + 30.0 + 90.0 * n).max(W - R + 40.0) - 20.0;
    let slot = (right - L) / n;
    let slanted = |label: &str| text_width(label.chars().count()) > slot;
    let longest = labels.clone().filter(|l| slanted(l)).map(|l| l.chars().count()).max();
    let height = H + slant_room(longest);
    frame(o, title, right + 20.0 + legend, height);
    let y = y_axis(o, y_label, top, right);
    for (i, label) in labels.enumerate() {
        let (lx, ly) = (L + slot * (i as f64 + 0.5), H - B + 16.0);
        let slant = if slanted(label) {
            format!(" text-anchor=\"end\" transform=\"rotate(-30 {lx:.1} {ly})\"")
        } else {
            " text-anchor=\"middle\"".to_string()
        };
        let _ = write!(o, "<text x=\"{lx:.1}\" y=\"{ly}\"{slant} font-size=\"11\">{}</text>", escape(label));
    }
    (slot, right, y)
}

/// Dashed lines across the plot at each ceiling, labelled at their right end.
fn ceiling_lines(o: &mut String, ceilings: &[Ceiling], right: f64, y: impl Fn(f64) -> f64) {
    for c in ceilings {
        let py = y(c.y);
        let _ = write!(
            o,
            "<line x1=\"{L}\" x2=\"{right}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#444\" stroke-dasharray=\"6 4\"><title>{}</title></line><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">{}</text>",
            escape(&c.label),
            right - 4.0,
            py - 5.0,
            escape(&c.label)
        );
    }
}

/// The x axis's line from the y axis to `right`.
fn x_axis_line(o: &mut String, right: f64) {
    let _ = write!(o, "<line x1=\"{L}\" x2=\"{right}\" y1=\"{}\" y2=\"{}\" stroke=\"#333\"/>", H - B, H - B);
}

impl BarChart {
    pub fn to_svg(&self) -> String {
        let mut o = String::new();
        let top = self
            .bars
            .iter()
            .map(|b| b.ci.map_or(b.value, |c| c.1.max(b.value)).max(b.limit.as_ref().map_or(0.0, |l| l.y)))
            .chain(self.ceilings.iter().map(|c| c.y))
            .fold(0f64, f64::max);
        let labels = self.bars.iter().map(|b| b.label.as_str());
        let (slot, right, y) = bar_axes(&mut o, &self.title, &self.y_label, labels, top * 1.1, 0.0);
        for (i, b) in self.bars.iter().enumerate() {
            let (bx, bw) = (L + slot * (i as f64 + 0.15), slot * 0.7);
            let (py, base) = (y(b.value), y(0.0));
            let _ = write!(
                o,
                "<rect x=\"{bx:.1}\" y=\"{py:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>",
                base - py,
                COLORS[0],
                escape(&b.hover)
            );
            if let Some((clo, chi)) = b.ci {
                error_bar(&mut o, bx + bw / 2.0, y(clo), y(chi), "#222");
            }
            // The value above the bar and its error bar.
            let _ = write!(
                o,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                bx + bw / 2.0,
                y(b.ci.map_or(b.value, |c| c.1.max(b.value))) - 4.0,
                significant(b.value, 3)
            );
            if let Some(l) = &b.limit {
                let ly = y(l.y);
                let _ = write!(
                    o,
                    "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"#b00\" stroke-width=\"2\" stroke-dasharray=\"4 3\"><title>{}</title></line><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#b00\" font-size=\"11\">{}</text>",
                    bx - slot * 0.1,
                    bx + bw + slot * 0.1,
                    escape(&l.label),
                    bx + bw + slot * 0.1,
                    ly - 4.0,
                    significant(l.y, 3)
                );
            }
        }
        ceiling_lines(&mut o, &self.ceilings, right, &y);
        x_axis_line(&mut o, right);
        o.push_str("</svg>");
        o
    }
}

/// One stacked bar: its label and a value per part of the chart (0 where it has none).
#[derive(Debug, Clone, PartialEq)]
pub struct Stack {
    pub label: String,
    pub values: Vec<f64>,
}

/// Bars made of parts (e.g. the stages of a decode step), each part one colour named in the
/// legend, every bar labelled; hovering a part shows its bar, name and value.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBarChart {
    pub title: String,
    /// The values' unit, also used in the hover text (`%`, `ms`).
    pub y_label: String,
    pub parts: Vec<String>,
    pub bars: Vec<Stack>,
}

impl StackedBarChart {
    pub fn to_svg(&self) -> String {
        let mut o = String::new();
        let top = self.bars.iter().map(|b| b.values.iter().sum::<f64>()).fold(0f64, f64::max);
        let longest = self.parts.iter().map(|p| p.chars().count()).max().unwrap_or(0);
        let labels = self.bars.iter().map(|b| b.label.as_str());
        let legend_width = 34.0 + text_width(longest);
        // No headroom: shares that sum to 100 get an axis that ends at 100.
        let (slot, right, y) = bar_axes(&mut o, &self.title, &self.y_label, labels, top, legend_width);
        for (i, b) in self.bars.iter().enumerate() {
            let (bx, bw) = (L + slot * (i as f64 + 0.15), slot * 0.7);
            let mut below = 0.0;
            for (j, v) in b.values.iter().enumerate().filter(|(_, v)| **v > 0.0) {
                let (y0, y1) = (y(below), y(below + v));
                let _ = write!(
                    o,
                    "<rect x=\"{bx:.1}\" y=\"{y1:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}: {} {} {}</title></rect>",
                    y0 - y1,
                    PART_COLORS[j % PART_COLORS.len()],
                    escape(&b.label),
                    escape(self.parts.get(j).map_or("", |p| p.as_str())),
                    significant(*v, 4),
                    escape(&self.y_label)
                );
                below += v;
            }
        }
        x_axis_line(&mut o, right);
        // Listed top to bottom as they stack.
        let entries: Vec<(&str, &str)> =
            self.parts.iter().zip(PART_COLORS.iter().cycle()).map(|(p, c)| (p.as_str(), *c)).collect();
        legend(&mut o, right, entries.into_iter().rev());
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
        assert_eq!(nice_ticks(100.00001), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0], "rounding error above 100");
        assert_eq!(nice_ticks(1.6).iter().map(|t| tick_text(*t)).collect::<Vec<_>>(), ["0", "0.5", "1", "1.5", "2"]);
    }

    #[test]
    fn a_log2_axis_has_a_tick_at_each_measured_value_and_nothing_between() {
        let c = LineChart {
            title: "tg vs batch".into(),
            x_label: "batch size".into(),
            y_label: "tokens/s".into(),
            x_axis: XAxis::Log2,
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
        let bars = ["f16", "int8", "int4"].map(|l| Bar {
            label: l.into(),
            value: 2.0,
            ci: None,
            hover: l.into(),
            limit: None,
        });
        let svg = BarChart { title: "t".into(), y_label: "MiB".into(), bars: bars.to_vec(), ceilings: vec![] }.to_svg();
        for l in ["f16", "int8", "int4"] {
            assert!(svg.contains(&format!("font-size=\"11\">{l}</text>")), "{l}");
        }
        // A bar's own ceiling: a line across its slot, named on hover, its value beside it;
        // the axis reaches it.
        let mut with_limit = bars.to_vec();
        with_limit[1].limit = Some(Ceiling { label: "probe after its steps 7.5".into(), y: 7.5 });
        let svg = BarChart { title: "t".into(), y_label: "GB/s".into(), bars: with_limit, ceilings: vec![] }.to_svg();
        assert_eq!(svg.matches("stroke=\"#b00\"").count(), 1);
        assert!(svg.contains("<title>probe after its steps 7.5</title>") && svg.contains(">7.50</text>"), "{svg}");
        assert!(svg.contains(">8</text>"), "the y axis reaches the limit: {svg}");
        // Twelve long labels: slanted, with the canvas grown below the axis to hold them.
        let long: Vec<Bar> = (0..12)
            .map(|i| Bar {
                label: format!("i2s B{i} c128 int8 t2"),
                value: 1.0,
                ci: None,
                hover: String::new(),
                limit: None,
            })
            .collect();
        let svg = BarChart { title: "t".into(), y_label: "GB/s".into(), bars: long, ceilings: vec![] }.to_svg();
        assert_eq!(svg.matches("rotate(-30").count(), 12);
        assert!(svg.contains(&format!("height=\"{:.0}\"", H + 6.5 * 20.0 * 0.5)), "{svg}");
    }

    #[test]
    fn every_stack_is_labelled_and_every_part_named_with_its_value() {
        let c = StackedBarChart {
            title: "stages".into(),
            y_label: "%".into(),
            parts: vec!["dot".into(), "unpack".into(), "norm".into()],
            bars: vec![
                Stack { label: "i2s B1".into(), values: vec![60.0, 30.0, 10.0] },
                Stack { label: "i2s B8".into(), values: vec![80.0, 0.0, 20.0] },
            ],
        };
        let svg = c.to_svg();
        for l in ["i2s B1", "i2s B8"] {
            assert!(svg.contains(&format!("font-size=\"11\">{l}</text>")), "bar label {l}");
        }
        for p in ["dot", "unpack", "norm"] {
            assert!(svg.contains(&format!(">{p}</text>")), "legend entry {p}");
        }
        // A zero part draws nothing; every other part is a rectangle with its exact value.
        assert_eq!(svg.matches("<rect x=").count(), 5 + 3, "five parts and three legend keys");
        assert!(
            svg.contains("<title>i2s B1: unpack 30.00 %</title>")
                && svg.contains("<title>i2s B8: norm 20.00 %</title>")
        );
        // Parts stack: B1's dot starts at the axis, its unpack right above it.
        let rect = |title: &str| -> (f64, f64) {
            let i = svg.find(&format!("<title>{title}")).unwrap();
            let r = &svg[svg[..i].rfind("<rect").unwrap()..i];
            let num = |k: &str| {
                r.split(&format!("{k}=\"")).nth(1).unwrap().split('"').next().unwrap().parse::<f64>().unwrap()
            };
            (num("y"), num("height"))
        };
        let (dot, unpack) = (rect("i2s B1: dot"), rect("i2s B1: unpack"));
        assert!((dot.0 + dot.1 - (H - B)).abs() < 0.2, "dot sits on the axis");
        assert!((unpack.0 + unpack.1 - dot.0).abs() < 0.2, "unpack sits on dot");
        assert!((dot.1 - 2.0 * unpack.1).abs() < 0.3, "heights in proportion: 60 vs 30");
    }

    #[test]
    fn a_names_axis_places_runs_evenly_with_their_names() {
        let names: Vec<String> = (0..4).map(|i| format!("#{i} abc{i}")).collect();
        let c = LineChart {
            title: "history".into(),
            x_label: "run (oldest first)".into(),
            x_axis: XAxis::Names(names.clone()),
            y_label: "tokens/s".into(),
            series: vec![Series {
                name: "B1".into(),
                points: (0..4).map(|i| point(i as f64, 10.0 + i as f64)).collect(),
            }],
            ceilings: vec![],
        };
        let svg = c.to_svg();
        let xs: Vec<f64> = names
            .iter()
            .map(|n| {
                let i = svg.find(&format!(">{n}</text>")).unwrap_or_else(|| panic!("tick {n}"));
                svg[..i].rsplit("<text x=\"").next().unwrap().split('"').next().unwrap().parse().unwrap()
            })
            .collect();
        assert!(xs.windows(3).all(|w| ((w[1] - w[0]) - (w[2] - w[1])).abs() < 0.2), "evenly spaced: {xs:?}");
        assert!(!svg.contains("log₂"), "not a log scale");
        // Forty runs with long names: slanted, the canvas taller.
        let many: Vec<String> = (0..40).map(|i| format!("#{i} 0123456789")).collect();
        let mut c2 = c.clone();
        c2.x_axis = XAxis::Names(many);
        c2.series[0].points = (0..40).map(|i| point(i as f64, 1.0)).collect();
        let svg = c2.to_svg();
        assert_eq!(svg.matches("rotate(-30").count(), 40);
        assert!(svg.contains(&format!("height=\"{:.0}\"", H + 6.5 * 14.0 * 0.5)));
    }
}
