//! `servetune report STUDY --format md|json|html`: what a person reads after a study, in the
//! shape of the hand-tuning reports in `shared/seeds/`, written from the store: the conclusion
//! first (the command to run and baseline vs recommended on every workload, with 95%
//! intervals), then the environment, the engines, every option explored with its effect, the
//! failures and early stops, the full "Serving Benchmark Result" blocks, and charts (SVG).

mod data;
mod html;
mod markdown;
pub mod svg;

use serde::Serialize;
use thiserror::Error;

use crate::api::{StudyV1, TrialV1};
use crate::bench::args::BenchArgs;
use crate::bench::metrics::Summary;
use crate::bench::output::{vllm_block, RunInfo};
use crate::space::{Config, Value};
use crate::store::{Store, StoreError};
use crate::tune::decide::{CheckState, Comparison};
use crate::tune::records::{Phase, StudyRecord, TrialKind, TrialRecord, TrialStatus};
use crate::tune::significance::Diff;
use svg::{Mark, XAxis};

pub use data::build;
pub use markdown::markdown;

#[derive(Debug, Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no study {0:?} in the store")]
    NoStudy(String),
    #[error("study {0:?} has no trials yet")]
    Empty(String),
    #[error("unknown format {0:?} (md, json or html)")]
    Format(String),
    #[error("cannot write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One figure of the conclusion table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub workload: String,
    pub metric: String,
    /// Whether more is better.
    pub higher_is_better: bool,
    pub baseline: Vec<f64>,
    pub recommended: Vec<f64>,
    pub diff: Option<Diff>,
    pub regression: bool,
    /// The gate's state of this check, and whether it gates the recommendation.
    pub state: CheckState,
    pub gate: bool,
    pub note: Option<String>,
}

/// What the report says, as data (the JSON format).
#[derive(Debug, Clone, Serialize)]
pub struct ReportData {
    /// The study record; JSON shows it in the API's v1 shape (`api::StudyV1`).
    #[serde(skip)]
    pub study: StudyRecord,
    pub model: String,
    pub workloads: Vec<(String, Vec<String>)>,
    pub baseline_trial: Option<u32>,
    pub recommended_trial: Option<u32>,
    /// The candidate the conclusion rows are about: the recommended one, or the one that came
    /// closest when the defaults are kept.
    pub leader_trial: Option<u32>,
    pub recommended_command: Option<String>,
    pub baseline_command: Option<String>,
    pub rows: Vec<Row>,
    pub options: Vec<OptionRow>,
    pub engines: Vec<EngineRow>,
    /// The trials; JSON shows them as `api::TrialV1`.
    #[serde(skip)]
    pub trials: Vec<TrialRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OptionRow {
    pub param: String,
    pub value: String,
    pub trials: usize,
    pub failed: usize,
    pub infeasible: usize,
    /// Best objective among the trials with this value.
    pub best: Option<f64>,
    /// Best with this value against the baseline, %.
    pub effect_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EngineRow {
    pub engine: String,
    pub version: Option<String>,
    pub defaults: Option<f64>,
    pub best: Option<f64>,
    pub trials: usize,
}

/// The parameter names the search trials set, sorted.
fn param_names(search: &[&TrialRecord]) -> Vec<String> {
    let mut names: Vec<String> = search
        .iter()
        .flat_map(|t| t.config.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

fn show(v: &Value) -> String {
    v.to_string()
}

fn pm(d: &Diff) -> String {
    if d.pct_low.is_finite() {
        format!("{:+.1}% [{:+.1}%, {:+.1}%]", d.pct, d.pct_low, d.pct_high)
    } else {
        format!("{:+.1}% (a single run on one side: no interval)", d.pct)
    }
}

fn mean_ci(v: &[f64]) -> String {
    match crate::tune::significance::mean_interval(v) {
        None => "-".into(),
        Some((m, h)) if h.is_finite() => format!("{m:.2} ± {h:.2}"),
        Some((m, _)) => format!("{m:.2}"),
    }
}

/// Renders one configuration as `--flag value` pairs relative to the defaults.
fn config_text(c: &Config) -> String {
    c.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The charts, as SVG strings: best so far, throughput against TPOT, one per parameter.
fn mark(t: &TrialRecord, best: Option<u32>) -> Mark {
    match t.status {
        TrialStatus::Failed => Mark::Failed,
        TrialStatus::Infeasible => Mark::Infeasible,
        _ if Some(t.seq) == best => Mark::Best,
        _ => Mark::Ok,
    }
}

/// The points of the best-so-far chart: per finished search trial, its objective (the
/// screening one if it was not promoted; none unless it met the constraints) and its mark.
pub fn best_so_far_points<T: std::borrow::Borrow<TrialRecord>>(
    search: &[T],
    best: Option<u32>,
) -> Vec<(f64, Option<f64>, Mark)> {
    search
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let t = t.borrow();
            (
                i as f64,
                t.objective
                    .or(t.screen_objective)
                    .filter(|_| t.status == TrialStatus::Ok),
                mark(t, best),
            )
        })
        .collect()
}

pub fn charts(d: &ReportData) -> Vec<(String, String)> {
    let search: Vec<&TrialRecord> = d
        .trials
        .iter()
        .filter(|t| t.kind == TrialKind::Search)
        .collect();
    let ylabel = d
        .study
        .outcome
        .as_ref()
        .map(|o| o.metric.clone())
        .unwrap_or_else(|| "objective".into());
    let mark_of = |t: &TrialRecord| mark(t, d.study.best_trial);
    let mut out = Vec::new();
    let pts = best_so_far_points(&search, d.study.best_trial);
    out.push(("best-so-far".to_string(), svg::best_so_far(&pts, &ylabel)));
    let pp: Vec<(f64, f64, Mark)> = search
        .iter()
        .filter_map(|t| {
            let m = t.full.as_ref().or(t.screen.as_ref())?;
            Some((
                *m.latencies_ms.get("tpot:mean")?,
                m.total_token_throughput,
                mark_of(t),
            ))
        })
        .collect();
    if !pp.is_empty() {
        out.push((
            "throughput-vs-tpot".to_string(),
            svg::pareto(&pp, "mean TPOT (ms)", "total token throughput (tok/s)"),
        ));
    }
    let names = param_names(&search);
    for name in names {
        let vals: Vec<(&Value, &TrialRecord)> = search
            .iter()
            .filter(|t| t.status == TrialStatus::Ok)
            .filter_map(|t| t.config.get(&name).map(|v| (v, *t)))
            .filter(|(_, t)| t.objective.or(t.screen_objective).is_some())
            .collect();
        if vals.is_empty() {
            continue;
        }
        let numeric = vals
            .iter()
            .all(|(v, _)| matches!(v, Value::Int(_) | Value::Float(_)));
        let y = |t: &TrialRecord| t.objective.or(t.screen_objective).unwrap_or(0.0);
        if numeric {
            let pts: Vec<(f64, f64, Mark)> = vals
                .iter()
                .map(|(v, t)| {
                    let x = match v {
                        Value::Int(i) => *i as f64,
                        Value::Float(f) => *f,
                        _ => 0.0,
                    };
                    (x, y(t), mark_of(t))
                })
                .collect();
            let axis = if d.study.log_params.contains(&name) {
                XAxis::Log
            } else {
                XAxis::Linear
            };
            out.push((
                format!("effect-{name}"),
                svg::effect(&name, &pts, axis, &ylabel),
            ));
        } else {
            // Every value a search trial tried is a tick, also one whose trials all failed or
            // missed the constraints (no point above it then).
            let mut labels: Vec<String> = search
                .iter()
                .filter_map(|t| t.config.get(&name).map(show))
                .collect();
            labels.sort();
            labels.dedup();
            let pts: Vec<(f64, f64, Mark)> = vals
                .iter()
                .map(|(v, t)| {
                    (
                        labels.iter().position(|l| *l == show(v)).unwrap_or(0) as f64,
                        y(t),
                        mark_of(t),
                    )
                })
                .collect();
            out.push((
                format!("effect-{name}"),
                svg::effect(&name, &pts, XAxis::Categories(&labels), &ylabel),
            ));
        }
    }
    out
}

fn run_info(d: &ReportData, workload: usize) -> RunInfo {
    let args = d
        .workloads
        .get(workload)
        .and_then(|(_, a)| BenchArgs::from_flags(a).ok());
    RunInfo {
        backend: args
            .as_ref()
            .map(|a| a.backend.as_str().to_owned())
            .unwrap_or_else(|| "openai".into()),
        label: None,
        model_id: d.model.clone(),
        tokenizer_id: d.model.clone(),
        num_prompts: args.as_ref().map(|a| a.num_prompts).unwrap_or(0),
        request_rate: args
            .as_ref()
            .map(|a| a.request_rate)
            .unwrap_or(f64::INFINITY),
        burstiness: args.as_ref().map(|a| a.burstiness).unwrap_or(1.0),
        max_concurrency: args.as_ref().and_then(|a| a.max_concurrency),
        percentile_metrics: args
            .as_ref()
            .map(|a| {
                a.percentile_metrics
                    .split(',')
                    .filter_map(|m| crate::bench::metrics::Metric::parse(m.trim()))
                    .collect()
            })
            .unwrap_or_default(),
        goodput: false,
        date: String::new(),
    }
}

/// The last full-length run of a trial in the re-measurement (else its search run).
fn block_of(d: &ReportData, seq: u32) -> Option<String> {
    let m = d
        .trials
        .iter()
        .rev()
        .find(|t| {
            matches!(t.kind, TrialKind::Remeasure { candidate, .. } if candidate == seq)
                && t.full.is_some()
        })
        .or_else(|| d.trials.iter().find(|t| t.seq == seq))
        .and_then(|t| t.full.as_ref())?;
    let s: Summary = serde_json::from_value(m.summary.clone()?).ok()?;
    Some(vllm_block(&s, &run_info(d, 0)))
}

/// One row of "what mattered": the option, its effect, whether it is beyond the noise.
type ImportanceRow = (String, String, &'static str);

/// The "what mattered" section as text: its introduction, and per parameter (largest effect
/// first) its name, effect and whether it stands out of the noise. None before the search
/// has ended.
fn importance(d: &ReportData) -> Option<(String, Vec<ImportanceRow>)> {
    let imp = d.study.importance.as_ref()?;
    let mut intro = format!(
        "A model estimate from the {} search trials (the optimiser's Gaussian process on every run's objective): how much the objective changes as each option alone sweeps its range, the others held at the best trial's. The run-to-run noise the model fitted is {:.1}%; an option under twice that had no effect this study could measure.",
        imp.trials, imp.noise_pct
    );
    if imp.trials <= imp.effects.len() + 1 {
        intro.push_str(&format!(
            " With {} trials for {} options the model can fit any pattern, noise included: these estimates cannot tell an option's effect from noise, and none is marked beyond it.",
            imp.trials,
            imp.effects.len()
        ));
    }
    let rows = imp
        .effects
        .iter()
        .map(|e| {
            (
                e.param.clone(),
                format!("{:.1}%", e.pct),
                if e.measurable { "yes" } else { "no" },
            )
        })
        .collect();
    Some((intro, rows))
}

/// The importance phase as text: its introduction, and per move its option, value, the
/// objective's and latency's change against the defaults, and what the search did with it.
/// None without the phase (or before it ended).
fn one_at_a_time(d: &ReportData) -> Option<(String, Vec<[String; 5]>)> {
    let f = d.study.one_at_a_time.as_ref()?;
    let frozen = f.frozen();
    let against = match (f.reference, f.defaults_pct, f.noise_margin_pct) {
        (Some(r), Some(dp), Some(e)) => format!(
            "Each change is against the phase's reference, the median of its readings ({r:.2}; the defaults read {dp:+.1}% from it), and the readings' own margin of error (Lenth's method: most options do little, so the spread around their median of the readings that met or missed the constraints as the defaults did is noise) is ±{e:.1}%: an option counts as having no effect when its move changed the objective and every latency limit by less than the larger of that and {:.1}%, and only while the defaults' own reading lies within that margin of the median (beyond it, most options may matter, or the defaults' run was off, and nothing is frozen). Every move ran in full, like the defaults",
            100.0 * f.freeze_below
        ),
        _ => format!(
            "Each change is against the defaults' reading (too few readings to estimate the noise from them): an option counts as having no effect when its move changed the objective and every latency limit by less than {:.1}%",
            100.0 * f.freeze_below
        ),
    };
    let intro = format!(
        "Before the search, each option was moved alone from the defaults, one trial each. {against}. Such an option, if it met or missed the constraints as the defaults did, was frozen at its default for the rest of the search: {}.",
        if frozen.is_empty() {
            "none was".to_owned()
        } else {
            frozen.join(", ")
        }
    );
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:+.1}%"));
    let rows = f
        .moved
        .iter()
        .map(|m| {
            [
                m.param.clone(),
                m.value.to_string(),
                pct(m.objective_pct),
                pct(m.latency_pct),
                format!(
                    "{}: {}",
                    if m.frozen {
                        "frozen at its default"
                    } else {
                        "searched"
                    },
                    m.why
                ),
            ]
        })
        .collect();
    Some((intro, rows))
}

/// The conclusion table's column for the leader: "recommended" only when the gate recommended
/// it.
fn leader_column(d: &ReportData) -> String {
    match (d.recommended_trial, d.leader_trial) {
        (Some(r), _) => format!("recommended #{r}"),
        (None, Some(l)) => format!("candidate #{l} (not recommended)"),
        (None, None) => "candidate".into(),
    }
}

/// A conclusion row's change, before any emphasis.
fn change_text(r: &Row) -> String {
    match (&r.diff, &r.note) {
        (_, Some(n)) => n.clone(),
        (Some(df), None) => pm(df),
        (None, None) => "-".into(),
    }
}

/// The gain test's level per look the gate used for `rec`: stored with its outcome, or, in an
/// outcome written before it was, `decide::alpha_per_look` of its file's re-measurement rounds.
fn level_of(rec: &StudyRecord) -> f64 {
    if let Some(level) = rec.outcome.as_ref().and_then(|o| o.level) {
        return level;
    }
    toml::from_str::<crate::tune::spec::StudySpec>(&rec.spec_text)
        .map(|s| crate::tune::decide::alpha_per_look(s.remeasure.repeats, s.remeasure.max_repeats))
        .unwrap_or(crate::tune::decide::ALPHA)
}

/// A re-measured candidate's value and note cells; `level`: the gain test's level per look.
fn comparison_cells(c: &Comparison, level: f64) -> (String, String) {
    let alone = c.diff.as_ref().is_some_and(|d| d.n_b == 0);
    let value = match &c.diff {
        Some(d) if alone => format!(
            "{:.2} [{:.2}, {:.2}] (defaults failed: no comparison)",
            d.mean_a, d.low, d.high
        ),
        Some(d) => pm(d),
        None => "-".into(),
    };
    let adj = c
        .p_adjusted
        .map(|p| {
            format!(" (Holm-adjusted one-sided p = {p:.4} against {level}, the level per look)")
        })
        .unwrap_or_default();
    let note = match (&c.disqualified, &c.diff) {
        (Some(why), _) => why.clone(),
        (None, Some(_)) if alone => "met the constraints in its pooled rounds".into(),
        (None, Some(_)) if c.significant => format!("significant{adj}"),
        _ => format!("not significant{adj}"),
    };
    (value, note)
}

fn primary_name(d: &ReportData) -> &str {
    d.workloads
        .first()
        .map(|w| w.0.as_str())
        .unwrap_or("primary")
}

/// The vLLM-style result blocks of the baseline and the recommended trial.
fn blocks(d: &ReportData) -> Vec<(&'static str, u32, String)> {
    [
        ("baseline", d.baseline_trial),
        ("recommended", d.recommended_trial),
    ]
    .into_iter()
    .filter_map(|(label, seq)| {
        let seq = seq?;
        Some((label, seq, block_of(d, seq)?))
    })
    .collect()
}

/// Runs other processes disturbed: run again (search), or set aside by the gate (rounds).
fn disturbed_lines(d: &ReportData) -> Vec<String> {
    let set_aside: &[u32] = d
        .study
        .outcome
        .as_ref()
        .map(|o| o.set_aside.as_slice())
        .unwrap_or(&[]);
    let mut disturbed = Vec::new();
    for t in &d.trials {
        // Without screening the screen is the full run: one line.
        let full = t.full.as_ref().filter(|f| Some(*f) != t.screen.as_ref());
        for m in [t.screen.as_ref(), full].into_iter().flatten() {
            if let Some(r) = &m.replaces {
                disturbed.push(format!("#{}: {r}", t.seq));
            }
        }
        if set_aside.contains(&t.seq) && t.status == TrialStatus::Failed {
            disturbed.push(format!(
                "#{}: set aside by the gate (it failed in a round in which the defaults failed too: the machine's failure, rerun)",
                t.seq
            ));
        } else if set_aside.contains(&t.seq) {
            let cores = t
                .full
                .as_ref()
                .and_then(|m| m.foreign_cores)
                .map(|f| format!("{f:.2}"))
                .unwrap_or_else(|| "?".into());
            disturbed.push(format!(
                "#{}: set aside by the gate (other processes kept {cores} cores busy)",
                t.seq
            ));
        }
    }
    disturbed
}

/// The JSON report: the data and the charts.
pub fn json(d: &ReportData) -> serde_json::Value {
    use serde_json::Value;
    let mut m = serde_json::Map::new();
    m.insert(
        "study".into(),
        serde_json::to_value(StudyV1::from(&d.study)).unwrap_or_default(),
    );
    if let Ok(Value::Object(rest)) = serde_json::to_value(d) {
        m.extend(rest);
    }
    let trials: Vec<TrialV1> = d.trials.iter().map(TrialV1::from).collect();
    m.insert(
        "trials".into(),
        serde_json::to_value(trials).unwrap_or_default(),
    );
    m.insert(
        "charts".into(),
        Value::Object(
            charts(d)
                .into_iter()
                .map(|(k, s)| (k, Value::String(s)))
                .collect(),
        ),
    );
    Value::Object(m)
}

/// A self-contained HTML page, generated from the data (`html.rs`).
pub fn html(d: &ReportData) -> String {
    html::page(d)
}

/// Whether the study is finished.
pub fn finished(d: &ReportData) -> bool {
    d.study.phase == Phase::Done
}

/// `servetune report`: the report in `format`; with `out`, written there (Markdown charts as
/// SVG files beside it) and the path returned in the message, else returned for stdout.
pub fn render(
    store: &Store,
    id: &str,
    format: &str,
    out: Option<&std::path::Path>,
) -> Result<String, ReportError> {
    let d = build(store, id)?;
    let write = |path: &std::path::Path, text: &str| {
        std::fs::write(path, text).map_err(|source| ReportError::Write {
            path: path.display().to_string(),
            source,
        })
    };
    let text = match format {
        "md" | "markdown" => {
            let mut files = Vec::new();
            if let Some(p) = out {
                let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("report");
                let dir = p.parent().unwrap_or(std::path::Path::new("."));
                for (name, svg) in charts(&d) {
                    let f = format!("{stem}-{name}.svg");
                    write(&dir.join(&f), &svg)?;
                    files.push((name, f));
                }
            }
            markdown(&d, &files)
        }
        "json" => serde_json::to_string_pretty(&json(&d)).unwrap_or_default() + "\n",
        "html" => html(&d),
        other => return Err(ReportError::Format(other.into())),
    };
    match out {
        Some(p) => {
            write(p, &text)?;
            Ok(format!("report written to {}\n", p.display()))
        }
        None => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::records::fixtures::named;
    use crate::tune::records::Outcome;

    /// An outcome as a finished study stores it, with the gate's level per look `level`.
    fn outcome(level: Option<f64>) -> Outcome {
        let mut o: Outcome = serde_json::from_value(serde_json::json!({
            "metric": "output_throughput", "baseline_trial": 0, "recommended": null,
            "recommended_command": null, "recommended_config": null, "comparisons": [],
            "verdict": "keep the defaults", "search_trials": 4, "screened_only": 0,
            "bench_s": 1.0, "saved_s": 0.0
        }))
        .unwrap();
        o.level = level;
        o
    }

    #[test]
    fn the_level_shown_is_the_one_the_gate_stored_else_the_files() {
        let mut rec = named("s", "s", 1.0, Phase::Done);
        rec.spec_text = "[study]\nname = \"s\"\n[remeasure]\nrepeats = 3\nmax_repeats = 3\n".into();
        let from_file = crate::tune::decide::alpha_per_look(3, 3);
        assert_eq!(level_of(&rec), from_file, "no outcome: the file's rounds");
        rec.outcome = Some(outcome(None));
        assert_eq!(
            level_of(&rec),
            from_file,
            "an outcome from before the level was stored"
        );
        rec.outcome = Some(outcome(Some(0.0123)));
        assert_eq!(
            level_of(&rec),
            0.0123,
            "the stored level, whatever the file says now"
        );
    }
}
