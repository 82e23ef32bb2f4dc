//! Two runs of the same code on a machine whose cores ran slower the second time (a shared VM
//! whose host is busier): batch-decode tokens/s follows the clock and reads as a regression,
//! the compute fraction (each run over its own report's int8 peak) does not, and the
//! comparison says that the peaks differ.

use bitnet_diff::compare::{compare, compute_peak_notes, Verdict};
use bitnet_report::stats::Stat;
use bitnet_report::{roofline::peak_key, Report};

fn base() -> Report {
    let path = format!("{}/tests/data/aa-a1.json", env!("CARGO_MANIFEST_DIR"));
    let mut r = bitnet_report::load(std::path::Path::new(&path)).unwrap();
    let keys: Vec<String> = r.results.iter().map(|x| peak_key(&x.config.isa, x.config.threads)).collect();
    for k in keys {
        r.roofline.int8_peak_gmacs.insert(k, 400.0);
    }
    for x in &mut r.results {
        x.decode.macs_per_step = 2_000_000_000 * x.config.batch as u64;
        // Runs within 1% of each other, so that equal samples read as unchanged.
        let m = x.decode.tokens_per_sec.median();
        x.decode.tokens_per_sec = Stat::of(&[m, 1.01 * m, 0.99 * m, 1.005 * m]);
    }
    r.refresh_derived();
    r
}

/// The same code with the cores' rate scaled by `f`: tokens/s and the peaks scale with it.
fn on_slower_cores(r: &Report, f: f64) -> Report {
    let mut n = r.clone();
    n.roofline.int8_peak_gmacs.values_mut().for_each(|g| *g *= f);
    for x in &mut n.results {
        let s: Vec<f64> = x.decode.tokens_per_sec.samples().iter().map(|v| v * f).collect();
        x.decode.tokens_per_sec = Stat::of(&s);
    }
    n.refresh_derived();
    n
}

fn metrics() -> Vec<String> {
    ["decode.tokens_per_sec", "decode.compute_fraction"].iter().map(|s| s.to_string()).collect()
}

#[test]
fn slower_cores_are_named_and_the_compute_fraction_does_not_move() {
    let b = base();
    assert!(b.results.iter().all(|x| x.decode.compute_fraction.is_some()));
    let n = on_slower_cores(&b, 0.7);
    let c = compare(&b, &n, ("base.json", "new.json"), &metrics(), 0.05, 1).unwrap();
    assert!(!c.pairs.is_empty());
    for p in &c.pairs {
        assert_eq!(
            (p.metrics[0].metric.as_str(), p.metrics[0].verdict),
            ("decode.tokens_per_sec", Verdict::Regression)
        );
        let f = &p.metrics[1];
        assert_eq!(f.metric, "decode.compute_fraction");
        assert_eq!(f.n_base, p.metrics[0].n_base, "one sample per measured run");
        assert_eq!(f.verdict, Verdict::Unchanged);
        assert!((f.base_median / f.new_median - 1.0).abs() < 1e-9, "{} vs {}", f.base_median, f.new_median);
    }
    let note = c.notes.iter().find(|x| x.contains("int8 compute peak")).expect("a note on the peaks");
    assert!(note.contains("400.0 → 280.0 G multiply-adds/s") && note.contains("-30.0%"), "{note}");
    // Within the threshold, or without peaks (older and imported reports), nothing to say.
    assert!(compute_peak_notes(&b, &on_slower_cores(&b, 0.97), 0.05).is_empty());
    let mut none = b.clone();
    none.roofline.int8_peak_gmacs.clear();
    assert!(compute_peak_notes(&none, &n, 0.05).is_empty());
    // A report without the fraction has nothing to compare for it: listed as not compared.
    none.refresh_derived();
    let c = compare(&none, &n, ("a", "b"), &metrics(), 0.05, 1).unwrap();
    assert!(c.pairs.iter().all(|p| p.metrics.iter().all(|m| m.metric != "decode.compute_fraction")));
    assert_eq!(c.not_compared.iter().filter(|x| x.contains("decode.compute_fraction")).count(), c.pairs.len());
}
