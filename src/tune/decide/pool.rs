//! An arm's rounds pooled: which of its runs count (measured, failed, disturbed by other
//! processes, or failed in a round in which the defaults failed too: the machine's), the
//! objective in one unit for every run of a comparison, whether the pooled rounds miss the
//! constraints (and whether the defaults miss them beyond doubt), and Holm's adjustment.

use super::Rules;
use crate::bench::abort::LatencyLimit;
use crate::tune::eval::{Measurement, TrialFailure};
use crate::tune::records::{TrialKind, TrialRecord, TrialStatus};
use crate::tune::spec::ObjectiveMetric;

/// One arm's rounds on one workload.
pub(super) struct Runs<'a> {
    pub(super) measured: Vec<&'a Measurement>,
    pub(super) failed: Vec<(u32, &'a TrialFailure)>,
    /// Rounds set aside: `(trial, foreign cores)`.
    pub(super) disturbed: Vec<(u32, f64)>,
    /// Failed runs set aside as the machine's (trials): on the primary workload, a round in
    /// which the defaults failed too (they ran in the search, so the machine, not the
    /// configuration, is the likelier cause: memory not yet released, a port taken).
    pub(super) machine: Vec<u32>,
}

impl Runs<'_> {
    /// Whether any round of this arm was set aside, for foreign load or as the machine's.
    pub(super) fn any_set_aside(&self) -> bool {
        !self.disturbed.is_empty() || !self.machine.is_empty()
    }
}

pub(super) fn runs<'a>(
    rules: &Rules,
    trials: &'a [TrialRecord],
    workloads: &[String],
    wi: usize,
    (base, arm): (u32, u32),
) -> Runs<'a> {
    let mut out = Runs {
        measured: Vec::new(),
        failed: Vec::new(),
        disturbed: Vec::new(),
        machine: Vec::new(),
    };
    // The primary workload's rounds in which the defaults' run failed.
    let machine_rounds: Vec<u32> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Failed)
        .filter_map(|t| match &t.kind {
            TrialKind::Remeasure { candidate, round } if wi == 0 && *candidate == base => {
                Some(*round)
            }
            _ => None,
        })
        .collect();
    for t in trials {
        let mine = match &t.kind {
            TrialKind::Remeasure { candidate, .. } => wi == 0 && *candidate == arm,
            TrialKind::Validate {
                workload,
                candidate,
                ..
            } => wi > 0 && *candidate == arm && Some(workload) == workloads.get(wi),
            TrialKind::Search => false,
        };
        if !mine {
            continue;
        }
        match t.status {
            TrialStatus::Running => {}
            TrialStatus::Failed => match (&t.kind, &t.failure) {
                (TrialKind::Remeasure { round, .. }, _) if machine_rounds.contains(round) => {
                    out.machine.push(t.seq);
                }
                (_, Some(f)) => out.failed.push((t.seq, f)),
                (_, None) => {}
            },
            TrialStatus::Ok | TrialStatus::Infeasible => match &t.full {
                Some(m) if m.disturbed(rules.max_foreign_cores) => out
                    .disturbed
                    .push((t.seq, m.foreign_cores.unwrap_or(f64::NAN))),
                Some(m) => out.measured.push(m),
                None => {}
            },
        }
    }
    out
}

/// The failure classes in which the engine refuses the configuration, proved by its log:
/// out of memory, unsupported by the hardware, a flag it rejects. Anything else (a crash, a
/// hang, a start-up timeout, a taken port) may be the machine's.
pub const REFUSALS: [&str; 3] = ["oom", "unsupported", "bad_flag"];

/// Whether a failure is the engine refusing the configuration (`REFUSALS`).
pub fn refused(f: &TrialFailure) -> bool {
    REFUSALS.contains(&f.class.as_str())
}

/// Whether a search trial's engine refused to start it (a refusal its log proves, with no
/// measurement): such defaults are not re-measured, there is nothing to measure. Defaults that
/// failed otherwise are re-measured like any arm (their rounds tell).
pub fn failed_to_start(t: &TrialRecord) -> bool {
    t.status == TrialStatus::Failed
        && t.screen.is_none()
        && t.full.is_none()
        && t.failure.as_ref().is_some_and(refused)
}

/// The value a run shows for the objective: the objective where the run measured it; a
/// validation workload without `--goodput` shows request throughput instead of goodput, and
/// tokens per joule falls back to output throughput where no energy was read. For one run's
/// progress line; a comparison uses `comparable`, which keeps one unit for all its runs.
pub fn value_of(metric: ObjectiveMetric, m: &Measurement) -> Option<f64> {
    m.objective(metric).or_else(|| fallback_of(metric, m))
}

/// What a run is compared on when the objective cannot be measured (see `value_of`).
pub(super) fn fallback_of(metric: ObjectiveMetric, m: &Measurement) -> Option<f64> {
    match metric {
        ObjectiveMetric::RequestGoodput => Some(m.request_throughput),
        ObjectiveMetric::TokensPerJoule => Some(m.output_throughput),
        _ => None,
    }
}

/// Whether a comparison of these runs must use the fallback: one of them could not measure
/// the objective, and mixing units (tokens per joule with tokens per second) would be no
/// comparison at all, so then every run is compared on the fallback.
/// (A metric with no fallback drops the runs that could not measure it.)
pub fn needs_fallback(metric: ObjectiveMetric, runs: &[&[&Measurement]]) -> bool {
    runs.iter()
        .flat_map(|r| r.iter())
        .any(|m| m.objective(metric).is_none() && fallback_of(metric, m).is_some())
}

/// The values of one arm in a comparison, in the comparison's one unit (`needs_fallback`).
pub fn comparable(metric: ObjectiveMetric, fallback: bool, runs: &[&Measurement]) -> Vec<f64> {
    runs.iter()
        .filter_map(|m| {
            if fallback {
                fallback_of(metric, m)
            } else {
                m.objective(metric)
            }
        })
        .collect()
}

/// Why an arm misses the constraints in its pooled rounds, if it does.
pub fn pooled_violation(
    measured: &[&Measurement],
    failed: &[(u32, &TrialFailure)],
    min_success_rate: f64,
    limits: &[LatencyLimit],
) -> Option<String> {
    if let Some((seq, f)) = failed.first() {
        return Some(format!(
            "the engine failed in round trial #{seq} ({}: {})",
            f.class,
            crate::util::excerpt(&f.evidence, 120)
        ));
    }
    if measured.is_empty() {
        return Some("not measured".into());
    }
    let (done, sent) = pooled_requests(measured);
    let rate = done as f64 / sent.max(1) as f64;
    if rate < min_success_rate {
        return Some(format!(
            "pooled success rate {:.2}% < {:.2}% ({} of {} requests failed over {} rounds)",
            100.0 * rate,
            100.0 * min_success_rate,
            sent - done,
            sent,
            measured.len()
        ));
    }
    for l in limits {
        let vals = readings(measured, l);
        if vals.is_empty() {
            continue;
        }
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        if mean > l.limit_ms {
            return Some(format!(
                "{} {} = {mean:.1} ms > {} ms (mean of {} rounds)",
                l.stat.label(),
                l.metric.key(),
                l.limit_ms,
                vals.len()
            ));
        }
    }
    None
}

/// Requests completed and sent, over every round.
pub(super) fn pooled_requests(measured: &[&Measurement]) -> (usize, usize) {
    let done = measured.iter().map(|m| m.completed).sum();
    let sent = measured.iter().map(|m| m.completed + m.failed).sum();
    (done, sent)
}

/// A latency limit's statistic in each round that measured it.
pub(super) fn readings(measured: &[&Measurement], l: &LatencyLimit) -> Vec<f64> {
    let key = crate::tune::eval::latency_key(l);
    measured
        .iter()
        .filter_map(|m| m.latencies_ms.get(&key).copied())
        .collect()
}

/// Whether the defaults' pooled violation (`pooled_violation`) is beyond doubt at one-sided
/// level `alpha` (the study's level per look: it is read after every round): a latency limit
/// whose per-round readings put the lower end of a one-sided (1 − alpha) interval for their
/// mean above the limit, or a success rate whose upper Wilson bound at (1 − alpha) is below
/// the floor. A point estimate just over a limit (a mean TPOT of 301 ms against 300, which a study
/// whose limits sit at the defaults' own readings meets half the time) is not: the defaults
/// are then compared as feasible, and a candidate must beat them.
pub fn violation_established(
    measured: &[&Measurement],
    min_success_rate: f64,
    limits: &[LatencyLimit],
    alpha: f64,
) -> Option<String> {
    let confidence = 100.0 * (1.0 - alpha);
    let (done, sent) = pooled_requests(measured);
    if sent > 0 {
        let (_, upper) = crate::bench::abort::wilson(
            done as f64,
            sent as f64,
            crate::bench::abort::normal_quantile(1.0 - alpha),
        );
        if upper < min_success_rate {
            return Some(format!(
                "pooled success rate {:.2}% < {:.2}% ({} of {sent} requests failed over {} rounds; upper {confidence:.1}% bound {:.2}%)",
                100.0 * done as f64 / sent as f64,
                100.0 * min_success_rate,
                sent - done,
                measured.len(),
                100.0 * upper
            ));
        }
    }
    for l in limits {
        let vals = readings(measured, l);
        if vals.len() < 2 {
            continue;
        }
        let (mean, sd, n) = crate::tune::significance::mean_sd(&vals);
        let n = n as f64;
        let low =
            mean - crate::tune::significance::t_quantile(1.0 - alpha, n - 1.0) * sd / n.sqrt();
        if low > l.limit_ms {
            return Some(format!(
                "{} {} = {mean:.1} ms > {} ms (mean of {} rounds; lower {confidence:.1}% bound {low:.1} ms)",
                l.stat.label(),
                l.metric.key(),
                l.limit_ms,
                vals.len()
            ));
        }
    }
    None
}

/// Holm's step-down adjustment of one-sided p-values (NaN counts as 1).
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    let pv = |i: usize| if p[i].is_nan() { 1.0 } else { p[i] };
    order.sort_by(|a, b| pv(*a).total_cmp(&pv(*b)));
    let mut adj = vec![1.0; m];
    let mut running: f64 = 0.0;
    for (k, &i) in order.iter().enumerate() {
        running = running.max(((m - k) as f64 * pv(i)).min(1.0));
        adj[i] = running;
    }
    adj
}

/// The resolution of a set of runs' objective (the `max_rate` bracket), for the interval.
pub(super) fn resolution(ms: &[&Measurement]) -> f64 {
    ms.iter()
        .filter_map(|m| m.resolution)
        .fold(0.0, |a: f64, r| a.max(r))
}
