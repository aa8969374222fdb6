//! Measuring a configuration: start its engine, run workloads against it, stop it. The study
//! loop sees only the `Evaluator`/`Session` traits; `EngineEvaluator` does it for real (the
//! launcher and the load generator), `mock::evaluator::SimEvaluator` in virtual time for the optimiser
//! benchmark and fast tests.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::opt::DecodeLoad;
use super::spec::ObjectiveMetric;
use crate::bench::abort::{LatencyLimit, Stat};
use crate::bench::args::BenchArgs;
use crate::bench::dataset::SampleRequest;
use crate::bench::metrics::Summary;
use crate::engine::failure::Patterns;
use crate::engine::launch::LaunchError;
use crate::engine::slots::Placement;
use crate::engine::trial::{Launcher, TrialEngine, TrialError};
use crate::space::{CommandLine, Config, Space};
use crate::telemetry::TelemetrySummary;

/// One benchmark run's figures, as the tuner needs them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub workload: String,
    pub num_prompts: usize,
    /// Requests per second asked for (`None`: all at once).
    pub request_rate: Option<f64>,
    pub duration_s: f64,
    pub completed: usize,
    pub failed: usize,
    pub success_rate: f64,
    pub total_token_throughput: f64,
    pub output_throughput: f64,
    pub request_throughput: f64,
    pub request_goodput: Option<f64>,
    pub total_output_tokens: u64,
    /// `ttft:mean`, `tpot:p99`, … in ms: the standard ones and every SLO's.
    pub latencies_ms: BTreeMap<String, f64>,
    /// Why the load generator stopped early (success floor or SLO beyond doubt).
    pub aborted: Option<String>,
    pub tokens_per_joule: Option<f64>,
    /// The load generator's whole summary (vLLM's result fields), for the report.
    pub summary: Option<serde_json::Value>,
    /// The objective's resolution where it is read from a grid (`max_rate`: the width of the
    /// last bracket), so that identical rounds do not make a zero-width interval.
    #[serde(default)]
    pub resolution: Option<f64>,
    /// Failed requests by reason (`stream_interrupted`, `http_status`, …).
    #[serde(default)]
    pub failures: BTreeMap<String, usize>,
    /// Set when this run replaced an earlier one: why, and what the first run read (a
    /// promising configuration that missed the constraints narrowly is confirmed before it is
    /// called infeasible; a run disturbed by foreign load is run again once the machine is
    /// quiet).
    #[serde(default, alias = "confirmed")]
    pub replaces: Option<String>,
    /// The mean number of cores other processes kept busy during the run
    /// (`telemetry::host`); `None` where it could not be read.
    #[serde(default)]
    pub foreign_cores: Option<f64>,
}

fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// The key of a latency statistic in `latencies_ms`.
pub fn latency_key(l: &LatencyLimit) -> String {
    format!("{}:{}", l.metric.key(), l.stat.label())
}

impl Measurement {
    pub fn from_summary(
        workload: &str,
        num_prompts: usize,
        rate: f64,
        s: &Summary,
        aborted: Option<String>,
        limits: &[LatencyLimit],
    ) -> Measurement {
        use crate::bench::metrics::Metric as M;
        let mut lat = BTreeMap::new();
        for m in [M::Ttft, M::Tpot, M::Itl, M::E2el] {
            let st = s.metric(m);
            lat.insert(format!("{}:mean", m.key()), finite(st.mean_ms));
            lat.insert(format!("{}:median", m.key()), finite(st.median_ms));
            for (p, v) in &st.percentiles_ms {
                lat.insert(format!("{}:p{p}", m.key()), finite(*v));
            }
        }
        for l in limits {
            let st = s.metric(l.metric);
            let v = match l.stat {
                Stat::Mean => Some(st.mean_ms),
                Stat::Median => Some(st.median_ms),
                Stat::P(p) => st.percentile(p),
            };
            if let Some(v) = v {
                lat.insert(latency_key(l), finite(v));
            }
        }
        Measurement {
            workload: workload.to_owned(),
            num_prompts,
            request_rate: rate.is_finite().then_some(rate),
            duration_s: finite(s.duration),
            completed: s.completed,
            failed: s.failed,
            success_rate: finite(s.success_rate),
            total_token_throughput: finite(s.total_token_throughput),
            output_throughput: finite(s.output_throughput),
            request_throughput: finite(s.request_throughput),
            request_goodput: s.request_goodput.map(finite),
            total_output_tokens: s.total_output_tokens,
            latencies_ms: lat,
            aborted,
            tokens_per_joule: None,
            summary: serde_json::to_value(s).ok(),
            resolution: None,
            failures: s
                .failed_by_reason
                .iter()
                .map(|(k, n)| (k.as_str().to_owned(), *n))
                .collect(),
            replaces: None,
            foreign_cores: None,
        }
    }

    /// The objective's value (higher is better); `None` where this run cannot tell it.
    pub fn objective(&self, metric: ObjectiveMetric) -> Option<f64> {
        match metric {
            ObjectiveMetric::TotalTokenThroughput => Some(self.total_token_throughput),
            ObjectiveMetric::OutputThroughput => Some(self.output_throughput),
            ObjectiveMetric::RequestThroughput => Some(self.request_throughput),
            ObjectiveMetric::RequestGoodput => self.request_goodput,
            ObjectiveMetric::TokensPerJoule => self.tokens_per_joule,
            ObjectiveMetric::MaxRate => self.request_rate,
        }
    }

    /// Whether other processes kept more than `max_cores` cores busy during the run.
    pub fn disturbed(&self, max_cores: f64) -> bool {
        self.foreign_cores.is_some_and(|f| f > max_cores)
    }

    /// Why this run misses the constraints, if it does.
    /// Per latency limit, the log of measured / limit (above 0: missed), None where the run
    /// did not measure the statistic: what the optimiser's constraint models learn from.
    pub fn slack(&self, limits: &[LatencyLimit]) -> Vec<Option<f64>> {
        limits
            .iter()
            .map(|l| {
                self.latencies_ms
                    .get(&latency_key(l))
                    .filter(|v| **v > 0.0 && l.limit_ms > 0.0)
                    .map(|v| (v / l.limit_ms).ln())
            })
            .collect()
    }

    /// The run's decode load against the per-token limits among `limits` (TPOT, ITL): None
    /// when there are none or the run did not measure its mean TPOT or output throughput.
    pub fn decode_load(&self, limits: &[LatencyLimit]) -> Option<DecodeLoad> {
        use crate::bench::metrics::Metric;
        let slack = self
            .slack(limits)
            .into_iter()
            .zip(limits)
            .filter(|(_, l)| matches!(l.metric, Metric::Tpot | Metric::Itl))
            .map(|(s, _)| s)
            .collect::<Option<Vec<f64>>>()?
            .into_iter()
            .reduce(f64::max)?;
        let tpot_s = self.latencies_ms.get("tpot:mean").copied()? / 1000.0;
        let batch = self.output_throughput * tpot_s;
        (batch > 0.0 && batch.is_finite()).then_some(DecodeLoad { batch, slack })
    }

    pub fn violation(&self, min_success_rate: f64, limits: &[LatencyLimit]) -> Option<String> {
        if let Some(a) = &self.aborted {
            return Some(format!("stopped early: {a}"));
        }
        if self.success_rate < min_success_rate {
            return Some(format!(
                "success rate {:.1}% < {:.1}%",
                100.0 * self.success_rate,
                100.0 * min_success_rate
            ));
        }
        for l in limits {
            if let Some(v) = self.latencies_ms.get(&latency_key(l)) {
                if *v > l.limit_ms {
                    return Some(format!(
                        "{} {} = {v:.1} ms > {} ms",
                        l.stat.label(),
                        l.metric.key(),
                        l.limit_ms
                    ));
                }
            }
        }
        None
    }
}

/// Why a configuration could not be measured, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialFailure {
    /// `oom`, `unsupported`, `bad_flag`, `port_in_use`, `startup_timeout`, `crash`, `hang`,
    /// or `infrastructure` (servetune itself could not do its part).
    pub class: String,
    /// The log line that proved the class.
    pub evidence: String,
    /// The last lines of the engine's log.
    pub log_excerpt: String,
}

/// What a started engine is, for the record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub command: CommandLine,
    pub engine: String,
    pub engine_version: Option<String>,
    pub startup_s: f64,
}

/// One run of a workload against a started engine.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// Index into the study's workloads (0 = primary).
    pub workload: usize,
    /// Fraction of the workload's prompts (screening runs use less than 1).
    pub fraction: f64,
    /// Overrides the workload's request rate (the `max_rate` inner search).
    pub rate: Option<f64>,
    /// Whether the study's constraints may stop the run early (search runs); re-measurement
    /// and validation runs run to the end, so that their rounds can be pooled.
    pub abort: bool,
    /// Added to the workload's seed: another draw of prompts (a confirmation run, each rate
    /// of the `max_rate` search), so that an engine's prompt cache never serves it warm.
    pub seed_offset: u64,
}

/// Starts one engine at a time, runs workloads against it, stops it.
pub trait Evaluator {
    /// Starts the engine of `cfg`; `dir` is the trial's directory (log, files).
    fn start(
        &mut self,
        cfg: &Config,
        dir: &Path,
    ) -> impl Future<Output = Result<Started, TrialFailure>>;
    /// Runs a workload against the started engine.
    fn run(&mut self, spec: &RunSpec) -> impl Future<Output = Result<Measurement, TrialFailure>>;
    /// Stops the engine and verifies it is gone; the telemetry since `start`, if any. Stopping
    /// with no engine started is a no-op.
    fn stop(&mut self) -> impl Future<Output = Result<Option<TelemetrySummary>, TrialFailure>>;
    /// The workloads' names, primary first.
    fn workloads(&self) -> Vec<String>;
    /// Pins the next engine `start`s to these devices (a parallel study's slot; `None`: the
    /// whole machine, as by default).
    fn place(&mut self, placement: Option<&Placement>) {
        let _ = placement;
    }
    /// Waits until other processes keep at most `max_cores` cores busy, or `limit` has
    /// passed; the foreign cores last read (`None`: not measured here).
    fn settle(&mut self, max_cores: f64, limit: Duration) -> impl Future<Output = Option<f64>> {
        let _ = (max_cores, limit);
        async { None }
    }
}

/// Real engines, real load.
pub struct EngineEvaluator {
    pub launcher: Launcher,
    pub space: Space,
    pub model: String,
    pub workloads: Vec<(String, BenchArgs)>,
    pub limits: Vec<LatencyLimit>,
    pub binaries: BTreeMap<String, Vec<String>>,
    pub versions: BTreeMap<String, Option<String>>,
    /// Sampled requests per (workload, prompts, seed): the same prompts for every trial.
    cache: HashMap<(usize, usize, u64), Vec<SampleRequest>>,
    engine: Option<TrialEngine>,
    /// The process groups of every engine this study runs at the moment (shared by a parallel
    /// study's evaluators): none of them is foreign load to another's run.
    ours: Arc<Mutex<Vec<i32>>>,
    patterns: Patterns,
    sampler: Option<crate::telemetry::Sampler>,
}

fn infra(msg: impl std::fmt::Display) -> TrialFailure {
    TrialFailure {
        class: "infrastructure".into(),
        evidence: msg.to_string(),
        log_excerpt: String::new(),
    }
}

fn from_trial_error(e: TrialError) -> TrialFailure {
    match e {
        TrialError::Launch(LaunchError::Failed {
            failure,
            log_excerpt,
            ..
        }) => TrialFailure {
            class: failure.class.key().to_owned(),
            evidence: failure.evidence,
            log_excerpt,
        },
        other => infra(other),
    }
}

/// On a core slot, the parameters whose default counts the machine's cores
/// (`Param::slot_default`) run at the slot's core count when the configuration leaves them at
/// their default: the engine then sees the cores it is pinned to, as it would on a machine of
/// that size.
fn slot_defaults(space: &Space, cfg: &mut Config, p: &Placement) {
    if p.cores.is_empty() {
        return;
    }
    for q in &space.params {
        if q.slot_default != Some(crate::space::SlotDefault::Cores) {
            continue;
        }
        if cfg.get(&q.name).is_none_or(|v| *v == q.default) {
            cfg.insert(
                q.name.clone(),
                crate::space::Value::Int(p.cores.len() as i64),
            );
        }
    }
}

impl EngineEvaluator {
    pub fn new(
        launcher: Launcher,
        space: Space,
        model: String,
        workloads: Vec<(String, BenchArgs)>,
        limits: Vec<LatencyLimit>,
        binaries: BTreeMap<String, Vec<String>>,
        versions: BTreeMap<String, Option<String>>,
    ) -> Self {
        EngineEvaluator {
            launcher,
            space,
            model,
            workloads,
            limits,
            binaries,
            versions,
            cache: HashMap::new(),
            engine: None,
            ours: Arc::default(),
            patterns: Patterns::default(),
            sampler: None,
        }
    }

    /// An evaluator like this one (a parallel study's next slot), sharing its record of the
    /// study's running engines.
    pub fn sibling(&self) -> EngineEvaluator {
        let mut e = EngineEvaluator::new(
            self.launcher.clone(),
            self.space.clone(),
            self.model.clone(),
            self.workloads.clone(),
            self.limits.clone(),
            self.binaries.clone(),
            self.versions.clone(),
        );
        e.ours = self.ours.clone();
        e
    }

    /// The process groups whose CPU time is the study's engines' (not foreign load): this
    /// evaluator's and, in a parallel study, the other slots'.
    fn groups(&self) -> Vec<i32> {
        let mut g: Vec<i32> = self.engine.iter().map(|e| e.ready.process.pgid()).collect();
        if let Ok(ours) = self.ours.lock() {
            g.extend(
                ours.iter()
                    .filter(|p| !g.contains(p))
                    .copied()
                    .collect::<Vec<_>>(),
            );
        }
        g
    }

    /// The engine died or stopped answering: classify from its log.
    fn engine_failure(&mut self, during: &str) -> Option<TrialFailure> {
        let engine = self.engine.as_mut()?;
        if engine.alive() {
            return None;
        }
        let log = std::fs::read_to_string(&engine.log).unwrap_or_default();
        let f = self.patterns.classify(&log, true);
        Some(TrialFailure {
            class: f
                .as_ref()
                .map(|f| f.class.key().to_owned())
                .unwrap_or_else(|| "crash".into()),
            evidence: f
                .map(|f| f.evidence)
                .unwrap_or_else(|| format!("the engine exited {during}")),
            log_excerpt: crate::engine::process::log_tail(&engine.log, 30),
        })
    }
}

impl Evaluator for EngineEvaluator {
    async fn start(&mut self, cfg: &Config, dir: &Path) -> Result<Started, TrialFailure> {
        self.stop().await?;
        let (space, mut ecfg) = self.space.split(cfg).map_err(infra)?;
        if let Some(p) = &self.launcher.placement {
            slot_defaults(space, &mut ecfg, p);
        }
        let engine = space.engine.name.clone();
        let mut launcher = self.launcher.clone();
        if let Some(b) = self.binaries.get(&engine) {
            launcher.binary = Some(b.clone());
        }
        self.patterns = Patterns::new(&space.engine.failures);
        let t0 = std::time::Instant::now();
        let te = launcher
            .start(space, &ecfg, &self.model, dir)
            .await
            .map_err(from_trial_error)?;
        let started = Started {
            command: te.rendered.command_line(),
            engine_version: self.versions.get(&engine).cloned().flatten(),
            engine,
            startup_s: t0.elapsed().as_secs_f64(),
        };
        // On a slot, its own GPUs (the others are other trials').
        let mine = self
            .launcher
            .placement
            .as_ref()
            .filter(|p| !p.gpus.is_empty())
            .map(|p| p.gpus.as_slice());
        self.sampler = Some(
            self.launcher
                .telemetry
                .sample_on(Duration::from_millis(500), mine),
        );
        if let Ok(mut ours) = self.ours.lock() {
            ours.push(te.ready.process.pgid());
        }
        self.engine = Some(te);
        Ok(started)
    }

    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        let base = match &self.engine {
            Some(e) => e.base_url.clone(),
            None => return Err(infra("no engine started")),
        };
        let (name, args) = self
            .workloads
            .get(spec.workload)
            .cloned()
            .ok_or_else(|| infra(format!("no workload {}", spec.workload)))?;
        let mut args = args;
        args.base_url = Some(base);
        args.num_prompts = ((args.num_prompts as f64 * spec.fraction).ceil() as usize)
            .clamp(1, args.num_prompts.max(1));
        if let Some(r) = spec.rate {
            args.request_rate = r;
        }
        if !spec.abort {
            args.min_success_rate = None;
            args.slo.clear();
        }
        args.seed = args
            .seed
            .wrapping_add(spec.seed_offset.wrapping_mul(0x9E37_79B9));
        if spec.fraction < 1.0 {
            // A screening run draws other prompts than the full run that follows it on the same
            // engine: with the same ones, the engine's prompt cache would serve the full run
            // warm, and it would read faster than the same run on a fresh engine.
            args.seed = args.seed.wrapping_add(0x5C4EE9);
        }
        // The seed is part of the key: a screening run that asks for as many prompts as the
        // full run (tiny workloads) still gets its own draw.
        let key = (spec.workload, args.num_prompts, args.seed);
        let (plan, _) = args
            .prepare_with(self.cache.get(&key).cloned())
            .await
            .map_err(infra)?;
        self.cache
            .entry(key)
            .or_insert_with(|| plan.requests.clone());
        let rate = plan.shape.request_rate;
        let probe = crate::telemetry::host::LoadSpan::start(self.groups());
        let outcome = crate::bench::run(plan).await.map_err(infra)?;
        let foreign_cores = probe.finish();
        if let Some(f) = self.engine_failure("during the benchmark") {
            return Err(f);
        }
        if outcome.summary.completed == 0 && outcome.aborted.is_none() {
            // Health answered but no request completed: a hung engine.
            return Err(TrialFailure {
                class: "hang".into(),
                evidence: format!(
                    "no request of {} completed (first error: {})",
                    args.num_prompts,
                    outcome
                        .records
                        .iter()
                        .find(|r| !r.error.is_empty())
                        .map(|r| crate::util::excerpt(&r.error, 200))
                        .unwrap_or_default()
                ),
                log_excerpt: self
                    .engine
                    .as_ref()
                    .map(|e| crate::engine::process::log_tail(&e.log, 30))
                    .unwrap_or_default(),
            });
        }
        let mut m = Measurement::from_summary(
            &name,
            args.num_prompts,
            rate,
            &outcome.summary,
            outcome.aborted,
            &self.limits,
        );
        m.foreign_cores = foreign_cores;
        Ok(m)
    }

    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        let tel = self.sampler.take().and_then(|s| s.finish());
        if let Some(e) = self.engine.take() {
            let pgid = e.ready.process.pgid();
            if let Ok(mut ours) = self.ours.lock() {
                ours.retain(|p| *p != pgid);
            }
            tokio::task::spawn_blocking(move || e.stop())
                .await
                .map_err(infra)?
                .map_err(infra)?;
        }
        Ok(tel)
    }

    fn workloads(&self) -> Vec<String> {
        self.workloads.iter().map(|w| w.0.clone()).collect()
    }

    fn place(&mut self, placement: Option<&Placement>) {
        self.launcher.placement = placement.cloned();
    }

    async fn settle(&mut self, max_cores: f64, limit: Duration) -> Option<f64> {
        crate::telemetry::host::wait_quiet(&self.groups(), max_cores, Duration::from_secs(2), limit)
            .await
    }
}
