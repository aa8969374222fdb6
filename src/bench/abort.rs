//! The early-abort policy, evaluated as records arrive: stop a run once its success-rate floor
//! can no longer be reached, or once a latency limit is breached beyond reasonable doubt after a
//! minimum sample. The tuner uses it as its trial-level early stop, so a bad configuration costs
//! seconds instead of a full benchmark.
//!
//! A mean limit is breached when the lower one-sided confidence bound of the mean exceeds it; a
//! percentile limit `Pq ≤ L` is breached when the lower Wilson bound on the share of samples above
//! `L` exceeds `1 − q/100` (or when so many samples already exceed `L` that no later sample can
//! bring the percentile back under it).

use serde::{Deserialize, Serialize};

use super::metrics::Metric;
use super::record::{FailureKind, RequestRecord};

/// Which statistic of a metric a limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    Mean,
    Median,
    /// A percentile in (0, 100).
    P(f64),
}

impl Stat {
    pub fn parse(s: &str) -> Option<Stat> {
        match s.trim() {
            "mean" => Some(Stat::Mean),
            "median" | "p50" => Some(Stat::Median),
            p => p
                .strip_prefix('p')
                .and_then(|x| x.parse::<f64>().ok())
                .filter(|x| *x > 0.0 && *x < 100.0)
                .map(Stat::P),
        }
    }
    fn quantile(self) -> Option<f64> {
        match self {
            Stat::Mean => None,
            Stat::Median => Some(50.0),
            Stat::P(p) => Some(p),
        }
    }
    pub fn label(self) -> String {
        match self {
            Stat::Mean => "mean".into(),
            Stat::Median => "median".into(),
            Stat::P(p) => format!("p{p}"),
        }
    }
}

/// `METRIC:STAT:MS`, e.g. `tpot:mean:50` or `ttft:p99:2000`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyLimit {
    pub metric: Metric,
    pub stat: Stat,
    pub limit_ms: f64,
}

impl LatencyLimit {
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad = || {
            format!("invalid latency limit {s:?}: expected METRIC:STAT:MS such as tpot:mean:50 or ttft:p99:2000 (METRIC is ttft, tpot, itl or e2el; STAT is mean, median or pNN)")
        };
        if parts.len() != 3 {
            return Err(bad());
        }
        let metric = Metric::parse(parts[0]).ok_or_else(bad)?;
        let stat = Stat::parse(parts[1]).ok_or_else(bad)?;
        let limit_ms: f64 = parts[2].trim().parse().map_err(|_| bad())?;
        if !(limit_ms.is_finite() && limit_ms > 0.0) {
            return Err(bad());
        }
        Ok(LatencyLimit {
            metric,
            stat,
            limit_ms,
        })
    }
    pub fn describe(&self) -> String {
        format!(
            "{} {} ≤ {} ms",
            self.stat.label(),
            self.metric.key(),
            self.limit_ms
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbortPolicy {
    /// Abort once the success rate can no longer reach this floor (0..=1).
    pub min_success_rate: Option<f64>,
    pub limits: Vec<LatencyLimit>,
    /// Samples needed before a latency limit may abort the run.
    pub min_samples: usize,
    /// One-sided confidence for "beyond doubt", e.g. 0.99.
    pub confidence: f64,
}

impl Default for AbortPolicy {
    fn default() -> Self {
        AbortPolicy {
            min_success_rate: None,
            limits: Vec::new(),
            min_samples: 20,
            confidence: 0.99,
        }
    }
}

impl AbortPolicy {
    pub fn is_active(&self) -> bool {
        self.min_success_rate.is_some() || !self.limits.is_empty()
    }
}

/// Running state of the policy over one run of `total` requests.
pub struct AbortMonitor {
    policy: AbortPolicy,
    total: usize,
    failed: usize,
    samples: Vec<Vec<f64>>, // per limit, in ms
    z: f64,
}

impl AbortMonitor {
    pub fn new(policy: AbortPolicy, total: usize) -> Self {
        let z = normal_quantile(policy.confidence.clamp(0.5, 0.999_999));
        let samples = vec![Vec::new(); policy.limits.len()];
        AbortMonitor {
            policy,
            total,
            failed: 0,
            samples,
            z,
        }
    }

    /// Takes one finished request; returns the reason to abort, if any.
    pub fn observe(&mut self, r: &RequestRecord) -> Option<String> {
        if r.warmup || r.failure == Some(FailureKind::Aborted) {
            return None;
        }
        if !r.success {
            self.failed += 1;
            if let Some(floor) = self.policy.min_success_rate {
                let best = (self.total - self.failed.min(self.total)) as f64 / self.total as f64;
                if best < floor {
                    return Some(format!(
                        "success rate can no longer reach {:.1}%: {} of {} requests failed (at most {:.2}% possible)",
                        floor * 100.0,
                        self.failed,
                        self.total,
                        best * 100.0
                    ));
                }
            }
            return None;
        }
        for (i, lim) in self.policy.limits.iter().enumerate() {
            let s = &mut self.samples[i];
            match lim.metric {
                Metric::Ttft => s.push(r.ttft_s * 1000.0),
                Metric::E2el => s.push(r.latency_s * 1000.0),
                Metric::Tpot => {
                    if let Some(t) = r.tpot_s() {
                        s.push(t * 1000.0)
                    }
                }
                Metric::Itl => s.extend(r.itl_s.iter().map(|x| x * 1000.0)),
            }
            if let Some(reason) = breach(lim, s, self.policy.min_samples, self.z, self.total) {
                return Some(reason);
            }
        }
        None
    }
}

fn breach(
    lim: &LatencyLimit,
    s: &[f64],
    min_samples: usize,
    z: f64,
    total: usize,
) -> Option<String> {
    let n = s.len();
    if n < min_samples.max(2) {
        return None;
    }
    let nf = n as f64;
    match lim.stat.quantile() {
        None => {
            let mean = s.iter().sum::<f64>() / nf;
            let var = s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (nf - 1.0);
            let lower = mean - z * (var / nf).sqrt();
            (lower > lim.limit_ms).then(|| {
                format!(
                    "{} breached: mean {:.2} ms over {} samples, lower confidence bound {:.2} ms",
                    lim.describe(),
                    mean,
                    n,
                    lower
                )
            })
        }
        Some(q) => {
            let allowed = 1.0 - q / 100.0;
            let k = s.iter().filter(|&&x| x > lim.limit_ms).count();
            // Certain: for per-request metrics the final sample has `total` values at most.
            let certain = lim.metric != Metric::Itl && (k as f64) > allowed * total as f64 + 1.0;
            let lower = wilson_lower(k as f64, nf, z);
            (certain || lower > allowed).then(|| {
                format!(
                    "{} breached: {} of {} samples above {} ms (share ≥ {:.3} with confidence, allowed {:.3})",
                    lim.describe(),
                    k,
                    n,
                    lim.limit_ms,
                    lower,
                    allowed
                )
            })
        }
    }
}

/// Lower bound of the Wilson score interval for a binomial proportion.
fn wilson_lower(k: f64, n: f64, z: f64) -> f64 {
    let p = k / n;
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let margin = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - margin) / (1.0 + z2 / n)).max(0.0)
}

/// Inverse of the standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let pl = 0.024_25;
    if p < pl {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - pl {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -normal_quantile(1.0 - p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ttft_ms: f64) -> RequestRecord {
        RequestRecord {
            success: true,
            ttft_s: ttft_ms / 1000.0,
            latency_s: 1.0,
            output_tokens: 11,
            ..Default::default()
        }
    }

    fn failed() -> RequestRecord {
        RequestRecord {
            failure: Some(FailureKind::HttpStatus),
            ..Default::default()
        }
    }

    #[test]
    fn parses_limits_and_rejects_garbage() {
        let l = LatencyLimit::parse("ttft:p99:2000").unwrap();
        assert_eq!(l.metric, Metric::Ttft);
        assert_eq!(l.stat, Stat::P(99.0));
        assert_eq!(
            LatencyLimit::parse("tpot:mean:50").unwrap().stat,
            Stat::Mean
        );
        for bad in [
            "ttft:p99",
            "foo:mean:1",
            "ttft:p100:1",
            "ttft:mean:-1",
            "ttft:mean:x",
        ] {
            let e = LatencyLimit::parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn quantile_matches_known_values() {
        assert!((normal_quantile(0.99) - 2.326_347_874).abs() < 1e-6);
        assert!((normal_quantile(0.5)).abs() < 1e-9);
        assert!((normal_quantile(0.025) + 1.959_963_985).abs() < 1e-6);
    }

    #[test]
    fn success_floor_aborts_as_soon_as_unreachable() {
        let p = AbortPolicy {
            min_success_rate: Some(0.99),
            ..Default::default()
        };
        let mut m = AbortMonitor::new(p, 100);
        assert!(m.observe(&failed()).is_none(), "99/100 is still possible");
        let why = m.observe(&failed()).expect("98/100 < 99%");
        assert!(why.contains("2 of 100"), "{why}");
    }

    #[test]
    fn latency_limit_needs_a_minimum_sample_and_clear_evidence() {
        let p = AbortPolicy {
            limits: vec![LatencyLimit::parse("ttft:mean:100").unwrap()],
            min_samples: 10,
            ..Default::default()
        };
        let mut m = AbortMonitor::new(p.clone(), 1000);
        for _ in 0..9 {
            assert!(m.observe(&ok(500.0)).is_none(), "below the minimum sample");
        }
        assert!(m.observe(&ok(500.1)).is_some());
        // Values scattered around the limit never abort.
        let mut m = AbortMonitor::new(p, 1000);
        for i in 0..500 {
            let v = if i % 2 == 0 { 60.0 } else { 139.0 };
            assert!(m.observe(&ok(v)).is_none());
        }
    }

    #[test]
    fn percentile_limit_uses_exceedance_share() {
        let p = AbortPolicy {
            limits: vec![LatencyLimit::parse("ttft:p90:100").unwrap()],
            min_samples: 20,
            ..Default::default()
        };
        // 5% above the limit: P90 is fine.
        let mut m = AbortMonitor::new(p.clone(), 10_000);
        for i in 0..2000 {
            assert!(m
                .observe(&ok(if i % 20 == 0 { 300.0 } else { 50.0 }))
                .is_none());
        }
        // 50% above: breached beyond doubt quickly.
        let mut m = AbortMonitor::new(p, 10_000);
        let mut hit = None;
        for i in 0..200 {
            if let Some(w) = m.observe(&ok(if i % 2 == 0 { 300.0 } else { 50.0 })) {
                hit = Some((i, w));
                break;
            }
        }
        let (i, why) = hit.expect("should abort");
        assert!(i < 60, "aborted only after {i}");
        assert!(why.contains("p90 ttft"), "{why}");
    }
}
