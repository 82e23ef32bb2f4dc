//! Summary statistics of repeated measurements: the `Stat` of the report, percentiles.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Statistics of one metric over its samples, with every raw sample kept (`bitnet-diff`
/// resamples them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stat {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median (linear interpolation for an even count).
    pub median: f64,
    /// Sample standard deviation (n − 1 in the denominator; 0 for one sample).
    pub stddev: f64,
    /// Smallest and largest sample.
    pub min: f64,
    pub max: f64,
    /// 95% confidence interval of the mean (Student's t with n − 1 degrees of freedom);
    /// equal to the mean for one sample.
    pub ci95_low: f64,
    pub ci95_high: f64,
    /// Every sample, in measurement order.
    pub samples: Vec<f64>,
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
}

/// The `p`-th percentile (0..=100) with linear interpolation between closest ranks (numpy's
/// default).
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (s.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_of_known_samples() {
        let s = Stat::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((s.n, s.mean, s.median, s.min, s.max), (8, 5.0, 4.5, 2.0, 9.0));
        // Sample variance 32 / 7.
        assert!((s.stddev - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        let half = 2.365 * s.stddev / 8f64.sqrt();
        assert!((s.ci95_low - (5.0 - half)).abs() < 1e-12 && (s.ci95_high - (5.0 + half)).abs() < 1e-12);
        assert_eq!(s.samples.len(), 8);
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
        assert_eq!((s.stddev, s.ci95_low, s.ci95_high, s.median), (0.0, 3.5, 3.5, 3.5));
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 5.5);
        assert!((percentile(&v, 90.0) - 9.1).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
    }
}
