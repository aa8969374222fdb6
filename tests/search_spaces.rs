//! Every shipped search-space file validates, its defaults render as the bare command, and its
//! samples render with every placeholder replaced and no empty argv element (JSON-valued flags
//! stay one element each; nothing passes through a shell); the shipped engines also form one
//! joint space.

use std::path::Path;

use rand::SeedableRng;
use servetune::space::{RenderCtx, Space};

fn ctx() -> RenderCtx<'static> {
    RenderCtx {
        model: "model.gguf",
        host: "127.0.0.1",
        port: 8080,
        binary: None,
        workdir: Path::new("/tmp/trial"),
    }
}

/// Not empty, and no `{identifier}` left (a JSON object such as `{"method":"ngram"}` is fine).
fn no_placeholder(a: &str) -> bool {
    if a.is_empty() {
        return false;
    }
    a.split('{').skip(1).all(|rest| {
        let inner = rest.split('}').next().unwrap_or("");
        !(rest.contains('}')
            && !inner.is_empty()
            && inner.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
    })
}

#[test]
fn shipped_spaces_validate_and_render() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/search-spaces"));
    let names = Space::available(dir);
    for want in ["llamacpp", "sglang", "trtllm", "vllm"] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    for name in &names {
        let s = Space::load(&dir.join(format!("{name}.toml"))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&s.engine.name, name, "file name and engine.name differ");
        assert!(s.params.iter().all(|p| !p.source.is_empty()));
        let r = s.render(&s.defaults(), &ctx()).unwrap();
        assert_eq!(
            r.argv.len(),
            s.engine.argv.len() + s.engine.fixed.len(),
            "{name}: defaults must render as the bare command: {:?}",
            r.argv
        );
        assert!(r.files.is_empty());
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let Ok(cfg) = s.sample(&mut rng) else {
                continue; // a rejected point (e.g. more GPUs than the node has)
            };
            let r = s.render(&cfg, &ctx()).unwrap();
            assert!(
                r.argv.iter().all(|a| no_placeholder(a)),
                "{name}: {:?}",
                r.argv
            );
            for (path, _) in &r.files {
                assert!(r.argv.contains(&path.display().to_string()));
            }
        }
    }
    assert!(!no_placeholder("--max-model-len={max_model_len}"));
    assert!(no_placeholder(r#"{"method":"ngram"}"#));
    let joint = Space::load_engines(dir, &names.join("+")).unwrap();
    assert_eq!(joint.baselines().len(), names.len());
}

/// The GPU engines' tensor-parallel size is what a trial's GPU count follows (`gpu_factor`);
/// llama.cpp, a single process, needs one.
#[test]
fn shipped_spaces_size_trials_by_their_tensor_parallelism() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/search-spaces"));
    for (engine, tp) in [
        ("vllm", "tensor_parallel_size"),
        ("sglang", "tp_size"),
        ("trtllm", "tp_size"),
    ] {
        let s = Space::load(&dir.join(format!("{engine}.toml"))).unwrap();
        let mut cfg = s.defaults();
        assert_eq!(s.gpus_needed(&cfg), 1, "{engine}");
        cfg.insert(tp.into(), servetune::space::Value::Int(4));
        assert_eq!(s.gpus_needed(&cfg), 4, "{engine}");
        let factors: Vec<&str> = s
            .params
            .iter()
            .filter(|p| p.gpu_factor)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(factors, [tp], "{engine}");
    }
    let l = Space::load(&dir.join("llamacpp.toml")).unwrap();
    assert_eq!(l.gpus_needed(&l.defaults()), 1);
}
