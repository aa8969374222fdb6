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
    /// Trials run at once, each on its own devices (`engine::slots`): at most this many.
    /// Default: as many as fit (on a GPU node one per group of GPUs a trial needs; on a CPU
    /// node one, unless `cores_per_trial` divides the cores).
    #[serde(default)]
    pub max_parallel_trials: Option<usize>,
    /// The GPUs (NVML indices) the study may use. Default: every GPU of the node.
    #[serde(default)]
    pub gpus: Option<Vec<u32>>,
    /// On a CPU node, the cores each trial's engine is pinned to (`sched_setaffinity`), so
    /// that several trials run at once on disjoint core sets. Default: none (one trial at a
    /// time on the whole machine).
    #[serde(default)]
    pub cores_per_trial: Option<usize>,
    /// The largest slowdown a parallel study accepts from running its slots at once: the
    /// defaults' mean reading in every slot at once against alone (the interference check
    /// before the search). Beyond it the study halves its slots and checks again.
    #[serde(default = "max_interference")]
    pub max_interference: f64,
}

fn max_interference() -> f64 {
    0.10
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
    /// The name the study file gives it (`[objective] metric`).
    pub fn key(self) -> &'static str {
        match self {
            ObjectiveMetric::TotalTokenThroughput => "total_token_throughput",
            ObjectiveMetric::OutputThroughput => "output_throughput",
            ObjectiveMetric::RequestThroughput => "request_throughput",
            ObjectiveMetric::RequestGoodput => "request_goodput",
            ObjectiveMetric::TokensPerJoule => "tokens_per_joule",
            ObjectiveMetric::MaxRate => "max_rate",
        }
    }

    /// How it is shown, with its unit.
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
    pub footprint: Footprint,
}

/// What the machine offers the model, as far as the disk and the telemetry say before a run
/// (measured by `tune::prior`'s `Footprint::measure`; the priors' `if` reads it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Footprint {
    /// The model's weight files, bytes (None: `why`).
    pub weights_bytes: Option<u64>,
    /// The memory of one accelerator (the host's without a GPU), bytes.
    pub memory_bytes: Option<u64>,
    /// Why a size is unknown (empty when both are known).
    pub why: String,
}

/// Waves of the primary workload's concurrency a screening run spans at least: the first and
/// last are ramp-up and drain, so a single wave ranks configurations by their transients.
pub const SCREEN_WAVES: usize = 4;

mod check;

pub use check::MIN_TAIL_REQUESTS;

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
        Study::checked(spec, text, path, spaces)
    }

    /// As `parse`, with the search spaces in `spaces` whatever the file's `space_dir` says
    /// (an executor's copy of them: `servetune run-trial`).
    pub fn parse_with_spaces(text: &str, path: &Path, spaces: &Path) -> Result<Study, TuneError> {
        let mut spec: StudySpec = toml::from_str(text)
            .map_err(|e| TuneError::Spec(format!("{}: {e}", path.display())))?;
        spec.study.space_dir = Some(spaces.to_path_buf());
        Study::checked(spec, text, path, None)
    }

    fn checked(
        mut spec: StudySpec,
        text: &str,
        path: &Path,
        spaces: Option<&Path>,
    ) -> Result<Study, TuneError> {
        let limits = check::check_sections(&spec)?;
        let workloads = check::workloads(&spec, &limits)?;
        let space_dir = check::space_dir(&spec, path, spaces)?;
        let (model, binaries) = check::model_and_binaries(&spec)?;
        let mut warnings = Vec::new();
        let screen_fraction = check::screen_fraction(&spec, &workloads[0].1, &mut warnings);
        check::guard_decidability(&spec, &workloads[0].1)?;
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
