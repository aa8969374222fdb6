//! What the API and the status page show, computed from the store (so a restarted daemon
//! shows exactly what it showed before): the status, the studies, the best configurations for
//! this node (the Prometheus metrics are `metrics`). What spans every study or queue entry comes from the
//! `catalog`, read again only after the store changes; the rest reads one study's records
//! (`/v1/best` reads the best records, one per model, node, version and workload).

use super::catalog;
use super::scheduler::rfc3339;
use super::{Backend, Daemon, DaemonError, Intent};
use crate::api::{
    BestAnswerV1, BestNowV1, BestV1, CurrentV1, JobV1, StatusV1, StudyDetailV1, StudyV1,
    TrialNowV1, TrialV1,
};
use crate::space::CommandLine;
use crate::tune::records::{Phase, StudyRecord, TrialKind, TrialRecord, TrialStatus};

fn current_view<B: Backend>(d: &Daemon<B>) -> Result<Option<CurrentV1>, DaemonError> {
    let (job, intent, events, (budget, wall_time_s)) = match d.current().as_ref() {
        Some(c) => (c.job.clone(), c.intent, c.events.clone(), c.budget),
        None => return Ok(None),
    };
    let now = d.clock.now();
    let rec = d.records().study(&job.study)?;
    let trials = d.records().trials(&job.study)?;
    let search: Vec<&TrialRecord> = trials
        .iter()
        .filter(|t| t.kind == TrialKind::Search && t.status != TrialStatus::Running)
        .collect();
    let running: Vec<TrialNowV1> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Running)
        .map(|t| TrialNowV1 {
            seq: t.seq,
            kind: t.kind.label(),
            note: t.note.clone(),
            command: t.command.as_ref().map(CommandLine::display),
            running_s: (now - t.started).max(0.0),
            attempts: t.attempts,
            slot: t.slot.as_ref().map(|p| p.label()),
        })
        .collect();
    let trial = running.last().cloned();
    let metric = rec
        .as_ref()
        .and_then(StudyRecord::metric)
        .unwrap_or_default();
    let best = rec.as_ref().and_then(|r| {
        let seq = r.best_trial?;
        let t = trials.iter().find(|t| t.seq == seq)?;
        Some(BestNowV1 {
            trial: seq,
            objective: r.best_objective?,
            metric: metric.clone(),
            command: t.command.as_ref().map(|c| c.serving().display()),
        })
    });
    let phase = rec.as_ref().map(|r| r.phase);
    let (time_left_s, basis) = time_left(phase, &trials, budget, wall_time_s);
    Ok(Some(CurrentV1 {
        study: job.study.clone(),
        trigger: job.trigger.clone(),
        state: match intent {
            Intent::Run => "running",
            Intent::Pause => "pausing",
            Intent::Cancel => "cancelling",
            Intent::Shutdown => "stopping",
        }
        .into(),
        phase,
        search_trials_done: search.len(),
        search_budget: budget,
        measurements_done: trials
            .iter()
            .filter(|t| t.status != TrialStatus::Running)
            .count(),
        trial,
        running,
        best,
        time_left_s,
        time_left_basis: basis,
        events,
    }))
}

/// The study's time left and how it was estimated: in the search, the trials left at the
/// mean duration of the finished ones, or the wall-time budget left where that is less (the
/// seconds spent in trials, `tune::study::active_s`: time paused or stopped does not count).
fn time_left(
    phase: Option<Phase>,
    trials: &[TrialRecord],
    budget: u32,
    wall_time_s: Option<f64>,
) -> (Option<f64>, String) {
    let durations: Vec<f64> = trials
        .iter()
        .filter(|t| t.kind == TrialKind::Search && t.status != TrialStatus::Running)
        .filter_map(|t| Some(t.ended? - t.started))
        .collect();
    match (phase, durations.is_empty()) {
        (Some(Phase::Search), false) => {
            let mean = durations.iter().sum::<f64>() / durations.len() as f64;
            let left = budget.saturating_sub(durations.len() as u32) as f64;
            let mut est = left * mean;
            let mut basis = format!(
                "search: at most {left:.0} more trials × {mean:.0} s mean, then the re-measurement"
            );
            if let Some(w) = wall_time_s {
                let wall_left = (w - crate::tune::study::active_s(trials)).max(0.0);
                if wall_left < est {
                    est = wall_left;
                    basis = "search: the wall-time budget left, then the re-measurement".into();
                }
            }
            (Some(est), basis)
        }
        (Some(Phase::Done), _) => (Some(0.0), "done".into()),
        _ => (None, "not enough finished trials to estimate".into()),
    }
}

pub fn status<B: Backend>(d: &Daemon<B>) -> Result<StatusV1, DaemonError> {
    let current = current_view(d)?;
    let queue = d.catalog()?.waiting.clone();
    let next_nightly = *d.next_nightly.lock().unwrap_or_else(|p| p.into_inner());
    let next_probe = *d.next_probe.lock().unwrap_or_else(|p| p.into_inner());
    Ok(StatusV1 {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        node: d.backend.node(),
        activity: if d.stopping() {
            "stopping"
        } else if current.is_some() {
            "tuning"
        } else {
            "idle"
        }
        .to_owned(),
        uptime_s: (d.clock.now() - d.started).max(0.0),
        current,
        queue,
        schedule: d.cfg.schedule.expr().to_owned(),
        schedule_tz: d.cfg.schedule.tz().to_owned(),
        next_nightly: next_nightly.map(|t| rfc3339(t as f64)),
        next_probe: next_probe.map(rfc3339),
    })
}

/// The status in one line (systemd's STATUS=).
pub fn one_line_status<B: Backend>(d: &Daemon<B>) -> String {
    match status(d) {
        Ok(s) => match &s.current {
            Some(c) => format!(
                "tuning {}: {} trials of {}{}; {} waiting",
                c.study,
                c.search_trials_done,
                c.search_budget,
                c.best
                    .as_ref()
                    .map(|b| format!(", best {:.1} (#{})", b.objective, b.trial))
                    .unwrap_or_default(),
                s.queue.len()
            ),
            None => format!(
                "idle; {} waiting; next nightly {}",
                s.queue.len(),
                s.next_nightly.as_deref().unwrap_or("-")
            ),
        },
        Err(e) => format!("error: {e}"),
    }
}

/// One study with its record (`study`), its queue entry (`job`) and its summary (`view`).
pub fn study_detail<B: Backend>(d: &Daemon<B>, id: &str) -> Result<StudyDetailV1, DaemonError> {
    let job = d.catalog()?.jobs.get(id).cloned();
    let rec = d.records().study(id)?;
    if job.is_none() && rec.is_none() {
        return Err(DaemonError::NotFound(format!("no study {id:?}")));
    }
    let s = d.records().summary(id)?;
    Ok(StudyDetailV1 {
        view: catalog::view(
            job.as_ref(),
            rec.as_ref(),
            rec.as_ref().map(StudyRecord::heading).as_ref(),
            &s,
        ),
        job: job.map(JobV1::from),
        study: rec.as_ref().map(StudyV1::from),
    })
}

pub fn trials<B: Backend>(d: &Daemon<B>, id: &str) -> Result<Vec<TrialV1>, DaemonError> {
    if !d.catalog()?.jobs.contains_key(id) && d.records().study(id)?.is_none() {
        return Err(DaemonError::NotFound(format!("no study {id:?}")));
    }
    Ok(d.records().trials(id)?.iter().map(TrialV1::from).collect())
}

/// The best configurations for `model` (all models when `None`); this node's first.
pub fn best<B: Backend>(d: &Daemon<B>, model: Option<&str>) -> Result<BestAnswerV1, DaemonError> {
    let node = d.backend.node();
    let mut best = d.records().best_for(model)?;
    best.sort_by_key(|b| {
        (
            b.hardware != node,
            std::cmp::Reverse((b.at * 1000.0) as i64),
        )
    });
    let here = best.iter().find(|b| b.hardware == node);
    Ok(BestAnswerV1 {
        command: here.and_then(|b| b.command.as_ref().map(CommandLine::display)),
        node,
        model: model.map(str::to_owned),
        best: best.iter().map(BestV1::from).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::records::fixtures::trial;

    /// Issue 20, item 11: a study paused for hours between two trials has not spent its
    /// wall-time budget; the estimate counts the seconds spent in trials only.
    #[test]
    fn the_time_left_does_not_count_the_time_a_study_was_paused() {
        let mut a = trial("s", 0, TrialKind::Search, TrialStatus::Ok);
        (a.started, a.ended) = (1_000.0, Some(1_100.0));
        let mut b = trial("s", 1, TrialKind::Search, TrialStatus::Ok);
        // Paused for ten hours before the second trial.
        (b.started, b.ended) = (37_100.0, Some(37_200.0));
        let (left, basis) = time_left(Some(Phase::Search), &[a, b], 10, Some(500.0));
        assert_eq!(left, Some(300.0), "{basis}");
        assert!(basis.contains("wall-time budget"), "{basis}");
        // Without a wall-time budget: the trials left at the mean duration.
        let (a, b) = (
            trial("s", 0, TrialKind::Search, TrialStatus::Ok),
            trial("s", 1, TrialKind::Search, TrialStatus::Ok),
        );
        let (left, _) = time_left(Some(Phase::Search), &[a, b], 10, None);
        // The fixture's trials take 0 and 20 s: 8 more at 10 s.
        assert_eq!(left, Some(80.0));
    }
}
