//! The end of a study: the gate's final decision becomes the stored outcome (verdict,
//! comparisons, checks, rounds, screening's savings) and, through `best`, the best record for
//! the node and workload.

use super::Runner;
use crate::space::CommandLine;
use crate::tune::best;
use crate::tune::decide::{self, Decision};
use crate::tune::eval::Evaluator;
use crate::tune::records::{Outcome, Phase, Rounds, StudyRecord, TrialKind, TrialRecord};
use crate::tune::TuneError;
use crate::util::unix_now;

impl<E: Evaluator> Runner<E> {
    /// Stores the outcome and, when the gate recommends a configuration, the best record.
    pub(super) fn finish_study(
        &mut self,
        rec: &mut StudyRecord,
        all: &[TrialRecord],
        base: &TrialRecord,
        d: Decision,
        rounds: Rounds,
    ) -> Result<(), TuneError> {
        let names = self.eval.workloads();
        let search_all: Vec<&TrialRecord> =
            all.iter().filter(|t| t.kind == TrialKind::Search).collect();
        let recommended_trial = d
            .recommended
            .and_then(|r| all.iter().find(|t| t.seq == r))
            .cloned();
        let outcome = Outcome {
            metric: self.metric().label().into(),
            baseline_trial: base.seq,
            recommended: d.recommended,
            recommended_command: recommended_trial
                .as_ref()
                .and_then(|t| t.command.as_ref())
                .map(CommandLine::serving),
            recommended_config: recommended_trial.as_ref().map(|t| t.config.clone()),
            comparisons: d.comparisons,
            verdict: d.verdict,
            leader: d.leader,
            checks: d.checks,
            baseline_infeasible: d.baseline_infeasible,
            rounds,
            set_aside: d.set_aside,
            search_trials: search_all.len() as u32,
            screened_only: search_all
                .iter()
                .filter(|t| t.screen.is_some() && !t.promoted)
                .count() as u32,
            bench_s: all.iter().map(|t| t.bench_s).sum(),
            saved_s: search_all.iter().map(|t| t.saved_s).sum(),
            level: Some(decide::Rules::of(&self.study.spec, &self.study.limits).alpha),
        };
        // The best known configuration for this node and workload: what the gate recommends,
        // else the defaults, unless an earlier study proved a configuration better than them
        // (`best::keep_or_write`).
        let chosen = recommended_trial.as_ref().unwrap_or(base);
        if let Some(workload) = names.first() {
            let b = best::proposed(
                &self.study.model,
                &rec.hardware,
                &rec.id,
                workload,
                &outcome,
                chosen,
                unix_now(),
            );
            if let Some(prev) = best::keep_or_write(&self.records, &b)? {
                let msg = format!(
                    "the best record stays the proven one (study {}, trial #{})",
                    prev.study, prev.trial
                );
                self.say(&msg);
            }
        }
        if outcome.saved_s > 0.0 {
            let line = format!(
                "screening saved {:.0} s of benchmark time ({:.0}% of {:.0} s without it)",
                outcome.saved_s,
                100.0 * outcome.saved_s / (outcome.bench_s + outcome.saved_s),
                outcome.bench_s + outcome.saved_s
            );
            self.say(&line);
        }
        rec.outcome = Some(outcome);
        rec.phase = Phase::Done;
        self.save(rec)
    }
}
