//! The load generator: datasets → arrivals → streaming requests → per-request records →
//! a summary identical to `vllm bench serve`'s, with an early-abort policy evaluated while the
//! records arrive. It never launches processes (that is `engine`'s job).

pub mod abort;
pub mod args;
pub mod arrival;
pub mod client;
pub mod dataset;
pub mod metrics;
pub mod output;
pub mod progress;
pub mod record;
pub mod sse;
pub mod stats;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{mpsc, Semaphore};

use abort::{AbortMonitor, AbortPolicy};
use client::{AbortSignal, RequestTemplate};
use dataset::SampleRequest;
use metrics::{Summary, SummaryConfig};
use record::{FailureKind, RequestRecord};

use crate::tokenizer::Tokenizer;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("invalid benchmark setting: {0}")]
    Config(String),
    #[error(transparent)]
    Dataset(#[from] dataset::DatasetError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("cannot create the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("cannot write results to {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// How requests are released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadShape {
    /// Requests per second; infinity sends everything at once (subject to concurrency).
    pub request_rate: f64,
    pub burstiness: f64,
    /// At most this many requests in flight (vLLM's semaphore).
    pub max_concurrency: Option<usize>,
    /// Closed loop: `max_concurrency` workers each send their next request as soon as the
    /// previous one finished (the arrival schedule is not used).
    pub closed_loop: bool,
    pub num_warmups: usize,
    pub seed: u64,
}

/// A fully prepared run.
pub struct BenchPlan {
    pub template: RequestTemplate,
    pub requests: Vec<SampleRequest>,
    pub shape: LoadShape,
    pub summary: SummaryConfig,
    pub abort: AbortPolicy,
    /// Counts output tokens when the server sends no usage.
    pub tokenizer: Option<Tokenizer>,
    pub progress: bool,
    pub label: String,
}

/// What a run produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchOutcome {
    /// Every record in dataset order, warm-ups first.
    pub records: Vec<RequestRecord>,
    pub summary: Summary,
    /// Why the run stopped early, if it did.
    pub aborted: Option<String>,
    /// Requests that were never sent because the run was aborted.
    pub not_sent: usize,
    /// CPU seconds this process spent during the measured window (client cost; includes any
    /// in-process server, so measure against an out-of-process engine).
    pub client_cpu_s: f64,
    /// Events with `choices` received in the measured window.
    pub events: u64,
}

/// Runs the plan against the server.
///
/// The load generator runs on a runtime of its own: one OS thread with a current-thread tokio
/// runtime. Every stream's connection task, body channel and request future then wake each
/// other without crossing threads (no futex per streamed event), which is most of a client's
/// cost against a server that writes one event per packet, and the caller's runtime (a study,
/// the daemon's API) neither slows the client nor is slowed by it. Dropping the returned future
/// aborts the run (in-flight requests are cancelled, nothing more is sent).
pub async fn run(plan: BenchPlan) -> Result<BenchOutcome, BenchError> {
    /// Aborts the run unless disarmed (the caller dropped the future before the result came).
    struct AbortOnDrop(Option<Arc<AbortSignal>>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            if let Some(a) = self.0.take() {
                a.abort();
            }
        }
    }
    let abort = Arc::new(AbortSignal::default());
    let inner = abort.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("servetune-load".into())
        .spawn(move || {
            let out = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(run_here(plan, inner)),
                Err(e) => Err(BenchError::Internal(format!(
                    "cannot start the load generator's runtime: {e}"
                ))),
            };
            let _ = tx.send(out);
        })
        .map_err(|e| BenchError::Internal(format!("cannot start the load generator: {e}")))?;
    let mut guard = AbortOnDrop(Some(abort));
    let out = rx.await;
    guard.0 = None;
    out.map_err(|_| BenchError::Internal("the load generator thread panicked".into()))?
}

/// `run`'s body, on the load generator's own thread.
async fn run_here(plan: BenchPlan, abort: Arc<AbortSignal>) -> Result<BenchOutcome, BenchError> {
    let shape = &plan.shape;
    check_shape(shape)?;
    let conc = shape.max_concurrency.unwrap_or(plan.requests.len().max(1));
    let max_concurrency = shape.max_concurrency;
    let http = client::http_client(conc)?;
    let tpl = Arc::new(plan.template.clone());
    let sem = shape.max_concurrency.map(|c| Arc::new(Semaphore::new(c)));

    let mut warm_records = warm_up(&plan, &http, &tpl, &abort, sem.as_ref()).await;

    let total = plan.requests.len();
    let counters = Arc::new(progress::Counters::default());
    let bar = progress::spawn(
        counters.clone(),
        total as u64,
        plan.label.clone(),
        plan.progress,
    );
    let (tx, rx) = mpsc::unbounded_channel::<RequestRecord>();
    let bodies: Arc<Vec<(Vec<u8>, u64, u64)>> = Arc::new(
        plan.requests
            .iter()
            .map(|r| {
                (
                    tpl.body(&r.prompt, r.expected_output_len),
                    r.prompt_len,
                    r.expected_output_len,
                )
            })
            .collect(),
    );
    let sent = Arc::new(AtomicUsize::new(0));
    let cpu0 = crate::util::process_cpu_seconds();
    let start = Instant::now();

    let dispatch = Dispatch {
        http: http.clone(),
        tpl: tpl.clone(),
        abort: abort.clone(),
        bodies,
        start,
    };
    let dispatcher = spawn_dispatcher(dispatch, shape.clone(), sem, sent.clone(), tx);

    // Collector: progress counters and the early-abort policy, record by record.
    let monitor = plan
        .abort
        .is_active()
        .then(|| AbortMonitor::with_concurrency(plan.abort.clone(), total, max_concurrency));
    let (mut records, aborted) = collect(rx, &counters, monitor, &abort, total).await;
    if let Err(e) = dispatcher.await {
        return Err(BenchError::Internal(format!(
            "the request dispatcher failed: {e}"
        )));
    }
    let duration = start.elapsed().as_secs_f64();
    let client_cpu_s = crate::util::process_cpu_seconds() - cpu0;
    counters.finished.store(true, Ordering::Relaxed);
    if let Some(b) = bar {
        let _ = b.await;
    }

    // Requests aborted in flight or in the queue are not measurements: keep them in the detailed
    // records, leave them out of the statistics.
    let not_sent = total - sent.load(Ordering::SeqCst)
        + records
            .iter()
            .filter(|r| r.failure == Some(FailureKind::Aborted) && r.latency_s == 0.0)
            .count();
    fill_output_tokens(&mut records, plan.tokenizer.as_ref()).await;
    fill_output_tokens(&mut warm_records, plan.tokenizer.as_ref()).await;
    if !tpl.keep_text {
        for r in records.iter_mut().chain(warm_records.iter_mut()) {
            r.generated_text = None;
        }
    }
    records.sort_by_key(|r| r.index);
    let (summary, events) = summarize_measured(&records, duration, &plan.summary);
    warm_records.extend(records);
    Ok(BenchOutcome {
        records: warm_records,
        summary,
        aborted,
        not_sent,
        client_cpu_s,
        events,
    })
}

/// Refuses load shapes that cannot run: a closed loop needs a number of workers and an
/// unlimited request rate.
fn check_shape(shape: &LoadShape) -> Result<(), BenchError> {
    if shape.closed_loop && shape.max_concurrency.is_none() {
        return Err(BenchError::Config(
            "--closed-loop needs --max-concurrency (the number of workers)".into(),
        ));
    }
    if shape.closed_loop && shape.request_rate.is_finite() {
        return Err(BenchError::Config(
            "--closed-loop sends as fast as the workers finish; --request-rate must be inf".into(),
        ));
    }
    Ok(())
}

/// Sends the warm-up requests and returns their records, marked as warm-ups.
///
/// The warm-ups are copies of the first prompt, sent at once under the same concurrency limit.
/// There are none when the plan asks for none or has no requests.
async fn warm_up(
    plan: &BenchPlan,
    http: &client::Clients,
    tpl: &Arc<RequestTemplate>,
    abort: &Arc<AbortSignal>,
    sem: Option<&Arc<Semaphore>>,
) -> Vec<RequestRecord> {
    let mut warm_records = Vec::new();
    if plan.shape.num_warmups > 0 && !plan.requests.is_empty() {
        let first = &plan.requests[0];
        let mut tasks = Vec::new();
        for _ in 0..plan.shape.num_warmups {
            let (http, tpl, abort, sem) = (http.clone(), tpl.clone(), abort.clone(), sem.cloned());
            let body = tpl.body(&first.prompt, first.expected_output_len);
            tasks.push(tokio::spawn(async move {
                let _permit = match &sem {
                    Some(s) => Some(s.clone().acquire_owned().await.expect("never closed")),
                    None => None,
                };
                client::send_request(&http, &tpl, body, Instant::now(), &abort).await
            }));
        }
        for t in tasks {
            if let Ok(mut r) = t.await {
                r.warmup = true;
                warm_records.push(r);
            }
        }
    }
    warm_records
}

/// What sending one measured request needs: the clients, the template, every request's
/// prepared body with its prompt and expected output lengths, the run's abort signal and the
/// instant the measured window started.
#[derive(Clone)]
struct Dispatch {
    http: client::Clients,
    tpl: Arc<RequestTemplate>,
    abort: Arc<AbortSignal>,
    bodies: Arc<Vec<(Vec<u8>, u64, u64)>>,
    start: Instant,
}

impl Dispatch {
    /// Sends request `i` and completes its record with its index, lengths and queueing time.
    ///
    /// `dispatched_s` is when the request was released by the arrival process; the time until
    /// it was actually sent is its client-side queueing (vLLM's queue_times).
    async fn send(&self, i: usize, dispatched_s: f64) -> RequestRecord {
        let (body, prompt_len, out_len) = self.bodies[i].clone();
        let mut r =
            client::send_request(&self.http, &self.tpl, body, self.start, &self.abort).await;
        r.queue_s = (r.start_s - dispatched_s).max(0.0);
        r.index = i;
        r.prompt_len = prompt_len;
        r.expected_output_len = out_len;
        r
    }
}

/// Starts the task that releases the measured requests, in a closed loop or on the arrival
/// schedule, and waits for all of them; every record goes to `tx`.
fn spawn_dispatcher(
    dispatch: Dispatch,
    shape: LoadShape,
    sem: Option<Arc<Semaphore>>,
    sent: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<RequestRecord>,
) -> tokio::task::JoinHandle<()> {
    let total = dispatch.bodies.len();
    tokio::spawn(async move {
        // Both helpers drop their `tx` before returning, so the collector ends once the
        // requests' tasks are done.
        let handles = if shape.closed_loop {
            closed_loop(
                dispatch,
                shape.max_concurrency.unwrap_or(1),
                total,
                sent,
                tx,
            )
        } else {
            let times = arrival::schedule(total, shape.request_rate, shape.burstiness, shape.seed);
            open_loop(dispatch, times, sem, sent, tx).await
        };
        for h in handles {
            let _ = h.await;
        }
    })
}

/// Starts `workers` tasks that each send their next request as soon as the previous one
/// finished, until all `total` are sent or the run is aborted.
fn closed_loop(
    dispatch: Dispatch,
    workers: usize,
    total: usize,
    sent: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<RequestRecord>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::new();
    let next = Arc::new(AtomicUsize::new(0));
    for _ in 0..workers {
        let (next, tx, one, sent) = (next.clone(), tx.clone(), dispatch.clone(), sent.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= total || one.abort.is_aborted() {
                    break;
                }
                sent.fetch_add(1, Ordering::SeqCst);
                let now = one.start.elapsed().as_secs_f64();
                let _ = tx.send(one.send(i, now).await);
            }
        }));
    }
    handles
}

/// Releases request `i` at `times[i]` seconds after the start, each in a task of its own that
/// waits for a concurrency permit first, until all are released or the run is aborted.
///
/// A request aborted while it waited for its permit is recorded as never sent.
async fn open_loop(
    dispatch: Dispatch,
    times: Vec<f64>,
    sem: Option<Arc<Semaphore>>,
    sent: Arc<AtomicUsize>,
    tx: mpsc::UnboundedSender<RequestRecord>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::new();
    let (abort, start) = (dispatch.abort.clone(), dispatch.start);
    for (i, at) in times.into_iter().enumerate() {
        if at > 0.0 {
            let when = start
                + std::time::Duration::try_from_secs_f64(at)
                    .unwrap_or(std::time::Duration::from_secs(u32::MAX as u64));
            tokio::select! {
                _ = tokio::time::sleep_until(when.into()) => {}
                _ = abort.wait() => {}
            }
        }
        if abort.is_aborted() {
            break;
        }
        sent.fetch_add(1, Ordering::SeqCst);
        let (tx, sem, abort, one) = (tx.clone(), sem.clone(), abort.clone(), dispatch.clone());
        let dispatched_s = start.elapsed().as_secs_f64();
        handles.push(tokio::spawn(async move {
            let permit = match &sem {
                Some(s) => tokio::select! {
                    p = s.clone().acquire_owned() => Some(p.expect("never closed")),
                    _ = abort.wait() => None,
                },
                None => None,
            };
            if abort.is_aborted() && sem.is_some() && permit.is_none() {
                // Aborted while queued: never sent.
                let mut r = RequestRecord {
                    index: i,
                    failure: Some(FailureKind::Aborted),
                    error: "run aborted before the request was sent".into(),
                    ..Default::default()
                };
                r.start_s = start.elapsed().as_secs_f64();
                let _ = tx.send(r);
                return;
            }
            let r = one.send(i, dispatched_s).await;
            drop(permit);
            let _ = tx.send(r);
        }));
    }
    handles
}

/// Receives the records until every sender is gone, counting them for the progress bar and
/// feeding the early-abort policy; the first reason to abort aborts the run.
///
/// Returns the records in the order they finished and the reason the run was aborted, if any.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<RequestRecord>,
    counters: &progress::Counters,
    mut monitor: Option<AbortMonitor>,
    abort: &AbortSignal,
    total: usize,
) -> (Vec<RequestRecord>, Option<String>) {
    let mut records: Vec<RequestRecord> = Vec::with_capacity(total);
    let mut aborted: Option<String> = None;
    while let Some(r) = rx.recv().await {
        counters.done.fetch_add(1, Ordering::Relaxed);
        if !r.success {
            counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        counters.output_tokens.fetch_add(
            r.server_output_tokens.unwrap_or(r.itl_s.len() as u64 + 1),
            Ordering::Relaxed,
        );
        if aborted.is_none() {
            if let Some(m) = monitor.as_mut() {
                if let Some(why) = m.observe(&r) {
                    tracing::warn!("aborting the run: {why}");
                    aborted = Some(why);
                    abort.abort();
                }
            }
        }
        records.push(r);
    }
    (records, aborted)
}

/// Summarizes the records that are measurements (all but the aborted ones) over `duration`
/// seconds, and counts the events with `choices` their successful requests received.
fn summarize_measured(
    records: &[RequestRecord],
    duration: f64,
    config: &SummaryConfig,
) -> (Summary, u64) {
    let measured: Vec<RequestRecord> = records
        .iter()
        .filter(|r| r.failure != Some(FailureKind::Aborted))
        .cloned()
        .collect();
    let summary = metrics::summarize(&measured, duration, config);
    let events = measured
        .iter()
        .filter(|r| r.success)
        .map(|r| r.itl_s.len() as u64 + 1)
        .sum();
    (summary, events)
}

/// vLLM: when the server sent no `usage.completion_tokens`, count the generated text with the
/// tokenizer; without one, count the text events.
async fn fill_output_tokens(records: &mut [RequestRecord], tokenizer: Option<&Tokenizer>) {
    for r in records
        .iter_mut()
        .filter(|r| r.success && r.server_output_tokens.is_none())
    {
        let text = r.generated_text.as_deref().unwrap_or("");
        let counted = match tokenizer {
            Some(t) => t.encode(text, false).await.ok().map(|v| v.len() as u64),
            None => None,
        };
        let events: u64 = r.text_reads.iter().map(|x| x.1 as u64).sum();
        r.output_tokens = counted.filter(|&n| n > 0).unwrap_or(events.max(1));
    }
}
