//! A mock OpenAI-compatible engine for tests and for trying servetune without a GPU:
//! `/v1/completions` and `/v1/chat/completions` (streaming and not), `/v1/models`, `/health`,
//! `/tokenize`, `/detokenize`, `/metrics`. Its latency, chunking, capacity and failures are set by
//! [`MockConfig`]; tokens are released on an absolute schedule (token k at
//! `start + ttft + k·itl`), so timer granularity does not accumulate and the configured
//! latencies are what a client should measure.
//!
//! With an engine profile (`profile`, `engines`, `sim`, `live`) it imitates vLLM, SGLang,
//! TensorRT-LLM or llama-server instead: their flags, their start-up failures and messages, and
//! latencies that follow a continuous-batching model of the flags.
//!
//! `serve` runs in-process (tests start it on port 0); `servetune mock-engine` wraps it.
//!
//! The same model drives the optimiser's evaluation in virtual time (`evaluator`) and
//! `servetune search-bench` (`search_bench`). Production paths never depend on this module: it
//! is behind the `mock` feature (on by default; `--no-default-features` builds without it), and
//! `tests/architecture.rs` fails when a `use crate::mock` appears outside it.

pub mod engines;
pub mod evaluator;
pub mod gate_bench;
mod generate;
pub mod live;
pub mod profile;
pub mod search_bench;
pub mod sim;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use crate::tokenizer::WordTokenizer;

/// How the mock behaves.
#[derive(Debug, Clone, Serialize, Deserialize, clap::Args)]
pub struct MockConfig {
    /// Model name served at /v1/models.
    #[arg(long, default_value = "mock-model")]
    pub model: String,
    /// Time to first token, milliseconds.
    #[arg(long, default_value_t = 20.0, allow_negative_numbers = true)]
    pub ttft_ms: f64,
    /// Time per output token after the first, milliseconds.
    #[arg(long, default_value_t = 5.0, allow_negative_numbers = true)]
    pub itl_ms: f64,
    /// Tokens carried by each streamed chunk.
    #[arg(long, default_value_t = 1)]
    pub tokens_per_chunk: u32,
    /// Requests generated at once; the rest wait (their wait adds to TTFT). 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    pub capacity: usize,
    /// Share of requests answered with HTTP 500 (0..1), drawn deterministically.
    #[arg(long, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// Stop serving (drop every connection) when request N+1 arrives; the CLI then exits 1.
    #[arg(long)]
    pub crash_after: Option<u64>,
    /// /health and the APIs answer 503 for this long after start.
    #[arg(long, default_value_t = 0.0)]
    pub slow_start_s: f64,
    /// Accept requests, send headers, never send a token.
    #[arg(long)]
    pub hang: bool,
    /// Close the connection after every response (as llama-server does after a stream).
    #[arg(long)]
    pub close_after_response: bool,
    /// Output tokens when the request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: u64,
    /// Vocabulary size of the word tokenizer (reported as meta.n_vocab).
    #[arg(long, default_value_t = 32_000)]
    pub vocab_size: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            model: "mock-model".into(),
            ttft_ms: 20.0,
            itl_ms: 5.0,
            tokens_per_chunk: 1,
            capacity: 0,
            failure_rate: 0.0,
            crash_after: None,
            slow_start_s: 0.0,
            hang: false,
            close_after_response: false,
            default_max_tokens: 16,
            vocab_size: 32_000,
            seed: 0,
        }
    }
}

/// Counters exposed at /metrics and to in-process tests.
#[derive(Debug, Default)]
pub struct MockStats {
    pub requests: AtomicU64,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub failed: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub max_running: AtomicU64,
}

/// Profile mode: the engine model behind the HTTP API.
pub struct EngineMode {
    pub profile: String,
    pub engine: live::Engine,
    /// Canonical metric → the engine's Prometheus name.
    pub metric_names: Vec<(String, String)>,
    /// The GPUs the engine was given (`CUDA_VISIBLE_DEVICES`), reported in `/v1/models` as
    /// `servetune_devices`; `None` when it was given the whole node.
    pub devices: Option<Vec<u32>>,
}

struct Shared {
    cfg: MockConfig,
    mode: Option<EngineMode>,
    started: Instant,
    stats: Arc<MockStats>,
    slots: Option<Arc<Semaphore>>,
    tokenizer: WordTokenizer,
    crashed: AtomicBool,
    crash: Arc<Notify>,
    created: u64,
}

/// A running mock engine.
pub struct MockHandle {
    pub addr: SocketAddr,
    pub stats: Arc<MockStats>,
    crash: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
    shutdown: Arc<Notify>,
}

impl MockHandle {
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// Stops the server and waits for it.
    pub async fn stop(self) {
        self.shutdown.notify_one();
        self.task.abort();
        let _ = self.task.await;
    }
    /// Resolves when the server crashed (`crash_after`).
    pub async fn crashed(&self) {
        self.crash.notified().await
    }
}

impl MockConfig {
    /// Checks the settings that would otherwise break every request.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("--ttft-ms", self.ttft_ms), ("--itl-ms", self.itl_ms)] {
            if !v.is_finite() || !(0.0..=3_600_000.0).contains(&v) {
                return Err(format!("{name} must be between 0 and 3600000 ms, got {v}"));
            }
        }
        if !(0.0..=1.0).contains(&self.failure_rate) {
            return Err(format!(
                "--failure-rate must be in [0, 1], got {}",
                self.failure_rate
            ));
        }
        if !self.slow_start_s.is_finite() || self.slow_start_s < 0.0 {
            return Err(format!(
                "--slow-start-s must be >= 0, got {}",
                self.slow_start_s
            ));
        }
        if self.vocab_size < 2 {
            return Err(format!(
                "--vocab-size must be at least 2, got {}",
                self.vocab_size
            ));
        }
        Ok(())
    }
}

/// Starts the mock on `listener`; it serves until stopped or crashed.
pub fn serve(listener: TcpListener, cfg: MockConfig) -> std::io::Result<MockHandle> {
    serve_mode(listener, cfg, None, Arc::new(Notify::new()))
}

/// Starts the mock with an optional engine model; `crash` fires when the engine dies (also
/// used by the model itself for a run-time out-of-memory).
pub fn serve_mode(
    listener: TcpListener,
    cfg: MockConfig,
    mode: Option<EngineMode>,
    crash: Arc<Notify>,
) -> std::io::Result<MockHandle> {
    cfg.validate()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let addr = listener.local_addr()?;
    let stats = Arc::new(MockStats::default());
    let shutdown = Arc::new(Notify::new());
    let shared = Arc::new(Shared {
        slots: (cfg.capacity > 0).then(|| Arc::new(Semaphore::new(cfg.capacity))),
        tokenizer: WordTokenizer {
            vocab_size: cfg.vocab_size.max(2),
        },
        started: Instant::now(),
        stats: stats.clone(),
        crashed: AtomicBool::new(false),
        crash: crash.clone(),
        mode,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        cfg,
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .with_state(shared);
    let crash2 = crash.clone();
    let sd = shutdown.clone();
    let task = tokio::spawn(async move {
        let stop = async move {
            tokio::select! {
                _ = crash2.notified() => {}
                _ = sd.notified() => {}
            }
        };
        // Dropping the serve future on crash drops every connection at once, like a dead process.
        tokio::select! {
            _ = axum::serve(listener, app) => {}
            _ = stop => {}
        }
    });
    Ok(MockHandle {
        addr,
        stats,
        crash,
        task,
        shutdown,
    })
}

fn error_response(status: StatusCode, msg: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": msg, "type": "mock_error", "code": status.as_u16()}})),
    )
        .into_response()
}

impl Shared {
    fn loading(&self) -> bool {
        self.started.elapsed().as_secs_f64() < self.cfg.slow_start_s
    }
    fn finish(&self, mut resp: Response) -> Response {
        if self.cfg.close_after_response {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
    /// Resolves once the engine has crashed (at once if it already has).
    async fn wait_crash(&self) {
        loop {
            let n = self.crash.notified();
            if self.crashed.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    if s.loading() {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "Loading model");
    }
    s.finish(Json(json!({"status": "ok"})).into_response())
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    let mut model = json!({
        "id": s.cfg.model, "object": "model", "created": s.created, "owned_by": "servetune-mock",
        "meta": {"n_vocab": s.cfg.vocab_size}
    });
    if let Some(d) = s.mode.as_ref().and_then(|m| m.devices.as_ref()) {
        model["servetune_devices"] = json!(d);
    }
    s.finish(Json(json!({"object": "list", "data": [model]})).into_response())
}

#[derive(Deserialize)]
struct TokenizeReq {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
}

async fn tokenize(State(s): State<Arc<Shared>>, Json(r): Json<TokenizeReq>) -> Response {
    let text = r.content.or(r.prompt).unwrap_or_default();
    let tokens = s.tokenizer.encode(&text);
    s.finish(Json(json!({"tokens": tokens, "count": tokens.len()})).into_response())
}

#[derive(Deserialize)]
struct DetokenizeReq {
    tokens: Vec<u32>,
}

async fn detokenize(State(s): State<Arc<Shared>>, Json(r): Json<DetokenizeReq>) -> Response {
    s.finish(Json(json!({"content": s.tokenizer.decode(&r.tokens)})).into_response())
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    if let Some(mode) = &s.mode {
        return s.finish(
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                engine_metrics(mode),
            )
                .into_response(),
        );
    }
    let st = &s.stats;
    let body = format!(
        "# TYPE mock:num_requests_running gauge\nmock:num_requests_running {}\n\
         # TYPE mock:num_requests_waiting gauge\nmock:num_requests_waiting {}\n\
         # TYPE mock:request_success_total counter\nmock:request_success_total {}\n\
         # TYPE mock:request_failure_total counter\nmock:request_failure_total {}\n\
         # TYPE mock:generation_tokens_total counter\nmock:generation_tokens_total {}\n\
         # TYPE mock:prompt_tokens_total counter\nmock:prompt_tokens_total {}\n",
        st.running.load(Ordering::Relaxed),
        st.waiting.load(Ordering::Relaxed),
        st.requests
            .load(Ordering::Relaxed)
            .saturating_sub(st.failed.load(Ordering::Relaxed)),
        st.failed.load(Ordering::Relaxed),
        st.generated_tokens.load(Ordering::Relaxed),
        st.prompt_tokens.load(Ordering::Relaxed),
    );
    s.finish(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response())
}

/// /metrics under the imitated engine's own metric names.
fn engine_metrics(mode: &EngineMode) -> String {
    let g = &mode.engine.gauges;
    let hit_rate = {
        let p = g.prompt_tokens.load(Ordering::Relaxed);
        if p == 0 {
            0.0
        } else {
            g.prefix_hit_tokens.load(Ordering::Relaxed) as f64 / p as f64
        }
    };
    let mut out = String::new();
    for (key, name) in &mode.metric_names {
        let (kind, v) = match key.as_str() {
            "running" => ("gauge", g.running.load(Ordering::Relaxed) as f64),
            "waiting" => ("gauge", g.waiting.load(Ordering::Relaxed) as f64),
            "kv_cache_usage" => ("gauge", g.kv_usage_ppm.load(Ordering::Relaxed) as f64 / 1e6),
            "prefix_cache_hit_rate" => ("gauge", hit_rate),
            "prompt_tokens_total" => ("counter", g.prompt_tokens.load(Ordering::Relaxed) as f64),
            "generation_tokens_total" => ("counter", g.generated.load(Ordering::Relaxed) as f64),
            "preemptions_total" => ("counter", g.preemptions.load(Ordering::Relaxed) as f64),
            _ => continue,
        };
        out.push_str(&format!(
            "# TYPE {name} {kind}\n{name}{{model_name=\"mock\"}} {v}\n"
        ));
    }
    out
}

/// The imitated machine and engine, for `servetune mock-engine --profile …`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// Imitate this engine: vllm, sglang, trtllm or llamacpp. Its flags follow `--`.
    #[arg(long)]
    pub profile: Option<String>,
    /// The machine: h200, h100, a100, l4 or cpu.
    #[arg(long, default_value = "h100")]
    pub mock_hardware: String,
    /// GPUs on the node (tensor parallelism beyond them fails).
    #[arg(long, default_value_t = 1)]
    pub mock_gpus: u32,
    /// The GPUs the engine may use, as CUDA reads `CUDA_VISIBLE_DEVICES` (which sets it when
    /// the flag is absent): indices of the node's `--mock-gpus`, comma-separated. The engine
    /// then has that many GPUs and reports them (start-up line, `/v1/models`); an index the
    /// node lacks dies with CUDA's invalid device ordinal. Ignored on the cpu machine.
    #[arg(long, env = "CUDA_VISIBLE_DEVICES")]
    pub mock_visible_devices: Option<String>,
    /// CPU cores (what --threads competes for on the cpu machine).
    #[arg(long, default_value_t = 16)]
    pub mock_cores: u32,
    /// The model: 8b, 32b or 135m.
    #[arg(long, default_value = "8b")]
    pub mock_model: String,
    /// The engine version to report and to gate flags by (default: a recent one per profile).
    #[arg(long)]
    pub mock_version: Option<String>,
    /// Seconds of start-up before the port opens (loading weights).
    #[arg(long, default_value_t = 0.3)]
    pub mock_startup_s: f64,
    /// Step-time noise (log-normal sigma).
    #[arg(long, default_value_t = 0.02)]
    pub mock_noise: f64,
    /// Imitates losing the race for the port once: when this file does not exist, create it
    /// and fail as if another process had bound the port between the launcher's choice and
    /// the engine's bind (the launcher's `free_port` is check-then-use).
    #[arg(long)]
    pub mock_port_taken_once: Option<std::path::PathBuf>,
    /// The engine's command line (after `--`).
    #[arg(last = true)]
    pub engine_args: Vec<String>,
}

impl ProfileArgs {
    pub fn machine(&self, profile: &str) -> Result<profile::Machine, String> {
        let mut hw = sim::Hardware::preset(&self.mock_hardware, self.mock_cores.max(1))
            .ok_or_else(|| {
                format!(
                    "--mock-hardware {:?}: one of h200, h100, a100, l4, cpu",
                    self.mock_hardware
                )
            })?;
        if hw.sm > 0 {
            hw.gpus = self.mock_gpus.max(1);
        }
        let model = sim::ModelSpec::preset(&self.mock_model)
            .ok_or_else(|| format!("--mock-model {:?}: one of 8b, 32b, 135m", self.mock_model))?;
        if !self.mock_noise.is_finite() || !(0.0..=1.0).contains(&self.mock_noise) {
            return Err(format!(
                "--mock-noise must be in [0, 1], got {}",
                self.mock_noise
            ));
        }
        if !self.mock_startup_s.is_finite() || self.mock_startup_s < 0.0 {
            return Err(format!(
                "--mock-startup-s must be >= 0, got {}",
                self.mock_startup_s
            ));
        }
        Ok(profile::Machine {
            hw,
            model,
            version: self
                .mock_version
                .clone()
                .unwrap_or_else(|| profile::default_version(profile).to_owned()),
        })
    }
}

impl ProfileArgs {
    /// The GPUs `--mock-visible-devices` (`CUDA_VISIBLE_DEVICES`) gives the engine on `hw`:
    /// `None` for the whole node (unset, or a CPU machine); an index the node lacks, one listed
    /// twice or none at all dies as CUDA does.
    pub fn visible_devices(&self, hw: &sim::Hardware) -> Result<Option<Vec<u32>>, profile::Fatal> {
        let Some(raw) = self.mock_visible_devices.as_deref() else {
            return Ok(None);
        };
        if hw.sm == 0 {
            return Ok(None);
        }
        let dead = |log: String| profile::Fatal {
            log,
            exit_code: 1,
            after_s: 0.5,
        };
        let mut devices: Vec<u32> = Vec::new();
        for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.parse::<u32>() {
                Ok(d) if d < hw.gpus && !devices.contains(&d) => devices.push(d),
                _ => {
                    return Err(dead(format!(
                        "RuntimeError: CUDA error: invalid device ordinal (CUDA_VISIBLE_DEVICES={raw}: {item:?} is not a device of this node's {} GPUs, or is listed twice)\n",
                        hw.gpus
                    )))
                }
            }
        }
        if devices.is_empty() {
            return Err(dead(format!(
                "RuntimeError: No CUDA GPUs are available (CUDA_VISIBLE_DEVICES={raw:?})\n"
            )));
        }
        Ok(Some(devices))
    }
}

/// Prints a start-up failure as the engine would, after its start-up time; the exit code.
async fn die(f: profile::Fatal) -> i32 {
    tokio::time::sleep(Duration::from_secs_f64(f.after_s)).await;
    eprint!("{}", f.log);
    f.exit_code
}

/// `servetune mock-engine --profile P -- ARGS`: behaves as engine P started with ARGS. Returns
/// the exit code.
pub async fn run_profile_cli(p: &ProfileArgs, mut cfg: MockConfig) -> anyhow::Result<i32> {
    let name = p.profile.clone().unwrap_or_default();
    let mut m = p.machine(&name).map_err(anyhow::Error::msg)?;
    let devices = p.visible_devices(&m.hw);
    if let Ok(Some(d)) = &devices {
        m.hw.gpus = d.len() as u32;
    }
    let launch = match (profile::parse(&name, &p.engine_args, &m), devices.clone()) {
        (Ok(profile::Parsed::Print(text)), _) => {
            print!("{text}");
            return Ok(0);
        }
        (Err(f), _) | (_, Err(f)) => return Ok(die(f).await),
        (Ok(profile::Parsed::Serve(l)), Ok(_)) => l,
    };
    let devices = devices.ok().flatten();
    let on = devices.as_ref().map_or(String::new(), |d| {
        let d: Vec<String> = d.iter().map(u32::to_string).collect();
        format!(" on devices {}", d.join(","))
    });
    eprintln!(
        "servetune mock-engine: imitating {name} {} on {} with model {} ({}){on}",
        m.version, m.hw.name, launch.model, m.model.name
    );
    tokio::time::sleep(Duration::from_secs_f64(p.mock_startup_s)).await;
    eprint!("{}", launch.banner);
    let lost_race = match &p.mock_port_taken_once {
        Some(path) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .is_ok(),
        None => false,
    };
    let bound = if lost_race {
        Err(std::io::Error::from(std::io::ErrorKind::AddrInUse))
    } else {
        TcpListener::bind((launch.host.as_str(), launch.port)).await
    };
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            // llama-server: "couldn't bind HTTP server socket"; uvicorn: "[Errno 98] ... address already in use".
            if name == "llamacpp" {
                eprintln!(
                    "srv    load_model: couldn't bind HTTP server socket, hostname: {}, port: {}",
                    launch.host, launch.port
                );
            } else {
                eprintln!("ERROR:    [Errno 98] error while attempting to bind on address ('{}', {}): address already in use ({e})", launch.host, launch.port);
            }
            return Ok(1);
        }
    };
    let mut settings = launch.settings.clone();
    settings.noise = p.mock_noise;
    let seed = cfg.seed;
    let sched = sim::Sched::new(settings, m.hw.clone(), m.model.clone(), seed);
    let crash = Arc::new(Notify::new());
    let c2 = crash.clone();
    let total = m.hw.mem_gib;
    let oom_name = name.clone();
    let engine = live::Engine::start(sched, launch.oom_prefill_tokens, move |tokens| {
        eprintln!("{}", engines::runtime_oom_log(&oom_name, tokens, total));
        // Wake the server (it drops every connection) and the CLI (it exits 1).
        c2.notify_waiters();
        c2.notify_one();
    });
    let s = profile::space(&name, &m.version).map_err(anyhow::Error::msg)?;
    let metric_names = s
        .engine
        .metrics
        .iter()
        .filter_map(|(k, names)| names.first().map(|n| (k.clone(), n.clone())))
        .collect();
    cfg.model = launch.model.clone();
    let handle = serve_mode(
        listener,
        cfg,
        Some(EngineMode {
            profile: name.clone(),
            engine,
            metric_names,
            devices,
        }),
        crash,
    )?;
    match name.as_str() {
        "vllm" => eprintln!("(APIServer pid={}) INFO [api_server.py:1333] Starting vLLM API server 0 on {}\n(APIServer pid={0}) INFO:     Application startup complete.", std::process::id(), handle.base_url()),
        "sglang" => eprintln!("The server is fired up and ready to roll!"),
        "trtllm" => eprintln!("INFO:     Uvicorn running on {} (Press CTRL+C to quit)", handle.base_url()),
        _ => eprintln!("main: server is listening on {} - starting the main loop", handle.base_url()),
    }
    tokio::select! {
        _ = handle.crashed() => Ok(1),
        _ = crate::signals::terminated() => {
            handle.stop().await;
            Ok(0)
        }
    }
}

/// `servetune mock-engine`: serve until Ctrl-C; exit 1 after a configured crash.
pub async fn run_cli(host: &str, port: u16, cfg: MockConfig) -> anyhow::Result<i32> {
    let listener = TcpListener::bind((host, port)).await?;
    let handle = serve(listener, cfg)?;
    eprintln!("mock engine listening on {}", handle.base_url());
    tokio::select! {
        _ = handle.crashed() => {
            eprintln!("mock engine: crash_after reached, exiting");
            Ok(1)
        }
        _ = crate::signals::terminated() => {
            handle.stop().await;
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        p: ProfileArgs,
    }

    fn args(extra: &[&str]) -> ProfileArgs {
        Cli::try_parse_from(std::iter::once("mock-engine").chain(extra.iter().copied()))
            .unwrap()
            .p
    }

    /// The engine sees the devices it was given (`CUDA_VISIBLE_DEVICES`, here through its flag:
    /// the process environment is the binary's to read), refuses tensor parallelism beyond
    /// them with vLLM's world-size message, and dies as CUDA does on a device the node lacks.
    #[test]
    fn visible_devices_bound_the_engine_and_a_missing_one_dies_as_cuda_does() {
        let p = args(&["--mock-gpus", "8", "--mock-visible-devices", "2,3"]);
        let mut m = p.machine("vllm").unwrap();
        let d = p.visible_devices(&m.hw).unwrap();
        assert_eq!(d, Some(vec![2, 3]));
        m.hw.gpus = 2;
        let argv = |tp: &str| -> Vec<String> {
            ["serve", "m", "--port", "1", "--tensor-parallel-size", tp]
                .map(String::from)
                .to_vec()
        };
        assert!(matches!(
            profile::parse("vllm", &argv("2"), &m),
            Ok(profile::Parsed::Serve(_))
        ));
        let Err(f) = profile::parse("vllm", &argv("4"), &m) else {
            panic!("tp 4 on 2 devices must fail")
        };
        assert!(
            f.log
                .contains("World size (4) is larger than the number of available GPUs (2)"),
            "{}",
            f.log
        );
        for bad in ["8", "1,1", "a", ""] {
            let p = args(&["--mock-gpus", "8", "--mock-visible-devices", bad]);
            let f = p
                .visible_devices(&p.machine("vllm").unwrap().hw)
                .unwrap_err();
            assert_eq!(f.exit_code, 1);
            assert!(
                f.log
                    .starts_with("RuntimeError: CUDA error: invalid device ordinal")
                    || f.log
                        .starts_with("RuntimeError: No CUDA GPUs are available"),
                "{bad}: {}",
                f.log
            );
        }
        // Unset: the whole node; a CPU machine ignores the variable, as vLLM's CPU build does.
        let mut p = args(&["--mock-gpus", "8", "--mock-visible-devices", "9"]);
        let cpu = args(&["--mock-hardware", "cpu", "--mock-visible-devices", "9"]);
        assert_eq!(
            cpu.visible_devices(&cpu.machine("vllm").unwrap().hw),
            Ok(None)
        );
        p.mock_visible_devices = None;
        assert_eq!(p.visible_devices(&p.machine("vllm").unwrap().hw), Ok(None));
    }
}
