//! What enqueues studies without a request: the first tuning of a kept study, the nightly
//! re-tune on the cron schedule, and a re-tune when a probe sees another engine version, GPU
//! or driver. The time comes from a `Clock` (tests inject one); the next nightly time and the
//! last probe of each study are in the store (`memory`), so a restart neither fires twice
//! nor misses an upgrade that happened while the daemon was down, and a nightly time the
//! daemon slept through fires once when it comes back.

use std::sync::{Arc, Mutex};

use super::memory::NightlyPlan;
use super::{Backend, Daemon, DaemonError, Probe};

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

fn save_plan<B: Backend>(d: &Daemon<B>, schedule: &str, next: Option<i64>) {
    let plan = NightlyPlan {
        schedule: schedule.to_owned(),
        next,
    };
    if let Err(e) = d.memory.put_nightly(&plan) {
        tracing::error!("scheduler: {e}");
    }
}

/// The scheduler loop (on the worker thread); returns when the daemon stops.
pub async fn run<B: Backend>(d: &Arc<Daemon<B>>) {
    if let Err(e) = initial(d) {
        tracing::error!("scheduler: {e}");
    }
    // The stored plan counts only for the same schedule (expression and zone): a changed one
    // starts afresh.
    let expr = d.cfg.schedule.key();
    let stored = match d.memory.nightly() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("scheduler: the stored nightly plan: {e}; computing it afresh");
            None
        }
    };
    let mut next_nightly = match stored {
        Some(p) if p.schedule == expr => p.next,
        _ => {
            let next = d.cfg.schedule.next_after(d.clock.now() as i64);
            save_plan(d, &expr, next);
            next
        }
    };
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
            save_plan(d, &expr, next_nightly);
        }
        if now >= next_probe {
            // A probe (engines' --version/--help) can take a minute: a stop does not wait.
            tokio::select! {
                _ = probe_all(d) => {}
                _ = d.stopped() => {}
            }
            next_probe = now + d.cfg.probe_interval_s;
        }
        *d.next_nightly.lock().unwrap_or_else(|p| p.into_inner()) = next_nightly;
        *d.next_probe.lock().unwrap_or_else(|p| p.into_inner()) = Some(next_probe);
        tokio::select! {
            _ = tokio::time::sleep(d.tick) => {}
            _ = d.stopped() => {}
        }
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
    let studies = d.records().studies()?;
    for k in &d.cfg.studies {
        let name = &k.study.spec.study.name;
        let tuned = jobs.iter().any(|j| &j.name == name)
            || studies.iter().any(|r| r.name().as_deref() == Some(name));
        if !tuned {
            d.submit(&k.study, k.file.clone(), "initial", true)?;
        }
    }
    Ok(())
}

fn nightly<B: Backend>(d: &Daemon<B>) -> Result<(), DaemonError> {
    let mut first_error = None;
    for k in d.cfg.studies.iter().filter(|k| k.nightly) {
        let name = &k.study.spec.study.name;
        // One study's failure does not cost the others their night.
        let r = d.queue.pending(name).and_then(|pending| {
            if pending {
                tracing::info!("nightly: study {name} is already queued or running");
                Ok(())
            } else {
                d.submit(&k.study, k.file.clone(), "nightly", true)
                    .map(|_| ())
            }
        });
        if let Err(e) = r {
            tracing::error!("nightly: study {name}: {e}");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
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
        let old = match d.memory.probe(name) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("probe of study {name}: {e}");
                continue;
            }
        };
        // A version that could not be read (a slow `--version` under load) is not a change.
        let mut probe = probe;
        if let Some(old) = &old {
            for (e, v) in probe.engines.iter_mut() {
                if v.is_none() {
                    *v = old.engines.get(e).cloned().flatten();
                }
            }
        }
        let what = old.as_ref().map(|o| changes(o, &probe)).unwrap_or_default();
        if !what.is_empty() {
            let trigger = what.join("; ");
            tracing::info!("study {name}: {trigger}");
            let queued = match d.queue.pending(name) {
                // The run after the pending one sees the change: keep the old probe so that
                // the next probe still finds it.
                Ok(true) => {
                    tracing::info!("study {name} is already queued or running; re-tune later");
                    false
                }
                Ok(false) => match d.submit(&k.study, k.file.clone(), &trigger, true) {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::error!("study {name}: {e}");
                        false
                    }
                },
                Err(e) => {
                    tracing::error!("study {name}: {e}");
                    false
                }
            };
            if !queued {
                continue;
            }
        }
        if let Err(e) = d.memory.put_probe(name, &probe) {
            tracing::error!("probe of study {name}: {e}");
        }
    }
}
