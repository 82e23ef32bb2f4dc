//! The statistics of the decision: a seeded bootstrap of the change in medians (on the log
//! scale, so swapping the two sides mirrors every figure exactly) and Welch's t-test.

/// SplitMix64, seeded from the data it resamples (see [`bootstrap_log_ratio`]).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A seed for one side's resampling, from the seed and that side's own samples — so each
/// side is resampled identically whichever argument it is, and the interval of B vs A is
/// exactly the mirror of A vs B.
fn side_seed(seed: u64, samples: &[f64]) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for v in samples {
        h = (h ^ v.to_bits()).wrapping_mul(0x100_0000_01b3);
    }
    h ^ samples.len() as u64
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// `ln(median(new) / median(base))` and its 95% percentile-bootstrap interval from
/// `resamples` resamples of each side (with replacement).
pub fn bootstrap_log_ratio(base: &[f64], new: &[f64], resamples: usize, seed: u64) -> (f64, f64, f64) {
    let point = median(new).ln() - median(base).ln();
    let (mut rb, mut rn) = (Rng(side_seed(seed, base)), Rng(side_seed(seed, new)));
    let mut buf_b = vec![0.0; base.len()];
    let mut buf_n = vec![0.0; new.len()];
    let mut d = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        for x in buf_b.iter_mut() {
            *x = base[rb.below(base.len())];
        }
        for x in buf_n.iter_mut() {
            *x = new[rn.below(new.len())];
        }
        d.push(median(&buf_n).ln() - median(&buf_b).ln());
    }
    d.sort_by(f64::total_cmp);
    // Nearest-rank percentiles at mirrored ranks, so the interval of the swapped comparison is
    // exactly the negated one (interpolation would differ in the last bit).
    let lo = ((d.len() - 1) as f64 * 0.025).round() as usize;
    (point, d[lo], d[d.len() - 1 - lo])
}

/// Welch's two-sided t-test: p-value for equal means of `a` and `b`.
pub fn welch_p(a: &[f64], b: &[f64]) -> f64 {
    let (na, nb) = (a.len() as f64, b.len() as f64);
    if na < 2.0 || nb < 2.0 {
        return f64::NAN;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let var = |v: &[f64], m: f64| v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0);
    let (ma, mb) = (mean(a), mean(b));
    let (va, vb) = (var(a, ma) / na, var(b, mb) / nb);
    let se2 = va + vb;
    if se2 == 0.0 {
        return if ma == mb { 1.0 } else { 0.0 };
    }
    let t = (ma - mb) / se2.sqrt();
    let df = se2 * se2 / (va * va / (na - 1.0) + vb * vb / (nb - 1.0));
    // Two-sided p = I_{df/(df+t²)}(df/2, 1/2).
    reg_inc_beta(df / 2.0, 0.5, df / (df + t * t))
}

/// ln Γ(x) (Lanczos, g = 7).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz).
pub fn reg_inc_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - reg_inc_beta(b, a, 1.0 - x);
    }
    let (tiny, eps) = (1e-300, 1e-15);
    let mut f = 1.0;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    d = if d.abs() < tiny { 1.0 / tiny } else { 1.0 / d };
    f *= d;
    for m in 1..500 {
        let m = m as f64;
        for num in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            d = if d.abs() < tiny { 1.0 / tiny } else { 1.0 / d };
            c = 1.0 + num / c;
            if c.abs() < tiny {
                c = tiny;
            }
            f *= c * d;
        }
        if (c * d - 1.0).abs() < eps {
            break;
        }
    }
    (ln_front.exp() * f / a).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_beta_matches_known_values() {
        // I_0.5(a, a) = 0.5; I_x(1, 1) = x; I_x(1, b) = 1 − (1 − x)^b.
        assert!((reg_inc_beta(3.0, 3.0, 0.5) - 0.5).abs() < 1e-12);
        assert!((reg_inc_beta(1.0, 1.0, 0.3) - 0.3).abs() < 1e-12);
        assert!((reg_inc_beta(1.0, 4.0, 0.2) - (1.0 - 0.8f64.powi(4))).abs() < 1e-12);
    }

    #[test]
    fn welch_matches_a_reference_computation() {
        // t = -2 with 8 degrees of freedom: two-sided p = 0.0805162 (numerical integration of
        // Student's t density).
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [3.0, 4.0, 5.0, 6.0, 7.0];
        let p = welch_p(&a, &b);
        assert!((p - 0.080_516).abs() < 1e-5, "p = {p}");
        assert_eq!(welch_p(&[2.0, 2.0], &[2.0, 2.0]), 1.0);
    }

    #[test]
    fn swapping_sides_mirrors_the_interval_exactly() {
        let a = [10.0, 10.5, 9.8, 10.2, 10.1];
        let b = [9.0, 9.3, 8.9, 9.1, 9.2, 9.05];
        let (p, lo, hi) = bootstrap_log_ratio(&a, &b, 2000, 7);
        let (q, lo2, hi2) = bootstrap_log_ratio(&b, &a, 2000, 7);
        assert_eq!((p, lo, hi), (-q, -hi2, -lo2));
        assert!(hi < 0.0 && lo < p && p < hi);
    }
}
