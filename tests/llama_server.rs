//! The real CPU engine: llama-server with SmolLM2-135M, benchmarked for real with ShareGPT and
//! with exact-length random prompts. Needs `servetune setup llamacpp`; CI sets
//! SERVETUNE_REQUIRE_LLAMA=1 so that a missing engine fails instead of skipping.

mod common;

use std::time::Duration;

use servetune::bench::dataset::{sharegpt, DatasetError};
use servetune::engine::process::{free_port, group_alive, EngineProcess};
use servetune::setup::LlamaPaths;

fn paths() -> Option<LlamaPaths> {
    let p = LlamaPaths::default_paths();
    if p.ready() {
        return Some(p);
    }
    if std::env::var("SERVETUNE_REQUIRE_LLAMA").as_deref() == Ok("1") {
        panic!(
            "llama.cpp assets missing under {}: run `servetune setup llamacpp`",
            p.root.display()
        );
    }
    eprintln!("SKIPPED: llama.cpp assets not installed (run `servetune setup llamacpp`)");
    None
}

/// llama-server launched through the crate's own engine process primitive (own process group,
/// argv only, torn down as a group, also on drop).
async fn start(p: &LlamaPaths, log: &std::path::Path) -> (EngineProcess, u16) {
    let port = free_port().unwrap();
    let argv: Vec<String> = [
        p.server.display().to_string(),
        "-m".into(),
        p.model.display().to_string(),
        "-np".into(),
        "4".into(),
        "-c".into(),
        "8192".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ]
    .to_vec();
    let mut engine = EngineProcess::spawn(&argv, &[], log).expect("spawn llama-server");
    engine
        .wait_http_ok(
            &format!("http://127.0.0.1:{port}/health"),
            Duration::from_secs(120),
        )
        .await
        .expect("llama-server healthy");
    (engine, port)
}

#[test]
fn real_sharegpt_file_is_reported_truncated() {
    let Some(p) = paths() else { return };
    match sharegpt::load(&p.sharegpt, false) {
        Err(DatasetError::Truncated {
            records_read,
            offset,
            ..
        }) => {
            assert_eq!(records_read, 17_671);
            assert!(offset > 100_000_000);
        }
        other => panic!("expected a truncation error, got {other:?}"),
    }
    let l = sharegpt::load(&p.sharegpt, true).unwrap();
    assert_eq!(l.records_read, 17_671);
    assert!(l.conversations.len() > 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmarks_llama_server_for_real() {
    let Some(p) = paths() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = start(&p, &dir.path().join("llama-server.log")).await;
    let base = format!("http://127.0.0.1:{port}");
    let sg = p.sharegpt.to_str().unwrap().to_owned();

    // ShareGPT, lengths measured with the server's own tokenizer.
    let (plan, _) = common::args(&[
        "--base-url",
        &base,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        &sg,
        "--allow-truncated",
        "--num-prompts",
        "12",
        "--sharegpt-output-len",
        "24",
        "--ignore-eos",
        "--max-concurrency",
        "4",
        "--seed",
        "7",
    ])
    .prepare()
    .await
    .unwrap();
    let o = servetune::bench::run(plan).await.unwrap();
    let s = &o.summary;
    assert_eq!(s.completed, 12, "{:?}", s.failed_by_reason);
    assert_eq!(s.total_output_tokens, 12 * 24);
    assert!(s.total_input_tokens >= 12 * 4);
    assert!(s.ttft.mean_ms > 0.0 && s.tpot.mean_ms > 0.0);
    assert!(s.max_concurrent_requests <= 4);

    // Random prompts of an exact length (tokenizer round trip through /tokenize, /detokenize).
    let (plan, _) = common::args(&[
        "--base-url",
        &base,
        "--random-input-len",
        "48",
        "--random-output-len",
        "8",
        "--num-prompts",
        "12",
        "--max-concurrency",
        "4",
    ])
    .prepare()
    .await
    .unwrap();
    assert!(plan.requests.iter().all(|r| r.prompt_len == 48));
    let o = servetune::bench::run(plan).await.unwrap();
    assert_eq!(o.summary.completed, 12, "{:?}", o.summary.failed_by_reason);
    assert_eq!(
        o.summary.total_input_tokens,
        12 * 48,
        "server-counted prompt tokens"
    );
    assert_eq!(o.summary.total_output_tokens, 12 * 8);

    let pgid = server.pgid();
    server.terminate(Duration::from_secs(10)).unwrap();
    assert!(!group_alive(pgid), "llama-server left running");
}

/// CI on a clean machine failed `benchmarks_llama_server_for_real` with "error sending request
/// for url (…/tokenize)": preparing a ShareGPT run asks the server once, then parses the
/// dataset (seconds on a busy machine, blocking the runtime), then tokenizes through the pooled
/// connection, which llama-server (cpp-httplib) closes after 5 idle seconds. Reproduced here
/// by blocking the runtime past that timeout between two calls.
#[tokio::test(flavor = "current_thread")]
async fn the_tokenizer_survives_a_connection_the_server_closed_while_idle() {
    let Some(p) = paths() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = start(&p, &dir.path().join("llama-server.log")).await;
    let t = servetune::tokenizer::RemoteTokenizer::new(&format!("http://127.0.0.1:{port}"), "");
    let first = t.encode("Hello there, how are you?", false).await.unwrap();
    assert!(!first.is_empty());
    for round in 0..3 {
        // A synchronous pause, as a dataset parse is: the pool cannot see the server's close.
        std::thread::sleep(Duration::from_secs(7));
        let again = t.encode("Hello there, how are you?", false).await;
        assert_eq!(
            again.as_ref().ok(),
            Some(&first),
            "round {round}: {again:?}"
        );
    }
    server.terminate(Duration::from_secs(10)).unwrap();
}

/// The shipped llama.cpp search space against the real binary: its `--help` lists every flag
/// of the space, a non-default point renders, launches through the trial launcher (readiness
/// ladder, store record), serves, and tears down with nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_llamacpp_space_launches_the_real_engine_through_the_ladder() {
    use servetune::engine::inventory;
    use servetune::engine::trial::Launcher;
    use servetune::space::{Space, Value};
    let Some(p) = paths() else { return };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces");
    let s = Space::load(&dir.join("llamacpp.toml")).unwrap();
    let bin = vec![p.server.display().to_string()];
    let found = inventory::probe(&s, Some(&bin), Duration::from_secs(30)).await;
    assert!(found.version.is_some(), "{found:?}");
    assert!(found.missing_flags.is_empty(), "{found:?}");

    let tmp = tempfile::tempdir().unwrap();
    let store = servetune::store::Store::open(tmp.path()).unwrap();
    let mut l = Launcher::new(Some(store.clone()), servetune::telemetry::Telemetry::off());
    l.binary = Some(bin);
    let mut cfg = s.defaults();
    for (k, v) in [
        ("parallel", Value::Int(2)),
        ("batch_size", Value::Int(1024)),
        ("ubatch_size", Value::Int(256)),
        ("threads", Value::Int(2)),
        ("flash_attn", Value::Str("on".into())),
        ("cache_type_k", Value::Str("q8_0".into())),
    ] {
        cfg.insert(k.into(), v);
    }
    s.repair(&mut cfg).unwrap();
    s.prune(&mut cfg);
    let e = l
        .start(&s, &cfg, &p.model.display().to_string(), tmp.path())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let argv = e.rendered.argv.join(" ");
    assert!(
        argv.contains("--parallel 2") && argv.contains("--cache-type-k q8_0"),
        "{argv}"
    );
    assert_eq!(store.engines().unwrap().len(), 1);
    let (plan, _) = common::args(&[
        "--base-url",
        &e.base_url,
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--num-prompts",
        "6",
    ])
    .prepare()
    .await
    .unwrap();
    let out = servetune::bench::run(plan).await.unwrap();
    assert_eq!(
        out.summary.completed, 6,
        "{:?}",
        out.summary.failed_by_reason
    );
    let pgid = e.ready.process.pgid();
    e.stop().unwrap();
    assert!(!group_alive(pgid));
    assert!(store.engines().unwrap().is_empty());
}

/// The shipped study, shrunk to a smoke run (3 trials, few prompts, 2 rounds): it completes
/// against the real engine, writes its verdict, and leaves no llama-server behind.
#[test]
fn the_shipped_llama_study_completes_a_smoke_run() {
    if paths().is_none() {
        return;
    }
    let run = common::run_smoke_study("llamacpp-smollm2-sharegpt", 3);
    let (dir, stderr, stdout) = (&run.dir, &run.stderr, &run.stdout);
    assert!(run.status.success(), "{stderr}\n{stdout}");
    assert!(
        stderr.contains("trial 1/3 #0 [engine defaults (baseline)]"),
        "{stderr}"
    );
    assert!(stdout.contains("verdict: "), "{stdout}");
    // Every engine the study started was torn down and verified gone (the launcher removes an
    // engine's record only then).
    let store = servetune::store::Store::open(&dir.path().join("state").join("db")).unwrap();
    assert!(store.engines().unwrap().is_empty(), "engine records left");
}

/// Kills the child on drop: a failed assertion must not leave a study (and its engine)
/// running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGTERM to a foreground `servetune tune` while the engine starts and while it is being
/// benchmarked, and once more with its stderr a pipe nobody reads any more (the pipeline it
/// ran in was killed; the signal watcher used to panic writing its notice before it set the
/// stop flag, and the study and its engine ran on; later the tracing subscriber's fallback
/// `eprintln!` panicked on the next log line and unwound past the engine's teardown, leaving its
/// record): servetune exits 130, and no llama-server and no engine record is left.
#[test]
fn sigterm_during_start_up_or_benchmark_leaves_no_engine() {
    if paths().is_none() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text =
        std::fs::read_to_string(root.join("studies/llamacpp-smollm2-sharegpt.toml")).unwrap();
    let smoke = common::shrink_to_smoke(&text, &root.join("search-spaces"), 3);
    // `None`: right after the engine's log appears (it is loading the model); `Some(marker)`:
    // once its log shows a request in a slot (the benchmark runs).
    for (when, marker, closed_stderr) in [
        ("start-up", None, false),
        ("benchmark", Some("launch_slot"), false),
        ("benchmark with stderr closed", Some("launch_slot"), true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("smoke.toml");
        std::fs::write(&file, &smoke).unwrap();
        let state = dir.path().join("state");
        let mut child = KillOnDrop(
            std::process::Command::new(env!("CARGO_BIN_EXE_servetune"))
                .args([
                    "tune",
                    file.to_str().unwrap(),
                    "--state",
                    state.to_str().unwrap(),
                ])
                // With stderr closed, debug logging makes the study write log lines after the
                // pipe is gone (the tracing subscriber's own fallback used to panic there).
                .env(
                    "SERVETUNE_LOG",
                    if closed_stderr { "debug" } else { "warn" },
                )
                .stdout(std::process::Stdio::null())
                .stderr(if closed_stderr {
                    std::process::Stdio::piped()
                } else {
                    std::process::Stdio::null()
                })
                .spawn()
                .unwrap(),
        );
        // Until the moment comes, the piped stderr is drained (debug logging fills a pipe's
        // 64 KiB quickly, and a full pipe would stall the study); then our end is closed.
        let closing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drain = child.0.stderr.take().map(|mut err| {
            let closing = closing.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                while !closing.load(std::sync::atomic::Ordering::Relaxed) {
                    if matches!(err.read(&mut buf), Ok(0) | Err(_)) {
                        break;
                    }
                }
                // `err` dropped here: the child's next write to stderr fails (EPIPE).
            })
        });
        let log = state
            .join("trials")
            .join("llamacpp-smollm2-sharegpt")
            .join("trial-0000")
            .join("engine.log");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let text = std::fs::read_to_string(&log).ok();
            let reached = match (marker, &text) {
                (None, Some(_)) => true,
                (Some(m), Some(t)) => t.contains(m),
                _ => false,
            };
            if reached {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{when} never reached");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Closing our end of the pipe: the drain stops at its next read (debug lines keep
        // coming), and the child's next write to stderr fails (EPIPE).
        closing.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(d) = drain {
            d.join().unwrap();
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
        // Wait at most 60 s (teardown takes seconds); a study that ignored the signal is killed
        // by the guard after the assertion fails.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.0.try_wait().unwrap() {
                break st;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "SIGTERM during {when}: servetune still running after 60 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        // Exit 130 after a clean stop, stderr closed or not (a panic would be 101).
        assert_eq!(status.code(), Some(130), "SIGTERM during {when}: {status}");
        let left = common::engines_logging_under(dir.path());
        assert!(left.is_empty(), "SIGTERM during {when} left {left:?}");
        let store = servetune::store::Store::open(&state.join("db")).unwrap();
        let records = store.engines().unwrap();
        assert!(
            records.is_empty(),
            "SIGTERM during {when} (exit {status}): engine records left: {records:?}"
        );
    }
}
