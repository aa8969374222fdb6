//! The tuner's records and the one layer that reads and writes them: studies, trials, best
//! configurations, and each study's summary, in the store's `studies`, `trials`, `best` and
//! `summaries` trees. Nothing else in the crate touches those trees (`tests/architecture.rs`
//! fails on a `scan` or a raw `store.get`/`put`/`remove` outside the store and its typed
//! layers).
//!
//! The record types are `schema` (re-exported here): versioned by the store
//! (`store::SCHEMA_VERSION`), each keeps reading its older form, and the API shows them
//! through its own types (`api`), so neither a resume nor a client breaks.
//!
//! A study's summary (trial counts by kind and outcome, the duration and launch histograms'
//! buckets) is rewritten with every trial write, from that study's trials only. The daemon's
//! list of studies and its `/metrics` read summaries, never every trial of every study, so a
//! request costs the same however many trials the store holds (`benches/views.rs`).

use std::collections::BTreeMap;

use crate::store::{Store, StoreError};

mod schema;
pub use schema::*;

pub const STUDIES: &str = "studies";
pub const TRIALS: &str = "trials";
pub const BEST: &str = "best";

pub fn trial_key(study: &str, seq: u32) -> String {
    format!("{study}/{seq:06}")
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
            name: None,
            metric: None,
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
            interference: None,
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
