//! The engines layer end to end, with the mock engine imitating each real engine as a
//! subprocess: shipped search spaces rendered and launched through the trial launcher, every
//! failure class produced by the engine's own message and classified, version gates and
//! `--help` probing against a faked older engine, the store's engine records and the reaper.
//! No engine may be left behind.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use servetune::engine::failure::{FailureClass, OomPhase, Patterns};
use servetune::engine::inventory;
use servetune::engine::launch::{launch, LaunchError, LaunchSpec, Rung};
use servetune::engine::process::group_alive;
use servetune::engine::reap::{groups_with_tag, reap};
use servetune::engine::trial::TrialEngine;
use servetune::space::Ladder;
use servetune::space::{Space, Value};
use servetune::store::Store;

mod common;

fn space(engine: &str) -> Space {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces");
    Space::load(&dir.join(format!("{engine}.toml"))).unwrap()
}

/// Short rung limits for the mock (the files' own are minutes, for real engines).
fn quick(mut s: Space) -> Space {
    s.engine.ready.port_s = Some(10.0);
    s.engine.ready.health_s = Some(5.0);
    s.engine.ready.first_token_s = Some(5.0);
    s
}

/// The mock imitating `engine`, started with the defaults in trial directory `dir` through a
/// launcher recording in `store`.
async fn running_defaults(engine: &str, store: &Store, dir: &Path) -> TrialEngine {
    let s = quick(space(engine));
    common::launcher(Some(store.clone()), common::mock_engine(engine, &[]))
        .start(&s, &s.defaults(), "m", dir)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_engine_launches_serves_and_leaves_nothing() {
    for engine in ["vllm", "sglang", "trtllm", "llamacpp"] {
        let s = quick(space(engine));
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let hw: &[&str] = if engine == "llamacpp" {
            &[
                "--mock-hardware",
                "cpu",
                "--mock-model",
                "135m",
                "--mock-cores",
                "2",
            ]
        } else {
            &[]
        };
        let l = common::launcher(Some(store.clone()), common::mock_engine(engine, hw));
        // A non-default point, so that flags, JSON groups and the YAML file all reach the mock.
        let cfg = match engine {
            "vllm" => common::with(
                s.defaults(),
                &[
                    ("max_num_seqs", Value::Int(64)),
                    ("speculative_method", Value::Str("ngram".into())),
                    ("num_speculative_tokens", Value::Int(3)),
                    ("prompt_lookup_max", Value::Int(4)),
                ],
            ),
            "trtllm" => common::with(
                s.defaults(),
                &[
                    ("kv_cache_reuse", Value::Bool(false)),
                    ("enable_chunked_prefill", Value::Bool(true)),
                ],
            ),
            "llamacpp" => common::with(
                s.defaults(),
                &[
                    ("parallel", Value::Int(2)),
                    ("cont_batching", Value::Bool(false)),
                ],
            ),
            _ => common::with(s.defaults(), &[("max_running_requests", Value::Int(32))]),
        };
        let mut cfg = cfg;
        s.prune(&mut cfg);
        let e = l
            .start(&s, &cfg, "tiny-model", &dir.path().join("t0"))
            .await
            .unwrap_or_else(|e| panic!("{engine}: {e}"));
        assert_eq!(e.ready.model, "tiny-model");
        if engine == "trtllm" {
            let (path, yaml) = &e.rendered.files[0];
            assert!(path.exists() && yaml.contains("enable_block_reuse: false"));
        }
        // The record carries the process group while the engine runs.
        let recs = store.engines().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].pgid, Some(e.ready.process.pgid()));
        let out = common::bench_at(
            &e.base_url,
            &[
                "--dataset-name",
                "random",
                "--random-input-len",
                "64",
                "--random-output-len",
                "16",
                "--num-prompts",
                "12",
                "--model",
                "tiny-model",
            ],
        )
        .await;
        assert_eq!(out.summary.completed, 12, "{engine}");
        let pgid = e.ready.process.pgid();
        let tag = e.tag.clone();
        e.stop().unwrap();
        assert!(!group_alive(pgid));
        assert!(groups_with_tag(&tag).is_empty());
        assert!(store.engines().unwrap().is_empty(), "{engine}: record left");
    }
}

/// A running engine whose handle is dropped without `stop` (a panic unwinding through a
/// study, as a log line written to a closed stderr once caused): its group is killed and its
/// record removed, so nothing is left and the next start sees no leaked engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_dropped_without_stop_is_torn_down_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let e = running_defaults("llamacpp", &store, &dir.path().join("t0")).await;
    let pgid = e.ready.process.pgid();
    let tag = e.tag.clone();
    assert!(group_alive(pgid));
    assert_eq!(store.engines().unwrap().len(), 1);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = e;
        panic!("a study panics while the engine runs");
    }));
    assert!(unwound.is_err());
    assert!(!group_alive(pgid), "the engine's group survived the drop");
    assert!(groups_with_tag(&tag).is_empty());
    assert!(
        store.engines().unwrap().is_empty(),
        "the engine's record survived the drop"
    );
}

/// Issue 20, item 2: `free_port` is check-then-use, so another process may bind the port
/// before the engine does. The launcher starts such an engine again on another port instead of
/// failing the trial (before: the trial failed with `port_in_use`), and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_lost_the_race_for_its_port_is_started_again_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let marker = dir.path().join("lost-once");
    let s = quick(space("vllm"));
    let binary = common::mock_engine(
        "vllm",
        &["--mock-port-taken-once", marker.to_str().unwrap()],
    );
    let e = common::launcher(Some(store.clone()), binary)
        .start(&s, &s.defaults(), "m", &dir.path().join("t0"))
        .await
        .expect("the second start, on another port, serves");
    assert!(marker.exists(), "the first start did not lose the race");
    // Each start has its own log: the lost race's lines stay in the first, so a later
    // failure of this engine (an out-of-memory refusal) is not read as a taken port.
    let t0 = dir.path().join("t0");
    let first = std::fs::read_to_string(t0.join("engine.log.1")).unwrap();
    assert!(first.contains("address already in use"), "{first}");
    let now = std::fs::read_to_string(t0.join("engine.log")).unwrap();
    assert!(!now.contains("address already in use"), "{now}");
    let pgid = e.ready.process.pgid();
    assert!(group_alive(pgid));
    assert_eq!(
        store.engines().unwrap().len(),
        1,
        "only the live engine is recorded"
    );
    e.stop().unwrap();
    assert!(!group_alive(pgid));
    assert!(store.engines().unwrap().is_empty());
}

/// vLLM's start-up failures (an unknown flag, weights or a KV cache that do not fit, out of
/// memory while capturing graphs, more GPUs than the node has) are classified by the engine's
/// own message, which they carry as evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_start_up_failures_carry_the_engines_own_evidence() {
    let vllm = quick(space("vllm"));
    let d = vllm.defaults();

    // A flag the (faked, older) engine does not have.
    let cfg = common::with(
        d.clone(),
        &[("performance_mode", Value::Str("throughput".into()))],
    );
    let (rung, class, ev) = common::start_failure(
        &vllm,
        &cfg,
        common::mock_engine("vllm", &["--mock-version", "0.16.0"]),
        "m",
    )
    .await;
    assert_eq!((rung, class), (Rung::Alive, FailureClass::BadFlag));
    // argparse lists the value after the unknown flag too (as real vLLM 0.32.0 does).
    assert_eq!(
        ev,
        "vllm: error: unrecognized arguments: --performance-mode throughput"
    );

    // Weights larger than the GPU: torch OOM at start.
    let (_, class, ev) = common::start_failure(
        &vllm,
        &d,
        common::mock_engine("vllm", &["--mock-hardware", "l4", "--mock-model", "32b"]),
        "m",
    )
    .await;
    assert_eq!(
        class,
        FailureClass::OutOfMemory {
            phase: OomPhase::Startup
        }
    );
    assert!(
        ev.contains("torch.OutOfMemoryError: CUDA out of memory"),
        "{ev}"
    );

    // The KV cache cannot hold one request of the study's length.
    let mut long = vllm.clone();
    long.set_vars(&BTreeMap::from([("max_model_len".to_string(), 4_000_000)]))
        .unwrap();
    let (_, class, ev) =
        common::start_failure(&long, &d, common::mock_engine("vllm", &[]), "m").await;
    assert_eq!(
        class,
        FailureClass::OutOfMemory {
            phase: OomPhase::Startup
        }
    );
    assert!(
        ev.contains("To serve at least one request with the model's max seq len (4000000)"),
        "{ev}"
    );

    // Almost all memory to the KV cache, big batches: out of memory while capturing graphs.
    let cfg = common::with(
        d.clone(),
        &[
            ("gpu_memory_utilization", Value::Float(0.97)),
            ("max_num_seqs", Value::Int(1024)),
        ],
    );
    let (_, class, ev) =
        common::start_failure(&vllm, &cfg, common::mock_engine("vllm", &[]), "m").await;
    assert_eq!(
        class,
        FailureClass::OutOfMemory {
            phase: OomPhase::GraphCapture
        },
        "{ev}"
    );

    // Tensor parallelism beyond the node's GPUs.
    let cfg = common::with(d.clone(), &[("tensor_parallel_size", Value::Int(2))]);
    let (_, class, ev) =
        common::start_failure(&vllm, &cfg, common::mock_engine("vllm", &[]), "m").await;
    assert_eq!(class, FailureClass::Unsupported);
    assert!(
        ev.contains("World size (2) is larger than the number of available GPUs (1)"),
        "{ev}"
    );
}

/// TensorRT-LLM's, SGLang's and llama-server's start-up failures (FP8 without FP8 kernels, too
/// small a static memory pool, a port taken) are classified by the engine's own message, which
/// they carry as evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trtllm_sglang_and_llama_server_start_up_failures_carry_the_engines_own_evidence() {
    // FP8 on a GPU without FP8 kernels (TensorRT-LLM#4599).
    let trt = quick(space("trtllm"));
    let cfg = common::with(
        trt.defaults(),
        &[("kv_cache_dtype", Value::Str("fp8".into()))],
    );
    let (_, class, ev) = common::start_failure(
        &trt,
        &cfg,
        common::mock_engine("trtllm", &["--mock-hardware", "a100"]),
        "m",
    )
    .await;
    assert_eq!(class, FailureClass::Unsupported);
    assert!(
        ev.contains("Unsupported SM version for FP8 block scaling GEMM"),
        "{ev}"
    );

    // SGLang with too small a static pool.
    let sg = quick(space("sglang"));
    let cfg = common::with(
        sg.defaults(),
        &[("mem_fraction_static", Value::Float(0.15))],
    );
    let (_, class, ev) =
        common::start_failure(&sg, &cfg, common::mock_engine("sglang", &[]), "m").await;
    assert_eq!(
        class,
        FailureClass::OutOfMemory {
            phase: OomPhase::Startup
        }
    );
    assert!(ev.contains("Not enough memory. Please try to increase --mem-fraction-static"));

    // llama-server with its port taken.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let mut argv = common::mock_engine(
        "llamacpp",
        &["--mock-hardware", "cpu", "--mock-model", "135m"],
    );
    argv.extend(
        ["-m", "x.gguf", "--host", "127.0.0.1", "--port"]
            .iter()
            .map(|s| s.to_string()),
    );
    argv.push(port.to_string());
    let spec = LaunchSpec {
        argv,
        env: vec![],
        host: "127.0.0.1".into(),
        port,
        health_path: "/health".into(),
        models_path: "/v1/models".into(),
        log: dir.path().join("e.log"),
        ladder: Ladder {
            port: Duration::from_secs(5),
            ..Ladder::default()
        },
        placement: None,
    };
    let Err(LaunchError::Failed { failure, .. }) = launch(&spec, &Patterns::default()).await else {
        panic!("expected port in use")
    };
    assert_eq!(failure.class, FailureClass::PortInUse);
    assert!(failure
        .evidence
        .contains("couldn't bind HTTP server socket"));
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_dies_mid_benchmark_is_an_oom_during_the_run() {
    // Nearly all memory static, 16k-token prefill chunks: a burst of long prompts needs more
    // activation memory than is left, and the engine dies with torch's message.
    let sg = quick(space("sglang"));
    let cfg = common::with(
        sg.defaults(),
        &[
            ("mem_fraction_static", Value::Float(0.95)),
            ("chunked_prefill_size", Value::Int(16384)),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let l = common::launcher(None, common::mock_engine("sglang", &[]));
    let mut e = l.start(&sg, &cfg, "m", dir.path()).await.unwrap();
    let out = common::bench_at(
        &e.base_url,
        &[
            "--dataset-name",
            "random",
            "--random-input-len",
            "3000",
            "--random-output-len",
            "8",
            "--num-prompts",
            "16",
            "--model",
            "m",
        ],
    )
    .await;
    assert!(out.summary.completed < 16, "the engine should have died");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!e.alive());
    let log = std::fs::read_to_string(&e.log).unwrap();
    let f = Patterns::new(&sg.engine.failures)
        .classify(&log, true)
        .unwrap();
    assert_eq!(
        f.class,
        FailureClass::OutOfMemory {
            phase: OomPhase::Run
        }
    );
    assert!(f.evidence.contains("CUDA out of memory"));
    e.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_gates_and_help_probing_see_what_the_installed_engine_has() {
    let vllm = space("vllm");
    let old = inventory::probe(
        &vllm,
        Some(&common::mock_engine("vllm", &["--mock-version", "0.16.0"])),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(old.version.as_deref(), Some("0.16.0"));
    assert_eq!(
        old.missing_flags,
        vec!["performance_mode".to_string()],
        "{old:?}"
    );
    let new = inventory::probe(
        &vllm,
        Some(&common::mock_engine("vllm", &[])),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(new.version.as_deref(), Some("0.17.1"));
    assert!(new.missing_flags.is_empty(), "{new:?}");
    // trtllm-serve has no --version: the banner of its --help carries it.
    let trt = inventory::probe(
        &space("trtllm"),
        Some(&common::mock_engine("trtllm", &["--mock-version", "1.1.0"])),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(trt.version.as_deref(), Some("1.1.0"), "{trt:?}");
    assert!(trt.missing_flags.is_empty(), "{trt:?}");
    let table = inventory::table(&[old, trt]);
    assert!(table.contains("lacks: performance_mode"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_kills_an_engine_its_dead_owner_left_and_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let e = running_defaults("vllm", &store, &dir.path().join("t")).await;
    let pgid = e.ready.process.pgid();
    let tag = e.tag.clone();
    // As if servetune had been SIGKILLed: nothing tears the engine down.
    std::mem::forget(e);
    assert!(group_alive(pgid));
    let reaped = reap(&store).unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].tag, tag);
    assert_eq!(reaped[0].killed, vec![pgid]);
    // The leader is this test's child: reap its zombie (init would, for a dead servetune).
    unsafe { libc::waitpid(pgid, std::ptr::null_mut(), 0) };
    assert!(!group_alive(pgid));
    assert!(store.engines().unwrap().is_empty());
    // A record whose engine is already gone is simply forgotten.
    let e = running_defaults("vllm", &store, &dir.path().join("t2")).await;
    e.stop().unwrap();
    assert!(reap(&store).unwrap().is_empty());
}

/// Parallel trials: an engine launched with a placement sees only its GPUs. The mock, on a
/// faked 8-GPU node, reports the devices it was given (`/v1/models`, start-up line), refuses
/// tensor parallelism beyond them with vLLM's world-size message, and dies with CUDA's
/// invalid device ordinal on a GPU the node lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placed_engine_sees_only_its_gpus_and_reports_them() {
    use servetune::engine::slots::Placement;
    let s = quick(space("vllm"));
    let binary = common::mock_engine("vllm", &["--mock-gpus", "8"]);
    let placed = |gpus: Vec<u32>| {
        let mut l = common::launcher(None, binary.clone());
        l.placement = Some(Placement {
            gpus,
            cores: vec![],
        });
        l
    };
    let tp = |n: i64| common::with(s.defaults(), &[("tensor_parallel_size", Value::Int(n))]);
    let dir = tempfile::tempdir().unwrap();
    let e = placed(vec![2, 3])
        .start(&s, &tp(2), "m", dir.path())
        .await
        .unwrap();
    let models: serde_json::Value = reqwest::get(format!("{}/v1/models", e.base_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        models["data"][0]["servetune_devices"],
        serde_json::json!([2, 3])
    );
    let log = std::fs::read_to_string(&e.log).unwrap();
    assert!(log.contains("on devices 2,3"), "{log}");
    e.stop().unwrap();

    for (gpus, size, want) in [
        (
            vec![2, 3],
            4,
            "World size (4) is larger than the number of available GPUs (2)",
        ),
        (vec![8], 1, "CUDA error: invalid device ordinal"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let Err(servetune::engine::trial::TrialError::Launch(LaunchError::Failed {
            failure, ..
        })) = placed(gpus).start(&s, &tp(size), "m", dir.path()).await
        else {
            panic!("expected a start-up failure for {want}")
        };
        assert_eq!(failure.class, FailureClass::Unsupported);
        assert!(failure.evidence.contains(want), "{}", failure.evidence);
    }
}
