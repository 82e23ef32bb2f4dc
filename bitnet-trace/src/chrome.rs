//! The timeline in Chrome's trace-event format (opens in Perfetto and chrome://tracing): one
//! complete (`"ph": "X"`) event per span, one track per worker thread.

use serde_json::{json, Value};

use crate::spans::Spans;

/// The trace document. Timestamps are microseconds from the first recorded span. A split
/// kernel's `unpack` and `dot` events of one run share that run's time in the measured ratio
/// (see `bitnet_engine::instrument`); `args.split_estimate` marks them.
pub fn trace_json(spans: &Spans, title: &str) -> Value {
    let t0 = spans.events.iter().map(|(_, e)| e.start).min().unwrap_or(0);
    let us = |t: u64| spans.ns(t.saturating_sub(t0)) / 1e3;
    let mut events: Vec<Value> = Vec::with_capacity(spans.events.len() + spans.threads + 1);
    events.push(json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": title}}));
    for t in 0..spans.threads {
        let name = if t == 0 { "thread 0 (caller)".to_string() } else { format!("worker {t}") };
        events.push(json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": name}}));
    }
    for (thread, e) in &spans.events {
        let mut args = json!({
            "phase": e.ctx.phase.name(),
            "step": e.ctx.step,
            "op": e.ctx.op.name(),
        });
        if let Some(l) = e.ctx.layer() {
            args["layer"] = json!(l);
        }
        if e.bytes > 0 {
            args["bytes"] = json!(e.bytes);
        }
        if matches!(e.stage.name(), "unpack" | "dot" | "xnor" | "popcount") {
            args["split_estimate"] = json!(true);
        }
        let name = match e.ctx.op.frame() {
            Some(f) => format!("{} {}", f, e.stage.name()),
            None => e.stage.name().to_string(),
        };
        events.push(json!({
            "name": name,
            "cat": e.stage.name(),
            "ph": "X",
            "ts": us(e.start),
            "dur": spans.ns(e.end.saturating_sub(e.start)) / 1e3,
            "pid": 1,
            "tid": thread,
            "args": args,
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "clock": spans.clock,
            "ticks_per_second": spans.ticks_per_sec,
            "overflow_events": spans.overflow.iter().sum::<u64>(),
        },
    })
}
