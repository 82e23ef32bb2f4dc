//! Per-stage spans: where the time of a token goes.
//!
//! The engine only emits. Every thread of a [`State`](crate::State) owns a [`ThreadRecorder`]
//! (preallocated when instrumentation is switched on, so recording never allocates, locks or
//! prints); tools read the recorders after the run.
//!
//! - Levels: [`Level::Aggregate`] keeps per (phase, layer, operation, stage) totals of ticks,
//!   calls and bytes; [`Level::Timeline`] also keeps individual events in a bounded buffer and
//!   counts what did not fit ([`ThreadRecorder::overflow`]).
//! - Switched off at run time a span costs one predictable branch; without the `instrument`
//!   cargo feature it compiles to nothing ([`ENABLED`] is `false`).
//! - Time is read with [`clock::now`] (the TSC on x86-64) and converted with a frequency
//!   calibrated once.
//!
//! Granularity: a span covers a whole stage run on one thread (one thread's rows of one
//! matmul, one attention item, one norm over all rows). The split kernel forms separate
//! `unpack` from `dot` (and `xnor` from `popcount`) per L1 tile; a tile takes a few hundred
//! nanoseconds, so timing every tile would cost several percent. Instead every
//! [`TIMED_TILE_EVERY`]-th tile (identical work; at least one per run, at a position that
//! rotates from run to run so the cold first tile is not favoured) is timed and the whole
//! run's time, measured exactly, is divided in the sampled ratio. Fused kernels interleave unpack and multiply in
//! registers; no timer can tell them apart, and they are reported as one stage,
//! `unpack_dot` (`xnor_popcount` for the fused xnor kernel).

pub mod clock;

use std::fmt;

/// Whether instrumentation is compiled in (the `instrument` cargo feature).
pub const ENABLED: bool = cfg!(feature = "instrument");

/// One of every this many tiles of a split kernel is timed stage by stage (see module docs).
pub const TIMED_TILE_EVERY: usize = 16;

/// What a recorder keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Off,
    /// Totals per (phase, layer, operation, stage): fixed-size, always cheap.
    Aggregate,
    /// Totals and individual events (bounded buffer).
    Timeline,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Aggregate => "aggregate",
            Level::Timeline => "timeline",
        }
    }
}

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name { $($(#[$vm])* $v),* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            pub const COUNT: usize = Self::ALL.len();
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s),* }
            }
            pub fn from_name(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.name() == s)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
    };
}

named_enum!(
    /// A stage of the forward pass.
    Stage {
        /// Token embedding rows → f32.
        Embed => "embed",
        /// RMSNorm (input, sub- and final norms).
        Norm => "norm",
        /// BitLinear's per-token absmax int8 activation quantization (and bit-planes).
        Quantize => "quantize",
        /// Split kernels: packed weights → int8 code tile.
        Unpack => "unpack",
        /// Split kernels: int8 multiply-accumulate of a code tile.
        Dot => "dot",
        /// Fused kernels: unpack and multiply interleaved in registers.
        UnpackDot => "unpack_dot",
        /// Split xnor kernel: AND of weight and activation bit-planes.
        Xnor => "xnor",
        /// Split xnor kernel: population counts.
        Popcount => "popcount",
        /// Fused xnor kernel.
        XnorPopcount => "xnor_popcount",
        /// Table-lookup kernels (`tq1 … lut`): each group of three weights' sum looked up in
        /// the token's tables; nothing is unpacked.
        Lookup => "lookup",
        /// Table-lookup kernels: a thread building its own tables of the tokens (per group
        /// of three columns, the sums of the ternary patterns), once per quantized activation.
        Tables => "tables",
        /// Rotary position embedding of queries and keys.
        Rope => "rope",
        /// Quantize and store keys and values in the KV cache.
        KvWrite => "kv_write",
        /// Attention scores q·k (inside `attention`).
        Qk => "qk",
        /// Softmax of the scores (inside `attention`).
        Softmax => "softmax",
        /// Weighted sum of values (inside `attention`).
        Av => "av",
        /// Gated FFN activation (ReLU² or SiLU times up).
        FfnAct => "ffn_act",
        /// Residual additions.
        Residual => "residual",
        /// Reordering a kernel's [N, rows] output to [rows, N].
        Transpose => "transpose",
        /// The int8 LM head matmul.
        LmHead => "lm_head",
        /// Choosing the next token from the logits.
        Sample => "sample",
        /// The calling thread waiting for the other workers at the end of a parallel stage.
        Wait => "wait",
    }
);

impl Stage {
    /// The frame this stage sits under in a stack (`attention` for qk, softmax and av).
    pub fn parent(self) -> Option<&'static str> {
        match self {
            Stage::Qk | Stage::Softmax | Stage::Av => Some("attention"),
            _ => None,
        }
    }
}

named_enum!(
    /// What a span works for: a linear layer, or the block it belongs to.
    Op {
        /// Outside any layer operation (embedding, sampling).
        None => "-",
        /// The attention block's own stages (norm, rope, kv_write, attention).
        Attn => "attn",
        Q => "q",
        K => "k",
        V => "v",
        O => "o",
        /// The feed-forward block's own stages (norm, activation).
        Ffn => "ffn",
        Gate => "gate",
        Up => "up",
        Down => "down",
        /// Final norm and LM head.
        Output => "output",
    }
);

impl Op {
    /// The frame name in a stack: `attn.q`, `ffn.down`, `attn`, `output`, or `None`.
    pub fn frame(self) -> Option<&'static str> {
        Some(match self {
            Op::None => return None,
            Op::Attn => "attn",
            Op::Q => "attn.q",
            Op::K => "attn.k",
            Op::V => "attn.v",
            Op::O => "attn.o",
            Op::Ffn => "ffn",
            Op::Gate => "ffn.gate",
            Op::Up => "ffn.up",
            Op::Down => "ffn.down",
            Op::Output => "output",
        })
    }
}

named_enum!(
    /// Which kind of forward call a span belongs to.
    Phase {
        /// Rows that share a sequence or start one (a prompt).
        Prefill => "prefill",
        /// One new token of each of B sequences.
        Decode => "decode",
    }
);

/// Layer value of spans outside the layers.
pub const NO_LAYER: u16 = u16::MAX;

/// The context of a span: which forward call, layer and operation it works for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanCtx {
    pub phase: Phase,
    /// Forward calls since the recorders were reset, counting from 0.
    pub step: u32,
    /// Layer index, or [`NO_LAYER`].
    pub layer: u16,
    pub op: Op,
}

impl SpanCtx {
    pub fn new(phase: Phase, step: u32) -> Self {
        Self { phase, step, layer: NO_LAYER, op: Op::None }
    }
    pub fn at(self, layer: usize, op: Op) -> Self {
        Self { layer: layer as u16, op, ..self }
    }
    pub fn with_op(self, op: Op) -> Self {
        Self { op, ..self }
    }
    pub fn layer(&self) -> Option<usize> {
        (self.layer != NO_LAYER).then_some(self.layer as usize)
    }
}

/// Totals of one (phase, layer, operation, stage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub ticks: u64,
    pub calls: u64,
    /// Bytes the stage read or wrote, where meaningful (weights, KV rows), else 0.
    pub bytes: u64,
}

/// One recorded span (timeline level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub start: u64,
    pub end: u64,
    pub ctx: SpanCtx,
    pub stage: Stage,
    pub bytes: u64,
}

/// The key of an aggregate cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanKey {
    pub phase: Phase,
    pub layer: Option<usize>,
    pub op: Op,
    pub stage: Stage,
}

/// One thread's recording.
#[derive(Debug, Clone)]
pub struct ThreadRecorder {
    level: Level,
    thread: usize,
    layers: usize,
    /// `[phase][layer + 1 (last = no layer)][op][stage]`.
    totals: Vec<Totals>,
    events: Vec<Event>,
    overflow: u64,
    /// Start and end ticks of this thread's chunk of the current parallel stage (the
    /// caller's `wait` spans are the time around its own chunk).
    pub(crate) chunk_start: u64,
    pub(crate) chunk_end: u64,
}

impl ThreadRecorder {
    /// A switched-off recorder (allocates nothing).
    pub fn off(thread: usize) -> Self {
        Self {
            level: Level::Off,
            thread,
            layers: 0,
            totals: Vec::new(),
            events: Vec::new(),
            overflow: 0,
            chunk_start: 0,
            chunk_end: 0,
        }
    }

    /// A recorder for a model of `layers` layers, keeping up to `timeline_capacity` events
    /// at [`Level::Timeline`]. Without the `instrument` feature every level records nothing.
    pub fn new(thread: usize, level: Level, layers: usize, timeline_capacity: usize) -> Self {
        if !ENABLED || level == Level::Off {
            return Self::off(thread);
        }
        clock::init();
        let cells = Phase::COUNT * (layers + 1) * Op::COUNT * Stage::COUNT;
        let events = if level == Level::Timeline { Vec::with_capacity(timeline_capacity) } else { Vec::new() };
        Self {
            level,
            thread,
            layers,
            totals: vec![Totals::default(); cells],
            events,
            overflow: 0,
            chunk_start: 0,
            chunk_end: 0,
        }
    }

    /// Whether spans are recorded (one branch; constant `false` without the feature).
    #[inline(always)]
    pub fn on(&self) -> bool {
        ENABLED && self.level != Level::Off
    }
    pub fn level(&self) -> Level {
        self.level
    }
    pub fn thread(&self) -> usize {
        self.thread
    }

    /// The start tick of a span, or 0 when off (no clock read).
    #[inline(always)]
    pub fn start(&self) -> u64 {
        if self.on() {
            clock::now()
        } else {
            0
        }
    }

    /// Ends a span begun at `start` now; returns the end tick (0 when off).
    #[inline(always)]
    pub fn end(&mut self, ctx: SpanCtx, stage: Stage, start: u64, bytes: u64) -> u64 {
        if !self.on() {
            return 0;
        }
        let end = clock::now();
        self.record(ctx, stage, start, end, bytes, 1);
        end
    }

    /// Runs `f` as one span (one branch when off).
    #[inline(always)]
    pub fn time<R>(&mut self, ctx: SpanCtx, stage: Stage, bytes: u64, f: impl FnOnce() -> R) -> R {
        if !self.on() {
            return f();
        }
        let start = clock::now();
        let r = f();
        self.record(ctx, stage, start, clock::now(), bytes, 1);
        r
    }

    /// Records a span of `calls` calls from `start` to `end` ticks.
    #[inline]
    pub fn record(&mut self, ctx: SpanCtx, stage: Stage, start: u64, end: u64, bytes: u64, calls: u64) {
        if !self.on() {
            return;
        }
        let i = self.index(ctx.phase, ctx.layer, ctx.op, stage);
        let t = &mut self.totals[i];
        t.ticks += end.saturating_sub(start);
        t.calls += calls;
        t.bytes += bytes;
        if self.level == Level::Timeline {
            if self.events.len() < self.events.capacity() {
                self.events.push(Event { start, end, ctx, stage, bytes });
            } else {
                self.overflow += 1;
            }
        }
    }

    /// The caller starts a parallel stage at `t` (before dispatching it to the pool).
    #[inline(always)]
    pub(crate) fn begin_split(&mut self, t: u64) {
        self.chunk_start = t;
        self.chunk_end = t;
    }

    /// The caller's pool barrier is over: its time outside its own chunk since `t_split`
    /// (dispatching the job before it, waiting for the others after it) is `wait`.
    #[inline]
    pub(crate) fn end_split(&mut self, ctx: SpanCtx, t_split: u64) {
        if !self.on() {
            return;
        }
        if self.chunk_start > t_split {
            self.record(ctx, Stage::Wait, t_split, self.chunk_start, 0, 1);
        }
        self.record(ctx, Stage::Wait, self.chunk_end, clock::now(), 0, 1);
    }

    #[inline(always)]
    fn index(&self, phase: Phase, layer: u16, op: Op, stage: Stage) -> usize {
        let l = if (layer as usize) < self.layers { layer as usize } else { self.layers };
        ((phase as usize * (self.layers + 1) + l) * Op::COUNT + op as usize) * Stage::COUNT + stage as usize
    }

    /// Every non-empty aggregate cell.
    pub fn totals(&self) -> impl Iterator<Item = (SpanKey, Totals)> + '_ {
        let per_phase = (self.layers + 1) * Op::COUNT * Stage::COUNT;
        self.totals.iter().enumerate().filter(|(_, t)| t.calls > 0).map(move |(i, t)| {
            let (phase, rest) = (i / per_phase, i % per_phase);
            let (layer, rest) = (rest / (Op::COUNT * Stage::COUNT), rest % (Op::COUNT * Stage::COUNT));
            let (op, stage) = (rest / Stage::COUNT, rest % Stage::COUNT);
            let key = SpanKey {
                phase: Phase::ALL[phase],
                layer: (layer < self.layers).then_some(layer),
                op: Op::ALL[op],
                stage: Stage::ALL[stage],
            };
            (key, *t)
        })
    }

    /// Recorded events in the order they ended (timeline level).
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Events that did not fit in the timeline buffer.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Forgets everything recorded (keeps the buffers).
    pub fn clear(&mut self) {
        self.totals.iter_mut().for_each(|t| *t = Totals::default());
        self.events.clear();
        self.overflow = 0;
    }
}

/// Ticks of the stages of split kernels, accumulated by the kernel over the timed tiles of
/// one run (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitTicks {
    /// `unpack` (or `xnor`) ticks over the timed tiles.
    pub first: u64,
    /// `dot` (or `popcount`) ticks over the timed tiles.
    pub second: u64,
    /// Tiles (or rows) processed, timed or not.
    pub tiles: u64,
}

impl SplitTicks {
    /// Divides `total` ticks between the two stages in the ratio of the timed tiles.
    pub fn divide(&self, total: u64) -> (u64, u64) {
        let sampled = self.first + self.second;
        if sampled == 0 {
            return (0, total);
        }
        let first = (total as u128 * self.first as u128 / sampled as u128) as u64;
        (first, total - first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregate_cells_round_trip_their_keys() {
        let mut r = ThreadRecorder::new(0, Level::Timeline, 3, 2);
        if !ENABLED {
            assert!(!r.on());
            return;
        }
        let ctx = SpanCtx::new(Phase::Decode, 5);
        r.record(ctx.at(2, Op::Down), Stage::Unpack, 10, 30, 100, 1);
        r.record(ctx.at(2, Op::Down), Stage::Unpack, 40, 45, 100, 1);
        r.record(ctx, Stage::Sample, 50, 51, 0, 1);
        let mut cells: Vec<_> = r.totals().collect();
        cells.sort_by_key(|(k, _)| k.stage);
        assert_eq!(cells.len(), 2);
        assert_eq!(
            cells[0],
            (
                SpanKey { phase: Phase::Decode, layer: Some(2), op: Op::Down, stage: Stage::Unpack },
                Totals { ticks: 25, calls: 2, bytes: 200 }
            )
        );
        assert_eq!(cells[1].0, SpanKey { phase: Phase::Decode, layer: None, op: Op::None, stage: Stage::Sample });
        // Capacity 2: the third event is counted, not kept.
        assert_eq!(r.events().len(), 2);
        assert_eq!(r.overflow(), 1);
        assert_eq!(r.events()[1].start, 40);
    }

    #[test]
    fn an_off_recorder_records_nothing() {
        let mut r = ThreadRecorder::off(0);
        assert_eq!(r.start(), 0);
        r.record(SpanCtx::new(Phase::Prefill, 0), Stage::Norm, 1, 2, 0, 1);
        assert_eq!(r.totals().count(), 0);
        assert_eq!(r.time(SpanCtx::new(Phase::Prefill, 0), Stage::Norm, 0, || 7), 7);
    }

    #[test]
    fn split_ticks_divide_in_the_sampled_ratio() {
        let s = SplitTicks { first: 30, second: 10, tiles: 8 };
        assert_eq!(s.divide(1000), (750, 250));
        assert_eq!(SplitTicks::default().divide(9), (0, 9));
    }
}
