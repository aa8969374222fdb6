//! What the daemon's list of studies and its `/metrics` cost as the store grows: loading every
//! trial of every study per request (as before `tune::records` kept summaries), against the
//! daemon's catalog (`daemon::catalog`): built from the summaries on the first request after a
//! write, then shared by every request until the next. Prints a table; run with
//! `cargo bench --bench views`.
//!
//! Each study is a finished daemon run (a queue entry and a record holding a real study file,
//! ten study names re-tuned nightly) with 12 trials whose screen and full measurements carry
//! a summary block of 60 figures, as real runs store the vLLM result block. The records carry
//! no outcome (a real finished one adds its comparisons and checks, some KB, to each decode). Timings in ms are the median of 5
//! repetitions, in µs the mean of 10,000, in one run, so the ratios between rows are what to
//! read; the machine's noise moves the absolute numbers.

use std::collections::BTreeMap;
use std::time::Instant;

use servetune::daemon::catalog::{Catalog, CatalogCache};
use servetune::daemon::queue::{JobState, Queue};
use servetune::store::Store;
use servetune::tune::eval::Measurement;
use servetune::tune::records::{Phase, Records, StudyRecord, TrialKind, TrialRecord, TrialStatus};
use servetune::tune::spec::Study;

const TRIALS_PER_STUDY: u32 = 12;

fn measurement() -> Measurement {
    let latencies: BTreeMap<String, f64> = ["ttft", "tpot", "itl", "e2el"]
        .iter()
        .flat_map(|m| {
            ["mean", "median", "p90", "p99"]
                .iter()
                .map(move |s| (format!("{m}:{s}"), 123.456))
        })
        .collect();
    let summary: serde_json::Map<String, serde_json::Value> = (0..60)
        .map(|i| {
            (
                format!("metric_{i:02}_of_the_vllm_block"),
                serde_json::json!(i as f64 * 1.5),
            )
        })
        .collect();
    Measurement {
        workload: "sharegpt".into(),
        num_prompts: 200,
        duration_s: 61.0,
        completed: 200,
        success_rate: 1.0,
        total_token_throughput: 1234.5,
        output_throughput: 456.7,
        request_throughput: 3.2,
        total_output_tokens: 40_000,
        latencies_ms: latencies,
        summary: Some(serde_json::Value::Object(summary)),
        ..Default::default()
    }
}

fn trial(study: &str, seq: u32, m: &Measurement) -> TrialRecord {
    let mut t: TrialRecord = serde_json::from_value(serde_json::json!({
        "study": study, "seq": seq, "kind": "search",
        "config": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_prefix_caching": true},
        "note": "tpe", "expected_improvement": 0.1, "status": "ok", "engine": "vllm",
        "command": {"env": [], "argv": ["vllm", "serve", "/models/x", "--max-num-seqs", "256"]},
        "engine_version": "0.10.1", "hardware": "1x H100", "screen": null, "full": null,
        "screen_objective": 1200.0, "objective": 1234.5, "promoted": true, "failure": null,
        "early_stop": null, "telemetry": null, "started": 1000.0, "ended": 1090.0,
        "bench_s": 61.0, "saved_s": 0.0, "attempts": 1, "startup_s": 25.0
    }))
    .expect("a valid trial");
    t.full = Some(m.clone());
    t.screen = Some(m.clone());
    t
}

/// A study file as the daemon keeps them: one of ten study names, re-tuned nightly.
fn spec_text(i: usize) -> String {
    format!(
        r#"[study]
name = "study-{}"
model = "meta-llama/Llama-3.1-8B-Instruct"
engines = "vllm"
optimizer = "tpe"
seed = {i}
params = ["max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"]

[constraints]
min_success_rate = 0.99
slo = ["tpot:mean:18", "ttft:p99:2000"]

[budget]
trials = 12

[[workload]]
name = "sharegpt"
args = ["--dataset-name", "random", "--num-prompts", "200", "--tokenizer", "words"]
"#,
        i % 10
    )
}

fn study(id: &str, spec_text: String) -> StudyRecord {
    StudyRecord {
        id: id.into(),
        spec_text,
        name: None,
        metric: None,
        created: 1000.0,
        updated: 2000.0,
        phase: Phase::Done,
        stop_reason: Some("budget".into()),
        trigger: "nightly".into(),
        hardware: "1x H100".into(),
        engine_versions: Default::default(),
        dropped_flags: vec![],
        best_trial: Some(3),
        best_objective: Some(1234.5),
        outcome: None,
        warm_start: vec![],
        log_params: vec![],
        importance: None,
        one_at_a_time: None,
        footprint: None,
        interference: None,
    }
}

fn median_ms(mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

/// Mean microseconds over `n` calls (for what is too quick to time once).
fn mean_us(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    let m = measurement();
    println!("| studies | trials | list, every trial (ms) | metrics, every trial (ms) | catalog build: first request after a write (ms) | request, catalog cached (µs) |");
    println!("|---|---|---|---|---|---|");
    for n in [1usize, 100, 1000] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path()).expect("a store");
        let records = Records::new(store.clone());
        let queue = Queue::new(store.clone());
        let spaces = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces");
        for i in 0..n {
            // Each study is a daemon run: its queue entry (done), its record, its trials.
            let text = spec_text(i);
            let file = std::path::PathBuf::from("bench.toml");
            let parsed = Study::parse_in(&text, &file, Some(&spaces)).expect("a valid study");
            let job = queue
                .enqueue(&parsed, file, "nightly", true, 1.8e9 + 86_400.0 * i as f64)
                .expect("enqueue");
            queue
                .update(&job.study, |j| {
                    j.state = JobState::Done;
                    Ok(())
                })
                .expect("update");
            let id = job.study;
            records.put_study(&study(&id, text)).expect("put");
            for seq in 0..TRIALS_PER_STUDY {
                records.put_trial(&trial(&id, seq, &m)).expect("put");
            }
        }
        records.refresh_summaries().expect("summaries");
        let ids: Vec<String> = records
            .studies()
            .expect("studies")
            .into_iter()
            .map(|r| r.id)
            .collect();

        // Before summaries: GET /v1/studies loaded every trial of every study per request.
        let list_old = median_ms(|| {
            let mut n = 0;
            for id in &ids {
                let ts = records.trials(id).expect("trials");
                n += ts.iter().filter(|t| t.kind == TrialKind::Search).count();
            }
            assert_eq!(n, ids.len() * TRIALS_PER_STUDY as usize);
        });
        // Before summaries: GET /metrics, outcome counts and durations over every trial.
        let metrics_old = median_ms(|| {
            let mut ok = 0;
            let mut durations = Vec::new();
            for id in &ids {
                for t in records.trials(id).expect("trials") {
                    ok += (t.status == TrialStatus::Ok) as usize;
                    durations.extend(t.ended.map(|e| e - t.started));
                }
            }
            assert_eq!(ok, durations.len());
        });
        // Now: the first request after a write builds the catalog (every study record and its
        // summary, every queue entry, the list's JSON) ...
        let build = median_ms(|| {
            let c = Catalog::build(store.generation(), &queue, &records).expect("catalog");
            assert_eq!(c.studies.len(), n);
            assert_eq!(c.jobs.len(), n);
            assert_eq!(c.totals.trials, n * TRIALS_PER_STUDY as usize);
        });
        // ... and every request until the next write shares it: the list's bytes and the
        // metrics' totals, whatever the number of studies.
        let cache = CatalogCache::default();
        let get = || {
            cache
                .get(
                    || store.generation(),
                    |g| Catalog::build(g, &queue, &records),
                )
                .expect("catalog")
        };
        get();
        let cached = mean_us(10_000, || {
            let c = get();
            let body = c.studies_json.clone();
            assert!(body.len() > 2 && c.totals.trials == n * TRIALS_PER_STUDY as usize);
        });
        println!(
            "| {n} | {} | {list_old:.2} | {metrics_old:.2} | {build:.2} | {cached:.2} |",
            n * TRIALS_PER_STUDY as usize,
        );
    }
}
