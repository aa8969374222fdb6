//! The study loop and its records. suggest → repair/reject → launch → screen → (promote →
//! full run) → record → tell, until the budget or convergence stops it; then the best few and
//! the baseline are re-measured interleaved (A B C, C B A, …) for a confidence interval, and the
//! winner is run on every validation workload.
//!
//! Everything that decides what comes next is derived from the records in the store, written
//! (and flushed) before and after every trial: a study killed at any moment resumes where it
//! stopped, the interrupted trial runs again, and no finished trial is lost.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::eval::{Evaluator, Measurement, RunSpec, TrialFailure};
use super::opt::{self, Obs, Optimizer};
use super::spec::{Metric, Study};
use super::stats::{welch, Diff};
use super::TuneError;
use crate::space::{Config, Space};
use crate::store::{Store, StoreError};
use crate::telemetry::TelemetrySummary;
use crate::util::unix_now;

pub const STUDIES: &str = "studies";
pub const TRIALS: &str = "trials";
pub const BEST: &str = "best";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Search,
    Remeasure,
    Validate,
    Done,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyRecord {
    pub id: String,
    pub spec_text: String,
    pub created: f64,
    pub updated: f64,
    pub phase: Phase,
    /// Why the search stopped.
    pub stop_reason: Option<String>,
    /// What started the study (`manual`, `nightly`, `engine upgrade: …`).
    pub trigger: String,
    pub hardware: String,
    pub engine_versions: BTreeMap<String, Option<String>>,
    /// Flags of the space files the installed engines lack (dropped, with a warning).
    pub dropped_flags: Vec<String>,
    pub best_trial: Option<u32>,
    pub best_objective: Option<f64>,
    pub outcome: Option<Outcome>,
    /// Configurations measured first after the baselines (a re-tune's warm start).
    #[serde(default)]
    pub warm_start: Vec<WarmStart>,
}

/// A configuration a re-tune measures first: an earlier study's best or top trial, carried
/// over to the space of the engine version installed now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmStart {
    pub config: Config,
    /// Where it comes from (`study llama-20261201-030000 #7, recommended`).
    pub from: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TrialKind {
    Search,
    /// Round `round` of the interleaved re-measurement of search trial `candidate`.
    Remeasure {
        round: u32,
        candidate: u32,
    },
    /// Search trial `candidate` on validation workload `workload`, round `round`.
    Validate {
        workload: String,
        round: u32,
        candidate: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialStatus {
    /// Started and not finished: after a restart it runs again.
    Running,
    Ok,
    /// Ran, but missed a constraint.
    Infeasible,
    /// The engine failed (start-up, crash, hang).
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    pub study: String,
    pub seq: u32,
    #[serde(flatten)]
    pub kind: TrialKind,
    pub config: Config,
    pub note: String,
    pub expected_improvement: Option<f64>,
    pub status: TrialStatus,
    pub engine: Option<String>,
    pub command: Option<String>,
    pub engine_version: Option<String>,
    pub hardware: String,
    /// The short (screening) run; equals the full run when screening is off.
    pub screen: Option<Measurement>,
    pub full: Option<Measurement>,
    pub screen_objective: Option<f64>,
    /// The objective of the full-length run, when it had one and met the constraints.
    pub objective: Option<f64>,
    pub promoted: bool,
    pub failure: Option<TrialFailure>,
    /// Why the trial stopped early or missed the constraints.
    pub early_stop: Option<String>,
    pub telemetry: Option<TelemetrySummary>,
    pub started: f64,
    pub ended: Option<f64>,
    /// Seconds of benchmark runs, and the seconds screening saved (the full run it skipped).
    pub bench_s: f64,
    pub saved_s: f64,
    /// How many times it was started (more than 1 after an interruption).
    pub attempts: u32,
    /// Seconds from spawning the engine to its first answered request.
    #[serde(default)]
    pub startup_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub candidate: u32,
    pub command: Option<String>,
    /// candidate − baseline, with its 95% interval; `None` when a round failed.
    pub diff: Option<Diff>,
    pub disqualified: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationRow {
    pub workload: String,
    pub diff: Option<Diff>,
    pub regression: bool,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub metric: String,
    pub baseline_trial: u32,
    pub recommended: Option<u32>,
    pub recommended_command: Option<String>,
    pub recommended_config: Option<Config>,
    pub comparisons: Vec<Comparison>,
    pub verdict: String,
    pub validation: Vec<ValidationRow>,
    pub search_trials: u32,
    pub screened_only: u32,
    pub bench_s: f64,
    pub saved_s: f64,
}

/// Whether a best record's model is the one asked for: the same, a suffix of it, or a part
/// of its file name (`SmolLM2` for `/models/SmolLM2-135M-Instruct.Q4_1.gguf`).
pub fn model_matches(model: &str, asked: &str) -> bool {
    model == asked
        || model.ends_with(asked)
        || std::path::Path::new(model)
            .file_name()
            .is_some_and(|f| f.to_string_lossy().contains(asked))
}

/// The best known configuration for (model, hardware, engine version, workload).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestRecord {
    pub key: String,
    pub model: String,
    pub hardware: String,
    pub engine: String,
    pub engine_version: Option<String>,
    pub workload: String,
    pub study: String,
    pub trial: u32,
    pub config: Config,
    pub command: Option<String>,
    pub objective: Option<f64>,
    pub metric: String,
    /// Whether it beat the engine's defaults with a 95% interval above zero.
    pub improved: bool,
    pub at: f64,
}

pub fn trial_key(study: &str, seq: u32) -> String {
    format!("{study}/{seq:06}")
}

/// Every trial of a study, in order.
pub fn trials(store: &Store, study: &str) -> Result<Vec<TrialRecord>, StoreError> {
    Ok(store
        .scan::<TrialRecord>(TRIALS, &format!("{study}/"))?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

/// What the runner prints, per event (the CLI prints it; the daemon logs it).
pub type Progress = Box<dyn FnMut(&str) + Send>;

pub struct Runner<E: Evaluator> {
    pub store: Store,
    pub study: Study,
    pub space: Space,
    pub eval: E,
    pub trial_root: PathBuf,
    pub hardware: String,
    pub engine_versions: BTreeMap<String, Option<String>>,
    pub dropped_flags: Vec<String>,
    pub trigger: String,
    pub progress: Progress,
    /// Set to stop after tearing the current engine down; the study stays resumable.
    pub cancel: Arc<AtomicBool>,
    /// A new study's warm start (stored with the study record when it is created).
    pub warm: Vec<WarmStart>,
    optimizer: Box<dyn Optimizer + Send>,
}

impl<E: Evaluator> Runner<E> {
    pub fn new(store: Store, study: Study, space: Space, eval: E, trial_root: PathBuf) -> Self {
        let optimizer = opt::make(study.spec.study.optimizer, &space, study.spec.study.seed);
        Runner {
            store,
            study,
            space,
            eval,
            trial_root,
            hardware: String::new(),
            engine_versions: BTreeMap::new(),
            dropped_flags: Vec::new(),
            trigger: "manual".into(),
            progress: Box::new(|_| {}),
            cancel: Arc::new(AtomicBool::new(false)),
            warm: Vec::new(),
            optimizer,
        }
    }

    fn say(&mut self, s: &str) {
        (self.progress)(s);
    }

    fn metric(&self) -> Metric {
        self.study.spec.objective.metric
    }

    fn id(&self) -> String {
        self.study.id().to_owned()
    }

    /// Loads the study record, or creates it. A study of the same name with another file is
    /// refused (so that its trials are never mixed with another study's).
    pub fn open(&mut self) -> Result<StudyRecord, TuneError> {
        let id = self.id();
        if let Some(rec) = self.store.get::<StudyRecord>(STUDIES, &id)? {
            if rec.spec_text != self.study.text {
                return Err(TuneError::Conflict(format!(
                    "study {id:?} exists in {} with a different file; rename the study or pass --restart to discard its trials",
                    self.store.path().display()
                )));
            }
            return Ok(rec);
        }
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
            warm_start: self
                .warm
                .iter()
                .filter_map(|w| {
                    Some(WarmStart {
                        config: self.space.carry_over(&w.config)?,
                        from: w.from.clone(),
                    })
                })
                .collect(),
        };
        self.store.put(STUDIES, &id, &rec)?;
        Ok(rec)
    }

    fn save(&self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        rec.updated = unix_now();
        self.store.put(STUDIES, &rec.id, rec)?;
        Ok(())
    }

    fn put_trial(&self, t: &TrialRecord) -> Result<(), TuneError> {
        self.store.put(TRIALS, &trial_key(&t.study, t.seq), t)?;
        Ok(())
    }

    fn check_cancel(&self) -> Result<(), TuneError> {
        if self.cancel.load(Ordering::Relaxed) {
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
            self.optimizer = opt::make_warm(spec.optimizer, &self.space, spec.seed, warm);
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
            startup_s: None,
        }
    }

    fn obs(t: &TrialRecord) -> Obs {
        Obs {
            config: t.config.clone(),
            value: if t.status == TrialStatus::Ok {
                t.screen_objective
            } else {
                None
            },
            failed: t.status == TrialStatus::Failed,
            measured: t.screen_objective,
        }
    }

    /// Why the search should stop now, if it should.
    fn stop_reason(&self, search: &[TrialRecord], rec: &StudyRecord) -> Option<String> {
        let spec = &self.study.spec;
        let n = search.len() as u32;
        if n >= spec.budget.trials {
            return Some(format!("budget: {n} trials"));
        }
        if let Some(w) = spec.budget.wall_time_s {
            let used = unix_now() - rec.created;
            if used >= w {
                return Some(format!("budget: wall time {used:.0} s ≥ {w:.0} s"));
            }
        }
        if n < spec.stopping.min_trials {
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
        let since = search.len() - 1 - last_improvement;
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

    async fn search(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        // Proposal and its trial run until the budget or convergence says stop.
        loop {
            self.check_cancel()?;
            let all = trials(&self.store, &rec.id)?;
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
                    let mut t = t.clone();
                    t.attempts += 1;
                    t.started = unix_now();
                    let msg = format!("trial {} was interrupted; running it again", t.seq);
                    self.say(&msg);
                    t
                }
                None => {
                    if let Some(reason) = self.stop_reason(&search, rec) {
                        self.say(&format!("search stopped: {reason}"));
                        rec.stop_reason = Some(reason);
                        rec.phase = Phase::Remeasure;
                        self.save(rec)?;
                        return Ok(());
                    }
                    let history: Vec<Obs> = search.iter().map(Self::obs).collect();
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
            let tpj = self.metric() == Metric::TokensPerJoule;
            let screens: Vec<f64> = search
                .iter()
                .filter(|t| t.status == TrialStatus::Ok)
                .filter_map(|t| match (&t.screen, tpj) {
                    (Some(m), true) => Some(m.output_throughput),
                    _ => t.screen_objective,
                })
                .collect();
            let is_baseline = self.space.baselines().contains(&trial.config);
            let cancel = self.cancel.clone();
            match guarded(cancel, self.search_trial(&mut trial, &screens, is_baseline)).await {
                Some(r) => r?,
                None => {
                    let _ = self.eval.stop().await;
                    return Err(TuneError::Interrupted);
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
            t.command.as_deref().unwrap_or("")
        )
    }

    /// One run of a workload: plain, or the inner search over the request rate.
    async fn measure(
        &mut self,
        workload: usize,
        fraction: f64,
    ) -> Result<Measurement, TrialFailure> {
        let o = self.study.spec.objective.clone();
        if o.metric != Metric::MaxRate {
            return self
                .eval
                .run(&RunSpec {
                    workload,
                    fraction,
                    rate: None,
                })
                .await;
        }
        let min_s = self.study.spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        let at = |rate: f64| RunSpec {
            workload,
            fraction,
            rate: Some(rate),
        };
        let (mut lo, mut hi) = (o.rate_min, o.rate_max);
        let first = self.eval.run(&at(lo)).await?;
        if first.violation(min_s, &limits).is_some() {
            return Ok(first);
        }
        let top = self.eval.run(&at(hi)).await?;
        if top.violation(min_s, &limits).is_none() {
            return Ok(top);
        }
        let mut best = first;
        for _ in 2..o.rate_steps {
            let mid = (lo * hi).sqrt();
            let m = self.eval.run(&at(mid)).await?;
            if m.violation(min_s, &limits).is_none() {
                lo = mid;
                best = m;
            } else {
                hi = mid;
            }
        }
        Ok(best)
    }

    fn trial_dir(&self, seq: u32) -> PathBuf {
        self.trial_root
            .join(self.id())
            .join(format!("trial-{seq:04}"))
    }

    /// A search trial: start, screen, maybe the full run, stop.
    async fn search_trial(
        &mut self,
        t: &mut TrialRecord,
        screens: &[f64],
        baseline: bool,
    ) -> Result<(), TuneError> {
        let spec = self.study.spec.clone();
        let metric = spec.objective.metric;
        let min_s = spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        let frac = spec.screening.fraction;
        let dir = self.trial_dir(t.seq);
        let result: Result<(), TrialFailure> = async {
            let started = self.eval.start(&t.config, &dir).await?;
            t.startup_s = Some(started.startup_s);
            t.command = Some(started.command);
            t.engine = Some(started.engine);
            t.engine_version = started.engine_version;
            let screen = self.measure(0, frac).await?;
            t.bench_s += screen.duration_s;
            t.early_stop = screen.violation(min_s, &limits);
            t.screen_objective = screen.objective(metric);
            t.screen = Some(screen.clone());
            if t.early_stop.is_some() {
                return Ok(());
            }
            // Tokens per joule is known only once the engine stops: screen on throughput.
            let v = match metric {
                Metric::TokensPerJoule => screen.output_throughput,
                _ => t.screen_objective.unwrap_or(0.0),
            };
            let mut all: Vec<f64> = screens.to_vec();
            all.push(v);
            all.sort_by(f64::total_cmp);
            // Promote the top `promote` fraction of screened candidates (and every baseline).
            let cut = ((all.len() as f64) * (1.0 - spec.screening.promote)).floor() as usize;
            let threshold = all[cut.min(all.len() - 1)];
            t.promoted = frac >= 1.0 || baseline || v >= threshold;
            if !t.promoted {
                t.saved_s = screen.duration_s * (1.0 / frac - 1.0);
                return Ok(());
            }
            let full = if frac >= 1.0 {
                screen
            } else {
                let f = self.measure(0, 1.0).await?;
                t.bench_s += f.duration_s;
                f
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
            if self.metric() == Metric::TokensPerJoule && t.early_stop.is_none() {
                t.screen_objective = tpj;
                if t.promoted {
                    t.objective = tpj;
                }
            }
        }
        t.status = match result {
            Err(f) if f.class == "infrastructure" => {
                t.failure = Some(f.clone());
                t.status = TrialStatus::Failed;
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

    /// The baseline the candidates are compared with: the best engine default.
    fn baseline_of(&self, search: &[TrialRecord]) -> Option<TrialRecord> {
        let bases = self.space.baselines();
        search
            .iter()
            .filter(|t| bases.contains(&t.config))
            .max_by(|a, b| {
                a.objective
                    .unwrap_or(f64::NEG_INFINITY)
                    .total_cmp(&b.objective.unwrap_or(f64::NEG_INFINITY))
            })
            .cloned()
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

    /// Runs the measurements of `plan` that have no finished record yet; `kind_of` names each.
    async fn run_plan(
        &mut self,
        rec: &StudyRecord,
        plan: Vec<(TrialKind, u32, usize)>,
    ) -> Result<(), TuneError> {
        let total = plan.len();
        for (i, (kind, candidate, workload)) in plan.into_iter().enumerate() {
            self.check_cancel()?;
            let all = trials(&self.store, &rec.id)?;
            let existing = all.iter().find(|t| t.kind == kind).cloned();
            let mut t = match existing {
                Some(t) if t.status != TrialStatus::Running => continue,
                Some(mut t) => {
                    t.attempts += 1;
                    t.started = unix_now();
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
            let dir = self.trial_dir(t.seq);
            let metric = self.metric();
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
                    let m = self.measure(workload, 1.0).await?;
                    t.bench_s = m.duration_s;
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
                    return Err(TuneError::Interrupted);
                }
            }
            self.put_trial(&t)?;
            let label = match &t.kind {
                TrialKind::Remeasure { round, .. } => format!("re-measure round {}", round + 1),
                TrialKind::Validate {
                    workload, round, ..
                } => format!("validation on {workload}, round {}", round + 1),
                TrialKind::Search => "search".into(),
            };
            let v = t
                .objective
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| format!("{:?}", t.status).to_lowercase());
            self.say(&format!("{label} ({}/{total}): #{candidate} → {v}", i + 1));
        }
        Ok(())
    }

    async fn remeasure(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        let all = trials(&self.store, &rec.id)?;
        let search: Vec<TrialRecord> = all
            .iter()
            .filter(|t| t.kind == TrialKind::Search)
            .cloned()
            .collect();
        let Some(base) = self.baseline_of(&search) else {
            rec.phase = Phase::Done;
            rec.outcome = None;
            self.save(rec)?;
            return Err(TuneError::Infrastructure(
                "no baseline trial was recorded".into(),
            ));
        };
        let cands = self.candidates(&search, &base);
        // Defaults that failed or missed the constraints are not re-measured: there is nothing
        // to compare with, the candidates are re-measured for their stability alone.
        let mut arms: Vec<u32> = if base.status == TrialStatus::Ok {
            vec![base.seq]
        } else {
            Vec::new()
        };
        arms.extend(cands.iter().map(|c| c.seq));
        let mut plan = Vec::new();
        if !cands.is_empty() {
            for round in 0..self.study.spec.remeasure.repeats {
                // A B C, C B A, …: every arm sees early and late slots alike.
                let order: Vec<u32> = if round % 2 == 0 {
                    arms.clone()
                } else {
                    arms.iter().rev().cloned().collect()
                };
                for a in order {
                    plan.push((
                        TrialKind::Remeasure {
                            round,
                            candidate: a,
                        },
                        a,
                        0,
                    ));
                }
            }
            self.say(&format!(
                "re-measuring the baseline #{} and {} candidate(s), {} rounds interleaved",
                base.seq,
                cands.len(),
                self.study.spec.remeasure.repeats
            ));
        }
        self.run_plan(rec, plan).await?;
        rec.phase = Phase::Validate;
        self.save(rec)
    }

    fn values(all: &[TrialRecord], pred: impl Fn(&TrialKind) -> bool) -> Result<Vec<f64>, String> {
        let mut v = Vec::new();
        for t in all.iter().filter(|t| pred(&t.kind)) {
            match (t.status, t.objective) {
                (TrialStatus::Ok, Some(x)) => v.push(x),
                (s, _) => {
                    return Err(format!(
                        "trial #{} was {}: {}",
                        t.seq,
                        format!("{s:?}").to_lowercase(),
                        t.failure
                            .as_ref()
                            .map(|f| f.evidence.clone())
                            .or(t.early_stop.clone())
                            .unwrap_or_default()
                    ))
                }
            }
        }
        Ok(v)
    }

    fn compare(&self, all: &[TrialRecord], base: u32, cands: &[u32]) -> Vec<Comparison> {
        let bvals = Self::values(
            all,
            |k| matches!(k, TrialKind::Remeasure { candidate, .. } if *candidate == base),
        );
        cands
            .iter()
            .map(|c| {
                let cvals = Self::values(
                    all,
                    |k| matches!(k, TrialKind::Remeasure { candidate, .. } if candidate == c),
                );
                let command = all
                    .iter()
                    .find(|t| t.seq == *c)
                    .and_then(|t| t.command.clone());
                match (&bvals, cvals) {
                    (Ok(b), Ok(v)) => Comparison {
                        candidate: *c,
                        command,
                        diff: Some(welch(&v, b)),
                        disqualified: None,
                    },
                    (Err(e), _) => Comparison {
                        candidate: *c,
                        command,
                        diff: None,
                        disqualified: Some(format!("the baseline failed a round: {e}")),
                    },
                    (_, Err(e)) => Comparison {
                        candidate: *c,
                        command,
                        diff: None,
                        disqualified: Some(e),
                    },
                }
            })
            .collect()
    }

    /// Candidates on their own (the defaults failed): each one's re-measured values, as a
    /// "difference" from zero (`mean_a`, `low`, `high` are the candidate's mean and interval).
    fn stability(&self, all: &[TrialRecord], cands: &[u32]) -> Vec<Comparison> {
        cands
            .iter()
            .map(|c| {
                let vals = Self::values(
                    all,
                    |k| matches!(k, TrialKind::Remeasure { candidate, .. } if candidate == c),
                );
                let command = all
                    .iter()
                    .find(|t| t.seq == *c)
                    .and_then(|t| t.command.clone());
                match vals.map(|v| (super::stats::mean_interval(&v), v.len())) {
                    Ok((Some((m, h)), n)) => Comparison {
                        candidate: *c,
                        command,
                        diff: Some(Diff {
                            mean_a: m,
                            mean_b: 0.0,
                            diff: m,
                            low: m - h,
                            high: m + h,
                            pct: f64::NAN,
                            pct_low: f64::NAN,
                            pct_high: f64::NAN,
                            n_a: n,
                            n_b: 0,
                        }),
                        disqualified: None,
                    },
                    Ok((None, _)) => Comparison {
                        candidate: *c,
                        command,
                        diff: None,
                        disqualified: Some("no re-measurement".into()),
                    },
                    Err(e) => Comparison {
                        candidate: *c,
                        command,
                        diff: None,
                        disqualified: Some(e),
                    },
                }
            })
            .collect()
    }

    async fn validate(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        let all = trials(&self.store, &rec.id)?;
        let search: Vec<TrialRecord> = all
            .iter()
            .filter(|t| t.kind == TrialKind::Search)
            .cloned()
            .collect();
        let base = self
            .baseline_of(&search)
            .ok_or_else(|| TuneError::Infrastructure("no baseline trial was recorded".into()))?;
        let cands: Vec<u32> = self
            .candidates(&search, &base)
            .iter()
            .map(|t| t.seq)
            .collect();
        let base_ok = base.status == TrialStatus::Ok;
        let comparisons = if base_ok {
            self.compare(&all, base.seq, &cands)
        } else {
            self.stability(&all, &cands)
        };
        let winner = comparisons
            .iter()
            .filter(|c| {
                c.diff.as_ref().is_some_and(|d| {
                    if base_ok {
                        d.significant_gain()
                    } else {
                        d.n_a > 0
                    }
                })
            })
            .max_by(|a, b| {
                a.diff
                    .as_ref()
                    .map(|d| d.mean_a)
                    .unwrap_or(0.0)
                    .total_cmp(&b.diff.as_ref().map(|d| d.mean_a).unwrap_or(0.0))
            })
            .cloned();
        let repeats = self.study.spec.remeasure.repeats;
        let names = self.eval.workloads();
        if let Some(w) = &winner {
            let mut plan = Vec::new();
            for (wi, name) in names.iter().enumerate().skip(1) {
                for round in 0..repeats {
                    let order = if round % 2 == 0 {
                        [base.seq, w.candidate]
                    } else {
                        [w.candidate, base.seq]
                    };
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
            }
            self.run_plan(rec, plan).await?;
        }
        let all = trials(&self.store, &rec.id)?;
        let tol = self.study.spec.validation.tolerance;
        let validation: Vec<ValidationRow> = match &winner {
            Some(w) => names
                .iter()
                .skip(1)
                .map(|name| {
                    let of = |seq: u32| {
                        Self::values(&all, |k| matches!(k, TrialKind::Validate { workload, candidate, .. } if workload == name && *candidate == seq))
                    };
                    match (of(w.candidate), of(base.seq)) {
                        (Ok(a), Ok(b)) => {
                            let d = welch(&a, &b);
                            ValidationRow {
                                workload: name.clone(),
                                regression: d.pct < -100.0 * tol,
                                diff: Some(d),
                                note: None,
                            }
                        }
                        (Err(e), _) => ValidationRow {
                            workload: name.clone(),
                            diff: None,
                            regression: true,
                            note: Some(format!("the recommended configuration failed: {e}")),
                        },
                        (_, Err(e)) => ValidationRow {
                            workload: name.clone(),
                            diff: None,
                            regression: false,
                            note: Some(format!("the baseline failed: {e}")),
                        },
                    }
                })
                .collect(),
            None => Vec::new(),
        };
        let search_all: Vec<&TrialRecord> =
            all.iter().filter(|t| t.kind == TrialKind::Search).collect();
        let verdict = match &winner {
            Some(w) if !base_ok => {
                let d = w.diff.as_ref().expect("winners have a diff");
                let why = base
                    .failure
                    .as_ref()
                    .map(|f| {
                        format!(
                            "failed ({}): {}",
                            f.class,
                            crate::util::excerpt(&f.evidence, 120)
                        )
                    })
                    .or(base
                        .early_stop
                        .clone()
                        .map(|e| format!("missed the constraints ({e})")))
                    .unwrap_or_default();
                format!(
                    "the engine's defaults (trial #{}) {why}; trial #{} meets the constraints in every re-measurement round: {:.2} (95% CI {:.2} to {:.2}, {} rounds)",
                    base.seq, w.candidate, d.mean_a, d.low, d.high, d.n_a
                )
            }
            Some(w) => {
                let d = w.diff.as_ref().expect("winners have a diff");
                let regress: Vec<&str> = validation
                    .iter()
                    .filter(|v| v.regression)
                    .map(|v| v.workload.as_str())
                    .collect();
                let mut s = format!(
                    "trial #{} beats the defaults by {:+.1}% (95% CI {:+.1}% to {:+.1}%, {} rounds each)",
                    w.candidate, d.pct, d.pct_low, d.pct_high, d.n_a
                );
                if !regress.is_empty() {
                    s.push_str(&format!(
                        "; but it regresses beyond {:.0}% on: {}",
                        100.0 * tol,
                        regress.join(", ")
                    ));
                }
                s
            }
            None if cands.is_empty() => {
                "no configuration met the constraints and beat the defaults in the search".into()
            }
            None => {
                let best = comparisons
                    .iter()
                    .filter_map(|c| c.diff.as_ref().map(|d| (c.candidate, d)))
                    .max_by(|a, b| a.1.pct.total_cmp(&b.1.pct));
                match best {
                    Some((c, d)) => format!(
                        "no significant improvement: the best candidate #{c} is {:+.1}% (95% CI {:+.1}% to {:+.1}%) against the defaults",
                        d.pct, d.pct_low, d.pct_high
                    ),
                    None => "no significant improvement: every candidate failed a re-measurement round".into(),
                }
            }
        };
        self.say(&verdict);
        let recommended_trial = winner
            .as_ref()
            .and_then(|w| all.iter().find(|t| t.seq == w.candidate))
            .cloned();
        let outcome = Outcome {
            metric: self.metric().label().into(),
            baseline_trial: base.seq,
            recommended: winner.as_ref().map(|w| w.candidate),
            recommended_command: recommended_trial
                .as_ref()
                .and_then(|t| t.command.as_deref())
                .map(serve_command),
            recommended_config: recommended_trial.as_ref().map(|t| t.config.clone()),
            comparisons,
            verdict,
            validation,
            search_trials: search_all.len() as u32,
            screened_only: search_all
                .iter()
                .filter(|t| t.screen.is_some() && !t.promoted)
                .count() as u32,
            bench_s: all.iter().map(|t| t.bench_s).sum(),
            saved_s: search_all.iter().map(|t| t.saved_s).sum(),
        };
        // The best known configuration for this node, per workload.
        let chosen = recommended_trial.clone().unwrap_or(base.clone());
        for name in names.iter().take(1) {
            let engine = chosen.engine.clone().unwrap_or_default();
            let version = chosen.engine_version.clone();
            let key = format!(
                "{}|{}|{}@{}|{}",
                self.study.model,
                rec.hardware,
                engine,
                version.as_deref().unwrap_or("?"),
                name
            );
            self.store.put(
                BEST,
                &key,
                &BestRecord {
                    key: key.clone(),
                    model: self.study.model.clone(),
                    hardware: rec.hardware.clone(),
                    engine,
                    engine_version: version,
                    workload: name.clone(),
                    study: rec.id.clone(),
                    trial: chosen.seq,
                    config: chosen.config.clone(),
                    command: chosen.command.as_deref().map(serve_command),
                    objective: chosen.objective,
                    metric: self.metric().label().into(),
                    improved: recommended_trial.is_some(),
                    at: unix_now(),
                },
            )?;
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

/// Runs `fut` unless `cancel` is set first (`None` then; the caller stops the engine).
async fn guarded<T>(
    cancel: Arc<AtomicBool>,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    let watcher = async move {
        while !cancel.load(Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        r = fut => Some(r),
        _ = watcher => None,
    }
}

/// A trial's command as one to serve with: the trial's free port replaced by 8000.
pub fn serve_command(cmd: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut it = cmd.split(' ').peekable();
    while let Some(w) = it.next() {
        out.push(w);
        if w == "--port"
            && it
                .peek()
                .is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()))
        {
            it.next();
            out.push("8000");
        }
    }
    out.join(" ")
}
