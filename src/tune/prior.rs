//! The workload's priors: each parameter's `prior` (`space::prior`) resolved against what the
//! study's workloads offer (their peak concurrency, longest prompt and output) and the engine's
//! variables, into unit-cube priors for the optimisers (`opt::Prior`). A prior whose variable
//! the workloads do not determine (an open-loop workload at a finite rate has no known peak
//! concurrency) is left out, with a note saying so.

use crate::bench::args::{BenchArgs, DatasetName};
use crate::space::prior::DEFAULT_SPREAD;
use crate::space::{At, Kind, Space, Value};
use crate::tune::encode::{arity, coord_of, Coord};
use crate::tune::opt::{Plan, Prior};

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

/// The optimiser's plan for a study on `space`: its budget and the priors its workloads imply,
/// with what each prior resolved to.
pub fn plan(study: &crate::tune::spec::Study, space: &Space) -> (Plan, Vec<Resolved>) {
    let shapes: Vec<Shape> = study.workloads.iter().map(|(_, b)| Shape::of(b)).collect();
    let (priors, notes) = resolve(space, &shapes);
    (
        Plan {
            budget: study.spec.budget.trials as usize,
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

/// One parameter's resolved prior, for the notes and the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub param: String,
    /// The value the workload implies (None: left out, `note` says why).
    pub value: Option<Value>,
    pub note: String,
}

/// The space's priors for these workloads: one per parameter (None where the space states
/// none or its variable is unknown), and what each resolved to.
pub fn resolve(space: &Space, shapes: &[Shape]) -> (Vec<Option<Prior>>, Vec<Resolved>) {
    let mut priors = Vec::new();
    let mut out = Vec::new();
    let vars = space.var_names();
    for p in &space.params {
        let Some(spec) = &p.prior else {
            priors.push(None);
            continue;
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
                        // First try: the default when it already satisfies the bound.
                        let mode = match coord_of(p, &p.default) {
                            Coord::Num(d) if d >= lo => d,
                            _ => lo,
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
                        "{} {} {v} ({})",
                        p.name,
                        if lower { ">=" } else { "=" },
                        spec.source
                    ),
                });
                priors.push(prior);
            }
            Err(why) => {
                out.push(Resolved {
                    param: p.name.clone(),
                    value: None,
                    note: format!("{}: prior not used: {why}", p.name),
                });
                priors.push(None);
            }
        }
    }
    (priors, out)
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
        let (priors, notes) = resolve(&space, &[c16]);
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
        let (priors, notes) = resolve(&space, &[open]);
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
            priors: resolve(&space, &[c16]).0,
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
}
