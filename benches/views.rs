//! What the daemon's list of studies and its `/metrics` cost as the store grows: the summaries
//! they read now against loading every trial of every study, as they did before
//! (`tune::records`). Prints a table; run with `cargo bench --bench views`.
//!
//! Each study has 12 trials whose screen and full measurements carry a summary block of 60
//! figures, as real runs store the vLLM result block. Timings are the median of 5 repetitions, in one run, so the
//! ratios are what to read; the machine's noise moves the absolute numbers.

use std::collections::BTreeMap;
use std::time::Instant;

use servetune::store::Store;
use servetune::tune::eval::Measurement;
use servetune::tune::records::{
    Histogram, Phase, Records, StudyRecord, TrialKind, TrialRecord, TrialStatus, TRIALS,
};

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

fn study(id: &str) -> StudyRecord {
    StudyRecord {
        id: id.into(),
        spec_text: format!(
            "[study]\nname = \"{}\"\nmodel = \"m\"\n",
            &id[..id.len().min(8)]
        ),
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

fn main() {
    let m = measurement();
    println!("| studies | trials | list, summaries (ms) | list, every trial (ms) | ratio | metrics, summaries (ms) | metrics, every trial (ms) | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for n in [1usize, 100, 1000] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path()).expect("a store");
        let records = Records::new(store.clone());
        for i in 0..n {
            let id = format!("study-{i:05}");
            records.put_study(&study(&id)).expect("put");
            for seq in 0..TRIALS_PER_STUDY {
                // Straight into the tree: the summaries are written once below (the daemon's
                // start-up backfill), which keeps building 12,000 records quick.
                store
                    .put(TRIALS, &format!("{id}/{seq:06}"), &trial(&id, seq, &m))
                    .expect("put");
            }
        }
        records.refresh_summaries().expect("summaries");
        let ids: Vec<String> = records
            .studies()
            .expect("studies")
            .into_iter()
            .map(|r| r.id)
            .collect();

        // GET /v1/studies: every study record with its counts.
        let list_new = median_ms(|| {
            let mut n = 0;
            for id in &ids {
                n += records.summary(id).expect("summary").trials;
            }
            assert_eq!(n, ids.len() * TRIALS_PER_STUDY as usize);
        });
        let list_old = median_ms(|| {
            let mut n = 0;
            for id in &ids {
                let ts = records.trials(id).expect("trials");
                n += ts.iter().filter(|t| t.kind == TrialKind::Search).count();
            }
            assert_eq!(n, ids.len() * TRIALS_PER_STUDY as usize);
        });
        // GET /metrics: outcome counts and the duration histogram over every trial.
        let metrics_new = median_ms(|| {
            let mut h = Histogram::default();
            let mut ok = 0;
            for r in records.studies().expect("studies") {
                let s = records.summary(&r.id).expect("summary");
                h.merge(&s.durations);
                ok += s.ok;
            }
            assert_eq!(ok as u64, h.count);
        });
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
        println!(
            "| {n} | {} | {list_new:.2} | {list_old:.2} | {:.1}x | {metrics_new:.2} | {metrics_old:.2} | {:.1}x |",
            n * TRIALS_PER_STUDY as usize,
            list_old / list_new,
            metrics_old / metrics_new
        );
    }
}
