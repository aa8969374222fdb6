//! The study file's checks: every section's values in range (each error names its field),
//! the workloads' `servetune bench` flags parsed by the load generator's own parser (with the
//! study's constraints as their early-abort policy), the search-space directory, the `@`
//! aliases of `servetune setup`'s assets, and what screening and the guards allow.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{ObjectiveMetric, StudySpec, SCREEN_WAVES};
use crate::bench::abort::LatencyLimit;
use crate::bench::args::BenchArgs;
use crate::tune::TuneError;

pub(super) fn field(f: &str, msg: impl std::fmt::Display) -> TuneError {
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
pub(super) fn screen_fraction(
    s: &StudySpec,
    primary: &BenchArgs,
    warnings: &mut Vec<String>,
) -> f64 {
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
pub(super) fn guard_decidability(s: &StudySpec, primary: &BenchArgs) -> Result<(), TuneError> {
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

/// Every section's values in range, and the constraints' latency limits parsed.
pub(super) fn check_sections(s: &StudySpec) -> Result<Vec<LatencyLimit>, TuneError> {
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
    check_search_sections(s)?;
    check_gate_sections(s)?;
    check_parallel(s)?;
    let o = &s.objective;
    if o.metric == ObjectiveMetric::MaxRate
        && !(o.rate_min > 0.0 && o.rate_max > o.rate_min && o.rate_steps >= 2)
    {
        return Err(field(
            "objective",
            "max_rate needs 0 < rate_min < rate_max and rate_steps >= 2",
        ));
    }
    Ok(limits)
}

/// Parallel trials: the slots' bounds and the interference threshold.
fn check_parallel(s: &StudySpec) -> Result<(), TuneError> {
    let st = &s.study;
    if st.max_parallel_trials == Some(0) {
        return Err(field("study.max_parallel_trials", "must be at least 1"));
    }
    if st.cores_per_trial == Some(0) {
        return Err(field("study.cores_per_trial", "must be at least 1"));
    }
    if let Some(g) = &st.gpus {
        if g.is_empty() {
            return Err(field(
                "study.gpus",
                "is empty; leave it out to use every GPU of the node",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(d) = g.iter().find(|i| !seen.insert(**i)) {
            return Err(field("study.gpus", format!("GPU {d} is listed twice")));
        }
    }
    if !(st.max_interference > 0.0 && st.max_interference < 1.0) {
        return Err(field(
            "study.max_interference",
            format!("{} is not in (0, 1)", st.max_interference),
        ));
    }
    Ok(())
}

/// The search's sections: screening and stopping.
fn check_search_sections(s: &StudySpec) -> Result<(), TuneError> {
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
    Ok(())
}

/// The gate's sections (the re-measurement's rounds, the foreign-load rule, the validation's
/// guards and tolerance) and the importance phase, in the order the file was always checked.
fn check_gate_sections(s: &StudySpec) -> Result<(), TuneError> {
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
                format!("{g:?} is not METRIC:STAT (ttft:p99, tpot:mean, itl:p99, e2el:median, …)"),
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
    Ok(())
}

/// Each workload's flags, parsed by the load generator's own parser (aliases resolved), with
/// the study's constraints as the run's early-abort policy and every percentile a limit or a
/// guard judges; the primary workload first.
pub(super) fn workloads(
    s: &StudySpec,
    limits: &[LatencyLimit],
) -> Result<Vec<(String, BenchArgs)>, TuneError> {
    let o = &s.objective;
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
        let b = workload_args(s, limits, w, &f)?;
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
    Ok(workloads)
}

/// One workload's `servetune bench` flags (`f`: the field named in errors).
fn workload_args(
    s: &StudySpec,
    limits: &[LatencyLimit],
    w: &super::Workload,
    f: &str,
) -> Result<BenchArgs, TuneError> {
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
    if s.objective.metric == ObjectiveMetric::RequestGoodput && w.primary && b.goodput.is_empty() {
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
    Ok(b)
}

/// Where the search spaces are: the file's `space_dir` (relative to the study file), else
/// the first of `../search-spaces`, `search-spaces` beside the file, `spaces` (the daemon's),
/// `./search-spaces` that exists; every engine of `study.engines` must have its file there.
pub(super) fn space_dir(
    s: &StudySpec,
    path: &Path,
    spaces: Option<&Path>,
) -> Result<PathBuf, TuneError> {
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
    Ok(space_dir)
}

/// The model (its alias resolved) and the `[binaries]` table with aliases resolved; each key
/// of it must be one of `study.engines`, and `study.platform`, when given, a known platform.
pub(super) fn model_and_binaries(
    s: &StudySpec,
) -> Result<(String, BTreeMap<String, Vec<String>>), TuneError> {
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
    Ok((model, binaries))
}
