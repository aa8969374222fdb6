//! How candidates are re-measured and validated: which arms (every engine's defaults and the
//! best search trials), the reference among the defaults, the interleaved round plans
//! (A B C, C B A, …) of the primary workload and, for the leader, of every other workload,
//! each run to the end on a fresh engine, and the gate's answer between rounds.

use super::Runner;
use crate::tune::decide::{self, Decision, Pending};
use crate::tune::eval::{Evaluator, Measurement};
use crate::tune::records::{Phase, Rounds, StudyRecord, TrialKind, TrialRecord, TrialStatus};
use crate::tune::TuneError;

impl<E: Evaluator> Runner<E> {
    /// The search trials of the engines' defaults: one per engine (the first of each).
    pub(super) fn default_trials(&self, search: &[TrialRecord]) -> Vec<TrialRecord> {
        let mut out: Vec<TrialRecord> = Vec::new();
        for b in self.space.baselines() {
            if let Some(t) = search.iter().find(|t| t.config == b) {
                out.push(t.clone());
            }
        }
        out
    }

    /// The best engine defaults by their search runs (the first that ran, else the first).
    pub(super) fn best_searched(bases: &[TrialRecord]) -> Option<TrialRecord> {
        bases
            .iter()
            .filter(|t| !decide::failed_to_start(t))
            .max_by(|a, b| {
                a.objective
                    .unwrap_or(f64::NEG_INFINITY)
                    .total_cmp(&b.objective.unwrap_or(f64::NEG_INFINITY))
            })
            .or_else(|| bases.first())
            .cloned()
    }

    /// The baseline the candidates are compared with: the best engine default. One search run
    /// each cannot tell (a disturbed run of one engine's defaults would make another's the
    /// reference), so every engine's defaults are re-measured, and once each has rounds the
    /// reference is the one with the best pooled reading among those that met the
    /// constraints in every round (one unit for all: the objective, or its fallback for every
    /// run when one lacks it); before that, or when none met them, the best search reading.
    /// With one engine: its defaults.
    pub(super) fn baseline_of(
        &self,
        bases: &[TrialRecord],
        all: &[TrialRecord],
    ) -> Option<TrialRecord> {
        let ran: Vec<&TrialRecord> = bases
            .iter()
            .filter(|t| !decide::failed_to_start(t))
            .collect();
        if ran.len() < 2 {
            return Self::best_searched(bases);
        }
        let metric = self.metric();
        let max_cores = self.study.spec.foreign_load.max_cores;
        let rounds_of = |seq: u32| -> Vec<&TrialRecord> {
            all.iter()
                .filter(|t| {
                    matches!(t.kind, TrialKind::Remeasure { candidate, .. } if candidate == seq)
                })
                .filter(|t| t.status != TrialStatus::Running)
                .filter(|t| t.full.as_ref().is_none_or(|m| !m.disturbed(max_cores)))
                .collect()
        };
        let rounds: Vec<Vec<&TrialRecord>> = ran.iter().map(|t| rounds_of(t.seq)).collect();
        if rounds.iter().any(Vec::is_empty) {
            return Self::best_searched(bases);
        }
        let runs: Vec<Vec<&Measurement>> = rounds
            .iter()
            .map(|r| r.iter().filter_map(|t| t.full.as_ref()).collect())
            .collect();
        let slices: Vec<&[&Measurement]> = runs.iter().map(Vec::as_slice).collect();
        let fallback = decide::needs_fallback(metric, &slices);
        let pooled = ran
            .iter()
            .zip(&rounds)
            .zip(&runs)
            .filter(|((_, r), _)| r.iter().all(|t| t.status == TrialStatus::Ok))
            .filter_map(|((t, _), m)| {
                let v = decide::comparable(metric, fallback, m);
                (!v.is_empty()).then(|| (*t, v.iter().sum::<f64>() / v.len() as f64))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(t, _)| t.clone());
        pooled.or_else(|| Self::best_searched(bases))
    }

    pub(super) fn candidates(
        &self,
        search: &[TrialRecord],
        baseline: &TrialRecord,
    ) -> Vec<TrialRecord> {
        let mut c: Vec<TrialRecord> = search
            .iter()
            .filter(|t| {
                t.seq != baseline.seq && t.objective.is_some() && t.config != baseline.config
            })
            .cloned()
            .collect();
        c.sort_by(|a, b| {
            b.objective
                .unwrap_or(0.0)
                .total_cmp(&a.objective.unwrap_or(0.0))
        });
        c.truncate(self.study.spec.remeasure.top as usize);
        c
    }

    /// Runs the measurements of `plan` that have no finished record yet.
    pub(super) async fn run_plan(
        &mut self,
        rec: &StudyRecord,
        plan: Vec<(TrialKind, u32, usize)>,
    ) -> Result<(), TuneError> {
        let total = plan.len();
        for (i, (kind, candidate, workload)) in plan.into_iter().enumerate() {
            self.check_cancel()?;
            let all = self.records.trials(&rec.id)?;
            let existing = all.iter().find(|t| t.kind == kind).cloned();
            let mut t = match existing {
                Some(t) if t.status != TrialStatus::Running => continue,
                Some(t) => {
                    let t = self.resume_trial(&t);
                    if t.status == TrialStatus::Failed {
                        self.put_trial(&t)?;
                        continue;
                    }
                    t
                }
                None => {
                    let cfg = all
                        .iter()
                        .find(|t| t.seq == candidate)
                        .map(|t| t.config.clone())
                        .ok_or_else(|| {
                            TuneError::Infrastructure(format!("trial {candidate} is missing"))
                        })?;
                    self.new_trial(
                        all.len() as u32,
                        kind.clone(),
                        cfg,
                        format!("re-measure of #{candidate}"),
                        None,
                    )
                }
            };
            // Stored once placed: the status never shows it running without its slot.
            self.place_alone(&mut t);
            self.put_trial(&t)?;
            self.exec().run_round(&mut t, candidate, workload).await?;
            let label = match &t.kind {
                TrialKind::Remeasure { round, .. } => format!("re-measure round {}", round + 1),
                TrialKind::Validate {
                    workload, round, ..
                } => format!("validation on {workload}, round {}", round + 1),
                TrialKind::Search => "search".into(),
            };
            let v = t
                .full
                .as_ref()
                .and_then(|m| decide::value_of(self.metric(), m))
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| format!("{:?}", t.status).to_lowercase());
            let miss = t
                .early_stop
                .as_deref()
                .map(|e| format!(" (misses: {e})"))
                .unwrap_or_default();
            self.say(&format!(
                "{label} ({}/{total}): #{candidate} → {v}{miss}",
                i + 1
            ));
        }
        Ok(())
    }

    /// The defaults and the candidates to re-measure: the defaults are always an arm, unless
    /// they failed to start (a classified engine failure: nothing to measure).
    pub(super) fn arms(&self, all: &[TrialRecord]) -> Option<(TrialRecord, Vec<u32>)> {
        let search: Vec<TrialRecord> = all
            .iter()
            .filter(|t| t.kind == TrialKind::Search)
            .cloned()
            .collect();
        let bases = self.default_trials(&search);
        // The arms are fixed by the search records alone (the candidates beside the best
        // searched defaults, and every engine's defaults), so that they are the same at every
        // look and after a resume; the reference among the defaults may move with the rounds
        // (`baseline_of`), the others are compared like any candidate: one may beat it.
        let searched = Self::best_searched(&bases)?;
        let mut arms: Vec<u32> = self
            .candidates(&search, &searched)
            .iter()
            .map(|t| t.seq)
            .collect();
        for b in &bases {
            if !arms.contains(&b.seq) && !decide::failed_to_start(b) {
                arms.push(b.seq);
            }
        }
        let base = self.baseline_of(&bases, all)?;
        arms.retain(|a| *a != base.seq);
        Some((base, arms))
    }

    /// The gate's answer on the records so far (`last`: no more rounds may be run).
    pub(super) fn decision(&self, all: &[TrialRecord], last: bool) -> Option<Decision> {
        self.decision_open(all, last, &[])
    }

    /// As `decision`, with candidates whose validation may still run (`decide::Input::open`).
    pub(super) fn decision_open(
        &self,
        all: &[TrialRecord],
        last: bool,
        open: &[u32],
    ) -> Option<Decision> {
        let (base, cands) = self.arms(all)?;
        let names = self.eval.workloads();
        let rules = decide::Rules::of(&self.study.spec, &self.study.limits);
        Some(decide::decide(
            &rules,
            &decide::Input {
                workloads: &names,
                baseline: &base,
                candidates: &cands,
                trials: all,
                last,
                open,
            },
        ))
    }

    /// Interleaved rounds of the primary workload: the defaults and every candidate, A B C,
    /// C B A, …; at least `repeats`, then more while the gate says another round could change
    /// its answer, up to `max_repeats`.
    pub(super) async fn remeasure(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        let all = self.records.trials(&rec.id)?;
        let Some((base, cands)) = self.arms(&all) else {
            rec.phase = Phase::Done;
            rec.outcome = None;
            self.save(rec)?;
            return Err(TuneError::Infrastructure(
                "no baseline trial was recorded".into(),
            ));
        };
        let mut arms: Vec<u32> = if !decide::failed_to_start(&base) {
            vec![base.seq]
        } else {
            Vec::new()
        };
        arms.extend(cands.iter().copied());
        if cands.is_empty() {
            rec.phase = Phase::Validate;
            return self.save(rec);
        }
        let (min, max) = (
            self.study.spec.remeasure.repeats,
            self.study.spec.remeasure.max_repeats,
        );
        self.say(&format!(
            "re-measuring the defaults #{} and {} candidate(s), {min} to {max} rounds interleaved",
            base.seq,
            cands.len(),
        ));
        let mut round = 0;
        loop {
            if round >= min {
                let all = self.records.trials(&rec.id)?;
                let d = self.decision(&all, round >= max);
                if d.as_ref().is_none_or(|d| d.pending != Pending::Remeasure) || round >= max {
                    break;
                }
                self.say(&format!(
                    "after {round} rounds the gain is not settled ({}); another round",
                    d.map(|d| d.verdict).unwrap_or_default()
                ));
            }
            let order: Vec<u32> = if round % 2 == 0 {
                arms.clone()
            } else {
                arms.iter().rev().copied().collect()
            };
            let plan = order
                .into_iter()
                .map(|a| {
                    (
                        TrialKind::Remeasure {
                            round,
                            candidate: a,
                        },
                        a,
                        0,
                    )
                })
                .collect();
            self.run_plan(rec, plan).await?;
            round += 1;
        }
        rec.phase = Phase::Validate;
        self.save(rec)
    }

    /// The validation rounds `candidate` has finished (a round's trial still running, as after
    /// a crash, does not count).
    pub(super) fn rounds_led(all: &[TrialRecord], candidate: u32) -> u32 {
        let mut rounds: Vec<u32> = all
            .iter()
            .filter_map(|t| match &t.kind {
                TrialKind::Validate {
                    round,
                    candidate: c,
                    ..
                } if *c == candidate && t.status != TrialStatus::Running => Some(*round),
                _ => None,
            })
            .collect();
        rounds.sort_unstable();
        rounds.dedup();
        rounds.len() as u32
    }

    /// The index of the next validation round of `leader` (rounds are numbered across
    /// leaders): the last round again when it is the leader's and not finished (a resume after
    /// a crash picks up the same trials), else the one after it.
    pub(super) fn next_validation_round(
        all: &[TrialRecord],
        workloads: usize,
        base: u32,
        leader: u32,
    ) -> u32 {
        let last = all
            .iter()
            .filter_map(|t| match &t.kind {
                TrialKind::Validate { round, .. } => Some(*round),
                _ => None,
            })
            .max();
        let Some(last) = last else { return 0 };
        let in_last = |arm: u32| {
            all.iter().filter(move |t| {
                matches!(&t.kind, TrialKind::Validate { round, candidate, .. } if *round == last && *candidate == arm)
            })
        };
        let finished = |arm: u32| {
            in_last(arm)
                .filter(|t| t.status != TrialStatus::Running)
                .count()
                >= workloads.saturating_sub(1)
        };
        let leaders = in_last(leader).next().is_some();
        if leaders && !(finished(base) && finished(leader)) {
            last
        } else {
            last + 1
        }
    }

    pub(super) fn rounds_of(all: &[TrialRecord], remeasure: bool) -> u32 {
        all.iter()
            .filter_map(|t| match (&t.kind, remeasure) {
                (TrialKind::Remeasure { round, .. }, true) => Some(round + 1),
                (TrialKind::Validate { round, .. }, false) => Some(round + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The leader and the defaults on every other workload, interleaved, while the gate asks
    /// for validation (up to the cap); then the final decision, the outcome and the best record.
    pub(super) async fn validate(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        let all = self.records.trials(&rec.id)?;
        let (base, _) = self
            .arms(&all)
            .ok_or_else(|| TuneError::Infrastructure("no baseline trial was recorded".into()))?;
        let names = self.eval.workloads();
        let (min, max) = (
            self.study.spec.remeasure.repeats,
            self.study.spec.remeasure.max_repeats,
        );
        let remeasure_rounds = Self::rounds_of(&all, true);
        let why;
        loop {
            let all = self.records.trials(&rec.id)?;
            // The minimum and the cap count each leader's own rounds: a runner-up that leads
            // once the first leader was passed over (a regression, or a check still
            // inconclusive at its cap) is validated in rounds of its own.
            let cands = self.arms(&all).map(|(_, c)| c).unwrap_or_default();
            let open: Vec<u32> = cands
                .iter()
                .copied()
                .filter(|&c| Self::rounds_led(&all, c) < max)
                .collect();
            let Some(d) = self.decision_open(&all, open.len() < cands.len(), &open) else {
                why = "no baseline".to_owned();
                break;
            };
            let done = d.leader.map_or(0, |l| Self::rounds_led(&all, l));
            if !d.validate {
                why = if d.pending == Pending::Remeasure {
                    format!("the gain was not settled at the cap of {remeasure_rounds} re-measurement rounds")
                } else if d.leader.is_none() {
                    "no candidate met the constraints in its pooled rounds".into()
                } else if d.recommended.is_none() && names.len() > 1 {
                    "no candidate passed the re-measurement, so none was validated".into()
                } else {
                    "the decision was clear".into()
                };
                break;
            }
            if done >= min && d.pending != Pending::Validate {
                why = format!("the decision was clear after {done} validation rounds");
                break;
            }
            if done >= max {
                why = format!("validation reached its cap of {max} rounds");
                break;
            }
            let Some(leader) = d.leader else {
                why = "no leader".to_owned();
                break;
            };
            if done == 0 {
                self.say(&format!(
                    "validating trial #{leader} against the defaults #{} on {} other workload(s)",
                    base.seq,
                    names.len() - 1
                ));
            } else if done >= min {
                self.say(&format!(
                    "after {done} validation rounds it is not settled ({}); another round",
                    d.verdict
                ));
            }
            let round = Self::next_validation_round(&all, names.len(), base.seq, leader);
            let order = if round % 2 == 0 {
                [base.seq, leader]
            } else {
                [leader, base.seq]
            };
            let mut plan = Vec::new();
            for (wi, name) in names.iter().enumerate().skip(1) {
                for a in order {
                    plan.push((
                        TrialKind::Validate {
                            workload: name.clone(),
                            round,
                            candidate: a,
                        },
                        a,
                        wi,
                    ));
                }
            }
            self.run_plan(rec, plan).await?;
        }
        let all = self.records.trials(&rec.id)?;
        let d = self
            .decision(&all, true)
            .ok_or_else(|| TuneError::Infrastructure("no baseline trial was recorded".into()))?;
        self.say(&d.verdict);
        let rounds = Rounds {
            remeasure: Self::rounds_of(&all, true),
            validation: Self::rounds_of(&all, false),
            why,
        };
        self.finish_study(rec, &all, &base, d, rounds)
    }
}
