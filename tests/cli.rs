//! The `servetune` binary end to end: `mock-engine` and `bench` as subprocesses, the printed
//! block, the saved JSON with vLLM's keys, clean SIGTERM, and bad input as a clear error.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use servetune::engine::process::{free_port, EngineProcess};

const BIN: &str = env!("CARGO_BIN_EXE_servetune");

fn wait_ok(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(out) = Command::new("curl").args(["-sf", url]).output() {
            if out.status.success() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{url} not ready");
}

#[test]
fn bench_prints_vllm_block_and_saves_vllm_json() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let argv: Vec<String> = [
        BIN,
        "mock-engine",
        "--port",
        &port.to_string(),
        "--ttft-ms",
        "10",
        "--itl-ms",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mock = EngineProcess::spawn(&argv, &[], &dir.path().join("mock.log")).unwrap();
    wait_ok(&format!("http://127.0.0.1:{port}/health"));
    let out = Command::new(BIN)
        .args([
            "bench",
            "--port",
            &port.to_string(),
            "--tokenizer",
            "words",
            "--random-input-len",
            "16",
            "--random-output-len",
            "8",
            "--num-prompts",
            "20",
            "--max-concurrency",
            "4",
            "--goodput",
            "ttft:1000",
            "--save-result",
            "--result-dir",
        ])
        .arg(dir.path())
        .args(["--result-filename", "r.json", "--disable-tqdm"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "============ Serving Benchmark Result ============",
        "Successful requests:                     20        ",
        "Failed requests:                         0         ",
        "Maximum request concurrency:             4         ",
        "Total input tokens:                      320       ",
        "Total generated tokens:                  160       ",
        "Request goodput (req/s):",
        "---------------Time to First Token----------------",
        "P99 ITL (ms):",
        "==================================================",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    let want = [
        "date",
        "endpoint_type",
        "backend",
        "label",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "latencies",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
    ];
    let mut pos = 0;
    for k in want {
        let at = keys
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("missing key {k}"));
        assert!(at >= pos, "key {k} out of vLLM's order");
        pos = at;
    }
    assert_eq!(json["request_rate"], "inf");
    assert_eq!(json["completed"], 20);
    assert_eq!(json["model_id"], "mock-model");
    assert!(
        json.get("ttfts").is_none(),
        "per-request arrays only with --save-detailed"
    );
    let pgid = mock.pgid();
    mock.terminate(Duration::from_secs(5)).unwrap();
    assert!(!servetune::engine::process::group_alive(pgid));
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--dataset-name", "sharegpt"], "--dataset-path"),
        (
            &["bench", "--request-rate", "-3"],
            "request rate must be > 0",
        ),
        (
            &[
                "bench",
                "--model",
                "m",
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                "/nonexistent.json",
            ],
            "/nonexistent.json",
        ),
        (
            &["bench", "--model", "m", "--port", "1", "--num-prompts", "2"],
            "127.0.0.1:1",
        ),
    ];
    for (args, needle) in cases {
        let out = Command::new(BIN)
            .args(*args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn mock_engine_exits_cleanly_on_sigterm() {
    let port = free_port().unwrap();
    let mut child = Command::new(BIN)
        .args(["mock-engine", "--port", &port.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ok(&format!("http://127.0.0.1:{port}/health"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "mock-engine ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
