//! The load generator against the in-process mock engine and scripted servers: measured
//! latencies equal the configured ones, every failure kind is produced for real and classified,
//! and the early-abort policy stops runs that cannot pass.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

mod common;

use common::{bench_at, scripted_server, start_mock};
use servetune::bench::record::FailureKind;
use servetune::mock::MockConfig;

fn within(x: f64, target: f64, rel: f64) -> bool {
    (x - target).abs() <= rel * target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measures_configured_latencies_and_counts_tokens() {
    let m = start_mock(MockConfig {
        ttft_ms: 60.0,
        itl_ms: 8.0,
        ..Default::default()
    })
    .await;
    let o = bench_at(
        &m.base_url(),
        &[
            "--random-input-len",
            "40",
            "--random-output-len",
            "20",
            "--num-prompts",
            "40",
            "--max-concurrency",
            "8",
            "--num-warmups",
            "2",
        ],
    )
    .await;
    let s = &o.summary;
    assert_eq!(s.completed, 40);
    assert_eq!(s.failed, 0);
    assert_eq!(s.total_input_tokens, 40 * 40);
    assert_eq!(s.total_output_tokens, 40 * 20);
    assert_eq!(o.records.iter().filter(|r| r.warmup).count(), 2);
    assert!(
        within(s.ttft.median_ms, 60.0, 0.15),
        "ttft {}",
        s.ttft.median_ms
    );
    // Medians: a scheduling hiccup on a shared machine moves a mean, not the median.
    assert!(
        within(s.tpot.median_ms, 8.0, 0.1),
        "tpot {}",
        s.tpot.median_ms
    );
    assert!(within(s.itl.median_ms, 8.0, 0.1), "itl {}", s.itl.median_ms);
    assert_eq!(s.itl.count, 40 * 19);
    assert!(s.max_concurrent_requests <= 8 && s.max_concurrent_requests >= 6);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_token_chunks_give_real_token_itl() {
    let m = start_mock(MockConfig {
        ttft_ms: 20.0,
        itl_ms: 5.0,
        tokens_per_chunk: 4,
        ..Default::default()
    })
    .await;
    let o = bench_at(
        &m.base_url(),
        &[
            "--random-input-len",
            "16",
            "--random-output-len",
            "33",
            "--num-prompts",
            "10",
        ],
    )
    .await;
    let s = &o.summary;
    // Chunks of 4 tokens arrive every 20 ms: vLLM's chunk ITL sees 20 ms, the token-based ITL
    // sees the real 5 ms per token (and TPOT nearly so, see below).
    // The median: on a loaded machine two chunks now and then land in one read, which (as in
    // vLLM) counts a 0 ms gap and pulls the mean down.
    assert!(
        within(s.itl.median_ms, 20.0, 0.1),
        "itl {}",
        s.itl.median_ms
    );
    // TPOT is exactly 4.53 ms here, not 5: the first chunk already carries tokens 0-3 (due at
    // 20 + 3*5 = 35 ms), the last carries token 32 alone (due at 180 ms), so TPOT =
    // (180 - 35) / 32. The old bound (5 ms +- 10%) left 0.03 ms of room, and a late first
    // read on a busy CI machine fell out of it. Medians across requests, so one hiccup does
    // not move it either. 20 %: wide enough for a machine with more runnable threads than
    // cores (measured: 14/15 runs passed at 10 % with three busy loops on 2 cores), still far
    // from the chunk-level 20 ms and the 0 ms a per-chunk count would give.
    let exact_tpot = (5.0 * 32.0 - 5.0 * 3.0) / 32.0;
    assert!(
        within(s.tpot.median_ms, exact_tpot, 0.2),
        "tpot {}",
        s.tpot.median_ms
    );
    assert!(
        within(s.token_itl.median_ms, 5.0, 0.2),
        "token itl {}",
        s.token_itl.median_ms
    );
    assert!(s.token_itl.median_ms > 1.0, "never 0.00 ms");
    assert!(s.max_output_tokens_per_s_token_weighted > s.max_output_tokens_per_s);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_backend_and_closed_loop() {
    let m = start_mock(MockConfig {
        ttft_ms: 5.0,
        itl_ms: 1.0,
        ..Default::default()
    })
    .await;
    let o = bench_at(
        &m.base_url(),
        &[
            "--backend",
            "openai-chat",
            "--random-input-len",
            "10",
            "--random-output-len",
            "8",
            "--num-prompts",
            "30",
            "--max-concurrency",
            "3",
            "--closed-loop",
        ],
    )
    .await;
    assert_eq!(o.summary.completed, 30);
    assert_eq!(o.summary.total_output_tokens, 30 * 8);
    assert!(o.summary.max_concurrent_requests <= 3);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_closing_after_each_response_causes_no_failures() {
    let m = start_mock(MockConfig {
        ttft_ms: 2.0,
        itl_ms: 1.0,
        close_after_response: true,
        ..Default::default()
    })
    .await;
    let o = bench_at(
        &m.base_url(),
        &[
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
            "--num-prompts",
            "100",
            "--max-concurrency",
            "4",
        ],
    )
    .await;
    assert_eq!(o.summary.failed, 0, "{:?}", o.summary.failed_by_reason);
    m.stop().await;
}

async fn only_failure(base: &str, extra: &[&str]) -> (FailureKind, String) {
    let mut flags = vec![
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--num-prompts",
        "3",
        "--random-vocab-size",
        "100",
        "--model",
        "m",
    ];
    flags.extend_from_slice(extra);
    let o = bench_at(base, &flags).await;
    assert_eq!(o.summary.completed, 0);
    assert_eq!(o.summary.failed, 3);
    let r = o.records.iter().find(|r| !r.success).unwrap();
    (r.failure.unwrap(), r.error.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_kind_is_classified() {
    // Connection refused: a port nobody listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let (k, e) = only_failure(&dead, &[]).await;
    assert_eq!(k, FailureKind::Connect, "{e}");

    // HTTP 500 from the mock.
    let m = start_mock(MockConfig {
        failure_rate: 1.0,
        ..Default::default()
    })
    .await;
    let (k, e) = only_failure(&m.base_url(), &[]).await;
    assert_eq!(k, FailureKind::HttpStatus);
    assert!(
        e.contains("HTTP 500") && e.contains("injected failure"),
        "{e}"
    );
    m.stop().await;

    // Malformed SSE payload.
    let base = scripted_server(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: {not json}\n\n").await;
    let (k, e) = only_failure(&base, &[]).await;
    assert_eq!(k, FailureKind::MalformedStream, "{e}");

    // An error object inside the stream.
    let base = scripted_server(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: {\"error\":{\"message\":\"out of memory\"}}\n\n").await;
    let (k, e) = only_failure(&base, &[]).await;
    assert_eq!(k, FailureKind::ServerError);
    assert!(e.contains("out of memory"), "{e}");

    // 200 and [DONE] but no event with choices.
    let base =
        scripted_server(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: [DONE]\n\n").await;
    let (k, e) = only_failure(&base, &[]).await;
    assert_eq!(k, FailureKind::NoContent);
    assert!(e.contains("Never received a valid chunk"), "{e}");

    // The server closes mid-stream (chunked body cut short).
    let base = scripted_server(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2a\r\ndata: {\"choices\":[{\"text\":\"hi\"}]}\n\n\r\n").await;
    let (k, e) = only_failure(&base, &[]).await;
    assert_eq!(k, FailureKind::StreamInterrupted, "{e}");

    // Hang: headers, then nothing; the request time limit ends it.
    let m = start_mock(MockConfig {
        hang: true,
        ..Default::default()
    })
    .await;
    let t = std::time::Instant::now();
    let (k, _) = only_failure(&m.base_url(), &["--request-timeout", "0.5"]).await;
    assert_eq!(k, FailureKind::Timeout);
    assert!(
        t.elapsed().as_secs_f64() < 5.0,
        "never hangs past its timeout"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_run_fails_in_flight_requests() {
    let m = start_mock(MockConfig {
        ttft_ms: 50.0,
        itl_ms: 20.0,
        crash_after: Some(5),
        ..Default::default()
    })
    .await;
    let o = bench_at(
        &m.base_url(),
        &[
            "--random-input-len",
            "8",
            "--random-output-len",
            "50",
            "--num-prompts",
            "20",
            "--max-concurrency",
            "4",
            "--request-timeout",
            "10",
        ],
    )
    .await;
    assert_eq!(o.summary.completed + o.summary.failed, 20);
    assert!(o.summary.failed >= 15, "{:?}", o.summary.failed_by_reason);
    let kinds: Vec<_> = o.summary.failed_by_reason.keys().copied().collect();
    assert!(
        kinds
            .iter()
            .all(|k| matches!(k, FailureKind::StreamInterrupted | FailureKind::Connect)),
        "{kinds:?}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_abort_on_success_floor() {
    let m = start_mock(MockConfig {
        failure_rate: 0.5,
        ttft_ms: 5.0,
        itl_ms: 1.0,
        ..Default::default()
    })
    .await;
    let o = bench_at(
        &m.base_url(),
        &[
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
            "--num-prompts",
            "500",
            "--request-rate",
            "200",
            "--min-success-rate",
            "0.99",
        ],
    )
    .await;
    let why = o.aborted.expect("aborted");
    assert!(why.contains("99.0%"), "{why}");
    assert!(o.not_sent > 300, "stopped early: {} not sent", o.not_sent);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_abort_on_latency_limit_but_not_when_met() {
    let m = start_mock(MockConfig {
        ttft_ms: 80.0,
        itl_ms: 1.0,
        ..Default::default()
    })
    .await;
    let flags = |slo: &'static str| {
        vec![
            "--random-input-len",
            "8",
            "--random-output-len",
            "4",
            "--num-prompts",
            "200",
            "--max-concurrency",
            "10",
            "--slo",
            slo,
            "--abort-min-samples",
            "10",
        ]
    };
    let o = bench_at(&m.base_url(), &flags("ttft:mean:40")).await;
    let why = o.aborted.expect("aborted");
    assert!(why.contains("mean ttft"), "{why}");
    assert!(o.summary.completed < 100);
    let o = bench_at(&m.base_url(), &flags("ttft:p90:500")).await;
    assert!(o.aborted.is_none());
    assert_eq!(o.summary.completed, 200);
    m.stop().await;
}

/// `--tokenizer DIR` loads a Hugging Face tokenizer.json offline and builds and counts the
/// random prompts with it (the mock reports a vocabulary of its own, which is not used); a
/// path that holds no tokenizer stops the run with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_hugging_face_tokenizer_builds_the_prompts() {
    let m = start_mock(MockConfig {
        ttft_ms: 1.0,
        itl_ms: 1.0,
        ..Default::default()
    })
    .await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf-tokenizer");
    let flags = [
        "--tokenizer",
        dir,
        "--random-input-len",
        "9",
        "--random-output-len",
        "3",
        "--num-prompts",
        "6",
    ];
    let (plan, info) = common::args(&[&["--base-url", &m.base_url()][..], &flags[..]].concat())
        .prepare()
        .await
        .unwrap();
    let words = [
        "<s>", "[UNK]", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away",
    ];
    for r in &plan.requests {
        assert!(
            r.prompt.split_whitespace().all(|w| words.contains(&w)),
            "not the fixture's words: {:?}",
            r.prompt
        );
    }
    assert_eq!(info.tokenizer_id, dir);
    let o = servetune::bench::run(plan).await.unwrap();
    assert_eq!(o.summary.completed, 6);
    let e = common::args(&["--base-url", &m.base_url(), "--tokenizer", "/no/such/dir"])
        .prepare()
        .await
        .err()
        .expect("a missing tokenizer is an error");
    assert!(e.to_string().contains("/no/such/dir"), "{e}");
    m.stop().await;
}
