//! Proof that the decision works, on real reports of this build measured on this machine kind:
//! - `aa-a1.json`, `aa-a2.json`: one sweep's interleaved runs split in two (`make_aa.py`): an
//!   A/A pair (the large preset, 4 configurations, 10 runs a side) taken in a noisy period;
//! - `quiet.json`: the same sweep taken in a quieter period (10 runs), and copies of it scaled by
//!   known factors;
//! - synthetic reports with 2% log-normal noise, where every configuration must be resolved.

use bitnet_diff::compare::{compare, decide, Better, DEFAULT_METRICS};
use bitnet_diff::Verdict;
use bitnet_report::report::Report;
use bitnet_report::stats::Stat;
use proptest::prelude::*;

fn load(name: &str) -> Report {
    bitnet_report::load(std::path::Path::new(&format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR")))).unwrap()
}

fn metrics() -> Vec<String> {
    DEFAULT_METRICS.iter().map(|s| s.to_string()).collect()
}

/// A copy whose throughputs are multiplied by `f` and whose times are divided by it.
fn scaled(r: &Report, f: f64) -> Report {
    let mut r = r.clone();
    let scale = |s: &Stat, k: f64| Stat::of(&s.samples().iter().map(|v| v * k).collect::<Vec<_>>());
    for x in &mut r.results {
        x.decode.tokens_per_sec = scale(&x.decode.tokens_per_sec, f);
        x.prefill.tokens_per_sec = scale(&x.prefill.tokens_per_sec, f);
        x.prefill.ttft_ms = scale(&x.prefill.ttft_ms, 1.0 / f);
    }
    r
}

#[test]
fn a_a_reports_flag_nothing() {
    let (a, b) = (load("aa-a1.json"), load("aa-a2.json"));
    let c = compare(&a, &b, ("a1", "a2"), &metrics(), 0.05, 1).unwrap();
    assert_eq!(c.pairs.len(), 4);
    assert_eq!(c.counts.regressions, 0, "{}", bitnet_diff::render::text(&c));
    assert_eq!(c.counts.improvements, 0, "{}", bitnet_diff::render::text(&c));
    assert!(c.env_warnings.is_empty(), "{:?}", c.env_warnings);
}

/// Coefficient of variation of a metric's base samples.
fn noise(r: &bitnet_report::report::BenchResult, metric: &str) -> f64 {
    let s = match metric {
        "decode.tokens_per_sec" => &r.decode.tokens_per_sec,
        "prefill.tokens_per_sec" => &r.prefill.tokens_per_sec,
        _ => &r.prefill.ttft_ms,
    };
    s.stddev() / s.mean()
}

/// Every metric gets `want`, except one too noisy (over 5% variation) to resolve 10% with 10
/// runs a side, which is inconclusive and says how many runs would settle it; never the wrong
/// way, never "unchanged".
fn assert_resolved(base: &Report, c: &bitnet_diff::Comparison, want: Verdict) {
    let mut resolved = 0;
    for (p, r) in c.pairs.iter().zip(&base.results) {
        for m in &p.metrics {
            if m.verdict == Verdict::Inconclusive {
                let n = noise(r, &m.metric);
                assert!(n > 0.05, "{:?} {}: {:.1}% noise must be resolved: {m:?}", p.config, m.metric, n * 100.0);
                assert!(m.note.as_deref().unwrap().contains("repetitions"));
            } else {
                assert_eq!(m.verdict, want, "{:?} {m:?}", p.config);
                resolved += 1;
            }
        }
    }
    assert!(resolved * 2 >= c.pairs.len() * 3, "{}", bitnet_diff::render::text(c));
}

#[test]
fn ten_percent_slower_is_a_regression_and_faster_an_improvement_on_real_samples() {
    let base = load("quiet.json");
    let slow = compare(&base, &scaled(&base, 0.9), ("base", "slow"), &metrics(), 0.05, 1).unwrap();
    assert_resolved(&base, &slow, Verdict::Regression);
    let fast = compare(&base, &scaled(&base, 1.1), ("base", "fast"), &metrics(), 0.05, 1).unwrap();
    assert_resolved(&base, &fast, Verdict::Improvement);
}

/// A report like `quiet.json` whose samples are `median × exp(N(0, 2%))`, seeded.
fn synthetic(factor: f64, seed: u64) -> Report {
    let mut r = load("quiet.json");
    let mut state = seed;
    let mut uniform = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    // Box–Muller.
    let mut normal = move || {
        let (u, v) = (uniform().max(1e-12), uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    };
    for x in &mut r.results {
        let mut gen =
            |s: &Stat, k: f64| Stat::of(&(0..10).map(|_| s.median() * k * (0.02 * normal()).exp()).collect::<Vec<_>>());
        x.decode.tokens_per_sec = gen(&x.decode.tokens_per_sec, factor);
        x.prefill.tokens_per_sec = gen(&x.prefill.tokens_per_sec, factor);
        x.prefill.ttft_ms = gen(&x.prefill.ttft_ms, 1.0 / factor);
    }
    r
}

#[test]
fn with_two_percent_noise_every_configuration_is_resolved() {
    let base = synthetic(1.0, 1);
    for (f, want) in [(0.9, Verdict::Regression), (1.1, Verdict::Improvement)] {
        let c = compare(&base, &synthetic(f, 2), ("base", "x"), &metrics(), 0.05, 1).unwrap();
        for p in &c.pairs {
            for m in &p.metrics {
                assert_eq!(m.verdict, want, "{f}: {:?} {m:?}", p.config);
            }
        }
    }
    // A/A with independent noise: nothing flagged.
    let c = compare(&base, &synthetic(1.0, 3), ("a", "a"), &metrics(), 0.05, 1).unwrap();
    assert_eq!((c.counts.regressions, c.counts.improvements), (0, 0), "{}", bitnet_diff::render::text(&c));
    // 2% slower at a 5% threshold: never a regression.
    let c = compare(&base, &synthetic(0.98, 4), ("a", "b"), &metrics(), 0.05, 1).unwrap();
    assert_eq!(c.counts.regressions, 0, "{}", bitnet_diff::render::text(&c));
}

#[test]
fn a_two_percent_change_is_never_a_regression_at_five_percent() {
    for base in [load("aa-a1.json"), load("aa-a2.json"), load("quiet.json")] {
        for f in [0.98, 1.02] {
            let c = compare(&base, &scaled(&base, f), ("base", "x"), &metrics(), 0.05, 1).unwrap();
            assert_eq!(c.counts.regressions, 0, "{f}: {}", bitnet_diff::render::text(&c));
            assert_eq!(c.counts.improvements, 0, "{f}");
        }
    }
    let c =
        compare(&load("aa-a1.json"), &scaled(&load("aa-a2.json"), 0.98), ("a1", "a2"), &metrics(), 0.05, 1).unwrap();
    assert_eq!(c.counts.regressions, 0, "{}", bitnet_diff::render::text(&c));
}

#[test]
fn the_output_is_deterministic_for_a_seed() {
    let (a, b) = (load("aa-a1.json"), load("aa-a2.json"));
    let one = bitnet_diff::render::json(&compare(&a, &b, ("a", "b"), &metrics(), 0.05, 9).unwrap());
    let two = bitnet_diff::render::json(&compare(&a, &b, ("a", "b"), &metrics(), 0.05, 9).unwrap());
    assert_eq!(one, two);
}

#[test]
fn one_sample_per_side_falls_back_to_a_plain_threshold() {
    let d = decide(&[100.0], &[90.0], Better::Higher, 0.05, 1);
    assert_eq!(
        (d.log_ci_low, d.log_ci_high, d.p_value, d.verdict),
        (d.log_change, d.log_change, None, Verdict::Regression)
    );
    assert!(d.note.unwrap().contains("plain threshold"));
    assert_eq!(decide(&[100.0], &[98.0], Better::Higher, 0.05, 1).verdict, Verdict::Unchanged);
    assert_eq!(decide(&[100.0], &[90.0], Better::Lower, 0.05, 1).verdict, Verdict::Improvement);
}

#[test]
fn noisy_small_samples_are_inconclusive_with_a_hint() {
    let base = [100.0, 80.0, 120.0];
    let new = [92.0, 70.0, 115.0];
    let d = decide(&base, &new, Better::Higher, 0.05, 1);
    assert_eq!(d.verdict, Verdict::Inconclusive);
    assert!(d.note.unwrap().contains("repetitions"), "a hint of how many runs would settle it");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Swapping BASE and NEW turns each regression into an improvement and back; unchanged
    /// and inconclusive stay what they are.
    #[test]
    fn swapping_sides_mirrors_the_verdict(
        a in prop::collection::vec(50.0f64..150.0, 1..12),
        b in prop::collection::vec(50.0f64..150.0, 1..12),
        higher in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let better = if higher { Better::Higher } else { Better::Lower };
        let ab = decide(&a, &b, better, 0.05, seed).verdict;
        let ba = decide(&b, &a, better, 0.05, seed).verdict;
        let mirrored = match ab {
            Verdict::Regression => Verdict::Improvement,
            Verdict::Improvement => Verdict::Regression,
            v => v,
        };
        prop_assert_eq!(ba, mirrored);
    }
}
