//! The traced run's outputs on the `tiny` preset: the folded stacks' structure (a golden file
//! of stack names and span counts, independent of timing), the Chrome trace's fields, the
//! summary's consistency section, and the counter fallback with software events.

use std::path::PathBuf;

use bitnet_engine::gguf::ModelSource;
use bitnet_engine::instrument::Level;
use bitnet_engine::{KernelForm, KvPrecision, State, StateOptions, WeightFormat};
use bitnet_trace::counters::Counters;
use bitnet_trace::folded::{folded, Weight};
use bitnet_trace::spans::Spans;
use bitnet_trace::{run_trace, TraceOptions};

fn tiny_opts() -> TraceOptions {
    TraceOptions { model: "tiny".into(), context_length: 16, tokens: 4, counters: false, ..Default::default() }
}

/// A fresh, uniquely named scratch directory, removed when dropped (pass or fail). The trace
/// goes to `out` inside it, which does not exist yet: run_trace creates it.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("bitnet-trace-test-{name}-")).tempdir().unwrap()
}

/// The stacks of a tiny run weighted by span counts, as committed in `golden/`. One thread,
/// because with more the pool's threads take each other's rows at run time, so how many spans
/// each writes depends on timing; a 2-thread run must still give the same stacks.
#[test]
fn folded_stack_structure_matches_the_golden_file() {
    if !bitnet_engine::instrument::ENABLED {
        return;
    }
    let src = ModelSource::parse("tiny").unwrap();
    let (model, _) = src.load(WeightFormat::I2, 42, 2, None).unwrap();
    let run = |form, threads| {
        let mut so = StateOptions::new(1, 32, KvPrecision::F16, threads);
        so.kernel = Some(
            bitnet_engine::Kernel::new(bitnet_engine::KernelFamily::I2s, bitnet_engine::IsaLevel::best(), form)
                .unwrap(),
        );
        let mut st = State::new(&model, &so).unwrap();
        st.set_instrument(Level::Aggregate, 0);
        bitnet_engine::model::greedy(&model, &mut st, &[1, 2, 3, 4, 5, 6, 7, 8], 4, false).unwrap();
        folded(&Spans::collect(&st), Weight::Calls)
    };
    let stacks = |f: &str| f.lines().map(|l| l.rsplit_once(' ').unwrap().0.to_string()).collect::<Vec<_>>();
    for (form, golden) in
        [(KernelForm::Split, "tiny_split_calls.folded"), (KernelForm::Fused, "tiny_fused_calls.folded")]
    {
        let got = run(form, 1);
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(golden);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        assert_eq!(got, want, "{form}: stacks or span counts changed; review and rerun with UPDATE_GOLDEN=1");
        assert_eq!(stacks(&run(form, 2)), stacks(&want), "{form}: 2 threads give other stacks than 1");
    }
}

#[test]
fn a_traced_run_writes_every_file_and_a_consistent_summary() {
    let dir = tmp("run");
    let out = dir.path().join("out");
    let o = run_trace(&TraceOptions { counters: true, ..tiny_opts() }, &out).unwrap();
    let names: Vec<String> = o.files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["flamegraph.svg", "stages.folded", "summary.json", "trace.json"]);

    // The folded file: `frame;...;stage ns` lines, every stack rooted at a phase.
    let folded = std::fs::read_to_string(out.join("stages.folded")).unwrap();
    assert!(folded.lines().count() > 20);
    for line in folded.lines() {
        let (stack, w) = line.rsplit_once(' ').unwrap();
        assert!(stack.starts_with("prefill;") || stack.starts_with("decode;"), "{line}");
        assert!(w.parse::<u64>().unwrap() > 0);
    }
    assert!(folded.contains("decode;layer.01;ffn.down;unpack "));
    assert!(folded.contains("decode;layer.00;attn;attention;qk "));
    let svg = std::fs::read_to_string(out.join("flamegraph.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("tiny") && svg.contains("i2s/"));

    // The Chrome trace parses back with the fields viewers need.
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(spans.len() > 100);
    for e in &spans {
        for f in ["name", "cat", "ts", "dur", "pid", "tid", "args"] {
            assert!(!e[f].is_null(), "event without {f}: {e}");
        }
        assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
        assert!(e["args"]["step"].is_u64() && e["args"]["phase"].is_string());
    }
    let tids: std::collections::BTreeSet<u64> = spans.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids.into_iter().collect::<Vec<_>>(), [0, 1], "one track per thread");
    let named = events.iter().filter(|e| e["ph"] == "M" && e["name"] == "thread_name").count();
    assert_eq!(named, 2);

    // The summary: both phases, consistency figures, counters with a status for each.
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["run"]["model"], "tiny");
    assert_eq!(s["run"]["form"], "split");
    let decode = s["stages"]["decode"].as_array().unwrap();
    let stage = |n: &str| decode.iter().find(|r| r["stage"] == n).unwrap_or_else(|| panic!("no {n} row"));
    assert!(stage("unpack")["bytes"].as_u64().unwrap() > 0);
    assert_eq!(stage("qk")["parent"], "attention");
    assert_eq!(stage("sample")["calls"], 4);
    let c = &s["consistency"];
    assert!(c["wall_ms"].as_f64().unwrap() > 0.0 && c["caller_span_ms"].as_f64().unwrap() > 0.0);
    let counters = s["counters"]["counters"].as_array().unwrap();
    assert_eq!(counters.len(), 11);
    for k in counters {
        assert!(k["status"] == "counting" || !k["error"].is_null(), "a missing counter says why: {k}");
    }
    // The compute section: at the kernel's ISA (the best here, i2s's default), a row for the
    // linear layers and the head of both phases, each its multiply-adds over its thread-time.
    let kernel = bitnet_engine::Kernel::best(bitnet_engine::KernelFamily::I2s);
    if kernel.isa() == bitnet_engine::IsaLevel::Scalar {
        assert!(s["compute"].is_null());
    } else {
        let c = &s["compute"];
        assert_eq!(c["isa"], kernel.isa().name());
        let peak = c["peak_gmacs_per_thread"].as_f64().unwrap();
        assert!(peak > 0.0);
        let rows = c["rows"].as_array().unwrap();
        // Flagged exactly when a part ran faster than the best probe (a disturbed probe).
        let above = rows.iter().any(|r| r["pct_of_peak"].as_f64().unwrap() > 100.0);
        assert_eq!(c["peak_below_stages"].as_bool(), Some(above));
        let parts: Vec<String> = rows.iter().map(|r| format!("{} {}", r["phase"], r["part"])).collect();
        assert_eq!(
            parts,
            [r#""prefill" "linear""#, r#""prefill" "lm_head""#, r#""decode" "linear""#, r#""decode" "lm_head""#]
        );
        let cfg = bitnet_engine::ModelConfig::preset("tiny").unwrap();
        let model = bitnet_engine::Model::synthetic("tiny", bitnet_engine::WeightFormat::I2, 42, 1).unwrap();
        assert_eq!(cfg.vocab * cfg.hidden, model.weights.head_macs_per_token() as usize);
        // Decode: 4 steps of one token.
        assert_eq!(rows[2]["macs"].as_u64().unwrap(), 4 * model.weights.linear_macs_per_token());
        assert_eq!(rows[3]["macs"].as_u64().unwrap(), 4 * model.weights.head_macs_per_token());
        for r in rows {
            let (macs, ms) = (r["macs"].as_f64().unwrap(), r["thread_ms"].as_f64().unwrap());
            let rate = r["gmacs_per_thread"].as_f64().unwrap();
            assert!((rate - macs / (ms * 1e6)).abs() <= 1e-9 * rate, "{r}");
            assert!((r["pct_of_peak"].as_f64().unwrap() - rate / peak * 100.0).abs() < 1e-9, "{r}");
        }
    }
}

#[test]
fn software_counters_count_when_hardware_ones_are_missing() {
    let mut c = Counters::open(&bitnet_trace::counters::thread_ids());
    let task_clock = c.status.iter().find(|s| s.name == "task-clock").unwrap().clone();
    if task_clock.status != "counting" {
        // perf_event_open is forbidden outright here: the reason must be named.
        assert!(task_clock.error.unwrap().contains("os error"));
        return;
    }
    for s in c.status.iter().filter(|s| s.kind == "hardware" && s.status == "missing") {
        assert!(s.error.as_deref().unwrap().contains("os error"), "{s:?}");
        assert!(c.fallback_note().unwrap().contains("software counters"));
    }
    // Burn some CPU; task-clock (ns of CPU time) must see it.
    let t = std::time::Instant::now();
    let mut x = 0u64;
    while t.elapsed() < std::time::Duration::from_millis(20) {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    std::hint::black_box(x);
    let d = c.delta();
    let ns = d.iter().find(|(n, _)| *n == "task-clock").unwrap().1.value;
    assert!(ns > 10e6, "task-clock counted {ns} ns over 20 ms of work");
}

#[test]
fn a_failed_run_leaves_no_files() {
    let dir = tmp("bad");
    let out = dir.path().join("out");
    let err = run_trace(&TraceOptions { context_length: 250, tokens: 10, ..tiny_opts() }, &out).err().unwrap();
    assert!(format!("{err:#}").contains("--context-length 250"), "{err:#}");
    assert!(!out.exists(), "nothing written");
    let parent = out.parent().unwrap();
    let leftovers = std::fs::read_dir(parent)
        .unwrap()
        .filter(|e| {
            let staging = format!(".{}.bitnet-trace-", out.file_name().unwrap().to_string_lossy());
            e.as_ref().unwrap().file_name().to_string_lossy().starts_with(&staging)
        })
        .count();
    assert_eq!(leftovers, 0, "no staging directory left behind");
}
