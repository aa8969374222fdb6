//! The worker thread: its own tokio runtime (a study's futures stay on it), running the
//! scheduler loop and the job loop side by side. The job loop takes the next study from the
//! queue, runs it to the end (or until it is paused, cancelled or the daemon stops), records
//! the outcome in the queue and writes the report under `<state>/reports/`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::queue::{Job, JobState};
use super::{scheduler, Backend, Current, Daemon, DaemonError, Intent};
use crate::tune::records::StudyRecord;
use crate::tune::spec::Study;
use crate::tune::TuneError;
use crate::util::unix_now;

/// How many progress lines the status keeps.
const EVENTS: usize = 20;

/// The worker thread's body: returns once the daemon stops and the engine is down.
pub fn thread<B: Backend>(d: Arc<Daemon<B>>) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("servetune-study")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the worker's runtime: {e}");
            return;
        }
    };
    rt.block_on(async {
        tokio::join!(scheduler::run(&d), jobs(&d));
    });
}

async fn jobs<B: Backend>(d: &Arc<Daemon<B>>) {
    while !d.stopping() {
        match d.queue.next() {
            Ok(Some(job)) => {
                if let Err(e) = run_job(d, job).await {
                    tracing::error!("queue: {e}");
                    tokio::time::sleep(d.tick).await;
                }
            }
            Ok(None) => {
                tokio::select! {
                    _ = d.wake.notified() => {}
                    _ = tokio::time::sleep(d.tick) => {}
                }
            }
            Err(e) => {
                tracing::error!("queue: {e}");
                tokio::time::sleep(d.tick).await;
            }
        }
    }
}

async fn run_job<B: Backend>(d: &Arc<Daemon<B>>, job: Job) -> Result<(), DaemonError> {
    let cancel = CancellationToken::new();
    let resumed = job.state == JobState::Running;
    // The queue entry is marked and `current` installed under the `current` lock, in the
    // order `Daemon::control` takes them: a request sees either a queued job or the current
    // one, never a gap; a SIGTERM from here on reaches the runner.
    let job = {
        let mut cur = d.current();
        if d.stopping() {
            return Ok(());
        }
        let marked = d.queue.update(&job.study, |j| {
            // Paused or cancelled since `next`: leave it.
            if !matches!(j.state, JobState::Queued | JobState::Running) {
                return Err(format!("study {} is {}", j.study, j.state.label()));
            }
            j.state = JobState::Running;
            j.started.get_or_insert(unix_now());
            Ok(())
        });
        let job = match marked {
            Ok(j) => j,
            Err(DaemonError::Conflict(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        *cur = Some(Current {
            job: job.clone(),
            cancel: cancel.clone(),
            intent: Intent::Run,
            events: Vec::new(),
            budget: (0, None),
        });
        job
    };
    tracing::info!(
        "{} study {} ({})",
        if resumed { "resuming" } else { "starting" },
        job.study,
        job.trigger
    );
    let result = execute(d, &job, cancel).await;
    // The final state is written before `current` is cleared, under its lock: a control
    // request in between waits, then finds the job finished.
    let mut cur = d.current();
    let intent = cur.as_ref().map(|c| c.intent).unwrap_or(Intent::Run);
    let (state, error) = match &result {
        Ok(_) => (JobState::Done, None),
        Err(TuneError::Interrupted) => match intent {
            Intent::Pause => (JobState::Paused, None),
            Intent::Cancel => (JobState::Cancelled, None),
            // Stopping: it stays running and resumes at the next start.
            Intent::Shutdown | Intent::Run => (JobState::Running, None),
        },
        Err(e) => (JobState::Failed, Some(e.to_string())),
    };
    let written = d.queue.update(&job.study, |j| {
        j.state = state;
        if state.finished() {
            j.ended = Some(unix_now());
        }
        j.error = error.clone();
        Ok(())
    });
    *cur = None;
    drop(cur);
    tracing::info!(
        "study {}: {}{}",
        job.study,
        if state == JobState::Running {
            "stopped; it resumes at the next start"
        } else {
            state.label()
        },
        error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );
    written?;
    if let Ok(rec) = &result {
        write_reports(d, rec);
    }
    Ok(())
}

async fn execute<B: Backend>(
    d: &Arc<Daemon<B>>,
    job: &Job,
    cancel: CancellationToken,
) -> Result<StudyRecord, TuneError> {
    let mut study = Study::parse_in(
        &job.spec_text,
        &job.spec_path,
        d.cfg.search_spaces.as_deref(),
    )?;
    study.run_id = Some(job.study.clone());
    if let Some(c) = d.current().as_mut() {
        c.budget = (study.spec.budget.trials, study.spec.budget.wall_time_s);
    }
    let mut runner = d
        .backend
        .runner(study, d.store.clone(), d.cfg.state_dir.join("trials"))
        .await?;
    runner.trigger = job.trigger.clone();
    runner.cancel = cancel;
    if job.warm {
        runner.warm = crate::tune::warm::from_store(
            d.records(),
            &job.name,
            &job.study,
            &runner.space,
            d.cfg.warm_top,
        )?;
        if !runner.warm.is_empty() {
            tracing::info!(
                "study {}: warm start from {} earlier configurations",
                job.study,
                runner.warm.len()
            );
        }
    }
    let d2 = d.clone();
    let id = job.study.clone();
    runner.progress = std::sync::Arc::new(move |line: &str| {
        tracing::info!("study {id}: {line}");
        d2.notifier
            .status(&format!("study {id}: {}", crate::util::excerpt(line, 160)));
        if let Some(c) = d2.current().as_mut() {
            c.events.push(line.to_owned());
            let n = c.events.len();
            if n > EVENTS {
                c.events.drain(..n - EVENTS);
            }
        }
    });
    runner.run().await
}

fn write_reports<B: Backend>(d: &Daemon<B>, rec: &StudyRecord) {
    let dir = d.cfg.state_dir.join("reports");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!("cannot create {}: {e}", dir.display());
        return;
    }
    for (fmt, ext) in [("md", "md"), ("html", "html")] {
        let path = dir.join(format!("{}.{ext}", rec.id));
        match crate::report::render(&d.store, &rec.id, fmt, Some(&path)) {
            Ok(_) => tracing::info!("study {}: report {}", rec.id, path.display()),
            Err(e) => tracing::warn!("study {}: report: {e}", rec.id),
        }
    }
}
