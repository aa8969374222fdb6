//! What the API and the status page show, computed from the store (so a restarted daemon
//! shows exactly what it showed before): the status, the studies, the best configurations for
//! this node, and the Prometheus metrics. What spans every study or queue entry comes from the
//! `catalog`, read again only after the store changes; the rest reads one study's records
//! (`/v1/best` reads the best records, one per model, node, version and workload).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::catalog;
use super::queue::JobState;
use super::scheduler::rfc3339;
use super::{Backend, Daemon, DaemonError, Intent};
use crate::api::{BestV1, StudyV1, TrialV1};
use crate::space::CommandLine;
use crate::tune::records::{
    Histogram, Phase, StudyRecord, TrialKind, TrialRecord, TrialStatus, DURATION_BUCKETS,
    LAUNCH_BUCKETS,
};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialView {
    pub seq: u32,
    pub kind: String,
    pub note: String,
    pub command: Option<String>,
    pub running_s: f64,
    pub attempts: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BestView {
    pub trial: u32,
    pub objective: f64,
    pub metric: String,
    /// The trial's command as one to serve with (port 8000).
    pub command: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CurrentView {
    pub study: String,
    pub trigger: String,
    /// `running`, or `pausing`/`cancelling`/`stopping` while the engine is torn down.
    pub state: String,
    /// search, remeasure, validate.
    pub phase: Option<Phase>,
    pub search_trials_done: usize,
    pub search_budget: u32,
    pub measurements_done: usize,
    pub trial: Option<TrialView>,
    pub best: Option<BestView>,
    /// An estimate of the time the study still needs, and how it was made.
    pub time_left_s: Option<f64>,
    pub time_left_basis: String,
    pub events: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueItem {
    pub study: String,
    pub state: JobState,
    pub trigger: String,
    pub submitted: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub node: String,
    /// idle, tuning, stopping.
    pub phase: String,
    pub uptime_s: f64,
    pub current: Option<CurrentView>,
    /// Queued and paused studies, in the order they would run.
    pub queue: Vec<QueueItem>,
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
pub struct StudyView {
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

fn current_view<B: Backend>(d: &Daemon<B>) -> Result<Option<CurrentView>, DaemonError> {
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
    let trial = trials
        .iter()
        .rev()
        .find(|t| t.status == TrialStatus::Running)
        .map(|t| TrialView {
            seq: t.seq,
            kind: t.kind.label(),
            note: t.note.clone(),
            command: t.command.as_ref().map(CommandLine::display),
            running_s: (now - t.started).max(0.0),
            attempts: t.attempts,
        });
    let metric = rec
        .as_ref()
        .and_then(StudyRecord::metric)
        .unwrap_or_default();
    let best = rec.as_ref().and_then(|r| {
        let seq = r.best_trial?;
        let t = trials.iter().find(|t| t.seq == seq)?;
        Some(BestView {
            trial: seq,
            objective: r.best_objective?,
            metric: metric.clone(),
            command: t.command.as_ref().map(|c| c.serving().display()),
        })
    });
    let phase = rec.as_ref().map(|r| r.phase);
    let (time_left_s, basis) = time_left(phase, &trials, budget, wall_time_s);
    Ok(Some(CurrentView {
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

pub fn status<B: Backend>(d: &Daemon<B>) -> Result<Status, DaemonError> {
    let current = current_view(d)?;
    let queue = d.catalog()?.waiting.clone();
    let next_nightly = *d.next_nightly.lock().unwrap_or_else(|p| p.into_inner());
    let next_probe = *d.next_probe.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Status {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        node: d.backend.node(),
        phase: if d.stopping() {
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
pub fn study_detail<B: Backend>(d: &Daemon<B>, id: &str) -> Result<serde_json::Value, DaemonError> {
    let job = d.catalog()?.jobs.get(id).cloned();
    let rec = d.records().study(id)?;
    if job.is_none() && rec.is_none() {
        return Err(DaemonError::NotFound(format!("no study {id:?}")));
    }
    let s = d.records().summary(id)?;
    Ok(serde_json::json!({
        "view": catalog::view(
            job.as_ref(),
            rec.as_ref(),
            rec.as_ref().map(StudyRecord::heading).as_ref(),
            &s
        ),
        "job": job,
        "study": rec.as_ref().map(StudyV1::from),
    }))
}

pub fn trials<B: Backend>(d: &Daemon<B>, id: &str) -> Result<Vec<TrialV1>, DaemonError> {
    if !d.catalog()?.jobs.contains_key(id) && d.records().study(id)?.is_none() {
        return Err(DaemonError::NotFound(format!("no study {id:?}")));
    }
    Ok(d.records().trials(id)?.iter().map(TrialV1::from).collect())
}

/// The best configurations for `model` (all models when `None`); this node's first.
pub fn best<B: Backend>(
    d: &Daemon<B>,
    model: Option<&str>,
) -> Result<serde_json::Value, DaemonError> {
    let node = d.backend.node();
    let mut best = d.records().best_for(model)?;
    best.sort_by_key(|b| {
        (
            b.hardware != node,
            std::cmp::Reverse((b.at * 1000.0) as i64),
        )
    });
    let here = best.iter().find(|b| b.hardware == node);
    Ok(serde_json::json!({
        "node": node,
        "model": model,
        "command": here.and_then(|b| b.command.as_ref().map(CommandLine::display)),
        "best": best.iter().map(BestV1::from).collect::<Vec<_>>(),
    }))
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn histogram(out: &mut String, name: &str, help: &str, bounds: &[f64], h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (i, b) in bounds.iter().enumerate() {
        let n = h.buckets.get(i).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum {}", h.sum);
    let _ = writeln!(out, "{name}_count {}", h.count);
}

/// `GET /metrics`, in Prometheus' text format (0.0.4).
pub fn metrics<B: Backend>(d: &Daemon<B>) -> Result<String, DaemonError> {
    let c = d.catalog()?;
    let total = &c.totals;
    let mut s = String::new();
    let _ = writeln!(s, "# HELP servetune_up Whether the daemon is serving.");
    let _ = writeln!(s, "# TYPE servetune_up gauge\nservetune_up 1");
    let waiting = c.waiting.len();
    let _ = writeln!(
        s,
        "# HELP servetune_queue_length Studies waiting to run (queued or paused).\n# TYPE servetune_queue_length gauge\nservetune_queue_length {waiting}"
    );
    let running = d.current().is_some() as u8;
    let _ = writeln!(
        s,
        "# HELP servetune_study_running Whether a study is being tuned now.\n# TYPE servetune_study_running gauge\nservetune_study_running {running}"
    );
    let _ = writeln!(
        s,
        "# HELP servetune_studies Daemon study runs by queue state.\n# TYPE servetune_studies gauge"
    );
    for (st, n) in &c.jobs_by_state {
        let _ = writeln!(s, "servetune_studies{{state=\"{}\"}} {n}", st.label());
    }
    let _ = writeln!(
        s,
        "# HELP servetune_trials_total Finished engine runs (search, re-measurement, validation) by outcome.\n# TYPE servetune_trials_total counter"
    );
    for (label, n) in [
        ("ok", total.ok),
        ("infeasible", total.infeasible),
        ("failed", total.failed),
    ] {
        let _ = writeln!(s, "servetune_trials_total{{outcome=\"{label}\"}} {n}");
    }
    let constraint = total.infeasible;
    let screened = total.screened_out;
    let _ = writeln!(
        s,
        "# HELP servetune_early_stops_total Trials stopped early: a constraint (success rate, SLO) missed, or not promoted past screening.\n# TYPE servetune_early_stops_total counter\nservetune_early_stops_total{{reason=\"constraint\"}} {constraint}\nservetune_early_stops_total{{reason=\"screened_out\"}} {screened}"
    );
    let _ = writeln!(
        s,
        "# HELP servetune_best_objective The best objective of the latest study of each name.\n# TYPE servetune_best_objective gauge"
    );
    for b in &c.latest {
        let _ = writeln!(
            s,
            "servetune_best_objective{{study=\"{}\",run=\"{}\",metric=\"{}\"}} {}",
            esc(&b.name),
            esc(&b.study),
            esc(&b.metric),
            b.objective
        );
    }
    histogram(
        &mut s,
        "servetune_trial_duration_seconds",
        "Wall time of finished trials (launch, benchmark runs, teardown).",
        &DURATION_BUCKETS,
        &total.durations,
    );
    histogram(
        &mut s,
        "servetune_launch_duration_seconds",
        "Seconds from spawning an engine to its first answered request.",
        &LAUNCH_BUCKETS,
        &total.launches,
    );
    if let Some(t) = *d.next_nightly.lock().unwrap_or_else(|p| p.into_inner()) {
        let _ = writeln!(
            s,
            "# HELP servetune_next_nightly_timestamp_seconds When the next nightly re-tune is due.\n# TYPE servetune_next_nightly_timestamp_seconds gauge\nservetune_next_nightly_timestamp_seconds {t}"
        );
    }
    Ok(s)
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
