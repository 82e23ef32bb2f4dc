//! Per-stage spans of the forward pass: which spans a run emits (counted exactly on the tiny
//! preset), that recording does not change results, and the timeline's invariants.

use std::collections::BTreeMap;

use bitnet_engine::instrument::{Level, Op, Phase, Stage, ENABLED};
use bitnet_engine::model::generate::greedy;
use bitnet_engine::{
    IsaLevel, Kernel, KernelFamily, KernelForm, KvPrecision, Model, State, StateOptions, WeightFormat,
};

const PROMPT: [u32; 8] = [1, 5, 9, 200, 17, 3, 3, 42];
const DECODE: usize = 4;

fn run(level: Level, form: KernelForm, threads: usize) -> (Vec<u32>, State, Model) {
    let model = Model::synthetic("tiny", WeightFormat::I2, 11, 2).unwrap();
    let mut opts = StateOptions::new(1, 64, KvPrecision::F16, threads);
    opts.kernel = Some(Kernel::new(KernelFamily::I2s, IsaLevel::best(), form).unwrap());
    let mut st = State::new(&model, &opts).unwrap();
    st.set_instrument(level, 10_000);
    // n_predict = DECODE + 1: the prefill gives the first token, then DECODE forward calls.
    let g = greedy(&model, &mut st, &PROMPT, DECODE + 1, false).unwrap();
    (g.tokens, st, model)
}

/// Calls per (phase, layer, op, stage), summed over threads.
fn calls(st: &State) -> BTreeMap<(Phase, Option<usize>, Op, Stage), u64> {
    let mut m = BTreeMap::new();
    for rec in st.recorders() {
        for (k, t) in rec.totals() {
            *m.entry((k.phase, k.layer, k.op, k.stage)).or_insert(0) += t.calls;
        }
    }
    m
}

#[test]
fn recording_does_not_change_results() {
    let (off, ..) = run(Level::Off, KernelForm::Fused, 2);
    for level in [Level::Aggregate, Level::Timeline] {
        for form in [KernelForm::Fused, KernelForm::Split] {
            assert_eq!(run(level, form, 2).0, off, "{level:?} {form:?}");
        }
    }
}

#[test]
fn a_run_emits_exactly_the_expected_spans() {
    if !ENABLED {
        return;
    }
    let (_, st, model) = run(Level::Aggregate, KernelForm::Fused, 1);
    let c = calls(&st);
    let d = DECODE as u64;
    let get = |p, l, o, s| c.get(&(p, l, o, s)).copied().unwrap_or(0);
    // One forward call for the prompt, DECODE for decode; one sample per decode step.
    assert_eq!(get(Phase::Prefill, None, Op::None, Stage::Embed), 1);
    assert_eq!(get(Phase::Decode, None, Op::None, Stage::Embed), d);
    assert_eq!(get(Phase::Decode, None, Op::None, Stage::Sample), d);
    // RoPE angles once per forward call, the rotations once per layer.
    assert_eq!(get(Phase::Decode, None, Op::None, Stage::Rope), d);
    let heads = model.config.heads as u64;
    for l in 0..model.config.layers {
        let l = Some(l);
        assert_eq!(get(Phase::Decode, l, Op::Attn, Stage::Norm), d);
        assert_eq!(get(Phase::Decode, l, Op::Attn, Stage::Rope), d);
        assert_eq!(get(Phase::Decode, l, Op::Attn, Stage::KvWrite), d);
        // Attention: one qk/softmax/av per read of a KV head's rows per decode row (per prompt
        // row in prefill). With an f16 cache the query heads sharing a KV head are one item
        // (tiny: 2 per KV head; one thread, so nothing splits them).
        let items = heads / (model.config.heads / model.config.kv_heads) as u64;
        assert_eq!(items, 2);
        assert_eq!(get(Phase::Decode, l, Op::Attn, Stage::Qk), d * items);
        assert_eq!(get(Phase::Decode, l, Op::Attn, Stage::Av), d * items);
        // A prompt attends in tiles of up to four rows of one query head (tiny's KV heads serve
        // two query heads, fewer than a tile's rows).
        let tiles = PROMPT.len().div_ceil(4) as u64 * heads;
        assert_eq!(get(Phase::Prefill, l, Op::Attn, Stage::Softmax), tiles);
        for op in [Op::Q, Op::K, Op::V, Op::O, Op::Gate, Op::Up, Op::Down] {
            assert_eq!(get(Phase::Decode, l, op, Stage::UnpackDot), d, "{op}");
            // One decode row: every projection writes its `[n, 1]` result in place (Q, K
            // and V too, each into its own output, though they share one dispatch).
            assert_eq!(get(Phase::Decode, l, op, Stage::Transpose), 0, "{op}");
            assert_eq!(get(Phase::Decode, l, op, Stage::Unpack), 0, "fused kernels have no separate unpack");
        }
        assert_eq!(get(Phase::Decode, l, Op::Ffn, Stage::FfnAct), d);
        assert_eq!(get(Phase::Decode, l, Op::Attn, Stage::Residual), d);
        assert_eq!(get(Phase::Decode, l, Op::Ffn, Stage::Residual), d);
    }
    assert_eq!(get(Phase::Decode, None, Op::Output, Stage::LmHead), d);
    assert_eq!(get(Phase::Prefill, None, Op::Output, Stage::LmHead), 1, "only the last prompt row gets logits");
}

#[test]
fn attention_counts_each_kv_heads_bytes_once_per_row() {
    if !ENABLED {
        return;
    }
    // However the query heads sharing a KV head are split into items (one item of both with f16
    // on one thread; one item per query head with an encoded cache), a decode step's qk and av
    // each count every KV head's rows once: memory traffic, as `bitnet-bench` counts it.
    let model = Model::synthetic("tiny", WeightFormat::I2, 11, 2).unwrap();
    let cfg = &model.config;
    assert!(cfg.heads > cfg.kv_heads, "the tiny preset groups query heads");
    for kv in [KvPrecision::F16, KvPrecision::Int8] {
        for threads in [1, 2] {
            let mut st = State::new(&model, &StateOptions::new(1, 64, kv, threads)).unwrap();
            st.set_instrument(Level::Aggregate, 10_000);
            greedy(&model, &mut st, &PROMPT, DECODE + 1, false).unwrap();
            let (mut qk, mut av) = (0u64, 0u64);
            for rec in st.recorders() {
                for (k, t) in rec.totals() {
                    if k.phase == Phase::Decode && k.stage == Stage::Qk {
                        qk += t.bytes;
                    }
                    if k.phase == Phase::Decode && k.stage == Stage::Av {
                        av += t.bytes;
                    }
                }
            }
            // Decode rows sit at positions PROMPT.len() .. PROMPT.len() + DECODE.
            let rows: u64 = (0..DECODE).map(|i| (PROMPT.len() + i + 1) as u64).sum();
            let want = rows * (cfg.layers * cfg.kv_heads * kv.bytes_per_vector(cfg.head_dim())) as u64;
            assert_eq!((qk, av), (want, want), "{kv:?}, {threads} threads");
        }
    }
}

#[test]
fn split_kernels_report_unpack_and_dot_with_bytes() {
    if !ENABLED {
        return;
    }
    let (_, st, model) = run(Level::Aggregate, KernelForm::Split, 2);
    let mut unpack = (0u64, 0u64);
    let mut dot = 0u64;
    for rec in st.recorders() {
        for (k, t) in rec.totals() {
            if k.phase == Phase::Decode && k.stage == Stage::Unpack {
                unpack.0 += t.ticks;
                unpack.1 += t.bytes;
            }
            if k.phase == Phase::Decode && k.stage == Stage::Dot {
                dot += t.ticks;
            }
            assert_ne!(k.stage, Stage::UnpackDot, "the split form has no fused stage");
        }
    }
    assert!(unpack.0 > 0 && dot > 0, "both stages took time: unpack {} dot {dot}", unpack.0);
    // Every decode step reads every linear weight byte once (split over the threads).
    let linear: u64 = model.weights.layers.iter().flat_map(|l| l.linears()).map(|w| w.byte_len() as u64).sum();
    let per_step = unpack.1 / DECODE as u64;
    assert!(per_step.abs_diff(linear) <= 7 * model.config.layers as u64 * 2, "{per_step} vs {linear} bytes");
}

#[test]
fn timeline_events_are_ordered_per_thread_with_steps_and_phases() {
    if !ENABLED {
        return;
    }
    let (_, st, _) = run(Level::Timeline, KernelForm::Fused, 2);
    let mut threads = 0;
    for rec in st.recorders() {
        let ev = rec.events();
        assert_eq!(rec.overflow(), 0);
        if ev.is_empty() {
            continue;
        }
        threads += 1;
        for e in ev {
            assert!(e.start <= e.end, "{e:?}");
            assert_eq!(e.ctx.phase, if e.ctx.step == 0 { Phase::Prefill } else { Phase::Decode }, "{e:?}");
            assert!(e.ctx.step as usize <= DECODE);
        }
        // Spans on one thread never overlap (stages nest only by name: attention's qk,
        // softmax and av follow one another).
        let mut sorted = ev.to_vec();
        sorted.sort_by_key(|e| (e.start, e.end));
        for w in sorted.windows(2) {
            assert!(w[0].end <= w[1].start, "{:?} overlaps {:?}", w[0], w[1]);
        }
    }
    assert_eq!(threads, 2, "both threads recorded work");
}

#[test]
fn a_small_timeline_counts_its_overflow() {
    if !ENABLED {
        return;
    }
    let model = Model::synthetic("tiny", WeightFormat::I2, 11, 1).unwrap();
    let mut st = State::new(&model, &StateOptions::new(1, 64, KvPrecision::F16, 1)).unwrap();
    st.set_instrument(Level::Timeline, 10);
    greedy(&model, &mut st, &PROMPT, 2, false).unwrap();
    let rec = st.recorders().next().unwrap();
    assert_eq!(rec.events().len(), 10);
    let total: u64 = rec.totals().map(|(_, t)| t.calls).sum();
    assert!(rec.overflow() > 0);
    // Every span is in the totals, kept or not (split spans count tiles, not events, so this
    // fused run has one event per call).
    assert_eq!(rec.overflow() + 10, total);
}

#[test]
fn lookup_forms_build_their_tables_once_per_thread_and_activation() {
    if !ENABLED {
        return;
    }
    // Each thread builds the tables of a quantized activation once, at its first block of the
    // matmuls that read it (Q/K/V, O, gate/up, down: four a layer), and the span goes to the op
    // it was working on then. With one thread that is exactly the first op of each group.
    let model = Model::synthetic("tiny", WeightFormat::Tq1_0, 11, 2).unwrap();
    let d = DECODE as u64;
    for form in [KernelForm::Lut, KernelForm::Perm] {
        let kernel = Kernel::new(KernelFamily::Tq1, IsaLevel::best(), form)
            .or_else(|_| Kernel::new(KernelFamily::Tq1, IsaLevel::Scalar, form))
            .unwrap();
        let mut tokens = Vec::new();
        for threads in [1, 2] {
            let mut opts = StateOptions::new(1, 64, KvPrecision::F16, threads);
            opts.kernel = Some(kernel);
            let mut st = State::new(&model, &opts).unwrap();
            st.set_instrument(Level::Aggregate, 10_000);
            tokens.push(greedy(&model, &mut st, &PROMPT, DECODE + 1, false).unwrap().tokens);
            let c = calls(&st);
            let get = |l, o, s| c.get(&(Phase::Decode, Some(l), o, s)).copied().unwrap_or(0);
            for l in 0..model.config.layers {
                let groups = [vec![Op::Q, Op::K, Op::V], vec![Op::O], vec![Op::Gate, Op::Up], vec![Op::Down]];
                for group in groups {
                    let built: u64 = group.iter().map(|&o| get(l, o, Stage::Tables)).sum();
                    if threads == 1 {
                        assert_eq!(get(l, group[0], Stage::Tables), d, "{kernel} layer {l} {:?}", group[0]);
                        assert_eq!(built, d, "{kernel} layer {l} {group:?}");
                    } else {
                        assert!((d..=2 * d).contains(&built), "{kernel} layer {l} {group:?}: {built}");
                    }
                    let looked_up: u64 = group.iter().map(|&o| get(l, o, Stage::Lookup)).sum();
                    assert!(looked_up >= built, "{kernel} layer {l} {group:?}");
                }
            }
        }
        assert_eq!(tokens[0], tokens[1], "{kernel}: two threads, each with its own tables");
    }
}
