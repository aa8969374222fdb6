//! How one run is measured: a workload's run (or the bisection over the request rate for a
//! `max_rate` objective), rerun when other processes disturbed it, confirmed once when a
//! promising configuration misses the constraints narrowly; and how a trial's result and its
//! engine's telemetry become its stored status (`finish`).

use std::time::Duration;

use super::exec::Exec;
use crate::telemetry::TelemetrySummary;
use crate::tune::eval::{latency_key, Evaluator, Measurement, RunSpec, TrialFailure};
use crate::tune::records::{TrialRecord, TrialStatus};
use crate::tune::spec::ObjectiveMetric;
use crate::tune::TuneError;
use crate::util::unix_now;

impl<E: Evaluator> Exec<'_, E> {
    /// One run of a workload: plain, or the inner search over the request rate. `abort`: the
    /// study's constraints stop the run early once it misses them beyond doubt (search runs);
    /// re-measurement and validation runs always run to the end, so that they can be pooled.
    /// `seed_offset` draws other prompts (a confirmation run on the same engine).
    pub(super) async fn measure(
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

    /// Whether a run that missed the constraints missed them narrowly: by one failed request,
    /// or a latency statistic within 10% of its limit. Such a miss of a promising
    /// configuration is confirmed by a second run before the trial is called infeasible.
    pub(super) fn narrow_miss(&self, m: &Measurement) -> bool {
        let min_s = self.study.spec.constraints.min_success_rate;
        let sent = m.completed + m.failed;
        let success_short = m.success_rate < min_s;
        if success_short {
            return m.failed <= 1
                || (sent > 0 && ((1.0 - min_s) * sent as f64) + 1.0 >= m.failed as f64);
        }
        self.study.limits.iter().all(|l| {
            m.latencies_ms
                .get(&latency_key(l))
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
    pub(super) async fn quiet_measure(
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
    pub(super) async fn checked_run(
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

    pub(super) fn finish(
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
}
