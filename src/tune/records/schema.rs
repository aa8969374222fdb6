//! The stored record types of the tuner, in one place: a study (`StudyRecord`), a trial
//! (`TrialRecord`, with its kind and status), a study's outcome and the gate's comparisons and
//! checks in it, the best known configuration (`BestRecord`) and a study's summary. The
//! measurement a trial stores is `eval::Measurement` (the evaluator's result, stored as it
//! is), an interval `significance::Diff`, a command `space::CommandLine`.
//!
//! Versioned by the store (`store::SCHEMA_VERSION`): a field added later is `#[serde(default)]`
//! (or read from the older form, as `CommandLine` reads version 1's string), so that records
//! written by an older servetune still load; the tests below hold one of each from version 1.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::space::{CommandLine, Config};
use crate::telemetry::TelemetrySummary;
use crate::tune::eval::{Measurement, TrialFailure};
use crate::tune::significance::Diff;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Search,
    Remeasure,
    Validate,
    Done,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyRecord {
    pub id: String,
    pub spec_text: String,
    /// The file's `[study] name`, which the study's runs share, and its objective metric
    /// (`ObjectiveMetric::key`), stored when the study is created. Records written before they
    /// were stored read `None`, and `heading` reads the file.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub metric: Option<String>,
    pub created: f64,
    pub updated: f64,
    pub phase: Phase,
    /// Why the search stopped.
    pub stop_reason: Option<String>,
    /// What started the study (`manual`, `nightly`, `engine upgrade: …`).
    pub trigger: String,
    pub hardware: String,
    pub engine_versions: BTreeMap<String, Option<String>>,
    /// Flags of the space files the installed engines lack (dropped, with a warning).
    pub dropped_flags: Vec<String>,
    pub best_trial: Option<u32>,
    pub best_objective: Option<f64>,
    pub outcome: Option<Outcome>,
    /// Configurations measured first after the baselines (a re-tune's warm start).
    #[serde(default)]
    pub warm_start: Vec<WarmStart>,
    /// The space's log-scaled parameters (the report draws their effect on a log axis).
    #[serde(default)]
    pub log_params: Vec<String>,
    /// Which knobs mattered in the search (set when it ends).
    #[serde(default)]
    pub importance: Option<Importance>,
    /// What the importance phase found (set when its last move has been measured; None
    /// without the phase).
    #[serde(default)]
    pub one_at_a_time: Option<crate::tune::opt::oat::Findings>,
    /// The model's weights against the machine's memory when the study was created (the
    /// priors' `if` read it): a resume uses it, not a new reading, so that its priors, and
    /// with them its proposals, are those of its records.
    #[serde(default)]
    pub footprint: Option<crate::tune::spec::Footprint>,
    /// A parallel study's interference check (set before its search; None for a study that
    /// runs one trial at a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interference: Option<Interference>,
}

/// A parallel study's interference check: the engine's defaults run alone in the first slot,
/// then in every slot at once; the slowdown is the mean of the slots' readings against the
/// reading alone. Beyond the study's `max_interference` the slots are halved and checked
/// again, down to one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interference {
    /// The objective of the defaults alone, in the first slot.
    pub alone: f64,
    /// Each check, in the order run.
    pub checks: Vec<InterferenceCheck>,
    /// The study's `max_interference`.
    pub threshold: f64,
    /// The slots the search uses.
    pub kept: usize,
    /// Why that many, in a sentence.
    pub why: String,
}

/// One round of the defaults in `placements.len()` slots at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterferenceCheck {
    pub placements: Vec<crate::engine::slots::Placement>,
    /// Each slot's objective (None: that run failed).
    pub readings: Vec<Option<f64>>,
    /// 1 - mean(readings) / alone (None: a run failed).
    pub slowdown: Option<f64>,
}

/// Which knobs mattered, estimated when the search ends: the GP's predicted spread of the
/// objective as each parameter alone sweeps its range around the best trial
/// (`opt::effects`), against the run-to-run noise it fitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Importance {
    /// Largest first.
    pub effects: Vec<crate::tune::opt::Effect>,
    /// The noise the model fitted, % of the objective.
    pub noise_pct: f64,
    /// Search trials it was estimated from.
    pub trials: usize,
}

/// A configuration a re-tune measures first: an earlier study's best or top trial, carried
/// over to the space of the engine version installed now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmStart {
    pub config: Config,
    /// Where it comes from (`study llama-20261201-030000 #7, recommended`).
    pub from: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TrialKind {
    Search,
    /// Round `round` of the interleaved re-measurement of search trial `candidate`.
    Remeasure {
        round: u32,
        candidate: u32,
    },
    /// Search trial `candidate` on validation workload `workload`, round `round`.
    Validate {
        workload: String,
        round: u32,
        candidate: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialStatus {
    /// Started and not finished: after a restart it runs again.
    Running,
    Ok,
    /// Ran, but missed a constraint.
    Infeasible,
    /// The engine failed (start-up, crash, hang).
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    pub study: String,
    pub seq: u32,
    #[serde(flatten)]
    pub kind: TrialKind,
    pub config: Config,
    /// Whether the configuration is an engine's defaults (the reference the gate compares
    /// with), set when the trial is created. Records written before it existed read `false`;
    /// the study's outcome names its reference (`Outcome::baseline_trial`).
    #[serde(default)]
    pub defaults: bool,
    pub note: String,
    pub expected_improvement: Option<f64>,
    pub status: TrialStatus,
    pub engine: Option<String>,
    pub command: Option<CommandLine>,
    pub engine_version: Option<String>,
    pub hardware: String,
    /// The short (screening) run; equals the full run when screening is off.
    pub screen: Option<Measurement>,
    pub full: Option<Measurement>,
    pub screen_objective: Option<f64>,
    /// The objective of the full-length run, when it had one and met the constraints.
    pub objective: Option<f64>,
    pub promoted: bool,
    pub failure: Option<TrialFailure>,
    /// Why the trial stopped early or missed the constraints.
    pub early_stop: Option<String>,
    pub telemetry: Option<TelemetrySummary>,
    pub started: f64,
    pub ended: Option<f64>,
    /// Seconds of benchmark runs, and the seconds screening saved (the full run it skipped).
    pub bench_s: f64,
    pub saved_s: f64,
    /// How many times it was started (more than 1 after an interruption).
    pub attempts: u32,
    /// Of those, how many servetune ended itself without a result (an operator's pause,
    /// cancel or stop; an infrastructure error): the others ended with servetune killed.
    #[serde(default)]
    pub stopped: u32,
    /// Seconds from spawning the engine to its first answered request.
    #[serde(default)]
    pub startup_s: Option<f64>,
    /// The failure of a first attempt whose engine failed without refusing the configuration
    /// (a crash, a hang, a start-up timeout: possibly the machine's), after which the trial
    /// ran once more; `failure` is the second attempt's, if it failed too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_after: Option<TrialFailure>,
    /// The devices the trial's engine was pinned to, in a parallel study.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<crate::engine::slots::Placement>,
}

impl TrialRecord {
    /// Back to `running` with no result: no run, objective or early stop, not promoted, not
    /// ended (a trial that runs again: after servetune's own failure, or once more after a
    /// failure that may be the machine's).
    pub fn reopen(&mut self) {
        self.status = TrialStatus::Running;
        self.ended = None;
        self.screen = None;
        self.full = None;
        self.screen_objective = None;
        self.objective = None;
        self.early_stop = None;
        self.promoted = false;
    }
}

/// How many interleaved rounds the decision took, and why they stopped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rounds {
    pub remeasure: u32,
    pub validation: u32,
    pub why: String,
}

impl TrialKind {
    /// How a trial's kind is shown, in every view (the trials table, the report, the status
    /// page and API): `search`, `re-measure #3 r2` (round 2 of candidate #3 against the
    /// defaults), `validate #3 on chat r1`.
    pub fn label(&self) -> String {
        match self {
            TrialKind::Search => "search".into(),
            TrialKind::Remeasure { round, candidate } => {
                format!("re-measure #{candidate} r{}", round + 1)
            }
            TrialKind::Validate {
                workload,
                round,
                candidate,
            } => format!("validate #{candidate} on {workload} r{}", round + 1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub metric: String,
    pub baseline_trial: u32,
    /// The configuration to run, when the gate (`decide`) recommends one.
    pub recommended: Option<u32>,
    /// The recommended trial's command, to serve with (port 8000).
    pub recommended_command: Option<CommandLine>,
    pub recommended_config: Option<Config>,
    pub comparisons: Vec<Comparison>,
    pub verdict: String,
    /// The candidate the checks are about (recommended, or the one that came closest).
    #[serde(default)]
    pub leader: Option<u32>,
    /// The leader against the defaults on every workload, as the gate judged it.
    #[serde(default)]
    pub checks: Vec<Check>,
    /// Why the defaults miss the constraints in their pooled rounds, if they do.
    #[serde(default)]
    pub baseline_infeasible: Option<String>,
    #[serde(default)]
    pub rounds: Rounds,
    /// Rounds (trial numbers) the gate set aside: other processes disturbed them, or the run
    /// failed in a round in which the defaults failed too.
    #[serde(default)]
    pub set_aside: Vec<u32>,
    pub search_trials: u32,
    pub screened_only: u32,
    pub bench_s: f64,
    pub saved_s: f64,
    /// The gain test's level per look the gate used (`decide::alpha_per_look`); `None` in
    /// outcomes written before it was stored (the report then reads the study's file).
    #[serde(default)]
    pub level: Option<f64>,
}

/// Whether a best record's model is the one asked for: the same, a suffix of it, or a part
/// of its file name (`SmolLM2` for `/models/SmolLM2-135M-Instruct.Q4_1.gguf`).
pub fn model_matches(model: &str, asked: &str) -> bool {
    model == asked
        || model.ends_with(asked)
        || std::path::Path::new(model)
            .file_name()
            .is_some_and(|f| f.to_string_lossy().contains(asked))
}

/// The best known configuration for (model, hardware, engine version, workload).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestRecord {
    pub key: String,
    pub model: String,
    pub hardware: String,
    pub engine: String,
    pub engine_version: Option<String>,
    pub workload: String,
    pub study: String,
    pub trial: u32,
    pub config: Config,
    /// The command to serve with (port 8000).
    pub command: Option<CommandLine>,
    pub objective: Option<f64>,
    pub metric: String,
    /// Whether it beat the engine's defaults with a 95% interval above zero.
    pub improved: bool,
    pub at: f64,
}

/// What the views show of a study's stored file, read in one parse: both `None` when the text
/// does not parse.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StudyHeading {
    /// `[study] name`, which the study's runs share.
    pub name: Option<String>,
    /// `[objective] metric` (the default: total token throughput).
    pub metric: Option<String>,
}

impl StudyRecord {
    /// The study's name and objective metric: the stored fields, or, in a record written
    /// before they were stored, its file's (one TOML parse: ask once, use both).
    pub fn heading(&self) -> StudyHeading {
        if self.name.is_some() {
            return StudyHeading {
                name: self.name.clone(),
                metric: self.metric.clone(),
            };
        }
        let Ok(v) = toml::from_str::<toml::Table>(&self.spec_text) else {
            return StudyHeading::default();
        };
        let name = v
            .get("study")
            .and_then(|s| s.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_owned);
        let metric = v
            .get("objective")
            .and_then(|o| o.get("metric"))
            .and_then(|m| m.as_str())
            .unwrap_or("total_token_throughput")
            .to_owned();
        StudyHeading {
            name,
            metric: Some(metric),
        }
    }

    /// The study's name (`[study] name` of its file), which its runs share.
    pub fn name(&self) -> Option<String> {
        self.heading().name
    }

    /// The objective metric its file names (the default: total token throughput).
    pub fn metric(&self) -> Option<String> {
        self.heading().metric
    }
}

/// Upper bounds of the trial-duration histogram's buckets, seconds.
pub const DURATION_BUCKETS: [f64; 9] = [
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
];
/// Upper bounds of the launch-time histogram's buckets, seconds.
pub const LAUNCH_BUCKETS: [f64; 8] = [1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// A histogram as Prometheus reports it: cumulative bucket counts, sum and count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Per bucket of the fixed bounds, how many values are at or below it.
    pub buckets: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    fn of(bounds: &[f64], values: impl Iterator<Item = f64>) -> Histogram {
        let mut h = Histogram {
            buckets: vec![0; bounds.len()],
            ..Default::default()
        };
        for v in values {
            h.add(bounds, v);
        }
        h
    }

    fn add(&mut self, bounds: &[f64], v: f64) {
        for (b, n) in bounds.iter().zip(self.buckets.iter_mut()) {
            if v <= *b {
                *n += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    /// Adds another histogram over the same bounds.
    pub fn merge(&mut self, o: &Histogram) {
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize(o.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            *a += b;
        }
        self.sum += o.sum;
        self.count += o.count;
    }
}

/// One study's trials, counted: what the daemon's views need without loading them. Derived
/// data: a summary that does not read (an older shape) is recomputed from the trials.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StudySummary {
    pub study: String,
    pub trials: usize,
    pub search_trials: usize,
    pub ok: usize,
    pub infeasible: usize,
    pub failed: usize,
    /// Search trials that ran their screen only (not promoted to the full run).
    pub screened_out: usize,
    /// Wall time of finished trials.
    pub durations: Histogram,
    /// Seconds from spawn to the first answered request.
    pub launches: Histogram,
}

impl StudySummary {
    pub(crate) fn of(study: &str, ts: &[TrialRecord]) -> StudySummary {
        let search: Vec<&TrialRecord> = ts.iter().filter(|t| t.kind == TrialKind::Search).collect();
        let count = |st: TrialStatus| ts.iter().filter(|t| t.status == st).count();
        StudySummary {
            study: study.to_owned(),
            trials: ts.len(),
            search_trials: search.len(),
            ok: count(TrialStatus::Ok),
            infeasible: count(TrialStatus::Infeasible),
            failed: count(TrialStatus::Failed),
            screened_out: search
                .iter()
                .filter(|t| t.status == TrialStatus::Ok && !t.promoted)
                .count(),
            durations: Histogram::of(
                &DURATION_BUCKETS,
                ts.iter()
                    .filter_map(|t| Some((t.ended? - t.started).max(0.0))),
            ),
            launches: Histogram::of(&LAUNCH_BUCKETS, ts.iter().filter_map(|t| t.startup_s)),
        }
    }
}

impl StudySummary {
    /// Adds another study's counts and histograms (the daemon's totals).
    pub fn merge(&mut self, o: &StudySummary) {
        self.trials += o.trials;
        self.search_trials += o.search_trials;
        self.ok += o.ok;
        self.infeasible += o.infeasible;
        self.failed += o.failed;
        self.screened_out += o.screened_out;
        self.durations.merge(&o.durations);
        self.launches.merge(&o.launches);
    }
}

// The gate's comparisons and checks, stored with a study's outcome (`tune::decide` makes
// them; the report, the API and `servetune best` read them from here).

/// The state of one check of the leader against the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckState {
    /// Within the tolerance on the losing side (or better).
    Ok,
    /// The whole interval lies beyond the tolerance on the losing side.
    Regression,
    /// The interval straddles the tolerance: more rounds could tell.
    Inconclusive,
    /// Shown for information; it does not gate the recommendation.
    Info,
}

impl CheckState {
    /// The one word for the state that the CLI, the report and the status page show beside a
    /// gating check's change (`""` for a check that only informs).
    pub fn label(self) -> &'static str {
        match self {
            CheckState::Ok => "within tolerance",
            CheckState::Regression => "REGRESSION",
            CheckState::Inconclusive => "inconclusive",
            CheckState::Info => "",
        }
    }
}

/// One figure of the leader against the defaults on one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub workload: String,
    /// `objective`, `success_rate`, or a latency key (`tpot:mean`).
    pub key: String,
    pub label: String,
    pub higher_is_better: bool,
    pub baseline: Vec<f64>,
    pub candidate: Vec<f64>,
    pub diff: Option<Diff>,
    pub state: CheckState,
    /// Whether this check gates the recommendation.
    pub gate: bool,
    pub note: Option<String>,
}

/// One candidate's gain on the objective of the primary workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub candidate: u32,
    pub command: Option<CommandLine>,
    /// candidate − defaults, with its 95% interval; `None` when it cannot be computed.
    pub diff: Option<Diff>,
    /// Holm-adjusted one-sided p-value.
    #[serde(default)]
    pub p_adjusted: Option<f64>,
    /// Significant after the correction (or: the defaults miss the constraints, this does not).
    #[serde(default)]
    pub significant: bool,
    /// Why the candidate cannot be recommended (missed the constraints pooled, failed a round).
    pub disqualified: Option<String>,
    /// Compared on the objective's fallback (`needs_fallback`: a run of either arm could not
    /// measure the objective), so `diff` is in the fallback's unit.
    #[serde(default)]
    pub fallback: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trial as servetune wrote it at schema version 1: the command as one display string,
    /// and none of the fields added since (`defaults`, `stopped`, `startup_s`,
    /// `retried_after`).
    const TRIAL_V1: &str = r#"{
        "study": "decode", "seq": 3, "kind": "remeasure", "round": 1, "candidate": 2,
        "config": {"parallel": 16}, "note": "re-measure of #2", "expected_improvement": null,
        "status": "failed", "engine": "llamacpp",
        "command": "LLAMA_ARG_X=1 llama-server -m '/models/a b.gguf' --parallel 16",
        "engine_version": "b4000", "hardware": "2 cores", "screen": null, "full": null,
        "screen_objective": null, "objective": null, "promoted": true,
        "failure": {"class": "crash", "evidence": "SIGSEGV", "log_excerpt": ""},
        "early_stop": null, "telemetry": null, "started": 10.0, "ended": 70.5,
        "bench_s": 55.0, "saved_s": 0.0, "attempts": 2
    }"#;

    /// A finished study as written at schema version 1: no warm start, log parameters,
    /// importance, phase findings, footprint, nor the typed name and metric; an
    /// outcome without the leader, checks, rounds or rounds set aside, and a comparison
    /// without its adjusted p-value.
    const STUDY_V1: &str = r#"{
        "id": "decode-20261101-030000",
        "spec_text": "[study]\nname = \"decode\"\nmodel = \"@smollm2\"\n[objective]\nmetric = \"output_throughput\"\n",
        "created": 1.0, "updated": 2.0, "phase": "done", "stop_reason": "budget: 12 trials",
        "trigger": "nightly", "hardware": "2 cores", "engine_versions": {"llamacpp": "b4000"},
        "dropped_flags": [], "best_trial": 2, "best_objective": 190.5,
        "outcome": {
            "metric": "output_throughput", "baseline_trial": 0, "recommended": 2,
            "recommended_command": "llama-server --parallel 16 --port 8000",
            "recommended_config": {"parallel": 16},
            "comparisons": [{"candidate": 2, "command": "llama-server --parallel 16",
                             "diff": null, "disqualified": null}],
            "verdict": "run trial #2", "search_trials": 12, "screened_only": 3,
            "bench_s": 600.0, "saved_s": 120.0
        }
    }"#;

    #[test]
    fn a_version_1_trial_loads_with_its_command_split_and_the_later_fields_at_their_defaults() {
        let t: TrialRecord = serde_json::from_str(TRIAL_V1).expect("a version 1 trial loads");
        assert_eq!(
            t.kind,
            TrialKind::Remeasure {
                round: 1,
                candidate: 2
            }
        );
        let c = t.command.expect("its command");
        assert_eq!(c.env, vec![("LLAMA_ARG_X".to_owned(), "1".to_owned())]);
        assert_eq!(
            c.argv,
            ["llama-server", "-m", "/models/a b.gguf", "--parallel", "16"]
        );
        assert_eq!(t.failure.map(|f| f.class), Some("crash".to_owned()));
        assert!(!t.defaults);
        assert_eq!((t.stopped, t.startup_s, t.retried_after), (0, None, None));
        assert_eq!((t.attempts, t.status), (2, TrialStatus::Failed));
    }

    #[test]
    fn a_version_1_study_loads_and_reads_its_name_and_metric_from_its_file() {
        let s: StudyRecord = serde_json::from_str(STUDY_V1).expect("a version 1 study loads");
        assert_eq!((s.name.as_deref(), s.metric.as_deref()), (None, None));
        assert_eq!(
            s.heading(),
            StudyHeading {
                name: Some("decode".into()),
                metric: Some("output_throughput".into())
            }
        );
        let o = s.outcome.expect("its outcome");
        assert_eq!(o.recommended, Some(2));
        assert_eq!(
            o.recommended_command.map(|c| c.argv),
            Some(vec![
                "llama-server".to_owned(),
                "--parallel".into(),
                "16".into(),
                "--port".into(),
                "8000".into()
            ])
        );
        assert_eq!((o.leader, o.checks.len(), o.set_aside.len()), (None, 0, 0));
        assert_eq!(o.rounds, Rounds::default());
        let c = &o.comparisons[0];
        assert_eq!(
            (c.p_adjusted, c.significant, c.fallback),
            (None, false, false)
        );
        assert!(s.warm_start.is_empty() && s.log_params.is_empty());
        assert!(s.importance.is_none() && s.one_at_a_time.is_none() && s.footprint.is_none());
    }

    #[test]
    fn a_study_written_now_keeps_its_typed_heading_over_its_file() {
        let mut s: StudyRecord = serde_json::from_str(STUDY_V1).unwrap();
        s.name = Some("renamed".into());
        s.metric = Some("request_goodput".into());
        let back: StudyRecord = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(
            back.heading(),
            StudyHeading {
                name: Some("renamed".into()),
                metric: Some("request_goodput".into())
            }
        );
    }
}
