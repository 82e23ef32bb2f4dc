//! An imported llama-bench report diffed against one of ours: configurations pair by batch,
//! context, KV precision and threads, since the two tools label models and kernels apart.

use bitnet_diff::compare::{compare, DEFAULT_METRICS};
use bitnet_report::report::Report;

fn metrics() -> Vec<String> {
    DEFAULT_METRICS.iter().map(|s| s.to_string()).collect()
}

/// llama-bench on `/tmp/large-tq2.gguf`: pp32 and tg8 at 2 threads, f16 K.
fn llama() -> Report {
    let path = format!("{}/../bitnet-bench/tests/data/llama-bench-large-tq2.json", env!("CARGO_MANIFEST_DIR"));
    bitnet_bench::import::import_file(std::path::Path::new(&path)).unwrap()
}

/// One of our reports cut to `configs` (kernel, batch, context) at 2 threads and f16, run on
/// a GGUF file of the same name in another directory.
fn ours(configs: &[(&str, usize, usize)]) -> Report {
    let path = format!("{}/tests/data/aa-a1.json", env!("CARGO_MANIFEST_DIR"));
    let mut r = bitnet_report::load(std::path::Path::new(&path)).unwrap();
    let template = r.results[0].clone();
    assert_eq!((template.config.kv_precision.as_str(), template.config.threads), ("f16", 2));
    r.results = configs
        .iter()
        .map(|&(kernel, batch, ctx)| {
            let mut x = template.clone();
            (x.config.kernel, x.config.batch, x.config.context_length) = (kernel.into(), batch, ctx);
            x
        })
        .collect();
    r.model.source = "GGUF file /data/models/large-tq2.gguf".into();
    r.model.weight_format = "tq2_0".into();
    r
}

#[test]
fn an_imported_llama_bench_report_pairs_with_ours_by_setting() {
    let (base, new) = (llama(), ours(&[("tq2", 1, 32), ("tq2", 4, 32)]));
    let c = compare(&base, &new, ("lb.json", "ours.json"), &metrics(), 0.05, 1).unwrap();
    assert_eq!(c.pairs.len(), 1);
    let p = &c.pairs[0];
    assert_eq!((p.config.kernel.as_str(), p.config.batch, p.config.context_length), ("tq2", 1, 32));
    let b = p.base_config.as_ref().expect("across tools the base's own configuration is kept");
    assert_eq!(b.kernel, "llama.cpp");
    assert_eq!(p.metrics.len(), 3, "decode and prefill tokens/s and TTFT are compared");
    let base_decode = base.results[0].decode.tokens_per_sec.median();
    assert_eq!(p.metrics[0].metric, "decode.tokens_per_sec");
    assert_eq!(p.metrics[0].base_median, base_decode);
    // Batch 4 has no llama-bench counterpart.
    assert_eq!(c.added.len(), 1);
    assert_eq!(c.added[0].batch, 4);
    // The notes say how it paired and that decode starts from different caches.
    assert!(c.notes.iter().any(|n| n.contains("paired by batch, context length, KV precision and threads")));
    // The imported report knows its depth (0: no -d given), and the note says it.
    assert_eq!(base.settings.decode_depth, Some(0));
    assert!(c.notes.iter().any(|n| n.contains("decodes from a cache of 0 tokens (its -d)")), "{:?}", c.notes);
    // One imported before the report kept the depth says what -d means instead.
    let mut older = base.clone();
    older.settings.decode_depth = None;
    let c2 = compare(&older, &new, ("lb.json", "ours.json"), &metrics(), 0.05, 1).unwrap();
    assert!(c2.notes.iter().any(|n| n.contains("-d depth (0 by default)")), "{:?}", c2.notes);
    // Labels and byte counts that differ by tool are not warned about; one file name is one
    // model, whatever its directory.
    for w in &c.env_warnings {
        assert!(!w.starts_with("model") && !w.starts_with("weight bytes") && !w.starts_with("ISA"), "{w}");
        assert!(!w.contains("cores") && !w.contains("logical CPUs"), "unknown to llama-bench: {w}");
    }
    assert!(c.env_warnings.iter().all(|w| !w.contains("weight format")), "{:?}", c.env_warnings);
    // Another file is another model.
    let mut other = new.clone();
    other.model.source = "GGUF file /data/models/large-tq1.gguf".into();
    let c = compare(&base, &other, ("lb.json", "ours.json"), &metrics(), 0.05, 1).unwrap();
    assert!(
        c.env_warnings.iter().any(|w| w == "model file differs: large-tq2.gguf vs large-tq1.gguf"),
        "{:?}",
        c.env_warnings
    );
}

#[test]
fn two_of_our_kernels_at_one_setting_cannot_pair_with_one_llama_bench_test() {
    let err =
        compare(&llama(), &ours(&[("tq2", 1, 32), ("i2s", 1, 32)]), ("lb.json", "ours.json"), &metrics(), 0.05, 1)
            .unwrap_err()
            .to_string();
    assert!(err.starts_with("ours.json: "), "{err}");
    assert!(err.contains("i2s/") && err.contains("tq2/") && err.contains("one --kernels"), "{err}");
    assert!(err.contains("against a llama-bench report"), "{err}");
}

#[test]
fn a_configuration_twice_in_one_report_is_refused_with_the_right_hint() {
    // `--batch-sizes 1,1-4` once ran batch 1 twice: pairing would pick one silently.
    let twice = ours(&[("tq2", 1, 32), ("tq2", 1, 32)]);
    for (base, new) in [(ours(&[("tq2", 1, 32)]), &twice), (llama(), &twice)] {
        let err = compare(&base, new, ("a.json", "b.json"), &metrics(), 0.05, 1).unwrap_err().to_string();
        assert!(err.starts_with("b.json: bitnet-b1.58-large tq2/avx512 B=1 ctx=32 kv=f16 t=2 occurs twice"), "{err}");
        assert!(err.contains("merge") && !err.contains("--kernels"), "{err}");
    }
}

#[test]
fn reports_of_one_tool_still_pair_by_the_whole_configuration() {
    let (a, mut b) = (ours(&[("tq2", 1, 32)]), ours(&[("tq2", 1, 32)]));
    let c = compare(&a, &b, ("a.json", "b.json"), &metrics(), 0.05, 1).unwrap();
    assert_eq!(c.pairs.len(), 1);
    assert!(c.pairs[0].base_config.is_none() && c.notes.is_empty());
    b.results[0].config.kernel = "i2s".into();
    let err = compare(&a, &b, ("a.json", "b.json"), &metrics(), 0.05, 1).unwrap_err().to_string();
    assert!(err.contains("no configuration in common"), "{err}");
    assert!(!err.contains("across tools"), "{err}");
}
