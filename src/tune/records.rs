//! The tuner's records and the one layer that reads and writes them: studies, trials, best
//! configurations, and each study's summary, in the store's `studies`, `trials`, `best` and
//! `summaries` trees. Nothing else in the crate touches those trees (`tests/architecture.rs`
//! fails on a `scan` or a raw `store.get`/`put`/`remove` outside the store and its typed
//! layers).
//!
//! The schema is versioned by the store (`store::SCHEMA_VERSION`); a record that changes shape
//! keeps reading its older form (serde defaults, `space::CommandLine`'s string form), and the
//! API shows them through its own types (`api`), so neither a resume nor a client breaks.
//!
//! A study's summary (trial counts by kind and outcome, the duration and launch histograms'
//! buckets) is rewritten with every trial write, from that study's trials only. The daemon's
//! list of studies and its `/metrics` read summaries, never every trial of every study, so a
//! request costs the same however many trials the store holds (`benches/views.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::decide::{Check, Comparison};
use super::eval::{Measurement, TrialFailure};
use crate::space::{CommandLine, Config};
use crate::store::{Store, StoreError};
use crate::telemetry::TelemetrySummary;

pub const STUDIES: &str = "studies";
pub const TRIALS: &str = "trials";
pub const BEST: &str = "best";

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
    pub one_at_a_time: Option<super::opt::oat::Findings>,
    /// The model's weights against the machine's memory when the study was created (the
    /// priors' `if` read it): a resume uses it, not a new reading, so that its priors, and
    /// with them its proposals, are those of its records.
    #[serde(default)]
    pub footprint: Option<super::prior::Footprint>,
}

/// Which knobs mattered, estimated when the search ends: the GP's predicted spread of the
/// objective as each parameter alone sweeps its range around the best trial
/// (`opt::effects`), against the run-to-run noise it fitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Importance {
    /// Largest first.
    pub effects: Vec<super::opt::Effect>,
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

pub fn trial_key(study: &str, seq: u32) -> String {
    format!("{study}/{seq:06}")
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
    /// The name and objective metric of the study's file (one TOML parse: ask once, use both).
    pub fn heading(&self) -> StudyHeading {
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
    fn of(study: &str, ts: &[TrialRecord]) -> StudySummary {
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

/// The latest study of each name (finished or not), from the studies already read with their
/// names (`StudyRecord::name`; a study without one goes by its id).
pub fn latest_by_name<R: std::borrow::Borrow<StudyRecord>>(
    studies: impl IntoIterator<Item = (Option<String>, R)>,
) -> BTreeMap<String, R> {
    let mut latest: BTreeMap<String, R> = BTreeMap::new();
    for (name, r) in studies {
        let rec = r.borrow();
        let name = name.unwrap_or_else(|| rec.id.clone());
        if latest
            .get(&name)
            .is_none_or(|o| o.borrow().created < rec.created)
        {
            latest.insert(name, r);
        }
    }
    latest
}

pub const SUMMARIES: &str = "summaries";

/// The typed layer over the store for the tuner's trees.
#[derive(Clone)]
pub struct Records {
    store: Store,
}

impl Records {
    pub fn new(store: Store) -> Records {
        Records { store }
    }

    /// The store underneath (its path, for messages).
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn study(&self, id: &str) -> Result<Option<StudyRecord>, StoreError> {
        self.store.get(STUDIES, id)
    }

    /// Every study, by id.
    pub fn studies(&self) -> Result<Vec<StudyRecord>, StoreError> {
        Ok(self
            .store
            .scan::<StudyRecord>(STUDIES, "")?
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }

    pub fn put_study(&self, rec: &StudyRecord) -> Result<(), StoreError> {
        self.store.put(STUDIES, &rec.id, rec)
    }

    /// Every trial of a study, in order.
    pub fn trials(&self, study: &str) -> Result<Vec<TrialRecord>, StoreError> {
        Ok(self
            .store
            .scan::<TrialRecord>(TRIALS, &format!("{study}/"))?
            .into_iter()
            .map(|(_, t)| t)
            .collect())
    }

    /// Writes a trial, then its study's summary (from that study's trials).
    pub fn put_trial(&self, t: &TrialRecord) -> Result<(), StoreError> {
        self.store.put(TRIALS, &trial_key(&t.study, t.seq), t)?;
        let ts = self.trials(&t.study)?;
        self.store
            .put(SUMMARIES, &t.study, &StudySummary::of(&t.study, &ts))
    }

    /// A study's summary; computed from its trials (and not stored: readers write nothing) when
    /// a store written before summaries existed has none.
    pub fn summary(&self, study: &str) -> Result<StudySummary, StoreError> {
        match self.store.get::<StudySummary>(SUMMARIES, study) {
            Ok(Some(s)) => Ok(s),
            Ok(None) | Err(StoreError::Decode { .. }) => {
                Ok(StudySummary::of(study, &self.trials(study)?))
            }
            Err(e) => Err(e),
        }
    }

    /// Rewrites every study's summary that differs from its trials: a store from before
    /// summaries, or one where servetune died between a trial's write and its summary's. The
    /// daemon does it once at start, so that no request has to; returns how many it wrote.
    pub fn refresh_summaries(&self) -> Result<usize, StoreError> {
        let mut n = 0;
        for r in self.studies()? {
            let fresh = StudySummary::of(&r.id, &self.trials(&r.id)?);
            let stored = self
                .store
                .get::<StudySummary>(SUMMARIES, &r.id)
                .ok()
                .flatten();
            if stored.as_ref() != Some(&fresh) {
                self.store.put(SUMMARIES, &r.id, &fresh)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Removes a study, its trials and its summary; returns how many trials went.
    pub fn remove_study(&self, id: &str) -> Result<usize, StoreError> {
        let ts = self.trials(id)?;
        for t in &ts {
            self.store.remove(TRIALS, &trial_key(id, t.seq))?;
        }
        self.store.remove(SUMMARIES, id)?;
        self.store.remove(STUDIES, id)?;
        Ok(ts.len())
    }

    /// The latest finished study named `name`, other than `except`.
    pub fn latest_finished(
        &self,
        name: &str,
        except: &str,
    ) -> Result<Option<StudyRecord>, StoreError> {
        Ok(self
            .studies()?
            .into_iter()
            .filter(|r| {
                r.id != except && r.phase == Phase::Done && r.name().as_deref() == Some(name)
            })
            .max_by(|a, b| a.created.total_cmp(&b.created)))
    }

    pub fn best(&self, key: &str) -> Result<Option<BestRecord>, StoreError> {
        self.store.get(BEST, key)
    }

    pub fn put_best(&self, b: &BestRecord) -> Result<(), StoreError> {
        self.store.put(BEST, &b.key, b)
    }

    /// The best configurations for `model` (all when `None`).
    pub fn best_for(&self, model: Option<&str>) -> Result<Vec<BestRecord>, StoreError> {
        Ok(self
            .store
            .scan::<BestRecord>(BEST, "")?
            .into_iter()
            .map(|(_, b)| b)
            .filter(|b| model.is_none_or(|m| model_matches(&b.model, m)))
            .collect())
    }
}

/// Records for unit tests elsewhere in the tuner (`warm`, …): the fields a test does not name
/// are neutral.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A trial of `study`: no config, no objective (set the fields a test needs).
    pub(crate) fn trial(
        study: &str,
        seq: u32,
        kind: TrialKind,
        status: TrialStatus,
    ) -> TrialRecord {
        let mut t: TrialRecord = serde_json::from_value(serde_json::json!({
            "study": study, "seq": seq, "config": {}, "note": "",
            "expected_improvement": null, "status": status, "engine": null, "command": null,
            "engine_version": null, "hardware": "", "screen": null, "full": null,
            "screen_objective": null, "objective": null, "promoted": seq % 2 == 0,
            "failure": null, "early_stop": null, "telemetry": null, "started": 100.0,
            "ended": if status == TrialStatus::Running { None } else { Some(100.0 + 20.0 * seq as f64) },
            "bench_s": 0.0, "saved_s": 0.0, "attempts": 1, "startup_s": 4.0,
            "kind": "search"
        }))
        .unwrap();
        t.kind = kind;
        t
    }

    /// A study named `name` (its file holds only that), created at `created`.
    pub(crate) fn named(id: &str, name: &str, created: f64, phase: Phase) -> StudyRecord {
        StudyRecord {
            id: id.into(),
            spec_text: format!("[study]\nname = \"{name}\"\n"),
            created,
            updated: created,
            phase,
            stop_reason: None,
            trigger: "nightly".into(),
            hardware: String::new(),
            engine_versions: Default::default(),
            dropped_flags: vec![],
            best_trial: None,
            best_objective: None,
            outcome: None,
            warm_start: vec![],
            log_params: vec![],
            importance: None,
            one_at_a_time: None,
            footprint: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{named, trial};
    use super::*;

    #[test]
    fn a_trial_write_keeps_its_studys_summary_current() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::new(Store::open(dir.path()).unwrap());
        r.put_trial(&trial("a", 0, TrialKind::Search, TrialStatus::Ok))
            .unwrap();
        r.put_trial(&trial("a", 1, TrialKind::Search, TrialStatus::Ok))
            .unwrap();
        r.put_trial(&trial("a", 2, TrialKind::Search, TrialStatus::Running))
            .unwrap();
        r.put_trial(&trial("b", 0, TrialKind::Search, TrialStatus::Failed))
            .unwrap();
        // A re-measurement round counts as a trial, not as a search trial.
        let round = TrialKind::Remeasure {
            round: 0,
            candidate: 0,
        };
        r.put_trial(&trial("b", 1, round, TrialStatus::Ok)).unwrap();
        let s = r.summary("a").unwrap();
        assert_eq!((s.trials, s.search_trials), (3, 3));
        assert_eq!((s.ok, s.failed, s.screened_out), (2, 0, 1));
        // Durations 0 s and 20 s; launches 4 s for all three.
        assert_eq!(s.durations.count, 2);
        assert_eq!(s.durations.sum, 20.0);
        assert_eq!(s.durations.buckets[0], 1, "<= 10 s");
        assert_eq!(s.durations.buckets[1], 2, "<= 30 s");
        assert_eq!(s.launches.buckets[1], 3, "<= 5 s");
        // The running trial finishes: the summary follows.
        r.put_trial(&trial("a", 2, TrialKind::Search, TrialStatus::Infeasible))
            .unwrap();
        let s = r.summary("a").unwrap();
        assert_eq!((s.infeasible, s.ok), (1, 2));
        let b = r.summary("b").unwrap();
        assert_eq!((b.trials, b.search_trials, b.failed, b.ok), (2, 1, 1, 1));
        let mut total = r.summary("a").unwrap().durations;
        total.merge(&b.durations);
        assert_eq!(total.count, 5);

        // A store from before summaries, or a summary left behind by a crash: computed on
        // read (a reader writes nothing), rewritten by the refresh.
        for id in ["a", "b"] {
            r.put_study(&study(id)).unwrap();
        }
        r.store.remove(SUMMARIES, "a").unwrap();
        assert_eq!(r.summary("a").unwrap().trials, 3);
        assert!(r
            .store
            .get::<StudySummary>(SUMMARIES, "a")
            .unwrap()
            .is_none());
        let mut stale = r.summary("b").unwrap();
        stale.ok = 99;
        r.store.put(SUMMARIES, "b", &stale).unwrap();
        assert_eq!(r.refresh_summaries().unwrap(), 2);
        assert_eq!(
            r.store
                .get::<StudySummary>(SUMMARIES, "a")
                .unwrap()
                .unwrap()
                .trials,
            3
        );
        assert_eq!(r.summary("b").unwrap().ok, 1);
        assert_eq!(r.refresh_summaries().unwrap(), 0, "nothing to rewrite");
        // A summary of another shape is derived data: recomputed, not an error.
        r.store.put(SUMMARIES, "b", &"not a summary").unwrap();
        assert_eq!(r.summary("b").unwrap().trials, 2);
        assert_eq!(r.remove_study("b").unwrap(), 2);
        assert!(r
            .store
            .get::<StudySummary>(SUMMARIES, "b")
            .unwrap()
            .is_none());
        assert!(r.trials("b").unwrap().is_empty());
    }

    fn study(id: &str) -> StudyRecord {
        named(id, id, 1.0, Phase::Done)
    }

    #[test]
    fn the_latest_finished_study_of_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::new(Store::open(dir.path()).unwrap());
        let rec = named;
        r.put_study(&rec("n-1", "n", 1.0, Phase::Done)).unwrap();
        r.put_study(&rec("n-2", "n", 2.0, Phase::Done)).unwrap();
        r.put_study(&rec("n-3", "n", 3.0, Phase::Search)).unwrap();
        r.put_study(&rec("m-1", "m", 9.0, Phase::Done)).unwrap();
        let id = |o: Option<StudyRecord>| o.map(|r| r.id);
        assert_eq!(id(r.latest_finished("n", "").unwrap()), Some("n-2".into()));
        assert_eq!(
            id(r.latest_finished("n", "n-2").unwrap()),
            Some("n-1".into())
        );
        assert_eq!(id(r.latest_finished("x", "").unwrap()), None);
        let latest = latest_by_name(r.studies().unwrap().into_iter().map(|s| (s.name(), s)));
        assert_eq!(latest["n"].id, "n-3");
        assert_eq!(latest["m"].id, "m-1");
    }
}
