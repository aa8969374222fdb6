//! The store-derived part of the daemon's views: the list of studies (and its JSON), each
//! study's queue entry, the waiting queue, job counts by state, trial totals and the latest
//! best of each study name. Building it reads every study record, its summary and every queue
//! entry; it is built once per store generation (`Store::generation`, bumped by every write)
//! and shared until the next write, so the status page and its polling, `/v1/studies`, a
//! study's view and `/metrics` do not grow with the number of stored studies
//! (`cargo bench --bench views`). The daemon is the store's only writer while it runs (sled's
//! lock), so no write can go unseen. The trees are read one after the other, not in one
//! snapshot: a write during a build can give that build a mixed view, and moves the generation,
//! so the next request rebuilds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::queue::{Job, JobState, Queue};
use super::scheduler::rfc3339;
use super::DaemonError;
use crate::api::{ListedStudyV1, QueueItemV1};
use crate::space::CommandLine;
use crate::tune::records::{latest_by_name, Records, StudyHeading, StudyRecord, StudySummary};

/// The best objective of the latest study of one name (`servetune_best_objective`).
#[derive(Debug, Clone, PartialEq)]
pub struct LatestBest {
    pub name: String,
    pub study: String,
    pub metric: String,
    pub objective: f64,
}

/// The views' reading of the store at one generation.
#[derive(Debug)]
pub struct Catalog {
    /// The store generation it was built at.
    pub generation: u64,
    /// Each daemon run's queue entry by study id (without its study file's text).
    pub jobs: HashMap<String, Job>,
    /// Every study: the daemon's runs in queue order, then studies run by `servetune tune`.
    pub studies: Vec<ListedStudyV1>,
    /// `studies` as `GET /v1/studies` answers it (cloning it shares the bytes).
    pub studies_json: bytes::Bytes,
    /// Queued and paused studies, in the order they would run.
    pub waiting: Vec<QueueItemV1>,
    /// How many daemon runs are in each queue state.
    pub jobs_by_state: Vec<(JobState, usize)>,
    /// Every study's summary, merged.
    pub totals: StudySummary,
    /// By study name.
    pub latest: Vec<LatestBest>,
}

pub(super) fn view(
    job: Option<&Job>,
    rec: Option<&StudyRecord>,
    heading: Option<&StudyHeading>,
    summary: &StudySummary,
) -> ListedStudyV1 {
    let id = job
        .map(|j| j.study.clone())
        .or_else(|| rec.map(|r| r.id.clone()))
        .unwrap_or_default();
    let o = rec.and_then(|r| r.outcome.as_ref());
    ListedStudyV1 {
        id,
        name: job
            .map(|j| j.name.clone())
            .or_else(|| heading.and_then(|h| h.name.clone())),
        state: job
            .map(|j| j.state.label().to_owned())
            .unwrap_or_else(|| "manual".into()),
        trigger: job
            .map(|j| j.trigger.clone())
            .or_else(|| rec.map(|r| r.trigger.clone()))
            .unwrap_or_default(),
        submitted: job.map(|j| rfc3339(j.submitted)),
        started: job.and_then(|j| j.started).map(rfc3339),
        ended: job.and_then(|j| j.ended).map(rfc3339),
        phase: rec.map(|r| r.phase),
        trials: summary.trials,
        search_trials: summary.search_trials,
        metric: heading.and_then(|h| h.metric.clone()),
        best_objective: rec.and_then(|r| r.best_objective),
        verdict: o.map(|o| o.verdict.clone()),
        recommended_command: o
            .and_then(|o| o.recommended_command.as_ref().map(CommandLine::display)),
        error: job.and_then(|j| j.error.clone()),
    }
}

impl Catalog {
    /// Reads the store at `generation` (taken before the first read).
    pub fn build(
        generation: u64,
        queue: &Queue,
        records: &Records,
    ) -> Result<Catalog, DaemonError> {
        let jobs = queue.all()?;
        let recs: BTreeMap<String, StudyRecord> = records
            .studies()?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        let mut totals = StudySummary::default();
        let mut summaries = BTreeMap::new();
        for id in recs.keys() {
            let s = records.summary(id)?;
            totals.merge(&s);
            summaries.insert(id.clone(), s);
        }
        let headings: HashMap<&str, StudyHeading> = recs
            .values()
            .map(|r| (r.id.as_str(), r.heading()))
            .collect();
        let none = StudySummary::default();
        let mut studies = Vec::with_capacity(jobs.len() + recs.len());
        for j in &jobs {
            let s = summaries.get(&j.study).unwrap_or(&none);
            let r = recs.get(&j.study);
            studies.push(view(Some(j), r, headings.get(j.study.as_str()), s));
        }
        let job_ids: HashSet<&str> = jobs.iter().map(|j| j.study.as_str()).collect();
        for (id, r) in &recs {
            if !job_ids.contains(id.as_str()) {
                studies.push(view(
                    None,
                    Some(r),
                    headings.get(id.as_str()),
                    &summaries[id],
                ));
            }
        }
        let studies_json = serde_json::to_vec(&studies)
            .map_err(|e| DaemonError::Internal(format!("serialising the studies: {e}")))?
            .into();
        let waiting = jobs
            .iter()
            .filter(|j| matches!(j.state, JobState::Queued | JobState::Paused))
            .map(|j| QueueItemV1 {
                study: j.study.clone(),
                state: j.state.v1(),
                trigger: j.trigger.clone(),
                submitted: rfc3339(j.submitted),
            })
            .collect();
        let jobs_by_state = JobState::ALL
            .iter()
            .map(|st| (*st, jobs.iter().filter(|j| j.state == *st).count()))
            .collect();
        let latest = latest_by_name(
            recs.values()
                .map(|r| (headings[r.id.as_str()].name.clone(), r)),
        )
        .into_iter()
        .filter_map(|(name, r)| {
            Some(LatestBest {
                objective: r.best_objective?,
                metric: headings[r.id.as_str()].metric.clone().unwrap_or_default(),
                study: r.id.clone(),
                name,
            })
        })
        .collect();
        let jobs = jobs
            .into_iter()
            .map(|mut j| {
                j.spec_text.clear();
                (j.study.clone(), j)
            })
            .collect();
        Ok(Catalog {
            generation,
            jobs,
            studies,
            studies_json,
            waiting,
            jobs_by_state,
            totals,
            latest,
        })
    }
}

/// The catalog of the latest generation, built on the first request after a write.
#[derive(Default)]
pub struct CatalogCache {
    current: Mutex<Option<Arc<Catalog>>>,
}

impl CatalogCache {
    /// The catalog for the store's current generation: the cached one if no write happened
    /// since it was built, else a new one. Concurrent requests after a write build it once
    /// (the lock is held while building: milliseconds, and the alternative is building it
    /// twice).
    pub fn get(
        &self,
        generation: impl Fn() -> u64,
        build: impl FnOnce(u64) -> Result<Catalog, DaemonError>,
    ) -> Result<Arc<Catalog>, DaemonError> {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let g = generation();
        if let Some(c) = cur.as_ref().filter(|c| c.generation == g) {
            return Ok(c.clone());
        }
        let c = Arc::new(build(g)?);
        *cur = Some(c.clone());
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(g: u64) -> Catalog {
        Catalog {
            generation: g,
            jobs: HashMap::new(),
            studies: vec![],
            studies_json: bytes::Bytes::from_static(b"[]"),
            waiting: vec![],
            jobs_by_state: vec![],
            totals: StudySummary::default(),
            latest: vec![],
        }
    }

    #[test]
    fn the_cache_rebuilds_exactly_when_the_generation_moves() {
        let cache = CatalogCache::default();
        let gen = std::sync::atomic::AtomicU64::new(7);
        let builds = std::sync::atomic::AtomicUsize::new(0);
        let get = || {
            cache
                .get(
                    || gen.load(std::sync::atomic::Ordering::SeqCst),
                    |g| {
                        builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        Ok(empty(g))
                    },
                )
                .unwrap()
        };
        assert_eq!(get().generation, 7);
        assert_eq!(get().generation, 7);
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1);
        gen.store(8, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(get().generation, 8);
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 2);
        // A failed build reports the error and leaves the last good catalog cached (a request
        // at that catalog's generation gets it without a build) ...
        let err = cache.get(
            || 9,
            |_| Err(DaemonError::Internal("the store is gone".into())),
        );
        assert!(matches!(err, Err(DaemonError::Internal(m)) if m.contains("gone")));
        let kept = cache
            .get(|| 8, |_| panic!("the generation-8 catalog is still cached"))
            .unwrap();
        assert_eq!(kept.generation, 8);
        // ... and the next request at the new generation builds again.
        gen.store(9, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(get().generation, 9);
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
