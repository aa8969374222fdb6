//! The verdict's wording: the one sentence (run trial #N, or keep the defaults, and why) that
//! the CLI, the report, the daemon's views and the API print, worded once from the decision's
//! data (`Draft`) when the gate decides, and stored with it.

use super::{Check, CheckState, Comparison, Input, Leader, Pending, Rules, SetAside};
use crate::tune::significance::Diff;

/// What the verdict is worded from: the decision's data before it is stored.
pub(super) struct Draft<'a> {
    pub comparisons: &'a [Comparison],
    /// Candidates tested (Holm's family size).
    pub tested: usize,
    pub recommended: Option<u32>,
    pub lead: &'a Leader,
    pub baseline_infeasible: Option<&'a str>,
    pub pending: Pending,
    pub aside: &'a SetAside,
}

impl Draft<'_> {
    /// The verdict: what to run (or to keep the defaults) and why, then what was passed over
    /// and what was set aside.
    pub(super) fn render(&self, rules: &Rules, input: &Input) -> String {
        let verdict = match (&self.recommended, &self.lead.significant) {
            (Some(r), Some(l)) => self.recommend(rules, *r, l),
            (None, Some(l)) => self.hold(rules, input, l),
            (_, None) => self.nothing_significant(rules, input),
        };
        let verdict = if self.lead.passed_over.is_empty() {
            verdict
        } else {
            let faster: Vec<String> = self
                .lead
                .passed_over
                .iter()
                .map(|(c, why)| format!("trial #{c} beat the defaults by more but {why}"))
                .collect();
            format!("{verdict} ({})", faster.join("; "))
        };
        self.with_set_aside(rules, input, verdict)
    }

    /// A recommendation: the gain, or the constraints the defaults miss.
    fn recommend(&self, rules: &Rules, r: u32, l: &Comparison) -> String {
        let tol = 100.0 * rules.tolerance;
        let d = l
            .diff
            .as_ref()
            .expect("a significant comparison has a diff");
        match self.baseline_infeasible {
            Some(why) if d.n_b == 0 => format!(
                "run trial #{r}: the engine's defaults {why}; trial #{r} meets the constraints in its pooled rounds ({:.2}, 95% CI {:.2} to {:.2}, {} rounds) and regresses on no workload beyond {tol:.0}%",
                d.mean_a, d.low, d.high, d.n_a
            ),
            Some(why) => format!(
                "run trial #{r}: the engine's defaults miss the constraints in their pooled rounds ({why}); trial #{r} meets them, at {:.2} against the defaults' {:.2} ({}, {} rounds each), and regresses on no workload beyond {tol:.0}%",
                d.mean_a, d.mean_b, pct(d), d.n_a
            ),
            None => format!(
                "run trial #{r}: it beats the defaults by {} over {} interleaved rounds each; Holm-adjusted one-sided p = {:.4} over {} candidate(s); no workload or guard regresses beyond {tol:.0}%",
                pct(d),
                d.n_a,
                l.p_adjusted.unwrap_or(f64::NAN),
                self.tested
            ),
        }
    }

    /// A significant leader not recommended: it regresses, is inconclusive, or is not
    /// validated yet.
    fn hold(&self, rules: &Rules, input: &Input, l: &Comparison) -> String {
        let tol = 100.0 * rules.tolerance;
        let d = l
            .diff
            .as_ref()
            .expect("a significant comparison has a diff");
        let regress = describe(&self.lead.checks, CheckState::Regression, rules.alpha);
        let unsure = describe(&self.lead.checks, CheckState::Inconclusive, rules.alpha);
        if !regress.is_empty() {
            format!(
                "keep the defaults: trial #{} changes the objective by {}, but regresses beyond {tol:.0}% on: {}",
                l.candidate,
                pct(d),
                regress.join("; ")
            )
        } else if !unsure.is_empty() || self.pending != Pending::None {
            format!(
                "keep the defaults: trial #{} changes the objective by {}, but {} {}; not recommended without more rounds",
                l.candidate,
                pct(d),
                if unsure.is_empty() {
                    "its validation has not run".to_owned()
                } else {
                    format!("its effect is inconclusive (the interval straddles the {tol:.0}% tolerance) on: {}", unsure.join("; "))
                },
                if super::is_final(input, l.candidate) { "at the round cap" } else { "so far" }
            )
        } else {
            format!(
                "keep the defaults: trial #{} was not validated on every workload",
                l.candidate
            )
        }
    }

    /// No significant candidate: none beat the defaults after the correction, or none met
    /// the constraints.
    fn nothing_significant(&self, rules: &Rules, input: &Input) -> String {
        if input.candidates.is_empty() {
            return "keep the defaults: no configuration other than the defaults met the constraints in the search".into();
        }
        if let Some(c) = &self.lead.closest {
            let d = c.diff.as_ref().expect("closest has a diff");
            return format!(
                "keep the defaults: no candidate beats them significantly after correcting for {} candidate(s); the best, trial #{}, is {} over {} rounds (Holm-adjusted one-sided p = {:.3} against {}, the level per look)",
                self.tested,
                c.candidate,
                pct(d),
                d.n_a,
                c.p_adjusted.unwrap_or(f64::NAN),
                rules.alpha
            );
        }
        let why: Vec<String> = self
            .comparisons
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

    /// The verdict with the rounds set aside: as the machine's failures, or disturbed by
    /// other processes; when too few clean rounds remain, the verdict says so instead.
    fn with_set_aside(&self, rules: &Rules, input: &Input, verdict: String) -> String {
        let a = self.aside;
        let so_far = if input.last {
            " at the round cap"
        } else {
            " so far"
        };
        let verdict = if a.machine.is_empty() {
            verdict
        } else if self.recommended.is_none() && a.short_of_clean && a.disturbed.is_empty() {
            format!(
                "keep the defaults: the defaults' own engine failed in re-measurement rounds (trials {}), so this machine could not run them{so_far}; run the study again when the machine is quiet",
                list(&a.machine),
            )
        } else {
            format!(
                "{verdict} ({} failed run(s) set aside: the defaults failed in the same round, so the machine, not the configuration, failed: trials {})",
                a.machine.len(),
                list(&a.machine)
            )
        };
        if a.disturbed.is_empty() {
            return verdict;
        }
        let worst =
            a.disturbed
                .iter()
                .map(|d| d.1)
                .fold(0.0_f64, |a, b| if b.is_nan() { a } else { a.max(b) });
        if self.recommended.is_none() && a.short_of_clean {
            format!(
                "keep the defaults: other processes kept this machine busy (up to {worst:.2} cores, limit {:.2}) during {} of {} re-measurement runs, and too few undisturbed rounds remain to decide{so_far}; run the study again when the machine is quiet",
                rules.max_foreign_cores, a.primary_disturbed, a.primary_rounds
            )
        } else {
            format!(
                "{verdict} ({} disturbed round(s) set aside: other processes kept up to {worst:.2} cores busy, limit {:.2})",
                a.disturbed.len(),
                rules.max_foreign_cores
            )
        }
    }
}

/// A relative change with its 95% interval (`+12.0% (95% CI +8.1% to +15.9%)`), or, with no
/// defaults to compare with, the level and its interval.
pub(super) fn pct(d: &Diff) -> String {
    if d.n_b == 0 || !d.pct.is_finite() {
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

/// The gating checks in `state`, as the verdict names them (`chat ttft:p99 +12.0% …`), with
/// the interval the state was decided on (at the level per look `alpha`), which is wider than
/// the 95% one shown beside it.
pub(super) fn describe(checks: &[Check], state: CheckState, alpha: f64) -> Vec<String> {
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
