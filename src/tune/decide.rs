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

use super::records::TrialRecord;
use super::significance::welch_with_resolution;
use super::spec::{ObjectiveMetric, StudySpec};
use crate::bench::abort::LatencyLimit;

mod checks;
mod pool;
mod verdict;

pub use super::records::{Check, CheckState, Comparison};
pub use checks::check_state;
use checks::{alone, workload_checks};
pub use pool::{
    comparable, failed_to_start, holm, needs_fallback, pooled_violation, refused, value_of,
    violation_established, REFUSALS,
};
use pool::{resolution, runs, Runs};

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

impl Rules {
    /// The gate's rules from a study file's constraints and validation settings.
    pub fn of(spec: &StudySpec, limits: &[LatencyLimit]) -> Rules {
        Rules {
            metric: spec.objective.metric,
            min_success_rate: spec.constraints.min_success_rate,
            limits: limits.to_vec(),
            tolerance: spec.validation.tolerance,
            guards: spec
                .validation
                .guards
                .iter()
                .map(|g| Guard { key: g.clone() })
                .collect(),
            alpha: alpha_per_look(spec.remeasure.repeats, spec.remeasure.max_repeats),
            max_foreign_cores: spec.foreign_load.max_cores,
        }
    }
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

/// One arm's rounds of workload `wi` in the decision's records.
fn arm_runs<'a>(rules: &Rules, input: &Input<'a>, wi: usize, arm: u32) -> Runs<'a> {
    runs(
        rules,
        input.trials,
        input.workloads,
        wi,
        (input.baseline.seq, arm),
    )
}

/// Why the defaults miss the constraints, if they do: they failed to start, failed a round,
/// or (measured in every round) miss them beyond doubt. Every round set aside: unknown.
fn baseline_infeasible(rules: &Rules, base: &TrialRecord, base_runs: &Runs) -> Option<String> {
    if failed_to_start(base) {
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
        None
    } else if !base_runs.failed.is_empty() {
        pooled_violation(
            &base_runs.measured,
            &base_runs.failed,
            rules.min_success_rate,
            &rules.limits,
        )
    } else {
        violation_established(
            &base_runs.measured,
            rules.min_success_rate,
            &rules.limits,
            rules.alpha,
        )
    }
}

/// Each candidate's gain over the defaults on the primary workload (step 2): disqualified
/// when it misses the constraints pooled, else Holm-corrected over the candidates tested
/// (returned: how many), or, against defaults that miss the constraints, meeting them at no
/// loss beyond the tolerance.
fn compare(
    rules: &Rules,
    input: &Input,
    base_runs: &Runs,
    base_infeasible: bool,
) -> (Vec<Comparison>, usize) {
    let command_of = |seq: u32| {
        input
            .trials
            .iter()
            .find(|t| t.seq == seq)
            .and_then(|t| t.command.clone())
    };
    let mut comparisons: Vec<Comparison> = input
        .candidates
        .iter()
        .map(|&c| {
            let r = arm_runs(rules, input, 0, c);
            let fallback = needs_fallback(rules.metric, &[&r.measured, &base_runs.measured]);
            let cvals = comparable(rules.metric, fallback, &r.measured);
            let bvals = comparable(rules.metric, fallback, &base_runs.measured);
            let res = resolution(&r.measured).max(resolution(&base_runs.measured));
            let diff = (!cvals.is_empty() && !bvals.is_empty())
                .then(|| welch_with_resolution(&cvals, &bvals, res))
                .or_else(|| (!cvals.is_empty()).then(|| alone(&cvals)));
            let disqualified = if r.measured.is_empty() && r.failed.is_empty() && r.any_set_aside()
            {
                Some("every round was set aside (disturbed by other processes, or the defaults failed in it too)".into())
            } else {
                pooled_violation(&r.measured, &r.failed, rules.min_success_rate, &rules.limits)
            };
            Comparison {
                candidate: c,
                command: command_of(c),
                fallback,
                diff,
                p_adjusted: None,
                significant: false,
                disqualified,
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
        c.significant = match (base_infeasible, &c.diff) {
            (true, Some(d)) if d.n_b > 0 => d.pct_bounds(rules.alpha).0 >= -100.0 * rules.tolerance,
            (true, _) => true,
            (false, _) => adj[k] <= rules.alpha,
        };
    }
    (comparisons, tested.len())
}

/// What candidates are ranked by: their gain relative to the defaults (each comparison has
/// its own unit, the objective or its fallback, so means are not comparable across them);
/// with no defaults to compare with, the mean (every comparison alone).
fn rank(c: &Comparison) -> f64 {
    c.diff.as_ref().map_or(f64::NEG_INFINITY, |d| {
        if d.n_b > 0 && d.pct.is_finite() {
            d.pct
        } else {
            d.mean_a
        }
    })
}

/// One candidate's checks on every workload it has run (a validation workload it has not
/// run yet is skipped; one whose rounds were all set aside is not: its checks are
/// inconclusive).
fn candidate_checks(rules: &Rules, input: &Input, cand: u32) -> Vec<Check> {
    let base = input.baseline;
    let mut checks = Vec::new();
    for (wi, name) in input.workloads.iter().enumerate() {
        let b = arm_runs(rules, input, wi, base.seq);
        let c = arm_runs(rules, input, wi, cand);
        // Not run by this candidate (the defaults may have run it beside an earlier leader).
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
            failed_to_start(base),
        ));
    }
    checks
}

/// Whether `cand`'s inconclusive checks are final: the last word, and no validation rounds
/// of its own left (`Input::open`).
fn is_final(input: &Input, cand: u32) -> bool {
    input.last && !input.open.contains(&cand)
}

/// The candidate the checks are about (step 3).
struct Leader {
    /// The first significant candidate, fastest first, that regresses on nothing (and, when
    /// final, is inconclusive on nothing); when every one does, the fastest.
    significant: Option<Comparison>,
    /// With none significant, the one that came closest.
    closest: Option<Comparison>,
    /// The leader's checks (the significant one's, else the closest's).
    checks: Vec<Check>,
    /// Faster significant candidates passed over, and why.
    passed_over: Vec<(u32, String)>,
}

impl Leader {
    fn find(rules: &Rules, input: &Input, comparisons: &[Comparison]) -> Leader {
        // (The Holm correction already covers every candidate, so looking past the first adds
        // no test.)
        let mut ranked: Vec<&Comparison> = comparisons.iter().filter(|c| c.significant).collect();
        ranked.sort_by(|a, b| rank(b).total_cmp(&rank(a)));
        let tol = 100.0 * rules.tolerance;
        let mut passed_over: Vec<(u32, String)> = Vec::new();
        let mut significant: Option<(Comparison, Vec<Check>)> = None;
        for c in &ranked {
            let k = candidate_checks(rules, input, c.candidate);
            let regress = verdict::describe(&k, CheckState::Regression, rules.alpha);
            // At the last look an inconclusive check will not be settled either: a candidate
            // left with one is passed over too, for one that passes every check.
            let unsure = if is_final(input, c.candidate) {
                verdict::describe(&k, CheckState::Inconclusive, rules.alpha)
            } else {
                Vec::new()
            };
            if regress.is_empty() && unsure.is_empty() {
                significant = Some(((*c).clone(), k));
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
        if significant.is_none() {
            passed_over.clear();
            significant = ranked
                .first()
                .map(|c| ((*c).clone(), candidate_checks(rules, input, c.candidate)));
        }
        let closest = comparisons
            .iter()
            .filter(|c| c.disqualified.is_none() && c.diff.is_some())
            .max_by(|a, b| rank(a).total_cmp(&rank(b)))
            .cloned();
        let (significant, checks) = match significant {
            Some((c, k)) => (Some(c), k),
            None => {
                let k = closest
                    .as_ref()
                    .map(|l| candidate_checks(rules, input, l.candidate))
                    .unwrap_or_default();
                (None, k)
            }
        };
        Leader {
            significant,
            closest,
            checks,
            passed_over,
        }
    }

    /// The leader: the significant one, else the closest.
    fn any(&self) -> Option<&Comparison> {
        self.significant.as_ref().or(self.closest.as_ref())
    }
}

/// The rounds set aside (step 0) and whether the defaults or the leader (with no leader: any
/// candidate) is left with fewer than 2 undisturbed rounds of the primary workload: no
/// interval means anything then, and more rounds may be quiet.
struct SetAside {
    /// Disturbed rounds `(trial, foreign cores)`, by trial, each once.
    disturbed: Vec<(u32, f64)>,
    /// Failed runs set aside as the machine's, by trial, each once.
    machine: Vec<u32>,
    /// Disturbed runs of the primary workload, and its runs in all.
    primary_disturbed: usize,
    primary_rounds: usize,
    short_of_clean: bool,
}

impl SetAside {
    fn count(rules: &Rules, input: &Input, leader: Option<&Comparison>) -> SetAside {
        let mut disturbed: Vec<(u32, f64)> = Vec::new();
        let mut machine: Vec<u32> = Vec::new();
        let (mut primary_disturbed, mut primary_rounds) = (0usize, 0usize);
        let base = input.baseline.seq;
        for wi in 0..input.workloads.len() {
            for arm in std::iter::once(base).chain(input.candidates.iter().copied()) {
                let r = arm_runs(rules, input, wi, arm);
                if wi == 0 {
                    primary_rounds +=
                        r.measured.len() + r.disturbed.len() + r.failed.len() + r.machine.len();
                    primary_disturbed += r.disturbed.len();
                }
                disturbed.extend(r.disturbed);
                machine.extend(r.machine);
            }
        }
        let short = |arm: u32| {
            let r = arm_runs(rules, input, 0, arm);
            r.failed.is_empty() && r.measured.len() < 2 && r.any_set_aside()
        };
        let short_of_clean = (!failed_to_start(input.baseline) && short(base))
            || match leader {
                Some(l) => short(l.candidate),
                None => input.candidates.iter().any(|&c| short(c)),
            };
        disturbed.sort_by_key(|d| d.0);
        disturbed.dedup_by_key(|d| d.0);
        machine.sort_unstable();
        machine.dedup();
        SetAside {
            disturbed,
            machine,
            primary_disturbed,
            primary_rounds,
            short_of_clean,
        }
    }
}

/// Decides. See the module header for the rule.
pub fn decide(rules: &Rules, input: &Input) -> Decision {
    let base_runs = arm_runs(rules, input, 0, input.baseline.seq);
    let baseline_infeasible = baseline_infeasible(rules, input.baseline, &base_runs);
    let (comparisons, tested) = compare(rules, input, &base_runs, baseline_infeasible.is_some());
    let lead = Leader::find(rules, input, &comparisons);
    let leader = lead.any();
    let primary = input.workloads.first().cloned().unwrap_or_default();
    let any = |wl_primary: bool, state: CheckState| {
        lead.checks
            .iter()
            .any(|c| c.gate && (c.workload == primary) == wl_primary && c.state == state)
    };
    let primary_regress = any(true, CheckState::Regression);
    let primary_unsure = any(true, CheckState::Inconclusive);
    let validated_any = lead.checks.iter().any(|c| c.workload != primary);
    let valid_regress = any(false, CheckState::Regression);
    let valid_unsure = any(false, CheckState::Inconclusive);
    let needs_validation = input.workloads.len() > 1;
    let significant = lead.significant.is_some();
    // What more rounds could settle.
    let gain_could_come = !significant
        && lead
            .closest
            .as_ref()
            .and_then(|c| c.diff.as_ref())
            .is_some_and(|d| d.diff > 0.0);
    let aside = SetAside::count(rules, input, leader);
    let pending = if (aside.short_of_clean && !input.last)
        || gain_could_come
        || (significant && primary_unsure)
    {
        Pending::Remeasure
    } else if significant
        && !primary_regress
        && needs_validation
        && (!validated_any || valid_unsure)
        && !valid_regress
    {
        Pending::Validate
    } else {
        Pending::None
    };
    let validate = significant
        && !aside.short_of_clean
        && !primary_regress
        && !primary_unsure
        && needs_validation
        && !gain_could_come;
    let recommended = lead.significant.as_ref().and_then(|l| {
        let all_ok = lead
            .checks
            .iter()
            .filter(|c| c.gate)
            .all(|c| c.state == CheckState::Ok);
        let validated = !needs_validation || validated_any;
        (all_ok && validated && !aside.short_of_clean && pending == Pending::None)
            .then_some(l.candidate)
    });
    let verdict = verdict::Draft {
        comparisons: &comparisons,
        tested,
        recommended,
        lead: &lead,
        baseline_infeasible: baseline_infeasible.as_deref(),
        pending,
        aside: &aside,
    }
    .render(rules, input);
    Decision {
        recommended,
        leader: leader.map(|l| l.candidate),
        checks: lead.checks.clone(),
        comparisons,
        baseline_infeasible,
        pending,
        validate,
        set_aside: aside
            .disturbed
            .iter()
            .map(|d| d.0)
            .chain(aside.machine.iter().copied())
            .collect(),
        verdict,
    }
}

#[cfg(test)]
mod tests;
