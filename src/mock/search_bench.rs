//! `servetune search-bench`: every optimiser on landscapes from the mock engine's performance
//! model, in virtual time (no processes, no sockets), over many seeds.
//!
//! For each landscape the true optimum is the best noise-free value over the whole grid, a
//! large random sample and every point any optimiser measured. An optimiser's result after t
//! trials is the *true* value of the configuration it would recommend then (its best observed,
//! which on a noisy landscape may be a lucky one). Reported per optimiser: trials to get within
//! 2% of the optimum (median over seeds), the gap at 10, 20 and 40 trials (median), and on how
//! many seeds it beat random search at equal budget.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::bench::abort::LatencyLimit;
use crate::space::{Config, Kind, Space, Value};
use crate::tune::eval::RunSpec;
use crate::tune::opt::{self, key, Algorithm, Obs, Plan};
use crate::tune::prior::{self, Footprint, Shape};

use super::evaluator::{SimEvaluator, SimWorkload};
use super::profile::Machine;
use super::sim::{Hardware, ModelSpec};

mod parallel;
mod warm;

pub use parallel::{run_parallel, study as parallel_study};
pub use warm::run_warm;

/// A landscape: a space, a machine, a workload, constraints and noise.
pub struct Landscape {
    pub name: String,
    pub space: Space,
    pub machine: Machine,
    pub workload: SimWorkload,
    pub limits: Vec<LatencyLimit>,
    pub noise: f64,
}

impl Landscape {
    /// What the workload offers, as a study would read it from its flags.
    fn shape(&self) -> Shape {
        let w = &self.workload;
        Shape {
            concurrency: Shape::concurrency(
                w.num_prompts,
                w.max_concurrency,
                w.request_rate.is_infinite(),
            ),
            prompt_tokens: (w.input_len + w.prefix_len) as f64,
            output_tokens: w.output_len as f64,
        }
    }

    /// The model's weights against the machine's memory, as a study measures them on the node.
    fn footprint(&self) -> Footprint {
        let gib = |x: f64| (x * (1u64 << 30) as f64) as u64;
        Footprint {
            weights_bytes: Some(gib(self.machine.model.weights_gib)),
            memory_bytes: Some(gib(self.machine.hw.mem_gib)),
            why: String::new(),
        }
    }

    /// The plan a study of `budget` trials on this landscape gets: its workload's priors.
    pub fn plan(&self, budget: usize) -> Plan {
        let priors = prior::resolve(&self.space, &[self.shape()], &self.footprint()).0;
        Plan {
            budget,
            cap: prior::concurrency_cap(&self.space, &priors),
            priors,
            ..Plan::default()
        }
    }
}

/// `space` with every stated prior replaced by one that points away from `optimum` (the far
/// end of a numeric range, another categorical value), sure of itself (spread 0.05).
fn misleading(space: &Space, optimum: &Config) -> Space {
    let mut s = space.clone();
    for p in &mut s.params {
        let Some(pr) = &mut p.prior else { continue };
        let far = match (&p.kind, optimum.get(&p.name)) {
            (Kind::Int { min, max, .. }, Some(Value::Int(x))) => {
                Value::Int(if (x - min) > (max - x) { *min } else { *max })
            }
            (Kind::Float { min, max, .. }, Some(Value::Float(x))) => {
                Value::Float(if (x - min) > (max - x) { *min } else { *max })
            }
            (Kind::Categorical { values }, Some(Value::Str(v))) => values
                .iter()
                .find(|w| *w != v)
                .map(|w| Value::Str(w.clone()))
                .unwrap_or(p.default.clone()),
            (Kind::Bool, Some(Value::Bool(b))) => Value::Bool(!b),
            _ => continue,
        };
        pr.at = Some(far);
        pr.at_least = None;
        pr.spread = Some(0.05);
        pr.source = "misleading on purpose (search-bench)".into();
    }
    s
}

fn restrict(space: Space, keep: &[&str]) -> Space {
    let drop: Vec<String> = space
        .params
        .iter()
        .filter(|p| !keep.contains(&p.name.as_str()))
        .map(|p| p.name.clone())
        .collect();
    space.without(&drop).0
}

fn machine(profile: &str, hw: &str, model: &str) -> Result<Machine, String> {
    Ok(Machine {
        hw: Hardware::preset(hw, 16).ok_or(format!("no hardware preset {hw}"))?,
        model: ModelSpec::preset(model).ok_or(format!("no model preset {model}"))?,
        version: super::profile::default_version(profile).to_owned(),
    })
}

/// The four shipped landscapes (3 to 10 parameters).
pub fn landscapes() -> Result<Vec<Landscape>, String> {
    let vllm = super::profile::space("vllm", super::profile::default_version("vllm"))?;
    let sglang = super::profile::space("sglang", super::profile::default_version("sglang"))?;
    let chat = SimWorkload {
        name: "random-1024-256".into(),
        num_prompts: 600,
        input_len: 1024,
        output_len: 256,
        prefix_len: 0,
        request_rate: f64::INFINITY,
        max_concurrency: None,
    };
    let three = restrict(
        vllm.clone(),
        &[
            "max_num_seqs",
            "max_num_batched_tokens",
            "enable_chunked_prefill",
        ],
    );
    let six = restrict(
        vllm,
        &[
            "max_num_seqs",
            "max_num_batched_tokens",
            "gpu_memory_utilization",
            "kv_cache_dtype",
            "quantization",
            "performance_mode",
        ],
    );
    let ten = restrict(
        sglang,
        &[
            "max_running_requests",
            "chunked_prefill_size",
            "mem_fraction_static",
            "schedule_policy",
            "schedule_conservativeness",
            "disable_radix_cache",
            "enable_mixed_chunk",
            "num_continuous_decode_steps",
            "cuda_graph_max_bs",
            "kv_cache_dtype",
        ],
    );
    Ok(vec![
        Landscape {
            name: "vllm 3p, H100 8B, TPOT SLO".into(),
            space: three.clone(),
            machine: machine("vllm", "h100", "8b")?,
            workload: chat.clone(),
            limits: vec![LatencyLimit::parse("tpot:mean:18")?],
            noise: 0.0,
        },
        Landscape {
            name: "vllm 3p, H100 8B, TPOT SLO, noise 5%".into(),
            space: three,
            machine: machine("vllm", "h100", "8b")?,
            workload: chat.clone(),
            limits: vec![LatencyLimit::parse("tpot:mean:18")?],
            noise: 0.05,
        },
        Landscape {
            name: "vllm 6p, A100 32B, OOM region + TPOT SLO".into(),
            space: six,
            machine: machine("vllm", "a100", "32b")?,
            workload: chat.clone(),
            limits: vec![LatencyLimit::parse("tpot:mean:30")?],
            noise: 0.02,
        },
        Landscape {
            name: "sglang 10p, H100 32B, prefix-shared".into(),
            space: ten,
            machine: machine("sglang", "h100", "32b")?,
            workload: SimWorkload {
                name: "random-prefix-2048".into(),
                prefix_len: 1536,
                input_len: 512,
                ..chat
            },
            limits: vec![],
            noise: 0.02,
        },
    ])
}

/// One landscape's evaluator and a cache of noise-free values.
struct Oracle<'a> {
    l: &'a Landscape,
    noisy: SimEvaluator,
    exact: SimEvaluator,
    cache: HashMap<String, Option<f64>>,
    pub evaluations: u64,
}

impl<'a> Oracle<'a> {
    fn new(l: &'a Landscape, seed: u64) -> Self {
        let mk = |noise: f64, seed: u64| {
            let mut e = SimEvaluator::new(
                l.space.clone(),
                l.machine.clone(),
                vec![l.workload.clone()],
                noise,
                seed,
            );
            e.limits = l.limits.clone();
            e
        };
        Oracle {
            l,
            noisy: mk(l.noise, seed),
            exact: mk(0.0, 0),
            cache: HashMap::new(),
            evaluations: 0,
        }
    }

    /// The observation of `cfg` and its benchmark's simulated duration (0 when the engine
    /// did not start or the run failed).
    fn eval(e: &mut SimEvaluator, l: &Landscape, cfg: &Config) -> (Obs, f64) {
        let spec = RunSpec {
            workload: 0,
            fraction: 1.0,
            rate: None,
            abort: false,
            seed_offset: 0,
        };
        let debug = std::env::var_os("SERVETUNE_DEBUG_BENCH").is_some();
        match e.start_now(cfg).and_then(|_| e.run_now(&spec)) {
            Ok(m) => {
                let violation = m.violation(0.99, &l.limits);
                if debug {
                    let ms = |k: &str| m.latencies_ms.get(k).copied().unwrap_or(f64::NAN);
                    eprintln!(
                        "{cfg:?}: {:.0} tok/s tpot {:.1} ttft {:.0} {violation:?}",
                        m.total_token_throughput,
                        ms("tpot:mean"),
                        ms("ttft:mean"),
                    );
                }
                (
                    Obs {
                        config: cfg.clone(),
                        value: violation.is_none().then_some(m.total_token_throughput),
                        failed: false,
                        measured: Some(m.total_token_throughput),
                        slack: m.slack(&l.limits),
                        decode: m.decode_load(&l.limits),
                    },
                    m.duration_s,
                )
            }
            Err(e) => {
                if debug {
                    eprintln!("{cfg:?}: {e:?}");
                }
                (
                    Obs {
                        config: cfg.clone(),
                        value: None,
                        failed: true,
                        measured: None,
                        slack: Vec::new(),
                        decode: None,
                    },
                    0.0,
                )
            }
        }
    }

    fn observe(&mut self, cfg: &Config) -> Obs {
        self.observe_timed(cfg).0
    }

    /// `observe`, with the benchmark's simulated duration.
    fn observe_timed(&mut self, cfg: &Config) -> (Obs, f64) {
        self.evaluations += 1;
        let e = if self.l.noise == 0.0 {
            &mut self.exact
        } else {
            &mut self.noisy
        };
        Self::eval(e, self.l, cfg)
    }

    fn truth(&mut self, cfg: &Config) -> Option<f64> {
        let k = key(cfg);
        if let Some(v) = self.cache.get(&k) {
            return *v;
        }
        let v = Self::eval(&mut self.exact, self.l, cfg).0.value;
        self.cache.insert(k, v);
        v
    }
}

/// The true value, after each trial, of the configuration the optimiser would recommend.
fn trajectory(
    l: &Landscape,
    kind: Algorithm,
    seed: u64,
    n: usize,
    truths: &mut HashMap<String, Option<f64>>,
) -> Vec<f64> {
    trajectory_warm(l, kind, seed, n, truths, Vec::new()).0
}

/// As `trajectory`, with the importance phase (`opt::oat`, its default threshold) before the
/// search; None where the budget leaves the search fewer than 2 trials (a study refuses it).
fn trajectory_oat(
    l: &Landscape,
    kind: Algorithm,
    seed: u64,
    n: usize,
    truths: &mut HashMap<String, Option<f64>>,
) -> Option<Vec<f64>> {
    let mut plan = l.plan(n);
    plan.one_at_a_time = Some(opt::oat::Settings {
        freeze_below: OAT_FREEZE_BELOW,
    });
    if n < l.space.baselines().len() + opt::oat::moves(&l.space, &plan).len() + 2 {
        return None;
    }
    Some(trajectory_plan(l, kind, seed, truths, Vec::new(), &plan).0)
}

/// `[importance] freeze_below`'s default.
const OAT_FREEZE_BELOW: f64 = 0.03;

/// As `trajectory`, with a warm start (measured after the baselines); also the history.
fn trajectory_warm(
    l: &Landscape,
    kind: Algorithm,
    seed: u64,
    n: usize,
    truths: &mut HashMap<String, Option<f64>>,
    warm: Vec<(Config, String)>,
) -> (Vec<f64>, Vec<Obs>) {
    trajectory_plan(l, kind, seed, truths, warm, &l.plan(n))
}

/// As `trajectory_warm`, for a study of `plan` (its budget is the number of trials).
fn trajectory_plan(
    l: &Landscape,
    kind: Algorithm,
    seed: u64,
    truths: &mut HashMap<String, Option<f64>>,
    warm: Vec<(Config, String)>,
    plan: &Plan,
) -> (Vec<f64>, Vec<Obs>) {
    let n = plan.budget;
    let mut o = Oracle::new(l, seed);
    std::mem::swap(&mut o.cache, truths);
    let mut opt = opt::make_warm(kind, &l.space, seed, plan, warm);
    let mut hist: Vec<Obs> = Vec::new();
    let mut out = Vec::new();
    let mut best: Option<(f64, Config)> = None;
    for _ in 0..n {
        let Ok(p) = opt.propose(&hist) else { break };
        let obs = o.observe(&p.config);
        if std::env::var("DEBUG_TRAJ").is_ok()
            && n == 10
            && kind == opt::default_for(&l.space, n)
            && plan.one_at_a_time.is_none()
        {
            eprintln!(
                "seed {seed} {} v={:?} m={:?} failed={} slack={:?} {} ({})",
                hist.len(),
                obs.value.map(|v| v as i64),
                obs.measured.map(|v| v as i64),
                obs.failed,
                obs.slack,
                serde_json::to_string(&p.config).unwrap(),
                p.note
            );
        }
        if let Some(v) = obs.value {
            if best.as_ref().is_none_or(|(b, _)| v > *b) {
                best = Some((v, p.config.clone()));
            }
        }
        hist.push(obs);
        let t = best.as_ref().and_then(|(_, c)| o.truth(c)).unwrap_or(0.0);
        out.push(t);
    }
    std::mem::swap(&mut o.cache, truths);
    (out, hist)
}

/// The best true value over the points in `truths` and a random sample of the space.
fn optimum(l: &Landscape, truths: &mut HashMap<String, Option<f64>>, samples: usize) -> f64 {
    let mut o = Oracle::new(l, 0);
    std::mem::swap(&mut o.cache, truths);
    let mut rng = opt::rng_for(0x0971, 0);
    for _ in 0..samples {
        if let Ok(c) = l.space.sample(&mut rng) {
            o.truth(&c);
        }
    }
    for c in opt::reference::Grid::new(l.space.clone(), 0)
        .configs()
        .take(400)
    {
        o.truth(c);
    }
    let best = o
        .cache
        .values()
        .filter_map(|v| *v)
        .fold(f64::NEG_INFINITY, f64::max);
    std::mem::swap(&mut o.cache, truths);
    best
}

/// Trials until the trajectory is within 2% of `optimum` (infinity if never).
fn trials_to(r: &[f64], optimum: f64) -> f64 {
    r.iter()
        .position(|v| *v >= 0.98 * optimum)
        .map(|i| (i + 1) as f64)
        .unwrap_or(f64::INFINITY)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub struct BenchOptions {
    pub seeds: u64,
    pub budget: usize,
    /// Random points (besides the grid) in the search for the true optimum.
    pub optimum_samples: usize,
    /// Only landscapes whose name contains this.
    pub only: Option<String>,
    /// The most trials a grid gets.
    pub grid_cap: usize,
}

/// The landscapes the options select: the four shipped ones, then the first one again with a
/// prior that points away from its optimum.
pub fn bench_landscapes(opts: &BenchOptions) -> Result<Vec<Landscape>, String> {
    let mut ls = landscapes()?;
    let wanted = |name: &str| opts.only.as_ref().is_none_or(|o| name.contains(o.as_str()));
    let misled_name = format!("{}, misleading prior", ls[0].name);
    if wanted(&misled_name) {
        let l = &ls[0];
        let mut truths = HashMap::new();
        optimum(l, &mut truths, opts.optimum_samples);
        let best = truths
            .iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .and_then(|(k, _)| serde_json::from_str::<Config>(k).ok())
            .ok_or("no feasible point on the first landscape")?;
        let misled = Landscape {
            name: misled_name,
            space: misleading(&l.space, &best),
            machine: l.machine.clone(),
            workload: l.workload.clone(),
            limits: l.limits.clone(),
            noise: l.noise,
        };
        ls.push(misled);
    }
    ls.retain(|l| wanted(&l.name));
    Ok(ls)
}

/// Runs the benchmark and returns the table (Markdown): the four landscapes, then the first
/// one again with a prior that points away from its optimum.
pub fn run(opts: &BenchOptions) -> Result<String, String> {
    let mut out = String::new();
    for l in &bench_landscapes(opts)? {
        table(l, opts, &mut out);
    }
    Ok(out)
}

/// One row: trials to 2%, the gaps at the checkpoints, wins over random.
struct Row {
    name: String,
    /// Per seed, the true value of the recommendation after each trial (one run per seed).
    runs: Vec<Vec<f64>>,
    /// Per checkpoint, per seed, the true value at the end of a study of that budget (the
    /// `default` row runs one study per budget: its start-up scales with the budget).
    at: Vec<Vec<f64>>,
}

/// The trials a study gets by default on this landscape, per budget.
const CHECKPOINTS: [usize; 3] = [10, 20, 40];

/// Runs every optimiser on `l` and appends the landscape's section of the report to `out`:
/// the optimum, the priors, then one row per optimiser.
fn table(l: &Landscape, opts: &BenchOptions, out: &mut String) {
    let t0 = std::time::Instant::now();
    let grid = opt::reference::Grid::new(l.space.clone(), 0);
    // The grid runs to its end, or to `grid_cap` trials on a large one.
    let grid_budget = (grid.len() + l.space.baselines().len()).min(opts.grid_cap);
    let mut truths: HashMap<String, Option<f64>> = HashMap::new();
    let mut rows = default_rows(l, opts, &mut truths);
    rows.extend(algorithm_rows(l, opts, grid_budget, &mut truths));
    let (optimum, points, at) = best_point(l, opts.optimum_samples, &mut truths);
    let _ = writeln!(
        out,
        "\n### {} ({} parameters; optimum {:.0} tok/s over {} distinct configurations; grid {} points)\n",
        l.name,
        l.space.params.len(),
        optimum,
        points,
        grid.len()
    );
    let _ = writeln!(out, "Optimum at `{at}`.\n");
    let said: Vec<String> = prior::resolve(&l.space, &[l.shape()], &l.footprint())
        .1
        .into_iter()
        .map(|r| r.note)
        .collect();
    if !said.is_empty() {
        let _ = writeln!(out, "Priors: {}.\n", said.join("; "));
    }
    write_rows(out, &rows, optimum);
    let _ = writeln!(
        out,
        "\n({} seeds, budget {} trials (the default row: one study per budget, {}), grid run to its end or {} trials; {:.1} s)",
        opts.seeds,
        opts.budget,
        CHECKPOINTS.map(|c| c.to_string()).join(", "),
        opts.grid_cap,
        t0.elapsed().as_secs_f64()
    );
}

/// The default optimiser's name, as the label of its rows shows it.
fn name_of_default(l: &Landscape) -> String {
    // The default by budget (`opt::default_for`): one name when it is the same at every
    // checkpoint, else each budget's.
    let default_at = |t: usize| opt::default_for(&l.space, t);
    let names: Vec<&str> = CHECKPOINTS.iter().map(|t| default_at(*t).name()).collect();
    if names.iter().all(|n| *n == names[0]) {
        names[0].to_string()
    } else {
        CHECKPOINTS
            .iter()
            .zip(&names)
            .map(|(t, n)| format!("{n} at {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The two rows of the default optimiser, one study per checkpoint budget and seed: plain, and
/// with the importance phase before the search.
fn default_rows(
    l: &Landscape,
    opts: &BenchOptions,
    truths: &mut HashMap<String, Option<f64>>,
) -> Vec<Row> {
    let default_at = |t: usize| opt::default_for(&l.space, t);
    let default_name = name_of_default(l);
    let mut rows: Vec<Row> = Vec::new();
    {
        let mut at = vec![Vec::new(); CHECKPOINTS.len()];
        let mut runs = Vec::new();
        for s in 0..opts.seeds {
            for (i, t) in CHECKPOINTS.iter().enumerate() {
                let r = trajectory(l, default_at(*t), s, *t, truths);
                at[i].push(r.last().copied().unwrap_or(0.0));
                if i + 1 == CHECKPOINTS.len() {
                    runs.push(r);
                }
            }
        }
        rows.push(Row {
            name: format!("default ({default_name})"),
            runs,
            at,
        });
    }
    {
        // The same studies with the importance phase; a budget too small for it is refused
        // (NaN: "-" in the table).
        let mut at = vec![Vec::new(); CHECKPOINTS.len()];
        let mut runs = Vec::new();
        for s in 0..opts.seeds {
            for (i, t) in CHECKPOINTS.iter().enumerate() {
                let r = trajectory_oat(l, default_at(*t), s, *t, truths);
                at[i].push(
                    r.as_ref()
                        .map_or(f64::NAN, |r| r.last().copied().unwrap_or(0.0)),
                );
                if i + 1 == CHECKPOINTS.len() {
                    runs.push(r.unwrap_or_default());
                }
            }
        }
        rows.push(Row {
            name: format!("default ({default_name}) + importance phase"),
            runs,
            at,
        });
    }
    rows
}

/// One row per optimiser, each run to the benchmark's budget (the grid to its own).
fn algorithm_rows(
    l: &Landscape,
    opts: &BenchOptions,
    grid_budget: usize,
    truths: &mut HashMap<String, Option<f64>>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for kind in Algorithm::ALL {
        let n = if kind == Algorithm::Grid {
            grid_budget
        } else {
            opts.budget
        };
        let runs: Vec<Vec<f64>> = (0..opts.seeds)
            .map(|s| trajectory(l, kind, s, n, truths))
            .collect();
        let at = CHECKPOINTS
            .iter()
            .map(|t| {
                runs.iter()
                    .map(|r| r.get(t - 1).or(r.last()).copied().unwrap_or(0.0))
                    .collect()
            })
            .collect();
        rows.push(Row {
            name: kind.name().into(),
            runs,
            at,
        });
    }
    rows
}

/// The optimum over every point measured so far (`truths`, grid included) and a random sample
/// of `samples` points: its value, the number of distinct points and the best point's key.
/// Leaves `truths` empty.
fn best_point(
    l: &Landscape,
    samples: usize,
    truths: &mut HashMap<String, Option<f64>>,
) -> (f64, usize, String) {
    // The optimum: every point measured so far (grid included) and a random sample.
    let mut o = Oracle::new(l, 0);
    std::mem::swap(&mut o.cache, truths);
    let mut rng = opt::rng_for(0x0971, 0);
    for _ in 0..samples {
        if let Ok(c) = l.space.sample(&mut rng) {
            o.truth(&c);
        }
    }
    let optimum = o
        .cache
        .values()
        .filter_map(|v| *v)
        .fold(f64::NEG_INFINITY, f64::max);
    let points = o.cache.len();
    let at = o
        .cache
        .iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k.clone())
        .unwrap_or_default();
    (optimum, points, at)
}

/// Appends the table of `rows` to `out`: per optimiser, trials to within 2% of `optimum`
/// (median), the gaps at the checkpoints (median) and on how many seeds it beat random.
fn write_rows(out: &mut String, rows: &[Row], optimum: f64) {
    let _ = writeln!(
        out,
        "| optimiser | trials to 2% (median) | gap @10 | gap @20 | gap @40 | beats random @10 | beats random @20 | beats random @40 |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let random = rows
        .iter()
        .find(|r| r.name == Algorithm::Random.name())
        .map(|r| r.at.clone())
        .unwrap_or_default();
    for row in rows {
        let within: Vec<f64> = row.runs.iter().map(|r| trials_to(r, optimum)).collect();
        let med = median(within);
        let refused = |i: usize| row.at[i].iter().any(|v| v.is_nan());
        let gap = |i: usize| {
            if refused(i) {
                return "-".to_string();
            }
            let g = median(
                row.at[i]
                    .iter()
                    .map(|v| 100.0 * (1.0 - v / optimum))
                    .collect(),
            );
            format!("{g:.1}%")
        };
        let beats = |i: usize| {
            if row.name == Algorithm::Random.name() || refused(i) {
                return "-".to_string();
            }
            let wins = row.at[i]
                .iter()
                .zip(&random[i])
                .filter(|(x, y)| **x > **y * 1.000_001)
                .count();
            format!("{wins}/{}", row.at[i].len())
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.name,
            if med.is_finite() {
                format!("{med:.0}")
            } else {
                format!("> {}", row.runs.first().map(|r| r.len()).unwrap_or(0))
            },
            gap(0),
            gap(1),
            gap(2),
            beats(0),
            beats(1),
            beats(2),
        );
    }
}
