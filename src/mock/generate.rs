//! The generation endpoints, `/v1/completions` and `/v1/chat/completions`: tokens released on
//! the plain mode's schedule, or, with an engine profile, as the engine model produces them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error_response, live, sim, MockStats, Shared};

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

pub(super) async fn completions(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    generate(s, body, false).await
}

pub(super) async fn chat(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
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
    if s.mode.is_some() && !s.cfg.hang {
        return modelled(job, &prompt, req.stream).await;
    }
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

/// Profile mode: the request goes through the engine model; the response starts when the first
/// token (or the refusal) comes back.
async fn modelled(job: Job, prompt: &str, stream: bool) -> Response {
    let s = job.s.clone();
    let mode = s.mode.as_ref().expect("checked by the caller");
    let ids: Vec<u64> = s
        .tokenizer
        .encode(prompt)
        .into_iter()
        .map(u64::from)
        .collect();
    let blocks = sim::block_hashes(&ids, mode.engine.block_size);
    let (ticket, mut rx) = mode.engine.submit(job.prompt_tokens, job.n, blocks);
    let first = tokio::select! {
        e = rx.recv() => e,
        _ = s.wait_crash() => None,
    };
    let (k, done) = match first {
        None => return dead_connection(),
        Some(live::Event::TooLong { prompt, limit }) => {
            s.stats.failed.fetch_add(1, Ordering::Relaxed);
            return s.finish(too_long(&mode.profile, prompt, limit));
        }
        Some(live::Event::Tokens { n, done }) => (n, done),
    };
    if !stream {
        let mut sent = k;
        let mut fin = done;
        while !fin {
            match tokio::select! { e = rx.recv() => e, _ = s.wait_crash() => None } {
                Some(live::Event::Tokens { n, done }) => {
                    sent += n;
                    fin = done;
                }
                _ => return dead_connection(),
            }
        }
        drop(ticket);
        s.stats.generated_tokens.fetch_add(sent, Ordering::Relaxed);
        let text: String = (0..sent).map(|i| job.token_text(i)).collect();
        let usage = json!({"prompt_tokens": job.prompt_tokens, "completion_tokens": sent,
                           "total_tokens": job.prompt_tokens + sent});
        let v = if job.chat {
            json!({"id": job.id, "object": "chat.completion", "created": s.created, "model": s.cfg.model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                   "usage": usage})
        } else {
            json!({"id": job.id, "object": "text_completion", "created": s.created, "model": s.cfg.model,
                   "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage})
        };
        return s.finish(Json(v).into_response());
    }
    struct St {
        job: Job,
        rx: tokio::sync::mpsc::UnboundedReceiver<live::Event>,
        _ticket: live::Ticket,
        sent: u64,
        next: Option<(u64, bool)>,
        tail: bool,
    }
    let st = St {
        job,
        rx,
        _ticket: ticket,
        sent: 0,
        next: Some((k, done)),
        tail: false,
    };
    let body = futures_util::stream::unfold(Some(st), |st| async move {
        let mut st = st?;
        if st.tail {
            return Some((Ok(st.job.tail()), None));
        }
        let ev = match st.next.take() {
            Some(e) => Some(e),
            None => {
                let s = st.job.s.clone();
                tokio::select! {
                    e = st.rx.recv() => match e {
                        Some(live::Event::Tokens { n, done }) => Some((n, done)),
                        _ => None,
                    },
                    _ = s.wait_crash() => None,
                }
            }
        };
        let Some((n, done)) = ev else {
            return Some((Err(std::io::Error::other("engine crashed")), None));
        };
        let text: String = (st.sent..st.sent + n)
            .map(|i| st.job.token_text(i))
            .collect();
        let chunk = st.job.chunk(&text, done.then_some("length"), st.sent == 0);
        st.job
            .s
            .stats
            .generated_tokens
            .fetch_add(n, Ordering::Relaxed);
        st.sent += n;
        st.tail = done;
        Some((Ok(Bytes::from(chunk)), Some(st)))
    });
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("static headers are valid");
    s.finish(resp)
}

/// The engine's answer to a prompt longer than its context (llama.cpp server-context.cpp;
/// TensorRT-LLM llm.py `_check_arguments`; vLLM/SGLang validation errors).
fn too_long(profile: &str, prompt: u64, limit: u64) -> Response {
    let v = match profile {
        "llamacpp" => {
            json!({"error": {"code": 400, "message": format!("request ({prompt} tokens) exceeds the available context size ({limit} tokens), try increasing it"), "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": limit}})
        }
        "trtllm" => {
            json!({"object": "error", "message": format!("The sum of prompt length ({prompt}), query length (0) should not exceed max_num_tokens ({limit})"), "type": "BadRequestError", "code": 400})
        }
        _ => {
            json!({"object": "error", "message": format!("This model's maximum context length is {limit} tokens. However, your request has {prompt} input tokens."), "type": "BadRequestError", "code": 400})
        }
    };
    (StatusCode::BAD_REQUEST, Json(v)).into_response()
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
