//! Unit tests of the search-space format: parsing, validation errors, sampling, constraints,
//! rendering (flags, JSON groups, YAML files), joint spaces, version gates and help probing.

use super::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

const MINI: &str = r#"
[engine]
name = "x"
binary = "x-server"
argv = ["{binary}", "-m", "{model}", "--port", "{port}"]

[[param]]
name = "batch"
flag = "--batch"
type = "int"
min = 32
max = 4096
log = true
default = 2048
source = "test"

[[param]]
name = "ubatch"
flag = "--ubatch"
type = "int"
min = 32
max = 4096
log = true
default = 512
source = "test"

[[param]]
name = "cb"
flag = "--cb"
type = "bool"
render = "switch"
default = true
source = "test"

[[param]]
name = "mode"
flag = "--mode"
type = "categorical"
values = ["a", "b"]
default = "a"
render = "equals"
when = { cb = true }
source = "test"

[[constraint]]
lhs = "ubatch"
op = "<="
rhs = "batch"
"#;

#[test]
fn defaults_render_as_the_bare_command() {
    let s = Space::parse(MINI, "mini.toml").unwrap();
    let d = s.defaults();
    let r = s.render(&d, &ctx("m.gguf")).unwrap();
    let (argv, env) = (r.argv, r.env);
    assert_eq!(argv, ["x-server", "-m", "m.gguf", "--port", "9"]);
    assert!(env.is_empty());
}

#[test]
fn samples_respect_ranges_conditions_and_constraints() {
    let s = Space::parse(MINI, "mini.toml").unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..500 {
        let c = s.sample(&mut rng).unwrap();
        let (Value::Int(b), Value::Int(u)) = (&c["batch"], &c["ubatch"]) else {
            panic!()
        };
        assert!((32..=4096).contains(b) && u <= b);
        assert_eq!(c.contains_key("mode"), c["cb"] == Value::Bool(true));
    }
    let mut c = s.defaults();
    c.insert("cb".into(), Value::Bool(false));
    c.insert("batch".into(), Value::Int(64));
    let argv = s.render(&c, &ctx("m")).unwrap().argv;
    assert!(argv.contains(&"--no-cb".to_string()));
    assert!(argv.windows(2).any(|w| w == ["--batch", "64"]));
}

#[test]
fn version_gates_drop_flags_outside_their_versions() {
    assert_eq!(
        compare_versions("0.10.2", "0.9.12"),
        std::cmp::Ordering::Greater
    );
    // PEP 440 order: dev < a < b < rc < release < post; trailing zeros and a local part
    // do not count.
    let ordered = [
        "0.9.12",
        "1.2.0-dev",
        "1.2.0.dev1",
        "1.2.0a1",
        "1.2.0b2",
        "v1.2.0rc1",
        "1.2.0rc2",
        "1.2",
        "1.2.0.post1",
        "1.2.1",
        "1.10.0",
    ];
    for w in ordered.windows(2) {
        assert_ne!(
            compare_versions(w[0], w[1]),
            std::cmp::Ordering::Greater,
            "{} vs {}",
            w[0],
            w[1]
        );
    }
    assert_eq!(
        compare_versions("v1.2.0rc1", "1.2.0"),
        std::cmp::Ordering::Less
    );
    assert_eq!(
        compare_versions("1.2.0.post1", "1.2.0"),
        std::cmp::Ordering::Greater
    );
    assert_eq!(
        compare_versions("1.2.0+cu121", "1.2"),
        std::cmp::Ordering::Equal
    );
    // A since gate does not pass on a release candidate of its version.
    let gated = MINI.replace(
        "render = \"equals\"",
        "render = \"equals\"\nsince = \"2.0\"",
    );
    let s = Space::parse(&gated, "g.toml").unwrap();
    let (old, dropped) = s.for_version("1.9.9");
    assert_eq!(dropped, vec!["mode".to_string()]);
    assert!(old.params.iter().all(|p| p.name != "mode"));
    let (_, dropped) = s.for_version("2.0.0rc1");
    assert_eq!(dropped, vec!["mode".to_string()]);
    let (new, dropped) = s.for_version("2.0.0");
    assert!(dropped.is_empty());
    assert!(new.params.iter().any(|p| p.name == "mode"));
    // A dropped parameter takes its constraints with it.
    let gated = MINI.replace("default = 2048", "default = 2048\nuntil = \"1.0\"");
    let (s, dropped) = Space::parse(&gated, "g.toml").unwrap().for_version("1.5");
    assert_eq!(dropped, vec!["batch".to_string()]);
    assert!(s.constraints.is_empty());
}

#[test]
fn errors_name_file_line_and_field() {
    let bad = MINI.replace(
        "min = 32\nmax = 4096\nlog = true\ndefault = 512",
        "min = 5000\nmax = 4096\nlog = true\ndefault = 512",
    );
    let e = Space::parse(&bad, "f.toml").unwrap_err().to_string();
    assert!(
        e.starts_with("f.toml:") && e.contains("\"ubatch\"") && e.contains("min 5000"),
        "{e}"
    );
    let bad = MINI.replace("rhs = \"batch\"", "rhs = \"batchh\"");
    let e = Space::parse(&bad, "f.toml").unwrap_err().to_string();
    assert!(e.contains("batchh"), "{e}");
    let bad = MINI.replace("type = \"bool\"", "type = \"boolean\"");
    let e = Space::parse(&bad, "f.toml").unwrap_err().to_string();
    assert!(e.starts_with("f.toml:"), "{e}");
    let bad = MINI.replace("default = \"a\"", "default = \"c\"");
    let e = Space::parse(&bad, "f.toml").unwrap_err().to_string();
    assert!(e.contains("not one of"), "{e}");
}

fn ctx(model: &str) -> RenderCtx<'_> {
    RenderCtx {
        model,
        host: "127.0.0.1",
        port: 9,
        binary: None,
        workdir: Path::new("/tmp/trial"),
    }
}

/// A TensorRT-LLM-like engine: YAML keys, a JSON group, a conditional constraint on a study
/// variable.
const RICH: &str = r#"
[engine]
name = "t"
binary = "t-serve"
argv = ["{binary}", "serve", "{model}", "--port", "{port}", "--max_seq_len", "{max_model_len}"]
yaml_flag = "--extra_llm_api_options"
vars = { max_model_len = 4096, gpu_count = 2 }

[engine.metrics]
kv_cache_usage = ["t:kv_cache_usage_perc", "t:gpu_cache_usage_perc"]

[[param]]
name = "max_num_tokens"
flag = "--max_num_tokens"
type = "int"
min = 256
max = 16384
default = 8192
source = "test"

[[param]]
name = "chunked"
yaml_key = "enable_chunked_prefill"
type = "bool"
default = false
source = "test"

[[param]]
name = "reuse"
yaml_key = "kv_cache_config.enable_block_reuse"
type = "bool"
default = true
source = "test"

[[param]]
name = "kv_dtype"
yaml_key = "kv_cache_config.dtype"
type = "categorical"
values = ["auto", "fp8"]
default = "auto"
source = "test"

[[param]]
name = "spec"
json_flag = "--speculative-config"
json_key = "method"
type = "categorical"
values = ["none", "ngram", "mtp"]
default = "none"
source = "test"

[[param]]
name = "spec_k"
json_flag = "--speculative-config"
json_key = "num_speculative_tokens"
type = "int"
min = 1
max = 6
default = 3
when = { spec = ["ngram", "mtp"] }
source = "test"

[[param]]
name = "tp"
flag = "--tp_size"
type = "int"
min = 1
max = 8
default = 1
source = "test"

[[constraint]]
lhs = "max_num_tokens"
op = ">="
rhs = "{max_model_len}"
when = { chunked = false }
repair = "clamp"

[[constraint]]
lhs = "tp"
op = "<="
rhs = "{gpu_count}"
repair = "reject"
"#;

#[test]
fn yaml_and_json_groups_render_and_study_variables_apply() {
    let s = Space::parse(RICH, "t.toml").unwrap();
    let d = s.defaults();
    let r = s.render(&d, &ctx("m")).unwrap();
    assert_eq!(
        r.argv,
        [
            "t-serve",
            "serve",
            "m",
            "--port",
            "9",
            "--max_seq_len",
            "4096"
        ]
    );
    assert!(r.files.is_empty());

    let mut c = d.clone();
    c.insert("reuse".into(), Value::Bool(false));
    c.insert("kv_dtype".into(), Value::Str("fp8".into()));
    c.insert("chunked".into(), Value::Bool(true));
    c.insert("spec".into(), Value::Str("ngram".into()));
    c.insert("spec_k".into(), Value::Int(3));
    let r = s.render(&c, &ctx("m")).unwrap();
    // The JSON group carries every active member, even one at its default.
    let i = r
        .argv
        .iter()
        .position(|a| a == "--speculative-config")
        .unwrap();
    assert_eq!(
        r.argv[i + 1],
        r#"{"method":"ngram","num_speculative_tokens":3}"#
    );
    let i = r
        .argv
        .iter()
        .position(|a| a == "--extra_llm_api_options")
        .unwrap();
    assert_eq!(r.argv[i + 1], "/tmp/trial/t-extra-options.yaml");
    let (path, yaml) = &r.files[0];
    assert_eq!(path, Path::new("/tmp/trial/t-extra-options.yaml"));
    assert!(
        yaml.ends_with(
            "enable_chunked_prefill: true\nkv_cache_config:\n  enable_block_reuse: false\n  dtype: \"fp8\"\n"
        ),
        "{yaml}"
    );
    assert!(r
        .display()
        .contains(r#"--speculative-config '{"method":"ngram","num_speculative_tokens":3}'"#));

    // Without chunked prefill the token budget must hold a whole max-length prompt.
    let mut c = d.clone();
    c.insert("max_num_tokens".into(), Value::Int(1024));
    s.repair(&mut c).unwrap();
    assert_eq!(c["max_num_tokens"], Value::Int(4096));
    let mut c = d.clone();
    c.insert("chunked".into(), Value::Bool(true));
    c.insert("max_num_tokens".into(), Value::Int(1024));
    s.repair(&mut c).unwrap();
    assert_eq!(c["max_num_tokens"], Value::Int(1024));
    // A study on a longer context moves the bound; tensor parallelism beyond the GPUs is out.
    let mut s2 = s.clone();
    s2.set_vars(&[("max_model_len".to_string(), 8192)].into())
        .unwrap();
    let mut c = d.clone();
    c.insert("max_num_tokens".into(), Value::Int(1024));
    s2.repair(&mut c).unwrap();
    assert_eq!(c["max_num_tokens"], Value::Int(8192));
    assert!(s2
        .render(&c, &ctx("m"))
        .unwrap()
        .argv
        .contains(&"8192".to_string()));
    let mut c = d.clone();
    c.insert("tp".into(), Value::Int(4));
    let e = s.repair(&mut c).unwrap_err();
    assert!(e.contains("tp = 4 violates tp <= {gpu_count} = 2"), "{e}");
    let e = s2
        .set_vars(&[("gpus".to_string(), 1)].into())
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"gpus\""), "{e}");
}

#[test]
fn bad_rich_files_name_the_field() {
    let cases = [
        (
            RICH.replace("rhs = \"{gpu_count}\"", "rhs = \"{gpus}\""),
            "{gpus}",
        ),
        (
            RICH.replace("yaml_flag = \"--extra_llm_api_options\"\n", ""),
            "yaml_flag",
        ),
        (RICH.replace("json_key = \"method\"\n", ""), "json_key"),
        (RICH.replace("kv_cache_usage =", "kv_usage ="), "kv_usage"),
        (
            RICH.replace("default = 8192", "default = 8192\nlgo = true"),
            "`lgo`",
        ),
        (
            RICH.replace("when = { chunked = false }", "when = { chunkd = false }"),
            "chunkd",
        ),
    ];
    for (text, needle) in cases {
        let e = Space::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("t.toml:") && e.contains(needle),
            "{needle}: {e}"
        );
    }
}

#[test]
fn a_joint_space_chooses_the_engine_and_renders_its_command() {
    let a = Space::parse(MINI, "x.toml").unwrap();
    let b = Space::parse(RICH, "t.toml").unwrap();
    let j = Space::joint(vec![a, b]).unwrap();
    assert_eq!(j.params[0].name, "engine");
    let base = j.baselines();
    assert_eq!(base.len(), 2);
    assert_eq!(base[1]["engine"], Value::Str("t".into()));
    assert!(base[1].keys().all(|k| k == "engine" || k.starts_with("t.")));
    let r = j.render(&base[1], &ctx("m")).unwrap();
    assert_eq!(r.argv[0], "t-serve");
    let mut rng = StdRng::seed_from_u64(9);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let c = j.sample(&mut rng).unwrap();
        let Value::Str(e) = &c["engine"] else {
            panic!()
        };
        seen.insert(e.clone());
        // Only the chosen engine's parameters are set, and its constraints hold.
        assert!(c
            .keys()
            .all(|k| k == "engine" || k.starts_with(&format!("{e}."))));
        if e == "x" {
            let (Value::Int(b), Value::Int(u)) = (&c["x.batch"], &c["x.ubatch"]) else {
                panic!()
            };
            assert!(u <= b);
        }
        let r = j.render(&c, &ctx("m")).unwrap();
        assert_eq!(r.argv[0], if e == "x" { "x-server" } else { "t-serve" });
    }
    assert_eq!(seen.len(), 2);
}

#[test]
fn help_probing_drops_flags_the_engine_lacks() {
    assert!(help_mentions(
        "  -b, --batch-size N   logical batch",
        "--batch-size"
    ));
    assert!(!help_mentions("  --batch-size N", "--batch"));
    assert!(help_mentions(
        "  --cb, --no-cb  continuous batching",
        "--cb"
    ));
    assert!(help_mentions("[--ubatch=UBATCH]", "--ubatch"));
    let s = Space::parse(MINI, "x.toml").unwrap();
    let help = "usage: x-server [--batch N] [--ubatch N] [--mode M]";
    let (probed, dropped) = s.probe_help(help);
    // `mode` is conditional on `cb`, which the help lacks: both go.
    assert_eq!(dropped, vec!["cb".to_string(), "mode".to_string()]);
    assert_eq!(probed.params.len(), 2);
    assert_eq!(probed.constraints.len(), 1);
    // A help that names none of the flags is no evidence: nothing dropped.
    let (same, dropped) = s.probe_help("Usage: x-server [OPTIONS]");
    assert!(dropped.is_empty() && same.params.len() == s.params.len());
}

#[test]
fn versions_are_read_from_version_output() {
    assert_eq!(parse_version("0.11.2\n").as_deref(), Some("0.11.2"));
    assert_eq!(
        parse_version("version: 7313 (e7ed4e3)\nbuilt with cc (Debian 12.2.0) 12.2.0").as_deref(),
        Some("7313")
    );
    assert_eq!(
        parse_version("sglang 0.5.5.post1").as_deref(),
        Some("0.5.5.post1")
    );
    assert_eq!(
        parse_version("TensorRT-LLM v1.2.0rc4").as_deref(),
        Some("1.2.0rc4")
    );
    assert_eq!(parse_version("no digits here"), None);
}

const PLATFORMS_SPACE: &str = r#"
[engine]
name = "p"
binary = "p-serve"
argv = ["{binary}", "--port", "{port}"]
env = { A = "1", C_ENV = "from-engine" }

[[param]]
name = "seqs"
flag = "--seqs"
type = "int"
min = 8
max = 2048
default = 1024
platform_default = { cpu = 128 }
source = "test"

[[param]]
name = "graphs"
flag = "--graphs"
type = "bool"
render = "switch"
default = true
platform = "gpu"
source = "test"

[[param]]
name = "graph_size"
flag = "--graph-size"
type = "int"
min = 1
max = 8
default = 4
when = { graphs = true }
source = "test"

[[param]]
name = "bind"
env = "C_ENV"
type = "categorical"
values = ["none", "all"]
default = "none"
platform = "cpu"
source = "test"
"#;

/// A CPU study's space has no GPU-only parameter (nor those that depend on one), the CPU's
/// own parameters, and the CPU defaults; a GPU study's the other way round. Bad platform
/// names and platform defaults outside the range are errors naming the parameter.
#[test]
fn platform_parameters_and_defaults_follow_the_platform() {
    let s = Space::parse(PLATFORMS_SPACE, "p.toml").unwrap();
    let (cpu, gone) = s.for_platform("cpu").unwrap();
    assert_eq!(gone, vec!["graphs".to_string(), "graph_size".to_string()]);
    let d = cpu.defaults();
    assert_eq!(d.get("seqs"), Some(&Value::Int(128)));
    assert!(d.contains_key("bind") && !d.contains_key("graphs"));
    // The CPU default renders as the bare command there; the GPU default does not.
    let mut at_gpu_default = d.clone();
    at_gpu_default.insert("seqs".into(), Value::Int(1024));
    let r = cpu.render(&at_gpu_default, &ctx("m")).unwrap();
    assert!(r.argv.join(" ").contains("--seqs 1024"), "{:?}", r.argv);
    assert!(!cpu
        .render(&d, &ctx("m"))
        .unwrap()
        .argv
        .contains(&"--seqs".to_string()));

    let (gpu, gone) = s.for_platform("gpu").unwrap();
    assert_eq!(gone, vec!["bind".to_string()]);
    assert_eq!(gpu.defaults().get("seqs"), Some(&Value::Int(1024)));
    assert!(gpu.defaults().contains_key("graph_size"));
    assert!(s
        .for_platform("tpu")
        .unwrap_err()
        .to_string()
        .contains("tpu"));

    let bad = PLATFORMS_SPACE.replace("platform = \"gpu\"", "platform = \"tpu\"");
    let e = Space::parse(&bad, "p.toml").unwrap_err().to_string();
    assert!(e.contains("graphs") && e.contains("tpu"), "{e}");
    let bad = PLATFORMS_SPACE.replace("{ cpu = 128 }", "{ cpu = 4096 }");
    let e = Space::parse(&bad, "p.toml").unwrap_err().to_string();
    assert!(
        e.contains("seqs") && e.contains("platform_default.cpu"),
        "{e}"
    );
    let bad = PLATFORMS_SPACE.replace("{ cpu = 128 }", "{ npu = 128 }");
    let e = Space::parse(&bad, "p.toml").unwrap_err().to_string();
    assert!(e.contains("npu"), "{e}");
}

/// The engine file's environment, a study's over it, and a parameter's over both (once).
#[test]
fn engine_study_and_parameter_environment_layer() {
    let mut s = Space::parse(PLATFORMS_SPACE, "p.toml")
        .unwrap()
        .for_platform("cpu")
        .unwrap()
        .0;
    s.set_env(
        &[("A", "3"), ("B", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let env = |cfg: &Config| {
        let mut e = s.render(cfg, &ctx("m")).unwrap().env;
        e.sort();
        e
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let d = s.defaults();
    assert_eq!(
        env(&d),
        vec![pair("A", "3"), pair("B", "2"), pair("C_ENV", "from-engine")]
    );
    let mut all = d.clone();
    all.insert("bind".into(), Value::Str("all".into()));
    assert_eq!(
        env(&all),
        vec![pair("A", "3"), pair("B", "2"), pair("C_ENV", "all")]
    );
}

#[test]
fn a_command_line_quotes_for_the_shell_and_reads_back() {
    let c = CommandLine {
        env: vec![("VLLM_CPU_KVCACHE_SPACE".into(), "4".into())],
        argv: vec![
            "vllm".into(),
            "serve".into(),
            "/models/my model".into(),
            "--speculative-config".into(),
            r#"{"method":"ngram","num_speculative_tokens":3}"#.into(),
            "--port".into(),
            "41234".into(),
            "it's".into(),
        ],
    };
    let shown = c.display();
    assert!(
        shown.starts_with("VLLM_CPU_KVCACHE_SPACE=4 vllm serve "),
        "{shown}"
    );
    // What is displayed is what a shell would split back into the same argv.
    assert_eq!(CommandLine::parse(&shown).unwrap(), c);
    assert_eq!(shlex::split(&shown).unwrap()[1..], c.argv[..]);

    let serving = c.serving();
    assert_eq!(serving.argv[6], "8000");
    assert_eq!(serving.env, c.env);
    let eq = CommandLine {
        env: Vec::new(),
        argv: vec![
            "x".into(),
            "--port=41234".into(),
            "--portal".into(),
            "9".into(),
        ],
    };
    assert_eq!(eq.serving().argv, ["x", "--port=8000", "--portal", "9"]);

    assert!(CommandLine::parse("vllm serve 'unbalanced").is_err());
    // A word with '=' after the first argument is an argument, not an assignment.
    let p = CommandLine::parse("A=1 x B=2").unwrap();
    assert_eq!(p.env, vec![("A".to_string(), "1".to_string())]);
    assert_eq!(p.argv, ["x", "B=2"]);
}

/// Stores before schema version 2 hold the display string; it reads back as its parts.
#[test]
fn a_stored_command_reads_in_both_schemas() {
    let c = CommandLine {
        env: vec![("K".into(), "v w".into())],
        argv: vec!["llama-server".into(), "--port".into(), "8000".into()],
    };
    let v2 = serde_json::to_string(&c).unwrap();
    assert_eq!(
        v2,
        r#"{"env":[["K","v w"]],"argv":["llama-server","--port","8000"]}"#
    );
    assert_eq!(serde_json::from_str::<CommandLine>(&v2).unwrap(), c);
    let v1 = serde_json::to_string(&c.display()).unwrap();
    assert_eq!(serde_json::from_str::<CommandLine>(&v1).unwrap(), c);
    let bad = serde_json::from_str::<CommandLine>(r#""x 'open""#).unwrap_err();
    assert!(bad.to_string().contains("unbalanced quotes"), "{bad}");
}

/// MINI with a `prior` line `batch` added to the numeric parameter and `mode` to the choice
/// one (an empty string adds nothing).
fn with_priors(batch: &str, mode: &str) -> String {
    MINI.replace(
        "default = 2048\nsource = \"test\"",
        &format!("default = 2048\nsource = \"test\"\n{batch}"),
    )
    .replace(
        "when = { cb = true }\nsource = \"test\"",
        &format!("when = {{ cb = true }}\nsource = \"test\"\n{mode}"),
    )
}

/// Priors parse: a target that scales a study variable, a lower bound, and a condition on a
/// variable that holds only above its bound.
#[test]
fn priors_parse_into_targets_lower_bounds_and_conditions() {
    let ok = with_priors(
        r#"prior = { at = "{concurrency}*2", source = "slots" }"#,
        r#"prior = { at = "b", source = "b is faster" }"#,
    );
    let s = Space::parse(&ok, "p.toml").unwrap();
    let batch = &s.params[0];
    let spec = batch.prior.as_ref().unwrap();
    assert_eq!(
        spec.at(batch, &[]).unwrap(),
        (
            At::Var {
                name: "concurrency".into(),
                factor: 2.0
            },
            false
        )
    );
    let at_least = with_priors(
        r#"prior = { at_least = "{prompt_tokens}", source = "s" }"#,
        "",
    );
    let s = Space::parse(&at_least, "p.toml").unwrap();
    let cond = with_priors(
        r#"prior = { at = 64, if = "{weights_share} > 0.5", source = "s" }"#,
        "",
    );
    let c = Space::parse(&cond, "p.toml").unwrap().params[0]
        .prior
        .as_ref()
        .unwrap()
        .condition()
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.var.as_str(), c.op.as_str(), c.bound),
        ("weights_share", ">", 0.5)
    );
    assert!(c.holds(0.6) && !c.holds(0.5));
    assert!(
        s.params[0]
            .prior
            .as_ref()
            .unwrap()
            .at(&s.params[0], &[])
            .unwrap()
            .1
    );
}

/// A bad prior (an unknown variable, a value the parameter cannot take, both or neither of
/// `at` and `at_least`, a bad expression, spread or source, an unknown key, a lower bound on a
/// choice, a malformed condition) is an error naming the file, the parameter and what is wrong.
#[test]
fn bad_priors_name_the_parameter_and_what_is_wrong() {
    for (batch, mode, needle) in [
        (
            r#"prior = { at = "{slots}", source = "s" }"#,
            "",
            "unknown variable \"slots\"",
        ),
        (
            r#"prior = { at = 8000, source = "s" }"#,
            "",
            "not a value of the parameter",
        ),
        (
            r#"prior = { at = 64, at_least = 32, source = "s" }"#,
            "",
            "exactly one of",
        ),
        (
            r#"prior = { at = "{concurrency}+1", source = "s" }"#,
            "",
            "`*K` or `/K`",
        ),
        (
            r#"prior = { at = 64, spread = 0, source = "s" }"#,
            "",
            "spread 0",
        ),
        (r#"prior = { at = 64, source = " " }"#, "", "prior.source"),
        (r#"prior = { at = 64, sauce = "s" }"#, "", "sauce"),
        (
            "",
            r#"prior = { at_least = "a", source = "s" }"#,
            "only for a numeric",
        ),
        (
            "",
            r#"prior = { at = "c", source = "s" }"#,
            "not a value of the parameter",
        ),
        (
            r#"prior = { at = 64, if = "{concurrency} >= 8", source = "s" }"#,
            "",
            "prior.if \"{concurrency} >= 8\": expected `{var} OP number`",
        ),
        (
            r#"prior = { at = 64, if = "{weights_share} = 0.5", source = "s" }"#,
            "",
            "var one of weights_share",
        ),
        (
            r#"prior = { at = 64, if = "{weights_share} >= half", source = "s" }"#,
            "",
            "prior.if",
        ),
    ] {
        let e = Space::parse(&with_priors(batch, mode), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:") && e.contains(needle),
            "{needle}: {e}"
        );
    }
}

/// MINI with `tp` (a GPU factor, active only with `cb`) and `pp` (a GPU factor).
fn with_gpu_factors() -> String {
    format!(
        "{MINI}
[[param]]
name = \"tp\"
flag = \"--tp\"
type = \"int\"
min = 1
max = 8
default = 1
gpu_factor = true
when = {{ cb = true }}
source = \"test\"

[[param]]
name = \"pp\"
flag = \"--pp\"
type = \"int\"
min = 1
max = 4
default = 2
gpu_factor = true
source = \"test\"
"
    )
}

#[test]
fn gpus_needed_is_the_product_of_the_active_gpu_factors() {
    let s = Space::parse(&with_gpu_factors(), "g.toml").unwrap();
    let mut cfg = s.defaults();
    assert_eq!(s.gpus_needed(&cfg), 2, "pp's default 2, tp's 1");
    cfg.insert("tp".into(), Value::Int(4));
    assert_eq!(s.gpus_needed(&cfg), 8);
    cfg.insert("cb".into(), Value::Bool(false));
    assert_eq!(s.gpus_needed(&cfg), 2, "tp is inactive without cb");
    cfg.remove("pp");
    assert_eq!(
        s.gpus_needed(&cfg),
        2,
        "an absent factor counts at its default"
    );
    // No factor at all: one GPU.
    let mini = Space::parse(MINI, "x.toml").unwrap();
    assert_eq!(mini.gpus_needed(&mini.defaults()), 1);
    // A joint space resolves the chosen engine.
    let g = Space::parse(
        &with_gpu_factors().replace("name = \"x\"", "name = \"g\""),
        "g.toml",
    )
    .unwrap();
    let j = Space::joint(vec![mini, g]).unwrap();
    let mut point = j.baselines()[1].clone();
    point.insert("g.tp".into(), Value::Int(2));
    point.insert("g.pp".into(), Value::Int(3));
    assert_eq!(j.gpus_needed(&point), 6);
    assert_eq!(j.gpus_needed(&j.baselines()[0]), 1);
    assert_eq!(j.gpus_needed(&Config::new()), 1, "no engine named");
}

#[test]
fn a_gpu_factor_must_be_an_integer_of_at_least_one() {
    for (from, to) in [
        ("min = 1\nmax = 8", "min = 0\nmax = 8"),
        (
            "name = \"tp\"\nflag = \"--tp\"\ntype = \"int\"\nmin = 1\nmax = 8\ndefault = 1",
            "name = \"tp\"\nflag = \"--tp\"\ntype = \"float\"\nmin = 1.0\nmax = 8.0\ndefault = 1.0",
        ),
    ] {
        let text = with_gpu_factors().replace(from, to);
        let e = Space::parse(&text, "g.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("g.toml:") && e.contains("\"tp\"") && e.contains("`gpu_factor`"),
            "{e}"
        );
    }
    let text = with_gpu_factors().replace("gpu_factor = true", "gpu_factor = \"yes\"");
    let e = Space::parse(&text, "g.toml").unwrap_err().to_string();
    assert!(e.starts_with("g.toml:"), "{e}");
}
