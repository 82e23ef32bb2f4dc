//! Folded stacks (Brendan Gregg's format, weighted in nanoseconds) and flamegraphs drawn by
//! `inferno`, with one fixed colour per stage in every graph.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use bitnet_engine::instrument::Stage;
use inferno::flamegraph::color::{BasicPalette, Color, Palette, PaletteMap};
use inferno::flamegraph::{self, Options};

use crate::spans::Spans;

/// What the weight of a folded line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// Nanoseconds summed over threads.
    Nanos,
    /// Spans recorded (for structure tests: independent of timing).
    Calls,
}

/// Folded lines `stack weight`, sorted by stack, summed over threads; zero weights dropped.
pub fn folded(spans: &Spans, weight: Weight) -> String {
    let mut by_stack: BTreeMap<String, f64> = BTreeMap::new();
    for t in &spans.totals {
        let w = match weight {
            Weight::Nanos => t.ns,
            Weight::Calls => t.calls as f64,
        };
        *by_stack.entry(t.stack()).or_insert(0.0) += w;
    }
    let mut out = String::new();
    for (stack, w) in by_stack {
        let w = w.round() as u64;
        if w > 0 {
            out.push_str(&format!("{stack} {w}\n"));
        }
    }
    out
}

/// The colour of a stage, the same in every graph: unpack-like stages warm, multiply-like
/// stages blue, attention yellow-green, the rest greys and pastels.
pub fn stage_color(stage: Stage) -> Color {
    let (r, g, b) = match stage {
        Stage::Unpack => (230, 85, 40),
        Stage::Dot => (50, 110, 220),
        Stage::UnpackDot => (150, 80, 200),
        Stage::Xnor => (235, 150, 40),
        Stage::Popcount => (40, 170, 170),
        Stage::XnorPopcount => (200, 120, 160),
        Stage::Lookup => (120, 60, 170),
        Stage::Tables => (175, 130, 215),
        Stage::Qk => (220, 200, 50),
        Stage::Softmax => (190, 210, 90),
        Stage::Av => (150, 200, 60),
        Stage::LmHead => (90, 70, 180),
        Stage::Quantize => (240, 170, 170),
        Stage::Norm => (170, 170, 170),
        Stage::Rope => (160, 190, 220),
        Stage::KvWrite => (120, 180, 120),
        Stage::FfnAct => (200, 170, 120),
        Stage::Residual => (200, 200, 200),
        Stage::Transpose => (150, 150, 120),
        Stage::Wait => (235, 235, 235),
        Stage::Embed => (140, 160, 140),
        Stage::Sample => (120, 120, 200),
    };
    Color { r, g, b }
}

fn palette() -> PaletteMap {
    let mut map = PaletteMap::default();
    for &s in Stage::ALL {
        map.insert(s.name(), stage_color(s));
    }
    map.insert("attention", Color { r: 240, g: 225, b: 120 });
    map
}

/// Renders folded lines as an SVG flamegraph.
pub fn flamegraph(folded: &str, title: &str, subtitle: &str, out: impl Write) -> Result<()> {
    let mut map = palette();
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(subtitle.to_string());
    opts.count_name = "ns".into();
    opts.colors = Palette::Basic(BasicPalette::Aqua);
    opts.hash = true;
    opts.deterministic = true;
    opts.palette_map = Some(&mut map);
    let lines: Vec<&str> = folded.lines().collect();
    if lines.is_empty() {
        anyhow::bail!("no spans were recorded, so there is nothing to draw");
    }
    flamegraph::from_lines(&mut opts, lines.iter().copied(), out).context("rendering the flamegraph")
}

/// A differential flamegraph of two folded files: the AFTER graph, frames coloured by how
/// much they grew (red) or shrank (blue) since BEFORE.
pub fn differential(before: &str, after: &str, title: &str, out: impl Write) -> Result<()> {
    let read = |p: &str| -> Result<Vec<u8>> {
        let bytes = std::fs::read(p).with_context(|| format!("{p}: cannot read"))?;
        validate_folded(&bytes).with_context(|| format!("{p}: not a folded-stack file"))?;
        Ok(bytes)
    };
    let (b, a) = (read(before)?, read(after)?);
    let mut diff = Vec::new();
    inferno::differential::from_readers(Default::default(), &b[..], &a[..], &mut diff)
        .context("comparing the folded files")?;
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(format!("{before} → {after}: red grew, blue shrank (widths: after)"));
    opts.count_name = "ns".into();
    opts.deterministic = true;
    let lines: Vec<&str> = std::str::from_utf8(&diff)?.lines().collect();
    flamegraph::from_lines(&mut opts, lines.iter().copied(), out).context("rendering the differential flamegraph")
}

/// Every non-empty line is `stack weight` with an integer weight.
fn validate_folded(bytes: &[u8]) -> Result<()> {
    let mut n = 0;
    for (i, line) in bytes.lines().enumerate() {
        let line = line.context("not UTF-8")?;
        if line.trim().is_empty() {
            continue;
        }
        let (stack, w) = line.rsplit_once(' ').with_context(|| format!("line {}: no weight", i + 1))?;
        if stack.is_empty() || w.parse::<u64>().is_err() {
            anyhow::bail!("line {}: expected `frame;frame;... count`, got {line:?}", i + 1);
        }
        n += 1;
    }
    if n == 0 {
        anyhow::bail!("no stacks in the file");
    }
    Ok(())
}
