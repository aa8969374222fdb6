//! One trial's execution on one engine slot (`Exec`): start the engine, run the screen and the
//! full run (or a round's run), stop it, and turn the result into the trial's status. It
//! borrows the study (read only), one slot's evaluator and the records, and nothing else of
//! the runner, so that several trials run at once, one per slot (`parallel`); the sequential
//! study uses it the same way on its one evaluator.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use super::{guarded, Progress};
use crate::tune::decide;
use crate::tune::eval::{Evaluator, Measurement, TrialFailure};
use crate::tune::records::{Records, TrialRecord, TrialStatus};
use crate::tune::spec::{ObjectiveMetric, Study};
use crate::tune::TuneError;

/// What a search trial is run against: the search so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Against {
    /// The screens of the finished search trials (what promotion ranks by).
    pub screens: Vec<f64>,
    /// The best full-run value so far: a narrow miss above it is confirmed.
    pub best_full: Option<f64>,
    /// Run in full whatever the screen reads (the defaults, the importance phase's moves).
    pub always_full: bool,
    /// The trial is the engine's defaults (run once more after a failure that is not a
    /// refusal).
    pub defaults: bool,
}

/// One trial's execution: the study, one slot's evaluator, the records, the progress sink.
pub(super) struct Exec<'a, E> {
    pub study: &'a Study,
    pub eval: &'a mut E,
    pub say_to: &'a Progress,
    pub records: &'a Records,
    pub cancel: CancellationToken,
    /// The study's trial directories (`<root>/<study id>`).
    pub dir: PathBuf,
}

impl<E: Evaluator> Exec<'_, E> {
    pub(super) fn say(&self, s: &str) {
        (self.say_to)(s);
    }

    pub(super) fn metric(&self) -> ObjectiveMetric {
        self.study.spec.objective.metric
    }

    pub(super) fn put_trial(&self, t: &TrialRecord) -> Result<(), TuneError> {
        self.records.put_trial(t)?;
        Ok(())
    }

    pub(super) fn trial_dir(&self, seq: u32) -> PathBuf {
        self.dir.join(format!("trial-{seq:04}"))
    }

    /// Starts the trial's engine and records what started: its start-up time, its command,
    /// the engine and its version.
    pub(super) async fn start_engine(&mut self, t: &mut TrialRecord) -> Result<(), TrialFailure> {
        let dir = self.trial_dir(t.seq);
        let started = self.eval.start(&t.config, &dir).await?;
        t.startup_s = Some(started.startup_s);
        t.command = Some(started.command);
        t.engine = Some(started.engine);
        t.engine_version = started.engine_version;
        Ok(())
    }

    /// A trial cancelled while it ran: its engine is stopped and the stop counted on the trial
    /// (a resume runs it again without taking it for a kill), stored, then `Interrupted`.
    pub(super) async fn interrupted(&mut self, t: &mut TrialRecord) -> TuneError {
        let _ = self.eval.stop().await;
        t.stopped += 1;
        match self.put_trial(t) {
            Ok(()) => TuneError::Interrupted,
            Err(e) => e,
        }
    }

    /// Whether a failed trial runs once more, and if so, resets it for that: its engine failed
    /// without refusing the configuration (a crash, a hang, a start-up timeout: possibly the
    /// machine's, e.g. memory a previous engine had not yet released) and it has not run again
    /// yet. The first failure is kept in `retried_after`, stored before the second attempt, so
    /// that a resume after a kill during it does not run a third.
    pub(super) fn retry_once(
        &mut self,
        t: &mut TrialRecord,
        what: &str,
    ) -> Result<bool, TuneError> {
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

    /// Runs a search trial against the search so far. The defaults' trial runs once more
    /// after a failure their engine's log does not prove to be a refusal.
    pub(super) async fn run_search_trial(
        &mut self,
        trial: &mut TrialRecord,
        against: &Against,
    ) -> Result<(), TuneError> {
        for attempt in 0..2 {
            let cancel = self.cancel.clone();
            match guarded(cancel, self.search_trial(trial, against)).await {
                Some(r) => r?,
                None => return Err(self.interrupted(trial).await),
            }
            // The defaults are the reference: only the engine refusing them (a class its
            // log proves: out of memory, unsupported, a bad flag) says they cannot run.
            if !(against.defaults && attempt == 0 && self.retry_once(trial, "the defaults")?) {
                break;
            }
        }
        Ok(())
    }

    /// A search trial: start, screen, maybe the full run, stop. `always_full` (the defaults
    /// and the importance phase's moves): promoted whatever the screen reads, and a narrow
    /// miss of the screen confirmed.
    async fn search_trial(
        &mut self,
        t: &mut TrialRecord,
        against: &Against,
    ) -> Result<(), TuneError> {
        let spec = self.study.spec.clone();
        let metric = spec.objective.metric;
        let min_s = spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        let frac = self.study.screen_fraction;
        let (screens, best_full, always_full) =
            (&against.screens, against.best_full, against.always_full);
        // Tokens per joule is known only once the engine stops: screen on throughput.
        let screen_value = move |m: &Measurement| match metric {
            ObjectiveMetric::TokensPerJoule => m.output_throughput,
            _ => m.objective(metric).unwrap_or(0.0),
        };
        let best_screen = screens.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let result: Result<(), TrialFailure> = async {
            self.start_engine(t).await?;
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

    /// One run of a round, to the end on a fresh engine (the rounds are pooled, so never
    /// stopped early nor rerun in place). A run whose engine failed without refusing the
    /// configuration (a crash, a hang, a start-up timeout) runs once more before it counts
    /// against its arm: the other arm's run in the round may have done well on a machine that
    /// was not.
    pub(super) async fn run_round(
        &mut self,
        t: &mut TrialRecord,
        candidate: u32,
        workload: usize,
    ) -> Result<(), TuneError> {
        let metric = self.metric();
        let min_s = self.study.spec.constraints.min_success_rate;
        let limits = self.study.limits.clone();
        loop {
            let cancel = self.cancel.clone();
            let fut = async {
                let result: Result<(), TrialFailure> = async {
                    self.start_engine(t).await?;
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
                self.finish(t, result, tel)
            };
            match guarded(cancel, fut).await {
                Some(r) => r?,
                None => return Err(self.interrupted(t).await),
            }
            // Whether it runs again is decided before the failure is stored: a kill in
            // between must not leave a failed record that a resume would take as final.
            if !self.retry_once(t, &format!("a round's run of #{candidate}"))? {
                self.put_trial(t)?;
                return Ok(());
            }
        }
    }
}

impl<E: Evaluator> Exec<'_, E> {
    /// One full run of the primary workload on a fresh engine of `cfg`, to the end (the
    /// interference check's run); the engine is stopped whatever happened. Cancelled:
    /// an infrastructure failure (the check is not stored, and runs again at a resume).
    pub(super) async fn probe(
        &mut self,
        cfg: &crate::space::Config,
        name: &str,
    ) -> Result<Measurement, TrialFailure> {
        let dir = self.dir.join(name);
        let cancel = self.cancel.clone();
        let result = guarded(cancel, async {
            self.eval.start(cfg, &dir).await?;
            self.measure(0, 1.0, false, 0).await
        })
        .await;
        let stopped = self.eval.stop().await;
        let m = result.unwrap_or_else(|| {
            Err(TrialFailure {
                class: "infrastructure".into(),
                evidence: "interrupted".into(),
                log_excerpt: String::new(),
            })
        })?;
        stopped?;
        Ok(m)
    }
}
