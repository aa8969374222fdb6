//! What enqueues studies without a request: the first tuning of a kept study, the nightly
//! re-tune on the cron schedule, and a re-tune when a probe sees another engine version, GPU
//! or driver. The time comes from a `Clock` (tests inject one); the next nightly time and the
//! last probe of each study are in the store (tree `daemon`), so a restart neither fires twice
//! nor misses an upgrade that happened while the daemon was down, and a nightly time the
//! daemon slept through fires once when it comes back.

use std::sync::{Arc, Mutex};

use super::{Backend, Daemon, DaemonError, Probe};
use crate::tune::study::{StudyRecord, STUDIES};

pub const DAEMON: &str = "daemon";
const NIGHTLY_NEXT: &str = "nightly_next";

/// Where the scheduler reads the time.
pub trait Clock: Send + Sync {
    /// Unix seconds.
    fn now(&self) -> f64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        crate::util::unix_now()
    }
}

/// A clock that moves only when told (tests).
pub struct ManualClock(Mutex<f64>);

impl ManualClock {
    pub fn new(t: f64) -> ManualClock {
        ManualClock(Mutex::new(t))
    }

    pub fn set(&self, t: f64) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> f64 {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn probe_key(name: &str) -> String {
    format!("probe/{name}")
}

/// The scheduler loop (on the worker thread); returns when the daemon stops.
pub async fn run<B: Backend>(d: &Arc<Daemon<B>>) {
    if let Err(e) = initial(d) {
        tracing::error!("scheduler: {e}");
    }
    let mut next_nightly: Option<i64> = d.store.get(DAEMON, NIGHTLY_NEXT).ok().flatten();
    if next_nightly.is_none() {
        next_nightly = d.cfg.schedule.next_after(d.clock.now() as i64);
        let _ = d.store.put(DAEMON, NIGHTLY_NEXT, &next_nightly);
    }
    let mut next_probe = d.clock.now();
    while !d.stopping() {
        d.beat();
        let now = d.clock.now();
        if let Some(t) = next_nightly.filter(|t| now >= *t as f64) {
            tracing::info!("nightly re-tune (scheduled {})", rfc3339(t as f64));
            if let Err(e) = nightly(d) {
                tracing::error!("nightly re-tune: {e}");
            }
            next_nightly = d.cfg.schedule.next_after(now as i64);
            if let Err(e) = d.store.put(DAEMON, NIGHTLY_NEXT, &next_nightly) {
                tracing::error!("scheduler: {e}");
            }
        }
        if now >= next_probe {
            probe_all(d).await;
            next_probe = now + d.cfg.probe_interval_s;
        }
        *d.next_nightly.lock().unwrap_or_else(|p| p.into_inner()) = next_nightly;
        *d.next_probe.lock().unwrap_or_else(|p| p.into_inner()) = Some(next_probe);
        tokio::time::sleep(d.tick).await;
    }
}

pub fn rfc3339(t: f64) -> String {
    crate::util::timestamp_rfc3339(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(t.max(0.0)),
    )
}

/// Kept studies never tuned (no run in the queue, no study of that name in the store) are
/// queued once, at start-up, when `tune_on_start`.
fn initial<B: Backend>(d: &Daemon<B>) -> Result<(), DaemonError> {
    if !d.cfg.tune_on_start {
        return Ok(());
    }
    let jobs = d.queue.all()?;
    let studies = d.store.scan::<StudyRecord>(STUDIES, "")?;
    for k in &d.cfg.studies {
        let name = &k.study.spec.study.name;
        let tuned = jobs.iter().any(|j| &j.name == name)
            || studies
                .iter()
                .any(|(_, r)| super::worker::study_name(&r.spec_text).as_deref() == Some(name));
        if !tuned {
            d.submit(&k.study, k.file.clone(), "initial", true)?;
        }
    }
    Ok(())
}

fn nightly<B: Backend>(d: &Daemon<B>) -> Result<(), DaemonError> {
    for k in d.cfg.studies.iter().filter(|k| k.nightly) {
        if d.queue.pending(&k.study.spec.study.name)? {
            tracing::info!(
                "nightly: study {} is already queued or running",
                k.study.spec.study.name
            );
            continue;
        }
        d.submit(&k.study, k.file.clone(), "nightly", true)?;
    }
    Ok(())
}

/// What changed between two probes, in words (`llamacpp 4100 → 4200`); empty if nothing.
pub fn changes(old: &Probe, new: &Probe) -> Vec<String> {
    let mut out = Vec::new();
    let v = |x: Option<&Option<String>>| {
        x.and_then(|v| v.clone())
            .unwrap_or_else(|| "unknown".into())
    };
    for e in old.engines.keys().chain(new.engines.keys()) {
        let (a, b) = (old.engines.get(e), new.engines.get(e));
        if a != b
            && !out
                .iter()
                .any(|s: &String| s.starts_with(&format!("engine upgrade: {e} ")))
        {
            out.push(format!("engine upgrade: {e} {} → {}", v(a), v(b)));
        }
    }
    if old.hardware != new.hardware {
        out.push(format!("GPU change: {} → {}", old.hardware, new.hardware));
    }
    if old.driver != new.driver {
        let s = |d: &Option<String>| d.clone().unwrap_or_else(|| "none".into());
        out.push(format!(
            "driver change: {} → {}",
            s(&old.driver),
            s(&new.driver)
        ));
    }
    out
}

async fn probe_all<B: Backend>(d: &Arc<Daemon<B>>) {
    for k in d.cfg.studies.iter().filter(|k| k.on_upgrade) {
        if d.stopping() {
            return;
        }
        d.beat();
        let name = &k.study.spec.study.name;
        let probe = match d.backend.probe(&k.study).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("probe of study {name}: {e}");
                continue;
            }
        };
        let key = probe_key(name);
        let old: Option<Probe> = match d.store.get(DAEMON, &key) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("probe of study {name}: {e}");
                continue;
            }
        };
        if let Err(e) = d.store.put(DAEMON, &key, &probe) {
            tracing::error!("probe of study {name}: {e}");
            continue;
        }
        let Some(old) = old else { continue };
        let what = changes(&old, &probe);
        if what.is_empty() {
            continue;
        }
        let trigger = what.join("; ");
        tracing::info!("study {name}: {trigger}");
        match d.queue.pending(name) {
            Ok(true) => tracing::info!("study {name} is already queued or running"),
            Ok(false) => {
                if let Err(e) = d.submit(&k.study, k.file.clone(), &trigger, true) {
                    tracing::error!("study {name}: {e}");
                }
            }
            Err(e) => tracing::error!("study {name}: {e}"),
        }
    }
}
