//! A mock OpenAI-compatible engine for tests and for trying servetune without a GPU:
//! `/v1/completions` and `/v1/chat/completions` (streaming and not), `/v1/models`, `/health`,
//! `/tokenize`, `/detokenize`, `/metrics`. Its latency, chunking, capacity and failures are set by
//! [`MockConfig`]; tokens are released on an absolute schedule (token k at
//! `start + ttft + k·itl`), so timer granularity does not accumulate and the configured
//! latencies are what a client should measure.
//!
//! `serve` runs in-process (tests start it on port 0); `servetune mock-engine` wraps it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
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

struct Shared {
    cfg: MockConfig,
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
    cfg.validate()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let addr = listener.local_addr()?;
    let stats = Arc::new(MockStats::default());
    let crash = Arc::new(Notify::new());
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
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        cfg,
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
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
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    if s.loading() {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "Loading model");
    }
    s.finish(Json(json!({"status": "ok"})).into_response())
}

async fn models(State(s): State<Arc<Shared>>) -> Response {
    s.finish(
        Json(json!({"object": "list", "data": [{
            "id": s.cfg.model, "object": "model", "created": s.created, "owned_by": "servetune-mock",
            "meta": {"n_vocab": s.cfg.vocab_size}
        }]}))
        .into_response(),
    )
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

#[derive(Deserialize)]
struct GenReq {
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
}

async fn completions(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    generate(s, body, false).await
}

async fn chat(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    generate(s, body, true).await
}

/// splitmix64: a deterministic per-request stream of pseudo-random numbers.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn prompt_text(r: &GenReq) -> String {
    if let Some(p) = &r.prompt {
        return match p {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
    }
    let mut out = String::new();
    for m in r.messages.iter().flatten() {
        match m.get("content") {
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        out.push_str(t);
                    }
                }
            }
            _ => {}
        }
        out.push(' ');
    }
    out
}

/// A response whose body fails at once: hyper aborts the connection, which is what a client
/// of a crashed process sees.
fn dead_connection() -> Response {
    let body = futures_util::stream::once(async {
        Err::<Bytes, _>(std::io::Error::other("engine crashed"))
    });
    Response::new(Body::from_stream(body))
}

async fn generate(s: Arc<Shared>, body: Bytes, chat: bool) -> Response {
    if s.crashed.load(Ordering::SeqCst) {
        return dead_connection();
    }
    let n_req = s.stats.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(limit) = s.cfg.crash_after {
        if n_req > limit {
            s.crashed.store(true, Ordering::SeqCst);
            s.crash.notify_waiters();
            s.crash.notify_one();
            return dead_connection();
        }
    }
    if s.loading() {
        s.stats.failed.fetch_add(1, Ordering::Relaxed);
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "Loading model");
    }
    let req: GenReq = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            s.stats.failed.fetch_add(1, Ordering::Relaxed);
            return s.finish(error_response(
                StatusCode::BAD_REQUEST,
                &format!("invalid request body: {e}"),
            ));
        }
    };
    let rnd = mix(s.cfg.seed ^ n_req);
    if s.cfg.failure_rate > 0.0 && (rnd >> 11) as f64 / (1u64 << 53) as f64 <= s.cfg.failure_rate {
        s.stats.failed.fetch_add(1, Ordering::Relaxed);
        return s.finish(error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected failure",
        ));
    }
    let prompt = prompt_text(&req);
    let prompt_tokens = s.tokenizer.count(&prompt) as u64;
    s.stats
        .prompt_tokens
        .fetch_add(prompt_tokens, Ordering::Relaxed);
    let n = req
        .max_completion_tokens
        .or(req.max_tokens)
        .unwrap_or(s.cfg.default_max_tokens)
        .max(1);
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let id = format!("{}-{n_req}", if chat { "chatcmpl" } else { "cmpl" });
    let job = Job {
        s: s.clone(),
        id,
        chat,
        n,
        prompt_tokens,
        rnd,
        include_usage,
    };
    if req.stream {
        let resp = Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(job.stream()))
            .expect("static headers are valid");
        s.finish(resp)
    } else {
        let text = job.run_to_end().await;
        let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": n,
                           "total_tokens": prompt_tokens + n});
        let v = if chat {
            json!({"id": format!("chatcmpl-{n_req}"), "object": "chat.completion", "created": s.created,
                   "model": s.cfg.model, "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": "length"}], "usage": usage})
        } else {
            json!({"id": format!("cmpl-{n_req}"), "object": "text_completion", "created": s.created,
                   "model": s.cfg.model, "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                   "usage": usage})
        };
        s.finish(Json(v).into_response())
    }
}

struct Job {
    s: Arc<Shared>,
    id: String,
    chat: bool,
    n: u64,
    prompt_tokens: u64,
    rnd: u64,
    include_usage: bool,
}

/// Decrements the running gauge when a request ends, however it ends (client gone included).
struct RunningGuard {
    stats: Arc<MockStats>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.stats.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Job {
    async fn admit(&self) -> RunningGuard {
        let permit = match &self.s.slots {
            Some(sem) => {
                self.s.stats.waiting.fetch_add(1, Ordering::Relaxed);
                let p = sem.clone().acquire_owned().await.expect("never closed");
                self.s.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                Some(p)
            }
            None => None,
        };
        let now = self.s.stats.running.fetch_add(1, Ordering::Relaxed) + 1;
        self.s.stats.max_running.fetch_max(now, Ordering::Relaxed);
        RunningGuard {
            stats: self.s.stats.clone(),
            _permit: permit,
        }
    }

    fn token_text(&self, k: u64) -> String {
        format!(
            " t{}",
            mix(self.rnd ^ k) % self.s.cfg.vocab_size.max(2) as u64
        )
    }

    async fn run_to_end(&self) -> String {
        let _g = self.admit().await;
        if self.s.cfg.hang {
            std::future::pending::<()>().await;
        }
        let start = tokio::time::Instant::now();
        let last = start
            + Duration::from_secs_f64(
                (self.s.cfg.ttft_ms + self.s.cfg.itl_ms * (self.n - 1) as f64) / 1000.0,
            );
        tokio::time::sleep_until(last).await;
        self.s
            .stats
            .generated_tokens
            .fetch_add(self.n, Ordering::Relaxed);
        (0..self.n).map(|k| self.token_text(k)).collect()
    }

    fn chunk(&self, text: &str, finish: Option<&str>, first: bool) -> String {
        let fin = match finish {
            Some(f) => format!("\"{f}\""),
            None => "null".into(),
        };
        let text = serde_json::to_string(text).expect("strings serialise");
        if self.chat {
            let role = if first { "\"role\":\"assistant\"," } else { "" };
            format!(
                "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":\"{}\",\"choices\":[{{\"index\":0,\"delta\":{{{role}\"content\":{text}}},\"finish_reason\":{fin}}}]}}\n\n",
                self.id, self.s.created, self.s.cfg.model
            )
        } else {
            format!(
                "data: {{\"id\":\"{}\",\"object\":\"text_completion\",\"created\":{},\"model\":\"{}\",\"choices\":[{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":{fin}}}]}}\n\n",
                self.id, self.s.created, self.s.cfg.model
            )
        }
    }

    /// The tokens due next: sleeps until the last of them is due, then formats one chunk.
    async fn emit(
        self,
        guard: RunningGuard,
        start: tokio::time::Instant,
        sent: u64,
    ) -> (Bytes, Phase) {
        let cfg = &self.s.cfg;
        let k = (cfg.tokens_per_chunk.max(1) as u64).min(self.n - sent);
        let last_token = sent + k - 1;
        let due = start
            + Duration::from_secs_f64((cfg.ttft_ms + cfg.itl_ms * last_token as f64) / 1000.0);
        tokio::time::sleep_until(due).await;
        let text: String = (sent..sent + k).map(|i| self.token_text(i)).collect();
        let done = sent + k >= self.n;
        let out = self.chunk(&text, done.then_some("length"), sent == 0);
        self.s
            .stats
            .generated_tokens
            .fetch_add(k, Ordering::Relaxed);
        if done {
            drop(guard);
            (Bytes::from(out), Phase::Tail(self))
        } else {
            (
                Bytes::from(out),
                Phase::Tokens {
                    job: self,
                    guard,
                    start,
                    sent: sent + k,
                },
            )
        }
    }

    fn tail(&self) -> Bytes {
        let mut out = String::new();
        if self.include_usage {
            let obj = if self.chat {
                "chat.completion.chunk"
            } else {
                "text_completion"
            };
            out.push_str(&format!(
                "data: {{\"id\":\"{}\",\"object\":\"{obj}\",\"created\":{},\"model\":\"{}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}}}}}\n\n",
                self.id, self.s.created, self.s.cfg.model, self.prompt_tokens, self.n, self.prompt_tokens + self.n
            ));
        }
        out.push_str("data: [DONE]\n\n");
        Bytes::from(out)
    }

    fn stream(self) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::unfold(Phase::Admit(self), |phase| async move {
            let shared = match &phase {
                Phase::Admit(j) | Phase::Tail(j) => j.s.clone(),
                Phase::Tokens { job, .. } => job.s.clone(),
                Phase::Done => return None,
            };
            let step = async move {
                match phase {
                    Phase::Admit(job) => {
                        let guard = job.admit().await;
                        if job.s.cfg.hang {
                            std::future::pending::<()>().await;
                        }
                        job.emit(guard, tokio::time::Instant::now(), 0).await
                    }
                    Phase::Tokens {
                        job,
                        guard,
                        start,
                        sent,
                    } => job.emit(guard, start, sent).await,
                    Phase::Tail(job) => (job.tail(), Phase::Done),
                    Phase::Done => unreachable!("handled above"),
                }
            };
            // A crash cuts every stream in flight: the error makes hyper abort the connection.
            tokio::select! {
                (bytes, next) = step => Some((Ok(bytes), next)),
                _ = shared.wait_crash() => Some((Err(std::io::Error::other("engine crashed")), Phase::Done)),
            }
        })
    }
}

impl Shared {
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

/// Where a streamed response stands.
enum Phase {
    Admit(Job),
    Tokens {
        job: Job,
        guard: RunningGuard,
        start: tokio::time::Instant,
        sent: u64,
    },
    Tail(Job),
    Done,
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
