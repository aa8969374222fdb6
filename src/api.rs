//! The JSON servetune shows the outside world, version 1: every answer of the daemon's `/v1`
//! routes (the status, the list of studies, a study, its trials, a queue entry, the best
//! configurations), `report --format json`, and the CLI's `--json`. These types are the
//! contract, and they are defined here only; the store's records
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
    /// The devices its engine was pinned to, in a parallel study.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<SlotV1>,
}

/// A parallel trial's slot: GPU indices as NVML numbers them, core numbers (either may be
/// empty).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotV1 {
    pub gpus: Vec<u32>,
    pub cores: Vec<usize>,
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
            slot: t.slot.as_ref().map(|p| SlotV1 {
                gpus: p.gpus.clone(),
                cores: p.cores.clone(),
            }),
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

/// A queued study run, as `POST /v1/studies` and the control routes answer (the daemon's
/// queue entry, converted by the daemon; its file's text is not repeated: `GET
/// /v1/studies/{id}` has the record, so `spec_text` is always empty).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobV1 {
    pub seq: u64,
    /// The study's id in the store: `<name>-<UTC time>`.
    pub study: String,
    /// The study file's `study.name`.
    pub name: String,
    pub spec_text: String,
    /// The path the study file's relative paths are read from.
    pub spec_path: String,
    /// `initial`, `nightly`, `engine upgrade: …`, `submitted`.
    pub trigger: String,
    pub state: JobStateV1,
    /// Whether it starts from the previous study's best configurations.
    pub warm: bool,
    /// Unix seconds.
    pub submitted: f64,
    pub started: Option<f64>,
    pub ended: Option<f64>,
    pub error: Option<String>,
}

/// A queued study run's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStateV1 {
    Queued,
    Running,
    Paused,
    Cancelled,
    Done,
    Failed,
}

impl JobStateV1 {
    /// The state's word, as the CLI and the status page show it (the JSON's value).
    pub fn label(self) -> &'static str {
        match self {
            JobStateV1::Queued => "queued",
            JobStateV1::Running => "running",
            JobStateV1::Paused => "paused",
            JobStateV1::Cancelled => "cancelled",
            JobStateV1::Done => "done",
            JobStateV1::Failed => "failed",
        }
    }
}

// ---- the daemon's answers (`/v1/status`, `/v1/studies`, `/v1/studies/{id}`, `/v1/best`) ----

/// The trial running now, as the status shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialNowV1 {
    pub seq: u32,
    pub kind: String,
    pub note: String,
    pub command: Option<String>,
    pub running_s: f64,
    pub attempts: u32,
    /// The devices its engine is pinned to, in a parallel study (`gpu 2,3`, `cores 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
}

/// The best trial of the running study so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BestNowV1 {
    pub trial: u32,
    pub objective: f64,
    pub metric: String,
    /// The trial's command as one to serve with (port 8000).
    pub command: Option<String>,
}

/// The study being tuned now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CurrentV1 {
    pub study: String,
    pub trigger: String,
    /// `running`, or `pausing`/`cancelling`/`stopping` while the engine is torn down.
    pub state: String,
    /// search, remeasure, validate.
    pub phase: Option<Phase>,
    pub search_trials_done: usize,
    pub search_budget: u32,
    pub measurements_done: usize,
    /// The latest running trial (of `running`).
    pub trial: Option<TrialNowV1>,
    /// Every running trial, in the order proposed: several in a parallel study.
    #[serde(default)]
    pub running: Vec<TrialNowV1>,
    pub best: Option<BestNowV1>,
    /// An estimate of the time the study still needs, and how it was made.
    pub time_left_s: Option<f64>,
    pub time_left_basis: String,
    pub events: Vec<String>,
}

/// A waiting or paused study in the queue, as the status lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueItemV1 {
    pub study: String,
    pub state: JobStateV1,
    pub trigger: String,
    pub submitted: String,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusV1 {
    pub version: String,
    pub node: String,
    /// What the daemon is doing: idle, tuning, stopping (`phase` in the JSON, as since v1; a
    /// study's own phase is `CurrentV1::phase`).
    #[serde(rename = "phase")]
    pub activity: String,
    pub uptime_s: f64,
    pub current: Option<CurrentV1>,
    /// Queued and paused studies, in the order they would run.
    pub queue: Vec<QueueItemV1>,
    pub schedule: String,
    /// The IANA zone the schedule is read in (absent from a daemon before zones: UTC).
    #[serde(default = "utc")]
    pub schedule_tz: String,
    /// RFC 3339, UTC.
    pub next_nightly: Option<String>,
    pub next_probe: Option<String>,
}

fn utc() -> String {
    "UTC".to_owned()
}

/// One study, as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListedStudyV1 {
    pub id: String,
    pub name: Option<String>,
    /// The queue state, or `manual` for a study run by `servetune tune`.
    pub state: String,
    pub trigger: String,
    pub submitted: Option<String>,
    pub started: Option<String>,
    pub ended: Option<String>,
    pub phase: Option<Phase>,
    pub trials: usize,
    pub search_trials: usize,
    pub metric: Option<String>,
    pub best_objective: Option<f64>,
    pub verdict: Option<String>,
    pub recommended_command: Option<String>,
    pub error: Option<String>,
}

/// `GET /v1/studies/{id}`: the study as listed, its queue entry (a daemon run) and its record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StudyDetailV1 {
    pub view: ListedStudyV1,
    pub job: Option<JobV1>,
    pub study: Option<StudyV1>,
}

/// `GET /v1/best`: the command to run on this node (its best record's), and every best record
/// for the model asked (all models without one), this node's first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BestAnswerV1 {
    pub node: String,
    pub model: Option<String>,
    pub command: Option<String>,
    pub best: Vec<BestV1>,
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
