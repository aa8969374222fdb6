//! The few statistics the tuner needs: the normal distribution, Student's t quantiles and the
//! confidence interval of a difference of means (Welch), used to decide whether a candidate
//! really beats the baseline.

use serde::{Deserialize, Serialize};

/// Standard normal density.
pub fn pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Standard normal distribution function (erfc by Numerical Recipes' Chebyshev fit, relative
/// error below 1.2e-7 everywhere).
pub fn cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Two-sided Student's t quantile `t_{1-alpha/2, df}` for a 95% interval, from the table (exact
/// to three decimals) with the normal value beyond 120 degrees of freedom.
pub fn t95(df: f64) -> f64 {
    const TABLE: &[(f64, f64)] = &[
        (1.0, 12.706),
        (2.0, 4.303),
        (3.0, 3.182),
        (4.0, 2.776),
        (5.0, 2.571),
        (6.0, 2.447),
        (7.0, 2.365),
        (8.0, 2.306),
        (9.0, 2.262),
        (10.0, 2.228),
        (12.0, 2.179),
        (15.0, 2.131),
        (20.0, 2.086),
        (25.0, 2.060),
        (30.0, 2.042),
        (40.0, 2.021),
        (60.0, 2.000),
        (120.0, 1.980),
    ];
    if !df.is_finite() || df > 120.0 {
        return 1.960;
    }
    let df = df.max(1.0);
    for w in TABLE.windows(2) {
        let ((d0, t0), (d1, t1)) = (w[0], w[1]);
        if df <= d1 {
            // Interpolate in 1/df, in which t is close to linear.
            let f = (1.0 / d0 - 1.0 / df) / (1.0 / d0 - 1.0 / d1);
            return t0 + f * (t1 - t0);
        }
    }
    1.980
}

/// Mean, sample standard deviation and count.
pub fn mean_sd(xs: &[f64]) -> (f64, f64, usize) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, 0);
    }
    let m = xs.iter().sum::<f64>() / n as f64;
    let sd = if n > 1 {
        (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        f64::NAN
    };
    (m, sd, n)
}

/// JSON has no NaN or infinity: such a value is stored as `null` and read back as NaN (an
/// unknown interval bound), so that a record holding one can always be read again.
pub mod nullable {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() {
            s.serialize_f64(*x)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// Mean and the half width of its 95% t interval (infinite with fewer than two values);
/// `None` for no values.
pub fn mean_interval(xs: &[f64]) -> Option<(f64, f64)> {
    let (m, sd, n) = mean_sd(xs);
    if n == 0 {
        return None;
    }
    let h = if n > 1 && sd.is_finite() {
        t95((n - 1) as f64) * sd / (n as f64).sqrt()
    } else {
        f64::INFINITY
    };
    Some((m, h))
}

/// A difference of means `a - b` with its 95% confidence interval, also as a percentage of `b`.
/// A bound that is unknown (one run on a side) reads as NaN after a round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    #[serde(with = "nullable")]
    pub mean_a: f64,
    #[serde(with = "nullable")]
    pub mean_b: f64,
    #[serde(with = "nullable")]
    pub diff: f64,
    #[serde(with = "nullable")]
    pub low: f64,
    #[serde(with = "nullable")]
    pub high: f64,
    #[serde(with = "nullable")]
    pub pct: f64,
    #[serde(with = "nullable")]
    pub pct_low: f64,
    #[serde(with = "nullable")]
    pub pct_high: f64,
    pub n_a: usize,
    pub n_b: usize,
}

impl Diff {
    /// Whether the interval lies entirely above zero (an unknown bound is not).
    pub fn significant_gain(&self) -> bool {
        self.low > 0.0 && self.low.is_finite()
    }
    /// Whether the interval lies entirely below zero.
    pub fn significant_loss(&self) -> bool {
        self.high < 0.0
    }
}

/// Welch's interval for `mean(a) - mean(b)`. With one sample on a side its variance is unknown
/// and the interval is infinite.
pub fn welch(a: &[f64], b: &[f64]) -> Diff {
    let (ma, sa, na) = mean_sd(a);
    let (mb, sb, nb) = mean_sd(b);
    let diff = ma - mb;
    let (low, high) = if na < 2 || nb < 2 {
        (f64::NEG_INFINITY, f64::INFINITY)
    } else {
        let va = sa * sa / na as f64;
        let vb = sb * sb / nb as f64;
        let se = (va + vb).sqrt();
        let df = if se == 0.0 {
            f64::INFINITY
        } else {
            (va + vb).powi(2)
                / (va * va / (na - 1) as f64 + vb * vb / (nb - 1) as f64).max(f64::MIN_POSITIVE)
        };
        let h = t95(df) * se;
        (diff - h, diff + h)
    };
    let pct = |x: f64| if mb != 0.0 { 100.0 * x / mb } else { f64::NAN };
    Diff {
        mean_a: ma,
        mean_b: mb,
        diff,
        low,
        high,
        pct: pct(diff),
        pct_low: pct(low),
        pct_high: pct(high),
        n_a: na,
        n_b: nb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_cdf_matches_known_values() {
        assert!((cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((cdf(1.959_964) - 0.975).abs() < 1e-6);
        assert!((cdf(-1.0) - 0.158_655_25).abs() < 1e-6);
    }

    #[test]
    fn t_quantiles_match_the_table_and_tend_to_normal() {
        assert!((t95(4.0) - 2.776).abs() < 1e-9);
        assert!((t95(11.0) - 2.201).abs() < 0.005, "{}", t95(11.0));
        assert!((t95(1e6) - 1.96).abs() < 1e-9);
    }

    #[test]
    fn welch_interval_matches_a_hand_computation() {
        // a: mean 11, sd 1; b: mean 10, sd 1; n = 4 each → se = 0.7071, df = 6, t = 2.447.
        let a = [10.0, 11.0, 11.0, 12.0];
        let b = [9.0, 10.0, 10.0, 11.0];
        let d = welch(&a, &b);
        let sd = (2.0f64 / 3.0).sqrt();
        let se = (2.0 * sd * sd / 4.0).sqrt();
        assert!((d.diff - 1.0).abs() < 1e-12);
        assert!((d.low - (1.0 - 2.447 * se)).abs() < 1e-3, "{d:?}");
        assert!(!d.significant_gain(), "{d:?}");
        let far = welch(&[20.0, 21.0, 20.5], &b);
        assert!(far.significant_gain() && far.pct > 90.0);
        let one = welch(&[1.0], &b);
        assert!(one.low.is_infinite() && !one.significant_gain());
        // A stored interval with unknown bounds reads back (as NaN), instead of failing.
        let back: Diff = serde_json::from_str(&serde_json::to_string(&one).unwrap()).unwrap();
        assert!(back.low.is_nan() && back.mean_b == one.mean_b);
    }
}
