//! The few statistics the tuner needs: the normal and Student's t distributions (from
//! `statrs`), and the confidence interval and one-sided p-value of a difference of means
//! (Welch), which `decide` uses to tell whether a candidate really beats the baseline.

use serde::{Deserialize, Serialize};
use statrs::distribution::ContinuousCDF;

/// Standard normal density.
pub fn pdf(z: f64) -> f64 {
    use statrs::distribution::Continuous;
    std_normal().pdf(z)
}

/// Standard normal distribution function.
pub fn cdf(z: f64) -> f64 {
    std_normal().cdf(z)
}

/// Inverse of the standard normal distribution function (the load generator's, one
/// definition for the crate).
use crate::bench::abort::normal_quantile;

fn std_normal() -> statrs::distribution::Normal {
    statrs::distribution::Normal::standard()
}

/// Student's t distribution function at `t` with `df` degrees of freedom (the normal one for
/// infinite or enormous `df`); NaN at a NaN `t` (statrs 0.18 panics there, in its incomplete
/// beta function).
pub fn t_cdf(t: f64, df: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    if t.is_infinite() {
        return if t > 0.0 { 1.0 } else { 0.0 };
    }
    match statrs::distribution::StudentsT::new(0.0, 1.0, df.max(1e-3)) {
        Ok(d) if df.is_finite() && df < 1e7 => d.cdf(t),
        _ => cdf(t),
    }
}

/// Student's t quantile `t_{p, df}` (the normal one for infinite or enormous `df`).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    match statrs::distribution::StudentsT::new(0.0, 1.0, df.max(1e-3)) {
        Ok(d) if df.is_finite() && df < 1e7 => d.inverse_cdf(p),
        _ => normal_quantile(p),
    }
}

/// Two-sided Student's t quantile for a 95% interval, `t_{0.975, df}`.
pub fn t95(df: f64) -> f64 {
    t_quantile(0.975, df)
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

fn nan() -> f64 {
    f64::NAN
}

/// A difference of means `a - b` with its 95% confidence interval, also as a percentage of `b`,
/// the Welch degrees of freedom and the one-sided p-value of "a is not above b".
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
    /// Welch–Satterthwaite degrees of freedom (NaN with one run on a side).
    #[serde(default = "nan", with = "nullable")]
    pub df: f64,
    /// One-sided p-value of the null hypothesis `mean(a) <= mean(b)` (NaN when unknown).
    #[serde(default = "nan", with = "nullable")]
    pub p_gain: f64,
}

impl Diff {
    /// Whether the 95% interval lies entirely above zero (an unknown bound is not). The
    /// recommendation itself uses `decide`, which corrects for the number of candidates.
    pub fn significant_gain(&self) -> bool {
        self.low > 0.0 && self.low.is_finite()
    }

    /// The relative change's bounds (percent of `b`) at one-sided level `alpha` on each side,
    /// i.e. the (1 − 2·alpha) interval: at `alpha` = 2.5% the stored 95% one. A decision taken
    /// at every look of a sequential design uses the design's level per look here
    /// (`decide::alpha_per_look`), not the 95% interval shown. Bounds that are unknown or
    /// exact (one run on a side, identical rounds) are the stored ones.
    pub fn pct_bounds(&self, alpha: f64) -> (f64, f64) {
        let t = t95(self.df);
        let half = (self.high - self.low) / 2.0;
        if !(self.df.is_finite()
            && half.is_finite()
            && half > 0.0
            && t > 0.0
            && alpha > 0.0
            && alpha < 0.5)
            || self.mean_b == 0.0
            || !self.mean_b.is_finite()
        {
            return (self.pct_low, self.pct_high);
        }
        let h = half / t * t_quantile(1.0 - alpha, self.df);
        let pct = |x: f64| 100.0 * x / self.mean_b;
        (pct(self.diff - h), pct(self.diff + h))
    }
}

/// Welch's interval for `mean(a) - mean(b)`. With one sample on a side its variance is unknown
/// and the interval is infinite.
pub fn welch(a: &[f64], b: &[f64]) -> Diff {
    welch_with_resolution(a, b, 0.0)
}

/// As `welch`, for values read with a finite `resolution` (the `max_rate` search finds a rate
/// to within a bracket): each value carries at least the variance of a uniform rounding error,
/// `resolution² / 12`, so identical rounds do not make a zero-width interval.
pub fn welch_with_resolution(a: &[f64], b: &[f64], resolution: f64) -> Diff {
    let (ma, sa, na) = mean_sd(a);
    let (mb, sb, nb) = mean_sd(b);
    let diff = ma - mb;
    let floor = if resolution.is_finite() && resolution > 0.0 {
        resolution * resolution / 12.0
    } else {
        0.0
    };
    let (low, high, df, p_gain) = if na < 2 || nb < 2 {
        (f64::NEG_INFINITY, f64::INFINITY, f64::NAN, f64::NAN)
    } else {
        let va = (sa * sa).max(floor) / na as f64;
        let vb = (sb * sb).max(floor) / nb as f64;
        let se = (va + vb).sqrt();
        if se == 0.0 {
            let p = if diff > 0.0 { 0.0 } else { 1.0 };
            (diff, diff, f64::INFINITY, p)
        } else {
            let df = (va + vb).powi(2)
                / (va * va / (na - 1) as f64 + vb * vb / (nb - 1) as f64).max(f64::MIN_POSITIVE);
            let h = t95(df) * se;
            (diff - h, diff + h, df, 1.0 - t_cdf(diff / se, df))
        }
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
        df,
        p_gain,
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
    fn t_quantiles_match_published_tables_and_tend_to_normal() {
        // Student's t tables: t_{0.975} at 4 and 11 degrees of freedom; 2.5% one-sided at 2.
        assert!((t95(4.0) - 2.776_445).abs() < 1e-5, "{}", t95(4.0));
        assert!((t95(11.0) - 2.200_985).abs() < 1e-5, "{}", t95(11.0));
        assert!((t95(1e9) - 1.959_964).abs() < 1e-5);
        assert!((t_cdf(4.302_653, 2.0) - 0.975).abs() < 1e-6);
        assert!((normal_quantile(0.99) - 2.326_348).abs() < 1e-6);
    }

    #[test]
    fn a_non_finite_measurement_gives_an_unknown_p_value_not_a_panic() {
        let d = welch(&[f64::NAN, 1.0], &[1.0, 2.0]);
        assert!(d.p_gain.is_nan() && d.mean_a.is_nan());
        let d = welch(&[f64::INFINITY, 1.0], &[1.0, 2.0]);
        assert!(!d.significant_gain());
        assert!(t_cdf(f64::NAN, 3.0).is_nan());
        assert_eq!(t_cdf(f64::INFINITY, 3.0), 1.0);
        assert_eq!(t_cdf(f64::NEG_INFINITY, 3.0), 0.0);
    }

    #[test]
    fn welch_p_value_is_one_sided_and_identical_rounds_with_a_resolution_are_not_certain() {
        let a = [10.0, 11.0, 11.0, 12.0];
        let b = [9.0, 10.0, 10.0, 11.0];
        let d = welch(&a, &b);
        // t = 1 / 0.57735 = 1.732 at 6 df: one-sided p = 0.0670.
        assert!((d.p_gain - 0.067).abs() < 1e-3, "{d:?}");
        assert!((d.df - 6.0).abs() < 1e-9);
        // max_rate rounds that all read 4.0 vs 2.83 (one bisection step apart): without the
        // resolution a zero-width interval; with it, a finite interval and a p-value above 0.
        let same = welch(&[4.0, 4.0, 4.0], &[2.83, 2.83, 2.83]);
        assert_eq!(same.low, same.high);
        let r = welch_with_resolution(&[4.0, 4.0, 4.0], &[2.83, 2.83, 2.83], 1.17);
        assert!(r.low < r.diff && r.p_gain > 0.0, "{r:?}");
    }

    #[test]
    fn bounds_at_a_level_per_look_widen_the_95_interval_by_the_t_quantiles_ratio() {
        let d = welch(&[110.0, 112.0, 108.0, 111.0], &[100.0, 101.0, 99.0, 100.5]);
        let (lo, hi) = d.pct_bounds(0.025);
        assert!((lo - d.pct_low).abs() < 1e-9 && (hi - d.pct_high).abs() < 1e-9);
        let (lo, hi) = d.pct_bounds(0.0110);
        let ratio = t_quantile(1.0 - 0.0110, d.df) / t95(d.df);
        assert!(ratio > 1.1, "{ratio}");
        assert!(
            (d.pct - lo - ratio * (d.pct - d.pct_low)).abs() < 1e-9,
            "{lo} {d:?}"
        );
        assert!(
            (hi - d.pct - ratio * (d.pct_high - d.pct)).abs() < 1e-9,
            "{hi} {d:?}"
        );
        // Unknown bounds stay unknown.
        let one = welch(&[110.0], &[100.0, 101.0]);
        assert_eq!(one.pct_bounds(0.0110), (one.pct_low, one.pct_high));
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
