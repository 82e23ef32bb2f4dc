//! Summaries of repeated measurements, built from their samples and nothing else: the `Stat`
//! and `Latency` of the report, percentiles. Their fields are private and their JSON summary
//! fields are output only: loading a report recomputes them from `samples`.

use schemars::JsonSchema;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};

/// Statistics of one metric over its samples, with every raw sample kept (`bitnet-diff`
/// resamples them).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stat {
    /// Number of samples.
    n: usize,
    /// Arithmetic mean.
    mean: f64,
    /// Median (linear interpolation for an even count).
    median: f64,
    /// Sample standard deviation (n − 1 in the denominator; 0 for one sample).
    stddev: f64,
    /// Smallest and largest sample.
    min: f64,
    max: f64,
    /// 95% confidence interval of the mean (Student's t with n − 1 degrees of freedom);
    /// equal to the mean for one sample.
    ci95_low: f64,
    ci95_high: f64,
    /// Every sample, in measurement order: the figures above are recomputed from them when a
    /// report is read.
    samples: Vec<f64>,
}

/// The 0.975 quantiles of Student's t (the bounds of a two-sided 95% interval) for 1..=30
/// degrees of freedom.
const T975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
    2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
];

/// t quantile for a 95% interval with `df` degrees of freedom: the table up to 30, beyond it
/// the Cornish–Fisher expansion of t around the normal quantile in powers of 1/df, which is
/// within 10⁻⁵ there (a table by brackets had rounded t(31) = 2.040 down to 2.021).
pub fn t975(df: usize) -> f64 {
    match df {
        0 => f64::NAN,
        1..=30 => T975[df - 1],
        _ => {
            let (z, v) = (1.959_963_984_540_054_f64, df as f64);
            let g1 = (z.powi(3) + z) / 4.0;
            let g2 = (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / 96.0;
            let g3 = (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / 384.0;
            let g4 =
                (79.0 * z.powi(9) + 776.0 * z.powi(7) + 1482.0 * z.powi(5) - 1920.0 * z.powi(3) - 945.0 * z) / 92160.0;
            z + g1 / v + g2 / v.powi(2) + g3 / v.powi(3) + g4 / v.powi(4)
        }
    }
}

impl Stat {
    /// Statistics of `samples` (at least one, all finite).
    pub fn of(samples: &[f64]) -> Stat {
        assert!(!samples.is_empty(), "Stat::of needs at least one sample");
        let n = samples.len();
        let mean = samples.iter().sum::<f64>() / n as f64;
        let var = if n > 1 { samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64 } else { 0.0 };
        let stddev = var.sqrt();
        let half = if n > 1 { t975(n - 1) * stddev / (n as f64).sqrt() } else { 0.0 };
        Stat {
            n,
            mean,
            median: percentile(samples, 50.0),
            stddev,
            min: samples.iter().copied().fold(f64::INFINITY, f64::min),
            max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ci95_low: mean - half,
            ci95_high: mean + half,
            samples: samples.to_vec(),
        }
    }

    /// The same statistics over `self`'s samples followed by `other`'s.
    pub fn pooled(&self, other: &Stat) -> Stat {
        Stat::of(&[self.samples.as_slice(), &other.samples].concat())
    }

    /// Every sample with `f` applied, summarised again.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Stat {
        Stat::of(&self.samples.iter().map(|&v| f(v)).collect::<Vec<_>>())
    }

    pub fn n(&self) -> usize {
        self.n
    }
    pub fn mean(&self) -> f64 {
        self.mean
    }
    pub fn median(&self) -> f64 {
        self.median
    }
    pub fn stddev(&self) -> f64 {
        self.stddev
    }
    pub fn min(&self) -> f64 {
        self.min
    }
    pub fn max(&self) -> f64 {
        self.max
    }
    pub fn ci95_low(&self) -> f64 {
        self.ci95_low
    }
    pub fn ci95_high(&self) -> f64 {
        self.ci95_high
    }
    pub fn samples(&self) -> &[f64] {
        &self.samples
    }
}

/// The samples of a stored summary, checked: at least one, all finite.
fn checked_samples<E: serde::de::Error>(samples: Vec<f64>, what: &str) -> Result<Vec<f64>, E> {
    if samples.is_empty() {
        return Err(E::custom(format!("{what} needs at least one sample")));
    }
    if let Some(v) = samples.iter().find(|v| !v.is_finite()) {
        return Err(E::custom(format!("{what}: sample {v} is not finite")));
    }
    Ok(samples)
}

/// A `Stat` as stored: every field must be there (the schema says which type), but only the
/// samples are read.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredStat {
    n: IgnoredAny,
    mean: IgnoredAny,
    median: IgnoredAny,
    stddev: IgnoredAny,
    min: IgnoredAny,
    max: IgnoredAny,
    ci95_low: IgnoredAny,
    ci95_high: IgnoredAny,
    samples: Vec<f64>,
}

impl<'de> Deserialize<'de> for Stat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let stored = StoredStat::deserialize(d)?;
        Ok(Stat::of(&checked_samples::<D::Error>(stored.samples, "a statistic")?))
    }
}

/// Percentiles of step latencies, with every step's latency kept.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Percentiles (ms) of the step latencies, linear interpolation.
    p50: f64,
    p90: f64,
    p95: f64,
    p99: f64,
    /// Every step's latency, runs in order: the percentiles are recomputed from them when a
    /// report is read.
    samples: Vec<f64>,
}

impl Latency {
    /// Percentiles of `samples` (ms, at least one), which are kept.
    pub fn of(samples: Vec<f64>) -> Latency {
        assert!(!samples.is_empty(), "Latency::of needs at least one sample");
        Latency {
            p50: percentile(&samples, 50.0),
            p90: percentile(&samples, 90.0),
            p95: percentile(&samples, 95.0),
            p99: percentile(&samples, 99.0),
            samples,
        }
    }

    /// The same percentiles over `self`'s samples followed by `other`'s.
    pub fn pooled(&self, other: &Latency) -> Latency {
        Latency::of([self.samples.as_slice(), &other.samples].concat())
    }

    pub fn p50(&self) -> f64 {
        self.p50
    }
    pub fn p90(&self) -> f64 {
        self.p90
    }
    pub fn p95(&self) -> f64 {
        self.p95
    }
    pub fn p99(&self) -> f64 {
        self.p99
    }
    pub fn samples(&self) -> &[f64] {
        &self.samples
    }
}

/// A `Latency` as stored: as [`StoredStat`].
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredLatency {
    p50: IgnoredAny,
    p90: IgnoredAny,
    p95: IgnoredAny,
    p99: IgnoredAny,
    samples: Vec<f64>,
}

impl<'de> Deserialize<'de> for Latency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let stored = StoredLatency::deserialize(d)?;
        Ok(Latency::of(checked_samples::<D::Error>(stored.samples, "a latency")?))
    }
}

/// The `p`-th percentile (0..=100) with linear interpolation between closest ranks (numpy's
/// default); NaN for no samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (s.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
}

/// The median (the 50th percentile: the mean of the middle two for an even count).
pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_of_known_samples() {
        let s = Stat::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((s.n(), s.mean(), s.median(), s.min(), s.max()), (8, 5.0, 4.5, 2.0, 9.0));
        // Sample variance 32 / 7.
        assert!((s.stddev() - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        let half = 2.365 * s.stddev() / 8f64.sqrt();
        assert!((s.ci95_low() - (5.0 - half)).abs() < 1e-12 && (s.ci95_high() - (5.0 + half)).abs() < 1e-12);
        assert_eq!(s.samples().len(), 8);
    }

    #[test]
    fn t_quantiles_beyond_the_table_match_published_values() {
        // t(0.975, df) from standard tables (six decimals).
        for (df, t) in [(31, 2.039513), (40, 2.021075), (60, 2.000298), (120, 1.979930), (1000, 1.962339)] {
            assert!((t975(df) - t).abs() < 2e-6, "df {df}: {} vs {t}", t975(df));
        }
        // The expansion continues the table (t(30) = 2.042272) and keeps falling.
        assert!((t975(31) - 2.042).abs() < 3e-3 && t975(31) < t975(30));
        assert!((31..500).all(|df| t975(df + 1) < t975(df) && t975(df) > 1.959963));
        assert!(t975(0).is_nan());
    }

    #[test]
    fn one_sample_has_a_degenerate_interval() {
        let s = Stat::of(&[3.5]);
        assert_eq!((s.stddev(), s.ci95_low(), s.ci95_high(), s.median()), (0.0, 3.5, 3.5, 3.5));
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 5.5);
        assert!((percentile(&v, 90.0) - 9.1).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan() && median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    }

    #[test]
    fn stored_summaries_are_recomputed_from_the_samples() {
        // A summary that says something else than its samples (an edited or mis-merged file)
        // is read as the summary of the samples.
        let text = r#"{"n": 9, "mean": 1.0, "median": 1.0, "stddev": 0.0, "min": 1.0, "max": 1.0,
                       "ci95_low": 1.0, "ci95_high": 1.0, "samples": [2.0, 4.0, 9.0]}"#;
        let s: Stat = serde_json::from_str(text).unwrap();
        assert_eq!(s, Stat::of(&[2.0, 4.0, 9.0]));
        assert_eq!((s.n(), s.median(), s.max()), (3, 4.0, 9.0));
        let back: Stat = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let l: Latency =
            serde_json::from_str(r#"{"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "samples": [1.0, 3.0]}"#).unwrap();
        assert_eq!((l.p50(), l.p99()), (2.0, 1.0 + 2.0 * 0.99));
    }

    #[test]
    fn a_summary_without_samples_or_with_unknown_fields_is_refused() {
        let empty = r#"{"n": 0, "mean": 0, "median": 0, "stddev": 0, "min": 0, "max": 0, "ci95_low": 0, "ci95_high": 0, "samples": []}"#;
        let e = serde_json::from_str::<Stat>(empty).unwrap_err().to_string();
        assert!(e.contains("at least one sample"), "{e}");
        let e = serde_json::from_str::<Latency>(r#"{"p50": 0, "p90": 0, "p95": 0, "p99": 0, "samples": []}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least one sample"), "{e}");
        let missing = r#"{"n": 1, "samples": [1.0]}"#;
        assert!(serde_json::from_str::<Stat>(missing).unwrap_err().to_string().contains("missing field"));
        let extra = r#"{"p50": 0, "p90": 0, "p95": 0, "p99": 0, "samples": [1], "p999": 0}"#;
        assert!(serde_json::from_str::<Latency>(extra).unwrap_err().to_string().contains("unknown field"));
    }
}
