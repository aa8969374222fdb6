//! `servetune tune STUDY.toml`, `servetune trials [STUDY]`, `servetune best [--model M]`: the
//! foreground study and the views of the store, as text or `--json` (the `api` v1 shapes).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::api::{BestV1, StudyV1, TrialV1};
use crate::store::Store;
use crate::telemetry::Telemetry;
use crate::tune::records::{BestRecord, Records, StudyRecord, TrialRecord, TrialStatus};
use crate::tune::spec::Study;
use crate::tune::TuneError;
use crate::util::say;

/// The state directory: `--state`, else `$SERVETUNE_STATE`, else `./state`.
pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("SERVETUNE_STATE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("state"))
}

/// The store of a state directory, to write.
pub fn open_store(state: &Path) -> Result<Store, TuneError> {
    Ok(Store::open_state(state)?)
}

/// The store to read (`trials`, `best`, `report`): a read-only view of its mirror while a
/// running `tune` or the daemon holds it.
pub fn open_store_for_reading(state: &Path) -> Result<Store, TuneError> {
    Ok(Store::open_state_for_reading(state)?)
}

/// Removes a study and its trials (for `--restart`).
pub fn discard(store: &Store, id: &str) -> Result<usize, TuneError> {
    Ok(Records::new(store.clone()).remove_study(id)?)
}

/// Runs a study in the foreground, printing a line per trial; resumes it if it was stopped.
pub async fn tune(
    file: &Path,
    state: &Path,
    restart: bool,
    json: bool,
) -> Result<StudyRecord, TuneError> {
    let study = Study::load(file)?;
    let store = open_store(state)?;
    if restart {
        let n = discard(&store, study.id())?;
        if n > 0 {
            say(&format!("discarded {n} trials of study {:?}", study.id()));
        }
    }
    let telemetry = Telemetry::detect();
    let mut runner =
        crate::tune::engine_runner(study, store, state.join("trials"), telemetry).await?;
    // Progress and the stop notice never panic on a closed stderr (a pipe whose reader has
    // gone, as when the pipeline it ran in was killed): `eprintln!` would, and a panic in the
    // signal watcher before it set the flag left the study, and its engine, running.
    runner.progress = std::sync::Arc::new(|s: &str| say(s));
    let cancel = runner.cancel.clone();
    let watcher = tokio::spawn(async move {
        crate::signals::terminated().await;
        cancel.cancel();
        say("stopping: tearing the engine down; run the same command again to resume");
    });
    let result = runner.run().await;
    watcher.abort();
    let rec = result?;
    if json {
        let shown = StudyV1::from(&rec);
        println!(
            "{}",
            serde_json::to_string_pretty(&shown).unwrap_or_default()
        );
    } else {
        print!("{}", summary(&rec));
    }
    Ok(rec)
}

/// The end-of-study summary.
pub fn summary(rec: &StudyRecord) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "study {}: {}",
        rec.id,
        rec.stop_reason.as_deref().unwrap_or("")
    );
    if let Some(o) = &rec.outcome {
        let _ = writeln!(s, "objective: {}", o.metric);
        let _ = writeln!(s, "verdict: {}", o.verdict);
        if let Some(c) = &o.recommended_command {
            let _ = writeln!(s, "recommended: {}", c.display());
        }
        for c in o.checks.iter().filter(|c| c.gate) {
            let state = c.state.label();
            match (&c.diff, &c.note) {
                (_, Some(n)) => {
                    let _ = writeln!(s, "check {} {}: {n}  {state}", c.workload, c.label);
                }
                (Some(d), None) => {
                    let _ = writeln!(
                        s,
                        "check {} {}: {:+.1}% (95% CI {:+.1}% to {:+.1}%)  {state}",
                        c.workload, c.label, d.pct, d.pct_low, d.pct_high
                    );
                }
                (None, None) => {
                    let _ = writeln!(s, "check {} {}: not measured  {state}", c.workload, c.label);
                }
            }
        }
        let _ = writeln!(
            s,
            "rounds: {} re-measurement, {} validation ({})",
            o.rounds.remeasure, o.rounds.validation, o.rounds.why
        );
        let _ = writeln!(
            s,
            "{} search trials ({} screened only); benchmark time {:.0} s, {:.0} s saved by screening",
            o.search_trials, o.screened_only, o.bench_s, o.saved_s
        );
    }
    s
}

/// The trials table.
pub fn trials_table(ts: &[TrialRecord]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>4}  {:<16} {:<10} {:>12} {:>12}  details",
        "seq", "kind", "status", "objective", "screen"
    );
    for t in ts {
        let f = |x: Option<f64>| x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
        let status = format!("{:?}", t.status).to_lowercase();
        let details = match t.status {
            TrialStatus::Failed => t
                .failure
                .as_ref()
                .map(|f| format!("{}: {}", f.class, crate::util::excerpt(&f.evidence, 80)))
                .unwrap_or_default(),
            TrialStatus::Infeasible => t.early_stop.clone().unwrap_or_default(),
            _ => t
                .command
                .as_ref()
                .map_or_else(|| t.note.clone(), |c| c.display()),
        };
        let _ = writeln!(
            s,
            "{:>4}  {:<16} {:<10} {:>12} {:>12}  {details}",
            t.seq,
            t.kind.label(),
            status,
            f(t.objective),
            f(t.screen_objective)
        );
    }
    s
}

pub fn trials_cmd(state: &Path, study: Option<&str>, json: bool) -> Result<String, TuneError> {
    let records = Records::new(open_store_for_reading(state)?);
    let ids: Vec<String> = match study {
        Some(id) => {
            if records.study(id)?.is_none() {
                return Err(TuneError::NoStudy(id.into()));
            }
            vec![id.to_owned()]
        }
        None => records.studies()?.into_iter().map(|r| r.id).collect(),
    };
    let mut all = Vec::new();
    for id in &ids {
        all.extend(records.trials(id)?);
    }
    if json {
        let shown: Vec<TrialV1> = all.iter().map(TrialV1::from).collect();
        return Ok(serde_json::to_string_pretty(&shown).unwrap_or_default() + "\n");
    }
    let mut s = String::new();
    for id in &ids {
        let ts: Vec<TrialRecord> = all.iter().filter(|t| &t.study == id).cloned().collect();
        let _ = writeln!(s, "study {id}: {} trials", ts.len());
        s.push_str(&trials_table(&ts));
    }
    Ok(s)
}

pub fn best_cmd(state: &Path, model: Option<&str>, json: bool) -> Result<String, TuneError> {
    let best: Vec<BestRecord> = Records::new(open_store_for_reading(state)?).best_for(model)?;
    if json {
        let shown: Vec<BestV1> = best.iter().map(BestV1::from).collect();
        return Ok(serde_json::to_string_pretty(&shown).unwrap_or_default() + "\n");
    }
    let mut s = String::new();
    if best.is_empty() {
        s.push_str("no finished study has recorded a best configuration yet\n");
    }
    for b in best {
        let _ = writeln!(
            s,
            "{} on {} ({} {}), workload {}: {} = {} [study {}, trial #{}{}]\n  {}",
            b.model,
            b.hardware,
            b.engine,
            b.engine_version.as_deref().unwrap_or("?"),
            b.workload,
            b.metric,
            b.objective
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into()),
            b.study,
            b.trial,
            if b.improved {
                ""
            } else {
                ", the defaults: nothing beat them significantly"
            },
            b.command.as_ref().map(|c| c.display()).unwrap_or_default()
        );
    }
    Ok(s)
}

/// `servetune run-trial SPEC.json`: runs one search trial from its self-contained spec
/// (`tune::study::TrialSpec`) on this machine, its engine pinned to the spec's slot, and
/// returns its record (the command prints it as JSON). The spec's space files are written to
/// a directory of `state`, which also holds the engine's record for the reaper and the
/// trial's log.
pub async fn run_trial(
    spec_path: &Path,
    state: &Path,
) -> Result<crate::tune::records::TrialRecord, TuneError> {
    use crate::tune::study::TrialSpec;
    let text = std::fs::read_to_string(spec_path).map_err(|source| TuneError::Io {
        path: spec_path.display().to_string(),
        source,
    })?;
    let spec: TrialSpec = serde_json::from_str(&text)
        .map_err(|e| TuneError::Spec(format!("{}: {e}", spec_path.display())))?;
    let spaces = state.join("spaces");
    for (name, body) in &spec.spaces {
        // File names only: a spec never writes outside its directory.
        if name.contains('/') || name.starts_with('.') || !name.ends_with(".toml") {
            return Err(TuneError::Spec(format!(
                "{}: spaces: {name:?} is not a space file name",
                spec_path.display()
            )));
        }
        let p = spaces.join(name);
        std::fs::create_dir_all(&spaces)
            .and_then(|()| std::fs::write(&p, body))
            .map_err(|source| TuneError::Io {
                path: p.display().to_string(),
                source,
            })?;
    }
    let mut study = Study::parse_with_spaces(&spec.study_file, spec_path, &spaces)?;
    study.run_id = Some(spec.trial.study.clone());
    let store = open_store(state)?;
    let mut runner =
        crate::tune::engine_runner(study, store, state.join("trials"), Telemetry::detect()).await?;
    runner.progress = std::sync::Arc::new(|s: &str| say(s));
    let cancel = runner.cancel.clone();
    let watcher = tokio::spawn(async move {
        crate::signals::terminated().await;
        cancel.cancel();
    });
    let r = runner.execute(&spec).await;
    watcher.abort();
    r
}
