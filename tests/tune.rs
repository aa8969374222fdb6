//! Tuning studies end to end.
//! - In process, in virtual time (`SimEvaluator`): the study finds the known optimum of a
//!   landscape under a TPOT SLO, never recommends an infeasible point, records failures with
//!   their class, and is deterministic for a seed.
//! - As subprocesses against the mock engine imitating vLLM: a whole `servetune tune` run, and
//!   the same study SIGKILLed mid-trial several times, then resumed: the engine left behind is
//!   killed, the interrupted trial runs again, no finished trial is lost.
//! - Bad study files: errors name the field.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use servetune::mock::evaluator::{SimEvaluator, SimWorkload};
use servetune::mock::profile::{default_version, Machine};
use servetune::mock::sim::{Hardware, ModelSpec};
use servetune::space::{Config, Space, Value};
use servetune::store::Store;
use servetune::tune::decide::CheckState;
use servetune::tune::eval::{Evaluator, RunSpec};
use servetune::tune::opt::Algorithm;
use servetune::tune::records::{self, Phase, Records, StudyRecord, TrialKind, TrialStatus};
use servetune::tune::spec::Study;
use servetune::tune::study::Runner;
use servetune::tune::TuneError;

const BIN: &str = env!("CARGO_BIN_EXE_servetune");

fn spaces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces")
}

fn study_text(name: &str, optimizer: &str, extra: &str) -> String {
    study_text_with(
        name,
        optimizer,
        extra,
        "tpot:mean:18",
        "\"max_num_seqs\", \"max_num_batched_tokens\", \"enable_chunked_prefill\", \"quantization\"",
    )
}

fn study_text_with(name: &str, optimizer: &str, extra: &str, slo: &str, params: &str) -> String {
    format!(
        r#"
[study]
name = "{name}"
model = "mock-8b"
engines = "vllm"
platform = "gpu"                  # the mock engine imitates vLLM on a GPU
optimizer = "{optimizer}"
seed = 3
space_dir = "{spaces}"
params = [{params}]

[constraints]
min_success_rate = 0.99
slo = ["{slo}"]

[budget]
trials = 24

[stopping]
patience = 100
min_trials = 100

[remeasure]
top = 2
repeats = 3

{extra}

# The virtual-time evaluator runs its own workloads; the file's sizes the screening runs
# (0.34 × 400 = 136 prompts, at least 4 waves of 32: screening stays on).
[[workload]]
name = "random"
args = ["--dataset-name", "random", "--num-prompts", "400", "--max-concurrency", "32", "--tokenizer", "words"]
"#,
        spaces = spaces_dir().display()
    )
}

fn sim_runner(store: &Store, name: &str, optimizer: &str, hw: &str) -> Runner<SimEvaluator> {
    sim_runner_with(store, study_text(name, optimizer, ""), hw, "8b")
}

fn sim_runner_with(store: &Store, text: String, hw: &str, model: &str) -> Runner<SimEvaluator> {
    let study = Study::parse(&text, Path::new("sim.toml")).unwrap();
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let space = servetune::tune::restrict(space, study.spec.study.params.as_deref()).unwrap();
    let machine = Machine {
        hw: Hardware::preset(hw, 16).unwrap(),
        model: ModelSpec::preset(model).unwrap(),
        version: default_version("vllm").to_owned(),
    };
    let mut eval = SimEvaluator::new(
        space.clone(),
        machine,
        vec![SimWorkload {
            name: "random".into(),
            num_prompts: 400,
            input_len: 1024,
            output_len: 256,
            prefix_len: 0,
            request_rate: f64::INFINITY,
            max_concurrency: None,
        }],
        0.02,
        7,
    );
    eval.limits = study.limits.clone();
    let dir = tempfile::tempdir().unwrap().keep();
    Runner::new(store.clone(), study, space, eval, dir)
}

fn int(c: &Config, k: &str) -> i64 {
    match c.get(k) {
        Some(Value::Int(v)) => *v,
        other => panic!("{k}: {other:?}"),
    }
}

#[tokio::test]
async fn a_simulated_study_beats_the_defaults_within_the_slo_and_records_failures() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // A 32B model on an A100: without fp8 weights a low memory utilisation runs out of
    // memory at start-up, and only fp8 weights reach TPOT ≤ 30 ms.
    let text = study_text_with(
        "sim-a100",
        "tpe",
        "",
        "tpot:mean:30",
        "\"max_num_seqs\", \"max_num_batched_tokens\", \"gpu_memory_utilization\", \"quantization\"",
    );
    let mut r = sim_runner_with(&store, text, "a100", "32b");
    let rec = r.run().await.unwrap();
    assert_eq!(rec.phase, Phase::Done);
    let ts = Records::new(store.clone()).trials("sim-a100").unwrap();
    let search: Vec<_> = ts.iter().filter(|t| t.kind == TrialKind::Search).collect();
    assert_eq!(search.len(), 24);
    // Trial 0 is the engine's defaults.
    assert_eq!(search[0].config, r.space.defaults());
    // The defaults (bf16 weights) miss TPOT ≤ 30 ms on this load: infeasible, with why.
    assert_eq!(search[0].status, TrialStatus::Infeasible, "{:?}", search[0]);
    assert!(search[0].early_stop.as_deref().unwrap().contains("tpot"));
    // Failures carry their class and the engine's own message.
    let failed: Vec<_> = search
        .iter()
        .filter(|t| t.status == TrialStatus::Failed)
        .collect();
    assert!(
        !failed.is_empty(),
        "the out-of-memory region was never tried"
    );
    for f in &failed {
        let fl = f.failure.as_ref().unwrap();
        assert!(
            ["unsupported", "oom"].contains(&fl.class.as_str()),
            "{fl:?}"
        );
        assert!(!fl.log_excerpt.is_empty());
    }
    // Every trial that counts met the SLO.
    for t in search.iter().filter(|t| t.objective.is_some()) {
        let m = t.full.as_ref().unwrap();
        assert!(m.latencies_ms["tpot:mean"] <= 30.0, "{:?}", m.latencies_ms);
    }
    // The optimiser learnt to avoid the crash: fewer failures in the second half.
    let first = search[..12]
        .iter()
        .filter(|t| t.status == TrialStatus::Failed)
        .count();
    let second = search[12..]
        .iter()
        .filter(|t| t.status == TrialStatus::Failed)
        .count();
    assert!(second <= first, "failures: {first} then {second}");
    let o = rec.outcome.unwrap();
    assert!(o.saved_s > 0.0, "screening saved nothing: {o:?}");
    // The defaults miss the SLO in their pooled re-measurement rounds too, and the
    // recommendation is a configuration that meets it: fp8 weights, the only way to TPOT ≤ 30 ms.
    assert!(
        o.baseline_infeasible
            .as_deref()
            .is_some_and(|w| w.contains("tpot")),
        "{o:?}"
    );
    let best = o
        .recommended
        .expect("a configuration that meets the SLO is recommended");
    assert!(
        o.verdict.starts_with(&format!("run trial #{best}")),
        "{}",
        o.verdict
    );
    let chosen = ts.iter().find(|t| t.seq == best).unwrap();
    assert_eq!(
        chosen.config.get("quantization"),
        Some(&Value::Str("fp8".into())),
        "{:?}",
        chosen.config
    );
    assert!(chosen.full.as_ref().unwrap().latencies_ms["tpot:mean"] <= 30.0);
}

#[tokio::test]
async fn a_simulated_study_finds_the_known_optimum() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut r = sim_runner(&store, "sim-h100", "gp", "h100");
    let rec = r.run().await.unwrap();
    // The true optimum of this landscape by exhaustive search over max_num_seqs (the knob
    // that trades TPOT for throughput), with the rest at their best.
    let mut best = 0.0f64;
    let mut e = SimEvaluator::new(
        r.space.clone(),
        r.eval.machine.clone(),
        r.eval.workloads.clone(),
        0.0,
        7,
    );
    e.limits = r.study.limits.clone();
    let spec = servetune::tune::eval::RunSpec {
        workload: 0,
        fraction: 1.0,
        rate: None,
        abort: false,
        seed_offset: 0,
    };
    for seqs in (8..=2048).step_by(8) {
        for mbt in [8192i64, 16384, 32768] {
            let mut c = r.space.defaults();
            c.insert("max_num_seqs".into(), Value::Int(seqs));
            c.insert("max_num_batched_tokens".into(), Value::Int(mbt));
            if e.start_now(&c).is_err() {
                continue;
            }
            let m = e.run_now(&spec).unwrap();
            if m.violation(0.99, &r.study.limits).is_none() {
                best = best.max(m.total_token_throughput);
            }
        }
    }
    let found = rec.best_objective.unwrap();
    assert!(found >= 0.95 * best, "found {found:.0}, optimum {best:.0}");
    let bt = Records::new(store.clone()).trials("sim-h100").unwrap();
    let b = bt.iter().find(|t| Some(t.seq) == rec.best_trial).unwrap();
    assert!(int(&b.config, "max_num_seqs") < 1024, "{:?}", b.config);
}

#[tokio::test]
async fn the_same_seed_gives_the_same_study() {
    let configs = |name: &'static str| async move {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut r = sim_runner(&store, name, "tpe", "h100");
        r.study.spec.budget.trials = 12;
        r.run().await.unwrap();
        Records::new(store.clone())
            .trials(name)
            .unwrap()
            .into_iter()
            .filter(|t| t.kind == TrialKind::Search)
            .map(|t| t.config)
            .collect::<Vec<_>>()
    };
    let a = configs("det").await;
    let b = configs("det").await;
    assert_eq!(a.len(), 12);
    assert_eq!(a, b);
}

#[test]
fn every_optimiser_name_parses_in_a_study() {
    for k in Algorithm::ALL {
        let text = study_text("names", k.name(), "");
        let s = Study::parse(&text, Path::new("x.toml")).unwrap();
        assert_eq!(s.spec.study.optimizer, Some(k));
    }
}

#[test]
fn bad_study_files_name_the_field() {
    let cases: Vec<(String, &str)> = vec![
        (study_text("x", "tpe", "[budget2]\ntrials = 3"), "budget2"),
        (study_text("x", "simplex", ""), "optimizer"),
        (
            study_text("x", "tpe", "").replace("tpot:mean:18", "tpot:avg:18"),
            "constraints.slo[0]",
        ),
        (
            study_text("x", "tpe", "").replace("min_success_rate = 0.99", "min_success_rate = 1.5"),
            "constraints.min_success_rate",
        ),
        (
            study_text("x", "tpe", "").replace("engines = \"vllm\"", "engines = \"vllmx\""),
            "study.engines",
        ),
        (
            study_text("x", "tpe", "")
                .replace("\"--num-prompts\", \"400\"", "\"--num-prompts\", \"many\""),
            "workload[0] (random).args",
        ),
        (
            study_text("x", "tpe", "").replace("\"--num-prompts\", \"400\"", "\"--port\", \"9\""),
            "--port is set by the study",
        ),
        (
            study_text("x", "tpe", "").replace("repeats = 3", "repeats = 1"),
            "remeasure.repeats",
        ),
        (
            study_text("x", "tpe", "").replace("repeats = 3", "repeats = 3\nmax_repeats = 2"),
            "remeasure.max_repeats",
        ),
        (
            study_text("x", "tpe", "[validation]\nguards = [\"ttft:p99:5\"]"),
            "validation.guards[0]",
        ),
        (
            study_text("x", "tpe", "[screening]\nfraction = 0"),
            "screening.fraction",
        ),
        (study_text("x y", "tpe", ""), "study.name"),
        (
            study_text("x", "tpe", "").replace("[[workload]]", "[[workloadz]]"),
            "workload",
        ),
        (
            study_text("x", "tpe", "[binaries]\nsglang = [\"x\"]"),
            "binaries.sglang",
        ),
        (
            study_text("x", "tpe", "[binaries]\nvllm = [\"@vlm\"]"),
            "binaries.vllm",
        ),
        (
            study_text("x", "tpe", "").replace("platform = \"gpu\"", "platform = \"tpu\""),
            "study.platform",
        ),
    ];
    for (text, want) in cases {
        let err = Study::parse(&text, Path::new("bad.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(want), "expected {want:?} in: {msg}");
    }
    // Unknown parameters are caught when the space is known.
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let err = servetune::tune::restrict(space, Some(&["max_num_seqz".to_string()])).unwrap_err();
    assert!(
        matches!(err, TuneError::Spec(ref m) if m.contains("study.params") && m.contains("max_num_seqz")),
        "{err}"
    );
}

// ---- subprocess studies against the mock engine ----

fn mock_study(dir: &Path, name: &str, trials: u32) -> PathBuf {
    mock_study_with(dir, name, trials, "")
}

/// `mock_study` with more `[study]` settings (`extra`).
fn mock_study_with(dir: &Path, name: &str, trials: u32, extra: &str) -> PathBuf {
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
params = ["max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"]
{extra}

[binaries]
vllm = ["{bin}", "mock-engine", "--profile", "vllm", "--mock-hardware", "h100", "--mock-model", "8b", "--mock-startup-s", "0.3", "--"]

[constraints]
min_success_rate = 0.99
slo = ["tpot:mean:200"]

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
fraction = 0.5

[remeasure]
top = 1
repeats = 2

[[workload]]
name = "short"
args = ["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "24", "--num-prompts", "24", "--max-concurrency", "8", "--tokenizer", "words"]

[[workload]]
name = "long-out"
args = ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "48", "--num-prompts", "12", "--max-concurrency", "4", "--tokenizer", "words"]
"#,
        spaces = spaces_dir().display(),
        bin = BIN
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// No live (non-zombie) mock engine whose command line has `marker`.
fn assert_no_engine_with(marker: &str) {
    let left = common::engines_with(marker);
    assert!(left.is_empty(), "engines left running: {left:?}");
}

fn tune_cmd(study: &Path, state: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "tune",
        study.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ])
    .env("SERVETUNE_LOG", "warn")
    .stdin(Stdio::null());
    c
}

#[test]
fn servetune_tune_runs_a_study_against_the_mock_engine() {
    let dir = tempfile::tempdir().unwrap();
    let study = mock_study(dir.path(), "mock-e2e", 5);
    let state = dir.path().join("state");
    let out = tune_cmd(&study, &state).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    assert!(
        stderr.contains("trial 1/5 #0 [engine defaults (baseline)]"),
        "{stderr}"
    );
    assert!(stdout.contains("verdict:"), "{stdout}");
    // The views of the store.
    let trials = Command::new(BIN)
        .args([
            "trials",
            "mock-e2e",
            "--json",
            "--state",
            state.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(trials.status.success());
    let ts: Vec<serde_json::Value> = serde_json::from_slice(&trials.stdout).unwrap();
    let search = ts.iter().filter(|t| t["kind"] == "search").count();
    assert_eq!(search, 5);
    assert!(ts.iter().all(|t| t["status"] != "running"));
    assert!(
        ts.iter().any(|t| t["kind"] == "remeasure"),
        "no re-measurement: {ts:?}"
    );
    for t in ts.iter().filter(|t| t["status"] == "ok") {
        assert!(t["command"].as_str().unwrap().contains("mock-engine"));
    }
    let best = Command::new(BIN)
        .args(["best", "--json", "--state", state.to_str().unwrap()])
        .output()
        .unwrap();
    let b: Vec<serde_json::Value> = serde_json::from_slice(&best.stdout).unwrap();
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0]["model"], "mock-8b-mock-e2e");
    assert_eq!(b[0]["workload"], "short");
    assert_no_engine_with("mock-8b-mock-e2e");
}

/// While a foreground `tune` holds the store, `trials`, `report` and `best` in another process
/// read the records it mirrors (sled admits one process: they used to fail with "cannot open
/// the store"); they see the trials finished so far, and never write.
#[test]
fn a_running_study_can_be_read_from_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let study = mock_study(dir.path(), "mock-live", 40);
    let state = dir.path().join("state");
    let mut child = tune_cmd(&study, &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let state_s = state.to_str().unwrap().to_owned();
    let read = |args: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--state", state_s.as_str()]);
        Command::new(BIN).args(&a).output().unwrap()
    };
    // Wait until two search trials have finished, read while the study goes on.
    let deadline = Instant::now() + Duration::from_secs(120);
    let ts = loop {
        let out = read(&["trials", "mock-live", "--json"]);
        if out.status.success() {
            let ts: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
            if ts.iter().filter(|t| t["status"] == "ok").count() >= 2 {
                break ts;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no view of the running study: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        child.try_wait().unwrap().is_none(),
        "the study must still be running (budget 40) for this test to mean anything"
    );
    assert_eq!(ts[0]["seq"], 0);
    assert!(ts[0]["command"].as_str().unwrap().contains("mock-engine"));
    let report = read(&["report", "mock-live"]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let md = String::from_utf8_lossy(&report.stdout);
    assert!(md.contains("The study has not finished"), "{md}");
    assert!(read(&["best", "--json"]).status.success());
    // The study itself was not disturbed: it stops cleanly on SIGTERM, and its own store
    // (opened once it is gone) has what the readers saw.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    let ok = finished(&state, "mock-live")
        .iter()
        .filter(|t| t.status == TrialStatus::Ok)
        .count();
    assert!(ok >= 2, "{ok} finished trials in the store");
    assert_no_engine_with("mock-8b-mock-live");
}

/// Whether trial `seq`'s engine has started (its log exists and says so).
fn trial_started(state: &Path, study: &str, seq: u32) -> bool {
    let log = state
        .join("trials")
        .join(study)
        .join(format!("trial-{seq:04}"))
        .join("engine.log");
    std::fs::read_to_string(log).is_ok_and(|s| !s.is_empty())
}

fn finished(state: &Path, study: &str) -> Vec<records::TrialRecord> {
    let store = Store::open(&state.join("db")).unwrap();
    Records::new(store.clone())
        .trials(study)
        .unwrap()
        .into_iter()
        .filter(|t| t.status != TrialStatus::Running)
        .collect()
}

#[test]
fn a_study_killed_mid_trial_resumes_without_losing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let name = "mock-kill";
    let study = mock_study(dir.path(), name, 6);
    let state = dir.path().join("state");
    let mut kept: Vec<records::TrialRecord> = Vec::new();
    // Kill it while trials 1, 3 and 5 run.
    for seq in [1u32, 3, 5] {
        let mut child = tune_cmd(&study, &state)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !trial_started(&state, name, seq) {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "trial {seq} never started"
            );
            if let Ok(Some(st)) = child.try_wait() {
                panic!("servetune exited early: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(150));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let now = finished(&state, name);
        // Nothing finished before is lost or changed.
        for k in &kept {
            assert!(
                now.contains(k),
                "trial {} changed or vanished after a kill",
                k.seq
            );
        }
        kept = now;
        // The engine of the killed run may still be alive: the next run must reap it.
    }
    let out = tune_cmd(&study, &state).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("was interrupted; running it again"),
        "{stderr}"
    );
    let store = Store::open(&state.join("db")).unwrap();
    let rec: StudyRecord = Records::new(store.clone()).study(name).unwrap().unwrap();
    assert_eq!(rec.phase, Phase::Done);
    let ts = Records::new(store.clone()).trials(name).unwrap();
    let seqs: Vec<u32> = ts.iter().map(|t| t.seq).collect();
    assert_eq!(
        seqs,
        (0..ts.len() as u32).collect::<Vec<_>>(),
        "gaps in the trial sequence"
    );
    assert_eq!(ts.iter().filter(|t| t.kind == TrialKind::Search).count(), 6);
    assert!(ts.iter().all(|t| t.status != TrialStatus::Running));
    for k in &kept {
        assert!(ts.contains(k), "trial {} lost", k.seq);
    }
    assert!(ts.iter().any(|t| t.attempts > 1), "no trial was run again");
    drop(store);
    assert_no_engine_with("mock-8b-mock-kill");
}

#[test]
fn a_parallel_study_killed_with_several_trials_running_reaps_every_engine_and_reruns_each() {
    let dir = tempfile::tempdir().unwrap();
    let name = "mock-par-kill";
    // One core per trial: on a machine of n cores, n trials at once (2 here).
    let study = mock_study_with(dir.path(), name, 8, "cores_per_trial = 1");
    let state = dir.path().join("state");
    let mut child = tune_cmd(&study, &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // Two engines at once, after the interference check (trial 2's engine has started).
    while !(trial_started(&state, name, 2)
        && common::engines_with("mock-8b-mock-par-kill").len() >= 2)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "two trials never ran at once"
        );
        if let Ok(Some(st)) = child.try_wait() {
            panic!("servetune exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL, with every slot's engine running
    child.wait().unwrap();
    // Their engines outlive it (own process groups) until the next run reaps them.
    assert!(!common::engines_with("mock-8b-mock-par-kill").is_empty());
    let kept = finished(&state, name);
    let running: Vec<u32> = {
        let store = Store::open(&state.join("db")).unwrap();
        Records::new(store)
            .trials(name)
            .unwrap()
            .iter()
            .filter(|t| t.status == TrialStatus::Running)
            .map(|t| t.seq)
            .collect()
    };
    assert!(!running.is_empty(), "no trial was running at the kill");
    let out = tune_cmd(&study, &state).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("left running by an earlier servetune"),
        "the killed run's engines were not reaped: {stderr}"
    );
    let store = Store::open(&state.join("db")).unwrap();
    let rec: StudyRecord = Records::new(store.clone()).study(name).unwrap().unwrap();
    assert_eq!(rec.phase, Phase::Done);
    assert!(rec.interference.as_ref().is_some_and(|i| i.kept >= 2));
    let ts = Records::new(store.clone()).trials(name).unwrap();
    let seqs: Vec<u32> = ts.iter().map(|t| t.seq).collect();
    assert_eq!(seqs, (0..ts.len() as u32).collect::<Vec<_>>());
    assert_eq!(ts.iter().filter(|t| t.kind == TrialKind::Search).count(), 8);
    assert!(ts.iter().all(|t| t.status != TrialStatus::Running));
    for k in &kept {
        assert!(ts.contains(k), "trial {} lost", k.seq);
    }
    for seq in &running {
        let t = ts.iter().find(|t| t.seq == *seq).unwrap();
        assert!(
            t.attempts > 1,
            "trial {seq} was running at the kill and did not run again"
        );
        assert!(t.slot.as_ref().is_some_and(|p| p.cores.len() == 1));
    }
    drop(store);
    assert_no_engine_with("mock-8b-mock-par-kill");
}

#[test]
fn a_conflicting_study_of_the_same_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let store = Store::open(&state.join("db")).unwrap();
    let text = study_text("same", "tpe", "");
    let s = Study::parse(&text, Path::new("a.toml")).unwrap();
    Records::new(store.clone())
        .put_study(&StudyRecord {
            id: "same".into(),
            spec_text: "something else".into(),
            name: None,
            metric: None,
            created: 0.0,
            updated: 0.0,
            phase: Phase::Search,
            stop_reason: None,
            trigger: "manual".into(),
            hardware: String::new(),
            engine_versions: Default::default(),
            dropped_flags: vec![],
            best_trial: None,
            best_objective: None,
            outcome: None,
            warm_start: vec![],
            log_params: vec![],
            importance: None,
            one_at_a_time: None,
            footprint: None,
            interference: None,
        })
        .unwrap();
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let machine = Machine {
        hw: Hardware::preset("h100", 16).unwrap(),
        model: ModelSpec::preset("8b").unwrap(),
        version: default_version("vllm").to_owned(),
    };
    let eval = SimEvaluator::new(space.clone(), machine, vec![], 0.0, 0);
    let mut r = Runner::new(store, s, space, eval, dir.path().to_path_buf());
    let err = r.open().unwrap_err();
    assert!(err.to_string().contains("--restart"), "{err}");
}

#[tokio::test]
async fn a_max_rate_study_finds_the_highest_rate_within_the_slo() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let text = study_text_with(
        "sim-rate",
        "tpe",
        "[objective]\nmetric = \"max_rate\"\nrate_min = 0.5\nrate_max = 64\nrate_steps = 6",
        "ttft:p99:2000",
        "\"max_num_seqs\", \"max_num_batched_tokens\"",
    );
    // A 32B model on an A100: its sustainable rate lies inside the searched range.
    let mut r = sim_runner_with(&store, text, "a100", "32b");
    r.study.spec.budget.trials = 8;
    let rec = r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("sim-rate").unwrap();
    let ok: Vec<_> = ts
        .iter()
        .filter(|t| t.kind == TrialKind::Search && t.objective.is_some())
        .collect();
    assert!(!ok.is_empty());
    for t in &ok {
        let m = t.full.as_ref().unwrap();
        let rate = t.objective.unwrap();
        // The objective is the rate the run was made at, and it met the SLO there.
        assert_eq!(m.request_rate, Some(rate));
        assert!((0.5..=64.0).contains(&rate));
        assert!(m.latencies_ms["ttft:p99"] <= 2000.0, "{:?}", m.latencies_ms);
    }
    assert!(rec.outcome.unwrap().metric.contains("request rate"));
    // Highest: the best trial's rate plus the bisection's resolution misses the SLO, measured
    // again here (fresh prompts), so the search did not stop below what the engine sustains.
    let best = ok
        .iter()
        .max_by(|a, b| a.objective.unwrap().total_cmp(&b.objective.unwrap()))
        .unwrap();
    let (rate, width) = (
        best.objective.unwrap(),
        best.full.as_ref().unwrap().resolution.unwrap(),
    );
    assert!(
        rate < 64.0,
        "the best rate is at the top of the range: nothing to check"
    );
    assert!(
        width > 0.0 && width <= rate,
        "resolution {width} at rate {rate}"
    );
    let run_at = |rate: f64| RunSpec {
        workload: 0,
        fraction: 1.0,
        rate: Some(rate),
        abort: false,
        seed_offset: 7,
    };
    r.eval.start(&best.config, dir.path()).await.unwrap();
    let above = r.eval.run(&run_at(rate + width)).await.unwrap();
    r.eval.stop().await.unwrap();
    assert!(
        above.latencies_ms["ttft:p99"] > 2000.0,
        "{} req/s (the best {rate} + resolution {width}) also meets the SLO: {:?}",
        rate + width,
        above.latencies_ms
    );
}

/// The simulated study the report tests read: 14 trials of TPE over four vLLM parameters (two
/// log-scaled, one categorical) on two workloads.
async fn run_report_study(store: &Store) {
    let text = study_text_with(
        "sim-report",
        "tpe",
        "",
        "tpot:mean:30",
        "\"max_num_seqs\", \"max_num_batched_tokens\", \"gpu_memory_utilization\", \"quantization\"",
    ) + "\n[[workload]]\nname = \"second\"\nargs = [\"--dataset-name\", \"random\", \"--random-input-len\", \"256\", \"--random-output-len\", \"128\", \"--num-prompts\", \"100\", \"--max-concurrency\", \"32\", \"--tokenizer\", \"words\"]\n";
    // The file's "second" describes what the virtual-time evaluator runs for it (below): the
    // report prints these flags as the workload's.
    let mut r = sim_runner_with(store, text, "a100", "32b");
    // The primary as the file's flags describe it (`--dataset-name random` defaults to 1024
    // input and 128 output tokens; `--max-concurrency 32`).
    r.eval.workloads[0].output_len = 128;
    r.eval.workloads[0].max_concurrency = Some(32);
    r.eval.workloads.push(SimWorkload {
        name: "second".into(),
        num_prompts: 100,
        input_len: 256,
        output_len: 128,
        prefix_len: 0,
        request_rate: f64::INFINITY,
        max_concurrency: Some(32),
    });
    r.study.spec.budget.trials = 14;
    r.run().await.unwrap();
}

/// The report of a simulated study, compared with the snapshot in `tests/snapshots/` (insta:
/// `cargo insta review`, or INSTA_UPDATE=always, after an intended change). The virtual-time evaluator makes
/// every figure deterministic; wall-clock times do not appear in the report.
#[tokio::test]
async fn the_report_of_a_study_matches_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    run_report_study(&store).await;
    let md = servetune::report::render(&store, "sim-report", "md", None).unwrap();
    // The shape: conclusion first, then the sections of the seeds' reports.
    let order = [
        "## Conclusion",
        "## Environment",
        "## Engine selection",
        "## Options explored",
        "## Trials",
        "## Failures",
    ];
    let pos: Vec<usize> = order
        .iter()
        .map(|h| md.find(h).unwrap_or_else(|| panic!("{h} missing")))
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "sections out of order");
    insta::assert_snapshot!("report-sim", md);
    // JSON carries the same data and the charts; HTML embeds them.
    let json: serde_json::Value = serde_json::from_str(
        &servetune::report::render(&store, "sim-report", "json", None).unwrap(),
    )
    .unwrap();
    assert_eq!(json["study"]["id"], "sim-report");
    assert!(json["charts"]["best-so-far"]
        .as_str()
        .unwrap()
        .starts_with("<svg"));
    assert!(json["charts"]["throughput-vs-tpot"]
        .as_str()
        .unwrap()
        .contains("<circle"));
    let html = servetune::report::render(&store, "sim-report", "html", None).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.matches("<svg").count() >= 3);
    assert!(servetune::report::render(&store, "sim-report", "pdf", None).is_err());
    assert!(servetune::report::render(&store, "nope", "md", None).is_err());
}

/// What the probe script appended to the HTML report measured in the browser.
fn probe_of(dom: &str) -> serde_json::Value {
    let start = dom.find("data-probe=\"").expect("the probe ran") + "data-probe=\"".len();
    let raw = &dom[start..start + dom[start..].find('"').unwrap()];
    let json = raw
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// The HTML report, rendered by headless Chromium in an 800-pixel window: the verdict is a
/// visible banner, a REGRESSION cell is red and bold, a long recommended command wraps
/// instead of widening the page, log-scaled parameters' effect charts have a log axis with
/// power-of-two ticks, and a categorical chart's ticks are its values.
#[tokio::test]
async fn the_html_report_marks_the_verdict_and_regressions_and_fits_the_page_in_chromium() {
    let Some(browser) = common::chromium() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    run_report_study(&store).await;
    // A regression on the second workload, and a recommended command with a 600-character
    // argument that has no space to break at.
    let mut rec: StudyRecord = Records::new(store.clone())
        .study("sim-report")
        .unwrap()
        .unwrap();
    let out = rec.outcome.as_mut().expect("finished");
    assert!(
        out.recommended.is_some(),
        "the study recommends a configuration"
    );
    let check = out.checks.last_mut().expect("checks of the leader");
    check.state = CheckState::Regression;
    let mut cmd = out.recommended_command.clone().expect("a command");
    cmd.argv.push("--speculative-config".into());
    cmd.argv
        .push(format!("{{\"draft\":\"{}\"}}", "x".repeat(600)));
    out.recommended_command = Some(cmd);
    Records::new(store.clone()).put_study(&rec).unwrap();

    let html = servetune::report::render(&store, "sim-report", "html", None).unwrap();
    let probe = r#"<script>
const r = {};
const cmd = document.getElementById('command');
r.command_wraps = cmd.scrollWidth <= cmd.clientWidth + 1;
r.command_lines = Math.round(cmd.getBoundingClientRect().height / parseFloat(getComputedStyle(cmd).lineHeight || 16));
r.page_fits = document.documentElement.scrollWidth <= window.innerWidth + 1;
const reg = document.querySelector('td.regression');
r.regression = reg && { text: reg.textContent, color: getComputedStyle(reg).color, weight: getComputedStyle(reg).fontWeight };
const v = document.getElementById('verdict');
r.verdict = { cls: v.className, label: v.querySelector('.label').textContent, height: v.offsetHeight, border: getComputedStyle(v).borderLeftWidth };
r.charts = {};
for (const s of document.querySelectorAll('svg[data-x-axis]')) {
  r.charts[s.parentElement.id] = { axis: s.dataset.xAxis, ticks: [...s.querySelectorAll('text.x-tick')].map(t => t.textContent) };
}
document.body.setAttribute('data-probe', JSON.stringify(r));
</script></body>"#;
    let page = dir.path().join("report.html");
    std::fs::write(&page, html.replace("</body>", probe)).unwrap();
    let dom = common::dump_dom(
        &browser,
        &format!("file://{}", page.display()),
        &dir.path().join("chromium-profile"),
        800,
    )
    .await;
    let p = probe_of(&dom);

    assert_eq!(p["verdict"]["cls"], "verdict recommend", "{p}");
    assert_eq!(p["verdict"]["label"], "Recommended", "{p}");
    assert!(p["verdict"]["height"].as_f64().unwrap() > 10.0, "{p}");
    assert_eq!(p["verdict"]["border"], "6px", "{p}");

    let reg = &p["regression"];
    assert!(
        reg["text"].as_str().unwrap().ends_with(" REGRESSION"),
        "{p}"
    );
    assert_eq!(reg["color"], "rgb(176, 0, 32)", "{p}");
    assert_eq!(reg["weight"], "700", "{p}");

    assert_eq!(p["command_wraps"], true, "{p}");
    assert!(p["command_lines"].as_f64().unwrap() >= 3.0, "{p}");
    assert_eq!(p["page_fits"], true, "{p}");

    for log_param in ["max_num_seqs", "max_num_batched_tokens"] {
        let c = &p["charts"][format!("chart-effect-{log_param}")];
        assert_eq!(c["axis"], "log", "{log_param}: {p}");
        let ticks: Vec<f64> = c["ticks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().parse().unwrap())
            .collect();
        assert!(ticks.len() >= 2, "{log_param}: {ticks:?}");
        let powers_of = |b: f64| ticks.iter().all(|t| (t.ln() / b.ln()).fract().abs() < 1e-9);
        assert!(
            powers_of(2.0) || powers_of(10.0),
            "{log_param}: ticks are powers of two or ten: {ticks:?}"
        );
    }
    let gmu = &p["charts"]["chart-effect-gpu_memory_utilization"];
    assert_eq!(gmu["axis"], "linear", "{p}");
    let q = &p["charts"]["chart-effect-quantization"];
    assert_eq!(q["axis"], "categorical", "{p}");
    let ticks: Vec<&str> = q["ticks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let mut sorted = ticks.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        ["fp8", "none"],
        "categorical ticks are the values tried: {ticks:?}"
    );
}

/// `@vllm` and `@smollm2-hf` stand for what `servetune setup vllm` installs, in `[binaries]`
/// and as the model.
#[test]
fn vllm_setup_aliases_resolve_to_the_installed_paths() {
    let text = study_text("x", "tpe", "[binaries]\nvllm = [\"@vllm\"]")
        .replace("model = \"mock-8b\"", "model = \"@smollm2-hf\"");
    let s = Study::parse(&text, Path::new("x.toml")).unwrap();
    let p = servetune::setup::VllmPaths::default_paths();
    assert_eq!(s.spec.binaries["vllm"], vec![p.vllm.display().to_string()]);
    assert_eq!(s.model, p.model.display().to_string());
}

#[test]
fn a_guard_that_cannot_be_decided_at_the_workloads_size_is_refused_at_the_start() {
    // 400 prompts: 4 beyond the 99th percentile per round (< 5), 40 beyond the 90th.
    let text = study_text(
        "guards",
        "gp",
        "[validation]\nguards = [\"ttft:p90\", \"ttft:p99\", \"tpot:mean\"]",
    );
    let err = Study::parse(&text, Path::new("x.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("validation.guards[1]")
            && err.contains("\"ttft:p99\" cannot be decided")
            && err.contains("at least 500"),
        "{err}"
    );
    // At 500 prompts the same guards can be decided.
    let s = Study::parse(&text.replace("\"400\"", "\"500\""), Path::new("x.toml"));
    assert!(s.is_ok(), "{:?}", s.err());
}

/// The default guard is mean TTFT, never TPOT: more slots trade a longer time per token for
/// throughput, the very trade the objective makes (issue 20, item 7).
#[test]
fn the_default_guard_is_mean_ttft_not_the_tpot_the_objective_trades() {
    let s = Study::parse(&study_text("g", "gp", ""), Path::new("x.toml")).unwrap();
    assert_eq!(s.spec.validation.guards, vec!["ttft:mean".to_string()]);
}

#[test]
fn a_study_without_an_optimiser_gets_the_benchmarks_choice_for_its_dimension_and_budget() {
    let text = study_text("auto", "gp", "").replace("optimizer = \"gp\"\n", "");
    let s = Study::parse(&text, Path::new("x.toml")).unwrap();
    assert_eq!(s.spec.study.optimizer, None);
    let space = servetune::space::Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let (small, _) = space.without(
        &space
            .params
            .iter()
            .skip(3)
            .map(|p| p.name.clone())
            .collect::<Vec<_>>(),
    );
    assert_eq!(servetune::tune::opt::default_for(&small, 12), Algorithm::Gp);
    assert_eq!(
        servetune::tune::opt::default_for(&space, 12),
        Algorithm::Tpe
    );
    // From 20 trials the GP leads in a large space too.
    assert_eq!(servetune::tune::opt::default_for(&space, 20), Algorithm::Gp);
}

/// The importance phase on a simulated study: one trial per option, each alone away from the
/// defaults, right after them; what it found stored with the study and in the report; the
/// options it froze stay at their defaults for the rest of the search.
#[tokio::test]
async fn the_importance_phase_moves_each_option_alone_and_the_search_keeps_the_frozen_ones_at_their_defaults(
) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let text = study_text_with(
        "sim-oat",
        "gp",
        "[importance]\none_at_a_time = true\nfreeze_below = 0.05\n",
        "tpot:mean:30",
        "\"max_num_seqs\", \"max_num_batched_tokens\", \"enable_chunked_prefill\", \"enable_prefix_caching\"",
    );
    let mut r = sim_runner_with(&store, text, "h100", "8b");
    r.study.spec.budget.trials = 12;
    let rec = r.run().await.unwrap();
    let trials = Records::new(store.clone()).trials("sim-oat").unwrap();
    let search: Vec<_> = trials
        .iter()
        .filter(|t| t.kind == records::TrialKind::Search)
        .collect();
    let defaults = r.space.defaults();
    let f = rec.one_at_a_time.as_ref().expect("the phase's findings");
    assert_eq!(f.moved.len(), 4, "{f:?}");
    for (i, m) in f.moved.iter().enumerate() {
        let t = search[1 + i];
        assert!(t.note.contains("importance phase"), "{}", t.note);
        let changed: Vec<&String> = t
            .config
            .iter()
            .filter(|(k, v)| defaults.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(changed, vec![&m.param], "trial {}: {:?}", t.seq, t.config);
        assert_eq!(t.config.get(&m.param), Some(&m.value));
    }
    // The defaults and the moves run in full whatever their screen reads (the phase compares
    // full readings only); later trials are screened, and some never get the full run.
    for t in &search[..5] {
        assert!(
            t.early_stop.is_some() || (t.promoted && t.full.is_some()),
            "trial {}: promoted {}, full {}",
            t.seq,
            t.promoted,
            t.full.is_some()
        );
    }
    assert!(
        search[5..].iter().any(|t| t.full.is_none()),
        "screening never held a trial back: the check above proves nothing"
    );
    // max_num_seqs trades TPOT for throughput on this landscape: never frozen.
    let seqs = f.moved.iter().find(|m| m.param == "max_num_seqs").unwrap();
    assert!(!seqs.frozen, "{seqs:?}");
    assert!(!f.frozen().is_empty(), "nothing frozen: {f:#?}");
    for m in f.moved.iter().filter(|m| m.frozen) {
        for t in &search[5..] {
            assert_eq!(
                t.config.get(&m.param),
                defaults.get(&m.param),
                "{}",
                m.param
            );
        }
    }
    let md = servetune::report::render(&store, "sim-oat", "md", None).unwrap();
    assert!(md.contains("### One at a time from the defaults"), "{md}");
    for m in &f.moved {
        assert!(
            md.contains(&format!("| {} | {} |", m.param, m.value)),
            "{md}"
        );
    }
}

#[tokio::test]
async fn an_importance_phase_that_leaves_no_room_for_the_search_is_refused_before_any_trial() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let text = study_text(
        "sim-oat-small",
        "gp",
        "[importance]\none_at_a_time = true\n",
    );
    let mut r = sim_runner_with(&store, text, "h100", "8b");
    r.study.spec.budget.trials = 5;
    let e = r.run().await.unwrap_err().to_string();
    assert!(
        e.contains("importance.one_at_a_time") && e.contains("budget.trials = 5"),
        "{e}"
    );
    assert!(Records::new(store)
        .trials("sim-oat-small")
        .unwrap()
        .is_empty());
}

/// The grid enumerates the whole space's points and the reports' procedure moves one option
/// at a time itself: neither searches the space the phase reduces, so a study that asks for
/// both is refused before any trial, naming the optimisers that can.
#[tokio::test]
async fn an_importance_phase_with_an_optimiser_that_cannot_use_it_is_refused_before_any_trial() {
    for algo in ["grid", "reports"] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let name = format!("sim-oat-{algo}");
        let text = study_text(&name, algo, "[importance]\none_at_a_time = true\n");
        let mut r = sim_runner_with(&store, text, "h100", "8b");
        r.study.spec.budget.trials = 20;
        let e = r.run().await.unwrap_err().to_string();
        assert!(
            e.contains("importance.one_at_a_time")
                && e.contains(&format!("the {algo} optimiser"))
                && e.contains("gp, tpe"),
            "{e}"
        );
        assert!(Records::new(store).trials(&name).unwrap().is_empty());
    }
}

#[test]
fn run_trial_runs_a_self_contained_spec_pinned_to_its_slot_and_prints_the_record() {
    use servetune::engine::slots::Placement;
    use servetune::tune::records::TrialRecord;
    use servetune::tune::study::{Against, TrialSpec, TRIAL_SPEC_VERSION};
    let dir = tempfile::tempdir().unwrap();
    let name = "mock-exec";
    let study = mock_study(dir.path(), name, 4);
    let mut spaces = std::collections::BTreeMap::new();
    spaces.insert(
        "vllm.toml".to_owned(),
        std::fs::read_to_string(spaces_dir().join("vllm.toml")).unwrap(),
    );
    let mut config = Config::new();
    config.insert("max_num_seqs".into(), Value::Int(8));
    let trial = TrialRecord {
        study: name.into(),
        seq: 3,
        kind: TrialKind::Search,
        config,
        note: "handed to an executor".into(),
        expected_improvement: None,
        status: TrialStatus::Running,
        engine: None,
        command: None,
        engine_version: None,
        hardware: String::new(),
        screen: None,
        full: None,
        screen_objective: None,
        objective: None,
        promoted: false,
        failure: None,
        early_stop: None,
        telemetry: None,
        started: 0.0,
        ended: None,
        bench_s: 0.0,
        saved_s: 0.0,
        attempts: 1,
        stopped: 0,
        startup_s: None,
        retried_after: None,
        slot: Some(Placement {
            gpus: vec![],
            cores: vec![0],
        }),
        defaults: false,
    };
    let spec = TrialSpec {
        version: TRIAL_SPEC_VERSION,
        // The study file names a space_dir of this machine; the spec's own copy is used.
        study_file: std::fs::read_to_string(&study).unwrap(),
        spaces,
        trial,
        against: Against {
            always_full: true,
            ..Against::default()
        },
    };
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, serde_json::to_string(&spec).unwrap()).unwrap();
    let state = dir.path().join("executor");
    let out = Command::new(BIN)
        .args(["run-trial", spec_path.to_str().unwrap(), "--state"])
        .arg(&state)
        .env("SERVETUNE_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let t: TrialRecord = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(t.seq, 3);
    assert_eq!(t.status, TrialStatus::Ok, "{:?}", t.failure);
    assert!(t.objective.is_some_and(|v| v > 0.0));
    assert!(t.full.is_some());
    let cmd = t.command.as_ref().unwrap().display();
    assert!(cmd.contains("--max-num-seqs 8"), "{cmd}");
    assert_eq!(t.slot.as_ref().unwrap().cores, vec![0]);
    // The engine ran on the spec's core and is gone.
    let log = std::fs::read_to_string(
        state
            .join("trials")
            .join(name)
            .join("trial-0003")
            .join("engine.log"),
    )
    .unwrap();
    assert!(!log.is_empty());
    assert_no_engine_with("mock-8b-mock-exec");
    // A spec of another version is refused with a message naming it.
    let mut bad: serde_json::Value = serde_json::to_value(&spec).unwrap();
    bad["version"] = serde_json::json!(99);
    std::fs::write(&spec_path, bad.to_string()).unwrap();
    let out = Command::new(BIN)
        .args(["run-trial", spec_path.to_str().unwrap(), "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("trial spec version 99"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
