//! The streaming request function: one OpenAI-compatible request, measured as
//! `vllm bench serve` measures it (`vllm/benchmarks/lib/endpoint_request_func.py`).
//!
//! Timestamps are taken once per body read, like vLLM's `time.perf_counter()` per received chunk:
//! SSE events that arrive in one read share a timestamp. Every failure becomes a
//! [`RequestRecord`] with a [`FailureKind`] and a message; nothing here panics or hangs past the
//! request's time limit.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::record::{FailureKind, RequestRecord};
use super::sse::SseDecoder;

/// Which OpenAI API the requests use.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
/// The request API a run speaks (`--backend`, vLLM's name for the flag).
#[serde(rename_all = "kebab-case")]
pub enum RequestApi {
    /// `/v1/completions` with a `prompt`.
    Openai,
    /// `/v1/chat/completions` with one user message.
    #[value(name = "openai-chat")]
    OpenaiChat,
}

impl RequestApi {
    pub fn default_endpoint(self) -> &'static str {
        match self {
            RequestApi::Openai => "/v1/completions",
            RequestApi::OpenaiChat => "/v1/chat/completions",
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            RequestApi::Openai => "openai",
            RequestApi::OpenaiChat => "openai-chat",
        }
    }
}

/// The request field that carries the output length. Engines differ: vLLM's completions API
/// takes `max_tokens`, its chat API `max_completion_tokens`; older servers know only `max_tokens`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    #[value(name = "max_tokens")]
    MaxTokens,
    #[value(name = "max_completion_tokens")]
    MaxCompletionTokens,
    /// Send both (harmless for servers that accept either).
    Both,
}

/// Everything about a request that is the same for the whole run.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    pub url: String,
    pub backend: RequestApi,
    pub model: String,
    pub max_tokens_field: MaxTokensField,
    pub ignore_eos: bool,
    pub temperature: Option<f64>,
    /// Extra top-level body fields (`--extra-body`), merged last.
    pub extra_body: Map<String, Value>,
    /// `Authorization: Bearer ...`, from `OPENAI_API_KEY` as vLLM does.
    pub api_key: Option<String>,
    pub timeout: Duration,
    /// Keep the generated text in the record (for `--save-detailed` and tokenizer fallback).
    pub keep_text: bool,
    /// Set once the server has been seen closing kept-alive connections (llama-server does
    /// after every stream): from then on every request asks for `Connection: close`, so no
    /// request is ever written to a connection the server is closing.
    pub connection_close: Arc<std::sync::atomic::AtomicBool>,
}

impl RequestTemplate {
    /// The JSON body for one prompt.
    pub fn body(&self, prompt: &str, output_len: u64) -> Vec<u8> {
        let mut m = Map::new();
        m.insert("model".into(), Value::String(self.model.clone()));
        match self.backend {
            RequestApi::Openai => {
                m.insert("prompt".into(), Value::String(prompt.to_owned()));
                m.insert("repetition_penalty".into(), Value::from(1.0));
            }
            RequestApi::OpenaiChat => {
                m.insert(
                    "messages".into(),
                    serde_json::json!([{ "role": "user", "content": prompt }]),
                );
            }
        }
        // Current vLLM sends a temperature only when one is given.
        if let Some(t) = self.temperature {
            m.insert("temperature".into(), Value::from(t));
        }
        let n = Value::from(output_len);
        match self.max_tokens_field {
            MaxTokensField::MaxTokens => {
                m.insert("max_tokens".into(), n);
            }
            MaxTokensField::MaxCompletionTokens => {
                m.insert("max_completion_tokens".into(), n);
            }
            MaxTokensField::Both => {
                m.insert("max_tokens".into(), n.clone());
                m.insert("max_completion_tokens".into(), n);
            }
        }
        m.insert("stream".into(), Value::Bool(true));
        m.insert(
            "stream_options".into(),
            serde_json::json!({ "include_usage": true }),
        );
        if self.ignore_eos {
            m.insert("ignore_eos".into(), Value::Bool(true));
        }
        for (k, v) in &self.extra_body {
            m.insert(k.clone(), v.clone());
        }
        serde_json::to_vec(&Value::Object(m)).expect("a JSON map always serialises")
    }
}

/// Lets the runner cancel requests in flight (early abort).
#[derive(Debug, Default)]
pub struct AbortSignal {
    flag: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl AbortSignal {
    pub fn abort(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }
    pub fn is_aborted(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }
    pub async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            if self.is_aborted() {
                return;
            }
            n.await;
        }
    }
}

/// The HTTP clients of a run: HTTP/1.1, kept-alive connections (`pooled`), and one that never
/// reuses a connection (`fresh`), for servers seen closing connections after a response.
///
/// llama-server (cpp-httplib) answers a stream with `Keep-Alive` and then closes the socket as
/// soon as the stream ends, so the pool holds connections that are being closed. When many
/// streams end in the same decode step (`--ignore-eos`, equal output lengths), as many waiting
/// requests take those connections at once; a request written to one fails before any response
/// byte ("connection closed before message completed"). A resend through the same pool can
/// take another such connection, which is how one request in 48 failed at 16 concurrent
/// streams. Resends, and every request after the first such close, go through `fresh`.
#[derive(Debug, Clone)]
pub struct Clients {
    pub pooled: reqwest::Client,
    pub fresh: reqwest::Client,
}

/// Builds the clients used for every request of a run.
pub fn http_client(max_connections_hint: usize) -> reqwest::Result<Clients> {
    let build = |idle: usize| {
        reqwest::Client::builder()
            .http1_only()
            .pool_max_idle_per_host(idle)
            .pool_idle_timeout(crate::util::ENGINE_POOL_IDLE)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(30))
            .build()
    };
    Ok(Clients {
        pooled: build(max_connections_hint.max(1))?,
        fresh: build(0)?,
    })
}

/// How many times a request that failed before any response byte is sent in all.
pub const SEND_ATTEMPTS: usize = 3;

#[derive(Deserialize)]
struct StreamChunk<'a> {
    /// The first choice only (vLLM's client reads `choices[0]`); read without collecting the
    /// array, so an event costs no allocation unless its text has escapes.
    #[serde(borrow, default)]
    choices: FirstChoice<'a>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<Value>,
}

/// The first element of the `choices` array (`None` for `null`, an empty or absent array).
#[derive(Default)]
struct FirstChoice<'a>(Option<Choice<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for FirstChoice<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = FirstChoice<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of choices or null")
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(FirstChoice(None))
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(self)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let first = seq.next_element::<Choice<'a>>()?;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(FirstChoice(first))
            }
        }
        d.deserialize_option(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// State of one response while its events arrive.
struct StreamState {
    rec: RequestRecord,
    text: String,
    got_choice: bool,
    last_ts: f64,
    done: bool,
    finished: bool,
    error: Option<(FailureKind, String)>,
    reads_text_events: u32,
}

impl StreamState {
    fn new(rec: RequestRecord) -> Self {
        StreamState {
            rec,
            text: String::new(),
            got_choice: false,
            last_ts: 0.0,
            done: false,
            finished: false,
            error: None,
            reads_text_events: 0,
        }
    }

    fn on_event(&mut self, data: &str, ts: f64) {
        if self.error.is_some() || self.done {
            return;
        }
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        if data.is_empty() {
            return;
        }
        let chunk: StreamChunk = match serde_json::from_str(data) {
            Ok(c) => c,
            Err(e) => {
                self.error = Some((
                    FailureKind::MalformedStream,
                    format!("event is not valid JSON ({e}): {}", excerpt(data)),
                ));
                return;
            }
        };
        if let Some(err) = chunk.error {
            self.error = Some((
                FailureKind::ServerError,
                format!("server error in stream: {}", excerpt(&err.to_string())),
            ));
            return;
        }
        if let Some(u) = chunk.usage {
            if u.prompt_tokens.is_some() {
                self.rec.server_prompt_tokens = u.prompt_tokens;
            }
            // vLLM's `if not output_len`: a zero count falls back to the tokenizer.
            if let Some(n) = u.completion_tokens.filter(|&n| n > 0) {
                self.rec.server_output_tokens = Some(n);
            }
        }
        let Some(choice) = chunk.choices.0 else {
            return;
        };
        if choice.finish_reason.is_some() {
            self.finished = true;
        }
        if !self.got_choice {
            self.got_choice = true;
            self.rec.ttft_s = ts;
        } else {
            self.rec.itl_s.push(ts - self.last_ts);
        }
        self.last_ts = ts;
        let piece = match (choice.text, choice.delta) {
            (Some(t), _) => Some(t),
            (None, Some(d)) => d.content.or(d.reasoning_content).or(d.reasoning),
            (None, None) => None,
        };
        if let Some(p) = piece.filter(|p| !p.is_empty()) {
            self.text.push_str(&p);
            self.reads_text_events += 1;
        }
    }

    /// Closes the read that just ended: remember when text arrived and how much.
    fn end_read(&mut self, ts: f64) {
        if self.reads_text_events > 0 {
            self.rec.text_reads.push((ts, self.reads_text_events));
            self.reads_text_events = 0;
        }
    }
}

fn excerpt(s: &str) -> String {
    crate::util::excerpt(s, 300)
}

/// Error text with its causes, as one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// A request that failed before any response byte because the server closed (or reset) the
/// connection it was written to: hyper's "connection closed before message completed", a
/// cancelled request, or a reset / broken pipe. The server never began answering it, so it is
/// safe to send again; a request whose response began is never resent.
fn closed_before_response(e: &reqwest::Error) -> bool {
    if e.is_connect() || e.is_timeout() {
        return false;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted | K::UnexpectedEof
            ) {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// Sends one request and measures it. `bench_start` anchors `start_s`.
pub async fn send_request(
    client: &Clients,
    tpl: &RequestTemplate,
    body: Vec<u8>,
    bench_start: Instant,
    abort: &Arc<AbortSignal>,
) -> RequestRecord {
    let st = Instant::now();
    let mut state = StreamState::new(RequestRecord {
        start_s: st.duration_since(bench_start).as_secs_f64(),
        ..Default::default()
    });
    let work = run_stream(client, tpl, body, st, &mut state);
    let outcome = tokio::select! {
        r = tokio::time::timeout(tpl.timeout, work) => match r {
            Ok(r) => r,
            Err(_) => Err((FailureKind::Timeout, format!("no complete response within {:.1} s", tpl.timeout.as_secs_f64()))),
        },
        _ = abort.wait() => Err((FailureKind::Aborted, "run aborted while the request was in flight".to_owned())),
    };
    let mut rec = std::mem::take(&mut state.rec);
    // vLLM: latency ends at the last event with `choices` (the usage chunk and [DONE] that may
    // follow do not count); a failed request's latency is the time until it failed.
    rec.latency_s = if state.got_choice && outcome.is_ok() && state.error.is_none() {
        state.last_ts
    } else {
        st.elapsed().as_secs_f64()
    };
    let outcome = outcome.and_then(|()| match state.error.take() {
        Some(e) => Err(e),
        None if !state.got_choice => Err((
            FailureKind::NoContent,
            "Never received a valid chunk to calculate TTFT.".to_owned(),
        )),
        None if !state.done && !state.finished => Err((
            FailureKind::StreamInterrupted,
            "stream ended before [DONE] and without a finish_reason".to_owned(),
        )),
        None => Ok(()),
    });
    match outcome {
        Ok(()) => {
            rec.success = true;
            rec.output_tokens = rec.server_output_tokens.unwrap_or(0);
        }
        Err((kind, msg)) => {
            rec.success = false;
            rec.failure = Some(kind);
            rec.error = msg;
        }
    }
    if tpl.keep_text || (rec.success && rec.server_output_tokens.is_none()) {
        rec.generated_text = Some(std::mem::take(&mut state.text));
    }
    rec
}

async fn run_stream(
    client: &Clients,
    tpl: &RequestTemplate,
    body: Vec<u8>,
    st: Instant,
    state: &mut StreamState,
) -> Result<(), (FailureKind, String)> {
    use std::sync::atomic::Ordering;
    let body = bytes::Bytes::from(body); // cheap to clone for a resend
    let send = |close: bool| {
        let c = if close { &client.fresh } else { &client.pooled };
        let mut req = c
            .post(&tpl.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if close {
            req = req.header(reqwest::header::CONNECTION, "close");
        }
        if let Some(k) = &tpl.api_key {
            req = req.bearer_auth(k);
        }
        req.send()
    };
    let mut first = send(tpl.connection_close.load(Ordering::Relaxed)).await;
    for _ in 1..SEND_ATTEMPTS {
        match &first {
            // The server closed the connection as we wrote to it: it never saw the request.
            // Send it again on a new connection, and stop reusing connections for this run.
            Err(e) if closed_before_response(e) => {
                tpl.connection_close.store(true, Ordering::Relaxed);
                first = send(true).await;
            }
            _ => break,
        }
    }
    let mut resp = first.map_err(|e| {
        let kind = if e.is_connect() {
            FailureKind::Connect
        } else if e.is_timeout() {
            FailureKind::Timeout
        } else {
            FailureKind::StreamInterrupted
        };
        (kind, error_chain(&e))
    })?;
    let status = resp.status();
    if status != reqwest::StatusCode::OK {
        let text = tokio::time::timeout(Duration::from_secs(5), resp.text())
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default();
        return Err((
            FailureKind::HttpStatus,
            format!("HTTP {}: {}", status.as_u16(), excerpt(text.trim())),
        ));
    }
    let mut decoder = SseDecoder::new();
    loop {
        let chunk = resp.chunk().await.map_err(|e| {
            (
                FailureKind::StreamInterrupted,
                format!("stream interrupted: {}", error_chain(&e)),
            )
        })?;
        let Some(bytes) = chunk else { break };
        let ts = st.elapsed().as_secs_f64();
        decoder
            .feed(&bytes, |ev| state.on_event(ev, ts))
            .map_err(|e| (FailureKind::MalformedStream, e.to_string()))?;
        state.end_read(ts);
        if state.error.is_some() {
            break;
        }
        if state.done {
            // Read the rest of the body (the chunked terminator) so that the connection goes
            // back to the pool instead of being closed; vLLM also reads to the end.
            let drain = async { while let Ok(Some(_)) = resp.chunk().await {} };
            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            return Ok(());
        }
    }
    let ts = st.elapsed().as_secs_f64();
    decoder
        .finish(|ev| state.on_event(ev, ts))
        .map_err(|e| (FailureKind::MalformedStream, e.to_string()))?;
    state.end_read(ts);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpl(backend: RequestApi) -> RequestTemplate {
        RequestTemplate {
            url: "http://127.0.0.1:1/v1/completions".into(),
            backend,
            model: "m".into(),
            max_tokens_field: MaxTokensField::MaxTokens,
            ignore_eos: true,
            temperature: None,
            extra_body: Map::new(),
            api_key: None,
            timeout: Duration::from_secs(1),
            keep_text: false,
            connection_close: Default::default(),
        }
    }

    #[test]
    fn completions_body_has_vllm_fields() {
        let b: Value = serde_json::from_slice(&tpl(RequestApi::Openai).body("hi", 7)).unwrap();
        assert_eq!(b["prompt"], "hi");
        assert_eq!(b["max_tokens"], 7);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        assert!(b.get("messages").is_none());
    }

    #[test]
    fn chat_body_and_max_completion_tokens() {
        let mut t = tpl(RequestApi::OpenaiChat);
        t.max_tokens_field = MaxTokensField::MaxCompletionTokens;
        t.ignore_eos = false;
        t.extra_body.insert("top_k".into(), Value::from(5));
        let b: Value = serde_json::from_slice(&t.body("hi", 3)).unwrap();
        assert_eq!(b["messages"][0]["content"], "hi");
        assert_eq!(b["max_completion_tokens"], 3);
        assert!(b.get("max_tokens").is_none());
        assert!(b.get("ignore_eos").is_none());
        assert!(
            b.get("temperature").is_none(),
            "no temperature unless given"
        );
        assert_eq!(b["top_k"], 5);
    }

    fn state() -> StreamState {
        StreamState::new(RequestRecord::default())
    }

    #[test]
    fn events_in_one_read_share_a_timestamp_like_vllm() {
        let mut s = state();
        s.on_event(r#"{"choices":[{"text":"a"}]}"#, 0.5);
        s.end_read(0.5);
        s.on_event(r#"{"choices":[{"text":"b"}]}"#, 0.6);
        s.on_event(r#"{"choices":[{"text":"c"}]}"#, 0.6);
        s.end_read(0.6);
        s.on_event(
            r#"{"choices":[{"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":3}}"#,
            0.7,
        );
        s.end_read(0.7);
        s.on_event("[DONE]", 0.7);
        assert_eq!(s.rec.ttft_s, 0.5);
        assert_eq!(s.rec.itl_s.len(), 3);
        assert!((s.rec.itl_s[0] - 0.1).abs() < 1e-12);
        assert_eq!(s.rec.itl_s[1], 0.0);
        assert_eq!(s.rec.text_reads, vec![(0.5, 1), (0.6, 2)]);
        assert_eq!(s.rec.server_output_tokens, Some(3));
        assert_eq!(s.rec.server_prompt_tokens, Some(4));
        assert_eq!(s.text, "abc");
        assert!(s.done && s.finished);
    }

    #[test]
    fn chat_deltas_and_usage_only_chunk() {
        let mut s = state();
        s.on_event(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, 0.2);
        s.on_event(r#"{"choices":[{"delta":{"content":"x\"y"}}]}"#, 0.3);
        s.on_event(r#"{"choices":[],"usage":{"completion_tokens":2}}"#, 0.4);
        assert_eq!(
            s.rec.ttft_s, 0.2,
            "vLLM counts the first chunk with choices"
        );
        assert_eq!(s.text, "x\"y");
        assert_eq!(s.rec.server_output_tokens, Some(2));
        assert_eq!(s.rec.itl_s.len(), 1);
    }

    /// Only `choices[0]` counts; `null`, `[]` and an absent `choices` are events without one,
    /// and a malformed later choice still fails the event.
    #[test]
    fn the_first_choice_is_read_and_the_rest_skipped() {
        let mut s = state();
        s.on_event(r#"{"choices":null,"usage":{"prompt_tokens":3}}"#, 0.1);
        s.on_event(r#"{"id":"x"}"#, 0.15);
        assert_eq!(s.rec.ttft_s, 0.0);
        assert_eq!(s.rec.server_prompt_tokens, Some(3));
        s.on_event(
            r#"{"choices":[{"text":"a"},{"text":"b","extra":[1,{"k":2}]}]}"#,
            0.2,
        );
        s.on_event(
            r#"{"choices":[{"text":"c","finish_reason":"length"}]}"#,
            0.3,
        );
        assert_eq!(s.text, "ac");
        assert_eq!(s.rec.ttft_s, 0.2);
        assert!(s.finished && s.error.is_none());
        let mut s = state();
        s.on_event(r#"{"choices":[{"text":"a"},{"text":]}"#, 0.2);
        assert!(matches!(s.error, Some((FailureKind::MalformedStream, _))));
    }

    #[test]
    fn malformed_and_error_events_fail_the_request() {
        let mut s = state();
        s.on_event("{not json", 0.1);
        assert_eq!(s.error.as_ref().unwrap().0, FailureKind::MalformedStream);
        let mut s = state();
        s.on_event(r#"{"error":{"message":"boom","code":500}}"#, 0.1);
        assert_eq!(s.error.as_ref().unwrap().0, FailureKind::ServerError);
    }
}
