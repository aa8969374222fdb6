//! The study queue, kept in the store (tree `jobs`, one record per study run keyed by its
//! sequence number) so that it survives restarts: requests and the scheduler enqueue, the
//! worker takes the oldest running-or-queued job, operators cancel, pause and resume. Every
//! change is one flushed write made under one lock, so two requests never race a transition.

use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::DaemonError;
use crate::api::{JobStateV1, JobV1};
use crate::store::Store;
use crate::tune::spec::Study;

pub const JOBS: &str = "jobs";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    /// Being tuned (or was, when the daemon died: it resumes first at start-up).
    Running,
    Paused,
    Cancelled,
    Done,
    Failed,
}

impl JobState {
    /// Every state, in the order the metrics list them.
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Paused,
        JobState::Cancelled,
        JobState::Done,
        JobState::Failed,
    ];

    /// The state's word (the API's, `JobStateV1::label`).
    pub fn label(self) -> &'static str {
        self.v1().label()
    }

    pub fn finished(self) -> bool {
        matches!(
            self,
            JobState::Cancelled | JobState::Done | JobState::Failed
        )
    }
}

/// One study run of the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub seq: u64,
    /// The study's id in the store: `<name>-<UTC time>`.
    pub study: String,
    /// The study file's `study.name`.
    pub name: String,
    pub spec_text: String,
    /// Anchors the study file's relative paths (search spaces).
    pub spec_path: PathBuf,
    /// `initial`, `nightly`, `engine upgrade: …`, `submitted`.
    pub trigger: String,
    pub state: JobState,
    /// Start from the previous study's best configurations.
    pub warm: bool,
    pub submitted: f64,
    pub started: Option<f64>,
    pub ended: Option<f64>,
    pub error: Option<String>,
}

impl JobState {
    /// The state as the API shows it.
    pub fn v1(self) -> JobStateV1 {
        match self {
            JobState::Queued => JobStateV1::Queued,
            JobState::Running => JobStateV1::Running,
            JobState::Paused => JobStateV1::Paused,
            JobState::Cancelled => JobStateV1::Cancelled,
            JobState::Done => JobStateV1::Done,
            JobState::Failed => JobStateV1::Failed,
        }
    }
}

/// A queue entry as the API answers it: without the study file's text (`GET
/// /v1/studies/{id}` has the record).
impl From<Job> for JobV1 {
    fn from(j: Job) -> JobV1 {
        JobV1 {
            seq: j.seq,
            study: j.study,
            name: j.name,
            spec_text: String::new(),
            spec_path: j.spec_path.display().to_string(),
            trigger: j.trigger,
            state: j.state.v1(),
            warm: j.warm,
            submitted: j.submitted,
            started: j.started,
            ended: j.ended,
            error: j.error,
        }
    }
}

pub struct Queue {
    store: Store,
    lock: Mutex<()>,
}

fn key(seq: u64) -> String {
    format!("{seq:012}")
}

impl Queue {
    pub fn new(store: Store) -> Queue {
        Queue {
            store,
            lock: Mutex::new(()),
        }
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every job, oldest first.
    pub fn all(&self) -> Result<Vec<Job>, DaemonError> {
        Ok(self
            .store
            .scan::<Job>(JOBS, "")?
            .into_iter()
            .map(|(_, j)| j)
            .collect())
    }

    /// The job of a study run.
    pub fn find(&self, study: &str) -> Result<Option<Job>, DaemonError> {
        Ok(self.all()?.into_iter().find(|j| j.study == study))
    }

    /// Whether a run of study `name` is queued or running (the scheduler adds no second one).
    pub fn pending(&self, name: &str) -> Result<bool, DaemonError> {
        Ok(self
            .all()?
            .iter()
            .any(|j| j.name == name && matches!(j.state, JobState::Queued | JobState::Running)))
    }

    /// Adds a run of `study`; its id is `<name>-<UTC time of submission>` (with a suffix when
    /// two land in the same second).
    pub fn enqueue(
        &self,
        study: &Study,
        spec_path: PathBuf,
        trigger: &str,
        warm: bool,
        now: f64,
    ) -> Result<Job, DaemonError> {
        let _g = self.guard();
        let all = self.all()?;
        let seq = all.last().map(|j| j.seq + 1).unwrap_or(1);
        let stamp = crate::util::timestamp_compact(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(now.max(0.0)),
        );
        let base = format!("{}-{stamp}", study.spec.study.name);
        let mut id = base.clone();
        let mut n = 1;
        while all.iter().any(|j| j.study == id)
            || crate::tune::records::Records::new(self.store.clone())
                .study(&id)?
                .is_some()
        {
            n += 1;
            id = format!("{base}.{n}");
        }
        let job = Job {
            seq,
            study: id,
            name: study.spec.study.name.clone(),
            spec_text: study.text.clone(),
            spec_path,
            trigger: trigger.to_owned(),
            state: JobState::Queued,
            warm,
            submitted: now,
            started: None,
            ended: None,
            error: None,
        };
        self.store.put(JOBS, &key(seq), &job)?;
        Ok(job)
    }

    /// The job to run next: one left running by a stopped daemon first, else the oldest queued.
    pub fn next(&self) -> Result<Option<Job>, DaemonError> {
        let all = self.all()?;
        Ok(all
            .iter()
            .find(|j| j.state == JobState::Running)
            .or_else(|| all.iter().find(|j| j.state == JobState::Queued))
            .cloned())
    }

    /// Applies `f` to the job of study run `study` and stores it; `f` may refuse with a reason
    /// (the request then gets 409 Conflict).
    pub fn update(
        &self,
        study: &str,
        f: impl FnOnce(&mut Job) -> Result<(), String>,
    ) -> Result<Job, DaemonError> {
        let _g = self.guard();
        let mut job = self
            .find(study)?
            .ok_or_else(|| DaemonError::NotFound(format!("no study {study:?} in the queue")))?;
        f(&mut job).map_err(DaemonError::Conflict)?;
        self.store.put(JOBS, &key(job.seq), &job)?;
        Ok(job)
    }

    /// How many jobs wait (queued or paused).
    pub fn waiting(&self) -> Result<usize, DaemonError> {
        Ok(self
            .all()?
            .iter()
            .filter(|j| matches!(j.state, JobState::Queued | JobState::Paused))
            .count())
    }
}
