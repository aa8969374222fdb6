//! The study runner: a study's lifecycle. It opens (or resumes) the study record and runs its
//! phases in order: the search (`search`), the interleaved re-measurement and validation rounds
//! (`rounds`, each run measured by `measure`), then the outcome (`outcome`). Here too: a new
//! trial's record, a trial found running at a resume (run again, up to `MAX_KILLS`), a failed
//! run retried once, the engine start and the interrupt shared by every trial.
//!
//! Everything that decides what comes next is derived from the records (`records`), written
//! (and flushed) before and after every trial: a study killed at any moment resumes where it
//! stopped, the interrupted trial runs again, and no finished trial is lost.

mod exec;
mod executor;
mod measure;
mod outcome;
mod parallel;
mod rounds;
mod search;

use std::collections::BTreeMap;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use super::eval::{Evaluator, TrialFailure};
use super::opt::{self, Optimizer};
use super::records::{Phase, Records, StudyRecord, TrialKind, TrialRecord, TrialStatus, WarmStart};
use super::spec::{ObjectiveMetric, Study};
use super::TuneError;
use crate::space::{Config, Kind, Space};
use crate::store::Store;
use crate::util::unix_now;
pub use exec::Against;
use exec::Exec;
pub use executor::{TrialSpec, TRIAL_SPEC_VERSION};
pub use parallel::Slots;

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
pub type Progress = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

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
    /// Parallel trials: the node's devices and one evaluator per trial that may run at once
    /// (None: one trial at a time on the whole machine).
    pub parallel: Option<Slots<E>>,
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
            progress: std::sync::Arc::new(|_| {}),
            cancel: CancellationToken::new(),
            warm: Vec::new(),
            optimizer,
            algorithm,
            plan,
            priors,
            parallel: None,
        }
    }

    /// The same runner around another evaluator made from this one (`wrap`): a wrapper that
    /// disturbs the machine at chosen trials (the real-engine fault tests), or measures more.
    pub fn map_eval<F: Evaluator>(self, wrap: impl Fn(E) -> F) -> Runner<F> {
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
            parallel: self.parallel.map(|s| Slots {
                pool: s.pool,
                evals: s.evals.into_iter().map(&wrap).collect(),
            }),
        }
    }

    fn say(&self, s: &str) {
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
            name: Some(self.study.spec.study.name.clone()),
            metric: Some(self.metric().key().to_owned()),
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
            interference: None,
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
            self.search_parallel(&mut rec).await?;
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
            slot: None,
        }
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

    /// Pins the study's own evaluator to the devices `t` gets on an otherwise idle node (a
    /// parallel study's sequential trials and rounds), and records them on the trial.
    fn place_alone(&mut self, t: &mut TrialRecord) {
        let Some(slots) = self.parallel.as_mut() else {
            return;
        };
        let need = parallel::gpus_needed(&self.space, &t.config);
        if let Some(p) = slots.pool.take(need) {
            slots.pool.give(&p);
            self.eval.place(Some(&p));
            t.slot = Some(p);
        }
    }

    /// The execution of one trial on the study's own evaluator (`exec`).
    fn exec(&mut self) -> Exec<'_, E> {
        let dir = self.trial_root.join(self.id());
        Exec {
            study: &self.study,
            eval: &mut self.eval,
            say_to: &self.progress,
            records: &self.records,
            cancel: self.cancel.clone(),
            dir,
        }
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
