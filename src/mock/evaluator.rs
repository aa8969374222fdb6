//! `tune::eval::Evaluator` in virtual time: the mock engine's flag model (`mock::engines::settings`,
//! with its real start-up failures) and its scheduler (`mock::sim`), no processes and no
//! sockets. A 200-request benchmark takes milliseconds, which makes the optimiser benchmark
//! (`servetune search-bench`) and many study tests possible.

use std::collections::BTreeMap;
use std::path::Path;

use rand::{Rng, SeedableRng};

use super::profile::Machine;
use super::sim::{block_hashes, simulate, Sched, Settings, SimRequest};
use crate::bench::abort::{LatencyLimit, Stat};
use crate::bench::metrics::Metric as M;
use crate::bench::stats::{self, Sorted};
use crate::engine::failure::Patterns;
use crate::engine::slots::Placement;
use crate::space::{CommandLine, Config, Space};
use crate::telemetry::TelemetrySummary;
use crate::tune::eval::{latency_key, Evaluator, Measurement, RunSpec, Started, TrialFailure};

/// A synthetic workload (random prompts, as `--dataset-name random`).
#[derive(Debug, Clone, PartialEq)]
pub struct SimWorkload {
    pub name: String,
    pub num_prompts: usize,
    pub input_len: u64,
    pub output_len: u64,
    /// Tokens shared by every prompt (prefix caching matters then).
    pub prefix_len: u64,
    /// Requests per second; infinity = all at once.
    pub request_rate: f64,
    pub max_concurrency: Option<usize>,
}

#[derive(Clone)]
pub struct SimEvaluator {
    pub space: Space,
    pub machine: Machine,
    pub workloads: Vec<SimWorkload>,
    pub limits: Vec<LatencyLimit>,
    /// Step-time noise (log-normal sigma); 0 = deterministic.
    pub noise: f64,
    pub seed: u64,
    runs: u64,
    /// The devices the next engine sees (a parallel study's slot): its GPUs and cores.
    pub placement: Option<Placement>,
    current: Option<(String, Settings, Option<u64>)>,
    engine_defaults: BTreeMap<String, Config>,
}

impl SimEvaluator {
    pub fn new(
        space: Space,
        machine: Machine,
        workloads: Vec<SimWorkload>,
        noise: f64,
        seed: u64,
    ) -> Self {
        SimEvaluator {
            space,
            machine,
            workloads,
            limits: Vec::new(),
            noise,
            seed,
            runs: 0,
            placement: None,
            current: None,
            engine_defaults: BTreeMap::new(),
        }
    }

    fn max_model_len(&self, space: &Space) -> u64 {
        space
            .vars
            .get("max_model_len")
            .or(space.vars.get("ctx_size"))
            .copied()
            .unwrap_or(8192)
            .max(1) as u64
    }

    /// The requests of a workload: the same for every configuration.
    pub fn requests(
        &self,
        w: &SimWorkload,
        n: usize,
        rate: f64,
        seed_offset: u64,
    ) -> Vec<SimRequest> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            self.seed ^ 0xB0B ^ seed_offset.wrapping_mul(0x9E37_79B9),
        );
        let prefix: Vec<u64> = (0..w.prefix_len).map(|i| 1_000_000 + i).collect();
        let mut t = 0.0;
        (0..n)
            .map(|i| {
                let spread = |x: u64, r: &mut rand::rngs::StdRng| {
                    let lo = (x as f64 * 0.75) as u64;
                    r.random_range(lo.max(1)..=x.max(1) + x / 4)
                };
                let input = spread(w.input_len, &mut rng);
                let out = spread(w.output_len, &mut rng);
                let mut toks = prefix.clone();
                toks.extend((0..input).map(|k| (i as u64) << 32 | k));
                if rate.is_finite() {
                    let u: f64 = rng.random_range(1e-12..1.0);
                    t += -u.ln() / rate;
                }
                SimRequest {
                    arrival_s: t,
                    prompt_tokens: toks.len() as u64,
                    max_tokens: out,
                    blocks: block_hashes(&toks, 16),
                }
            })
            .collect()
    }
}

impl Evaluator for SimEvaluator {
    async fn start(&mut self, cfg: &Config, _dir: &Path) -> Result<Started, TrialFailure> {
        self.start_now(cfg)
    }

    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        self.run_now(spec)
    }

    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        self.current = None;
        Ok(None)
    }

    fn workloads(&self) -> Vec<String> {
        self.workloads.iter().map(|w| w.name.clone()).collect()
    }

    fn place(&mut self, placement: Option<&Placement>) {
        self.placement = placement.cloned();
    }
}

impl SimEvaluator {
    /// `start` without the future (the optimiser benchmark calls it in a tight loop).
    pub fn start_now(&mut self, cfg: &Config) -> Result<Started, TrialFailure> {
        let (space, ecfg) = self.space.split(cfg).map_err(|e| TrialFailure {
            class: "infrastructure".into(),
            evidence: e,
            log_excerpt: String::new(),
        })?;
        let profile = space.engine.name.clone();
        // Parameters a restricted space leaves out run at the engine's defaults.
        let mut full = match self.engine_defaults.get(&profile) {
            Some(d) => d.clone(),
            None => {
                let d = super::profile::space(&profile, &self.machine.version)
                    .map(|s| s.defaults())
                    .unwrap_or_default();
                self.engine_defaults.insert(profile.clone(), d.clone());
                d
            }
        };
        full.extend(space.defaults());
        full.extend(ecfg.clone());
        let mml = self.max_model_len(space);
        // A slot's engine sees only its devices, as CUDA_VISIBLE_DEVICES and the affinity
        // mask make a real engine see them.
        let mut machine = self.machine.clone();
        if let Some(p) = &self.placement {
            if !p.gpus.is_empty() {
                machine.hw.gpus = p.gpus.len() as u32;
            }
            if !p.cores.is_empty() {
                machine.hw.cores = p.cores.len() as u32;
            }
        }
        match super::engines::settings(&profile, &full, mml, &machine) {
            Ok((mut settings, _banner, oom)) => {
                settings.noise = self.noise;
                let command = CommandLine {
                    env: Vec::new(),
                    argv: std::iter::once(profile.clone())
                        .chain(ecfg.iter().map(|(k, v)| format!("{k}={v}")))
                        .collect(),
                };
                self.current = Some((profile.clone(), settings, oom));
                Ok(Started {
                    command,
                    engine: profile,
                    engine_version: Some(self.machine.version.clone()),
                    startup_s: 0.0,
                })
            }
            Err(fatal) => {
                let f = Patterns::new(&space.engine.failures).classify(&fatal.log, false);
                Err(TrialFailure {
                    class: f
                        .as_ref()
                        .map(|f| f.class.key().to_owned())
                        .unwrap_or_else(|| "crash".into()),
                    evidence: f.map(|f| f.evidence).unwrap_or_default(),
                    log_excerpt: fatal.log,
                })
            }
        }
    }

    /// `run` without the future.
    pub fn run_now(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        let Some((profile, settings, oom)) = self.current.clone() else {
            return Err(TrialFailure {
                class: "infrastructure".into(),
                evidence: "no engine started".into(),
                log_excerpt: String::new(),
            });
        };
        let w = self.workloads[spec.workload].clone();
        let n =
            ((w.num_prompts as f64 * spec.fraction).ceil() as usize).clamp(1, w.num_prompts.max(1));
        let rate = spec.rate.unwrap_or(w.request_rate);
        let reqs = self.requests(&w, n, rate, spec.seed_offset);
        self.runs += 1;
        let mut sched = Sched::new(
            settings,
            self.machine.hw.clone(),
            self.machine.model.clone(),
            self.seed.wrapping_add(self.runs.wrapping_mul(0x9E37)),
        );
        let (out, makespan) = simulate(&mut sched, &reqs, w.max_concurrency);
        if let Some(limit) = oom {
            if sched.stats.max_prefill_tokens > limit {
                let log = super::engines::runtime_oom_log(
                    &profile,
                    sched.stats.max_prefill_tokens,
                    self.machine.hw.mem_gib,
                );
                return Err(TrialFailure {
                    class: "oom".into(),
                    evidence: log.clone(),
                    log_excerpt: log,
                });
            }
        }
        let ok: Vec<_> = out.iter().filter(|o| o.ok).collect();
        let dur = makespan.max(1e-9);
        let out_tokens: u64 = ok.iter().map(|o| o.output_tokens).sum();
        let in_tokens: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
        let ttft: Vec<f64> = ok.iter().map(|o| o.ttft_s * 1e3).collect();
        let tpot: Vec<f64> = ok
            .iter()
            .filter(|o| o.output_tokens > 1)
            .map(|o| (o.e2el_s - o.ttft_s) * 1e3 / (o.output_tokens - 1) as f64)
            .collect();
        let e2el: Vec<f64> = ok.iter().map(|o| o.e2el_s * 1e3).collect();
        let mut lat = BTreeMap::new();
        for (m, v) in [(M::Ttft, &ttft), (M::Tpot, &tpot), (M::E2el, &e2el)] {
            let sorted = Sorted::new(v);
            let mean = stats::mean(v);
            lat.insert(format!("{}:mean", m.key()), mean);
            lat.insert(format!("{}:median", m.key()), sorted.percentile(50.0));
            lat.insert(format!("{}:p99", m.key()), sorted.percentile(99.0));
            for l in self.limits.iter().filter(|l| l.metric == m) {
                let x = match l.stat {
                    Stat::Mean => mean,
                    Stat::Median => sorted.percentile(50.0),
                    Stat::P(p) => sorted.percentile(p),
                };
                lat.insert(latency_key(l), x);
            }
        }
        // Token ITL equals TPOT here (one token per event).
        for s in ["mean", "median", "p99"] {
            let v = lat[&format!("tpot:{s}")];
            lat.insert(format!("itl:{s}"), v);
        }
        Ok(Measurement {
            workload: w.name.clone(),
            num_prompts: n,
            request_rate: rate.is_finite().then_some(rate),
            duration_s: dur,
            completed: ok.len(),
            failed: out.len() - ok.len(),
            success_rate: ok.len() as f64 / out.len().max(1) as f64,
            total_token_throughput: (in_tokens + out_tokens) as f64 / dur,
            output_throughput: out_tokens as f64 / dur,
            request_throughput: ok.len() as f64 / dur,
            request_goodput: None,
            total_output_tokens: out_tokens,
            latencies_ms: lat,
            aborted: None,
            tokens_per_joule: None,
            summary: None,
            resolution: None,
            failures: BTreeMap::new(),
            replaces: None,
            foreign_cores: None,
        })
    }
}
