//! Starting and stopping the engine of one trial: render the point of the space to an argv
//! vector (and the files it names), refuse a GPU that foreign processes hold, record the engine
//! in the store *before* spawning it (with a tag in its environment so a restart can find it),
//! climb the readiness ladder with the engine file's limits and failure patterns (an engine
//! that found its port taken by another process starts again on another port), and on stop
//! tear the group down, verify it is gone and wait for the GPU memory it held to be free.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use thiserror::Error;

use crate::space::{Config, RenderCtx, Rendered, Space};
use crate::store::{EngineRecord, Store, StoreError};
use crate::telemetry::{Telemetry, TelemetryError};

use super::failure::{FailureClass, Patterns};
use super::launch::{launch_with, LaunchError, LaunchSpec, Ready};
use super::process::free_port;
use super::reap::{groups_with_tag, TAG_ENV};
use super::slots::Placement;

#[derive(Debug, Error)]
pub enum TrialError {
    #[error("cannot render the configuration: {0}")]
    Render(String),
    #[error("cannot write {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Gpu(#[from] TelemetryError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("engine {tag} left processes behind after teardown: {why}")]
    Teardown { tag: String, why: String },
}

/// How engines are started on this node.
#[derive(Clone)]
pub struct Launcher {
    pub store: Option<Store>,
    pub telemetry: Telemetry,
    /// Refuse to launch on a GPU that processes other than our engines use.
    pub refuse_foreign_gpu_processes: bool,
    /// How long a teardown waits for the GPU memory to be free again.
    pub release_timeout: Duration,
    pub host: String,
    /// Replaces the `{binary}` element of every engine's argv (the mock engine in tests and on
    /// machines without the engine: `servetune mock-engine --profile vllm --`).
    pub binary: Option<Vec<String>>,
    /// The slot of a parallel trial (`slots::Pool::take`): the engine sees only its GPUs and
    /// runs only on its cores, and the foreign-process check and the wait for released memory
    /// look at its GPUs only (the other GPUs belong to other trials). `None`: the whole node.
    pub placement: Option<Placement>,
}

impl Launcher {
    pub fn new(store: Option<Store>, telemetry: Telemetry) -> Launcher {
        Launcher {
            store,
            telemetry,
            refuse_foreign_gpu_processes: true,
            release_timeout: Duration::from_secs(60),
            host: "127.0.0.1".into(),
            binary: None,
            placement: None,
        }
    }
}

/// The host memory an engine must have taken for its teardown to wait for it to come back.
const HOST_WAIT_ABOVE: u64 = 2 << 30;

/// A started engine of a trial.
pub struct TrialEngine {
    pub ready: Ready,
    pub tag: String,
    pub port: u16,
    pub base_url: String,
    pub rendered: Rendered,
    pub log: PathBuf,
    baseline: Vec<(u32, u64)>,
    /// The host's available memory before the launch (`telemetry::host_memory`).
    host_available: Option<u64>,
    launcher: Launcher,
    /// Cleared once `stop` has torn the engine down and forgotten its record.
    armed: bool,
}

/// A `TrialEngine` dropped without `stop` (a panic unwinding through the study, a future that
/// held it dropped) still tears its group down and removes its record: the process's own drop
/// would kill the group but leave the record, and the next start would report it as leaked.
impl Drop for TrialEngine {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Err(e) = self.teardown(Duration::from_secs(10)) {
            tracing::error!("engine {} dropped without a stop: {e}", self.tag);
        }
    }
}

/// An engine being started and not yet handed over as a `TrialEngine`: dropped armed (the
/// start was abandoned mid-way), it tears down whatever carries the tag and forgets it.
struct Unhanded<'a> {
    launcher: &'a Launcher,
    tag: Option<String>,
}

impl Drop for Unhanded<'_> {
    fn drop(&mut self) {
        if let Some(tag) = self.tag.take() {
            if let Err(e) = self.launcher.forget(&tag) {
                tracing::error!("abandoned engine start {tag}: {e}");
            }
        }
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn new_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Starts a launch tries when the engine reports its port taken: `free_port` finds a port
/// that is free when asked, and another process may bind it before the engine does. That race
/// says nothing about the configuration, so it must not fail the trial.
const PORT_TRIES: u32 = 3;

impl Launcher {
    /// Renders, records and launches. `space` is a single engine's (see `Space::split`);
    /// `dir` is the trial's directory (log and files). An engine that reports its port taken
    /// is started again on another port, up to `PORT_TRIES` starts in all.
    pub async fn start(
        &self,
        space: &Space,
        cfg: &Config,
        model: &str,
        dir: &Path,
    ) -> Result<TrialEngine, TrialError> {
        std::fs::create_dir_all(dir).map_err(|source| TrialError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut tries = 0;
        loop {
            tries += 1;
            let port = free_port().map_err(|source| TrialError::Io {
                path: "a free port".into(),
                source,
            })?;
            match self.start_on(space, cfg, model, dir, port).await {
                Err(TrialError::Launch(LaunchError::Failed { failure, .. }))
                    if failure.class == FailureClass::PortInUse && tries < PORT_TRIES =>
                {
                    tracing::warn!(
                        port,
                        evidence = %failure.evidence,
                        "the engine found its port taken (another process bound it first); starting it again on another port"
                    );
                }
                other => return other,
            }
        }
    }

    /// One start on `port`.
    async fn start_on(
        &self,
        space: &Space,
        cfg: &Config,
        model: &str,
        dir: &Path,
        port: u16,
    ) -> Result<TrialEngine, TrialError> {
        let rendered = space
            .render(
                cfg,
                &RenderCtx {
                    model,
                    host: &self.host,
                    port,
                    binary: self.binary.as_deref(),
                    workdir: dir,
                },
            )
            .map_err(TrialError::Render)?;
        for (path, text) in &rendered.files {
            std::fs::write(path, text).map_err(|source| TrialError::Io {
                path: path.display().to_string(),
                source,
            })?;
        }
        let mine = self.placement.as_ref().map(|p| p.gpus.as_slice());
        if self.refuse_foreign_gpu_processes {
            self.telemetry.check_no_foreign_on(&[], mine)?;
        }
        let baseline: Vec<(u32, u64)> = self
            .telemetry
            .memory_used()
            .into_iter()
            .filter(|(g, _)| mine.is_none_or(|m| m.contains(g)))
            .collect();
        let host_available = crate::telemetry::host_memory::mem_available();
        let tag = new_tag();
        let log = dir.join("engine.log");
        // Each start classifies its own log: an earlier start's (a lost port race, a crash
        // run once more) is kept beside it as `engine.log.N`, so that its lines (a taken port)
        // cannot be read as this start's failure.
        rotate(&log)?;
        let mut env = rendered.env.clone();
        env.push((TAG_ENV.into(), tag.clone()));
        if let Some(store) = &self.store {
            store.engine_intent(&EngineRecord {
                tag: tag.clone(),
                argv: rendered.argv.clone(),
                log: log.clone(),
                pgid: None,
                owner_pid: std::process::id(),
                started_unix: crate::util::unix_now(),
            })?;
        }
        let spec = LaunchSpec {
            argv: rendered.argv.clone(),
            env,
            host: self.host.clone(),
            port,
            health_path: space.engine.health.clone(),
            models_path: space.engine.models.clone(),
            log: log.clone(),
            ladder: space.engine.ladder(),
            placement: self.placement.clone(),
        };
        // From here on the engine may exist: if this future is dropped before it is handed
        // over (the study was stopped during start-up), the guard kills whatever carries the
        // tag and removes the record, as a failed start does.
        let mut guard = Unhanded {
            launcher: self,
            tag: Some(tag.clone()),
        };
        let patterns = Patterns::new(&space.engine.failures);
        let store = self.store.clone();
        let t2 = tag.clone();
        let result = launch_with(&spec, &patterns, move |pgid| match &store {
            Some(s) => s.engine_started(&t2, pgid).map_err(|e| e.to_string()),
            None => Ok(()),
        })
        .await;
        guard.tag = None;
        match result {
            Ok(ready) => Ok(TrialEngine {
                ready,
                tag,
                port,
                base_url: format!("http://{}:{port}", self.host),
                rendered,
                log,
                baseline,
                host_available,
                launcher: self.clone(),
                armed: true,
            }),
            Err(e) => {
                // The ladder tore the engine down; make sure, then forget it.
                self.forget(&tag)?;
                Err(e.into())
            }
        }
    }

    /// Kills whatever still carries `tag` and removes its record.
    /// (Also called by `Unhanded` when a start is abandoned.)
    fn forget(&self, tag: &str) -> Result<(), TrialError> {
        for pgid in groups_with_tag(tag) {
            super::process::terminate_group(pgid, None, Duration::from_secs(10)).map_err(|e| {
                TrialError::Teardown {
                    tag: tag.into(),
                    why: e.to_string(),
                }
            })?;
        }
        if let Some(s) = &self.store {
            s.engine_gone(tag)?;
        }
        Ok(())
    }
}

/// Moves a non-empty `log` aside to the first free `log.N` (N from 1 to 1000).
fn rotate(log: &Path) -> Result<(), TrialError> {
    if std::fs::metadata(log).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    let name = log.file_name().unwrap_or_default().to_string_lossy();
    // A name is free only when the file system says so (another error is not "free": a
    // rename would overwrite an older start's log).
    let to = (1..=1000)
        .map(|n| log.with_file_name(format!("{name}.{n}")))
        .find(|p| {
            std::fs::symlink_metadata(p).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        })
        .ok_or_else(|| TrialError::Io {
            path: log.display().to_string(),
            source: std::io::Error::other("no free name to move the previous start's log to"),
        })?;
    std::fs::rename(log, &to).map_err(|source| TrialError::Io {
        path: log.display().to_string(),
        source,
    })
}

impl TrialEngine {
    /// The known group first, then whatever else carries the tag, and the record; disarms the
    /// drop guard. A group that would not die keeps its record, so the reaper can find it.
    fn teardown(&mut self, grace: Duration) -> Result<(), TrialError> {
        self.ready
            .process
            .shutdown(grace)
            .map_err(|e| TrialError::Teardown {
                tag: self.tag.clone(),
                why: e.to_string(),
            })?;
        self.launcher.forget(&self.tag)?;
        self.armed = false;
        Ok(())
    }

    /// Whether the engine's leader process is still running.
    pub fn alive(&mut self) -> bool {
        self.ready.process.exited().is_none()
    }

    /// SIGTERM, grace, SIGKILL; then no process of the group (or carrying the tag) may be
    /// left, and the GPU memory must return to where it was before the launch. The host's
    /// memory is waited for too (the next engine must not start while the kernel still frees
    /// this one's), but other processes may hold it: not getting it back is a warning.
    pub fn stop(mut self) -> Result<(), TrialError> {
        let host_before_stop = crate::telemetry::host_memory::mem_available();
        self.teardown(Duration::from_secs(15))?;
        self.launcher.telemetry.wait_released(
            &self.baseline,
            512 << 20,
            self.launcher.release_timeout,
        )?;
        // Only an engine that took a large share is waited for (vLLM's CPU KV cache, not a
        // small model's few hundred MiB, which the next start does not miss).
        let held = match (self.host_available, host_before_stop) {
            (Some(before), Some(now)) => before.saturating_sub(now),
            _ => 0,
        };
        if let (Some(before), true) = (self.host_available, held >= HOST_WAIT_ABOVE) {
            let missing = crate::telemetry::host_memory::wait_released(
                before,
                self.launcher.release_timeout,
                Duration::from_millis(100),
                crate::telemetry::host_memory::mem_available,
            );
            if let Some(m) = missing {
                tracing::warn!(
                    "engine {}: {} MiB of host memory available before its launch are still taken {} s after it stopped (other processes, or memory the kernel has not freed yet)",
                    self.tag,
                    m >> 20,
                    self.launcher.release_timeout.as_secs()
                );
            }
        }
        Ok(())
    }
}
