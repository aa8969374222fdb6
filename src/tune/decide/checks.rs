//! The leader's checks against the defaults on one workload: the objective (validation
//! workloads), the success rate and every latency limit (where the defaults meet them), and
//! the guard metrics (primary workload), each a relative change whose state (ok, regression,
//! inconclusive) is read on its bounds at the level per look.

use super::pool::{fallback_of, needs_fallback, pooled_violation, resolution, Runs};
use super::{Check, CheckState, Rules};
use crate::tune::eval::Measurement;
use crate::tune::significance::{welch_with_resolution, Diff};

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

pub(super) fn latency_label(key: &str) -> String {
    let (m, s) = key.split_once(':').unwrap_or((key, ""));
    let stat = match s {
        "mean" => "mean".to_owned(),
        "median" => "median".to_owned(),
        p => p.to_uppercase(),
    };
    format!("{stat} {} (ms)", m.to_uppercase())
}

/// The comparison of the leader and the defaults on one workload.
pub(super) fn workload_checks(
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
pub(super) fn alone(v: &[f64]) -> Diff {
    let (m, h) = crate::tune::significance::mean_interval(v).unwrap_or((f64::NAN, f64::INFINITY));
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
