//! The daemon.
//! - In process on port 0, studies in virtual time (the mock engine's model behind a
//!   `Backend` whose engine version a test can change), the time from a `ManualClock`: the API
//!   contract (snapshots), auth, body limits and JSON errors; the queue (one study at a time,
//!   cancel, pause, resume, surviving a restart); the nightly schedule; an engine upgrade that
//!   triggers a warm re-tune.
//! - As a subprocess with real (mock-engine) trials: SIGTERM exits 0 with no engine left and
//!   the study resumable; SIGKILL, restart, nothing lost; a bad config exits 64 naming the
//!   field.
//! - The status page in headless Chromium.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::engines_with;
use serde_json::Value as Json;
use servetune::daemon::config::DaemonConfig;
use servetune::daemon::scheduler::{Clock, ManualClock};
use servetune::daemon::{self, Backend, Daemon, Handle, Probe};
use servetune::mock::evaluator::{SimEvaluator, SimWorkload};
use servetune::mock::profile::Machine;
use servetune::mock::sim::{Hardware, ModelSpec};
use servetune::space::{Config, Space};
use servetune::store::Store;
use servetune::telemetry::TelemetrySummary;
use servetune::tune::eval::{Evaluator, Measurement, RunSpec, Started, TrialFailure};
use servetune::tune::records::{self, Phase, Records, StudyRecord, TrialKind, TrialStatus};
use servetune::tune::spec::Study;
use servetune::tune::study::{Runner, Slots};
use servetune::tune::TuneError;

const BIN: &str = env!("CARGO_BIN_EXE_servetune");
const NODE: &str = "1x NVIDIA H100 80GB HBM3 (simulated)";

fn spaces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces")
}

/// 2026-12-03T09:00:00Z.
const T0: f64 = 1_796_288_400.0;

// ---- a backend in virtual time ----

/// The virtual-time evaluator with a real pause per engine start, so that a test can act
/// while a trial runs.
struct SlowSim {
    inner: SimEvaluator,
    delay: Duration,
}

impl Evaluator for SlowSim {
    async fn start(&mut self, cfg: &Config, dir: &Path) -> Result<Started, TrialFailure> {
        tokio::time::sleep(self.delay).await;
        self.inner.start(cfg, dir).await
    }
    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        self.inner.run(spec).await
    }
    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        self.inner.stop().await
    }
    fn workloads(&self) -> Vec<String> {
        self.inner.workloads()
    }
}

struct SimBackend {
    version: Mutex<String>,
    delay: Duration,
    /// GPUs of the faked node the studies' trials run on in parallel (0: one at a time).
    gpus: u32,
}

impl SimBackend {
    fn new(version: &str, delay_ms: u64) -> SimBackend {
        SimBackend {
            version: Mutex::new(version.into()),
            delay: Duration::from_millis(delay_ms),
            gpus: 0,
        }
    }
    fn version(&self) -> String {
        self.version.lock().unwrap().clone()
    }
}

impl Backend for SimBackend {
    type Eval = SlowSim;

    async fn probe(&self, _study: &Study) -> Result<Probe, String> {
        Ok(Probe {
            engines: BTreeMap::from([("vllm".to_string(), Some(self.version()))]),
            hardware: NODE.into(),
            driver: Some("550.54.15".into()),
        })
    }

    async fn runner(
        &self,
        study: Study,
        store: Store,
        trial_root: PathBuf,
    ) -> Result<Runner<SlowSim>, TuneError> {
        let version = self.version();
        let space = Space::load(&spaces_dir().join("vllm.toml"))?;
        let space = space.for_version(&version).0;
        let space = servetune::tune::restrict(space, study.spec.study.params.as_deref())?;
        let machine = Machine {
            hw: Hardware::preset("h100", 16).unwrap(),
            model: ModelSpec::preset("8b").unwrap(),
            version: version.clone(),
        };
        let mut inner = SimEvaluator::new(
            space.clone(),
            machine,
            vec![SimWorkload {
                name: "random".into(),
                num_prompts: 300,
                input_len: 1024,
                output_len: 256,
                prefix_len: 0,
                request_rate: f64::INFINITY,
                max_concurrency: None,
            }],
            0.02,
            7,
        );
        inner.limits = study.limits.clone();
        let slow = |inner: SimEvaluator| SlowSim {
            inner,
            delay: self.delay,
        };
        let slots = (self.gpus > 0).then(|| {
            use servetune::engine::slots::{Node, Pool};
            use servetune::telemetry::Link;
            let links = vec![vec![Link::NvLink; self.gpus as usize]; self.gpus as usize];
            let node = Node::fake((0..self.gpus).collect(), links, (0..16).collect());
            let evals = (0..self.gpus).map(|_| slow(inner.clone())).collect();
            Slots {
                pool: Pool::new(node, 0, None).unwrap(),
                evals,
            }
        });
        let mut r = Runner::new(store, study, space, slow(inner), trial_root);
        r.parallel = slots;
        r.hardware = NODE.into();
        r.engine_versions = BTreeMap::from([("vllm".to_string(), Some(version))]);
        Ok(r)
    }

    fn node(&self) -> String {
        NODE.into()
    }
}

fn sim_study(name: &str, trials: u32) -> String {
    format!(
        r#"
[study]
name = "{name}"
model = "mock-8b"
engines = "vllm"
platform = "gpu"                  # the mock engine imitates vLLM on a GPU
optimizer = "tpe"
seed = 3
space_dir = "{spaces}"
params = ["max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"]

[constraints]
min_success_rate = 0.99
slo = ["tpot:mean:18"]

[budget]
trials = {trials}

[stopping]
patience = 100
min_trials = 100

[remeasure]
top = 1
repeats = 2

[[workload]]
name = "random"
args = ["--dataset-name", "random", "--num-prompts", "20", "--tokenizer", "words"]
"#,
        spaces = spaces_dir().display()
    )
}

struct Fixture {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            clock: Arc::new(ManualClock::new(T0)),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `studies` as files and a config keeping them; `daemon` adds `[daemon]` keys.
    fn config(&self, daemon: &str, studies: &[(&str, &str)]) -> DaemonConfig {
        let mut text =
            format!("[daemon]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"state\"\n{daemon}\n");
        for (name, body) in studies {
            std::fs::write(self.path().join(format!("{name}.toml")), body).unwrap();
            text.push_str(&format!("[[study]]\nfile = \"{name}.toml\"\n"));
        }
        let p = self.path().join("config.toml");
        std::fs::write(&p, text).unwrap();
        DaemonConfig::load(&p).unwrap()
    }

    async fn start(
        &self,
        cfg: DaemonConfig,
        backend: SimBackend,
    ) -> (Arc<Daemon<SimBackend>>, Handle, Api) {
        let store = Store::open(&cfg.state_dir.join("db")).unwrap();
        let token = cfg.token().unwrap();
        let clock: Arc<dyn Clock> = self.clock.clone();
        let mut d = Daemon::new(cfg, store, backend, clock, token.clone());
        d.tick = Duration::from_millis(20);
        let d = Arc::new(d);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let h = daemon::start(d.clone(), listener).unwrap();
        let api = Api {
            base: format!("http://{}", h.addr),
            token,
            http: reqwest::Client::new(),
        };
        (d, h, api)
    }
}

struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    async fn get(&self, path: &str) -> (u16, Json) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let code = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }

    async fn text(&self, path: &str) -> (u16, String, String) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (r.status().as_u16(), ct, r.text().await.unwrap())
    }

    async fn post(&self, path: &str, token: Option<&str>, body: &str) -> (u16, Json) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .body(body.to_owned());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let code = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }

    /// `POST /v1/studies/{id}/{action}` with the token.
    async fn control(&self, id: &str, action: &str) -> (u16, Json) {
        self.post(&format!("/v1/studies/{id}/{action}"), Some(&self.token), "")
            .await
    }

    async fn submit(&self, body: &str) -> String {
        let (code, j) = self.post("/v1/studies", Some(&self.token), body).await;
        assert_eq!(code, 201, "{j}");
        j["study"].as_str().unwrap().to_owned()
    }

    async fn state_of(&self, id: &str) -> String {
        let (code, j) = self.get(&format!("/v1/studies/{id}")).await;
        assert_eq!(code, 200, "{j}");
        j["view"]["state"].as_str().unwrap().to_owned()
    }

    /// Waits until study `id` is in state `want` (panics after 60 s).
    async fn wait_state(&self, id: &str, want: &str) {
        let t0 = Instant::now();
        loop {
            let s = self.state_of(id).await;
            if s == want {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "study {id} stayed {s}, never {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `/v1/studies` lists `n` studies; returns the list.
    async fn wait_studies(&self, n: usize, what: &str) -> Json {
        self.wait_for("/v1/studies", what, |j| {
            j.as_array().is_some_and(|a| a.len() == n)
        })
        .await
    }

    async fn wait_for<F: Fn(&Json) -> bool>(&self, path: &str, what: &str, f: F) -> Json {
        let t0 = Instant::now();
        loop {
            let (_, j) = self.get(path).await;
            if f(&j) {
                return j;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{path}: never {what}: {j}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Replaces wall-clock values (and whatever depends on them) for snapshots, and the checkout's
/// absolute path (a clean clone lives elsewhere) by `<repo>`.
fn redact(v: &mut Json) {
    const KEYS: &[&str] = &[
        "created",
        "updated",
        "started",
        "ended",
        "uptime_s",
        "running_s",
        "time_left_s",
        "time_left_basis",
        "at",
        "spec_path",
        "next_probe",
        "startup_s",
    ];
    match v {
        Json::Object(m) => {
            for (k, x) in m.iter_mut() {
                if KEYS.contains(&k.as_str()) && !x.is_null() {
                    *x = Json::String("<redacted>".into());
                } else {
                    redact(x);
                }
            }
        }
        Json::Array(a) => a.iter_mut().for_each(redact),
        Json::String(s) if s.contains(env!("CARGO_MANIFEST_DIR")) => {
            *s = s.replace(env!("CARGO_MANIFEST_DIR"), "<repo>");
        }
        _ => {}
    }
}

/// A JSON answer, wall-clock values redacted, against its insta snapshot in
/// `tests/snapshots/` (`cargo insta review`, or INSTA_UPDATE=always, after an intended change).
fn snapshot_json(name: &str, mut v: Json) {
    redact(&mut v);
    insta::assert_snapshot!(name, serde_json::to_string_pretty(&v).unwrap());
}

// ---- API contract ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_its_contract_and_refuses_changes_without_the_token() {
    let f = Fixture::new();
    let cfg = f.config("max_body_bytes = 2048\ntune_on_start = false", &[]);
    let (_d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 0)).await;

    let (code, j) = api.get("/healthz").await;
    assert_eq!((code, j), (200, serde_json::json!({"ok": true})));
    let (code, idle) = api.get("/v1/status").await;
    assert_eq!(code, 200);
    assert_eq!(idle["phase"], "idle");
    assert_eq!(idle["node"], NODE);
    // The default schedule, from the injected clock (09:00 UTC): tomorrow 03:00.
    let idle = api
        .wait_for("/v1/status", "scheduled", |j| !j["next_nightly"].is_null())
        .await;
    assert_eq!(idle["next_nightly"], "2026-12-04T03:00:00Z");
    snapshot_json("status-idle", idle);

    // Changes need the token: none, a wrong one (same and other length), then bad bodies.
    let study = sim_study("api", 6);
    refuses_changes_without_the_token_and_bad_requests(&api, &study).await;

    // A study, start to finish. The queue entry answered is the v1 job, without the file.
    let (code, job) = api.post("/v1/studies", Some(&api.token), &study).await;
    assert_eq!(code, 201, "{job}");
    let id = job["study"].as_str().unwrap().to_owned();
    assert_eq!(id, "api-20261203-090000");
    assert_eq!(job["spec_text"], "", "{job}");
    snapshot_json("job-submitted", job);
    api.wait_state(&id, "done").await;
    let (code, list) = api.get("/v1/studies").await;
    assert_eq!(code, 200);
    snapshot_json("studies", list);
    let (_, detail) = api.get(&format!("/v1/studies/{id}")).await;
    assert_eq!(detail["study"]["phase"], "done");
    assert_eq!(detail["study"]["trigger"], "submitted");
    let (_, trials) = api.get(&format!("/v1/studies/{id}/trials")).await;
    let trials = trials.as_array().unwrap().clone();
    let search = trials.iter().filter(|t| t["kind"] == "search").count();
    assert_eq!(search, 6);
    assert!(trials.iter().all(|t| t["status"] != "running"));
    // The v1 shapes of a study and a trial (a store schema change must not move them): the
    // command is one shell-quoted string.
    assert!(
        trials.iter().all(|t| t["command"].is_string()),
        "{trials:?}"
    );
    snapshot_json("study-detail", detail.clone());
    snapshot_json("trial", trials[0].clone());
    let (code, ct, md) = api.text(&format!("/v1/studies/{id}/report")).await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("text/markdown"), "{ct}");
    assert!(md.contains("Serving Benchmark Result"), "{md}");
    let (code, rep) = api
        .get(&format!("/v1/studies/{id}/report?format=json"))
        .await;
    assert_eq!(code, 200);
    assert_eq!(rep["study"]["id"], id.as_str());
    snapshot_json("report", rep);
    let (code, _) = api
        .get(&format!("/v1/studies/{id}/report?format=pdf"))
        .await;
    assert_eq!(code, 400);
    let (_, best) = api.get("/v1/best?model=mock-8b").await;
    assert_eq!(best["node"], NODE);
    let cmd = best["command"].as_str().expect("a command for this node");
    assert!(cmd.contains("max_num_seqs"), "{cmd}");
    snapshot_json("best", best);
    let (_, none) = api.get("/v1/best?model=other").await;
    assert!(none["command"].is_null() && none["best"].as_array().unwrap().is_empty());

    // The metrics agree with the trials.
    assert_metrics_agree_with(&api, &trials).await;
    h.stop().await.unwrap();
}

/// Asserts that changes need the token (none, or a wrong one of the same or another length,
/// is refused with 401 and a challenge), that a body over the limit, a study the daemon cannot
/// read, an unknown path or method and a repeated query parameter are refused with their status
/// codes, and that every refusal is a JSON error.
async fn refuses_changes_without_the_token_and_bad_requests(api: &Api, study: &str) {
    for token in [
        None,
        Some("x".repeat(api.token.len())),
        Some("short".into()),
    ] {
        let (code, j) = api.post("/v1/studies", token.as_deref(), study).await;
        assert_eq!(code, 401, "{j}");
        assert!(j["error"].as_str().unwrap().contains("token"), "{j}");
    }
    let r = api
        .http
        .post(format!("{}/v1/studies", api.base))
        .body(study.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers().get("www-authenticate").unwrap(),
        "Bearer realm=\"servetune\""
    );
    let (code, j) = api
        .post("/v1/studies", Some(&api.token), &"#".repeat(4096))
        .await;
    assert_eq!(code, 413, "{j}");
    assert!(j["error"].is_string(), "{j}");
    let (code, j) = api
        .post(
            "/v1/studies",
            Some(&api.token),
            &study.replace("name = \"api\"", "name = \"a b\""),
        )
        .await;
    assert_eq!(code, 400);
    assert!(j["error"].as_str().unwrap().contains("study.name"), "{j}");
    for (code_want, method, path) in [
        (404, "GET", "/nope"),
        (405, "DELETE", "/v1/status"),
        (404, "GET", "/v1/studies/none"),
        (404, "GET", "/v1/studies/none/trials"),
        (404, "GET", "/v1/studies/none/report"),
        (404, "POST", "/v1/studies/none/cancel"),
        (404, "POST", "/v1/studies/none/explode"),
        (400, "GET", "/v1/best?model=a&model=b"),
    ] {
        let r = api
            .http
            .request(method.parse().unwrap(), format!("{}{path}", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), code_want, "{method} {path}");
        let j: Json = r.json().await.unwrap();
        assert!(j["error"].is_string(), "{method} {path}: {j}");
    }
}

/// Asserts that the metrics count the study's `trials` by outcome, the trial durations, the
/// studies by state and the queue, and match their snapshot (wall-clock durations left out).
async fn assert_metrics_agree_with(api: &Api, trials: &[Json]) {
    let (code, ct, metrics) = api.text("/metrics").await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let count = |status: &str| trials.iter().filter(|t| t["status"] == status).count();
    for (label, n) in [
        ("ok", count("ok")),
        ("infeasible", count("infeasible")),
        ("failed", count("failed")),
    ] {
        let line = format!("servetune_trials_total{{outcome=\"{label}\"}} {n}\n");
        assert!(metrics.contains(&line), "missing {line:?} in\n{metrics}");
    }
    assert!(metrics.contains(&format!(
        "servetune_trial_duration_seconds_count {}\n",
        trials.len()
    )));
    assert!(metrics.contains("servetune_studies{state=\"done\"} 1\n"));
    assert!(metrics.contains("servetune_queue_length 0\n"));
    let stable: String = metrics
        .lines()
        .filter(|l| !l.contains("_duration_seconds_") || l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    insta::assert_snapshot!("metrics", stable);
}

// ---- the queue ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_study_at_a_time_with_cancel_pause_resume_and_a_queue_that_survives_a_restart() {
    let f = Fixture::new();
    let cfg = f.config("tune_on_start = false", &[]);
    let (d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 150)).await;
    let a = api.submit(&sim_study("qa", 8)).await;
    let b = api.submit(&sim_study("qb", 4)).await;
    let c = api.submit(&sim_study("qc", 4)).await;
    api.wait_state(&a, "running").await;
    let st = api
        .wait_for("/v1/status", "a running trial", |j| {
            !j["current"]["trial"].is_null()
        })
        .await;
    assert_eq!(st["phase"], "tuning");
    assert_eq!(st["current"]["study"], a.as_str());
    let queued: Vec<&str> = st["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["study"].as_str().unwrap())
        .collect();
    assert_eq!(queued, [b.as_str(), c.as_str()]);

    // Queued studies: pause one, cancel one; a cancelled one cannot be resumed.
    let (code, j) = api.control(&b, "pause").await;
    assert_eq!((code, j["state"].as_str()), (200, Some("paused")), "{j}");
    snapshot_json("job-paused", j);
    let (code, _) = api.control(&c, "cancel").await;
    assert_eq!(code, 200);
    let (code, j) = api.control(&c, "resume").await;
    assert_eq!(code, 409, "{j}");
    assert!(j["error"].as_str().unwrap().contains("cancelled"), "{j}");
    snapshot_json("control-refused", j);
    let (code, _) = api.post(&format!("/v1/studies/{a}/pause"), None, "").await;
    assert_eq!(code, 401);

    // The running one: paused once its engine is down; nothing else runs (b paused, c cancelled).
    let (code, _) = api.control(&a, "pause").await;
    assert_eq!(code, 200);
    api.wait_state(&a, "paused").await;
    let before = api.get(&format!("/v1/studies/{a}/trials")).await.1;
    let st = api.get("/v1/status").await.1;
    assert!(st["current"].is_null(), "{st}");

    // A restart keeps the queue as it was.
    drop(api); // its kept-alive connections would hold the server (and the store) open
    h.stop().await.unwrap();
    drop(d);
    let cfg = f.config("tune_on_start = false", &[]);
    let (_d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 20)).await;
    for (id, want) in [(&a, "paused"), (&b, "paused"), (&c, "cancelled")] {
        assert_eq!(api.state_of(id).await, want, "{id}");
    }
    let (code, _) = api.control(&a, "resume").await;
    assert_eq!(code, 200);
    let (code, _) = api.control(&b, "resume").await;
    assert_eq!(code, 200);
    api.wait_state(&a, "done").await;
    api.wait_state(&b, "done").await;
    assert_eq!(api.state_of(&c).await, "cancelled");

    // a resumed where it stopped: what it had finished is unchanged, no gaps.
    let after = api.get(&format!("/v1/studies/{a}/trials")).await.1;
    let after = after.as_array().unwrap();
    for t in before.as_array().unwrap() {
        if t["status"] != "running" {
            assert!(after.contains(t), "trial {} changed", t["seq"]);
        }
    }
    let seqs: Vec<u64> = after.iter().map(|t| t["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..after.len() as u64).collect::<Vec<_>>());
    assert_eq!(after.iter().filter(|t| t["kind"] == "search").count(), 8);

    // One at a time: no trial of b overlaps one of a.
    let span = |ts: &[Json]| -> Vec<(f64, f64)> {
        ts.iter()
            .map(|t| (t["started"].as_f64().unwrap(), t["ended"].as_f64().unwrap()))
            .collect()
    };
    let tb = api.get(&format!("/v1/studies/{b}/trials")).await.1;
    for (s1, e1) in span(after) {
        for (s2, e2) in span(tb.as_array().unwrap()) {
            assert!(e1 <= s2 || e2 <= s1, "trials of {a} and {b} overlap");
        }
    }
    h.stop().await.unwrap();
}

// ---- the scheduler ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nightly_schedule_fires_on_the_injected_clock_and_once_after_downtime() {
    let f = Fixture::new();
    let body = sim_study("nightly", 5);
    let conf = "tune_on_start = false\nschedule = \"0 3 * * *\"";
    let cfg = f.config(conf, &[("nightly", &body)]);
    let (d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 0)).await;
    let jobs = |j: &Json| j.as_array().unwrap().len();
    api.wait_for("/v1/status", "scheduled", |j| {
        j["next_nightly"] == "2026-12-04T03:00:00Z"
    })
    .await;
    f.clock.set(T0 + 18.0 * 3600.0 - 1.0); // 02:59:59 the next day
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(jobs(&api.get("/v1/studies").await.1), 0);
    f.clock.set(T0 + 18.0 * 3600.0); // 03:00:00
    let list = api.wait_studies(1, "a nightly study").await;
    assert_eq!(list[0]["trigger"], "nightly");
    let first = list[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(first, "nightly-20261204-030000");
    api.wait_for("/v1/status", "the next night", |j| {
        j["next_nightly"] == "2026-12-05T03:00:00Z"
    })
    .await;
    api.wait_state(&first, "done").await;

    // Down from before the 5th 03:00 to the 6th 12:00: one catch-up run, not two.
    drop(api); // its kept-alive connections would hold the server (and the store) open
    h.stop().await.unwrap();
    drop(d);
    f.clock.set(T0 + (3.0 * 24.0 + 3.0) * 3600.0);
    let cfg = f.config(conf, &[("nightly", &body)]);
    let (_d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 0)).await;
    let list = api.wait_studies(2, "the catch-up").await;
    let second = list[1]["id"].as_str().unwrap().to_owned();
    assert_eq!(list[1]["trigger"], "nightly");
    api.wait_state(&second, "done").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(jobs(&api.get("/v1/studies").await.1), 2);
    let st = api.get("/v1/status").await.1;
    assert_eq!(st["next_nightly"], "2026-12-07T03:00:00Z");
    // A re-tune starts warm, from the first night's study.
    let d = api.get(&format!("/v1/studies/{second}")).await.1;
    let warm = d["study"]["warm_start"].as_array().unwrap();
    assert!(!warm.is_empty(), "{d}");
    assert!(warm[0]["from"].as_str().unwrap().contains(&first), "{d}");
    h.stop().await.unwrap();
}

/// `schedule_tz`: the same "3 am" is 02:00 UTC in Berlin's winter, and the status says in
/// which zone the schedule is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_is_read_in_its_time_zone() {
    let f = Fixture::new();
    let conf = "tune_on_start = false\nschedule = \"0 3 * * *\"\nschedule_tz = \"Europe/Berlin\"";
    let cfg = f.config(conf, &[]);
    let (_d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 0)).await;
    let st = api
        .wait_for("/v1/status", "scheduled", |j| !j["next_nightly"].is_null())
        .await;
    assert_eq!(st["next_nightly"], "2026-12-04T02:00:00Z", "{st}");
    assert_eq!(st["schedule_tz"], "Europe/Berlin");
    h.stop().await.unwrap();
}

// ---- re-tune on an engine upgrade, warm ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_upgrade_triggers_a_warm_retune() {
    let f = Fixture::new();
    let body = sim_study("upgrade", 10);
    let cfg = f.config("probe_interval_s = 60", &[("upgrade", &body)]);
    let backend = SimBackend::new("0.10.1", 0);
    let (d, h, api) = f.start(cfg, backend).await;
    // Never tuned: tuned at start (cold).
    let list = api.wait_studies(1, "the initial study").await;
    assert_eq!(list[0]["trigger"], "initial");
    let first = list[0]["id"].as_str().unwrap().to_owned();
    api.wait_state(&first, "done").await;

    // The same version at the next probe: nothing.
    f.clock.set(T0 + 61.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.get("/v1/studies").await.1.as_array().unwrap().len(), 1);

    *d.backend.version.lock().unwrap() = "0.11.0".into();
    f.clock.set(T0 + 122.0);
    let list = api.wait_studies(2, "the re-tune").await;
    assert_eq!(list[1]["trigger"], "engine upgrade: vllm 0.10.1 → 0.11.0");
    let second = list[1]["id"].as_str().unwrap().to_owned();
    api.wait_state(&second, "done").await;

    let store_path = f.path().join("state/db");
    drop(api); // its kept-alive connections would hold the server (and the store) open
    h.stop().await.unwrap();
    drop(d);
    let store = Store::open(&store_path).unwrap();
    let rec: StudyRecord = Records::new(store.clone()).study(&second).unwrap().unwrap();
    assert_eq!(rec.trigger, "engine upgrade: vllm 0.10.1 → 0.11.0");
    assert_eq!(rec.engine_versions["vllm"].as_deref(), Some("0.11.0"));
    assert!(!rec.warm_start.is_empty());
    let prev: StudyRecord = Records::new(store.clone()).study(&first).unwrap().unwrap();
    let ts = Records::new(store.clone()).trials(&second).unwrap();
    let search: Vec<_> = ts.iter().filter(|t| t.kind == TrialKind::Search).collect();
    // Baseline first, then the previous best configurations, then the optimiser.
    assert!(search[0].note.contains("baseline"), "{}", search[0].note);
    assert!(
        search[1].note.starts_with("warm start: "),
        "{}",
        search[1].note
    );
    let prev_best = prev
        .best_trial
        .and_then(|b| {
            Records::new(store.clone())
                .trials(&first)
                .unwrap()
                .into_iter()
                .find(|t| t.seq == b)
        })
        .unwrap();
    assert!(
        search.iter().any(|t| t.config == prev_best.config),
        "the previous best was not measured again"
    );
    assert_eq!(rec.phase, Phase::Done);
    assert!(ts.iter().all(|t| t.status != TrialStatus::Running));
}

// ---- as a subprocess, with mock-engine trials ----

fn mock_study(dir: &Path, name: &str, trials: u32) -> PathBuf {
    let text = format!(
        r#"
[study]
name = "{name}"
model = "mock-8b-{name}"
engines = "vllm"
platform = "gpu"                  # the mock engine imitates vLLM on a GPU
optimizer = "tpe"
seed = 1
space_dir = "{spaces}"
params = ["max_num_seqs", "max_num_batched_tokens"]

[binaries]
vllm = ["{bin}", "mock-engine", "--profile", "vllm", "--mock-hardware", "h100", "--mock-model", "8b", "--mock-startup-s", "0.3", "--"]

[constraints]
min_success_rate = 0.99

# Tests run side by side: their engines are foreign load to each other, and the mock
# engine's figures do not depend on the CPU.
[foreign_load]
max_cores = inf

[budget]
trials = {trials}

[stopping]
patience = 100
min_trials = 100

[screening]
fraction = 1.0

[remeasure]
top = 1
repeats = 2

[[workload]]
name = "short"
args = ["--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "24", "--num-prompts", "24", "--max-concurrency", "8", "--tokenizer", "words"]
"#,
        spaces = spaces_dir().display(),
        bin = BIN
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

struct Proc {
    child: Child,
    addr: String,
}

/// Starts `servetune daemon` and reads its address from its log.
fn spawn_daemon(config: &Path) -> Proc {
    let mut child = Command::new(BIN)
        .args(["daemon", "--config", config.to_str().unwrap()])
        .env("SERVETUNE_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("servetune daemon on http://").nth(1) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(rest.split(' ').next().unwrap_or("").to_owned());
                }
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the daemon never said where it listens");
    Proc { child, addr }
}

fn get(addr: &str, path: &str) -> Json {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(format!("http://{addr}{path}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(secs), "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn running_trial(addr: &str) -> Option<u64> {
    get(addr, "/v1/status")["current"]["trial"]["seq"].as_u64()
}

fn sigterm(child: &Child) {
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
}

#[test]
fn sigterm_leaves_no_engine_and_a_sigkilled_daemon_resumes_without_losing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let name = "daemon-kill";
    let study = mock_study(dir.path(), name, 5);
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"state\"\nstop_timeout_s = 30\n[[study]]\nfile = \"{}\"\n",
            study.display()
        ),
    )
    .unwrap();
    let marker = format!("mock-8b-{name}");

    // SIGTERM while trial 1's engine runs: exit 0 quickly, no engine left, study resumable.
    let mut p = spawn_daemon(&config);
    wait_until("trial 1 running", 120, || {
        running_trial(&p.addr).is_some_and(|s| s >= 1) && !engines_with(&marker).is_empty()
    });
    let id = get(&p.addr, "/v1/status")["current"]["study"]
        .as_str()
        .unwrap()
        .to_owned();
    let t = Instant::now();
    sigterm(&p.child);
    let status = p.child.wait().unwrap();
    let took = t.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(
        engines_with(&marker).is_empty(),
        "{:?}",
        engines_with(&marker)
    );
    let state = dir.path().join("state");
    let kept = {
        let store = Store::open(&state.join("db")).unwrap();
        let job = servetune::daemon::queue::Queue::new(store.clone())
            .all()
            .unwrap()
            .into_iter()
            .next()
            .unwrap();
        assert_eq!(
            job.state,
            servetune::daemon::queue::JobState::Running,
            "{job:?}"
        );
        Records::new(store.clone()).trials(&id).unwrap()
    };

    // Restart, SIGKILL mid-trial, restart: it finishes with nothing lost.
    let mut p = spawn_daemon(&config);
    let last = kept.len() as u64;
    wait_until("a later trial running", 120, || {
        running_trial(&p.addr).is_some_and(|s| s > last) && !engines_with(&marker).is_empty()
    });
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let mut p = spawn_daemon(&config);
    wait_until("the study done", 240, || {
        get(&p.addr, &format!("/v1/studies/{id}"))["view"]["state"] == "done"
    });
    sigterm(&p.child);
    assert!(p.child.wait().unwrap().success());
    let store = Store::open(&state.join("db")).unwrap();
    let ts = Records::new(store.clone()).trials(&id).unwrap();
    for k in kept.iter().filter(|k| k.status != TrialStatus::Running) {
        assert!(ts.contains(k), "trial {} lost or changed", k.seq);
    }
    let seqs: Vec<u32> = ts.iter().map(|t| t.seq).collect();
    assert_eq!(seqs, (0..ts.len() as u32).collect::<Vec<_>>());
    assert_eq!(ts.iter().filter(|t| t.kind == TrialKind::Search).count(), 5);
    assert!(ts.iter().all(|t| t.status != TrialStatus::Running));
    assert!(ts.iter().any(|t| t.attempts > 1), "no trial was run again");
    assert!(engines_with(&marker).is_empty());
    assert!(state.join("reports").join(format!("{id}.md")).is_file());
}

#[test]
fn a_bad_config_exits_64_naming_the_field_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[daemon]\nlisten = \"localhost\"\n", "daemon.listen"),
        ("[daemon]\nschedule = \"0 3 * *\"\n", "daemon.schedule"),
        ("[daemon]\nschedule = \"0 0 30 2 *\"\n", "never fires"),
        (
            "[daemon]\nschedule_tz = \"Europe/Berln\"\n",
            "daemon.schedule_tz: unknown time zone \"Europe/Berln\"",
        ),
        (
            "[daemon]\nprobe_interval_s = 0\n",
            "daemon.probe_interval_s",
        ),
        ("[daemon]\ntoken_file = \"missing\"\n", "daemon.token_file"),
        ("[daemon]\nlisten_addr = \"127.0.0.1:1\"\n", "listen_addr"),
        ("[[study]]\nfile = \"nope.toml\"\n", "study[0].file"),
    ];
    for (i, (body, field)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{i}.toml"));
        let text = if body.contains("[daemon]") {
            body.replacen("[daemon]\n", "[daemon]\nstate_dir = \"state\"\n", 1)
        } else {
            format!("[daemon]\nstate_dir = \"state\"\n{body}")
        };
        std::fs::write(&p, text).unwrap();
        let out = Command::new(BIN)
            .args(["daemon", "--config", p.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{body}: {err}");
        assert!(err.contains(field), "{body}: expected {field} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A token file others can read is refused.
    let tok = dir.path().join("token");
    std::fs::write(&tok, "0123456789abcdef0123").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o644)).unwrap();
    let p = dir.path().join("t.toml");
    std::fs::write(
        &p,
        "[daemon]\nstate_dir = \"state\"\ntoken_file = \"token\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["daemon", "--config", p.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("daemon.token_file") && err.contains("chmod 600"),
        "{err}"
    );
}

// ---- the status page in a browser ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_and_updates_itself_in_headless_chromium() {
    let Some(browser) = common::chromium() else {
        return;
    };
    let f = Fixture::new();
    let cfg = f.config("tune_on_start = false", &[]);
    let (_d, h, api) = f.start(cfg, SimBackend::new("0.10.1", 0)).await;
    let id = api.submit(&sim_study("page", 6)).await;
    api.wait_state(&id, "done").await;
    // The server-rendered page has the chart and the study.
    let (code, ct, html) = api.text("/").await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(html.contains("<svg") && html.contains(&id), "{html}");
    let profile = f.path().join("chromium-profile");
    let dom = common::dump_dom(&browser, &format!("{}/", api.base), &profile, 1280).await;
    // The script ran in the browser, fetched /v1/status and wrote the live line.
    assert!(dom.contains("id=\"live\" data-state=\"ok\""), "{dom}");
    assert!(dom.contains("idle · 0 waiting"), "{dom}");
    assert!(dom.contains("<svg"), "{dom}");
    assert!(dom.contains(&id), "{dom}");
    h.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_shows_every_running_trial_of_a_parallel_study_with_its_slot() {
    let f = Fixture::new();
    let cfg = f.config("tune_on_start = false", &[]);
    let mut backend = SimBackend::new("0.10.1", 300);
    backend.gpus = 2;
    let (_d, h, api) = f.start(cfg, backend).await;
    let id = api.submit(&sim_study("par", 8)).await;
    let st = api
        .wait_for("/v1/status", "two running trials", |j| {
            j["current"]["running"]
                .as_array()
                .is_some_and(|r| r.len() == 2 && r.iter().all(|t| t["kind"] == "search"))
        })
        .await;
    let running = st["current"]["running"].as_array().unwrap();
    let slots: Vec<&str> = running
        .iter()
        .map(|t| t["slot"].as_str().unwrap())
        .collect();
    assert!(
        slots.contains(&"gpu 0") && slots.contains(&"gpu 1"),
        "{slots:?}"
    );
    assert_eq!(st["current"]["trial"], running[1], "the latest is `trial`");
    let (code, _, html) = api.text("/").await;
    assert_eq!(code, 200);
    assert!(html.contains(", on gpu "), "{html}");
    // Every snapshot until the study ends: a trial shown running, search or re-measurement,
    // has its slot (one that waits for a slot is not shown; CI once caught a proposed trial
    // between its proposal and its placement).
    let first: Vec<u64> = running.iter().filter_map(|t| t["seq"].as_u64()).collect();
    let t0 = Instant::now();
    let mut later = std::collections::BTreeSet::new();
    while api.state_of(&id).await != "done" {
        let (_, st) = api.get("/v1/status").await;
        for t in st["current"]["running"].as_array().into_iter().flatten() {
            assert!(
                t["slot"].is_string(),
                "a running trial without its slot: {st}"
            );
            let seq = t["seq"].as_u64().unwrap();
            if !first.contains(&seq) {
                later.insert((seq, t["kind"].as_str().unwrap().to_owned()));
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "study {id} never done"
        );
    }
    assert!(
        later.iter().any(|(_, k)| k == "search") && later.iter().any(|(_, k)| k != "search"),
        "running trials seen after the first two: {later:?}"
    );
    h.stop().await.unwrap();
}

// ---- systemd's notification protocol ----

#[test]
fn the_daemon_tells_systemd_ready_watchdog_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[daemon]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"state\"\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["daemon", "--config", config.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let mut recv = || {
        let n = sock
            .recv(&mut buf)
            .expect("no notification from the daemon");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first = recv();
    assert!(first.starts_with("READY=1\nSTATUS=idle"), "{first:?}");
    // Pings at half the watchdog period while the worker is alive.
    let t0 = Instant::now();
    let mut pings = 0;
    while pings < 2 {
        if recv() == "WATCHDOG=1" {
            pings += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no watchdog pings");
    }
    sigterm(&child);
    let t0 = Instant::now();
    loop {
        let m = recv();
        if m.starts_with("STOPPING=1") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no STOPPING=1");
    }
    assert!(child.wait().unwrap().success());
}

#[test]
fn best_records_are_found_by_model_name_suffix_or_file_name() {
    let gguf = "/root/.cache/servetune/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    assert!(records::model_matches(gguf, "SmolLM2"));
    assert!(records::model_matches(gguf, gguf));
    assert!(records::model_matches(
        "meta-llama/Llama-3.1-8B",
        "Llama-3.1-8B"
    ));
    assert!(!records::model_matches(gguf, "Qwen"));
    assert!(!records::model_matches(
        "meta-llama/Llama-3.1-8B",
        "llama/Llama-3.1-70B"
    ));
}
