//! The JSON servetune shows the outside world, version 1: the daemon's `/v1` answers, `report
//! --format json`, and the CLI's `--json`. These types are the contract; the store's records
//! (`tune::study`) are built from them by nothing and may change shape with the store's schema
//! version, because each answer is converted here, field by field. A schema change is then
//! a change to a `From` below, not an API break: v1 only ever gains fields.
//!
//! The first such change: schema 2 stores a trial's command as its environment and argv
//! (`space::CommandLine`); v1 still shows it as the one shell-quoted string it always was.
//! Leaf types whose shape is the same in both (a `Measurement`, a `Check`, a `Config`) are
//! embedded as they are; a snapshot test of each answer fails if one of them changes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::space::{CommandLine, Config};
use crate::telemetry::TelemetrySummary;
use crate::tune::decide::{Check, Comparison};
use crate::tune::eval::{Measurement, TrialFailure};
use crate::tune::records::{
    BestRecord, Importance, Outcome, Phase, Rounds, StudyRecord, TrialKind, TrialRecord,
    TrialStatus, WarmStart,
};
use crate::tune::significance::Diff;

fn shown(c: &Option<CommandLine>) -> Option<String> {
    c.as_ref().map(CommandLine::display)
}

/// A study: its file, phase, engines and, once finished, the decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyV1 {
    pub id: String,
    pub spec_text: String,
    pub created: f64,
    pub updated: f64,
    pub phase: Phase,
    pub stop_reason: Option<String>,
    pub trigger: String,
    pub hardware: String,
    pub engine_versions: BTreeMap<String, Option<String>>,
    pub dropped_flags: Vec<String>,
    pub best_trial: Option<u32>,
    pub best_objective: Option<f64>,
    pub outcome: Option<OutcomeV1>,
    pub warm_start: Vec<WarmStart>,
    /// The space's log-scaled parameters.
    pub log_params: Vec<String>,
    /// Which knobs mattered in the search.
    #[serde(default)]
    pub importance: Option<Importance>,
    /// What the importance phase found and froze (None without the phase).
    #[serde(default)]
    pub one_at_a_time: Option<crate::tune::opt::oat::Findings>,
}

/// The decision: what to run (or keep the defaults), and the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutcomeV1 {
    pub metric: String,
    pub baseline_trial: u32,
    pub recommended: Option<u32>,
    /// The recommended command, to serve with (port 8000), shell-quoted.
    pub recommended_command: Option<String>,
    pub recommended_config: Option<Config>,
    pub comparisons: Vec<ComparisonV1>,
    pub verdict: String,
    pub leader: Option<u32>,
    pub checks: Vec<Check>,
    pub baseline_infeasible: Option<String>,
    pub rounds: Rounds,
    pub set_aside: Vec<u32>,
    pub search_trials: u32,
    pub screened_only: u32,
    pub bench_s: f64,
    pub saved_s: f64,
}

/// One candidate against the defaults on the primary workload's objective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonV1 {
    pub candidate: u32,
    /// The candidate's command as launched, shell-quoted.
    pub command: Option<String>,
    pub diff: Option<Diff>,
    pub p_adjusted: Option<f64>,
    pub significant: bool,
    pub disqualified: Option<String>,
}

/// One trial: a configuration started, measured (or failed) and stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialV1 {
    pub study: String,
    pub seq: u32,
    #[serde(flatten)]
    pub kind: TrialKind,
    pub config: Config,
    /// Whether the configuration is an engine's defaults.
    pub defaults: bool,
    pub note: String,
    pub expected_improvement: Option<f64>,
    pub status: TrialStatus,
    pub engine: Option<String>,
    /// The engine's command line as launched, shell-quoted.
    pub command: Option<String>,
    pub engine_version: Option<String>,
    pub hardware: String,
    pub screen: Option<Measurement>,
    pub full: Option<Measurement>,
    pub screen_objective: Option<f64>,
    pub objective: Option<f64>,
    pub promoted: bool,
    pub failure: Option<TrialFailure>,
    pub early_stop: Option<String>,
    pub telemetry: Option<TelemetrySummary>,
    pub started: f64,
    pub ended: Option<f64>,
    pub bench_s: f64,
    pub saved_s: f64,
    pub attempts: u32,
    pub stopped: u32,
    pub startup_s: Option<f64>,
    /// The failure of a first attempt after which the trial ran once more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retried_after: Option<TrialFailure>,
}

/// The best known configuration for a model, hardware, engine version and workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestV1 {
    pub key: String,
    pub model: String,
    pub hardware: String,
    pub engine: String,
    pub engine_version: Option<String>,
    pub workload: String,
    pub study: String,
    pub trial: u32,
    pub config: Config,
    /// The command to serve with (port 8000), shell-quoted.
    pub command: Option<String>,
    pub objective: Option<f64>,
    pub metric: String,
    pub improved: bool,
    pub at: f64,
}

impl From<&StudyRecord> for StudyV1 {
    fn from(r: &StudyRecord) -> Self {
        StudyV1 {
            id: r.id.clone(),
            spec_text: r.spec_text.clone(),
            created: r.created,
            updated: r.updated,
            phase: r.phase,
            stop_reason: r.stop_reason.clone(),
            trigger: r.trigger.clone(),
            hardware: r.hardware.clone(),
            engine_versions: r.engine_versions.clone(),
            dropped_flags: r.dropped_flags.clone(),
            best_trial: r.best_trial,
            best_objective: r.best_objective,
            outcome: r.outcome.as_ref().map(OutcomeV1::from),
            warm_start: r.warm_start.clone(),
            log_params: r.log_params.clone(),
            importance: r.importance.clone(),
            one_at_a_time: r.one_at_a_time.clone(),
        }
    }
}

impl From<&Outcome> for OutcomeV1 {
    fn from(o: &Outcome) -> Self {
        OutcomeV1 {
            metric: o.metric.clone(),
            baseline_trial: o.baseline_trial,
            recommended: o.recommended,
            recommended_command: shown(&o.recommended_command),
            recommended_config: o.recommended_config.clone(),
            comparisons: o.comparisons.iter().map(ComparisonV1::from).collect(),
            verdict: o.verdict.clone(),
            leader: o.leader,
            checks: o.checks.clone(),
            baseline_infeasible: o.baseline_infeasible.clone(),
            rounds: o.rounds.clone(),
            set_aside: o.set_aside.clone(),
            search_trials: o.search_trials,
            screened_only: o.screened_only,
            bench_s: o.bench_s,
            saved_s: o.saved_s,
        }
    }
}

impl From<&Comparison> for ComparisonV1 {
    fn from(c: &Comparison) -> Self {
        ComparisonV1 {
            candidate: c.candidate,
            command: shown(&c.command),
            diff: c.diff.clone(),
            p_adjusted: c.p_adjusted,
            significant: c.significant,
            disqualified: c.disqualified.clone(),
        }
    }
}

impl From<&TrialRecord> for TrialV1 {
    fn from(t: &TrialRecord) -> Self {
        TrialV1 {
            study: t.study.clone(),
            seq: t.seq,
            kind: t.kind.clone(),
            config: t.config.clone(),
            defaults: t.defaults,
            note: t.note.clone(),
            expected_improvement: t.expected_improvement,
            status: t.status,
            engine: t.engine.clone(),
            command: shown(&t.command),
            engine_version: t.engine_version.clone(),
            hardware: t.hardware.clone(),
            screen: t.screen.clone(),
            full: t.full.clone(),
            screen_objective: t.screen_objective,
            objective: t.objective,
            promoted: t.promoted,
            failure: t.failure.clone(),
            early_stop: t.early_stop.clone(),
            telemetry: t.telemetry.clone(),
            started: t.started,
            ended: t.ended,
            bench_s: t.bench_s,
            saved_s: t.saved_s,
            attempts: t.attempts,
            stopped: t.stopped,
            startup_s: t.startup_s,
            retried_after: t.retried_after.clone(),
        }
    }
}

impl From<&BestRecord> for BestV1 {
    fn from(b: &BestRecord) -> Self {
        BestV1 {
            key: b.key.clone(),
            model: b.model.clone(),
            hardware: b.hardware.clone(),
            engine: b.engine.clone(),
            engine_version: b.engine_version.clone(),
            workload: b.workload.clone(),
            study: b.study.clone(),
            trial: b.trial,
            config: b.config.clone(),
            command: shown(&b.command),
            objective: b.objective,
            metric: b.metric.clone(),
            improved: b.improved,
            at: b.at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The v1 shape of a trial's command is the shell-quoted string whatever the store holds.
    #[test]
    fn a_trial_shows_its_command_as_one_string() {
        let t: TrialRecord = serde_json::from_value(serde_json::json!({
            "study": "s", "seq": 3, "kind": "search", "config": {}, "note": "",
            "expected_improvement": null, "status": "ok", "engine": "vllm",
            "command": {"env": [["VLLM_CPU_KVCACHE_SPACE", "4"]], "argv": ["vllm", "serve", "/m x"]},
            "engine_version": null, "hardware": "h", "screen": null, "full": null,
            "screen_objective": null, "objective": null, "promoted": false, "failure": null,
            "early_stop": null, "telemetry": null, "started": 1.0, "ended": null,
            "bench_s": 0.0, "saved_s": 0.0, "attempts": 1
        }))
        .unwrap();
        let v = serde_json::to_value(TrialV1::from(&t)).unwrap();
        assert_eq!(v["command"], "VLLM_CPU_KVCACHE_SPACE=4 vllm serve '/m x'");
        assert_eq!(v["kind"], "search");
        // Every field of the record is in the answer (v1 drops nothing the record has).
        let rec = serde_json::to_value(&t).unwrap();
        let missing: Vec<&String> = rec
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| v.get(k.as_str()).is_none())
            .collect();
        assert!(missing.is_empty(), "{missing:?}");
    }
}
