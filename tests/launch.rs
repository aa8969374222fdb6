//! The launcher's readiness ladder and failure classes, produced for real with the mock engine
//! (as a subprocess) and with llama-server when it is installed. No engine may be left behind.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

use std::time::Duration;

use servetune::engine::failure::{FailureClass, Patterns};
use servetune::engine::launch::{launch, LaunchError, LaunchSpec, Rung};
use servetune::engine::process::{free_port, group_alive};
use servetune::space::Ladder;

const BIN: &str = env!("CARGO_BIN_EXE_servetune");

fn spec(dir: &std::path::Path, port: u16, extra: &[&str], ladder: Ladder) -> LaunchSpec {
    let mut argv: Vec<String> = vec![
        BIN.into(),
        "mock-engine".into(),
        "--port".into(),
        port.to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    LaunchSpec {
        argv,
        env: vec![],
        host: "127.0.0.1".into(),
        port,
        health_path: "/health".into(),
        models_path: "/v1/models".into(),
        log: dir.join(format!("engine-{port}.log")),
        ladder,
        placement: None,
    }
}

fn quick() -> Ladder {
    Ladder {
        alive: Duration::from_millis(200),
        port: Duration::from_secs(10),
        health: Duration::from_secs(3),
        models: Duration::from_secs(3),
        first_token: Duration::from_secs(2),
    }
}

fn failed(e: LaunchError) -> (Rung, FailureClass, String) {
    match e {
        LaunchError::Failed { rung, failure, .. } => (rung, failure.class, failure.evidence),
        other => panic!("unexpected {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ladder_passes_on_a_healthy_engine_and_teardown_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let ready = launch(&spec(dir.path(), port, &[], quick()), &Patterns::default())
        .await
        .unwrap();
    assert_eq!(ready.model, "mock-model");
    let names: Vec<Rung> = ready.rungs.iter().map(|r| r.0).collect();
    assert_eq!(
        names,
        [
            Rung::Alive,
            Rung::Port,
            Rung::Health,
            Rung::Models,
            Rung::FirstToken
        ]
    );
    let pgid = ready.process.pgid();
    ready.process.terminate(Duration::from_secs(5)).unwrap();
    assert!(!group_alive(pgid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_up_failure_is_classified() {
    let dir = tempfile::tempdir().unwrap();
    let p = Patterns::default();
    let mut used = Vec::new();

    // Bad flag: clap's message for an unknown argument.
    let mut patterns = std::collections::BTreeMap::new();
    patterns.insert(
        "bad_flag".to_string(),
        vec!["unexpected argument".to_string()],
    );
    let clap_aware = Patterns::new(&patterns);
    let port = free_port().unwrap();
    used.push(port);
    let e = launch(&spec(dir.path(), port, &["--bogus"], quick()), &clap_aware)
        .await
        .err()
        .unwrap();
    let (rung, class, evidence) = failed(e);
    assert_eq!((rung, class), (Rung::Alive, FailureClass::BadFlag));
    assert!(evidence.contains("--bogus"), "{evidence}");

    // Port in use: something else holds the port.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    used.push(port);
    let e = launch(&spec(dir.path(), port, &[], quick()), &p)
        .await
        .err()
        .unwrap();
    let (_, class, _) = failed(e);
    assert_eq!(
        class,
        FailureClass::PortInUse,
        "the mock prints 'Address already in use'"
    );
    drop(holder);

    // Start-up timeout: health stays 503 longer than the health limit.
    let port = free_port().unwrap();
    used.push(port);
    let e = launch(
        &spec(dir.path(), port, &["--slow-start-s", "30"], quick()),
        &p,
    )
    .await
    .err()
    .unwrap();
    assert_eq!(failed(e).0, Rung::Health);

    // Hang: healthy, lists its model, never produces a token.
    let port = free_port().unwrap();
    used.push(port);
    let e = launch(&spec(dir.path(), port, &["--hang"], quick()), &p)
        .await
        .err()
        .unwrap();
    let (rung, class, _) = failed(e);
    assert_eq!((rung, class), (Rung::FirstToken, FailureClass::Hang));

    // Crash at the first request.
    let port = free_port().unwrap();
    used.push(port);
    let e = launch(
        &spec(dir.path(), port, &["--crash-after", "0"], quick()),
        &p,
    )
    .await
    .err()
    .unwrap();
    let (rung, class, _) = failed(e);
    assert_eq!(rung, Rung::FirstToken);
    assert!(
        matches!(class, FailureClass::Crash | FailureClass::Hang),
        "{class:?}"
    );

    // Nothing of any of these engines is left.
    for port in used {
        let pattern = format!("mock-engine --port {port}( |$)");
        let out = std::process::Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .unwrap();
        assert!(out.stdout.is_empty(), "left running on port {port}");
    }
}
