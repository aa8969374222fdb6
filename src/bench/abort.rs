//! The early-abort policy, evaluated as records arrive: stop a run once its success-rate floor
//! can no longer be reached, or once a latency limit is breached beyond reasonable doubt after a
//! minimum sample. The tuner uses it as its trial-level early stop, so a bad configuration costs
//! seconds instead of a full benchmark.
//!
//! The unit of evidence is the request: a request's tokens share its batch and its neighbours,
//! so they are not independent samples. ITL is reported over every gap of the run (`vllm bench
//! serve` pools them: a long request weighs more than a short one), so an ITL limit is tested on
//! the pooled statistic, the ratio of the requests' sums (gaps in ms, or gaps above the limit)
//! to their gap counts, with the ratio estimator's variance over requests (the delta method);
//! every other metric has one value per request, and the same formulas reduce to the plain
//! mean. A mean limit is breached when the lower one-sided confidence bound of the mean exceeds
//! it; a percentile limit `Pq ≤ L` is breached when the
//! lower Wilson bound on the share of requests above `L` exceeds `1 − q/100` (or at once, when
//! so many already exceed `L` that no later request can bring the percentile back under it).
//! A look reads the requests in dispatch order, up to the first that has not finished: in
//! completion order the short requests come first, and their gaps would bias a mean. The tests
//! run at `LOOKS` planned points only (the first after a quarter of the run, two waves of the
//! concurrency and the minimum sample), each at the Bonferroni share of the error rate, so
//! that the stated confidence holds for the run as a whole.

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

/// How many times at most a latency limit is tested during one run. Testing after every
/// sample at a fixed confidence would raise the false-abort rate well above its nominal level
/// (repeated significance tests); the tests run at these planned looks only, each at the
/// Bonferroni level `(1 − confidence) / LOOKS`, so that the chance of a false abort over the
/// whole run stays below `1 − confidence`.
pub const LOOKS: usize = 8;

/// Running state of the policy over one run of `total` requests.
pub struct AbortMonitor {
    policy: AbortPolicy,
    total: usize,
    failed: usize,
    /// Per limit, one sample per request, at the request's index in the run (its dispatch
    /// order): (value, weight). The value is in ms with weight 1; for ITL, the sum over the
    /// request's gaps (of the gap in ms, or of 1 for a gap above the limit) with its gap count
    /// as the weight. `None`: not finished, failed, or no value (one output token).
    samples: Vec<Vec<Option<(f64, f64)>>>,
    /// Per limit, how many finished requests read above it (for the certain breach).
    above: Vec<usize>,
    /// Which requests have finished (in dispatch order).
    finished: Vec<bool>,
    /// The tests read the requests dispatched first, `0..prefix`, once every one of them has
    /// finished: dispatch order is independent of a request's length, completion order is not
    /// (short requests finish first, and a sample of the first completions would be a sample
    /// of the short requests).
    prefix: usize,
    /// Finished requests (of the prefix) between looks; the first look is after the minimum
    /// sample, a quarter of the run and two waves of the concurrency (the first burst starts
    /// all at once, and queues behind itself).
    step: usize,
    next_look: usize,
    z: f64,
}

impl AbortMonitor {
    pub fn new(policy: AbortPolicy, total: usize) -> Self {
        Self::with_concurrency(policy, total, None)
    }

    /// As `new`, for a run with at most `concurrency` requests in flight.
    pub fn with_concurrency(policy: AbortPolicy, total: usize, concurrency: Option<usize>) -> Self {
        let alpha = (1.0 - policy.confidence.clamp(0.5, 0.999_999)) / LOOKS as f64;
        let z = normal_quantile(1.0 - alpha);
        let samples = vec![vec![None; total]; policy.limits.len()];
        let above = vec![0; policy.limits.len()];
        let waves = concurrency.map_or(0, |c| 2 * c);
        let first_look = policy.min_samples.max(2).max(total.div_ceil(4)).max(waves);
        let step = (total.saturating_sub(first_look))
            .div_ceil(LOOKS - 1)
            .max(1);
        AbortMonitor {
            policy,
            total,
            failed: 0,
            samples,
            above,
            finished: vec![false; total],
            prefix: 0,
            step,
            next_look: first_look,
            z,
        }
    }

    /// Takes one finished request; returns the reason to abort, if any.
    pub fn observe(&mut self, r: &RequestRecord) -> Option<String> {
        if r.warmup || r.failure == Some(FailureKind::Aborted) {
            return None;
        }
        if r.index >= self.finished.len() {
            // More records than planned (never from `bench::run`): room for them.
            self.finished.resize(r.index + 1, false);
            for s in &mut self.samples {
                s.resize(r.index + 1, None);
            }
        }
        self.finished[r.index] = true;
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
        } else {
            for (i, lim) in self.policy.limits.iter().enumerate() {
                // One sample per request (see the module's header).
                let v = match lim.metric {
                    Metric::Ttft => Some((r.ttft_s * 1000.0, 1.0)),
                    Metric::E2el => Some((r.latency_s * 1000.0, 1.0)),
                    Metric::Tpot => r.tpot_s().map(|t| (t * 1000.0, 1.0)),
                    Metric::Itl if r.itl_s.is_empty() => None,
                    Metric::Itl => {
                        let n = r.itl_s.len() as f64;
                        Some(match lim.stat.quantile() {
                            None => (r.itl_s.iter().sum::<f64>() * 1000.0, n),
                            Some(_) => (
                                r.itl_s
                                    .iter()
                                    .filter(|x| **x * 1000.0 > lim.limit_ms)
                                    .count() as f64,
                                n,
                            ),
                        })
                    }
                };
                if let Some((x, _)) = v {
                    if x > lim.limit_ms {
                        self.above[i] += 1;
                    }
                }
                self.samples[i][r.index] = v;
                // A per-request percentile limit can be breached for certain at any time.
                if let Some(reason) = certain_breach(lim, self.above[i], self.total) {
                    return Some(reason);
                }
            }
        }
        while self.prefix < self.finished.len() && self.finished[self.prefix] {
            self.prefix += 1;
        }
        if self.prefix < self.next_look {
            return None;
        }
        self.next_look = self.prefix + self.step;
        for (i, lim) in self.policy.limits.iter().enumerate() {
            let s: Vec<(f64, f64)> = self.samples[i][..self.prefix]
                .iter()
                .flatten()
                .copied()
                .collect();
            if let Some(reason) = breach(lim, &s, self.z) {
                return Some(reason);
            }
        }
        None
    }
}

/// A per-request percentile limit `Pq ≤ L` is breached for certain once more than
/// `(1 − q/100) · total + 1` requests exceed `L`: no later sample can bring it back.
fn certain_breach(lim: &LatencyLimit, k: usize, total: usize) -> Option<String> {
    let q = lim.stat.quantile()?;
    if lim.metric == Metric::Itl {
        return None;
    }
    let allowed = 1.0 - q / 100.0;
    ((k as f64) > allowed * total as f64 + 1.0).then(|| {
        format!(
            "{} breached: {k} of {total} requests above {} ms already (at most {:.0} allowed)",
            lim.describe(),
            lim.limit_ms,
            allowed * total as f64
        )
    })
}

/// The pooled mean `Σy / Σw` of `(y, w)` samples and its lower one-sided bound at `z`. The
/// variance is the ratio estimator's (delta method): the residuals `y − R·w` over the
/// requests, scaled by the mean weight; with every weight 1 it is the plain mean's.
fn mean_lower(s: &[(f64, f64)], z: f64) -> (f64, f64) {
    let nf = s.len() as f64;
    let (sy, sw) = s.iter().fold((0.0, 0.0), |(a, b), (y, w)| (a + y, b + w));
    let ratio = sy / sw;
    let wbar = sw / nf;
    let var = s
        .iter()
        .map(|(y, w)| (y - ratio * w) * (y - ratio * w))
        .sum::<f64>()
        / (nf - 1.0);
    (ratio, ratio - z * (var / nf).sqrt() / wbar)
}

fn breach(lim: &LatencyLimit, s: &[(f64, f64)], z: f64) -> Option<String> {
    let n = s.len();
    if n < 2 {
        return None;
    }
    let nf = n as f64;
    match (lim.stat.quantile(), lim.metric) {
        (None, _) => {
            let (mean, lower) = mean_lower(s, z);
            (lower > lim.limit_ms).then(|| {
                format!(
                    "{} breached: mean {:.2} ms over {} requests, lower confidence bound {:.2} ms",
                    lim.describe(),
                    mean,
                    n,
                    lower
                )
            })
        }
        (Some(q), Metric::Itl) => {
            // The pooled share of gaps above the limit, as the run's percentile counts them.
            let allowed = 1.0 - q / 100.0;
            let (mean, lower) = mean_lower(s, z);
            (lower > allowed).then(|| {
                format!(
                    "{} breached: {:.3} of the gaps above {} ms over {} requests (share ≥ {:.3} with confidence, allowed {:.3})",
                    lim.describe(),
                    mean,
                    lim.limit_ms,
                    n,
                    lower,
                    allowed
                )
            })
        }
        (Some(q), _) => {
            let allowed = 1.0 - q / 100.0;
            let k = s.iter().filter(|&&(x, _)| x > lim.limit_ms).count();
            let lower = wilson_lower(k as f64, nf, z);
            (lower > allowed).then(|| {
                format!(
                    "{} breached: {} of {} requests above {} ms (share ≥ {:.3} with confidence, allowed {:.3})",
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

/// The Wilson score interval (lower, upper) for a binomial proportion of `k` in `n`.
pub fn wilson(k: f64, n: f64, z: f64) -> (f64, f64) {
    let p = k / n;
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let margin = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    let d = 1.0 + z2 / n;
    (
        ((centre - margin) / d).max(0.0),
        ((centre + margin) / d).min(1.0),
    )
}

/// Lower bound of the Wilson score interval for a binomial proportion.
fn wilson_lower(k: f64, n: f64, z: f64) -> f64 {
    wilson(k, n, z).0
}

/// Inverse of the standard normal distribution function.
pub fn normal_quantile(p: f64) -> f64 {
    use statrs::distribution::ContinuousCDF;
    statrs::distribution::Normal::standard().inverse_cdf(p.clamp(1e-300, 1.0 - 1e-16))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A monitor fed records in dispatch order (each record's index is set to its position).
    struct Feed {
        m: AbortMonitor,
        n: usize,
    }

    impl Feed {
        fn from(m: AbortMonitor) -> Self {
            Feed { m, n: 0 }
        }

        fn observe(&mut self, r: &RequestRecord) -> Option<String> {
            let r = RequestRecord {
                index: self.n,
                ..r.clone()
            };
            self.n += 1;
            self.m.observe(&r)
        }
    }

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
        let mut m = Feed::from(AbortMonitor::new(p, 100));
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
        // 40 requests: the first look is at max(10 samples, a quarter of the run).
        let mut m = Feed::from(AbortMonitor::new(p.clone(), 40));
        for _ in 0..9 {
            assert!(m.observe(&ok(500.0)).is_none(), "below the minimum sample");
        }
        assert!(m.observe(&ok(500.1)).is_some());
        // Values scattered around the limit never abort.
        let mut m = Feed::from(AbortMonitor::new(p, 1000));
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
        let mut m = Feed::from(AbortMonitor::new(p.clone(), 10_000));
        for i in 0..2000 {
            assert!(m
                .observe(&ok(if i % 20 == 0 { 300.0 } else { 50.0 }))
                .is_none());
        }
        // 50% above: breached beyond doubt at the first look (a quarter of 200).
        let mut m = Feed::from(AbortMonitor::new(p, 200));
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

    fn tpot_record(tpot_ms: f64) -> RequestRecord {
        RequestRecord {
            success: true,
            ttft_s: 0.1,
            latency_s: 0.1 + tpot_ms * 127.0 / 1000.0,
            output_tokens: 128,
            server_output_tokens: Some(128),
            ..Default::default()
        }
    }

    /// The rule this module replaced: a test after every sample from the 20th on, at a fixed
    /// one-sided 99% (kept here to show the simulation can tell the two apart).
    fn naive_aborts(samples: &[f64], limit: f64) -> bool {
        let z = normal_quantile(0.99);
        let samples: Vec<(f64, f64)> = samples.iter().map(|x| (*x, 1.0)).collect();
        (20..=samples.len()).any(|n| {
            let (_, lower) = mean_lower(&samples[..n], z);
            lower > limit
        })
    }

    #[test]
    fn false_abort_rate_at_the_limit_stays_within_the_stated_confidence() {
        use rand::SeedableRng;
        use rand_distr::Distribution;
        // Requests whose TPOT has a mean exactly at the limit: the run meets `mean ≤ 50 ms`
        // on average, so every abort is a false one. The stated confidence is 99%.
        let limit: f64 = 50.0;
        let sigma: f64 = 0.5;
        let mu = limit.ln() - sigma * sigma / 2.0;
        let dist = rand_distr::LogNormal::new(mu, sigma).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let runs = 3000;
        let (mut ours, mut naive) = (0, 0);
        for _ in 0..runs {
            let xs: Vec<f64> = (0..200).map(|_| dist.sample(&mut rng)).collect();
            let p = AbortPolicy {
                limits: vec![LatencyLimit::parse("tpot:mean:50").unwrap()],
                ..Default::default()
            };
            let mut m = Feed::from(AbortMonitor::with_concurrency(p, 200, Some(16)));
            if xs.iter().any(|x| m.observe(&tpot_record(*x)).is_some()) {
                ours += 1;
            }
            if naive_aborts(&xs, limit) {
                naive += 1;
            }
        }
        let (ours, naive) = (ours as f64 / runs as f64, naive as f64 / runs as f64);
        // 3 standard errors of a 1% rate over 3000 runs is 0.55%.
        assert!(ours <= 0.0155, "false aborts {:.2}% > 1%", 100.0 * ours);
        assert!(
            naive > 2.0 * ours.max(0.005),
            "the repeated fixed-z test should abort falsely far more often: {:.2}% vs {:.2}%",
            100.0 * naive,
            100.0 * ours
        );
    }

    #[test]
    fn itl_counts_requests_not_tokens() {
        use rand::SeedableRng;
        use rand_distr::Distribution;
        // Each request runs at its own pace (its batch), around 90% of the ITL limit: the run
        // meets `mean ITL ≤ 20 ms`. One slow request has 127 tight gaps above the limit; as
        // 127 independent samples it would look like certain evidence.
        let dist = rand_distr::LogNormal::new((18.0f64).ln(), 0.3).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let runs = 1000;
        let mut aborts = 0;
        for _ in 0..runs {
            let p = AbortPolicy {
                limits: vec![LatencyLimit::parse("itl:mean:20").unwrap()],
                ..Default::default()
            };
            let mut m = Feed::from(AbortMonitor::with_concurrency(p, 100, Some(8)));
            let hit = (0..100).any(|_| {
                let pace: f64 = dist.sample(&mut rng) / 1000.0;
                let r = RequestRecord {
                    success: true,
                    itl_s: vec![pace; 127],
                    ..Default::default()
                };
                m.observe(&r).is_some()
            });
            if hit {
                aborts += 1;
            }
        }
        assert!(aborts <= 20, "{aborts} false aborts in {runs} runs");
        // A clearly slow engine (every request 50% over the limit) is still caught.
        let p = AbortPolicy {
            limits: vec![LatencyLimit::parse("itl:mean:20").unwrap()],
            ..Default::default()
        };
        let mut m = Feed::from(AbortMonitor::with_concurrency(p, 100, Some(8)));
        let at = (0..100).position(|i| {
            let r = RequestRecord {
                success: true,
                itl_s: vec![0.030 + 0.001 * (i % 3) as f64; 127],
                ..Default::default()
            };
            m.observe(&r).is_some()
        });
        assert_eq!(at, Some(24), "the first look is at a quarter of the run");
    }

    /// A closed-loop run of `n` requests at concurrency `c`: half short (16 gaps) at `short_ms`
    /// per gap, half long (256 gaps) at `long_ms`, each request at its own pace around them, in
    /// a random dispatch order; the records come back in completion order (short ones first).
    fn mixed_run(
        rng: &mut rand::rngs::StdRng,
        n: usize,
        c: usize,
        short_ms: f64,
        long_ms: f64,
    ) -> Vec<RequestRecord> {
        use rand::Rng;
        use rand_distr::Distribution;
        let jitter = rand_distr::LogNormal::new(0.0, 0.15).unwrap();
        let mut free = vec![0.0f64; c];
        let mut done: Vec<(f64, RequestRecord)> = (0..n)
            .map(|index| {
                let (gaps, ms) = if rng.random_bool(0.5) {
                    (16, short_ms)
                } else {
                    (256, long_ms)
                };
                let pace = ms * jitter.sample(rng) / 1000.0;
                let slot = (0..c).min_by(|a, b| free[*a].total_cmp(&free[*b])).unwrap();
                free[slot] += pace * gaps as f64;
                let r = RequestRecord {
                    index,
                    success: true,
                    itl_s: vec![pace; gaps],
                    ..Default::default()
                };
                (free[slot], r)
            })
            .collect();
        done.sort_by(|a, b| a.0.total_cmp(&b.0));
        done.into_iter().map(|(_, r)| r).collect()
    }

    #[test]
    fn itl_limit_tests_the_pooled_gaps_in_dispatch_order() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let policy = AbortPolicy {
            limits: vec![LatencyLimit::parse("itl:mean:20").unwrap()],
            ..Default::default()
        };
        let aborts = |rng: &mut rand::rngs::StdRng, short_ms, long_ms| {
            let runs = 400;
            let mut hits = 0;
            let mut per_request = 0.0;
            for _ in 0..runs {
                let run = mixed_run(rng, 200, 8, short_ms, long_ms);
                per_request += run
                    .iter()
                    .map(|r| r.itl_s.iter().sum::<f64>() / r.itl_s.len() as f64)
                    .sum::<f64>()
                    * 1000.0
                    / run.len() as f64
                    / runs as f64;
                let mut m = AbortMonitor::with_concurrency(policy.clone(), 200, Some(8));
                if run.iter().any(|r| m.observe(r).is_some()) {
                    hits += 1;
                }
            }
            (hits as f64 / runs as f64, per_request)
        };
        // Slow short requests, fast long ones: the run's mean ITL over its gaps is about
        // 18.5 ms (it meets the limit), the mean of the requests' means about 22 ms, and the
        // first completions are the short ones at 26 ms. Neither may make it abort.
        let (rate, per_request) = aborts(&mut rng, 26.0, 18.0);
        assert!(
            per_request > 21.0,
            "the per-request mean {per_request:.1} ms"
        );
        assert!(
            rate <= 0.02,
            "false aborts in {:.1}% of the runs",
            100.0 * rate
        );
        // The reverse: fast short requests hide slow long ones (22.5 ms over the gaps, 18.5 ms
        // per request): the limit is breached and the run is stopped.
        let (rate, per_request) = aborts(&mut rng, 14.0, 23.0);
        assert!(
            per_request < 19.0,
            "the per-request mean {per_request:.1} ms"
        );
        assert!(
            rate >= 0.95,
            "breach caught in only {:.1}% of the runs",
            100.0 * rate
        );
    }
}
