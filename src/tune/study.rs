//! The study loop. suggest → repair/reject → launch → screen → (promote →
//! full run) → record → tell, until the budget or convergence stops it; then the best few and
//! the baseline are re-measured interleaved (A B C, C B A, …) for a confidence interval, and the
//! winner is run on every validation workload.
//!
//! Everything that decides what comes next is derived from the records (`records`), written
//! (and flushed) before and after every trial: a study killed at any moment resumes where it
//! stopped, the interrupted trial runs again, and no finished trial is lost.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::best;
use super::decide::{self, Decision, Pending};
use super::eval::{Evaluator, Measurement, RunSpec, TrialFailure};
use super::opt::{self, Obs, Optimizer};
use super::records::{
    Importance, Outcome, Phase, Records, Rounds, StudyRecord, TrialKind, TrialRecord, TrialStatus,
    WarmStart,
};
use super::spec::{ObjectiveMetric, Study};
use super::TuneError;
use crate::space::{CommandLine, Config, Kind, Space};
use crate::store::Store;
use crate::telemetry::TelemetrySummary;
use crate::util::unix_now;

/// Seconds a study has spent running trials (what `budget.wall_time_s` counts): the time it
/// was paused or stopped between trials does not count.
pub fn active_s(all: &[TrialRecord]) -> f64 {
    let now = unix_now();
    all.iter()
        .map(|t| (t.ended.unwrap_or(now) - t.started).max(0.0))
        .sum()
}

/// Times servetune may be killed while one trial runs before that trial counts as failed.
pub const MAX_KILLS: u32 = 3;

/// What the runner prints, per event (the CLI prints it; the daemon logs it).
pub type Progress = Box<dyn FnMut(&str) + Send>;

pub struct Runner<E: Evaluator> {
    /// The study's records in the store.
    pub records: Records,
    pub study: Study,
    pub space: Space,
    pub eval: E,
    pub trial_root: PathBuf,
    pub hardware: String,
    pub engine_versions: BTreeMap<String, Option<String>>,
    pub dropped_flags: Vec<String>,
    pub trigger: String,
    pub progress: Progress,
    /// Cancelled to stop after tearing the current engine down; the study stays resumable.
    pub cancel: CancellationToken,
    /// A new study's warm start, already fitted to `space` (`tune::warm`); stored with the
    /// study record when it is created.
    pub warm: Vec<WarmStart>,
    optimizer: Box<dyn Optimizer + Send>,
    /// The optimiser (the file's, else `opt::default_for` the space), its plan (budget, the
    /// workload's priors) and what the priors resolved to.
    pub algorithm: opt::Algorithm,
    plan: opt::Plan,
    pub priors: Vec<super::prior::Resolved>,
}

impl<E: Evaluator> Runner<E> {
    pub fn new(store: Store, study: Study, space: Space, eval: E, trial_root: PathBuf) -> Self {
        let (plan, priors) = super::prior::plan(&study, &space);
        let algorithm = study
            .spec
            .study
            .optimizer
            .unwrap_or_else(|| opt::default_for(&space, plan.budget));
        let optimizer = opt::make(algorithm, &space, study.spec.study.seed, &plan);
        Runner {
            records: Records::new(store),
            study,
            space,
            eval,
            trial_root,
            hardware: String::new(),
            engine_versions: BTreeMap::new(),
            dropped_flags: Vec::new(),
            trigger: "manual".into(),
            progress: Box::new(|_| {}),
            cancel: CancellationToken::new(),
            warm: Vec::new(),
            optimizer,
            algorithm,
            plan,
            priors,
        }
    }

    /// The same runner around another evaluator made from this one (`wrap`): a wrapper that
    /// disturbs the machine at chosen trials (the real-engine fault tests), or measures more.
    pub fn map_eval<F: Evaluator>(self, wrap: impl FnOnce(E) -> F) -> Runner<F> {
        Runner {
            records: self.records,
            study: self.study,
            space: self.space,
            eval: wrap(self.eval),
            trial_root: self.trial_root,
            hardware: self.hardware,
            engine_versions: self.engine_versions,
            dropped_flags: self.dropped_flags,
            trigger: self.trigger,
            progress: self.progress,
            cancel: self.cancel,
            warm: self.warm,
            optimizer: self.optimizer,
            algorithm: self.algorithm,
            plan: self.plan,
            priors: self.priors,
        }
    }

    fn say(&mut self, s: &str) {
        (self.progress)(s);
    }

    fn metric(&self) -> ObjectiveMetric {
        self.study.spec.objective.metric
    }

    fn id(&self) -> String {
        self.study.id().to_owned()
    }

    /// Loads the study record, or creates it. A study of the same name with another file is
    /// refused (so that its trials are never mixed with another study's).
    pub fn open(&mut self) -> Result<StudyRecord, TuneError> {
        let id = self.id();
        if let Some(rec) = self.records.study(&id)? {
            if rec.spec_text != self.study.text {
                return Err(TuneError::Conflict(format!(
                    "study {id:?} exists in {} with a different file; rename the study or pass --restart to discard its trials",
                    self.records.store().path().display()
                )));
            }
            return Ok(rec);
        }
        self.check_phase_fits()?;
        let now = unix_now();
        let rec = StudyRecord {
            id: id.clone(),
            spec_text: self.study.text.clone(),
            created: now,
            updated: now,
            phase: Phase::Search,
            stop_reason: None,
            trigger: self.trigger.clone(),
            hardware: self.hardware.clone(),
            engine_versions: self.engine_versions.clone(),
            dropped_flags: self.dropped_flags.clone(),
            best_trial: None,
            best_objective: None,
            outcome: None,
            warm_start: self.warm.clone(),
            importance: None,
            one_at_a_time: None,
            footprint: Some(self.study.footprint.clone()),
            log_params: self
                .space
                .params
                .iter()
                .filter(|p| {
                    matches!(
                        p.kind,
                        Kind::Int { log: true, .. } | Kind::Float { log: true, .. }
                    )
                })
                .map(|p| p.name.clone())
                .collect(),
        };
        self.records.put_study(&rec)?;
        Ok(rec)
    }

    /// The importance phase must leave the search two trials at least, and serve an optimiser
    /// that searches a reduced space: the grid enumerates the whole space's points and the
    /// reports' procedure moves one option at a time itself, both matching their points
    /// against the history by whole configuration.
    fn check_phase_fits(&self) -> Result<(), TuneError> {
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
    fn record_phase(
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

    fn save(&self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        rec.updated = unix_now();
        self.records.put_study(rec)?;
        Ok(())
    }

    fn put_trial(&self, t: &TrialRecord) -> Result<(), TuneError> {
        self.records.put_trial(t)?;
        Ok(())
    }

    fn check_cancel(&self) -> Result<(), TuneError> {
        if self.cancel.is_cancelled() {
            Err(TuneError::Interrupted)
        } else {
            Ok(())
        }
    }

    /// Runs (or resumes) the study to the end.
    pub async fn run(&mut self) -> Result<StudyRecord, TuneError> {
        let mut rec = self.open()?;
        if !rec.warm_start.is_empty() {
            let spec = &self.study.spec.study;
            let warm = rec
                .warm_start
                .iter()
                .map(|w| (w.config.clone(), w.from.clone()))
                .collect();
            self.optimizer =
                opt::make_warm(self.algorithm, &self.space, spec.seed, &self.plan, warm);
        }
        if rec.phase == Phase::Search {
            self.search(&mut rec).await?;
        }
        if rec.phase == Phase::Remeasure {
            self.remeasure(&mut rec).await?;
        }
        if rec.phase == Phase::Validate {
            self.validate(&mut rec).await?;
        }
        Ok(rec)
    }

    fn new_trial(
        &self,
        seq: u32,
        kind: TrialKind,
        config: Config,
        note: String,
        ei: Option<f64>,
    ) -> TrialRecord {
        let engine = self
            .space
            .split(&config)
            .ok()
            .map(|(s, _)| s.engine.name.clone());
        TrialRecord {
            study: self.id(),
            seq,
            kind,
            defaults: self.space.baselines().contains(&config),
            config,
            note,
            expected_improvement: ei,
            status: TrialStatus::Running,
            engine,
            command: None,
            engine_version: None,
            hardware: self.hardware.clone(),
            screen: None,
            full: None,
            screen_objective: None,
            objective: None,
            promoted: false,
            failure: None,
            early_stop: None,
            telemetry: None,
            started: unix_now(),
            ended: None,
            bench_s: 0.0,
            saved_s: 0.0,
            attempts: 1,
            stopped: 0,
            startup_s: None,
            retried_after: None,
        }
    }

    /// What the optimiser learns from a trial. A promoted trial is known by its full run; a
    /// screened-out one only by its screen, a low-fidelity reading: its screen value is scaled
    /// by `screen_to_full`, the median ratio of full to screen runs among the promoted trials,
    /// so that a short run's ramp-up and drain do not bias it against the full runs.
    fn obs(
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
    fn history(&self, search: &[TrialRecord]) -> Vec<Obs> {
        let ratio = Self::screen_to_full(search);
        search
            .iter()
            .map(|t| Self::obs(t, ratio, self.metric(), &self.study.limits))
            .collect()
    }

    /// Which knobs mattered in these search trials (`opt::effects`), said on the way.
    fn importance(&mut self, search: &[TrialRecord]) -> Option<Importance> {
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
    fn screen_to_full(search: &[TrialRecord]) -> f64 {
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
    fn min_trials(&self, rec: &StudyRecord) -> u32 {
        let spec = &self.study.spec;
        spec.stopping.min_trials.max(opt::convergence_floor(
            self.algorithm,
            &self.space,
            &self.plan,
            rec.warm_start.len(),
        ))
    }

    /// Why the search should stop now, if it should.
    fn stop_reason(
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

    /// Whether a failed trial runs once more, and if so, resets it for that: its engine failed
    /// without refusing the configuration (a crash, a hang, a start-up timeout: possibly the
    /// machine's, e.g. memory a previous engine had not yet released) and it has not run again
    /// yet. The first failure is kept in `retried_after`, stored before the second attempt, so
    /// that a resume after a kill during it does not run a third.
    fn retry_once(&mut self, t: &mut TrialRecord, what: &str) -> Result<bool, TuneError> {
        let again = t.status == TrialStatus::Failed
            && t.retried_after.is_none()
            && t.failure.as_ref().is_some_and(|f| !decide::refused(f));
        if !again {
            return Ok(false);
        }
        let f = t.failure.take().expect("checked above");
        self.say(&format!(
            "trial #{}: {what} failed ({}: {}), which is not the engine refusing the configuration; running it once more",
            t.seq,
            f.class,
            crate::util::excerpt(&f.evidence, 100)
        ));
        t.retried_after = Some(f);
        t.reopen();
        // Nor the first attempt's engine: the second records its own.
        t.startup_s = None;
        t.command = None;
        t.engine_version = None;
        t.bench_s = 0.0;
        t.telemetry = None;
        self.put_trial(t)?;
        Ok(true)
    }

    /// A trial found `Running` at a resume: run it again, unless servetune was killed while it
    /// ran `MAX_KILLS` times already (a trial that takes the host down, e.g. an out-of-memory
    /// kill, would otherwise be retried forever); then it is recorded as failed.
    fn resume_trial(&mut self, t: &TrialRecord) -> TrialRecord {
        let mut t = t.clone();
        let kills = t.attempts.saturating_sub(t.stopped);
        if kills >= MAX_KILLS {
            t.status = TrialStatus::Failed;
            t.ended = Some(unix_now());
            t.failure = Some(TrialFailure {
                class: "crash".into(),
                evidence: format!(
                    "servetune was killed {kills} times while this trial ran (out of memory on the host?); not run again"
                ),
                log_excerpt: String::new(),
            });
            let msg = format!(
                "trial {} killed servetune {kills} times: recorded as failed",
                t.seq
            );
            self.say(&msg);
            return t;
        }
        t.attempts += 1;
        t.started = unix_now();
        t.ended = None;
        t.failure = None;
        let msg = format!("trial {} was interrupted; running it again", t.seq);
        self.say(&msg);
        t
    }

    async fn search(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
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
        // Proposal and its trial run until the budget or convergence says stop.
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
                None => {
                    self.record_phase(rec, &search)?;
                    if let Some(reason) = self.stop_reason(&search, &all, rec) {
                        self.say(&format!("search stopped: {reason}"));
                        rec.stop_reason = Some(reason);
                        rec.importance = self.importance(&search);
                        rec.phase = Phase::Remeasure;
                        self.save(rec)?;
                        return Ok(());
                    }
                    let history = self.history(&search);
                    let p = match self.optimizer.propose(&history) {
                        Ok(p) => p,
                        Err(e) => {
                            self.say(&format!("search stopped: {e}"));
                            rec.stop_reason = Some(e);
                            rec.phase = Phase::Remeasure;
                            self.save(rec)?;
                            return Ok(());
                        }
                    };
                    self.new_trial(
                        all.len() as u32,
                        TrialKind::Search,
                        p.config,
                        p.note,
                        p.expected_improvement,
                    )
                }
            };
            self.put_trial(&trial)?;
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
            // The best full-run value so far: a narrow miss above it is confirmed.
            let best_full = search
                .iter()
                .filter_map(|t| t.objective)
                .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
            // The defaults and the importance phase's moves run in full, whatever their
            // screen reads: the phase compares its readings with one another, so none of them
            // may be a screen's (shorter, noisier) reading.
            let full = self.space.baselines().contains(&trial.config)
                || moves.iter().any(|m| m.config == trial.config);
            let is_defaults = self.space.baselines().contains(&trial.config);
            for attempt in 0..2 {
                let cancel = self.cancel.clone();
                match guarded(
                    cancel,
                    self.search_trial(&mut trial, &screens, best_full, full),
                )
                .await
                {
                    Some(r) => r?,
                    None => {
                        let _ = self.eval.stop().await;
                        trial.stopped += 1;
                        self.put_trial(&trial)?;
                        return Err(TuneError::Interrupted);
                    }
                }
                // The defaults are the reference: only the engine refusing them (a class its
                // log proves: out of memory, unsupported, a bad flag) says they cannot run.
                if !(is_defaults && attempt == 0 && self.retry_once(&mut trial, "the defaults")?) {
                    break;
                }
            }
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

    fn trial_line(&self, t: &TrialRecord, rec: &StudyRecord, n: usize) -> String {
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

    /// One run of a workload: plain, or the inner search over the request rate. `abort`: the
    /// study's constraints stop the run early once it misses them beyond doubt (search runs);
    /// re-measurement and validation runs always run to the end, so that they can be pooled.
    /// `seed_offset` draws other prompts (a confirmation run on the same engine).
    async fn measure(
        &mut self,
        workload: usize,
        fraction: f64,
        abort: bool,
        seed_offset: u64,
    ) -> Result<Measurement, TrialFailure> {
        let o = self.study.spec.objective.clone();
        if o.metric != ObjectiveMetric::MaxRate {
            return self
                .eval
                .run(&RunSpec {
                    workload,
                    fraction,
                    rate: None,
                    abort,
                    seed_offset,
                })
                .await;
        }
        let min_s = self.study.spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        // Every inner run draws its own prompts: with the same ones, the engine's prefix cache
        // would serve the later rates warm and inflate the rate found.
        let mut runs = 0u64;
        let mut at = |rate: f64| {
            runs += 1;
            RunSpec {
                workload,
                fraction,
                rate: Some(rate),
                abort: true,
                seed_offset: seed_offset.wrapping_mul(1000).wrapping_add(runs),
            }
        };
        // The foreign load of the search is the worst of its runs: one disturbed run moves the
        // bracket, whichever run is returned.
        let mut foreign: Option<f64> = None;
        let mut seen = |m: &Measurement| {
            if let Some(f) = m.foreign_cores {
                foreign = Some(foreign.map_or(f, |g: f64| g.max(f)));
            }
        };
        let (mut lo, mut hi) = (o.rate_min, o.rate_max);
        let mut first = self.eval.run(&at(lo)).await?;
        seen(&first);
        if first.violation(min_s, &limits).is_some() {
            first.resolution = Some(lo);
            return Ok(first);
        }
        let mut top = self.eval.run(&at(hi)).await?;
        seen(&top);
        if top.violation(min_s, &limits).is_none() {
            top.resolution = Some(0.0);
            top.foreign_cores = foreign;
            return Ok(top);
        }
        let mut best = first;
        for _ in 2..o.rate_steps {
            let mid = (lo * hi).sqrt();
            let m = self.eval.run(&at(mid)).await?;
            seen(&m);
            if m.violation(min_s, &limits).is_none() {
                lo = mid;
                best = m;
            } else {
                hi = mid;
            }
        }
        // The rate found is `lo`; the true boundary lies in [lo, hi).
        best.resolution = Some(hi - lo);
        best.foreign_cores = foreign;
        Ok(best)
    }

    fn trial_dir(&self, seq: u32) -> PathBuf {
        self.trial_root
            .join(self.id())
            .join(format!("trial-{seq:04}"))
    }

    /// Whether a run that missed the constraints missed them narrowly: by one failed request,
    /// or a latency statistic within 10% of its limit. Such a miss of a promising
    /// configuration is confirmed by a second run before the trial is called infeasible.
    fn narrow_miss(&self, m: &Measurement) -> bool {
        let min_s = self.study.spec.constraints.min_success_rate;
        let sent = m.completed + m.failed;
        let success_short = m.success_rate < min_s;
        if success_short {
            return m.failed <= 1
                || (sent > 0 && ((1.0 - min_s) * sent as f64) + 1.0 >= m.failed as f64);
        }
        self.study.limits.iter().all(|l| {
            m.latencies_ms
                .get(&super::eval::latency_key(l))
                .is_none_or(|v| *v <= 1.1 * l.limit_ms)
        })
    }

    /// `measure`, and what to do when other processes disturbed it (`[foreign_load]`): wait up
    /// to `settle_s` for the machine to be quiet, then, with `rerun` (search runs), run it
    /// again with other prompts (at most `reruns` times). Re-measurement and validation rounds
    /// are not rerun in place (a second run on a warm engine is not like the other rounds): the
    /// gate sets the disturbed round aside and asks for another, which starts on a quiet
    /// machine. The time of every run is added to `bench_s`. A run still disturbed after that
    /// is returned as it is.
    async fn quiet_measure(
        &mut self,
        workload: usize,
        fraction: f64,
        abort: bool,
        seed_offset: u64,
        rerun: bool,
        bench_s: &mut f64,
    ) -> Result<Measurement, TrialFailure> {
        let fl = self.study.spec.foreign_load.clone();
        let mut m = self.measure(workload, fraction, abort, seed_offset).await?;
        *bench_s += m.duration_s;
        let reruns = if rerun { fl.reruns } else { 0 };
        for k in 0..=reruns {
            if !m.disturbed(fl.max_cores) {
                break;
            }
            let first = m.foreign_cores.unwrap_or(0.0);
            let now = self
                .eval
                .settle(fl.max_cores, Duration::from_secs_f64(fl.settle_s))
                .await;
            let still = match now {
                Some(f) if f > fl.max_cores => {
                    format!("still {f:.2} after {:.0} s; ", fl.settle_s)
                }
                _ => String::new(),
            };
            if k == reruns {
                self.say(&format!(
                    "other processes kept {first:.2} cores busy during that run (limit {:.2}); {still}{}",
                    fl.max_cores,
                    if rerun {
                        "it counts as disturbed"
                    } else {
                        "the gate sets this round aside"
                    }
                ));
                break;
            }
            self.say(&format!(
                "other processes kept {first:.2} cores busy during that run (limit {:.2}); {still}running it again",
                fl.max_cores
            ));
            let mut again = self
                .measure(
                    workload,
                    fraction,
                    abort,
                    seed_offset.wrapping_mul(100) + 10 + u64::from(k),
                )
                .await?;
            *bench_s += again.duration_s;
            again.replaces = Some(format!(
                "a first run was disturbed: other processes kept {first:.2} cores busy (limit {:.2}); it read {}",
                fl.max_cores,
                m.objective(self.metric())
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "nothing".into())
            ));
            m = again;
        }
        Ok(m)
    }

    /// One run of the primary workload in a search trial, confirmed once with other prompts
    /// when it misses the constraints narrowly and `promising` says it could be the best.
    async fn checked_run(
        &mut self,
        t: &mut TrialRecord,
        fraction: f64,
        promising: impl Fn(&Measurement) -> bool,
    ) -> Result<Measurement, TrialFailure> {
        let min_s = self.study.spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        let m = self
            .quiet_measure(0, fraction, true, 0, true, &mut t.bench_s)
            .await?;
        let Some(why) = m.violation(min_s, &limits) else {
            return Ok(m);
        };
        // A run the abort rule stopped at its one failed request read only a truncated run's
        // throughput, which says nothing of whether the configuration is promising: it is
        // confirmed whatever it read (one failure may be a glitch; a configuration that
        // fails requests fails the second run as fast).
        let stopped_at_one = m.aborted.is_some() && m.failed == 1 && m.success_rate < min_s;
        if !(self.narrow_miss(&m) && (stopped_at_one || promising(&m))) {
            return Ok(m);
        }
        let what = if stopped_at_one {
            "was stopped at its one failed request"
        } else {
            "missed the constraints narrowly"
        };
        let msg = format!(
            "trial #{} {what} ({why}); confirming with a second run",
            t.seq
        );
        self.say(&msg);
        let mut again = self
            .quiet_measure(0, fraction, true, 1, true, &mut t.bench_s)
            .await?;
        let note = format!("a first run {what} ({why}); this second run replaces it");
        again.replaces = Some(match again.replaces.take() {
            Some(earlier) => format!("{note}; {earlier}"),
            None => note,
        });
        Ok(again)
    }

    /// A search trial: start, screen, maybe the full run, stop. `always_full` (the defaults
    /// and the importance phase's moves): promoted whatever the screen reads, and a narrow
    /// miss of the screen confirmed.
    async fn search_trial(
        &mut self,
        t: &mut TrialRecord,
        screens: &[f64],
        best_full: Option<f64>,
        always_full: bool,
    ) -> Result<(), TuneError> {
        let spec = self.study.spec.clone();
        let metric = spec.objective.metric;
        let min_s = spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        let frac = self.study.screen_fraction;
        let dir = self.trial_dir(t.seq);
        // Tokens per joule is known only once the engine stops: screen on throughput.
        let screen_value = move |m: &Measurement| match metric {
            ObjectiveMetric::TokensPerJoule => m.output_throughput,
            _ => m.objective(metric).unwrap_or(0.0),
        };
        let best_screen = screens.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let result: Result<(), TrialFailure> = async {
            let started = self.eval.start(&t.config, &dir).await?;
            t.startup_s = Some(started.startup_s);
            t.command = Some(started.command);
            t.engine = Some(started.engine);
            t.engine_version = started.engine_version;
            let screen = self
                .checked_run(t, frac, |m| always_full || screen_value(m) >= best_screen)
                .await?;
            t.early_stop = screen.violation(min_s, &limits);
            t.screen_objective = screen.objective(metric);
            t.screen = Some(screen.clone());
            if t.early_stop.is_some() {
                return Ok(());
            }
            let v = screen_value(&screen);
            let mut all: Vec<f64> = screens.to_vec();
            all.push(v);
            all.sort_by(f64::total_cmp);
            // Promote the top `promote` fraction of screened candidates (and every trial run in full always).
            let cut = ((all.len() as f64) * (1.0 - spec.screening.promote)).floor() as usize;
            let threshold = all[cut.min(all.len() - 1)];
            t.promoted = frac >= 1.0 || always_full || v >= threshold;
            if !t.promoted {
                t.saved_s = screen.duration_s * (1.0 / frac - 1.0);
                return Ok(());
            }
            let full = if frac >= 1.0 {
                screen
            } else {
                // Promoted: its screen ranks it near the top, so a narrow miss is confirmed.
                self.checked_run(t, 1.0, |m| {
                    always_full
                        || v >= best_screen
                        || best_full.is_none_or(|b| m.objective(metric).unwrap_or(0.0) >= b)
                })
                .await?
            };
            t.early_stop = full.violation(min_s, &limits);
            if t.early_stop.is_none() {
                t.objective = full.objective(metric);
            }
            t.full = Some(full);
            Ok(())
        }
        .await;
        let tel = self.eval.stop().await;
        self.finish(t, result, tel)
    }

    fn finish(
        &self,
        t: &mut TrialRecord,
        result: Result<(), TrialFailure>,
        tel: Result<Option<TelemetrySummary>, TrialFailure>,
    ) -> Result<(), TuneError> {
        t.ended = Some(unix_now());
        match tel {
            Ok(tel) => t.telemetry = tel,
            Err(f) => {
                // An engine that would not go away: record it and stop the study; the next
                // launch would fight it for the GPU.
                t.status = TrialStatus::Failed;
                t.failure = Some(f.clone());
                self.put_trial(t)?;
                return Err(TuneError::Teardown(f.evidence));
            }
        }
        if let Some(tel) = &t.telemetry {
            // The sampler covered the whole engine session: every run's tokens count.
            let tokens: u64 = [&t.screen, &t.full]
                .iter()
                .filter_map(|m| m.as_ref().map(|m| m.total_output_tokens))
                .sum();
            let tpj = tel.tokens_per_joule(tokens);
            for m in [t.screen.as_mut(), t.full.as_mut()].into_iter().flatten() {
                m.tokens_per_joule = tpj;
            }
            if self.metric() == ObjectiveMetric::TokensPerJoule && t.early_stop.is_none() {
                t.screen_objective = tpj;
                if t.promoted {
                    t.objective = tpj;
                }
            }
        }
        t.status = match result {
            Err(f) if f.class == "infrastructure" => {
                // servetune could not do its part (a foreign GPU process, a missing binary,
                // an I/O error): that says nothing about the configuration. The trial stays
                // `running`, so that it runs again once the cause is fixed and the study is
                // resumed; the failure is kept for the record.
                t.failure = Some(f.clone());
                t.stopped += 1;
                t.reopen();
                self.put_trial(t)?;
                return Err(TuneError::Infrastructure(f.evidence));
            }
            Err(f) => {
                t.failure = Some(f);
                TrialStatus::Failed
            }
            Ok(()) if t.early_stop.is_some() => TrialStatus::Infeasible,
            Ok(()) => TrialStatus::Ok,
        };
        Ok(())
    }

    /// The search trials of the engines' defaults: one per engine (the first of each).
    fn default_trials(&self, search: &[TrialRecord]) -> Vec<TrialRecord> {
        let mut out: Vec<TrialRecord> = Vec::new();
        for b in self.space.baselines() {
            if let Some(t) = search.iter().find(|t| t.config == b) {
                out.push(t.clone());
            }
        }
        out
    }

    /// The best engine defaults by their search runs (the first that ran, else the first).
    fn best_searched(bases: &[TrialRecord]) -> Option<TrialRecord> {
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
    fn baseline_of(&self, bases: &[TrialRecord], all: &[TrialRecord]) -> Option<TrialRecord> {
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

    fn candidates(&self, search: &[TrialRecord], baseline: &TrialRecord) -> Vec<TrialRecord> {
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
    async fn run_plan(
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
            self.put_trial(&t)?;
            // A round's run whose engine failed without refusing the configuration (a crash,
            // a hang, a start-up timeout) runs once more before it counts against its arm: the
            // other arm's run in the round may have done well on a machine that was not.
            let metric = self.metric();
            loop {
                let dir = self.trial_dir(t.seq);
                let min_s = self.study.spec.constraints.min_success_rate;
                let limits = self.study.limits.clone();
                let cancel = self.cancel.clone();
                let fut = async {
                    let result: Result<(), TrialFailure> = async {
                        let started = self.eval.start(&t.config, &dir).await?;
                        t.startup_s = Some(started.startup_s);
                        t.command = Some(started.command);
                        t.engine = Some(started.engine);
                        t.engine_version = started.engine_version;
                        // To the end, never stopped early: the rounds are pooled.
                        t.bench_s = 0.0;
                        let m = self
                            .quiet_measure(workload, 1.0, false, 0, false, &mut t.bench_s)
                            .await?;
                        t.early_stop = m.violation(min_s, &limits);
                        t.screen_objective = m.objective(metric);
                        if t.early_stop.is_none() {
                            t.objective = t.screen_objective;
                        }
                        t.promoted = true;
                        t.full = Some(m);
                        Ok(())
                    }
                    .await;
                    let tel = self.eval.stop().await;
                    self.finish(&mut t, result, tel)
                };
                match guarded(cancel, fut).await {
                    Some(r) => r?,
                    None => {
                        let _ = self.eval.stop().await;
                        t.stopped += 1;
                        self.put_trial(&t)?;
                        return Err(TuneError::Interrupted);
                    }
                }
                // Whether it runs again is decided before the failure is stored: a kill in
                // between must not leave a failed record that a resume would take as final.
                if !self.retry_once(&mut t, &format!("a round's run of #{candidate}"))? {
                    self.put_trial(&t)?;
                    break;
                }
            }
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
                .and_then(|m| decide::value_of(metric, m))
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
    fn arms(&self, all: &[TrialRecord]) -> Option<(TrialRecord, Vec<u32>)> {
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
    fn decision(&self, all: &[TrialRecord], last: bool) -> Option<Decision> {
        self.decision_open(all, last, &[])
    }

    /// As `decision`, with candidates whose validation may still run (`decide::Input::open`).
    fn decision_open(&self, all: &[TrialRecord], last: bool, open: &[u32]) -> Option<Decision> {
        let (base, cands) = self.arms(all)?;
        let names = self.eval.workloads();
        let rules = super::spec::rules_of(&self.study.spec, &self.study.limits);
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
    async fn remeasure(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
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
    fn rounds_led(all: &[TrialRecord], candidate: u32) -> u32 {
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
    fn next_validation_round(all: &[TrialRecord], workloads: usize, base: u32, leader: u32) -> u32 {
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

    fn rounds_of(all: &[TrialRecord], remeasure: bool) -> u32 {
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
    async fn validate(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
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

    /// Stores the outcome and, when the gate recommends a configuration, the best record.
    fn finish_study(
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

/// Runs `fut` unless `cancel` is cancelled first (`None` then; the caller stops the engine).
async fn guarded<T>(
    cancel: CancellationToken,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        r = fut => Some(r),
        _ = cancel.cancelled() => None,
    }
}
