//! Launching an engine for a trial: spawn (through `process`), then the readiness ladder:
//! process alive → port open → health 200 → `/v1/models` lists a model → one 1-token request
//! answers. Each rung has its own time limit; a failure on any rung tears the engine down and is
//! classified with the log line that proves it. A hung engine (healthy, but no token) is caught
//! by the last rung.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::failure::{Failure, FailureClass, Patterns};
use super::process::{log_tail, EngineProcess, ProcessError};
use super::slots::Placement;
use crate::space::Ladder;

/// The rungs of the readiness ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rung {
    Alive,
    Port,
    Health,
    Models,
    FirstToken,
}

pub struct LaunchSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub host: String,
    pub port: u16,
    pub health_path: String,
    /// The model list (`/v1/models`).
    pub models_path: String,
    pub log: PathBuf,
    pub ladder: Ladder,
    /// The devices and cores the engine is confined to (parallel trials); `None`: the node.
    pub placement: Option<Placement>,
}

/// An engine that passed every rung.
pub struct Ready {
    pub process: EngineProcess,
    /// The model id the engine serves.
    pub model: String,
    /// Seconds spent on each rung.
    pub rungs: Vec<(Rung, f64)>,
}

#[derive(Debug, Error)]
pub enum LaunchError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("cannot record the engine in the store, so it was stopped: {0}")]
    Record(String),
    #[error("engine failed at rung {rung:?}: {} ({})", failure.class.key(), failure.evidence)]
    Failed {
        rung: Rung,
        failure: Failure,
        log_excerpt: String,
    },
}

fn fail(
    process: EngineProcess,
    rung: Rung,
    patterns: &Patterns,
    fallback: FailureClass,
    why: String,
) -> LaunchError {
    // Tear down first: the log is complete only once the process is gone.
    let path = process.log_path().to_path_buf();
    let _ = process.terminate(Duration::from_secs(10));
    let log = std::fs::read_to_string(&path).unwrap_or_default();
    let failure = patterns.classify(&log, false).unwrap_or(Failure {
        class: fallback,
        evidence: why,
    });
    LaunchError::Failed {
        rung,
        failure,
        log_excerpt: log_tail(&path, 30),
    }
}

// Each later rung polls until it succeeds, the process dies, or its limit passes.
/// Climbs one rung of the ladder: polls `$check` (a future of an `Option`) every 100 ms until it
/// yields a value, which the macro evaluates to, and records the rung's time in `$rungs`.
///
/// When the process dies or `$limit` passes first, the engine is torn down and the calling
/// function returns the classified failure.
macro_rules! climb {
    ($process:ident, $rungs:ident, $patterns:expr, $rung:expr, $limit:expr, $timeout_class:expr, $check:expr) => {{
        let t = Instant::now();
        loop {
            if let Some(status) = $process.exited() {
                return Err(fail(
                    $process,
                    $rung,
                    $patterns,
                    FailureClass::Crash,
                    format!("exited during start-up ({status})"),
                ));
            }
            if let Some(v) = $check.await {
                $rungs.push(($rung, t.elapsed().as_secs_f64()));
                break v;
            }
            if t.elapsed() > $limit {
                return Err(fail(
                    $process,
                    $rung,
                    $patterns,
                    $timeout_class,
                    format!("no answer within {:.0} s", $limit.as_secs_f64()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }};
}

/// Spawns the engine and climbs the ladder.
pub async fn launch(spec: &LaunchSpec, patterns: &Patterns) -> Result<Ready, LaunchError> {
    launch_with(spec, patterns, |_| Ok(())).await
}

/// As `launch`, calling `on_spawn(pgid)` as soon as the process exists (the caller records the
/// group in the store); an error from it tears the engine down at once.
pub async fn launch_with(
    spec: &LaunchSpec,
    patterns: &Patterns,
    on_spawn: impl FnOnce(i32) -> Result<(), String>,
) -> Result<Ready, LaunchError> {
    let mut process =
        EngineProcess::spawn_placed(&spec.argv, &spec.env, &spec.log, spec.placement.as_ref())?;
    if let Err(why) = on_spawn(process.pgid()) {
        let _ = process.terminate(Duration::from_secs(10));
        return Err(LaunchError::Record(why));
    }
    let base = format!("http://{}:{}", spec.host, spec.port);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client without TLS always builds");
    let mut rungs = Vec::new();
    let t0 = Instant::now();

    // Alive: the process survives its first moments (a bad flag exits at once).
    tokio::time::sleep(spec.ladder.alive).await;
    if let Some(status) = process.exited() {
        return Err(fail(
            process,
            Rung::Alive,
            patterns,
            FailureClass::Crash,
            format!("exited at start ({status})"),
        ));
    }
    rungs.push((Rung::Alive, t0.elapsed().as_secs_f64()));

    let addr = format!("{}:{}", spec.host, spec.port);
    climb!(
        process,
        rungs,
        patterns,
        Rung::Port,
        spec.ladder.port,
        FailureClass::StartupTimeout,
        async { tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ()) }
    );
    let health = format!("{base}{}", spec.health_path);
    climb!(
        process,
        rungs,
        patterns,
        Rung::Health,
        spec.ladder.health,
        FailureClass::StartupTimeout,
        async {
            match http.get(&health).send().await {
                Ok(r) if r.status() == reqwest::StatusCode::OK => Some(()),
                _ => None,
            }
        }
    );
    let models = format!("{base}{}", spec.models_path);
    let model: String = climb!(
        process,
        rungs,
        patterns,
        Rung::Models,
        spec.ladder.models,
        FailureClass::StartupTimeout,
        async {
            let v: serde_json::Value = http.get(&models).send().await.ok()?.json().await.ok()?;
            v.pointer("/data/0/id")
                .and_then(|x| x.as_str())
                .map(str::to_owned)
        }
    );
    // First token: one request for one token. An engine that is healthy but never answers
    // within the limit is hung.
    let completions = format!("{base}/v1/completions");
    let body =
        serde_json::json!({"model": model, "prompt": "Hello", "max_tokens": 1, "stream": false});
    let t = Instant::now();
    if first_token_answers(&http, &completions, &body, spec.ladder.first_token).await {
        rungs.push((Rung::FirstToken, t.elapsed().as_secs_f64()));
    } else {
        let class = if process.exited().is_some() {
            FailureClass::Crash
        } else {
            FailureClass::Hang
        };
        return Err(fail(
            process,
            Rung::FirstToken,
            patterns,
            class,
            format!(
                "no token within {:.0} s",
                spec.ladder.first_token.as_secs_f64()
            ),
        ));
    }
    Ok(Ready {
        process,
        model,
        rungs,
    })
}

/// Whether a request for one token (`body`, posted to `completions`) gets an answer with a
/// choice within `limit`.
async fn first_token_answers(
    http: &reqwest::Client,
    completions: &str,
    body: &serde_json::Value,
    limit: Duration,
) -> bool {
    let answer = tokio::time::timeout(limit, async {
        let r = http
            .post(completions)
            .timeout(limit)
            .json(body)
            .send()
            .await
            .ok()?;
        let v: serde_json::Value = r.json().await.ok()?;
        v.pointer("/choices/0").map(|_| ())
    })
    .await;
    matches!(answer, Ok(Some(())))
}
