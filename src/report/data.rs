//! The report's data, collected from the store (`build`): the conclusion rows, every option
//! explored with its effect, and the engines.

use std::collections::BTreeMap;

use super::{param_names, show, EngineRow, OptionRow, ReportData, ReportError, Row};
use crate::space::Value;
use crate::store::Store;
use crate::tune::decide::CheckState;
use crate::tune::records::{Outcome, Records, StudyRecord, TrialKind, TrialRecord, TrialStatus};

/// What the report needs from the stored study file: the model and the workloads (primary
/// first). Parsed once, without the checks of `Study::parse` (which also
/// needs the dataset files, and a report must work after they are gone).
struct SpecView {
    model: String,
    workloads: Vec<(String, Vec<String>)>,
}

fn spec_view(text: &str) -> SpecView {
    match toml::from_str::<crate::tune::spec::StudySpec>(text) {
        Ok(s) => {
            let mut w: Vec<(String, Vec<String>)> = s
                .workloads
                .iter()
                .map(|w| (w.name.clone(), w.args.clone()))
                .collect();
            if let Some(i) = s.workloads.iter().position(|w| w.primary) {
                let p = w.remove(i);
                w.insert(0, p);
            }
            SpecView {
                model: s.study.model,
                workloads: w,
            }
        }
        Err(_) => SpecView {
            model: String::new(),
            workloads: Vec::new(),
        },
    }
}

/// Collects everything the report shows.
pub fn build(store: &Store, id: &str) -> Result<ReportData, ReportError> {
    let records = Records::new(store.clone());
    let rec: StudyRecord = records
        .study(id)?
        .ok_or_else(|| ReportError::NoStudy(id.into()))?;
    let trials = records.trials(id)?;
    if trials.is_empty() {
        return Err(ReportError::Empty(id.into()));
    }
    let SpecView { model, workloads } = spec_view(&rec.spec_text);
    let outcome = rec.outcome.clone();
    let search: Vec<&TrialRecord> = trials
        .iter()
        .filter(|t| t.kind == TrialKind::Search)
        .collect();
    let baseline_trial = outcome
        .as_ref()
        .map(|o| o.baseline_trial)
        .or(search.first().map(|t| t.seq));
    let recommended_trial = outcome.as_ref().and_then(|o| o.recommended);
    let leader_trial = outcome.as_ref().and_then(|o| o.recommended.or(o.leader));
    // Commands to serve with (port 8000), as a person would type them.
    let cmd_of = |seq: Option<u32>| {
        seq.and_then(|s| trials.iter().find(|t| t.seq == s))
            .and_then(|t| t.command.as_ref())
            .map(|c| c.serving().display())
    };
    // Conclusion rows: the gate's own checks of the leader against the defaults (the report
    // shows the decision; it never makes one).
    let rows = conclusion_rows(outcome.as_ref());
    // Every option explored: per parameter, per value (numeric: per distinct value, or four
    // ranges when there are many).
    let base_obj = baseline_trial
        .and_then(|b| trials.iter().find(|t| t.seq == b))
        .and_then(|t| t.objective);
    let options = option_rows(&search, base_obj);
    // Engines: defaults and best per engine.
    let engines = engine_rows(&search, &rec, baseline_trial);
    Ok(ReportData {
        model,
        workloads,
        baseline_trial,
        recommended_trial,
        leader_trial,
        recommended_command: outcome
            .as_ref()
            .and_then(|o| o.recommended_command.as_ref())
            .map(|c| c.display())
            .or_else(|| cmd_of(recommended_trial)),
        baseline_command: cmd_of(baseline_trial),
        rows,
        options,
        engines,
        trials,
        study: rec,
    })
}

/// The conclusion rows, one per check the gate made of the leader against the defaults; none
/// before the study has an outcome.
fn conclusion_rows(outcome: Option<&Outcome>) -> Vec<Row> {
    outcome
        .map(|o| {
            o.checks
                .iter()
                .map(|c| Row {
                    workload: c.workload.clone(),
                    metric: c.label.clone(),
                    higher_is_better: c.higher_is_better,
                    baseline: c.baseline.clone(),
                    recommended: c.candidate.clone(),
                    diff: c.diff.clone(),
                    regression: c.state == CheckState::Regression,
                    state: c.state,
                    gate: c.gate,
                    note: c.note.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The rows of every option explored: per parameter the search trials set, one row per value
/// (or range of values), its effect measured against the baseline's objective `base_obj`.
fn option_rows(search: &[&TrialRecord], base_obj: Option<f64>) -> Vec<OptionRow> {
    let names = param_names(search);
    let mut options = Vec::new();
    for name in &names {
        let with: Vec<(&Value, &TrialRecord)> = search
            .iter()
            .filter_map(|t| t.config.get(name).map(|v| (v, *t)))
            .collect();
        for (value, ts) in value_groups(&with) {
            if ts.is_empty() {
                continue;
            }
            options.push(option_row(name, value, &ts, base_obj));
        }
    }
    options
}

/// Groups the trials that set one parameter by its value: per distinct value, or four ranges
/// (by quartile) when a numeric parameter took more than six values.
fn value_groups<'t>(with: &[(&'t Value, &'t TrialRecord)]) -> Vec<(String, Vec<&'t TrialRecord>)> {
    let numeric = with
        .iter()
        .all(|(v, _)| matches!(v, Value::Int(_) | Value::Float(_)));
    let num = |v: &Value| match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => 0.0,
    };
    let mut distinct: Vec<String> = with.iter().map(|(v, _)| show(v)).collect();
    distinct.sort();
    distinct.dedup();
    if numeric && distinct.len() > 6 {
        let mut vals: Vec<f64> = with.iter().map(|(v, _)| num(v)).collect();
        vals.sort_by(f64::total_cmp);
        let q = |p: f64| vals[((vals.len() - 1) as f64 * p).round() as usize];
        let edges = [q(0.0), q(0.25), q(0.5), q(0.75), q(1.0)];
        (0..4)
            .map(|i| {
                let (lo, hi) = (edges[i], edges[i + 1]);
                let ts = with
                    .iter()
                    .filter(|(v, _)| {
                        let x = num(v);
                        x >= lo && (x < hi || (i == 3 && x <= hi))
                    })
                    .map(|(_, t)| *t)
                    .collect();
                (format!("{}–{}", fmt_num(lo), fmt_num(hi)), ts)
            })
            .collect()
    } else {
        distinct
            .iter()
            .map(|d| {
                (
                    d.clone(),
                    with.iter()
                        .filter(|(v, _)| &show(v) == d)
                        .map(|(_, t)| *t)
                        .collect(),
                )
            })
            .collect()
    }
}

/// One row of the options explored: how the trials `ts` with `value` of `param` fared, and
/// their best objective against the baseline's `base_obj`.
fn option_row(param: &str, value: String, ts: &[&TrialRecord], base_obj: Option<f64>) -> OptionRow {
    let best = ts
        .iter()
        .filter_map(|t| {
            t.objective
                .or(t.screen_objective)
                .filter(|_| t.status == TrialStatus::Ok)
        })
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
    OptionRow {
        param: param.to_owned(),
        value,
        trials: ts.len(),
        failed: ts
            .iter()
            .filter(|t| t.status == TrialStatus::Failed)
            .count(),
        infeasible: ts
            .iter()
            .filter(|t| t.status == TrialStatus::Infeasible)
            .count(),
        effect_pct: match (best, base_obj) {
            (Some(b), Some(base)) if base != 0.0 => Some(100.0 * (b / base - 1.0)),
            _ => None,
        },
        best,
    }
}

/// The engine rows: per engine the search tried, its version, its defaults' objective, the
/// best objective found and how many trials ran on it.
fn engine_rows(
    search: &[&TrialRecord],
    rec: &StudyRecord,
    baseline_trial: Option<u32>,
) -> Vec<EngineRow> {
    let mut engines: BTreeMap<String, EngineRow> = BTreeMap::new();
    for t in search {
        let e = t.engine.clone().unwrap_or_else(|| "?".into());
        let row = engines.entry(e.clone()).or_insert(EngineRow {
            engine: e.clone(),
            version: rec.engine_versions.get(&e).cloned().flatten(),
            defaults: None,
            best: None,
            trials: 0,
        });
        row.trials += 1;
        if t.defaults || Some(t.seq) == baseline_trial {
            row.defaults = t.objective;
        }
        if let Some(v) = t.objective {
            row.best = Some(row.best.map_or(v, |b: f64| b.max(v)));
        }
    }
    engines.into_values().collect()
}

fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:.3}")
    }
}
