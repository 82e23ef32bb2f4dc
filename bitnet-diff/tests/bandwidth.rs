//! Two runs of the same code on a machine whose memory bandwidth moved between them (as it
//! does on shared VMs by tens of percent within an hour): decode tokens/s follows the
//! bandwidth and reads as a regression, the roofline fraction (each step over a probe taken
//! right after it) does not, and the comparison says that the probes differ.

use bitnet_diff::compare::{compare, Verdict};
use bitnet_report::report::Report;
use bitnet_report::stats::Stat;

fn base() -> Report {
    let path = format!("{}/tests/data/aa-a1.json", env!("CARGO_MANIFEST_DIR"));
    let mut r = bitnet_report::load(std::path::Path::new(&path)).unwrap();
    // Four roofline passes per result (one per run) of four steps: one fraction per decode
    // step, each step over its own probe, and each pass's median.
    for (i, x) in r.results.iter_mut().enumerate() {
        x.decode.step_fractions = (0..16).map(|k| 0.80 + 0.01 * ((k * 3 + i) % 5) as f64).collect();
        x.decode.probes_gbps = vec![30.0; 16];
        x.decode.pass_fractions =
            x.decode.step_fractions.chunks(4).map(|c| bitnet_report::stats::percentile(c, 50.0)).collect();
        x.decode.roofline_fraction = bitnet_report::stats::percentile(&x.decode.step_fractions, 50.0);
    }
    r
}

/// The same code on the same machine with its bandwidth scaled by `f`: decode tokens/s and the
/// probes scale with it, the fractions stay.
fn on_slower_host(r: &Report, f: f64) -> Report {
    let mut n = r.clone();
    for v in n.roofline.by_threads.values_mut() {
        *v *= f;
    }
    n.roofline.read_bandwidth_gbps *= f;
    for x in &mut n.results {
        let s: Vec<f64> = x.decode.tokens_per_sec.samples().iter().map(|v| v * f).collect();
        x.decode.tokens_per_sec = Stat::of(&s);
        x.decode.probes_gbps.iter_mut().for_each(|p| *p *= f);
    }
    n
}

fn metrics() -> Vec<String> {
    ["decode.tokens_per_sec", "decode.roofline_fraction"].iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_slower_host_is_named_and_the_roofline_fraction_does_not_move() {
    let b = base();
    let n = on_slower_host(&b, 0.7);
    let c = compare(&b, &n, ("base.json", "new.json"), &metrics(), 0.05, 1).unwrap();
    for p in &c.pairs {
        let tps = &p.metrics[0];
        assert_eq!((tps.metric.as_str(), tps.verdict), ("decode.tokens_per_sec", Verdict::Regression));
        let roof = &p.metrics[1];
        assert_eq!(roof.metric, "decode.roofline_fraction");
        assert_eq!((roof.n_base, roof.n_new), (4, 4), "the passes' medians are the samples");
        assert_eq!(roof.verdict, Verdict::Unchanged);
        assert_eq!(roof.base_median, roof.new_median);
        assert!((0.8..=0.84).contains(&roof.base_median), "the median of the step fractions: {}", roof.base_median);
    }
    let note = c.notes.iter().find(|x| x.contains("read bandwidth")).expect("a note on the probes");
    assert!(note.contains("49.1 → 34.4 GB/s with 2 thread(s)") && note.contains("-30.0%"), "{note}");
    assert!(c.env_warnings.iter().all(|w| !w.contains("bandwidth")), "not an environment difference");
    // The text and Markdown outputs carry it.
    assert!(bitnet_diff::render::text(&c).contains("note: the memory read bandwidth"));
    assert!(bitnet_diff::render::markdown(&c).contains("note: the memory read bandwidth"));
}

#[test]
fn probes_within_the_threshold_get_no_note_and_either_direction_is_named() {
    let b = base();
    let c = compare(&b, &on_slower_host(&b, 0.96), ("a", "b"), &metrics(), 0.05, 1).unwrap();
    assert!(c.notes.is_empty(), "{:?}", c.notes);
    let c = compare(&on_slower_host(&b, 0.7), &b, ("a", "b"), &metrics(), 0.05, 1).unwrap();
    assert!(c.notes.iter().any(|x| x.contains("34.4 → 49.1 GB/s") && x.contains("+42.9%")), "{:?}", c.notes);
    // A report without probes (an imported llama-bench run has none) is not compared.
    let mut none = b.clone();
    none.roofline.by_threads.clear();
    assert!(bitnet_diff::compare::bandwidth_notes(&none, &on_slower_host(&b, 0.5), 0.05).is_empty());
}

#[test]
fn probes_of_different_sizes_are_named_and_unknown_sizes_are_not() {
    // A --quick baseline (64 MiB probes, which a 32 MiB L3 partly holds) against a full run.
    let (mut quick, mut full) = (base(), base());
    quick.roofline.probe_bytes = Some(64 << 20);
    full.roofline.probe_bytes = Some(1 << 30);
    for r in [&mut quick, &mut full] {
        r.roofline.step_probe_bytes = Some(128 << 20);
    }
    let c = compare(&quick, &full, ("quick.json", "full.json"), &metrics(), 0.05, 1).unwrap();
    let sized: Vec<&String> = c.notes.iter().filter(|n| n.contains("buffers of different sizes")).collect();
    assert_eq!(sized.len(), 1, "{:?}", c.notes);
    assert!(sized[0].contains("roofline.probe_bytes: 67108864 → 1073741824 bytes"), "{}", sized[0]);
    // The step probes differ too: the roofline fractions are named.
    full.roofline.step_probe_bytes = Some(16 << 20);
    let c = compare(&quick, &full, ("quick.json", "full.json"), &metrics(), 0.05, 1).unwrap();
    assert!(
        c.notes.iter().any(|n| n.contains("roofline.step_probe_bytes") && n.contains("decode.roofline_fraction")),
        "{:?}",
        c.notes
    );
    // Equal sizes, or a report that does not say (older, imported), give no such note.
    let c = compare(&quick, &quick.clone(), ("a", "b"), &metrics(), 0.05, 1).unwrap();
    assert!(c.notes.iter().all(|n| !n.contains("different sizes")), "{:?}", c.notes);
    let mut older = full.clone();
    (older.roofline.probe_bytes, older.roofline.step_probe_bytes) = (None, None);
    let c = compare(&older, &quick, ("a", "b"), &metrics(), 0.05, 1).unwrap();
    assert!(c.notes.iter().all(|n| !n.contains("different sizes")), "{:?}", c.notes);
}
