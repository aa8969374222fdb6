//! `servetune daemon`: the long-running service on a GPU node. It keeps the configured studies
//! tuned: one study at a time from a queue kept in the store (`queue`), run by a worker thread
//! (`worker`) that also runs the scheduler (`scheduler`: the nightly cron and the engine,
//! GPU and driver probes that trigger a warm re-tune); an HTTP API and status page (`api`,
//! `views`, `page`) answer operators; systemd hears READY, STATUS and WATCHDOG (`notify`).
//!
//! Invariants: nothing is bound before the whole configuration is valid; a request that
//! changes something needs the bearer token; SIGTERM tears the running trial's engine down
//! and leaves the study resumable; everything that matters is in the store, so a SIGKILLed
//! daemon resumes on restart exactly as `servetune tune` does.

pub mod api;
pub mod catalog;
pub mod client;
pub mod config;
pub mod cron;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod page;
pub mod queue;
pub mod scheduler;
pub mod views;
pub mod worker;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreError};
use crate::telemetry::Telemetry;
use crate::tune::eval::{EngineEvaluator, Evaluator};
use crate::tune::records::Records;
use crate::tune::spec::Study;
use crate::tune::study::Runner;
use crate::tune::TuneError;
use config::DaemonConfig;
use notify::Notifier;
use queue::{Job, JobState, Queue};
use scheduler::Clock;

#[derive(Debug, Error)]
pub enum DaemonError {
    /// A bad configuration: the daemon exits with status 64.
    #[error("config: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tune(#[from] TuneError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Internal(String),
}

/// What the probes see of a study's engines on this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub engines: BTreeMap<String, Option<String>>,
    pub hardware: String,
    pub driver: Option<String>,
}

/// How the daemon probes engines and builds a study's runner: real engines in production,
/// the virtual-time mock in tests.
pub trait Backend: Send + Sync + 'static {
    type Eval: Evaluator;
    /// The versions of the study's engines, the GPU and the driver, as installed now.
    fn probe(&self, study: &Study) -> impl Future<Output = Result<Probe, String>>;
    fn runner(
        &self,
        study: Study,
        store: Store,
        trial_root: PathBuf,
    ) -> impl Future<Output = Result<Runner<Self::Eval>, TuneError>>;
    /// This node's hardware key (`1x NVIDIA H200`, `cpu: … (2 cores)`).
    fn node(&self) -> String;
}

/// Real engines, measured by the load generator.
pub struct EngineBackend {
    pub telemetry: Telemetry,
}

impl Backend for EngineBackend {
    type Eval = EngineEvaluator;

    async fn probe(&self, study: &Study) -> Result<Probe, String> {
        let e = crate::tune::engine_space(study, &self.telemetry)
            .await
            .map_err(|e| e.to_string())?;
        let fp = self.telemetry.fingerprint();
        Ok(Probe {
            engines: e.versions,
            hardware: fp.key(),
            driver: fp.driver_version,
        })
    }

    async fn runner(
        &self,
        study: Study,
        store: Store,
        trial_root: PathBuf,
    ) -> Result<Runner<EngineEvaluator>, TuneError> {
        crate::tune::engine_runner(study, store, trial_root, self.telemetry.clone()).await
    }

    fn node(&self) -> String {
        self.telemetry.fingerprint().key()
    }
}

/// Why the running study is being interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    Run,
    Pause,
    Cancel,
    /// The daemon is stopping: the study stays `running` and resumes at the next start.
    Shutdown,
}

/// The study being tuned now.
pub struct Current {
    pub job: Job,
    pub cancel: CancellationToken,
    pub intent: Intent,
    /// The runner's latest progress lines, newest last.
    pub events: Vec<String>,
    /// The study file's search budget: trials and wall time (for the time-left estimate).
    pub budget: (u32, Option<f64>),
}

pub struct Daemon<B: Backend> {
    pub cfg: DaemonConfig,
    pub store: Store,
    /// The tuner's records (studies, trials, best, summaries) in `store`.
    records: Records,
    pub queue: Queue,
    /// The scheduler's next nightly time and last probes, in the store.
    pub memory: memory::SchedulerMemory,
    /// The views' reading of the store, rebuilt after a write (`catalog`).
    catalog: catalog::CatalogCache,
    pub backend: B,
    pub clock: Arc<dyn Clock>,
    pub notifier: Notifier,
    token: String,
    pub started: f64,
    /// How often the worker's scheduler loop wakes (1 s; tests shorten it).
    pub tick: Duration,
    current: Mutex<Option<Current>>,
    wake: tokio::sync::Notify,
    shutdown: CancellationToken,
    heartbeat: Mutex<Instant>,
    /// When the scheduler fires next (Unix seconds), for the status.
    next_nightly: Mutex<Option<i64>>,
    next_probe: Mutex<Option<f64>>,
}

impl<B: Backend> Daemon<B> {
    pub fn new(
        cfg: DaemonConfig,
        store: Store,
        backend: B,
        clock: Arc<dyn Clock>,
        token: String,
    ) -> Daemon<B> {
        let started = clock.now();
        match Records::new(store.clone()).refresh_summaries() {
            Ok(0) => {}
            Ok(n) => tracing::info!("rewrote the summaries of {n} studies from their trials"),
            Err(e) => tracing::warn!("summarising stored studies: {e}"),
        }
        Daemon {
            queue: Queue::new(store.clone()),
            records: Records::new(store.clone()),
            catalog: Default::default(),
            memory: memory::SchedulerMemory::new(store.clone()),
            cfg,
            store,
            backend,
            clock,
            notifier: Notifier::from_env(),
            token,
            started,
            tick: Duration::from_secs(1),
            current: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
            shutdown: CancellationToken::new(),
            heartbeat: Mutex::new(Instant::now()),
            next_nightly: Mutex::new(None),
            next_probe: Mutex::new(None),
        }
    }

    pub fn records(&self) -> &Records {
        &self.records
    }

    /// The store as the list views read it, current to the last write.
    pub fn catalog(&self) -> Result<Arc<catalog::Catalog>, DaemonError> {
        self.catalog.get(
            || self.store.generation(),
            |g| catalog::Catalog::build(g, &self.queue, &self.records),
        )
    }

    /// Constant-time comparison of a presented bearer token with the configured one.
    pub fn authorized(&self, presented: &str) -> bool {
        let (a, b) = (presented.as_bytes(), self.token.as_bytes());
        let mut diff = (a.len() != b.len()) as u8;
        for (i, x) in b.iter().enumerate() {
            diff |= x ^ a.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once a shutdown has begun.
    pub async fn stopped(&self) {
        self.shutdown.cancelled().await
    }

    pub fn stopping(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Asks the worker to stop: the running study's engine is torn down, the study stays
    /// `running` in the queue so that the next start resumes it.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
        if let Some(c) = self.current().as_mut() {
            // A pause or cancel already under way stays what it is.
            if c.intent == Intent::Run {
                c.intent = Intent::Shutdown;
            }
            c.cancel.cancel();
        }
        self.wake.notify_one();
        self.notifier.stopping();
    }

    /// Enqueues a study run and wakes the worker.
    pub fn submit(
        &self,
        study: &Study,
        spec_path: PathBuf,
        trigger: &str,
        warm: bool,
    ) -> Result<Job, DaemonError> {
        let job = self
            .queue
            .enqueue(study, spec_path, trigger, warm, self.clock.now())?;
        tracing::info!("queued study {} ({trigger})", job.study);
        self.wake.notify_one();
        Ok(job)
    }

    /// Cancels a queued, paused or running study (a running one after its engine is down).
    pub fn cancel(&self, study: &str) -> Result<Job, DaemonError> {
        self.control(study, Intent::Cancel)
    }

    /// Pauses a queued or running study; `resume` puts it back in the queue where it was.
    pub fn pause(&self, study: &str) -> Result<Job, DaemonError> {
        self.control(study, Intent::Pause)
    }

    pub fn resume(&self, study: &str) -> Result<Job, DaemonError> {
        let job = self.queue.update(study, |j| match j.state {
            JobState::Paused => {
                j.state = JobState::Queued;
                Ok(())
            }
            s => Err(format!(
                "study {study} is {}; only a paused study can be resumed",
                s.label()
            )),
        })?;
        self.wake.notify_one();
        Ok(job)
    }

    fn control(&self, study: &str, intent: Intent) -> Result<Job, DaemonError> {
        let verb = if intent == Intent::Cancel {
            "cancelled"
        } else {
            "paused"
        };
        let mut cur = self.current();
        if let Some(c) = cur.as_mut().filter(|c| c.job.study == study) {
            if c.intent != Intent::Run {
                return Err(DaemonError::Conflict(format!(
                    "study {study} is already stopping"
                )));
            }
            // The worker records the new state once the engine is down.
            c.intent = intent;
            c.cancel.cancel();
            return Ok(c.job.clone());
        }
        // Still holding `current`: the worker cannot take this job meanwhile, and it re-checks
        // the state when it does. A `running` job that is not current was left by a stopped
        // daemon and has not been picked up again yet.
        let r = self.queue.update(study, |j| match (j.state, intent) {
            (JobState::Queued | JobState::Running, _) | (JobState::Paused, Intent::Cancel) => {
                j.state = if intent == Intent::Cancel {
                    JobState::Cancelled
                } else {
                    JobState::Paused
                };
                if intent == Intent::Cancel {
                    j.ended = Some(crate::util::unix_now());
                }
                Ok(())
            }
            (s, _) => Err(format!(
                "study {study} is {}; it cannot be {verb}",
                s.label()
            )),
        });
        drop(cur);
        r
    }

    fn beat(&self) {
        *self.heartbeat.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Whether the worker's loop ran recently (the watchdog pings only then).
    pub fn alive(&self, within: Duration) -> bool {
        self.heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            <= within
    }
}

/// A daemon serving in this process: its address, and how to stop it.
pub struct Handle {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), DaemonError>>,
}

impl Handle {
    /// Stops it as SIGTERM would, and waits.
    pub async fn stop(mut self) -> Result<(), DaemonError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done
            .await
            .map_err(|e| DaemonError::Internal(e.to_string()))?
    }
}

/// Starts the worker and the HTTP server on `listener`; returns at once.
pub fn start<B: Backend>(
    d: Arc<Daemon<B>>,
    listener: tokio::net::TcpListener,
) -> Result<Handle, DaemonError> {
    let addr = listener
        .local_addr()
        .map_err(|e| DaemonError::Internal(e.to_string()))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(serve(d, listener, async move {
        let _ = rx.await;
    }));
    Ok(Handle {
        addr,
        stop: Some(tx),
        done,
    })
}

/// Runs the daemon until `stop` resolves, then shuts down in order: the worker tears the
/// engine down (within `stop_timeout_s`, else the engines are killed), the HTTP server
/// drains, the store is flushed.
pub async fn serve<B: Backend>(
    d: Arc<Daemon<B>>,
    listener: tokio::net::TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let worker = {
        let d = d.clone();
        std::thread::Builder::new()
            .name("servetune-worker".into())
            .spawn(move || worker::thread(d))
            .map_err(|e| DaemonError::Internal(format!("cannot start the worker: {e}")))?
    };
    let app = api::router(d.clone());
    let (http_stop_tx, http_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = http_stop_rx.await;
            })
            .await
    });
    d.notifier.ready(&views::one_line_status(&d));
    let watchdog = d.notifier.watchdog().map(|period| {
        let d = d.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period / 2).await;
                // Ping only while the worker's loop is alive: a hung worker gets restarted.
                if d.alive(period) {
                    d.notifier.ping();
                    d.notifier.status(&views::one_line_status(&d));
                }
            }
        })
    });
    stop.await;
    tracing::info!("stopping: tearing the running engine down");
    d.begin_shutdown();
    let limit = Duration::from_secs_f64(d.cfg.stop_timeout_s);
    // Joined on a plain thread: a worker that never stops must not keep the runtime (and so
    // the process) from exiting.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let _ = std::thread::Builder::new()
        .name("servetune-join".into())
        .spawn(move || {
            let _ = done_tx.send(worker.join().is_ok());
        });
    let joined = tokio::time::timeout(limit, done_rx).await;
    let outcome = match joined {
        Ok(Ok(true)) => Ok(()),
        Ok(_) => Err(DaemonError::Internal("the worker thread panicked".into())),
        Err(_) => {
            tracing::error!(
                "the worker did not stop within {:.0} s; killing the engines it started",
                d.cfg.stop_timeout_s
            );
            Err(DaemonError::Internal(
                "the worker did not stop in time".into(),
            ))
        }
    };
    if outcome.is_err() {
        let _ = crate::engine::reap::reap(&d.store);
    }
    if let Some(w) = watchdog {
        w.abort();
    }
    let _ = http_stop_tx.send(());
    // Connections still open after this are cut: the process is about to exit.
    let mut http = http;
    if tokio::time::timeout(Duration::from_secs(5), &mut http)
        .await
        .is_err()
    {
        http.abort();
    }
    d.store.flush()?;
    tracing::info!("stopped");
    outcome
}

/// `servetune daemon --config FILE`: validates the config (status 64 if bad), binds, serves
/// until SIGTERM or SIGINT.
pub async fn run(config: &std::path::Path) -> Result<(), DaemonError> {
    let cfg = DaemonConfig::load(config)?;
    let token = cfg.token()?;
    let store = Store::open_state(&cfg.state_dir)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| DaemonError::Bind {
            addr: cfg.listen.to_string(),
            source,
        })?;
    let bound = listener.local_addr().unwrap_or(cfg.listen);
    if !cfg.listen.ip().is_loopback() {
        tracing::warn!(
            "listening on {} (not loopback): the API is reachable from the network; changes still need the token",
            cfg.listen
        );
    }
    tracing::info!(
        "servetune daemon on http://{bound} (state {}, {} studies kept tuned, schedule {})",
        cfg.state_dir.display(),
        cfg.studies.len(),
        cfg.schedule
    );
    let backend = EngineBackend {
        telemetry: Telemetry::detect(),
    };
    let d = Arc::new(Daemon::new(
        cfg,
        store,
        backend,
        Arc::new(scheduler::SystemClock),
        token,
    ));
    serve(d, listener, crate::signals::terminated()).await
}
