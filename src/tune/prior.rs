//! The workload's priors: each parameter's `prior` (`space::prior`) resolved against what the
//! study's workloads offer (their peak concurrency, longest prompt and output) and the engine's
//! variables, into unit-cube priors for the optimisers (`opt::Prior`). A prior whose variable
//! the workloads do not determine (an open-loop workload at a finite rate has no known peak
//! concurrency) is left out, with a note saying so. A prior with an `if` on the machine
//! (`Footprint`: how much of an accelerator the model's weights take) is used only where it
//! holds, and left out with a note where it does not or cannot be known.

use crate::bench::args::{BenchArgs, DatasetName};
use crate::space::prior::DEFAULT_SPREAD;
use crate::space::{At, Kind, Space, Value};
use crate::tune::encode::{arity, coord_of, Coord};
use crate::tune::opt::{Plan, Prior};
pub use crate::tune::spec::Footprint;

/// The longest prompt vLLM's ShareGPT sampling keeps (`is_valid_sequence`: max_prompt_len
/// 1024) and the longest prompt plus output (max_total_len 2048).
const SHAREGPT_MAX_PROMPT: f64 = 1024.0;
const SHAREGPT_MAX_TOTAL: f64 = 2048.0;

/// What a workload offers an engine, as far as its flags say before it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Requests in flight at most (None: not known before the run).
    pub concurrency: Option<f64>,
    pub prompt_tokens: f64,
    pub output_tokens: f64,
}

impl Shape {
    /// The shape `servetune bench` flags give: `--max-concurrency`, else every prompt at
    /// once at an infinite rate; random prompts at their upper length (`--random-range-ratio`
    /// widens both ways, as in vLLM) plus the shared prefix; ShareGPT at vLLM's filter bounds.
    pub fn of(b: &BenchArgs) -> Shape {
        let concurrency = Shape::concurrency(
            b.num_prompts,
            b.max_concurrency,
            b.request_rate.is_infinite() || b.closed_loop,
        );
        let (prompt, output) = match b.dataset_name {
            DatasetName::Random => {
                let up = 1.0 + b.random_range_ratio.max(0.0);
                (
                    b.random_input_len as f64 * up + b.random_prefix_len as f64,
                    b.random_output_len as f64 * up,
                )
            }
            DatasetName::Sharegpt => (
                SHAREGPT_MAX_PROMPT,
                b.sharegpt_output_len
                    .map_or(SHAREGPT_MAX_TOTAL - SHAREGPT_MAX_PROMPT, |o| o as f64),
            ),
        };
        Shape {
            concurrency,
            prompt_tokens: prompt.round(),
            output_tokens: output.round(),
        }
    }

    /// The most requests in flight: the concurrency limit, else every prompt at once when they
    /// are all sent at once; unknown for an open loop at a finite rate.
    pub fn concurrency(
        num_prompts: usize,
        max_concurrency: Option<usize>,
        all_at_once: bool,
    ) -> Option<f64> {
        match max_concurrency {
            Some(c) => Some(c.min(num_prompts) as f64),
            None if all_at_once => Some(num_prompts as f64),
            None => None,
        }
    }

    /// The value of a workload variable over several workloads (the largest), if known.
    fn var(shapes: &[Shape], name: &str) -> Option<f64> {
        let pick = |f: &dyn Fn(&Shape) -> Option<f64>| -> Option<f64> {
            let vs: Vec<Option<f64>> = shapes.iter().map(f).collect();
            if vs.is_empty() || vs.iter().any(Option::is_none) {
                return None;
            }
            vs.into_iter().flatten().reduce(f64::max)
        };
        match name {
            "concurrency" => pick(&|s| s.concurrency),
            "prompt_tokens" => pick(&|s| Some(s.prompt_tokens)),
            "output_tokens" => pick(&|s| Some(s.output_tokens)),
            "seq_tokens" => pick(&|s| Some(s.prompt_tokens + s.output_tokens)),
            _ => None,
        }
    }
}

/// Files beside PyTorch weights in a checkpoint directory that are not weights.
const NOT_WEIGHTS: &[&str] = &[
    "optimizer",
    "training_args",
    "rng_state",
    "scheduler",
    "scaler",
];

impl Footprint {
    /// The footprint of `model` (a weight file, a model directory, or a Hugging Face id found
    /// in the local hub cache) on the first GPU of `gpus`, or on the host without one.
    pub fn measure(model: &str, gpus: &[crate::telemetry::GpuInfo]) -> Footprint {
        let memory_bytes = match gpus.first() {
            Some(g) if g.memory_total_bytes > 0 => Some(g.memory_total_bytes),
            Some(_) => None,
            None => crate::telemetry::host_memory::mem_total(),
        };
        let weights_bytes = weights_bytes(model, None);
        let mut why = Vec::new();
        if weights_bytes.is_none() {
            why.push(format!(
                "no weight files found for the model {model:?} on this node"
            ));
        }
        if memory_bytes.is_none() {
            why.push("the accelerator's memory could not be read".to_owned());
        }
        Footprint {
            weights_bytes,
            memory_bytes,
            why: why.join("; "),
        }
    }

    /// A machine variable (`space::prior::MACHINE_VARS`), or why it is unknown.
    pub fn var(&self, name: &str) -> Result<f64, String> {
        match (name, self.weights_bytes, self.memory_bytes) {
            ("weights_share", Some(w), Some(m)) if m > 0 => Ok(w as f64 / m as f64),
            ("weights_share", ..) => Err(if self.why.is_empty() {
                "the model's size or the accelerator's memory is unknown".to_owned()
            } else {
                self.why.clone()
            }),
            _ => Err(format!("{name} is not a machine variable")),
        }
    }
}

/// The bytes of `model`'s weights: the file itself (with its siblings for a split GGUF,
/// `…-00001-of-0000N.gguf`), the weight files at the top of a directory, or those of the
/// snapshot `refs/main` names of a Hugging Face id (`org/name`) in the hub cache (`hub`, else
/// `HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`). None where none is found.
fn weights_bytes(model: &str, hub: Option<&std::path::Path>) -> Option<u64> {
    let path = std::path::Path::new(model);
    if path.is_file() {
        let name = path.file_name()?.to_string_lossy().into_owned();
        if let Some((stem, _)) = name.split_once("-00001-of-") {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            let dir = dir.unwrap_or(std::path::Path::new("."));
            let split = format!("{stem}-0");
            return sum_files(dir, |n| {
                n.starts_with(&split) && n.contains("-of-") && n.ends_with(".gguf")
            });
        }
        return std::fs::metadata(path).ok().map(|m| m.len());
    }
    if path.is_dir() {
        return dir_weights(path);
    }
    let (org, name) = model.split_once('/')?;
    let id_part = |s: &str| !s.is_empty() && !s.contains('/') && !s.starts_with('.');
    if !id_part(org) || !id_part(name) {
        return None;
    }
    let hub = match hub {
        Some(h) => h.to_path_buf(),
        None => std::env::var_os("HF_HUB_CACHE")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HF_HOME").map(|h| std::path::PathBuf::from(h).join("hub"))
            })
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|h| std::path::PathBuf::from(h).join(".cache/huggingface/hub"))
            })?,
    };
    let repo = hub.join(format!("models--{org}--{name}"));
    let snapshot = std::fs::read_to_string(repo.join("refs/main"))
        .ok()
        .map(|r| repo.join("snapshots").join(r.trim()))
        .filter(|d| d.is_dir())
        .or_else(|| {
            std::fs::read_dir(repo.join("snapshots"))
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.is_dir())
        })?;
    dir_weights(&snapshot)
}

/// The weights of a model directory, one format only (a checkpoint may hold the same weights
/// twice: safetensors beside PyTorch `.bin`, Mistral's `consolidated.safetensors` beside its
/// shards): the safetensors index's `total_size`, else the safetensors files (the shards
/// without `consolidated*` when both are there), else the PyTorch index's `total_size`, else
/// the PyTorch files less a trainer's state (optimizer, RNG, …), else a single GGUF (several
/// are several quantisations of one model: which one is unknown). None where none is found.
fn dir_weights(dir: &std::path::Path) -> Option<u64> {
    let index_total = |name: &str| -> Option<u64> {
        let text = std::fs::read_to_string(dir.join(name)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("metadata")?.get("total_size")?.as_u64()
    };
    if let Some(t) = index_total("model.safetensors.index.json") {
        return Some(t);
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let sharded = names
        .iter()
        .any(|n| n.ends_with(".safetensors") && !n.starts_with("consolidated"));
    if let Some(t) = sum_files(dir, |n| {
        n.ends_with(".safetensors") && !(sharded && n.starts_with("consolidated"))
    }) {
        return Some(t);
    }
    if let Some(t) = index_total("pytorch_model.bin.index.json") {
        return Some(t);
    }
    let torch = |n: &str| {
        [".bin", ".pt", ".pth"].iter().any(|x| n.ends_with(x))
            && !NOT_WEIGHTS.iter().any(|w| n.contains(w))
    };
    if let Some(t) = sum_files(dir, torch) {
        return Some(t);
    }
    let ggufs: Vec<&String> = names
        .iter()
        .filter(|n| n.ends_with(".gguf") && !n.starts_with("mmproj"))
        .collect();
    match ggufs.as_slice() {
        [one] => std::fs::metadata(dir.join(one)).ok().map(|m| m.len()),
        _ => None,
    }
}

/// The total size of the files directly in `dir` whose names pass `keep` (None: none), links
/// followed (a hub snapshot links its files to blobs).
fn sum_files(dir: &std::path::Path, keep: impl Fn(&str) -> bool) -> Option<u64> {
    let mut total = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let len = std::fs::metadata(e.path()).ok().filter(|m| m.is_file());
        if let (true, Some(m)) = (keep(&name), len) {
            *total.get_or_insert(0) += m.len();
        }
    }
    total
}

/// The optimiser's plan for a study on `space`: its budget and the priors its workloads imply,
/// with what each prior resolved to.
pub fn plan(study: &crate::tune::spec::Study, space: &Space) -> (Plan, Vec<Resolved>) {
    let shapes: Vec<Shape> = study.workloads.iter().map(|(_, b)| Shape::of(b)).collect();
    let (priors, notes) = resolve(space, &shapes, &study.footprint);
    (
        Plan {
            budget: study.spec.budget.trials as usize,
            cap: concurrency_cap(space, &priors),
            priors,
            one_at_a_time: study.spec.importance.one_at_a_time.then_some(
                crate::tune::opt::oat::Settings {
                    freeze_below: study.spec.importance.freeze_below,
                },
            ),
            guided_from: None,
        },
        notes,
    )
}

/// The space's batch cap (`Plan::cap`): the parameter whose prior, resolved, is the workload's
/// concurrency.
pub fn concurrency_cap(space: &Space, priors: &[Option<Prior>]) -> Option<String> {
    space
        .params
        .iter()
        .zip(priors)
        .find(|(p, pr)| {
            pr.is_some()
                && matches!(&p.prior, Some(s) if matches!(&s.at, Some(Value::Str(e)) if e.trim() == "{concurrency}"))
        })
        .map(|(p, _)| p.name.clone())
}

/// One parameter's resolved prior, for the notes and the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub param: String,
    /// The value the workload implies (None: left out, `note` says why).
    pub value: Option<Value>,
    pub note: String,
}

/// The space's priors for these workloads on this machine: one per parameter (None where the
/// space states none, its variable is unknown or its `if` does not hold), and what each
/// resolved to.
pub fn resolve(
    space: &Space,
    shapes: &[Shape],
    footprint: &Footprint,
) -> (Vec<Option<Prior>>, Vec<Resolved>) {
    let mut priors = Vec::new();
    let mut out = Vec::new();
    let vars = space.var_names();
    for p in &space.params {
        let Some(spec) = &p.prior else {
            priors.push(None);
            continue;
        };
        let applies = match spec.condition() {
            Ok(Some(c)) => match footprint.var(&c.var) {
                Ok(x) if c.holds(x) => Ok(Some(format!(", as {} is {x:.2}", c.var))),
                Ok(x) => Err(format!("{} is {x:.2}, so `{c}` does not hold", c.var)),
                Err(why) => Err(format!("`{c}` cannot be checked: {why}")),
            },
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        };
        let because = match applies {
            Ok(b) => b.unwrap_or_default(),
            Err(why) => {
                left_out(&mut priors, &mut out, &p.name, &why);
                continue;
            }
        };
        let parsed = spec.at(p, &vars);
        let lower = matches!(parsed, Ok((_, true)));
        let value = match parsed.map(|(a, _)| a) {
            Ok(At::Value(v)) => Ok(v),
            Ok(At::Var { name, factor }) => {
                match Shape::var(shapes, &name).or_else(|| space.var(&name).map(|v| v as f64)) {
                    Some(x) => {
                        let x = x * factor;
                        let v = match p.kind {
                            Kind::Float { .. } => Value::Float(x),
                            _ => Value::Int(x.round() as i64),
                        };
                        Ok(p.fit(&v).unwrap_or(v))
                    }
                    None => Err(format!(
                        "{{{name}}} is not known before the run (an open-loop workload at a finite rate)"
                    )),
                }
            }
            Err(e) => Err(e),
        };
        match value {
            Ok(v) => {
                let prior = match (coord_of(p, &v), arity(p)) {
                    (Coord::Num(lo), None) if lower => {
                        // First try: the default when it already satisfies the bound, else
                        // the middle of what the prior allows (its density is uniform there,
                        // and the bound is where the statement only just holds: a memory
                        // fraction "at least 0.88" on a full accelerator wants more).
                        let mode = match coord_of(p, &p.default) {
                            Coord::Num(d) if d >= lo => d,
                            _ => 0.5 * (lo + 1.0),
                        };
                        Some(Prior::AtLeast { lo, mode })
                    }
                    (Coord::Num(mu), None) => Some(Prior::Num {
                        mu,
                        sigma: spec.spread.unwrap_or(DEFAULT_SPREAD),
                    }),
                    (Coord::Cat(index), Some(arity)) => Some(Prior::Cat { index, arity }),
                    _ => None,
                };
                out.push(Resolved {
                    param: p.name.clone(),
                    value: prior.is_some().then(|| v.clone()),
                    note: format!(
                        "{} {} {v} ({}{because})",
                        p.name,
                        if lower { ">=" } else { "=" },
                        spec.source
                    ),
                });
                priors.push(prior);
            }
            Err(why) => left_out(&mut priors, &mut out, &p.name, &why),
        }
    }
    (priors, out)
}

/// A parameter's prior left out, with why.
fn left_out(priors: &mut Vec<Option<Prior>>, out: &mut Vec<Resolved>, param: &str, why: &str) {
    out.push(Resolved {
        param: param.to_owned(),
        value: None,
        note: format!("{param}: prior not used: {why}"),
    });
    priors.push(None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> BenchArgs {
        let v: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        BenchArgs::from_flags(&v).expect("flags")
    }

    #[test]
    fn the_shape_reads_concurrency_and_lengths_from_the_flags() {
        let s = Shape::of(&args(&[
            "--dataset-name",
            "random",
            "--random-input-len",
            "32",
            "--random-output-len",
            "128",
            "--num-prompts",
            "32",
            "--max-concurrency",
            "16",
        ]));
        assert_eq!(s.concurrency, Some(16.0));
        assert_eq!(s.prompt_tokens, 32.0);
        assert_eq!(s.output_tokens, 128.0);
        let open = Shape::of(&args(&[
            "--dataset-name",
            "random",
            "--request-rate",
            "4",
            "--random-range-ratio",
            "0.5",
            "--random-input-len",
            "100",
            "--random-prefix-len",
            "10",
        ]));
        assert_eq!(open.concurrency, None);
        assert_eq!(open.prompt_tokens, 160.0);
        assert_eq!(Shape::var(&[s.clone(), open.clone()], "concurrency"), None);
        assert_eq!(Shape::var(&[s, open], "prompt_tokens"), Some(160.0));
    }

    /// The llama.cpp space and the decode study's workload (16 streams, 32 in, 128 out).
    fn llama_decode() -> (Space, Shape) {
        let space = Space::load(std::path::Path::new("search-spaces/llamacpp.toml")).unwrap();
        let c16 = Shape {
            concurrency: Some(16.0),
            prompt_tokens: 32.0,
            output_tokens: 128.0,
        };
        (space, c16)
    }

    #[test]
    fn llama_server_slots_resolve_to_the_concurrency_and_unknown_concurrency_is_left_out() {
        let (space, c16) = llama_decode();
        let (priors, notes) = resolve(&space, &[c16], &Footprint::default());
        let i = space
            .params
            .iter()
            .position(|p| p.name == "parallel")
            .unwrap();
        let Some(Prior::Num { mu, .. }) = priors[i] else {
            panic!("no prior on parallel: {notes:?}")
        };
        // --parallel is log-scaled over 1..32: 16 sits at ln 16 / ln 32 = 0.8.
        assert!((mu - 0.8).abs() < 1e-9, "{mu}");
        let open = Shape {
            concurrency: None,
            ..Shape::of(&args(&["--dataset-name", "random"]))
        };
        let (priors, notes) = resolve(&space, &[open], &Footprint::default());
        assert!(priors[i].is_none());
        assert!(
            notes
                .iter()
                .any(|n| n.param == "parallel" && n.note.contains("not known before the run")),
            "{notes:?}"
        );
    }

    #[test]
    fn the_prior_point_keeps_the_engines_own_defaults_outside_the_searched_range() {
        // Seen on the real decode study: --threads-batch's default is -1 (auto), outside its
        // range 1..32; the prior's point ran it at 1 thread and read 25% below the defaults.
        let (space, c16) = llama_decode();
        let plan = Plan {
            budget: 12,
            priors: resolve(&space, &[c16], &Footprint::default()).0,
            ..Plan::default()
        };
        let mut opt = crate::tune::opt::make(crate::tune::opt::Algorithm::Tpe, &space, 0, &plan);
        let base = opt.propose(&[]).unwrap().config;
        let obs = |c: &crate::space::Config| crate::tune::opt::Obs {
            config: c.clone(),
            value: Some(1.0),
            failed: false,
            measured: Some(1.0),
            slack: Vec::new(),
            decode: None,
        };
        let p = opt.propose(&[obs(&base)]).unwrap();
        assert!(p.note.contains("the workload's prior"), "{}", p.note);
        assert_eq!(p.config.get("parallel"), Some(&Value::Int(16)));
        assert_eq!(
            p.config.get("threads_batch"),
            Some(&Value::Int(-1)),
            "{:?}",
            p.config
        );
        assert_eq!(p.config.get("ubatch_size"), Some(&Value::Int(512)));
    }

    #[test]
    fn a_prior_on_the_machine_applies_only_where_its_condition_holds() {
        // The vLLM space: FP8 weights and KV cache, and a higher memory fraction, when the
        // weights take half an accelerator or more (a 32B model in bf16 on an 80 GiB GPU), not
        // for an 8B one, and not when the model's size is unknown.
        let space = Space::load(std::path::Path::new("search-spaces/vllm.toml")).unwrap();
        let chat = Shape {
            concurrency: Some(64.0),
            prompt_tokens: 1024.0,
            output_tokens: 256.0,
        };
        let on = |weights_gib: f64| Footprint {
            weights_bytes: Some((weights_gib * (1u64 << 30) as f64) as u64),
            memory_bytes: Some(80 << 30),
            why: String::new(),
        };
        let at = |p: &str| space.params.iter().position(|q| q.name == p).unwrap();
        let note = |notes: &[Resolved], p: &str| {
            notes
                .iter()
                .find(|n| n.param == p)
                .map(|n| n.note.clone())
                .unwrap_or_default()
        };
        let (priors, notes) = resolve(&space, std::slice::from_ref(&chat), &on(61.0));
        assert_eq!(
            priors[at("quantization")],
            Some(Prior::Cat { index: 1, arity: 2 }),
            "{notes:?}"
        );
        assert!(matches!(
            priors[at("kv_cache_dtype")],
            Some(Prior::Cat { index: 1, .. })
        ));
        assert!(matches!(
            priors[at("gpu_memory_utilization")],
            Some(Prior::AtLeast { .. })
        ));
        // The default (0.92) already holds the bound: it is the point tried first. SGLang's
        // default (0: its own choice) does not: the middle of 0.88..0.95 is.
        let gmu = &space.params[at("gpu_memory_utilization")];
        assert!(matches!(
            priors[at("gpu_memory_utilization")],
            Some(Prior::AtLeast { mode, .. }) if Coord::Num(mode) == coord_of(gmu, &Value::Float(0.92))
        ));
        let sglang = Space::load(std::path::Path::new("search-spaces/sglang.toml")).unwrap();
        let (sp, _) = resolve(&sglang, std::slice::from_ref(&chat), &on(61.0));
        let i = sglang
            .params
            .iter()
            .position(|q| q.name == "mem_fraction_static")
            .unwrap();
        let mid = coord_of(&sglang.params[i], &Value::Float(0.915));
        assert!(
            matches!(sp[i], Some(Prior::AtLeast { mode, .. }) if matches!(mid, Coord::Num(m) if (m - mode).abs() < 1e-9)),
            "{:?}",
            sp[i]
        );
        assert_eq!(
            concurrency_cap(&space, &priors).as_deref(),
            Some("max_num_seqs"),
            "the batch cap is the parameter whose prior is the workload's concurrency"
        );
        assert!(
            note(&notes, "quantization").contains("as weights_share is 0.76"),
            "{notes:?}"
        );
        let (priors, notes) = resolve(&space, std::slice::from_ref(&chat), &on(15.0));
        assert_eq!(priors[at("quantization")], None);
        assert!(
            note(&notes, "quantization")
                .contains("weights_share is 0.19, so `weights_share >= 0.5` does not hold"),
            "{notes:?}"
        );
        // The workload's own priors stand either way.
        assert!(priors[at("max_num_seqs")].is_some());
        let unknown = Footprint {
            memory_bytes: Some(80 << 30),
            why: "no weight files found for the model \"org/m\" on this node".into(),
            ..Footprint::default()
        };
        let (priors, notes) = resolve(&space, &[chat], &unknown);
        assert_eq!(priors[at("kv_cache_dtype")], None);
        assert!(
            note(&notes, "kv_cache_dtype").contains("cannot be checked: no weight files found"),
            "{notes:?}"
        );
    }

    #[test]
    fn the_model_size_is_read_from_a_file_a_split_gguf_a_directory_or_the_hub_cache() {
        let dir = tempfile::tempdir().unwrap();
        let write = |p: &std::path::Path, n: usize| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, vec![0u8; n]).unwrap();
        };
        let d = dir.path();
        write(&d.join("one.gguf"), 100);
        write(&d.join("big-00001-of-00002.gguf"), 300);
        write(&d.join("big-00002-of-00002.gguf"), 200);
        write(&d.join("hf/model-00001-of-00002.safetensors"), 1000);
        write(&d.join("hf/model-00002-of-00002.safetensors"), 500);
        write(&d.join("hf/config.json"), 7);
        // The same weights twice, and a trainer's state: one format, no state.
        write(&d.join("both/model.safetensors"), 800);
        write(&d.join("both/pytorch_model.bin"), 800);
        write(&d.join("both/optimizer.pt"), 1600);
        write(&d.join("mistral/consolidated.safetensors"), 900);
        write(&d.join("mistral/model-00001-of-00001.safetensors"), 900);
        write(&d.join("ckpt/pytorch_model.bin"), 700);
        write(&d.join("ckpt/training_args.bin"), 5);
        write(&d.join("ckpt/rng_state.pth"), 5);
        write(&d.join("indexed/model-00001-of-00002.safetensors"), 60000);
        std::fs::write(
            d.join("indexed/model.safetensors.index.json"),
            "{\"metadata\": {\"total_size\": 123456}, \"weight_map\": {}}",
        )
        .unwrap();
        write(&d.join("quants/m.Q4_K_M.gguf"), 40);
        write(&d.join("quants/m.Q8_0.gguf"), 80);
        let s = |p: &std::path::Path| p.display().to_string();
        let none: Option<&std::path::Path> = None;
        assert_eq!(weights_bytes(&s(&d.join("one.gguf")), none), Some(100));
        assert_eq!(
            weights_bytes(&s(&d.join("big-00001-of-00002.gguf")), none),
            Some(500)
        );
        assert_eq!(weights_bytes(&s(&d.join("hf")), none), Some(1500));
        assert_eq!(weights_bytes(&s(&d.join("both")), none), Some(800));
        assert_eq!(weights_bytes(&s(&d.join("mistral")), none), Some(900));
        assert_eq!(weights_bytes(&s(&d.join("ckpt")), none), Some(700));
        assert_eq!(weights_bytes(&s(&d.join("indexed")), none), Some(123_456));
        // Several quantisations: which one the engine loads is unknown.
        assert_eq!(weights_bytes(&s(&d.join("quants")), none), None);
        // A hub id: the snapshot refs/main names, its files links or copies.
        let repo = d.join("hub/models--org--m");
        write(&repo.join("refs/main"), 0);
        std::fs::write(repo.join("refs/main"), "abc\n").unwrap();
        write(&repo.join("snapshots/abc/model.safetensors"), 4000);
        write(&repo.join("snapshots/abc/tokenizer.json"), 9);
        assert_eq!(weights_bytes("org/m", Some(&d.join("hub"))), Some(4000));
        assert_eq!(weights_bytes("org/other", Some(&d.join("hub"))), None);
        assert_eq!(weights_bytes(&s(&d.join("missing.gguf")), none), None);
        // No weight files: unknown, not zero.
        write(&d.join("empty/config.json"), 3);
        assert_eq!(weights_bytes(&s(&d.join("empty")), none), None);
        let f = Footprint::measure(&s(&d.join("missing.gguf")), &[]);
        let e = f.var("weights_share").unwrap_err();
        assert!(e.contains("no weight files found"), "{e}");
    }
}
