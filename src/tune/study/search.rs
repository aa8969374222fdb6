//! The search loop: propose → screen → promote → full run, one search trial at a time, until
//! the budget or convergence stops it; the importance phase's findings once its moves are
//! measured; what the optimiser learns from each trial (`obs`); the progress line per trial.

use super::exec::Against;
use super::{active_s, Runner};
use crate::space::CommandLine;
use crate::tune::eval::Evaluator;
use crate::tune::opt::{self, Obs};
use crate::tune::records::{Importance, Phase, StudyRecord, TrialKind, TrialRecord, TrialStatus};
use crate::tune::spec::ObjectiveMetric;
use crate::tune::TuneError;

impl<E: Evaluator> Runner<E> {
    /// The importance phase must leave the search two trials at least, and serve an optimiser
    /// that searches a reduced space: the grid enumerates the whole space's points and the
    /// reports' procedure moves one option at a time itself, both matching their points
    /// against the history by whole configuration.
    pub(super) fn check_phase_fits(&self) -> Result<(), TuneError> {
        let moves = opt::oat::moves(&self.space, &self.plan).len();
        if moves == 0 {
            return Ok(());
        }
        if matches!(
            self.algorithm,
            opt::Algorithm::Grid | opt::Algorithm::Reports
        ) {
            return Err(TuneError::Spec(format!(
                "importance.one_at_a_time: the {} optimiser does not search a reduced space ({}); turn the phase off or choose gp, tpe, anneal or random",
                self.algorithm.name(),
                if self.algorithm == opt::Algorithm::Grid {
                    "it enumerates every point of the whole space"
                } else {
                    "it moves one option at a time itself"
                }
            )));
        }
        let before = self.space.baselines().len() + self.warm.len();
        let need = (before + moves + 2) as u32;
        let budget = self.study.spec.budget.trials;
        if budget < need {
            return Err(TuneError::Spec(format!(
                "importance.one_at_a_time: the phase moves {moves} parameters, a trial each, after {before} baseline and warm-start trial(s); budget.trials = {budget} leaves fewer than 2 trials for the search (raise it to {need} or more, or turn the phase off)"
            )));
        }
        Ok(())
    }

    /// The importance phase's findings once its last move has been measured (said, and
    /// stored with the study).
    pub(super) fn record_phase(
        &mut self,
        rec: &mut StudyRecord,
        search: &[TrialRecord],
    ) -> Result<(), TuneError> {
        let Some(settings) = self.plan.one_at_a_time else {
            return Ok(());
        };
        if rec.one_at_a_time.is_some() {
            return Ok(());
        }
        let moves = opt::oat::moves(&self.space, &self.plan);
        let history = self.history(search);
        let Some(f) = opt::oat::assess(&self.space, &moves, settings, &history) else {
            return Ok(());
        };
        let frozen = f.frozen();
        let kept: Vec<String> = f
            .moved
            .iter()
            .filter(|m| !m.frozen)
            .map(|m| format!("{} ({})", m.param, m.why))
            .collect();
        self.say(&format!(
            "importance phase: frozen at their defaults: {}; searched: {}",
            if frozen.is_empty() {
                "none".to_owned()
            } else {
                frozen.join(", ")
            },
            if kept.is_empty() {
                "none".to_owned()
            } else {
                kept.join("; ")
            }
        ));
        rec.one_at_a_time = Some(f);
        self.save(rec)
    }

    /// What the optimiser learns from a trial. A promoted trial is known by its full run; a
    /// screened-out one only by its screen, a low-fidelity reading: its screen value is scaled
    /// by `screen_to_full`, the median ratio of full to screen runs among the promoted trials,
    /// so that a short run's ramp-up and drain do not bias it against the full runs.
    pub(super) fn obs(
        t: &TrialRecord,
        screen_to_full: f64,
        metric: ObjectiveMetric,
        limits: &[crate::bench::abort::LatencyLimit],
    ) -> Obs {
        let estimate = match (t.objective, t.screen_objective, t.promoted) {
            (Some(full), _, _) => Some(full),
            (None, Some(s), false) => Some(s * screen_to_full),
            (None, Some(s), true) => Some(s),
            _ => None,
        };
        Obs {
            config: t.config.clone(),
            value: if t.status == TrialStatus::Ok {
                estimate
            } else {
                None
            },
            failed: t.status == TrialStatus::Failed,
            measured: t
                .full
                .as_ref()
                .and_then(|m| m.objective(metric))
                .or(t.screen_objective),
            slack: t
                .full
                .as_ref()
                .or(t.screen.as_ref())
                .map(|m| m.slack(limits))
                .unwrap_or_default(),
            decode: t
                .full
                .as_ref()
                .or(t.screen.as_ref())
                .and_then(|m| m.decode_load(limits)),
        }
    }

    /// What the optimiser learns from the search trials.
    pub(super) fn history(&self, search: &[TrialRecord]) -> Vec<Obs> {
        let ratio = Self::screen_to_full(search);
        search
            .iter()
            .map(|t| Self::obs(t, ratio, self.metric(), &self.study.limits))
            .collect()
    }

    /// Which knobs mattered in these search trials (`opt::effects`), said on the way.
    pub(super) fn importance(&mut self, search: &[TrialRecord]) -> Option<Importance> {
        let history = self.history(search);
        let (effects, noise_pct) = opt::effects(&self.space, &history)?;
        // The runs the model was fitted to (`opt::effects`): failed ones measured nothing.
        let measured = history
            .iter()
            .filter(|h| h.measured.is_some_and(|m| m > 0.0))
            .count();
        let said: Vec<String> = effects
            .iter()
            .filter(|e| e.measurable)
            .map(|e| format!("{} {:.1}%", e.param, e.pct))
            .collect();
        self.say(&format!(
            "what mattered (model estimate around the best trial, noise {noise_pct:.1}%): {}",
            if measured <= effects.len() + 1 {
                format!(
                    "{measured} runs that measured the objective are too few to tell {} options' effects from noise",
                    effects.len()
                )
            } else if said.is_empty() {
                "no parameter beyond the noise".to_owned()
            } else {
                said.join(", ")
            }
        ));
        Some(Importance {
            effects,
            noise_pct,
            trials: search.len(),
        })
    }

    /// The median full/screen ratio of the promoted trials (1 without any).
    pub(super) fn screen_to_full(search: &[TrialRecord]) -> f64 {
        let mut r: Vec<f64> = search
            .iter()
            .filter_map(|t| match (t.objective, t.screen_objective) {
                (Some(f), Some(s)) if s > 0.0 && t.screen.is_some() && t.full.is_some() => {
                    Some(f / s)
                }
                _ => None,
            })
            .filter(|x| x.is_finite())
            .collect();
        if r.is_empty() {
            return 1.0;
        }
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    }

    /// The fewest search trials before convergence may stop the search: the file's
    /// `min_trials`, raised to the optimiser's floor (`opt::convergence_floor`).
    pub(super) fn min_trials(&self, rec: &StudyRecord) -> u32 {
        let spec = &self.study.spec;
        spec.stopping.min_trials.max(opt::convergence_floor(
            self.algorithm,
            &self.space,
            &self.plan,
            rec.warm_start.len(),
        ))
    }

    /// Why the search should stop now, if it should.
    pub(super) fn stop_reason(
        &self,
        search: &[TrialRecord],
        all: &[TrialRecord],
        rec: &StudyRecord,
    ) -> Option<String> {
        let spec = &self.study.spec;
        let n = search.len() as u32;
        if n >= spec.budget.trials {
            return Some(format!("budget: {n} trials"));
        }
        if let Some(w) = spec.budget.wall_time_s {
            let used = active_s(all);
            if used >= w {
                return Some(format!(
                    "budget: {used:.0} s of trials ≥ wall time {w:.0} s"
                ));
            }
        }
        if n == 0 || n < self.min_trials(rec) {
            return None;
        }
        let mut best: Option<f64> = None;
        let mut last_improvement = 0usize;
        for (i, t) in search.iter().enumerate() {
            if let Some(v) = t.objective {
                if best.is_none_or(|b| v > b * (1.0 + spec.stopping.min_improvement)) {
                    last_improvement = i;
                }
                best = Some(best.map_or(v, |b| b.max(v)));
            }
        }
        let since = search.len().saturating_sub(1 + last_improvement);
        if since as u32 >= spec.stopping.patience {
            return Some(format!(
                "converged: no improvement above {:.1}% in the last {since} trials",
                100.0 * spec.stopping.min_improvement
            ));
        }
        if let Some(ei) = search.last().and_then(|t| t.expected_improvement) {
            if ei < spec.stopping.ei_threshold {
                return Some(format!(
                    "converged: expected improvement {:.3}% < {:.3}%",
                    100.0 * ei,
                    100.0 * spec.stopping.ei_threshold
                ));
            }
        }
        None
    }

    /// Proposals and their trials until the budget or convergence says stop; then the phase
    /// moves on to the re-measurement.
    pub(super) async fn search(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        self.announce_search(rec);
        loop {
            self.check_cancel()?;
            let all = self.records.trials(&rec.id)?;
            let search: Vec<TrialRecord> = all
                .iter()
                .filter(|t| t.kind == TrialKind::Search && t.status != TrialStatus::Running)
                .cloned()
                .collect();
            let mut trial = match all
                .iter()
                .find(|t| t.kind == TrialKind::Search && t.status == TrialStatus::Running)
            {
                Some(t) => {
                    let t = self.resume_trial(t);
                    if t.status == TrialStatus::Failed {
                        self.put_trial(&t)?;
                        continue;
                    }
                    t
                }
                None => match self.next_search_trial(rec, &all, &search)? {
                    Some(t) => t,
                    None => return Ok(()),
                },
            };
            self.place_alone(&mut trial);
            self.put_trial(&trial)?;
            let against = self.against(&trial, &search);
            self.exec().run_search_trial(&mut trial, &against).await?;
            self.put_trial(&trial)?;
            if let Some(v) = trial.objective {
                if rec.best_objective.is_none_or(|b| v > b) {
                    rec.best_objective = Some(v);
                    rec.best_trial = Some(trial.seq);
                }
            }
            self.save(rec)?;
            let line = self.trial_line(&trial, rec, search.len() + 1);
            self.say(&line);
        }
    }

    /// Says the study's notes, what the workload implies, the importance phase and the
    /// start-up, and a `stopping.min_trials` below the optimiser's floor.
    pub(super) fn announce_search(&mut self, rec: &StudyRecord) {
        for w in self.study.warnings.clone() {
            self.say(&format!("note: {w}"));
        }
        let moves = opt::oat::moves(&self.space, &self.plan);
        let phase = if moves.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = moves.iter().map(|m| m.param.as_str()).collect();
            format!(
                "an importance phase of {} trials (each of {} moved alone from the defaults; what moves nothing by {:.0}% is frozen), ",
                moves.len(),
                names.join(", "),
                100.0 * self.study.spec.importance.freeze_below
            )
        };
        if !self.priors.is_empty() || !moves.is_empty() {
            let said: Vec<String> = self.priors.iter().map(|p| p.note.clone()).collect();
            let implies = if said.is_empty() {
                String::new()
            } else {
                format!("the workload implies {}; ", said.join("; "))
            };
            self.say(&format!(
                "{}: {implies}{phase}{} start-up trials, then model-guided",
                self.algorithm.name(),
                opt::startup_trials(
                    self.algorithm,
                    &self.space,
                    &self.plan,
                    rec.warm_start.len()
                )
            ));
        }
        let floor = self.min_trials(rec);
        // (Said only where it changes anything: a budget under the floor runs to its end.)
        if floor > self.study.spec.stopping.min_trials && floor < self.study.spec.budget.trials {
            let msg = format!(
                "note: stopping.min_trials = {} is below what the optimiser needs before convergence can be judged (its baselines, warm start, importance phase and start-up design, then model-guided trials for {} parameters); convergence will not stop the search before trial {floor}",
                self.study.spec.stopping.min_trials,
                self.space.params.len()
            );
            self.say(&msg);
        }
    }

    /// The next search trial, from the optimiser's proposal; `None` when the search stops
    /// (the budget, convergence, or an optimiser with nothing left to propose), the study
    /// then moved on to the re-measurement and saved.
    fn next_search_trial(
        &mut self,
        rec: &mut StudyRecord,
        all: &[TrialRecord],
        search: &[TrialRecord],
    ) -> Result<Option<TrialRecord>, TuneError> {
        self.record_phase(rec, search)?;
        if let Some(reason) = self.stop_reason(search, all, rec) {
            self.say(&format!("search stopped: {reason}"));
            rec.stop_reason = Some(reason);
            rec.importance = self.importance(search);
            rec.phase = Phase::Remeasure;
            self.save(rec)?;
            return Ok(None);
        }
        let history = self.history(search);
        match self.optimizer.propose(&history) {
            Ok(p) => Ok(Some(self.new_trial(
                all.len() as u32,
                TrialKind::Search,
                p.config,
                p.note,
                p.expected_improvement,
            ))),
            Err(e) => {
                self.say(&format!("search stopped: {e}"));
                rec.stop_reason = Some(e);
                rec.phase = Phase::Remeasure;
                self.save(rec)?;
                Ok(None)
            }
        }
    }

    /// What a search trial runs against (`search`: its screens set the promotion threshold,
    /// its best full run what a narrow miss must beat to be confirmed).
    pub(super) fn against(&self, trial: &TrialRecord, search: &[TrialRecord]) -> Against {
        // What screening ranks by (tokens per joule is known only after the engine stops,
        // so those studies screen on output throughput).
        let tpj = self.metric() == ObjectiveMetric::TokensPerJoule;
        let screens: Vec<f64> = search
            .iter()
            .filter(|t| t.status == TrialStatus::Ok)
            .filter_map(|t| match (&t.screen, tpj) {
                (Some(m), true) => Some(m.output_throughput),
                _ => t.screen_objective,
            })
            .collect();
        let best_full = search
            .iter()
            .filter_map(|t| t.objective)
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
        // The defaults and the importance phase's moves run in full, whatever their
        // screen reads: the phase compares its readings with one another, so none of them
        // may be a screen's (shorter, noisier) reading.
        let defaults = self.space.baselines().contains(&trial.config);
        let always_full = defaults
            || opt::oat::moves(&self.space, &self.plan)
                .iter()
                .any(|m| m.config == trial.config);
        Against {
            screens,
            best_full,
            always_full,
            defaults,
        }
    }

    pub(super) fn trial_line(&self, t: &TrialRecord, rec: &StudyRecord, n: usize) -> String {
        let budget = self.study.spec.budget.trials;
        let what = match t.status {
            TrialStatus::Ok => match (t.objective, t.screen_objective) {
                (Some(o), _) => format!("ok {o:.1}"),
                (None, Some(s)) => format!("screened {s:.1} (not promoted)"),
                _ => "ok".into(),
            },
            TrialStatus::Infeasible => format!(
                "infeasible: {}",
                t.early_stop.as_deref().unwrap_or("constraints missed")
            ),
            TrialStatus::Failed => format!(
                "failed ({}): {}",
                t.failure.as_ref().map(|f| f.class.as_str()).unwrap_or("?"),
                t.failure
                    .as_ref()
                    .map(|f| crate::util::excerpt(&f.evidence, 100))
                    .unwrap_or_default()
            ),
            TrialStatus::Running => "running".into(),
        };
        let best = match (rec.best_objective, rec.best_trial) {
            (Some(b), Some(i)) => format!("best {b:.1} (#{i})"),
            _ => "no feasible trial yet".into(),
        };
        format!(
            "trial {n}/{budget} #{} [{}] {what} · {best} · {}",
            t.seq,
            t.note,
            t.command
                .as_ref()
                .map(CommandLine::display)
                .unwrap_or_default()
        )
    }
}
