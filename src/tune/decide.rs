//! The one recommendation gate. Given a study's rules and its re-measurement and validation
//! records, `decide` says which configuration to run (or to keep the defaults), why, and
//! whether more interleaved rounds could change the answer. It is a pure function of the
//! records: the study calls it between rounds and at the end (and stores the result in the
//! study's outcome), and the report, `servetune best`, the daemon's views and `/v1/best` read
//! that stored decision. Nothing else decides.
//!
//! The rule, in order:
//! 0. A round during which other processes kept more than `[foreign_load] max_cores` cores
//!    busy on average is set aside (not pooled, not tested); the verdict counts them. While
//!    the defaults or the leader (no leader: any candidate) has disturbed rounds and fewer than
//!    2 undisturbed ones on the primary workload, nothing is recommended and more rounds are
//!    asked for; at the cap it is "keep the defaults: the machine was busy". A validation
//!    workload whose rounds were all set aside is inconclusive.
//! 1. Every arm (the engine's defaults and each candidate) is judged on all of its rounds of a
//!    workload pooled. A failed run in a round in which the defaults failed too is the
//!    machine's, not the configuration's: it is set aside like a disturbed round (the verdict
//!    counts it); another failed round (a classified engine failure) makes the arm fail.
//!    Otherwise the success rate is the pooled one (completed / sent over every round) and
//!    each latency limit is checked on the mean over the rounds of that round's statistic.
//! 2. The gain on the objective of each constraint-meeting candidate over the defaults is a
//!    Welch t-test (t quantiles at the Welch degrees of freedom). With several candidates the
//!    one-sided p-values are corrected by Holm's step-down procedure, and a candidate is
//!    significant when its adjusted p-value is at most the level per look
//!    (`alpha_per_look`: Pocock's constant level over the looks from `repeats` to
//!    `max_repeats`, so that the study's one-sided error rate over all its looks stays at
//!    2.5%). Every other interval a decision reads after each round is taken at that level
//!    too, never a fixed 95% one read again and again (whether an arm meets the constraints
//!    is read on its pooled point estimates, step 1). Defaults measured in every round miss the constraints
//!    only beyond doubt (`violation_established`: a Wilson bound on the success rate, a
//!    one-sided t bound on each SLO's per-round readings); missing them so, they are beaten by a candidate that
//!    meets them and whose objective's interval does not reach below theirs by more than the
//!    tolerance. Defaults that failed to start are beaten by the best candidate that meets
//!    the constraints, judged on them alone and said so.
//! 3. The candidates that qualify are taken in order of relative gain: the first that does
//!    not regress is recommended (the leader); one that regresses, or is still inconclusive
//!    at the round cap, is passed over and said so. On each validation workload (its
//!    objective, and its constraints where the defaults meet them) and on each guard metric
//!    of the primary workload (default: mean TTFT), the interval of the relative change whose
//!    each side is a one-sided bound at the level per look (`alpha_per_look`; the 95% one is
//!    what the report shows) must lie within the tolerance on the losing side. An interval entirely beyond it is a
//!    regression; one that straddles it is inconclusive. A validation workload the candidate
//!    has not run yet is not judged; the validation rounds' minimum and cap count per leader.
//! 4. More rounds are asked for while the answer could still change (the leader's gain is
//!    positive but not yet significant, or a check is inconclusive), up to the study's cap.
//!    At the cap, an inconclusive check means the defaults are kept, and the verdict says so.

use serde::{Deserialize, Serialize};

use super::eval::{Measurement, TrialFailure};
use super::records::{TrialKind, TrialRecord, TrialStatus};
use super::significance::{welch_with_resolution, Diff};
use super::spec::ObjectiveMetric;
use crate::bench::abort::LatencyLimit;
use crate::space::CommandLine;

/// A latency statistic of the primary workload that must not get worse beyond the tolerance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Guard {
    /// A key of `Measurement::latencies_ms` (`ttft:p99`, `tpot:mean`, …).
    pub key: String,
}

/// What the gate needs from the study file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rules {
    pub metric: ObjectiveMetric,
    pub min_success_rate: f64,
    pub limits: Vec<LatencyLimit>,
    /// A relative loss beyond this (0.05 = 5%) is a regression.
    pub tolerance: f64,
    pub guards: Vec<Guard>,
    /// The level of the gain test at each look (after each round from `repeats` to
    /// `max_repeats`): `alpha_per_look`, so that the study's one-sided error rate over all its
    /// looks is `ALPHA`.
    pub alpha: f64,
    /// A round during which other processes kept more cores busy than this on average is
    /// disturbed and set aside (`[foreign_load] max_cores`).
    #[serde(default = "no_limit")]
    pub max_foreign_cores: f64,
}

fn no_limit() -> f64 {
    f64::INFINITY
}

/// The one-sided family-wise error rate of a study's gain test over all its looks: 2.5%.
pub const ALPHA: f64 = 0.025;

/// Pocock's nominal one-sided levels for an overall 2.5% over K equally spaced looks, K = 1 to
/// 10 (Pocock 1977; Jennison & Turnbull, Group Sequential Methods, table 2.1: two-sided 5%
/// constants halved).
const POCOCK_2_5: [f64; 10] = [
    0.025, 0.0147, 0.0110, 0.0091, 0.0079, 0.0071, 0.0065, 0.0060, 0.0056, 0.0053,
];

/// The gain test's level at each look of a study that looks after every round from `min` to
/// `max` (the re-measurement's `repeats` and `max_repeats`): a study stops at the first look
/// that recommends, so testing at `ALPHA` each time would recommend a candidate no better than
/// the defaults more often than `ALPHA` (4.2% over three looks; `servetune gate-bench`).
/// Pocock's constant level keeps the overall rate at `ALPHA`: the looks here are closer than
/// equally spaced ones (rounds 3, 4, 5 share most of their data), which only makes it more
/// conservative. Beyond ten looks, Bonferroni (`ALPHA / K`).
pub fn alpha_per_look(min: u32, max: u32) -> f64 {
    let looks = max.saturating_sub(min.max(1)) as usize + 1;
    POCOCK_2_5
        .get(looks - 1)
        .copied()
        .unwrap_or(ALPHA / looks as f64)
}

/// The state of one check of the leader against the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckState {
    /// Within the tolerance on the losing side (or better).
    Ok,
    /// The whole interval lies beyond the tolerance on the losing side.
    Regression,
    /// The interval straddles the tolerance: more rounds could tell.
    Inconclusive,
    /// Shown for information; it does not gate the recommendation.
    Info,
}

impl CheckState {
    /// The one word for the state that the CLI, the report and the status page show beside a
    /// gating check's change (`""` for a check that only informs).
    pub fn label(self) -> &'static str {
        match self {
            CheckState::Ok => "within tolerance",
            CheckState::Regression => "REGRESSION",
            CheckState::Inconclusive => "inconclusive",
            CheckState::Info => "",
        }
    }
}

/// One figure of the leader against the defaults on one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub workload: String,
    /// `objective`, `success_rate`, or a latency key (`tpot:mean`).
    pub key: String,
    pub label: String,
    pub higher_is_better: bool,
    pub baseline: Vec<f64>,
    pub candidate: Vec<f64>,
    pub diff: Option<Diff>,
    pub state: CheckState,
    /// Whether this check gates the recommendation.
    pub gate: bool,
    pub note: Option<String>,
}

/// One candidate's gain on the objective of the primary workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub candidate: u32,
    pub command: Option<CommandLine>,
    /// candidate − defaults, with its 95% interval; `None` when it cannot be computed.
    pub diff: Option<Diff>,
    /// Holm-adjusted one-sided p-value.
    #[serde(default)]
    pub p_adjusted: Option<f64>,
    /// Significant after the correction (or: the defaults miss the constraints, this does not).
    #[serde(default)]
    pub significant: bool,
    /// Why the candidate cannot be recommended (missed the constraints pooled, failed a round).
    pub disqualified: Option<String>,
    /// Compared on the objective's fallback (`needs_fallback`: a run of either arm could not
    /// measure the objective), so `diff` is in the fallback's unit.
    #[serde(default)]
    pub fallback: bool,
}

/// What more measurement could settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pending {
    None,
    /// Another re-measurement round (primary workload, every arm).
    Remeasure,
    /// Another validation round (the leader and the defaults on the other workloads).
    Validate,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub recommended: Option<u32>,
    /// The candidate the checks are about (the recommended one, or the one that came closest).
    pub leader: Option<u32>,
    pub comparisons: Vec<Comparison>,
    pub checks: Vec<Check>,
    /// Why the defaults miss the constraints in their pooled rounds, if they do.
    pub baseline_infeasible: Option<String>,
    pub pending: Pending,
    /// Whether the leader has passed the primary workload (significant gain, guards settled
    /// and within the tolerance) and other workloads exist: validation is due.
    #[serde(default)]
    pub validate: bool,
    /// Rounds (trial numbers) set aside: other processes disturbed them, or the run failed
    /// in a round in which the defaults failed too (the machine's failure).
    #[serde(default)]
    pub set_aside: Vec<u32>,
    pub verdict: String,
}

/// The records the decision is made from.
pub struct Input<'a> {
    /// Workload names, primary first.
    pub workloads: &'a [String],
    /// The search trial of the engine's defaults.
    pub baseline: &'a TrialRecord,
    /// Search trials re-measured against it.
    pub candidates: &'a [u32],
    /// Every trial of the study.
    pub trials: &'a [TrialRecord],
    /// Whether this is the last word (no more rounds may be run).
    pub last: bool,
    /// Candidates whose validation may still run rounds of its own (a runner-up that leads
    /// once the first leader was passed over at its cap): their inconclusive checks are not
    /// final, even at the last word.
    pub open: &'a [u32],
}

/// One arm's rounds on one workload.
struct Runs<'a> {
    measured: Vec<&'a Measurement>,
    failed: Vec<(u32, &'a TrialFailure)>,
    /// Rounds set aside: `(trial, foreign cores)`.
    disturbed: Vec<(u32, f64)>,
    /// Failed runs set aside as the machine's (trials): on the primary workload, a round in
    /// which the defaults failed too (they ran in the search, so the machine, not the
    /// configuration, is the likelier cause: memory not yet released, a port taken).
    machine: Vec<u32>,
}

impl Runs<'_> {
    /// Whether any round of this arm was set aside, for foreign load or as the machine's.
    fn any_set_aside(&self) -> bool {
        !self.disturbed.is_empty() || !self.machine.is_empty()
    }
}

fn runs<'a>(
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
fn fallback_of(metric: ObjectiveMetric, m: &Measurement) -> Option<f64> {
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
fn pooled_requests(measured: &[&Measurement]) -> (usize, usize) {
    let done = measured.iter().map(|m| m.completed).sum();
    let sent = measured.iter().map(|m| m.completed + m.failed).sum();
    (done, sent)
}

/// A latency limit's statistic in each round that measured it.
fn readings(measured: &[&Measurement], l: &LatencyLimit) -> Vec<f64> {
    let key = super::eval::latency_key(l);
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
        let (mean, sd, n) = super::significance::mean_sd(&vals);
        let n = n as f64;
        let low = mean - super::significance::t_quantile(1.0 - alpha, n - 1.0) * sd / n.sqrt();
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
fn resolution(ms: &[&Measurement]) -> f64 {
    ms.iter()
        .filter_map(|m| m.resolution)
        .fold(0.0, |a: f64, r| a.max(r))
}

/// The state of a relative change against the tolerance, decided on its bounds at one-sided
/// level `alpha` (the study's level per look: a check is read after every round, so reading
/// it at 95% each time would pass a candidate that loses by the tolerance more often than
/// 2.5% of the time; `servetune gate-bench`'s guard rows).
pub fn check_state(d: &Diff, higher_is_better: bool, tolerance: f64, alpha: f64) -> CheckState {
    let tol = 100.0 * tolerance;
    let (low, high) = d.pct_bounds(alpha);
    let (worst, best) = if higher_is_better {
        (low, high)
    } else {
        (-high, -low)
    };
    if worst.is_nan() || best.is_nan() {
        return CheckState::Inconclusive;
    }
    if worst >= -tol {
        CheckState::Ok
    } else if best < -tol {
        CheckState::Regression
    } else {
        CheckState::Inconclusive
    }
}

fn latency_label(key: &str) -> String {
    let (m, s) = key.split_once(':').unwrap_or((key, ""));
    let stat = match s {
        "mean" => "mean".to_owned(),
        "median" => "median".to_owned(),
        p => p.to_uppercase(),
    };
    format!("{stat} {} (ms)", m.to_uppercase())
}

/// The comparison of the leader and the defaults on one workload.
fn workload_checks(
    rules: &Rules,
    name: &str,
    base: &Runs,
    cand: &Runs,
    primary: bool,
    no_defaults: bool,
) -> Vec<Check> {
    let mut out = Vec::new();
    let fallback = needs_fallback(rules.metric, &[&base.measured, &cand.measured]);
    let objective_label = if fallback {
        format!(
            "{} (compared on the fallback: this workload cannot measure the objective)",
            rules.metric.label()
        )
    } else {
        rules.metric.label().to_owned()
    };
    let vals = |r: &Runs, f: &dyn Fn(&Measurement) -> Option<f64>| -> Vec<f64> {
        r.measured.iter().filter_map(|m| f(m)).collect()
    };
    let mut push = |key: &str,
                    label: String,
                    higher: bool,
                    gate: bool,
                    res: f64,
                    f: &dyn Fn(&Measurement) -> Option<f64>| {
        let (b, c) = (vals(base, f), vals(cand, f));
        let diff = (!b.is_empty() && !c.is_empty()).then(|| welch_with_resolution(&c, &b, res));
        // Defaults that did not start give nothing to compare with: the check informs, and
        // the candidate is judged on its constraints alone.
        let state = match (&diff, gate && !no_defaults) {
            (Some(d), true) => check_state(d, higher, rules.tolerance, rules.alpha),
            (None, true) => CheckState::Inconclusive,
            (_, false) => CheckState::Info,
        };
        let note = (gate && no_defaults)
            .then(|| "the defaults did not start: nothing to compare with".to_owned());
        out.push(Check {
            workload: name.to_owned(),
            key: key.to_owned(),
            label,
            higher_is_better: higher,
            baseline: b,
            candidate: c,
            diff,
            state,
            gate: gate && !no_defaults,
            note,
        });
    };
    let res = resolution(&base.measured).max(resolution(&cand.measured));
    // The primary's objective is judged by the gain test; a validation workload's gates.
    push("objective", objective_label, true, !primary, res, &|m| {
        if fallback {
            fallback_of(rules.metric, m)
        } else {
            m.objective(rules.metric)
        }
    });
    let mut keys: Vec<String> = vec!["tpot:mean".into(), "ttft:p99".into()];
    for g in &rules.guards {
        if !keys.contains(&g.key) {
            keys.push(g.key.clone());
        }
    }
    for k in keys {
        let gate = primary && rules.guards.iter().any(|g| g.key == k);
        let kk = k.clone();
        push(&k, latency_label(&k), false, gate, 0.0, &move |m| {
            m.latencies_ms.get(&kk).copied()
        });
    }
    push(
        "success_rate",
        "success rate (%)".into(),
        true,
        false,
        0.0,
        &|m| Some(100.0 * m.success_rate),
    );
    if !primary {
        // A validation workload's constraints: the leader must meet them where the defaults do.
        let bv = pooled_violation(
            &base.measured,
            &base.failed,
            rules.min_success_rate,
            &rules.limits,
        );
        let cv = pooled_violation(
            &cand.measured,
            &cand.failed,
            rules.min_success_rate,
            &rules.limits,
        );
        if let Some(why) = cv {
            let (state, note) = match bv {
                None => (
                    CheckState::Regression,
                    format!("the recommended configuration misses the constraints: {why}"),
                ),
                Some(b) => (
                    CheckState::Info,
                    format!("both miss the constraints (defaults: {b}; candidate: {why})"),
                ),
            };
            out.push(Check {
                workload: name.to_owned(),
                key: "constraints".into(),
                label: "constraints".into(),
                higher_is_better: true,
                baseline: Vec::new(),
                candidate: Vec::new(),
                diff: None,
                state,
                gate: true,
                note: Some(note),
            });
        }
    }
    out
}

/// A candidate's own mean and 95% interval, as a `Diff` with no defaults (`n_b = 0`): the
/// defaults failed to start, so there is nothing to subtract.
fn alone(v: &[f64]) -> Diff {
    let (m, h) = super::significance::mean_interval(v).unwrap_or((f64::NAN, f64::INFINITY));
    Diff {
        mean_a: m,
        mean_b: f64::NAN,
        diff: m,
        low: m - h,
        high: m + h,
        pct: f64::NAN,
        pct_low: f64::NAN,
        pct_high: f64::NAN,
        n_a: v.len(),
        n_b: 0,
        df: f64::NAN,
        p_gain: f64::NAN,
    }
}

fn pct(d: &Diff) -> String {
    if d.n_b == 0 || !d.pct.is_finite() {
        // Nothing to compare with (the defaults did not start): the level and its interval.
        return format!(
            "{:.2} (95% CI {:.2} to {:.2}; no defaults to compare with)",
            d.mean_a, d.low, d.high
        );
    }
    format!(
        "{:+.1}% (95% CI {:+.1}% to {:+.1}%)",
        d.pct, d.pct_low, d.pct_high
    )
}

/// Decides. See the module header for the rule.
pub fn decide(rules: &Rules, input: &Input) -> Decision {
    let base = input.baseline;
    let command_of = |seq: u32| {
        input
            .trials
            .iter()
            .find(|t| t.seq == seq)
            .and_then(|t| t.command.clone())
    };
    // Defaults that did not start (a classified engine failure) have nothing to compare with:
    // candidates are judged on their own constraints.
    let base_failed_to_start = failed_to_start(base);
    // One arm's rounds on workload `wi`, with the defaults' failed rounds known.
    let arm_runs =
        |wi: usize, arm: u32| runs(rules, input.trials, input.workloads, wi, (base.seq, arm));
    let base_runs = arm_runs(0, base.seq);
    let baseline_infeasible = if base_failed_to_start {
        Some(match &base.failure {
            Some(f) => format!(
                "failed to start ({}): {}",
                f.class,
                crate::util::excerpt(&f.evidence, 120)
            ),
            None => "failed to start".into(),
        })
    } else if base_runs.measured.is_empty()
        && base_runs.failed.is_empty()
        && base_runs.any_set_aside()
    {
        // Every round of the defaults was set aside: unknown, not infeasible.
        None
    } else if !base_runs.failed.is_empty() {
        pooled_violation(
            &base_runs.measured,
            &base_runs.failed,
            rules.min_success_rate,
            &rules.limits,
        )
    } else {
        // Measured in every round: infeasible only beyond doubt.
        violation_established(
            &base_runs.measured,
            rules.min_success_rate,
            &rules.limits,
            rules.alpha,
        )
    };
    let mut comparisons: Vec<Comparison> = input
        .candidates
        .iter()
        .map(|&c| {
            let r = arm_runs(0, c);
            let fallback = needs_fallback(rules.metric, &[&r.measured, &base_runs.measured]);
            let cvals = comparable(rules.metric, fallback, &r.measured);
            let bvals = comparable(rules.metric, fallback, &base_runs.measured);
            let res = resolution(&r.measured).max(resolution(&base_runs.measured));
            let diff = (!cvals.is_empty() && !bvals.is_empty())
                .then(|| welch_with_resolution(&cvals, &bvals, res))
                .or_else(|| (!cvals.is_empty()).then(|| alone(&cvals)));
            Comparison {
                candidate: c,
                command: command_of(c),
                fallback,
                diff,
                p_adjusted: None,
                significant: false,
                disqualified: if r.measured.is_empty()
                    && r.failed.is_empty()
                    && r.any_set_aside()
                {
                    Some("every round was set aside (disturbed by other processes, or the defaults failed in it too)".into())
                } else {
                    pooled_violation(
                        &r.measured,
                        &r.failed,
                        rules.min_success_rate,
                        &rules.limits,
                    )
                },
            }
        })
        .collect();
    // Holm over the candidates that met the constraints.
    let tested: Vec<usize> = comparisons
        .iter()
        .enumerate()
        .filter(|(_, c)| c.disqualified.is_none() && c.diff.is_some())
        .map(|(i, _)| i)
        .collect();
    let p: Vec<f64> = tested
        .iter()
        .map(|&i| comparisons[i].diff.as_ref().map_or(1.0, |d| d.p_gain))
        .collect();
    let adj = holm(&p);
    for (k, &i) in tested.iter().enumerate() {
        let c = &mut comparisons[i];
        c.p_adjusted = Some(adj[k]);
        // Against defaults that miss the constraints (beyond doubt), meeting them is the gain,
        // but not at any price: a candidate whose objective may be lower than the defaults'
        // by more than the tolerance (its interval's lower end) is not a recommendation.
        c.significant = match (&baseline_infeasible, &c.diff) {
            (Some(_), Some(d)) if d.n_b > 0 => {
                d.pct_bounds(rules.alpha).0 >= -100.0 * rules.tolerance
            }
            (Some(_), _) => true,
            (None, _) => adj[k] <= rules.alpha,
        };
    }
    // Candidates are ranked by their gain relative to the defaults: each comparison has its
    // own unit (the objective, or its fallback), so means are not comparable across them.
    // With no defaults to compare with, by the mean (every comparison alone).
    let mean_of = |c: &Comparison| {
        c.diff.as_ref().map_or(f64::NEG_INFINITY, |d| {
            if d.n_b > 0 && d.pct.is_finite() {
                d.pct
            } else {
                d.mean_a
            }
        })
    };
    // One candidate's checks on every workload it has run (a validation workload it has not
    // run yet is skipped; one whose rounds were all set aside is not: its checks are
    // inconclusive).
    let checks_of = |cand: u32| -> Vec<Check> {
        let mut checks = Vec::new();
        for (wi, name) in input.workloads.iter().enumerate() {
            let b = arm_runs(wi, base.seq);
            let c = arm_runs(wi, cand);
            // Not run by this candidate (the defaults may have run it beside an earlier
            // leader).
            let unrun = c.measured.is_empty() && c.failed.is_empty() && !c.any_set_aside();
            if wi > 0 && unrun {
                continue;
            }
            checks.extend(workload_checks(
                rules,
                name,
                &b,
                &c,
                wi == 0,
                base_failed_to_start,
            ));
        }
        checks
    };
    // The significant candidates, fastest first: the first that regresses on no workload and
    // no guard leads; a faster one that does is passed over, and said so. (The Holm correction
    // above already covers every candidate, so looking past the first adds no test.) When all
    // regress, the fastest leads and the verdict says what it regresses on.
    let mut ranked: Vec<&Comparison> = comparisons.iter().filter(|c| c.significant).collect();
    ranked.sort_by(|a, b| mean_of(b).total_cmp(&mean_of(a)));
    // At the last look an inconclusive check will not be settled either: a candidate left
    // with one is passed over too, for one that passes every check.
    let tol = 100.0 * rules.tolerance;
    let is_final = |cand: u32| input.last && !input.open.contains(&cand);
    let mut passed_over: Vec<(u32, String)> = Vec::new();
    let mut significant_leader: Option<(Comparison, Vec<Check>)> = None;
    for c in &ranked {
        let k = checks_of(c.candidate);
        let regress = describe(&k, CheckState::Regression, rules.alpha);
        let unsure = if is_final(c.candidate) {
            describe(&k, CheckState::Inconclusive, rules.alpha)
        } else {
            Vec::new()
        };
        if regress.is_empty() && unsure.is_empty() {
            significant_leader = Some(((*c).clone(), k));
            break;
        }
        let mut why = Vec::new();
        if !regress.is_empty() {
            why.push(format!(
                "regresses beyond {tol:.0}% on: {}",
                regress.join("; ")
            ));
        }
        if !unsure.is_empty() {
            why.push(format!(
                "is inconclusive at the round cap on: {}",
                unsure.join("; ")
            ));
        }
        passed_over.push((c.candidate, why.join("; and ")));
    }
    if significant_leader.is_none() {
        passed_over.clear();
        significant_leader = ranked
            .first()
            .map(|c| ((*c).clone(), checks_of(c.candidate)));
    }
    let (significant_leader, leader_checks) = match significant_leader {
        Some((c, k)) => (Some(c), Some(k)),
        None => (None, None),
    };
    // The one that came closest, when none is significant (for the wording and for asking for
    // more rounds).
    let closest = comparisons
        .iter()
        .filter(|c| c.disqualified.is_none() && c.diff.is_some())
        .max_by(|a, b| mean_of(a).total_cmp(&mean_of(b)))
        .cloned();
    let leader = significant_leader.clone().or(closest.clone());
    let checks = match (leader_checks, &leader) {
        (Some(k), _) => k,
        (None, Some(l)) => checks_of(l.candidate),
        (None, None) => Vec::new(),
    };
    let primary = input.workloads.first().cloned().unwrap_or_default();
    let any = |wl_primary: bool, state: CheckState| {
        checks
            .iter()
            .any(|c| c.gate && (c.workload == primary) == wl_primary && c.state == state)
    };
    let primary_regress = any(true, CheckState::Regression);
    let primary_unsure = any(true, CheckState::Inconclusive);
    let validated_any = checks.iter().any(|c| c.workload != primary);
    let valid_regress = any(false, CheckState::Regression);
    let valid_unsure = any(false, CheckState::Inconclusive);
    let needs_validation = input.workloads.len() > 1;
    // What more rounds could settle.
    let gain_could_come = significant_leader.is_none()
        && closest
            .as_ref()
            .and_then(|c| c.diff.as_ref())
            .is_some_and(|d| d.diff > 0.0);
    // Rounds set aside for foreign load, and whether the defaults or the leader (with no
    // leader: any candidate) is left with fewer than 2 undisturbed rounds of the primary
    // workload: no interval means anything then, and more rounds may be quiet.
    let mut set_aside: Vec<(u32, f64)> = Vec::new();
    let mut machine: Vec<u32> = Vec::new();
    let (mut primary_set_aside, mut primary_rounds) = (0usize, 0usize);
    for (wi, _) in input.workloads.iter().enumerate() {
        for arm in std::iter::once(base.seq).chain(input.candidates.iter().copied()) {
            let r = arm_runs(wi, arm);
            if wi == 0 {
                primary_rounds +=
                    r.measured.len() + r.disturbed.len() + r.failed.len() + r.machine.len();
                primary_set_aside += r.disturbed.len();
            }
            set_aside.extend(r.disturbed);
            machine.extend(r.machine);
        }
    }
    let short = |arm: u32| {
        let r = arm_runs(0, arm);
        r.failed.is_empty() && r.measured.len() < 2 && r.any_set_aside()
    };
    let short_of_clean = (!base_failed_to_start && short(base.seq))
        || match &leader {
            Some(l) => short(l.candidate),
            None => input.candidates.iter().any(|&c| short(c)),
        };
    set_aside.sort_by_key(|d| d.0);
    set_aside.dedup_by_key(|d| d.0);
    let pending = if (short_of_clean && !input.last)
        || gain_could_come
        || (significant_leader.is_some() && primary_unsure)
    {
        Pending::Remeasure
    } else if significant_leader.is_some()
        && !primary_regress
        && needs_validation
        && (!validated_any || valid_unsure)
        && !valid_regress
    {
        Pending::Validate
    } else {
        Pending::None
    };
    let validate = significant_leader.is_some()
        && !short_of_clean
        && !primary_regress
        && !primary_unsure
        && needs_validation
        && !gain_could_come;
    let m = tested.len();
    let recommended = significant_leader.as_ref().and_then(|l| {
        let all_ok = checks
            .iter()
            .filter(|c| c.gate)
            .all(|c| c.state == CheckState::Ok);
        let validated = !needs_validation || validated_any;
        (all_ok && validated && !short_of_clean && pending == Pending::None).then_some(l.candidate)
    });
    let rounds = |c: &Comparison| c.diff.as_ref().map_or(0, |d| d.n_a);
    let problems = |state: CheckState| describe(&checks, state, rules.alpha);
    let verdict = match (&recommended, &significant_leader) {
        (Some(r), Some(l)) => {
            let d = l
                .diff
                .as_ref()
                .expect("a significant comparison has a diff");
            match &baseline_infeasible {
                Some(why) if d.n_b == 0 => format!(
                    "run trial #{r}: the engine's defaults {why}; trial #{r} meets the constraints in its pooled rounds ({:.2}, 95% CI {:.2} to {:.2}, {} rounds) and regresses on no workload beyond {tol:.0}%",
                    d.mean_a, d.low, d.high, d.n_a
                ),
                Some(why) => format!(
                    "run trial #{r}: the engine's defaults miss the constraints in their pooled rounds ({why}); trial #{r} meets them, at {:.2} against the defaults' {:.2} ({}, {} rounds each), and regresses on no workload beyond {tol:.0}%",
                    d.mean_a, d.mean_b, pct(d), d.n_a
                ),
                None => format!(
                    "run trial #{r}: it beats the defaults by {} over {} interleaved rounds each; Holm-adjusted one-sided p = {:.4} over {m} candidate(s); no workload or guard regresses beyond {tol:.0}%",
                    pct(d),
                    d.n_a,
                    l.p_adjusted.unwrap_or(f64::NAN)
                ),
            }
        }
        (None, Some(l)) => {
            let d = l
                .diff
                .as_ref()
                .expect("a significant comparison has a diff");
            let regress = problems(CheckState::Regression);
            let unsure = problems(CheckState::Inconclusive);
            if !regress.is_empty() {
                format!(
                    "keep the defaults: trial #{} changes the objective by {}, but regresses beyond {tol:.0}% on: {}",
                    l.candidate,
                    pct(d),
                    regress.join("; ")
                )
            } else if !unsure.is_empty() || pending != Pending::None {
                format!(
                    "keep the defaults: trial #{} changes the objective by {}, but {} {}; not recommended without more rounds",
                    l.candidate,
                    pct(d),
                    if unsure.is_empty() {
                        "its validation has not run".to_owned()
                    } else {
                        format!("its effect is inconclusive (the interval straddles the {tol:.0}% tolerance) on: {}", unsure.join("; "))
                    },
                    if is_final(l.candidate) { "at the round cap" } else { "so far" }
                )
            } else {
                format!(
                    "keep the defaults: trial #{} was not validated on every workload",
                    l.candidate
                )
            }
        }
        (_, None) => {
            if input.candidates.is_empty() {
                "keep the defaults: no configuration other than the defaults met the constraints in the search".into()
            } else {
                match &closest {
                    Some(c) => {
                        let d = c.diff.as_ref().expect("closest has a diff");
                        format!(
                            "keep the defaults: no candidate beats them significantly after correcting for {m} candidate(s); the best, trial #{}, is {} over {} rounds (Holm-adjusted one-sided p = {:.3} against {}, the level per look)",
                            c.candidate,
                            pct(d),
                            rounds(c),
                            c.p_adjusted.unwrap_or(f64::NAN),
                            rules.alpha
                        )
                    }
                    None => {
                        let why: Vec<String> = comparisons
                            .iter()
                            .map(|c| {
                                format!(
                                    "#{}: {}",
                                    c.candidate,
                                    c.disqualified
                                        .clone()
                                        .unwrap_or_else(|| "no measurement".into())
                                )
                            })
                            .collect();
                        format!(
                            "keep the defaults: every candidate missed the constraints in its pooled re-measurement rounds ({})",
                            why.join("; ")
                        )
                    }
                }
            }
        }
    };
    let verdict = if passed_over.is_empty() {
        verdict
    } else {
        let faster: Vec<String> = passed_over
            .iter()
            .map(|(c, why)| format!("trial #{c} beat the defaults by more but {why}"))
            .collect();
        format!("{verdict} ({})", faster.join("; "))
    };
    let worst = set_aside
        .iter()
        .map(|d| d.1)
        .fold(0.0_f64, |a, b| if b.is_nan() { a } else { a.max(b) });
    machine.sort_unstable();
    machine.dedup();
    let verdict = if machine.is_empty() {
        verdict
    } else if recommended.is_none() && short_of_clean && set_aside.is_empty() {
        format!(
            "keep the defaults: the defaults' own engine failed in re-measurement rounds (trials {}), so this machine could not run them{}; run the study again when the machine is quiet",
            list(&machine),
            if input.last { " at the round cap" } else { " so far" }
        )
    } else {
        format!(
            "{verdict} ({} failed run(s) set aside: the defaults failed in the same round, so the machine, not the configuration, failed: trials {})",
            machine.len(),
            list(&machine)
        )
    };
    let verdict = if set_aside.is_empty() {
        verdict
    } else if recommended.is_none() && short_of_clean {
        format!(
            "keep the defaults: other processes kept this machine busy (up to {worst:.2} cores, limit {:.2}) during {primary_set_aside} of {primary_rounds} re-measurement runs, and too few undisturbed rounds remain to decide{}; run the study again when the machine is quiet",
            rules.max_foreign_cores,
            if input.last { " at the round cap" } else { " so far" }
        )
    } else {
        format!(
            "{verdict} ({} disturbed round(s) set aside: other processes kept up to {worst:.2} cores busy, limit {:.2})",
            set_aside.len(),
            rules.max_foreign_cores
        )
    };
    Decision {
        recommended,
        leader: leader.map(|l| l.candidate),
        comparisons,
        checks,
        baseline_infeasible,
        pending,
        validate,
        set_aside: set_aside
            .iter()
            .map(|d| d.0)
            .chain(machine.iter().copied())
            .collect(),
        verdict,
    }
}

/// The gating checks in `state`, as the verdict names them (`chat ttft:p99 +12.0% …`), with
/// the interval the state was decided on (at the level per look `alpha`), which is wider than
/// the 95% one shown beside it.
fn describe(checks: &[Check], state: CheckState, alpha: f64) -> Vec<String> {
    checks
        .iter()
        .filter(|c| c.gate && c.state == state)
        .map(|c| match (&c.diff, &c.note) {
            (_, Some(n)) => format!("{}: {n}", c.workload),
            (Some(d), None) => match d.pct_bounds(alpha) {
                (lo, hi) if d.n_b > 0 && d.pct.is_finite() && lo.is_finite() && hi.is_finite() => format!(
                    "{} {} {}, decided on {lo:+.1}% to {hi:+.1}% (the {:.1}% interval of the level per look)",
                    c.workload,
                    c.label,
                    pct(d),
                    100.0 * (1.0 - 2.0 * alpha)
                ),
                _ => format!("{} {} {}", c.workload, c.label, pct(d)),
            },
            (None, None) => format!("{} {} (not measured)", c.workload, c.label),
        })
        .collect()
}

/// Trial numbers as `#3, #7`.
fn list(seqs: &[u32]) -> String {
    seqs.iter()
        .map(|s| format!("#{s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::Config;
    use std::collections::BTreeMap;

    fn meas(v: f64, tpot: f64, ttft99: f64) -> Measurement {
        let mut lat = BTreeMap::new();
        lat.insert("tpot:mean".to_owned(), tpot);
        lat.insert("ttft:p99".to_owned(), ttft99);
        Measurement {
            workload: "w".into(),
            num_prompts: 100,
            completed: 100,
            success_rate: 1.0,
            total_token_throughput: v,
            output_throughput: v / 2.0,
            request_throughput: v / 100.0,
            latencies_ms: lat,
            ..Default::default()
        }
    }

    fn rec(seq: u32, kind: TrialKind, m: Measurement, rules: &Rules) -> TrialRecord {
        let infeasible = m.violation(rules.min_success_rate, &rules.limits);
        TrialRecord {
            study: "s".into(),
            seq,
            kind,
            config: Config::new(),
            defaults: false,
            note: String::new(),
            expected_improvement: None,
            status: if infeasible.is_some() {
                TrialStatus::Infeasible
            } else {
                TrialStatus::Ok
            },
            engine: Some("e".into()),
            command: Some(CommandLine {
                env: Vec::new(),
                argv: vec!["engine".into(), "--trial".into(), seq.to_string()],
            }),
            engine_version: None,
            hardware: String::new(),
            screen: None,
            objective: infeasible.is_none().then_some(m.total_token_throughput),
            screen_objective: Some(m.total_token_throughput),
            full: Some(m),
            promoted: true,
            failure: None,
            early_stop: infeasible,
            telemetry: None,
            started: 0.0,
            ended: Some(1.0),
            bench_s: 1.0,
            saved_s: 0.0,
            attempts: 1,
            stopped: 0,
            startup_s: None,
            retried_after: None,
        }
    }

    fn rules(slo: &[&str], guards: &[&str]) -> Rules {
        Rules {
            metric: ObjectiveMetric::TotalTokenThroughput,
            min_success_rate: 0.99,
            limits: slo
                .iter()
                .map(|s| LatencyLimit::parse(s).unwrap())
                .collect(),
            tolerance: 0.05,
            guards: guards
                .iter()
                .map(|g| Guard {
                    key: (*g).to_owned(),
                })
                .collect(),
            alpha: ALPHA,
            max_foreign_cores: 0.25,
        }
    }

    /// A study's records: search trials 0 (defaults) and `cands`, then the primary rounds
    /// (`(arm, throughput, tpot, ttft p99)`) and the validation rounds.
    struct Book {
        trials: Vec<TrialRecord>,
    }

    impl Book {
        fn new(rules: &Rules, arms: &[u32]) -> Book {
            let trials = arms
                .iter()
                .map(|&a| rec(a, TrialKind::Search, meas(100.0, 10.0, 100.0), rules))
                .collect();
            Book { trials }
        }
        fn round(&mut self, rules: &Rules, arm: u32, round: u32, m: Measurement) {
            let seq = 100 + self.trials.len() as u32;
            self.trials.push(rec(
                seq,
                TrialKind::Remeasure {
                    round,
                    candidate: arm,
                },
                m,
                rules,
            ));
        }
        fn validate(&mut self, rules: &Rules, wl: &str, arm: u32, round: u32, m: Measurement) {
            let seq = 100 + self.trials.len() as u32;
            self.trials.push(rec(
                seq,
                TrialKind::Validate {
                    workload: wl.into(),
                    round,
                    candidate: arm,
                },
                m,
                rules,
            ));
        }
        fn decide(&self, rules: &Rules, workloads: &[&str], cands: &[u32], last: bool) -> Decision {
            let names: Vec<String> = workloads.iter().map(|s| s.to_string()).collect();
            decide(
                rules,
                &Input {
                    workloads: &names,
                    baseline: &self.trials[0],
                    candidates: cands,
                    trials: &self.trials,
                    last,
                    open: &[],
                },
            )
        }
    }

    #[test]
    fn holm_matches_a_hand_computation() {
        // Sorted: 0.01 × 3 = 0.03; 0.03 × 2 = 0.06; 0.04 × 1 = 0.04 → max(0.06, 0.04).
        let adj = holm(&[0.01, 0.04, 0.03]);
        assert!((adj[0] - 0.03).abs() < 1e-12);
        assert!((adj[1] - 0.06).abs() < 1e-12);
        assert!((adj[2] - 0.06).abs() < 1e-12);
        assert_eq!(holm(&[f64::NAN]), vec![1.0]);
    }

    #[test]
    fn the_defaults_missing_an_slo_in_one_round_do_not_disqualify_the_candidates() {
        // Round 2 of the defaults reads 320 ms (> 300): pooled over the three rounds, 296.7.
        let r = rules(&["tpot:mean:300"], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for (i, (bt, ct)) in [(280.0, 200.0), (320.0, 205.0), (290.0, 198.0)]
            .into_iter()
            .enumerate()
        {
            b.round(&r, 0, i as u32, meas(100.0 + i as f64, bt, 900.0));
            b.round(&r, 1, i as u32, meas(130.0 + i as f64, ct, 900.0));
        }
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.baseline_infeasible, None, "{d:?}");
        assert_eq!(d.recommended, Some(1), "{}", d.verdict);
        assert!(d.verdict.starts_with("run trial #1"), "{}", d.verdict);
    }

    #[test]
    fn with_no_feasible_candidate_the_verdict_says_so_and_claims_no_comparison() {
        // Candidates need only meet the constraints: none did, so none was compared with the
        // defaults and the verdict must not say one failed to beat them.
        let r = rules(&["tpot:mean:300"], &[]);
        let mut b = Book::new(&r, &[0]);
        for i in 0..3 {
            b.round(&r, 0, i, meas(100.0, 200.0, 900.0));
        }
        let d = b.decide(&r, &["main"], &[], true);
        assert_eq!(d.recommended, None);
        assert_eq!(
            d.verdict,
            "keep the defaults: no configuration other than the defaults met the constraints in the search"
        );
    }

    /// Issue 20, item 1: defaults whose pooled mean TPOT is just over the limit (301 ms against
    /// 300, rounds spread by ±15 ms) are not infeasible beyond doubt, so a feasible candidate
    /// 15% slower must not be recommended (before: every feasible candidate counted as
    /// significant, and it was).
    #[test]
    fn defaults_just_over_a_limit_are_not_infeasible_and_a_slower_candidate_is_not_recommended() {
        let r = rules(&["tpot:mean:300"], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for (i, bt) in [286.0, 316.0, 301.0].into_iter().enumerate() {
            b.round(&r, 0, i as u32, meas(100.0 + i as f64, bt, 900.0));
            b.round(&r, 1, i as u32, meas(85.0 + i as f64, 250.0, 900.0));
        }
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.baseline_infeasible, None, "{d:?}");
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(d.verdict.starts_with("keep the defaults"), "{}", d.verdict);
    }

    /// Item 1, second half: defaults that miss a limit beyond doubt (mean TPOT 400 ms, every
    /// round) are beaten by a feasible candidate only if it does not lose on the objective
    /// beyond the tolerance: -15% is refused, -2% is recommended.
    #[test]
    fn against_defaults_that_surely_miss_a_limit_a_candidate_may_not_lose_beyond_the_tolerance() {
        let r = rules(&["tpot:mean:300"], &[]);
        for (cand, recommended) in [(85.0, false), (98.0, true)] {
            let mut b = Book::new(&r, &[0, 1]);
            for i in 0..3u32 {
                b.round(&r, 0, i, meas(100.0 + i as f64, 400.0 + i as f64, 900.0));
                b.round(&r, 1, i, meas(cand + i as f64, 250.0, 900.0));
            }
            let d = b.decide(&r, &["main"], &[1], true);
            assert!(
                d.baseline_infeasible
                    .as_deref()
                    .is_some_and(|w| w.contains("lower 97.5% bound")),
                "{d:?}"
            );
            assert_eq!(
                d.recommended.is_some(),
                recommended,
                "{cand}: {}",
                d.verdict
            );
        }
    }

    fn busy(mut m: Measurement, cores: f64) -> Measurement {
        m.foreign_cores = Some(cores);
        m
    }

    #[test]
    fn a_disturbed_round_of_the_defaults_is_set_aside_not_pooled() {
        // The defaults' third round ran beside a busy process: 60 tok/s and TPOT 900 ms. Pooled,
        // the defaults would miss the 300 ms SLO (mean 433 ms) and a candidate no faster than
        // them would be recommended; set aside, the defaults meet it and nothing beats them.
        let r = rules(&["tpot:mean:300"], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3u32 {
            let bm = if i == 2 {
                busy(meas(60.0, 900.0, 900.0), 1.4)
            } else {
                busy(meas(100.0 + i as f64, 200.0, 900.0), 0.05)
            };
            b.round(&r, 0, i, bm);
            b.round(&r, 1, i, meas(100.5 - i as f64, 200.0, 900.0));
        }
        b.round(&r, 0, 3, meas(100.5, 200.0, 900.0));
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.baseline_infeasible, None, "{d:?}");
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert_eq!(d.set_aside.len(), 1, "{d:?}");
        assert!(
            d.verdict.contains("1 disturbed round(s) set aside"),
            "{}",
            d.verdict
        );
        // With the check off (no limit), the same records pool the disturbed round: the
        // defaults' mean TPOT reads 375 ms, over the limit, but not beyond doubt (one round of
        // four), so they are still compared as feasible and the candidate, no faster, is not
        // recommended (before issue 20 item 1, the pooled point estimate made it a gain).
        let off = Rules {
            max_foreign_cores: f64::INFINITY,
            ..r.clone()
        };
        let d = b.decide(&off, &["main"], &[1], true);
        assert!(d.set_aside.is_empty(), "{d:?}");
        assert_eq!(d.comparisons[0].diff.as_ref().map(|x| x.n_b), Some(4));
        assert_eq!(d.baseline_infeasible, None, "{d:?}");
        assert_eq!(d.recommended, None, "{}", d.verdict);
    }

    /// A failed re-measurement run of `arm` in `round` (the engine's class and evidence).
    fn failed_round(b: &mut Book, arm: u32, round: u32, class: &str, evidence: &str) {
        let seq = 100 + b.trials.len() as u32;
        let mut t = rec(
            seq,
            TrialKind::Remeasure {
                round,
                candidate: arm,
            },
            meas(0.0, 0.0, 0.0),
            &rules(&[], &[]),
        );
        t.status = TrialStatus::Failed;
        t.full = None;
        t.objective = None;
        t.failure = Some(TrialFailure {
            class: class.into(),
            evidence: evidence.into(),
            log_excerpt: String::new(),
        });
        b.trials.push(t);
    }

    /// Seen on real vLLM (CPU build, 2026-12-05): in re-measure round 2 the candidate's engine
    /// failed for memory the previous engine had not yet given back, then the defaults' engine
    /// failed to start too, and the verdict blamed the candidate ("missed the constraints in
    /// its pooled rounds … oom"). A round in which the defaults fail too is the machine's: both
    /// failures are set aside, another round is asked for, and the candidate's gain, measured
    /// in the other rounds, is judged on them.
    #[test]
    fn a_round_in_which_the_defaults_fail_too_is_the_machines_and_is_set_aside() {
        let r = rules(&[], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for i in [0u32, 2, 3] {
            b.round(&r, 0, i, meas(100.0 + i as f64 * 0.3, 10.0, 100.0));
            b.round(&r, 1, i, meas(130.0 - i as f64 * 0.3, 10.0, 100.0));
        }
        failed_round(&mut b, 1, 1, "oom", "ValueError: Available memory on node 0 (20.29/23.54 GiB) on kv cache allocation is less than requested memory");
        failed_round(&mut b, 0, 1, "crash", "WorkerProc failed to start");
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.comparisons[0].disqualified, None, "{d:?}");
        assert_eq!(d.recommended, Some(1), "{}", d.verdict);
        assert_eq!(d.set_aside.len(), 2, "{d:?}");
        assert!(
            d.verdict.contains("2 failed run(s) set aside"),
            "{}",
            d.verdict
        );
        // The candidate failing alone in a round is still the candidate's failure.
        let mut b = Book::new(&r, &[0, 1]);
        for i in [0u32, 2, 3] {
            b.round(&r, 0, i, meas(100.0 + i as f64 * 0.3, 10.0, 100.0));
            b.round(&r, 1, i, meas(130.0 - i as f64 * 0.3, 10.0, 100.0));
        }
        b.round(&r, 0, 1, meas(100.0, 10.0, 100.0));
        failed_round(&mut b, 1, 1, "oom", "out of memory");
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(d.comparisons[0].disqualified.is_some(), "{d:?}");
        // Defaults failing in every round but one: too few rounds; more are asked for, and at
        // the cap the verdict keeps the defaults and says the machine could not run them.
        let mut b = Book::new(&r, &[0, 1]);
        b.round(&r, 0, 0, meas(100.0, 10.0, 100.0));
        b.round(&r, 1, 0, meas(130.0, 10.0, 100.0));
        for i in 1..3u32 {
            failed_round(&mut b, 0, i, "crash", "WorkerProc failed to start");
            b.round(&r, 1, i, meas(130.0, 10.0, 100.0));
        }
        let d = b.decide(&r, &["main"], &[1], false);
        assert_eq!(d.pending, Pending::Remeasure, "{d:?}");
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(
            d.verdict
                .starts_with("keep the defaults: the defaults' own engine failed"),
            "{}",
            d.verdict
        );
    }

    /// Issue 20 item 8: defaults that cannot start left every guard inconclusive (nothing to
    /// compare with), so the study ran to the round cap, recommended nothing and printed
    /// "+NaN%". With no defaults, the best feasible candidate is judged on its constraints and
    /// the verdict says so, with no comparison.
    #[test]
    fn defaults_that_cannot_start_leave_the_best_feasible_candidate_judged_on_its_constraints() {
        let r = rules(&["tpot:mean:300"], &["ttft:mean"]);
        let mut b = Book::new(&r, &[0, 1, 2]);
        b.trials[0].status = TrialStatus::Failed;
        b.trials[0].full = None;
        b.trials[0].objective = None;
        b.trials[0].failure = Some(TrialFailure {
            class: "oom".into(),
            evidence: "CUDA out of memory".into(),
            log_excerpt: String::new(),
        });
        for i in 0..3u32 {
            b.round(&r, 1, i, meas(120.0 + i as f64, 200.0, 900.0));
            b.round(&r, 2, i, meas(90.0 + i as f64, 200.0, 900.0));
        }
        let d = b.decide(&r, &["main"], &[1, 2], false);
        assert!(d.baseline_infeasible.is_some(), "{d:?}");
        assert_eq!(d.pending, Pending::None, "{d:?}");
        assert_eq!(d.recommended, Some(1), "{}", d.verdict);
        assert!(!d.verdict.contains("NaN"), "{}", d.verdict);
        assert!(
            d.checks
                .iter()
                .all(|c| c.state != CheckState::Inconclusive && c.state != CheckState::Regression),
            "{:?}",
            d.checks
        );
        // A candidate that misses its own constraints is still not recommended.
        let mut b2 = Book::new(&r, &[0, 1]);
        b2.trials[0] = b.trials[0].clone();
        for i in 0..3u32 {
            b2.round(&r, 1, i, meas(120.0, 400.0, 900.0));
        }
        let d = b2.decide(&r, &["main"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(!d.verdict.contains("NaN"), "{}", d.verdict);
    }

    #[test]
    fn a_study_disturbed_throughout_keeps_the_defaults_and_says_why() {
        // Every round of every arm ran beside a busy process (the optimum moves on a half-busy
        // machine): the candidate reads +50%, and nothing of it may be recommended.
        let r = rules(&[], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3u32 {
            b.round(&r, 0, i, busy(meas(100.0 + i as f64, 10.0, 100.0), 1.0));
            b.round(&r, 1, i, busy(meas(150.0 + i as f64, 10.0, 100.0), 1.0));
        }
        let d = b.decide(&r, &["main"], &[1], false);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert_eq!(d.pending, Pending::Remeasure, "more rounds may be quiet");
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert_eq!(d.pending, Pending::None);
        assert_eq!(d.set_aside.len(), 6);
        assert!(
            d.verdict
                .starts_with("keep the defaults: other processes kept this machine busy")
                && d.verdict
                    .contains("run the study again when the machine is quiet"),
            "{}",
            d.verdict
        );
    }

    #[test]
    fn a_validation_workload_whose_rounds_were_all_disturbed_blocks_the_recommendation() {
        // A clear gain on the primary; the only validation workload ran beside a busy process
        // in every round: it is not "not run yet", it is unknown, and unknown is not ok.
        let r = rules(&[], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3u32 {
            b.round(&r, 0, i, meas(100.0 + i as f64, 10.0, 100.0));
            b.round(&r, 1, i, meas(150.0 + i as f64, 10.0, 100.0));
            b.validate(&r, "other", 0, i, busy(meas(100.0, 10.0, 100.0), 1.2));
            b.validate(&r, "other", 1, i, busy(meas(100.0, 10.0, 100.0), 1.2));
        }
        let d = b.decide(&r, &["main", "other"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(
            d.checks
                .iter()
                .any(|c| c.workload == "other" && c.gate && c.state == CheckState::Inconclusive),
            "{:?}",
            d.checks
        );
        assert_eq!(d.set_aside.len(), 6);
    }

    #[test]
    fn a_leader_with_one_undisturbed_round_is_not_recommended_at_the_cap() {
        // The defaults' one quiet round misses the SLO (so any candidate that meets it would
        // count as significant) and the leader has a single quiet round; no guards. Without
        // the short-of-clean rule the gate recommends on one round of each.
        let r = rules(&["tpot:mean:300"], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        b.round(&r, 0, 0, meas(100.0, 400.0, 100.0));
        b.round(&r, 1, 0, meas(130.0, 200.0, 100.0));
        for i in 1..3u32 {
            b.round(&r, 0, i, busy(meas(100.0, 200.0, 100.0), 1.0));
            b.round(&r, 1, i, busy(meas(130.0, 200.0, 100.0), 1.0));
        }
        let d = b.decide(&r, &["main"], &[1], false);
        assert_eq!(d.pending, Pending::Remeasure);
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(
            d.verdict.contains("during 4 of 6 re-measurement runs"),
            "{}",
            d.verdict
        );
    }

    #[test]
    fn several_candidates_are_corrected_for_multiplicity() {
        let r = rules(&[], &[]);
        // Each candidate alone: one-sided p ≈ 0.015 (significant at 2.5%); three of them:
        // Holm needs 0.0083 for the smallest, so none is.
        let base = [100.0, 104.0, 96.0, 100.0];
        let cand = [106.0, 110.0, 102.0, 106.5];
        let single = {
            let mut b = Book::new(&r, &[0, 1]);
            for i in 0..4 {
                b.round(&r, 0, i, meas(base[i as usize], 10.0, 100.0));
                b.round(&r, 1, i, meas(cand[i as usize], 10.0, 100.0));
            }
            b.decide(&r, &["main"], &[1], true)
        };
        let p = single.comparisons[0].diff.as_ref().unwrap().p_gain;
        assert!(p < 0.025 && p > 0.0084, "p = {p}");
        assert_eq!(single.recommended, Some(1), "{}", single.verdict);
        let mut b = Book::new(&r, &[0, 1, 2, 3]);
        for i in 0..4 {
            b.round(&r, 0, i, meas(base[i as usize], 10.0, 100.0));
            for c in 1..=3 {
                b.round(&r, c, i, meas(cand[i as usize], 10.0, 100.0));
            }
        }
        let d = b.decide(&r, &["main"], &[1, 2, 3], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(
            d.verdict.contains("after correcting for 3 candidate(s)"),
            "{}",
            d.verdict
        );
    }

    #[test]
    fn a_guard_or_a_validation_workload_beyond_the_tolerance_blocks_the_recommendation() {
        let r = rules(&[], &["ttft:p99", "tpot:mean"]);
        // +30% throughput, but P99 TTFT doubles on the primary workload.
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3 {
            b.round(&r, 0, i, meas(100.0 + i as f64, 10.0, 100.0 + i as f64));
            b.round(&r, 1, i, meas(130.0 + i as f64, 10.0, 200.0 + i as f64));
        }
        let d = b.decide(&r, &["main"], &[1], true);
        assert_eq!(d.recommended, None);
        assert!(d.verdict.contains("regresses beyond 5%"), "{}", d.verdict);
        let ttft = d.checks.iter().find(|c| c.key == "ttft:p99").unwrap();
        assert_eq!(ttft.state, CheckState::Regression);
        // Guards off, the primary is fine; a validation workload 15% slower blocks it.
        let r = rules(&[], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3 {
            b.round(&r, 0, i, meas(100.0 + i as f64, 10.0, 100.0));
            b.round(&r, 1, i, meas(130.0 + i as f64, 10.0, 200.0));
        }
        let before = b.decide(&r, &["main", "chat"], &[1], false);
        assert_eq!(before.pending, Pending::Validate, "{before:?}");
        assert!(before.validate && before.recommended.is_none());
        for i in 0..3 {
            b.validate(&r, "chat", 0, i, meas(100.0 + i as f64, 10.0, 100.0));
            b.validate(&r, "chat", 1, i, meas(85.0 + i as f64, 10.0, 100.0));
        }
        let d = b.decide(&r, &["main", "chat"], &[1], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(d.verdict.contains("chat"), "{}", d.verdict);
    }

    /// Issue 20 item 9: the fastest candidate doubles P99 TTFT (a guard); the runner-up, 20%
    /// faster than the defaults and regressing on nothing, is recommended, and the verdict says
    /// why the faster one was passed over. Before, only the leader was checked: "keep the
    /// defaults".
    #[test]
    fn a_runner_up_that_passes_every_check_is_recommended_when_the_leader_fails_a_guard() {
        let r = rules(&[], &["ttft:p99"]);
        let mut b = Book::new(&r, &[0, 1, 2]);
        for i in 0..4 {
            let x = i as f64;
            b.round(&r, 0, i, meas(100.0 + x, 10.0, 100.0 + x));
            b.round(&r, 1, i, meas(130.0 + x, 10.0, 200.0 + x));
            b.round(&r, 2, i, meas(120.0 + x, 10.0, 101.0 + x));
        }
        let d = b.decide(&r, &["main"], &[1, 2], true);
        assert_eq!(d.recommended, Some(2), "{}", d.verdict);
        assert_eq!(d.leader, Some(2));
        assert!(d.verdict.starts_with("run trial #2"), "{}", d.verdict);
        assert!(
            d.verdict.contains(
                "trial #1 beat the defaults by more but regresses beyond 5% on: main P99 TTFT"
            ),
            "{}",
            d.verdict
        );
        // The checks shown are the recommendation's.
        let ttft = d.checks.iter().find(|c| c.key == "ttft:p99").unwrap();
        assert_eq!(ttft.state, CheckState::Ok);
        // When every significant candidate regresses, the fastest leads and is named.
        let mut b = Book::new(&r, &[0, 1, 2]);
        for i in 0..4 {
            let x = i as f64;
            b.round(&r, 0, i, meas(100.0 + x, 10.0, 100.0 + x));
            b.round(&r, 1, i, meas(130.0 + x, 10.0, 200.0 + x));
            b.round(&r, 2, i, meas(120.0 + x, 10.0, 180.0 + x));
        }
        let d = b.decide(&r, &["main"], &[1, 2], true);
        assert_eq!(d.recommended, None, "{}", d.verdict);
        assert!(
            d.verdict
                .starts_with("keep the defaults: trial #1 changes the objective"),
            "{}",
            d.verdict
        );
        assert!(
            !d.verdict.contains("beat the defaults by more"),
            "{}",
            d.verdict
        );
        // A leader whose guard is still inconclusive asks for rounds; at the cap it is passed
        // over for the runner-up that passes every check.
        let mut b = Book::new(&r, &[0, 1, 2]);
        let noisy = [95.0, 118.0, 100.0, 115.0];
        for i in 0..4 {
            let x = i as f64;
            b.round(&r, 0, i, meas(100.0 + x, 10.0, 100.0 + x));
            b.round(&r, 1, i, meas(130.0 + x, 10.0, noisy[i as usize]));
            b.round(&r, 2, i, meas(120.0 + x, 10.0, 101.0 + x));
        }
        let early = b.decide(&r, &["main"], &[1, 2], false);
        assert_eq!(early.leader, Some(1), "{}", early.verdict);
        assert_eq!(early.pending, Pending::Remeasure, "{}", early.verdict);
        let d = b.decide(&r, &["main"], &[1, 2], true);
        assert_eq!(d.recommended, Some(2), "{}", d.verdict);
        assert!(
            d.verdict.contains(
                "trial #1 beat the defaults by more but is inconclusive at the round cap on: main P99 TTFT"
            ),
            "{}",
            d.verdict
        );
    }

    /// Issue 20 item 4: tokens per joule, with one candidate round whose energy reading is
    /// missing. Before, that round entered the comparison in tokens per second (50 among
    /// readings of 2), a mean of 14 "tokens per joule"; now the whole comparison is on the
    /// fallback, output throughput, in one unit, and says so.
    #[test]
    fn a_round_without_the_objective_moves_the_whole_comparison_to_the_fallback() {
        let mut r = rules(&[], &[]);
        r.metric = ObjectiveMetric::TokensPerJoule;
        let joules = |v: f64, tpj: Option<f64>| Measurement {
            tokens_per_joule: tpj,
            ..meas(v, 10.0, 100.0)
        };
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..4 {
            let x = i as f64;
            b.round(&r, 0, i, joules(100.0 + x, Some(2.0 + 0.01 * x)));
            let tpj = (i != 2).then_some(2.2 + 0.01 * x);
            b.round(&r, 1, i, joules(110.0 + x, tpj));
        }
        let d = b.decide(&r, &["main"], &[1], true);
        let c = &d.comparisons[0];
        assert!(c.fallback, "{c:?}");
        let diff = c.diff.as_ref().unwrap();
        // Output throughput is half the total in `meas`: 55.75 against 50.75.
        assert!((diff.mean_a - 55.75).abs() < 1e-9, "{diff:?}");
        assert!((diff.mean_b - 50.75).abs() < 1e-9, "{diff:?}");
        // With every energy reading present the comparison stays in tokens per joule.
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..4 {
            let x = i as f64;
            b.round(&r, 0, i, joules(100.0 + x, Some(2.0 + 0.01 * x)));
            b.round(&r, 1, i, joules(110.0 + x, Some(2.2 + 0.01 * x)));
        }
        let d = b.decide(&r, &["main"], &[1], true);
        assert!(!d.comparisons[0].fallback);
        assert!((d.comparisons[0].diff.as_ref().unwrap().mean_a - 2.215).abs() < 1e-9);
    }

    #[test]
    fn an_interval_straddling_the_tolerance_is_inconclusive_and_asks_for_rounds() {
        let r = rules(&[], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3 {
            b.round(&r, 0, i, meas(100.0 + i as f64, 10.0, 100.0));
            b.round(&r, 1, i, meas(130.0 + i as f64, 10.0, 100.0));
        }
        // Validation: −5% on average, with ±8% noise: the interval straddles −5%.
        for (i, (x, y)) in [(100.0, 88.0), (104.0, 103.0), (96.0, 94.0)]
            .into_iter()
            .enumerate()
        {
            b.validate(&r, "chat", 0, i as u32, meas(x, 10.0, 100.0));
            b.validate(&r, "chat", 1, i as u32, meas(y, 10.0, 100.0));
        }
        let d = b.decide(&r, &["main", "chat"], &[1], false);
        let c = d
            .checks
            .iter()
            .find(|c| c.workload == "chat" && c.key == "objective")
            .unwrap();
        assert_eq!(c.state, CheckState::Inconclusive, "{c:?}");
        assert_eq!(d.pending, Pending::Validate);
        let last = b.decide(&r, &["main", "chat"], &[1], true);
        assert_eq!(last.recommended, None);
        assert!(last.verdict.contains("inconclusive"), "{}", last.verdict);
        assert!(
            last.verdict.contains("at the round cap"),
            "{}",
            last.verdict
        );
    }

    #[test]
    fn a_positive_gain_short_of_significance_asks_for_another_round() {
        let r = rules(&[], &[]);
        let mut b = Book::new(&r, &[0, 1]);
        for (i, (x, y)) in [(100.0, 104.0), (103.0, 101.0), (97.0, 105.0)]
            .into_iter()
            .enumerate()
        {
            b.round(&r, 0, i as u32, meas(x, 10.0, 100.0));
            b.round(&r, 1, i as u32, meas(y, 10.0, 100.0));
        }
        let d = b.decide(&r, &["main"], &[1], false);
        assert_eq!(d.pending, Pending::Remeasure, "{}", d.verdict);
        assert_eq!(d.recommended, None);
    }

    #[test]
    fn request_goodput_validation_workloads_are_compared_on_request_throughput() {
        let mut r = rules(&[], &[]);
        r.metric = ObjectiveMetric::RequestGoodput;
        let good = |v: f64| Measurement {
            request_goodput: Some(v),
            ..meas(100.0 * v, 10.0, 100.0)
        };
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3 {
            b.round(&r, 0, i, good(1.0 + 0.01 * i as f64));
            b.round(&r, 1, i, good(1.3 + 0.01 * i as f64));
            // No --goodput on the validation workload: no goodput, same request throughput.
            b.validate(&r, "chat", 0, i, meas(100.0 + i as f64, 10.0, 100.0));
            b.validate(&r, "chat", 1, i, meas(100.5 + i as f64, 10.0, 100.0));
        }
        let d = b.decide(&r, &["main", "chat"], &[1], true);
        assert_eq!(d.recommended, Some(1), "{}", d.verdict);
    }

    #[test]
    fn identical_max_rate_rounds_are_not_a_certain_gain() {
        let mut r = rules(&[], &[]);
        r.metric = ObjectiveMetric::MaxRate;
        let at = |rate: f64, res: f64| Measurement {
            request_rate: Some(rate),
            resolution: Some(res),
            ..meas(100.0, 10.0, 100.0)
        };
        let mut b = Book::new(&r, &[0, 1]);
        for i in 0..3 {
            // Both bracketed to within 1.4 req/s; the candidate one step higher every time.
            b.round(&r, 0, i, at(4.0, 1.4));
            b.round(&r, 1, i, at(4.4, 1.4));
        }
        let d = b.decide(&r, &["main"], &[1], true);
        let diff = d.comparisons[0].diff.as_ref().unwrap();
        assert!(diff.low < 0.0 && diff.high > diff.low, "{diff:?}");
        assert_eq!(d.recommended, None, "{}", d.verdict);
    }
}
