//! Parallel trials: several search trials at once, each on its own devices (`engine::slots`).
//!
//! Before the search, the interference check: the engine's defaults alone in one slot, then in
//! every slot at once; a mean slowdown beyond `[study] max_interference` halves the slots and
//! checks again (the check is stored with the study, so a resume does not repeat it). Then the
//! loop: every idle evaluator gets the next trial (a trial found running at a resume first,
//! else the optimiser's `propose_batch` with the running trials' configurations, so a batch
//! never collapses onto one point), placed on free devices by the pool (a trial that needs
//! more than is free waits at the head of the line, so a whole-node trial gets the node);
//! each finished trial is stored, frees its devices, and the loop proposes again. A trial's
//! record is written (running, with its slot) before its engine starts; after a kill, every
//! running trial runs again. The re-measurement does not run here: its rounds run one engine
//! at a time (`rounds`), so no interference reaches the gate's evidence and no placement
//! favours an arm.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::exec::Exec;
use super::Runner;
use crate::engine::slots::Pool;
use crate::space::Config;
use crate::tune::eval::{Evaluator, Measurement, TrialFailure};
use crate::tune::records::{
    Interference, InterferenceCheck, Phase, StudyRecord, TrialKind, TrialRecord, TrialStatus,
};
use crate::tune::spec::ObjectiveMetric;
use crate::tune::TuneError;
use crate::util::unix_now;

/// A parallel study's devices and its evaluators, one per trial that may run at once.
pub struct Slots<E> {
    pub pool: Pool,
    pub evals: Vec<E>,
}

/// What the loop does next.
enum Next {
    Trial(Box<TrialRecord>),
    /// Nothing to propose before a running trial finishes.
    Wait,
    /// The search is over (once the running trials finish): why.
    Stop(String),
}

type Finished<'a, E> = (&'a mut E, TrialRecord, Result<(), TuneError>);
type Running<'a, E> = FuturesUnordered<Pin<Box<dyn Future<Output = Finished<'a, E>> + 'a>>>;

/// The GPUs a configuration's engine needs (its parallelism).
pub(super) fn gpus_needed(space: &crate::space::Space, cfg: &Config) -> u32 {
    space.gpus_needed(cfg)
}

impl<E: Evaluator> Runner<E> {
    /// The search with parallel trials (the interference check first); a study the check
    /// leaves one slot, or one without slots, runs the sequential search.
    pub(super) async fn search_parallel(&mut self, rec: &mut StudyRecord) -> Result<(), TuneError> {
        let Some(mut slots) = self.parallel.take() else {
            return self.search(rec).await;
        };
        let kept = match self.interference(rec, &mut slots).await {
            Ok(k) => k,
            Err(e) => {
                self.parallel = Some(slots);
                return Err(e);
            }
        };
        let r = if kept > 1 {
            self.parallel_search(rec, &mut slots, kept).await
        } else {
            Ok(())
        };
        self.parallel = Some(slots);
        r?;
        if kept > 1 {
            return Ok(());
        }
        self.search(rec).await
    }

    async fn parallel_search(
        &mut self,
        rec: &mut StudyRecord,
        slots: &mut Slots<E>,
        kept: usize,
    ) -> Result<(), TuneError> {
        self.announce_search(rec);
        let study = self.study.clone();
        let records = self.records.clone();
        let say = self.progress.clone();
        let dir = self.trial_root.join(self.id());
        let stop = self.cancel.child_token();
        let Slots { pool, evals } = slots;
        let mut idle: Vec<&mut E> = evals.iter_mut().take(kept).rev().collect();
        let mut running: Running<'_, E> = FuturesUnordered::new();
        let mut resumed = self.resumed(rec)?;
        let mut head: Option<TrialRecord> = None;
        let mut failure: Option<TuneError> = None;
        let mut stop_reason: Option<String> = None;
        loop {
            while failure.is_none() && !stop.is_cancelled() && !idle.is_empty() {
                let mut t = match head.take().or_else(|| resumed.pop_front()) {
                    Some(t) => t,
                    None => match self.next_parallel(rec)? {
                        Next::Trial(t) => {
                            // Stored once it has its slot: until then it waits, and the
                            // status shows only what runs.
                            stop_reason = None;
                            *t
                        }
                        Next::Wait => break,
                        Next::Stop(why) => {
                            stop_reason = Some(why);
                            break;
                        }
                    },
                };
                let need = gpus_needed(&self.space, &t.config);
                if !pool.fits_ever(need) {
                    self.too_large(&mut t, need)?;
                    continue;
                }
                let Some(p) = pool.take(need) else {
                    head = Some(t);
                    break;
                };
                let ev = idle.pop().expect("checked non-empty");
                ev.place(Some(&p));
                t.slot = Some(p);
                // It starts now, not when it was proposed (it may have waited for GPUs).
                t.started = unix_now();
                self.put_trial(&t)?;
                let finished = self.finished_search(rec)?;
                let against = self.against(&t, &finished);
                let mut ex = Exec {
                    study: &study,
                    eval: ev,
                    say_to: &say,
                    records: &records,
                    cancel: stop.clone(),
                    dir: dir.clone(),
                };
                running.push(Box::pin(async move {
                    let r = ex.run_search_trial(&mut t, &against).await;
                    (ex.eval, t, r)
                }));
            }
            let Some((ev, t, r)) = running.next().await else {
                break;
            };
            if let Some(p) = &t.slot {
                pool.give(p);
            }
            idle.push(ev);
            match r {
                Ok(()) => self.finished_trial(rec, &t)?,
                Err(e) => {
                    if failure.is_none() {
                        failure = Some(e);
                    }
                    stop.cancel();
                }
            }
        }
        if let Some(mut t) = head {
            // Proposed (or resumed) but never started: stored running, so a resume runs it
            // without counting a kill.
            t.stopped += 1;
            self.put_trial(&t)?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        self.check_cancel()?;
        let reason =
            stop_reason.unwrap_or_else(|| "the optimiser had nothing more to propose".into());
        self.say(&format!("search stopped: {reason}"));
        let finished = self.finished_search(rec)?;
        rec.stop_reason = Some(reason);
        rec.importance = self.importance(&finished);
        rec.phase = Phase::Remeasure;
        self.save(rec)
    }

    /// The finished search trials, in the order proposed.
    fn finished_search(&self, rec: &StudyRecord) -> Result<Vec<TrialRecord>, TuneError> {
        Ok(self
            .records
            .trials(&rec.id)?
            .into_iter()
            .filter(|t| t.kind == TrialKind::Search && t.status != TrialStatus::Running)
            .collect())
    }

    /// The search trials found running at a resume, each to run again (or, killed too often,
    /// recorded as failed), in the order proposed.
    fn resumed(&mut self, rec: &StudyRecord) -> Result<VecDeque<TrialRecord>, TuneError> {
        let mut out = VecDeque::new();
        for t in self.records.trials(&rec.id)? {
            if t.kind != TrialKind::Search || t.status != TrialStatus::Running {
                continue;
            }
            let t = self.resume_trial(&t);
            self.put_trial(&t)?;
            if t.status == TrialStatus::Running {
                out.push_back(t);
            }
        }
        Ok(out)
    }

    /// The next trial to run: the optimiser's proposal with the running trials taken into
    /// account, or a wait, or the end of the search.
    fn next_parallel(&mut self, rec: &mut StudyRecord) -> Result<Next, TuneError> {
        let all = self.records.trials(&rec.id)?;
        let (finished, running): (Vec<TrialRecord>, Vec<TrialRecord>) = all
            .iter()
            .filter(|t| t.kind == TrialKind::Search)
            .cloned()
            .partition(|t| t.status != TrialStatus::Running);
        self.record_phase(rec, &finished)?;
        let budget = self.study.spec.budget.trials as usize;
        if finished.len() + running.len() >= budget {
            return Ok(Next::Stop(format!("budget: {budget} trials")));
        }
        if let Some(reason) = self.stop_reason(&finished, &all, rec) {
            return Ok(Next::Stop(reason));
        }
        let history = self.history(&finished);
        let configs: Vec<Config> = running.iter().map(|t| t.config.clone()).collect();
        match self.optimizer.propose_batch(&history, &configs) {
            Ok(Some(p)) => Ok(Next::Trial(Box::new(self.new_trial(
                all.len() as u32,
                TrialKind::Search,
                p.config,
                p.note,
                p.expected_improvement,
            )))),
            Ok(None) => Ok(Next::Wait),
            Err(e) => Ok(Next::Stop(e)),
        }
    }

    /// A trial that needs more GPUs than the study has: failed at once, with why.
    fn too_large(&mut self, t: &mut TrialRecord, need: u32) -> Result<(), TuneError> {
        t.status = TrialStatus::Failed;
        t.ended = Some(unix_now());
        t.failure = Some(TrialFailure {
            class: "unsupported".into(),
            evidence: format!(
                "the configuration needs {need} GPUs at once; the study's node has fewer"
            ),
            log_excerpt: String::new(),
        });
        self.put_trial(t)
    }

    /// A finished trial: stored, the study's best updated, its line said.
    fn finished_trial(&mut self, rec: &mut StudyRecord, t: &TrialRecord) -> Result<(), TuneError> {
        self.put_trial(t)?;
        if let Some(v) = t.objective {
            if rec.best_objective.is_none_or(|b| v > b) {
                rec.best_objective = Some(v);
                rec.best_trial = Some(t.seq);
            }
        }
        self.save(rec)?;
        let n = self.finished_search(rec)?.len();
        let mut line = self.trial_line(t, rec, n);
        if let Some(p) = &t.slot {
            line = format!("{line} · on {}", p.label());
        }
        self.say(&line);
        Ok(())
    }

    /// The interference check (once per study, stored): the slots the search uses.
    async fn interference(
        &mut self,
        rec: &mut StudyRecord,
        slots: &mut Slots<E>,
    ) -> Result<usize, TuneError> {
        let k = slots.evals.len();
        if k <= 1 {
            return Ok(k);
        }
        if let Some(i) = &rec.interference {
            return Ok(i.kept.min(k));
        }
        let Some(defaults) = self.space.baselines().into_iter().next() else {
            return Ok(k);
        };
        let need = gpus_needed(&self.space, &defaults);
        self.say(&format!(
            "interference check: the engine's defaults alone, then in {k} slots at once"
        ));
        let threshold = self.study.spec.study.max_interference;
        let alone = self.probe_round(&defaults, need, 1, slots).await?;
        let Some(Some(alone)) = alone.readings.first().copied() else {
            let why = "the defaults did not run alone, so interference could not be measured; one trial at a time"
                .to_string();
            return self.keep(rec, 0.0, Vec::new(), 1, why);
        };
        let mut checks = Vec::new();
        let mut kept = k.min(slots.pool.capacity(need));
        while kept > 1 {
            let mut c = self.probe_round(&defaults, need, kept, slots).await?;
            let read: Vec<f64> = c.readings.iter().flatten().copied().collect();
            c.slowdown = (read.len() == c.readings.len() && alone > 0.0)
                .then(|| 1.0 - read.iter().sum::<f64>() / read.len() as f64 / alone);
            let slowdown = c.slowdown;
            let shown: Vec<String> = c
                .readings
                .iter()
                .zip(&c.placements)
                .map(|(r, p)| match r {
                    Some(v) => format!("{}: {v:.1}", p.label()),
                    None => format!("{}: failed", p.label()),
                })
                .collect();
            checks.push(c);
            self.say(&format!(
                "interference check: alone {alone:.1}; {kept} at once: {} → slowdown {}",
                shown.join(", "),
                slowdown.map_or("unknown (a run failed)".into(), |s| format!(
                    "{:.1}%",
                    100.0 * s
                ))
            ));
            match slowdown {
                Some(s) if s <= threshold => {
                    let why = format!(
                        "{kept} slots at once slow the defaults by {:.1}% (≤ {:.0}%): the search runs {kept} trials at once",
                        100.0 * s,
                        100.0 * threshold
                    );
                    return self.keep(rec, alone, checks, kept, why);
                }
                _ => kept /= 2,
            }
        }
        let worst = checks.last().and_then(|c| c.slowdown);
        let why = format!(
            "running the slots at once slowed the defaults by {} (> {:.0}%): one trial at a time",
            worst.map_or("an unknown amount (a run failed)".into(), |s| format!(
                "{:.1}%",
                100.0 * s
            )),
            100.0 * threshold
        );
        self.keep(rec, alone, checks, 1, why)
    }

    fn keep(
        &mut self,
        rec: &mut StudyRecord,
        alone: f64,
        checks: Vec<InterferenceCheck>,
        kept: usize,
        why: String,
    ) -> Result<usize, TuneError> {
        self.say(&format!("interference check: {why}"));
        rec.interference = Some(Interference {
            alone,
            checks,
            threshold: self.study.spec.study.max_interference,
            kept,
            why,
        });
        self.save(rec)?;
        Ok(kept)
    }

    /// The defaults in `n` slots at once, one full run of the primary workload each.
    async fn probe_round(
        &mut self,
        defaults: &Config,
        need: u32,
        n: usize,
        slots: &mut Slots<E>,
    ) -> Result<InterferenceCheck, TuneError> {
        let study = self.study.clone();
        let records = self.records.clone();
        let say = self.progress.clone();
        let dir = self.trial_root.join(self.id());
        let Slots { pool, evals } = slots;
        let mut placements = Vec::new();
        let mut futs = Vec::new();
        for (i, ev) in evals.iter_mut().take(n).enumerate() {
            let Some(p) = pool.take(need) else { break };
            ev.place(Some(&p));
            let mut ex = Exec {
                study: &study,
                eval: ev,
                say_to: &say,
                records: &records,
                cancel: self.cancel.clone(),
                dir: dir.clone(),
            };
            let name = format!("interference-{n}-{i}");
            placements.push(p);
            futs.push(async move { ex.probe(defaults, &name).await });
        }
        let results = futures_util::future::join_all(futs).await;
        for p in &placements {
            pool.give(p);
        }
        self.check_cancel()?;
        let metric = self.metric();
        let readings = results
            .into_iter()
            .map(|r| r.ok().and_then(|m| reading(&m, metric)))
            .collect();
        Ok(InterferenceCheck {
            placements,
            readings,
            slowdown: None,
        })
    }
}

/// What the interference check compares: the objective (output throughput for tokens per
/// joule, which is known only once an engine stops).
fn reading(m: &Measurement, metric: ObjectiveMetric) -> Option<f64> {
    match metric {
        ObjectiveMetric::TokensPerJoule => Some(m.output_throughput),
        _ => m.objective(metric),
    }
}
