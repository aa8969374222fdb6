//! The study file (TOML): what to tune, on which workloads, for which objective, under which
//! constraints and budget. Parsing rejects unknown keys; every error names the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::opt::Algorithm;
use super::TuneError;
use crate::bench::abort::LatencyLimit;
use crate::bench::args::BenchArgs;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudySpec {
    pub study: StudySection,
    /// Study variables for the spaces (`max_model_len`, `ctx_size`, `gpu_count`, …).
    #[serde(default)]
    pub vars: BTreeMap<String, i64>,
    /// Per engine, the argv that replaces `{binary}` (e.g. the mock engine in tests).
    #[serde(default)]
    pub binaries: BTreeMap<String, Vec<String>>,
    /// Environment every engine of the study gets, the defaults' run included (over the engine
    /// file's `[engine] env`; a searched parameter on the same variable overrides it).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub objective: Objective,
    #[serde(default)]
    pub constraints: Constraints,
    #[serde(default)]
    pub budget: Budget,
    #[serde(default)]
    pub stopping: Stopping,
    #[serde(default)]
    pub screening: Screening,
    #[serde(default)]
    pub importance: ImportanceSection,
    #[serde(default)]
    pub remeasure: Remeasure,
    #[serde(default)]
    pub validation: Validation,
    #[serde(default)]
    pub foreign_load: ForeignLoad,
    #[serde(rename = "workload")]
    pub workloads: Vec<Workload>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudySection {
    /// The study's id in the store.
    pub name: String,
    /// The model argument of the engine (`@smollm2`: the GGUF `servetune setup llamacpp` installs).
    pub model: String,
    /// One engine (`vllm`) or a choice (`vllm+sglang`).
    pub engines: String,
    /// The optimiser; absent: the one `search-bench` finds best for the space's dimension
    /// (`opt::default_for`).
    #[serde(default)]
    pub optimizer: Option<Algorithm>,
    #[serde(default)]
    pub seed: u64,
    /// Where the engines' space files are (default: `search-spaces` next to the study's
    /// directory, then in the working directory).
    #[serde(default)]
    pub space_dir: Option<PathBuf>,
    /// Search only these parameters (`<engine>.<param>` in a choice of engines); the others
    /// stay at the engine's defaults. Default: all of the space files'.
    #[serde(default)]
    pub params: Option<Vec<String>>,
    /// Refuse to launch on a GPU that other processes use.
    #[serde(default = "yes")]
    pub refuse_foreign_gpu_processes: bool,
    /// `cpu` or `gpu`: which platform's parameters and defaults apply. Default: `gpu` where
    /// NVML finds a GPU, else `cpu`.
    #[serde(default)]
    pub platform: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveMetric {
    #[default]
    TotalTokenThroughput,
    OutputThroughput,
    RequestThroughput,
    /// vLLM's request goodput; the primary workload needs `--goodput`.
    RequestGoodput,
    /// Output tokens per joule of GPU energy (needs NVML).
    TokensPerJoule,
    /// The highest request rate that still meets the constraints (inner search per trial).
    MaxRate,
}

impl ObjectiveMetric {
    pub fn label(self) -> &'static str {
        match self {
            ObjectiveMetric::TotalTokenThroughput => "total token throughput (tok/s)",
            ObjectiveMetric::OutputThroughput => "output token throughput (tok/s)",
            ObjectiveMetric::RequestThroughput => "request throughput (req/s)",
            ObjectiveMetric::RequestGoodput => "request goodput (req/s)",
            ObjectiveMetric::TokensPerJoule => "output tokens per joule",
            ObjectiveMetric::MaxRate => "highest request rate within the SLOs (req/s)",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Objective {
    #[serde(default)]
    pub metric: ObjectiveMetric,
    /// `max_rate`: the rates searched (req/s), and how many runs the inner search may use.
    #[serde(default = "rate_min")]
    pub rate_min: f64,
    #[serde(default = "rate_max")]
    pub rate_max: f64,
    #[serde(default = "rate_steps")]
    pub rate_steps: u32,
}

fn rate_min() -> f64 {
    0.25
}
fn rate_max() -> f64 {
    64.0
}
fn rate_steps() -> u32 {
    8
}

impl Default for Objective {
    fn default() -> Self {
        Objective {
            metric: ObjectiveMetric::default(),
            rate_min: rate_min(),
            rate_max: rate_max(),
            rate_steps: rate_steps(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    /// Successful requests / all (0..=1).
    #[serde(default = "min_success")]
    pub min_success_rate: f64,
    /// Latency limits `METRIC:STAT:MS` (`tpot:mean:50`, `ttft:p99:2000`).
    #[serde(default)]
    pub slo: Vec<String>,
}

fn min_success() -> f64 {
    0.99
}

impl Default for Constraints {
    fn default() -> Self {
        Constraints {
            min_success_rate: min_success(),
            slo: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Search trials at most (baselines included).
    #[serde(default = "trials")]
    pub trials: u32,
    /// Wall time of the whole study at most, seconds (search stops; re-measurement still runs).
    #[serde(default)]
    pub wall_time_s: Option<f64>,
}

fn trials() -> u32 {
    30
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            trials: trials(),
            wall_time_s: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stopping {
    /// Stop when the best has not improved by `min_improvement` for this many trials.
    #[serde(default = "patience")]
    pub patience: u32,
    /// Relative improvement that counts (0.01 = 1%).
    #[serde(default = "min_improvement")]
    pub min_improvement: f64,
    /// Never stop for convergence before this many trials.
    #[serde(default = "min_trials")]
    pub min_trials: u32,
    /// GP only: stop when the expected improvement of the next proposal is below this (relative).
    #[serde(default = "ei_threshold")]
    pub ei_threshold: f64,
}

fn patience() -> u32 {
    10
}
fn min_improvement() -> f64 {
    0.01
}
fn min_trials() -> u32 {
    10
}
fn ei_threshold() -> f64 {
    0.002
}

impl Default for Stopping {
    fn default() -> Self {
        Stopping {
            patience: patience(),
            min_improvement: min_improvement(),
            min_trials: min_trials(),
            ei_threshold: ei_threshold(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Screening {
    /// Screening runs use this fraction of the primary workload's prompts; 1 disables screening.
    #[serde(default = "fraction")]
    pub fraction: f64,
    /// The fraction of screened candidates (the best ones) that get the full-length run.
    #[serde(default = "promote")]
    pub promote: f64,
}

fn fraction() -> f64 {
    0.34
}
fn promote() -> f64 {
    0.34
}

impl Default for Screening {
    fn default() -> Self {
        Screening {
            fraction: fraction(),
            promote: promote(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Remeasure {
    /// Candidates re-measured against the baseline.
    #[serde(default = "top")]
    pub top: u32,
    /// Rounds of A/B/… interleaving (each measures every candidate and the baseline once),
    /// at least; more are run while the decision is inconclusive, up to `max_repeats`.
    #[serde(default = "repeats")]
    pub repeats: u32,
    /// The cap on rounds (re-measurement, and validation per workload).
    #[serde(default = "max_repeats")]
    pub max_repeats: u32,
}

fn max_repeats() -> u32 {
    6
}

fn top() -> u32 {
    2
}
fn repeats() -> u32 {
    3
}

impl Default for Remeasure {
    fn default() -> Self {
        Remeasure {
            top: top(),
            repeats: repeats(),
            max_repeats: max_repeats(),
        }
    }
}

/// The importance phase (`opt::oat`): before the search, one trial per parameter moved alone
/// from the defaults; the parameters whose move changed nothing measurable are frozen at their
/// defaults for the rest of the study.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportanceSection {
    /// Run the phase (off by default: it costs a trial per parameter).
    #[serde(default)]
    pub one_at_a_time: bool,
    /// A move that changed the objective and every latency limit by less than this (relative)
    /// freezes its parameter. Set it above the run-to-run noise.
    #[serde(default = "freeze_below")]
    pub freeze_below: f64,
}

fn freeze_below() -> f64 {
    0.03
}

impl Default for ImportanceSection {
    fn default() -> Self {
        ImportanceSection {
            one_at_a_time: false,
            freeze_below: freeze_below(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Validation {
    /// A relative loss against the baseline beyond this on any workload is a regression.
    #[serde(default = "tolerance")]
    pub tolerance: f64,
    /// Latency statistics of the primary workload that must not get worse beyond the
    /// tolerance (`ttft:mean`, `ttft:p99`, `itl:p99`, …); `[]` for none. Default: mean TTFT,
    /// which a round of any size can decide. Not TPOT: the time per output token grows with
    /// the batch, the very trade a throughput objective makes, so a TPOT guard would call
    /// every gain from more slots a regression; a TPOT limit belongs in `constraints.slo`.
    #[serde(default = "guards")]
    pub guards: Vec<String>,
}

fn guards() -> Vec<String> {
    vec!["ttft:mean".into()]
}

fn tolerance() -> f64 {
    0.05
}

impl Default for Validation {
    fn default() -> Self {
        Validation {
            tolerance: tolerance(),
            guards: guards(),
        }
    }
}

/// Other processes' CPU use during a run (`telemetry::host`): a run during which they kept
/// more than `max_cores` cores busy on average is disturbed. It is run again once the machine
/// is quiet (`reruns` times at most, after waiting up to `settle_s` for quiet), and a disturbed
/// round is set aside by the gate, which never recommends on disturbed runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForeignLoad {
    /// Mean foreign cores over a run above which it is disturbed; `inf` turns the check off.
    #[serde(default = "max_cores")]
    pub max_cores: f64,
    #[serde(default = "reruns")]
    pub reruns: u32,
    #[serde(default = "settle_s")]
    pub settle_s: f64,
}

fn max_cores() -> f64 {
    0.25
}
fn reruns() -> u32 {
    1
}
fn settle_s() -> f64 {
    30.0
}

impl Default for ForeignLoad {
    fn default() -> Self {
        ForeignLoad {
            max_cores: max_cores(),
            reruns: reruns(),
            settle_s: settle_s(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    /// The workload tuned on (default: the first).
    #[serde(default)]
    pub primary: bool,
    /// `servetune bench` flags (`--dataset-path @sharegpt` is the cached ShareGPT).
    pub args: Vec<String>,
}

/// A loaded, checked study.
#[derive(Debug, Clone)]
pub struct Study {
    pub spec: StudySpec,
    /// The file's text, stored with the study.
    pub text: String,
    pub space_dir: PathBuf,
    /// The model argument with `@` aliases resolved.
    pub model: String,
    /// Each workload's parsed flags (aliases resolved), primary first.
    pub workloads: Vec<(String, BenchArgs)>,
    pub limits: Vec<LatencyLimit>,
    /// The study's id in the store: its name, unless the daemon gave this run its own
    /// (`<name>-<UTC time>`), so that every re-tune keeps its own trials.
    pub run_id: Option<String>,
    /// The fraction of the primary workload's prompts a screening run sends: the file's
    /// `screening.fraction`, raised so that a screen spans several waves of the workload's
    /// concurrency (steady state), or 1 (no screening) when that would be most of the run.
    pub screen_fraction: f64,
    /// What the file allows that would mislead, said once before the study runs.
    pub warnings: Vec<String>,
    /// The model's weights against the machine's memory, for the priors' `if` (unknown until
    /// the runner measures it on the node: `tune::runner`).
    pub footprint: super::prior::Footprint,
}

/// Waves of the primary workload's concurrency a screening run spans at least: the first and
/// last are ramp-up and drain, so a single wave ranks configurations by their transients.
pub const SCREEN_WAVES: usize = 4;

/// The gate's rules from a study file's constraints and validation settings.
pub fn rules_of(spec: &StudySpec, limits: &[LatencyLimit]) -> super::decide::Rules {
    super::decide::Rules {
        metric: spec.objective.metric,
        min_success_rate: spec.constraints.min_success_rate,
        limits: limits.to_vec(),
        tolerance: spec.validation.tolerance,
        guards: spec
            .validation
            .guards
            .iter()
            .map(|g| super::decide::Guard { key: g.clone() })
            .collect(),
        alpha: super::decide::alpha_per_look(spec.remeasure.repeats, spec.remeasure.max_repeats),
        max_foreign_cores: spec.foreign_load.max_cores,
    }
}

fn field(f: &str, msg: impl std::fmt::Display) -> TuneError {
    TuneError::Spec(format!("{f}: {msg}"))
}

/// `@smollm2` and `@sharegpt`: the assets of `servetune setup llamacpp`; `@vllm` and
/// `@smollm2-hf`: those of `servetune setup vllm`.
fn resolve_alias(s: &str, what: &str) -> Result<String, TuneError> {
    let Some(name) = s.strip_prefix('@') else {
        return Ok(s.to_owned());
    };
    let cache = crate::util::cache_dir();
    let llama = crate::setup::LlamaPaths::new(&cache);
    let vllm = crate::setup::VllmPaths::new(&cache);
    let p = match name {
        "smollm2" => llama.model,
        "sharegpt" => llama.sharegpt,
        "smollm2-hf" => vllm.model,
        "vllm" => vllm.vllm,
        _ => {
            return Err(field(
                what,
                format!("unknown alias {s:?} (known: @smollm2, @sharegpt, @smollm2-hf, @vllm)"),
            ))
        }
    };
    Ok(p.display().to_string())
}

/// `--metric-percentiles` with the percentile of every `pNN` statistic in `stats` added.
fn with_percentiles(current: &str, stats: impl Iterator<Item = String>) -> String {
    let mut pcts: Vec<String> = current
        .split(',')
        .map(|x| x.trim().to_owned())
        .filter(|x| !x.is_empty())
        .collect();
    for st in stats {
        if let Some(p) = st.strip_prefix('p') {
            if !pcts.iter().any(|x| x == p) {
                pcts.push(p.to_owned());
            }
        }
    }
    pcts.join(",")
}

/// The screening fraction a primary workload allows (see `Study::screen_fraction`).
fn screen_fraction(s: &StudySpec, primary: &BenchArgs, warnings: &mut Vec<String>) -> f64 {
    let frac = s.screening.fraction;
    if frac >= 1.0 {
        return 1.0;
    }
    let n = primary.num_prompts.max(1);
    let conc = match primary.max_concurrency {
        Some(c) => c.max(1),
        // All at once with no concurrency limit: a shorter run is another load, not a sample.
        None if primary.request_rate.is_infinite() => n,
        None => 1,
    };
    let asked = (n as f64 * frac).ceil() as usize;
    let need = SCREEN_WAVES * conc;
    if asked >= need {
        return frac;
    }
    if need as f64 > 0.75 * n as f64 {
        warnings.push(format!(
            "screening is off: {asked} of {n} prompts at concurrency {conc} is less than {SCREEN_WAVES} waves, and {need} prompts would be most of the run (raise --num-prompts to at least {} to screen)",
            (need as f64 / 0.75).ceil() as usize
        ));
        return 1.0;
    }
    warnings.push(format!(
        "screening runs send {need} prompts ({SCREEN_WAVES} waves at concurrency {conc}) instead of {asked}, so that they measure steady state"
    ));
    need as f64 / n as f64
}

/// The fewest requests a round must have beyond a guarded percentile for its interval to
/// close within a tolerance of a few percent in the rounds a study runs: below it, the
/// percentile is one of the few slowest requests of the round, and its round-to-round spread
/// is tens of percent (P99 TTFT over 32 requests: ±20% after 5 rounds).
pub const MIN_TAIL_REQUESTS: f64 = 5.0;

/// Refuses, at study start, a guard that cannot be decided at the primary workload's size: a
/// percentile with fewer than `MIN_TAIL_REQUESTS` requests beyond it per round, whose
/// interval would stay open at every round cap and keep the defaults whatever the candidate
/// did. The error names what would make it decidable.
fn guard_decidability(s: &StudySpec, primary: &BenchArgs) -> Result<(), TuneError> {
    let n = primary.num_prompts.max(1) as f64;
    for (i, g) in s.validation.guards.iter().enumerate() {
        let Some((_, st)) = g.split_once(':') else {
            continue;
        };
        if let Some(crate::bench::abort::Stat::P(p)) = crate::bench::abort::Stat::parse(st) {
            let tail = n * (1.0 - p / 100.0);
            if tail < MIN_TAIL_REQUESTS {
                return Err(field(
                    &format!("validation.guards[{i}]"),
                    format!(
                        "{g:?} cannot be decided: a round of {n:.0} requests has {tail:.1} beyond its {p}th percentile, so its interval would not close within {:.0}% at any round cap and the study would keep the defaults whatever it found; guard a mean or median, a lower percentile, or raise the primary workload's --num-prompts to at least {:.0}",
                        100.0 * s.validation.tolerance,
                        (MIN_TAIL_REQUESTS / (1.0 - p / 100.0)).ceil()
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Study {
    pub fn load(path: &Path) -> Result<Study, TuneError> {
        let text = std::fs::read_to_string(path).map_err(|source| TuneError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Study::parse(&text, path)
    }

    /// Parses and checks; `path` names the file in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Study, TuneError> {
        Study::parse_in(text, path, None)
    }

    /// As `parse`; `spaces` is where search spaces are looked for when the study names no
    /// `space_dir` and none sits beside the file (the daemon's `search_spaces`).
    pub fn parse_in(text: &str, path: &Path, spaces: Option<&Path>) -> Result<Study, TuneError> {
        let spec: StudySpec = toml::from_str(text)
            .map_err(|e| TuneError::Spec(format!("{}: {e}", path.display())))?;
        let s = &spec;
        if s.study.name.is_empty()
            || !s
                .study
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(field(
                "study.name",
                format!(
                    "{:?} must be non-empty letters, digits, '-', '_' or '.'",
                    s.study.name
                ),
            ));
        }
        if s.workloads.is_empty() {
            return Err(field("workload", "at least one [[workload]] is needed"));
        }
        if !(0.0..=1.0).contains(&s.constraints.min_success_rate) {
            return Err(field(
                "constraints.min_success_rate",
                format!("{} is not in [0, 1]", s.constraints.min_success_rate),
            ));
        }
        let limits = s
            .constraints
            .slo
            .iter()
            .enumerate()
            .map(|(i, l)| {
                LatencyLimit::parse(l).map_err(|e| field(&format!("constraints.slo[{i}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if s.budget.trials < 1 {
            return Err(field("budget.trials", "must be at least 1"));
        }
        if let Some(w) = s.budget.wall_time_s {
            if !(w.is_finite() && w > 0.0) {
                return Err(field(
                    "budget.wall_time_s",
                    format!("{w} is not a positive number of seconds"),
                ));
            }
        }
        if !(s.screening.fraction > 0.0 && s.screening.fraction <= 1.0) {
            return Err(field(
                "screening.fraction",
                format!("{} is not in (0, 1]", s.screening.fraction),
            ));
        }
        if !(s.screening.promote > 0.0 && s.screening.promote <= 1.0) {
            return Err(field(
                "screening.promote",
                format!("{} is not in (0, 1]", s.screening.promote),
            ));
        }
        if !(s.stopping.min_improvement >= 0.0 && s.stopping.min_improvement < 1.0) {
            return Err(field(
                "stopping.min_improvement",
                format!("{} is not in [0, 1)", s.stopping.min_improvement),
            ));
        }
        if s.remeasure.repeats < 2 {
            return Err(field(
                "remeasure.repeats",
                "needs at least 2 rounds for a confidence interval",
            ));
        }
        if s.remeasure.max_repeats < s.remeasure.repeats {
            return Err(field(
                "remeasure.max_repeats",
                format!(
                    "{} is below remeasure.repeats ({})",
                    s.remeasure.max_repeats, s.remeasure.repeats
                ),
            ));
        }
        let fl = &s.foreign_load;
        if fl.max_cores.is_nan() || fl.max_cores <= 0.0 {
            return Err(field(
                "foreign_load.max_cores",
                format!("{} is not a positive number of cores", fl.max_cores),
            ));
        }
        if !(0.0..=3600.0).contains(&fl.settle_s) {
            return Err(field(
                "foreign_load.settle_s",
                format!("{} is not a number of seconds in [0, 3600]", fl.settle_s),
            ));
        }
        if fl.reruns > 10 {
            return Err(field(
                "foreign_load.reruns",
                format!("{} is more than 10", fl.reruns),
            ));
        }
        for (i, g) in s.validation.guards.iter().enumerate() {
            let ok = g.split_once(':').is_some_and(|(m, st)| {
                crate::bench::metrics::Metric::parse(m).is_some()
                    && crate::bench::abort::Stat::parse(st).is_some()
            });
            if !ok {
                return Err(field(
                    &format!("validation.guards[{i}]"),
                    format!(
                        "{g:?} is not METRIC:STAT (ttft:p99, tpot:mean, itl:p99, e2el:median, …)"
                    ),
                ));
            }
        }
        if !(s.importance.freeze_below > 0.0 && s.importance.freeze_below < 1.0) {
            return Err(field(
                "importance.freeze_below",
                format!("{} is not in (0, 1)", s.importance.freeze_below),
            ));
        }
        if !(s.validation.tolerance >= 0.0 && s.validation.tolerance < 1.0) {
            return Err(field(
                "validation.tolerance",
                format!("{} is not in [0, 1)", s.validation.tolerance),
            ));
        }
        let o = &s.objective;
        if o.metric == ObjectiveMetric::MaxRate
            && !(o.rate_min > 0.0 && o.rate_max > o.rate_min && o.rate_steps >= 2)
        {
            return Err(field(
                "objective",
                "max_rate needs 0 < rate_min < rate_max and rate_steps >= 2",
            ));
        }
        let primaries = s.workloads.iter().filter(|w| w.primary).count();
        if primaries > 1 {
            return Err(field("workload", "only one workload may be primary"));
        }
        let mut workloads = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, w) in s.workloads.iter().enumerate() {
            let f = format!("workload[{i}] ({})", w.name);
            if !names.insert(w.name.clone()) {
                return Err(field(&f, "duplicate workload name"));
            }
            let mut args = Vec::new();
            let mut it = w.args.iter();
            while let Some(a) = it.next() {
                args.push(a.clone());
                if a == "--dataset-path" || a == "--tokenizer" {
                    if let Some(v) = it.next() {
                        args.push(resolve_alias(v, &format!("{f}.args"))?);
                    }
                }
            }
            let mut b = BenchArgs::from_flags(&args).map_err(|e| {
                field(
                    &format!("{f}.args"),
                    e.to_string().trim().replace('\n', " "),
                )
            })?;
            for flag in ["--host", "--port", "--base-url"] {
                if w.args
                    .iter()
                    .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
                {
                    return Err(field(
                        &format!("{f}.args"),
                        format!("{flag} is set by the study (each trial has its own engine)"),
                    ));
                }
            }
            if o.metric == ObjectiveMetric::RequestGoodput && w.primary && b.goodput.is_empty() {
                return Err(field(
                    &format!("{f}.args"),
                    "objective request_goodput needs --goodput on the primary workload",
                ));
            }
            // The study's constraints are the run's early-abort policy too.
            b.min_success_rate = Some(s.constraints.min_success_rate);
            b.slo = s.constraints.slo.clone();
            // The runs report every percentile a limit or a guard judges.
            let stats = limits.iter().map(|l| l.stat.label()).chain(
                s.validation
                    .guards
                    .iter()
                    .filter_map(|g| g.split_once(':').map(|(_, st)| st.to_owned())),
            );
            b.metric_percentiles = with_percentiles(&b.metric_percentiles, stats);
            b.disable_tqdm = true;
            b.validate().map_err(|e| field(&format!("{f}.args"), e))?;
            if w.primary {
                workloads.insert(0, (w.name.clone(), b));
            } else {
                workloads.push((w.name.clone(), b));
            }
        }
        if o.metric == ObjectiveMetric::RequestGoodput
            && primaries == 0
            && workloads[0].1.goodput.is_empty()
        {
            return Err(field(
                "workload[0].args",
                "objective request_goodput needs --goodput on the primary workload",
            ));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let space_dir = match &s.study.space_dir {
            Some(d) if d.is_absolute() => d.clone(),
            Some(d) => base.join(d),
            None => [
                Some(base.join("../search-spaces")),
                Some(base.join("search-spaces")),
                spaces.map(Path::to_path_buf),
                Some(PathBuf::from("search-spaces")),
            ]
            .into_iter()
            .flatten()
            .find(|d| d.is_dir())
            .unwrap_or_else(|| PathBuf::from("search-spaces")),
        };
        for e in s.study.engines.split('+') {
            if !space_dir.join(format!("{e}.toml")).is_file() {
                return Err(field(
                    "study.engines",
                    format!(
                        "no search space {} (known: {})",
                        space_dir.join(format!("{e}.toml")).display(),
                        crate::space::Space::available(&space_dir).join(", ")
                    ),
                ));
            }
        }
        for k in s.binaries.keys() {
            if !s.study.engines.split('+').any(|e| e == k) {
                return Err(field(
                    &format!("binaries.{k}"),
                    "is not one of study.engines",
                ));
            }
        }
        if let Some(pl) = &s.study.platform {
            if !crate::space::PLATFORMS.contains(&pl.as_str()) {
                return Err(field(
                    "study.platform",
                    format!(
                        "{pl:?} is not one of {}",
                        crate::space::PLATFORMS.join(", ")
                    ),
                ));
            }
        }
        let model = resolve_alias(&s.study.model, "study.model")?;
        let mut binaries = BTreeMap::new();
        for (k, argv) in &s.binaries {
            let resolved = argv
                .iter()
                .map(|a| resolve_alias(a, &format!("binaries.{k}")))
                .collect::<Result<Vec<_>, _>>()?;
            binaries.insert(k.clone(), resolved);
        }
        let mut warnings = Vec::new();
        let screen_fraction = screen_fraction(s, &workloads[0].1, &mut warnings);
        guard_decidability(s, &workloads[0].1)?;
        let mut spec = spec;
        spec.binaries = binaries;
        Ok(Study {
            text: text.to_owned(),
            space_dir,
            model,
            workloads,
            limits,
            spec,
            run_id: None,
            screen_fraction,
            warnings,
            footprint: Default::default(),
        })
    }

    pub fn id(&self) -> &str {
        self.run_id.as_deref().unwrap_or(&self.spec.study.name)
    }
}
