//! The engine's span recorders, collected from a [`State`] and converted to nanoseconds.

use bitnet_engine::instrument::{clock, Event, Op, Phase, Stage};
use bitnet_engine::State;

/// Totals of one (phase, layer, operation, stage) on one thread.
#[derive(Debug, Clone, PartialEq)]
pub struct StageTotal {
    pub phase: Phase,
    pub layer: Option<usize>,
    pub op: Op,
    pub stage: Stage,
    pub thread: usize,
    pub ns: f64,
    pub calls: u64,
    pub bytes: u64,
}

impl StageTotal {
    /// The folded-stack path: `decode;layer.07;ffn.down;unpack`, `decode;layer.00;attn;attention;qk`,
    /// `prefill;output;lm_head`, `decode;sample`.
    pub fn stack(&self) -> String {
        stack(self.phase, self.layer, self.op, self.stage)
    }
}

/// See [`StageTotal::stack`].
pub fn stack(phase: Phase, layer: Option<usize>, op: Op, stage: Stage) -> String {
    let mut s = String::from(phase.name());
    if let Some(l) = layer {
        s.push_str(&format!(";layer.{l:02}"));
    }
    if let Some(f) = op.frame() {
        s.push(';');
        s.push_str(f);
    }
    if let Some(p) = stage.parent() {
        s.push(';');
        s.push_str(p);
    }
    s.push(';');
    s.push_str(stage.name());
    s
}

/// Everything the recorders of one state hold.
#[derive(Debug, Clone)]
pub struct Spans {
    pub totals: Vec<StageTotal>,
    /// (thread, event), per thread in recording order.
    pub events: Vec<(usize, Event)>,
    /// Events that did not fit, per thread.
    pub overflow: Vec<u64>,
    pub threads: usize,
    pub ticks_per_sec: f64,
    pub clock: &'static str,
}

impl Spans {
    pub fn collect(state: &State) -> Self {
        let ticks_per_sec = clock::ticks_per_second();
        let to_ns = |t: u64| t as f64 * 1e9 / ticks_per_sec;
        let mut totals = Vec::new();
        let mut events = Vec::new();
        let mut overflow = Vec::new();
        let mut threads = 0;
        for rec in state.recorders() {
            threads += 1;
            for (k, t) in rec.totals() {
                totals.push(StageTotal {
                    phase: k.phase,
                    layer: k.layer,
                    op: k.op,
                    stage: k.stage,
                    thread: rec.thread(),
                    ns: to_ns(t.ticks),
                    calls: t.calls,
                    bytes: t.bytes,
                });
            }
            events.extend(rec.events().iter().map(|e| (rec.thread(), *e)));
            overflow.push(rec.overflow());
        }
        Self { totals, events, overflow, threads, ticks_per_sec, clock: clock::source().name() }
    }

    /// Nanoseconds of `t` ticks.
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * 1e9 / self.ticks_per_sec
    }

    /// Sum of `f` over the totals that `keep` selects.
    pub fn sum(&self, keep: impl Fn(&StageTotal) -> bool, f: impl Fn(&StageTotal) -> f64) -> f64 {
        self.totals.iter().filter(|t| keep(t)).map(f).sum()
    }
}
