//! The run's summary: per-stage totals, per-thread busy time, counters, heap figures and the
//! consistency checks, as JSON (`summary.json`) and as a table for the terminal.

use std::collections::BTreeMap;
use std::fmt::Write;

use bitnet_engine::instrument::{Phase, Stage};
use serde::{Deserialize, Serialize};

use crate::counters::{CounterStatus, CounterValue};
use crate::spans::Spans;

/// Stage times on the caller thread must sum to within this fraction of the wall time.
pub const WALL_TOLERANCE: f64 = 0.05;
/// ... or within this many milliseconds: a run of well under a millisecond (the `tiny` preset)
/// has a few microseconds of untimed code between its engine calls, more than 5% of it, and
/// that is no evidence of missed or double-counted spans.
pub const WALL_SLACK_MS: f64 = 0.05;
/// Span and sampled shares of a stage may differ by this many percentage points for reasons
/// other than chance, on top of the sampling error (`pprof_limit_pp`): spans are wall time, so
/// a thread preempted inside a stage adds to its span but takes no samples, and the kernel's
/// loop around `unpack_stage` / `dot_stage` is inside the spans but not those functions. The
/// value comes from CI's trace smoke runs on Zen 4, where a flat 5-point limit failed about one
/// run in 20 (the runs' figures: docs/perf-notes.md).
pub const PPROF_SYSTEMATIC_PP: f64 = 4.0;
/// Extra points a single stage of the split form (`unpack`, `dot`) may differ by: the spans and
/// the samples place the boundary between the two differently on some CPUs, while agreeing on
/// their sum, which is checked with the plain limit (`unpack+dot`). The value covers what an
/// Intel Xeon (family 6 model 207) measured per stage (docs/perf-notes.md).
pub const PPROF_BOUNDARY_PP: f64 = 8.0;
/// How many binomial standard errors of the sampled share the check allows (at 3, chance alone
/// fails a correct stage about once in 370).
pub const PPROF_SIGMAS: f64 = 3.0;
/// Fewer samples than this give a limit wider than about 11.5 points (binomial standard error
/// at 400 samples is at most 2.5 points); the check then says it could not run.
pub const PPROF_MIN_SAMPLES: u64 = 400;

/// The largest difference, in percentage points, allowed between a stage's span share
/// (`span_pct`, the expected share if the spans are right) and its share of `samples` samples:
/// `PPROF_SYSTEMATIC_PP` plus `PPROF_SIGMAS` binomial standard errors.
pub fn pprof_limit_pp(span_pct: f64, samples: u64) -> f64 {
    let p = (span_pct / 100.0).clamp(0.0, 1.0);
    let standard_error_pp = 100.0 * (p * (1.0 - p) / samples.max(1) as f64).sqrt();
    PPROF_SYSTEMATIC_PP + PPROF_SIGMAS * standard_error_pp
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub tool: String,
    pub run: RunInfo,
    pub wall: Wall,
    /// Per stage, for each phase (`prefill`, `decode`).
    pub stages: BTreeMap<String, Vec<StageRow>>,
    pub threads: Vec<ThreadRow>,
    pub consistency: Consistency,
    pub counters: Option<CounterReport>,
    pub timeline: Option<TimelineInfo>,
    pub heap: Option<HeapInfo>,
    /// The matmuls' multiply-adds per second against the int8 peak; absent where the kernel's
    /// ISA has none (scalar) and in summaries written before it existed.
    #[serde(default)]
    pub compute: Option<ComputeReport>,
}

/// How close the matmuls came to the core's int8 arithmetic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeReport {
    /// The ISA level whose peak was probed (the kernel's).
    pub isa: String,
    /// The instructions the probe ran (`bitnet_engine::probes::compute_peak`).
    pub instruction: String,
    /// G multiply-adds per second of one thread while all the run's threads ran the probe
    /// (best pass ÷ threads).
    pub peak_gmacs_per_thread: f64,
    /// Whether a part that multiplies (not a lookup or popcount form) ran faster than the
    /// probe, even after probing again: the probe was disturbed (another tenant, throttling), so
    /// the percentages are not of the hardware's peak.
    #[serde(default)]
    pub peak_below_stages: bool,
    pub rows: Vec<ComputeRow>,
}

/// One phase's linear layers or LM head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeRow {
    pub phase: String,
    /// `linear` (the kernel stages of the seven projections) or `lm_head`.
    pub part: String,
    /// Multiply-adds of the phase (weights × tokens).
    pub macs: u64,
    /// Thread-time in those stages, summed over threads.
    pub thread_ms: f64,
    /// macs ÷ thread_ms: the rate of a thread while it ran them.
    pub gmacs_per_thread: f64,
    /// Of `peak_gmacs_per_thread`, in %.
    pub pct_of_peak: f64,
}

/// The stages of a linear layer's kernel (not the quantize or transpose around it).
const KERNEL_STAGES: [Stage; 8] = [
    Stage::Unpack,
    Stage::Dot,
    Stage::UnpackDot,
    Stage::Xnor,
    Stage::Popcount,
    Stage::XnorPopcount,
    Stage::Lookup,
    Stage::Tables,
];

/// The linear layers' and the LM head's rows of one phase, given their multiply-adds; a part
/// without spans (or without work) is left out.
pub fn compute_rows(
    spans: &Spans,
    phase: Phase,
    linear_macs: u64,
    head_macs: u64,
    peak_per_thread: f64,
) -> Vec<ComputeRow> {
    use bitnet_engine::instrument::Op;
    let linear_op = |op: Op| matches!(op, Op::Q | Op::K | Op::V | Op::O | Op::Gate | Op::Up | Op::Down);
    let parts = [
        (
            "linear",
            linear_macs,
            spans.sum(|t| t.phase == phase && linear_op(t.op) && KERNEL_STAGES.contains(&t.stage), |t| t.ns),
        ),
        ("lm_head", head_macs, spans.sum(|t| t.phase == phase && t.stage == Stage::LmHead, |t| t.ns)),
    ];
    parts
        .into_iter()
        .filter(|(_, macs, ns)| *macs > 0 && *ns > 0.0)
        .map(|(part, macs, ns)| {
            let gmacs = macs as f64 / ns;
            ComputeRow {
                phase: phase.name().into(),
                part: part.into(),
                macs,
                thread_ms: ns / 1e6,
                gmacs_per_thread: gmacs,
                pct_of_peak: if peak_per_thread > 0.0 { gmacs / peak_per_thread * 100.0 } else { 0.0 },
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub model: String,
    pub source: String,
    pub weight_format: String,
    /// The FFN gating that ran (`silu`, `relu2`) and which rule chose it.
    #[serde(default)]
    pub ffn_activation: String,
    #[serde(default)]
    pub ffn_activation_source: String,
    pub kernel: String,
    pub isa: String,
    pub form: String,
    pub threads: usize,
    pub batch: usize,
    pub context_length: usize,
    pub decode_steps: usize,
    pub kv_precision: String,
    pub level: String,
    pub clock: String,
    pub clock_ghz: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wall {
    /// Wall time of the engine calls of each phase (counter reads between calls excluded).
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub prefill_tokens_per_sec: f64,
    pub decode_tokens_per_sec: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageRow {
    pub stage: String,
    /// `attention` for qk, softmax and av.
    pub parent: Option<String>,
    /// Summed over threads.
    pub total_ms: f64,
    /// Of the phase's thread-time (threads × wall).
    pub share_pct: f64,
    pub calls: u64,
    pub ns_per_call: f64,
    pub bytes: u64,
    /// bytes / the stage's time on its busiest thread: the rate the stage moved data at while
    /// it ran, over all the threads that ran it.
    pub gbps: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRow {
    pub thread: usize,
    /// Time in spans other than `wait`.
    pub busy_ms: f64,
    pub busy_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Consistency {
    /// Span time on the calling thread (which also records its waits at every barrier).
    pub caller_span_ms: f64,
    pub wall_ms: f64,
    pub difference_pct: f64,
    pub wall_ok: bool,
    pub pprof: Option<PprofCheck>,
    /// Plain statements of every failed check (with `--strict-checks` the run then exits 1).
    pub failures: Vec<String>,
    /// Checks that could not run and why (too few pprof samples); not failures.
    #[serde(default)]
    pub not_run: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PprofCheck {
    pub samples: u64,
    pub rows: Vec<PprofRow>,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PprofRow {
    pub stage: String,
    pub function: String,
    /// Stage time / the process's CPU time while sampled (threads × wall where that is not
    /// readable), in %.
    pub span_pct: f64,
    /// Samples with the function on the stack / all samples, in %.
    pub sampled_pct: f64,
    /// The allowed difference (`pprof_limit_pp`), in percentage points.
    #[serde(default)]
    pub limit_pp: f64,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterReport {
    pub counters: Vec<CounterStatus>,
    /// The fallback line, when hardware counters are missing.
    pub note: Option<String>,
    /// Totals per phase, summed over threads.
    pub prefill: BTreeMap<String, CounterValue>,
    pub decode: BTreeMap<String, CounterValue>,
    /// IPC, miss rates ... of the decode phase, where both inputs count.
    pub decode_derived: BTreeMap<String, f64>,
    pub per_decode_step: Vec<BTreeMap<String, CounterValue>>,
    /// Each kernel stage run alone on layer 0's linear layers, on one thread, with counters
    /// on that thread only: the per-stage counters (see `counters`).
    pub isolated_stages: Vec<crate::counters::IsolatedStage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineInfo {
    pub events: usize,
    pub overflow: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeapInfo {
    pub allocations_per_decode_step: f64,
    pub bytes_per_decode_step: f64,
    pub max_bytes: u64,
}

/// Per-stage rows of one phase, in pipeline order.
pub fn stage_rows(spans: &Spans, phase: Phase, wall_ms: f64) -> Vec<StageRow> {
    let thread_ms = wall_ms * spans.threads as f64;
    let mut rows = Vec::new();
    for &stage in Stage::ALL {
        let sel: Vec<_> = spans.totals.iter().filter(|t| t.phase == phase && t.stage == stage).collect();
        if sel.is_empty() {
            continue;
        }
        let ns: f64 = sel.iter().map(|t| t.ns).sum();
        let calls: u64 = sel.iter().map(|t| t.calls).sum();
        let bytes: u64 = sel.iter().map(|t| t.bytes).sum();
        // The stage's wall time is its busiest thread's: the whole of it for a stage only the
        // caller runs (embed, kv_write), about ns / threads for one split across all threads.
        // Dividing every stage by the thread count had doubled the serial stages' GB/s. Where
        // the slowest thread changes from call to call, the sum of the calls' slowest times is
        // a little more than this, so the figure is a slight overestimate.
        let mut per_thread = BTreeMap::new();
        for t in &sel {
            *per_thread.entry(t.thread).or_insert(0.0) += t.ns;
        }
        let wall_ns = per_thread.values().copied().fold(0.0, f64::max);
        rows.push(StageRow {
            stage: stage.name().into(),
            parent: stage.parent().map(Into::into),
            total_ms: ns / 1e6,
            share_pct: if thread_ms > 0.0 { ns / 1e6 / thread_ms * 100.0 } else { 0.0 },
            calls,
            ns_per_call: if calls > 0 { ns / calls as f64 } else { 0.0 },
            bytes,
            gbps: (bytes > 0 && wall_ns > 0.0).then(|| bytes as f64 / wall_ns),
        });
    }
    rows
}

/// Busy time of each thread over the traced region.
pub fn thread_rows(spans: &Spans, wall_ms: f64) -> Vec<ThreadRow> {
    (0..spans.threads)
        .map(|t| {
            let ms = spans.sum(|s| s.thread == t && s.stage != Stage::Wait, |s| s.ns) / 1e6;
            ThreadRow { thread: t, busy_ms: ms, busy_pct: if wall_ms > 0.0 { ms / wall_ms * 100.0 } else { 0.0 } }
        })
        .collect()
}

/// The wall-time check: every span of the caller thread, including its waits, against the
/// wall time of the engine calls.
pub fn wall_check(spans: &Spans, wall_ms: f64) -> (f64, f64, bool) {
    let caller_ms = spans.sum(|s| s.thread == 0, |s| s.ns) / 1e6;
    let diff = if wall_ms > 0.0 { (caller_ms - wall_ms) / wall_ms } else { f64::INFINITY };
    (caller_ms, diff * 100.0, diff.abs() <= WALL_TOLERANCE || (caller_ms - wall_ms).abs() <= WALL_SLACK_MS)
}

fn fmt_bytes(b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.1}", b as f64 / 1048576.0)
    }
}

/// The summary as a table for the terminal.
pub fn table(s: &Summary) -> String {
    let mut o = String::new();
    let r = &s.run;
    let _ = writeln!(
        o,
        "bitnet-trace: {} ({}, {} FFN from {}), kernel {}/{}/{}, {} threads, batch {}, context {}, {} decode steps, KV {}, spans {}",
        r.model,
        r.weight_format,
        r.ffn_activation,
        r.ffn_activation_source,
        r.kernel,
        r.isa,
        r.form,
        r.threads,
        r.batch,
        r.context_length,
        r.decode_steps,
        r.kv_precision,
        r.level
    );
    let w = &s.wall;
    let _ = writeln!(
        o,
        "prefill {:.1} ms ({:.1} tok/s), decode {:.1} ms ({:.2} tok/s); clock {} at {:.3} GHz",
        w.prefill_ms, w.prefill_tokens_per_sec, w.decode_ms, w.decode_tokens_per_sec, r.clock, r.clock_ghz
    );
    for (phase, rows) in s.stages.iter().rev() {
        let _ = writeln!(
            o,
            "\n| {:<18} | {:>10} | {:>7} | {:>9} | {:>10} | {:>9} | {:>7} |",
            format!("{phase} stage"),
            "total ms",
            "% time",
            "calls",
            "ns/call",
            "MiB",
            "GB/s"
        );
        let _ = writeln!(o, "|{:-<20}|{:->12}|{:->9}|{:->11}|{:->12}|{:->11}|{:->9}|", "", "", "", "", "", "", "");
        for row in rows {
            let name = match &row.parent {
                Some(p) => format!("{p}.{}", row.stage),
                None => row.stage.clone(),
            };
            let _ = writeln!(
                o,
                "| {:<18} | {:>10.2} | {:>6.1}% | {:>9} | {:>10.0} | {:>9} | {:>7} |",
                name,
                row.total_ms,
                row.share_pct,
                row.calls,
                row.ns_per_call,
                fmt_bytes(row.bytes),
                row.gbps.map(|g| format!("{g:.1}")).unwrap_or_else(|| "-".into())
            );
        }
    }
    if let Some(c) = &s.compute {
        let parts: Vec<String> = c
            .rows
            .iter()
            .map(|r| format!("{} {} {:.1} ({:.0}%)", r.phase, r.part, r.gmacs_per_thread, r.pct_of_peak))
            .collect();
        let _ = writeln!(
            o,
            "\ncompute (G multiply-adds/s of a thread in the stages; int8 peak {:.1} a thread at {}, {}): {}",
            c.peak_gmacs_per_thread,
            c.isa,
            c.instruction,
            parts.join(", ")
        );
        if c.peak_below_stages {
            let _ = writeln!(
                o,
                "note: stages that multiply ran faster than every int8 peak probe: the probes were disturbed \
                 (another tenant on the core, or throttling), so the percentages above are not of this CPU's \
                 peak; rerun on a quiet machine"
            );
        }
    }
    let busy: Vec<String> = s.threads.iter().map(|t| format!("thread {} {:.0}%", t.thread, t.busy_pct)).collect();
    let _ = writeln!(o, "\nbusy (spans other than wait, of wall): {}", busy.join(", "));
    let c = &s.consistency;
    let _ = writeln!(
        o,
        "consistency: caller-thread spans {:.2} ms vs wall {:.2} ms ({:+.2}%, limit ±{:.0}% or ±{} ms): {}",
        c.caller_span_ms,
        c.wall_ms,
        c.difference_pct,
        WALL_TOLERANCE * 100.0,
        WALL_SLACK_MS,
        if c.wall_ok { "ok" } else { "FAILED" }
    );
    if let Some(p) = &c.pprof {
        for row in &p.rows {
            let _ = writeln!(
                o,
                "consistency: {} spans {:.1}% vs pprof {:.1}% of {} samples in {} (limit ±{:.1} pp): {}",
                row.stage,
                row.span_pct,
                row.sampled_pct,
                p.samples,
                row.function,
                row.limit_pp,
                if row.ok { "ok" } else { "FAILED" }
            );
        }
    }
    for f in &c.failures {
        let _ = writeln!(o, "CHECK FAILED: {f}");
    }
    for f in &c.not_run {
        let _ = writeln!(o, "check not run: {f}");
    }
    if let Some(cr) = &s.counters {
        if let Some(n) = &cr.note {
            let _ = writeln!(o, "counters: {n}");
        }
        let steps = s.run.decode_steps.max(1) as f64;
        let vals: Vec<String> = cr
            .decode
            .iter()
            .map(|(k, v)| format!("{k} {:.0}/step{}", v.value / steps, if v.scaled { " (scaled)" } else { "" }))
            .collect();
        let _ = writeln!(o, "counters (decode, all threads): {}", vals.join(", "));
        if !cr.isolated_stages.is_empty() {
            let mut by_stage: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
            for r in &cr.isolated_stages {
                let e = by_stage.entry(&r.stage).or_default();
                e.0 += r.ns_per_call;
                e.1 += r.per_call.get("instructions").map_or(0.0, |v| v.value);
            }
            let parts: Vec<String> = by_stage
                .iter()
                .map(|(k, (ns, ins))| {
                    if *ins > 0.0 {
                        format!("{k} {:.0} µs, {:.2e} instructions", ns / 1e3, ins)
                    } else {
                        format!("{k} {:.0} µs", ns / 1e3)
                    }
                })
                .collect();
            let _ = writeln!(o, "stages alone (layer 0's seven matmuls, one thread): {}", parts.join("; "));
        }
        if !cr.decode_derived.is_empty() {
            let d: Vec<String> = cr.decode_derived.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
            let _ = writeln!(o, "derived (decode): {}", d.join(", "));
        }
    }
    if let Some(t) = &s.timeline {
        let _ = writeln!(o, "timeline: {} events kept, {} dropped (buffer full)", t.events, t.overflow);
    }
    if let Some(h) = &s.heap {
        let _ = writeln!(
            o,
            "heap: {:.1} allocations and {:.0} bytes per decode step; peak {} bytes allocated during the traced run",
            h.allocations_per_decode_step, h.bytes_per_decode_step, h.max_bytes
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use bitnet_engine::instrument::Op;

    use super::*;
    use crate::spans::StageTotal;

    fn total(stage: Stage, thread: usize, ns: f64, bytes: u64) -> StageTotal {
        StageTotal { phase: Phase::Decode, layer: None, op: Op::None, stage, thread, ns, calls: 1, bytes }
    }

    #[test]
    fn pprof_limit_is_the_systematic_allowance_plus_three_binomial_errors() {
        // 30% of 500 samples: one standard error is sqrt(0.3 * 0.7 / 500) = 2.05 points.
        let se = 100.0 * (0.3f64 * 0.7 / 500.0).sqrt();
        assert!((pprof_limit_pp(30.0, 500) - (PPROF_SYSTEMATIC_PP + 3.0 * se)).abs() < 1e-12);
        // The error shrinks with more samples and is largest at a half share.
        assert!(pprof_limit_pp(30.0, 5000) < pprof_limit_pp(30.0, 500));
        assert!(pprof_limit_pp(50.0, 500) > pprof_limit_pp(30.0, 500));
        // A share of 0 or 100% has no sampling error; out-of-range shares do not make NaN.
        assert_eq!(pprof_limit_pp(0.0, 500), PPROF_SYSTEMATIC_PP);
        assert_eq!(pprof_limit_pp(104.0, 500), PPROF_SYSTEMATIC_PP);
        assert!(pprof_limit_pp(30.0, 0).is_finite());
        // At the minimum sample count no share is allowed more than 11.5 points.
        assert!(pprof_limit_pp(50.0, PPROF_MIN_SAMPLES) <= 11.5 + 1e-12);
    }

    #[test]
    fn gbps_divides_by_the_busiest_thread_so_serial_stages_are_not_doubled() {
        let spans = Spans {
            totals: vec![
                // Only the caller embeds: 1 GB in 1 s is 1 GB/s, not 2.
                total(Stage::Embed, 0, 1e9, 1_000_000_000),
                // Both threads stream 1 GB each, one in 1 s and one in 0.8 s: 2 GB by the time
                // the slower is done, 2 GB/s.
                total(Stage::UnpackDot, 0, 1e9, 1_000_000_000),
                total(Stage::UnpackDot, 1, 0.8e9, 1_000_000_000),
            ],
            events: Vec::new(),
            overflow: vec![0, 0],
            threads: 2,
            ticks_per_sec: 1e9,
            clock: "test",
        };
        let rows = stage_rows(&spans, Phase::Decode, 2000.0);
        let gbps = |name: &str| rows.iter().find(|r| r.stage == name).and_then(|r| r.gbps).unwrap();
        assert!((gbps("embed") - 1.0).abs() < 1e-12, "{rows:?}");
        assert!((gbps("unpack_dot") - 2.0).abs() < 1e-12, "{rows:?}");
    }

    #[test]
    fn compute_rows_divide_each_parts_work_by_its_kernel_thread_time() {
        let at = |op: Op, stage: Stage, thread: usize, ns: f64| StageTotal {
            phase: Phase::Decode,
            layer: Some(0),
            op,
            stage,
            thread,
            ns,
            calls: 1,
            bytes: 0,
        };
        let spans = Spans {
            totals: vec![
                // Kernel stages of the projections count, on every thread: 3 s in all.
                at(Op::Q, Stage::Unpack, 0, 0.5e9),
                at(Op::Q, Stage::Dot, 0, 0.5e9),
                at(Op::Down, Stage::Lookup, 1, 1.5e9),
                at(Op::Down, Stage::Tables, 1, 0.5e9),
                // Quantizing, transposing and the attention block's own stages do not.
                at(Op::Q, Stage::Quantize, 0, 7e9),
                at(Op::Q, Stage::Transpose, 1, 7e9),
                at(Op::Attn, Stage::Qk, 0, 7e9),
                // The head: 2 s.
                at(Op::Output, Stage::LmHead, 0, 1e9),
                at(Op::Output, Stage::LmHead, 1, 1e9),
                // Another phase's kernels are that phase's.
                StageTotal { phase: Phase::Prefill, ..at(Op::Q, Stage::UnpackDot, 0, 9e9) },
            ],
            events: Vec::new(),
            overflow: vec![0, 0],
            threads: 2,
            ticks_per_sec: 1e9,
            clock: "test",
        };
        let rows = compute_rows(&spans, Phase::Decode, 600_000_000_000, 100_000_000_000, 250.0);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((rows[0].part.as_str(), rows[0].thread_ms), ("linear", 3000.0));
        assert!((rows[0].gmacs_per_thread - 200.0).abs() < 1e-9 && (rows[0].pct_of_peak - 80.0).abs() < 1e-9);
        assert_eq!((rows[1].part.as_str(), rows[1].thread_ms), ("lm_head", 2000.0));
        assert!((rows[1].gmacs_per_thread - 50.0).abs() < 1e-9 && (rows[1].pct_of_peak - 20.0).abs() < 1e-9);
        // No work or no spans: no row.
        assert_eq!(compute_rows(&spans, Phase::Decode, 0, 0, 250.0), vec![]);
        let prefill = compute_rows(&spans, Phase::Prefill, 900_000_000_000, 5, 250.0);
        assert_eq!(prefill.len(), 1);
        assert!((prefill[0].gmacs_per_thread - 100.0).abs() < 1e-9);
    }
}
