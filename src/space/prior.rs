//! A parameter's prior: the value the workload implies, the one an expert tunes first (enough
//! slots for the offered concurrency, batched tokens above the longest prompt). A space file
//! states it per parameter, in terms of the workload and the machine:
//!
//! ```toml
//! prior = { at = "{concurrency}", source = "one slot per stream in flight" }
//! prior = { at = "{prompt_tokens}*2", spread = 0.15, source = "…" }
//! prior = { at = "on", source = "…" }
//! prior = { at_least = "{prompt_tokens}", source = "…" }
//! prior = { at = "fp8", if = "{weights_share} >= 0.5", source = "…" }
//! prior = { at_least = 0.88, edge = "high", source = "…" }
//! ```
//!
//! `at` says "near this value"; `at_least` (numeric parameters) says "anywhere at or above
//! this value", for a lower bound an expert knows without knowing the best value. Either is a
//! value of the parameter, or `{var}`, `{var}*K` or `{var}/K` with a workload
//! variable (`WORKLOAD_VARS`, derived from the study's `servetune bench` flags) or one of the
//! engine's `[engine] vars`. `if` makes the prior conditional on the machine (`MACHINE_VARS`:
//! how much of an accelerator the model's weights take): an expert quantizes the KV cache of a
//! model that leaves little memory for it, not of one that leaves plenty. `edge` marks an
//! `at_least` knob that trades memory with the KV cache (`Edge`). This module parses and
//! checks the statement; `tune::prior` resolves it against a study's workloads and machine and
//! the optimisers (`tune::opt::prior`) use it.

use serde::{Deserialize, Serialize};

use super::{Kind, Param, Value};

/// The workload variables a prior may use, with their meaning (resolved by `tune::prior`).
pub const WORKLOAD_VARS: &[(&str, &str)] = &[
    (
        "concurrency",
        "the most requests the workloads keep in flight (--max-concurrency, or --num-prompts at an infinite --request-rate)",
    ),
    (
        "prompt_tokens",
        "the longest prompt of the workloads, in tokens",
    ),
    (
        "output_tokens",
        "the longest output of the workloads, in tokens",
    ),
    (
        "seq_tokens",
        "the longest prompt plus output of the workloads, in tokens",
    ),
];

/// The machine variables a prior's `if` may use, with their meaning (resolved by
/// `tune::prior::Footprint`).
pub const MACHINE_VARS: &[(&str, &str)] = &[(
    "weights_share",
    "the model's weight files over the memory of one accelerator (the host's memory without a GPU)",
)];

/// The prior as the space file states it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorSpec {
    /// Near this: a value of the parameter, or an expression of a variable (`{concurrency}*2`).
    #[serde(default)]
    pub at: Option<Value>,
    /// At or above this (numeric parameters), as `at`.
    #[serde(default)]
    pub at_least: Option<Value>,
    /// The prior's standard deviation in the parameter's unit coordinate (log-scaled where the
    /// parameter is): how sure the statement is. Default `DEFAULT_SPREAD`.
    #[serde(default)]
    pub spread: Option<f64>,
    /// Only if this holds: `{var} OP number` with a machine variable (`MACHINE_VARS`) and
    /// OP one of `>=`, `>`, `<=`, `<`.
    #[serde(default, rename = "if")]
    pub if_: Option<String>,
    /// Where an `at_least` knob sits at the memory edge (`Edge`), if it trades memory with
    /// the KV cache.
    #[serde(default)]
    pub edge: Option<Edge>,
    /// Why the workload implies this value.
    pub source: String,
}

/// How a knob trades memory with the KV cache, for the start-up's memory-edge point (the
/// expert's move: give the KV cache everything the workload does not need, and back off if
/// the engine refuses). Only on an `at_least` prior.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Edge {
    /// More of it is more KV cache (a memory fraction): at the edge, the top of its range.
    High,
    /// More of it is memory the KV cache does not get (a prefill chunk's activations): at the
    /// edge, the prior's bound, the least the workload needs.
    Low,
}

/// A prior's `if`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub var: String,
    pub op: String,
    pub bound: f64,
}

impl Condition {
    /// `{var} OP number` (the variable must be one of `MACHINE_VARS`).
    pub fn parse(s: &str) -> Result<Condition, String> {
        let shape = || {
            format!(
                "prior.if {s:?}: expected `{{var}} OP number` with OP one of >=, >, <=, < and var one of {}",
                MACHINE_VARS
                    .iter()
                    .map(|(v, _)| *v)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let rest = s.trim().strip_prefix('{').ok_or_else(shape)?;
        let (var, tail) = rest.split_once('}').ok_or_else(shape)?;
        if !MACHINE_VARS.iter().any(|(v, _)| *v == var) {
            return Err(shape());
        }
        let tail = tail.trim();
        let op = [">=", "<=", ">", "<"]
            .into_iter()
            .find(|op| tail.starts_with(op))
            .ok_or_else(shape)?;
        let bound: f64 = tail[op.len()..].trim().parse().map_err(|_| shape())?;
        if !bound.is_finite() {
            return Err(shape());
        }
        Ok(Condition {
            var: var.to_owned(),
            op: op.to_owned(),
            bound,
        })
    }

    /// Whether `x` (the variable's value) satisfies it.
    pub fn holds(&self, x: f64) -> bool {
        match self.op.as_str() {
            ">=" => x >= self.bound,
            ">" => x > self.bound,
            "<=" => x <= self.bound,
            _ => x < self.bound,
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.var, self.op, self.bound)
    }
}

/// The spread of a numeric prior when the file gives none: a tenth of the range.
pub const DEFAULT_SPREAD: f64 = 0.1;

/// `at` or `at_least` read: a fixed value, or a variable times a factor.
#[derive(Debug, Clone, PartialEq)]
pub enum At {
    Value(Value),
    Var { name: String, factor: f64 },
}

impl PriorSpec {
    /// What the prior says: the point, and whether it is a lower bound (`at_least`), or why
    /// it says nothing valid for `p` (`engine_vars`: the engine file's declared variables).
    pub fn at(&self, p: &Param, engine_vars: &[&str]) -> Result<(At, bool), String> {
        let numeric = matches!(p.kind, Kind::Int { .. } | Kind::Float { .. });
        let (v, lower) = match (&self.at, &self.at_least) {
            (Some(v), None) => (v, false),
            (None, Some(v)) if numeric => (v, true),
            (None, Some(_)) => return Err("prior.at_least is only for a numeric parameter".into()),
            _ => return Err("prior needs exactly one of `at` and `at_least`".into()),
        };
        if self.edge.is_some() && !lower {
            return Err("prior.edge is only for an `at_least` prior".into());
        }
        self.condition()?;
        Ok((self.point(v, p, engine_vars)?, lower))
    }

    /// The parsed `if`, if any.
    pub fn condition(&self) -> Result<Option<Condition>, String> {
        self.if_.as_deref().map(Condition::parse).transpose()
    }

    fn point(&self, at: &Value, p: &Param, engine_vars: &[&str]) -> Result<At, String> {
        if let Some(s) = self.spread {
            if !(s.is_finite() && s > 0.0 && s <= 1.0) {
                return Err(format!("prior.spread {s} is not in (0, 1]"));
            }
        }
        if self.source.trim().is_empty() {
            return Err("prior.source must say why the workload implies this value".into());
        }
        let numeric = matches!(p.kind, Kind::Int { .. } | Kind::Float { .. });
        if let Value::Str(s) = at {
            if let Some(rest) = s.trim().strip_prefix('{') {
                if !numeric {
                    return Err(format!(
                        "prior.at {s:?}: a variable is only for a numeric parameter"
                    ));
                }
                let (name, tail) = rest
                    .split_once('}')
                    .ok_or_else(|| format!("prior.at {s:?}: `{{` without `}}`"))?;
                let known =
                    WORKLOAD_VARS.iter().any(|(v, _)| *v == name) || engine_vars.contains(&name);
                if !known {
                    return Err(format!(
                        "prior.at {s:?}: unknown variable {name:?} (workload: {}; engine: {})",
                        WORKLOAD_VARS
                            .iter()
                            .map(|(v, _)| *v)
                            .collect::<Vec<_>>()
                            .join(", "),
                        engine_vars.join(", ")
                    ));
                }
                let tail = tail.trim();
                let factor = if tail.is_empty() {
                    1.0
                } else {
                    let (op, num) = tail.split_at(1);
                    let k: f64 = num.trim().parse().map_err(|_| {
                        format!("prior.at {s:?}: after the variable, `*K` or `/K` with a number K")
                    })?;
                    if !(k.is_finite() && k > 0.0) {
                        return Err(format!("prior.at {s:?}: K must be a positive number"));
                    }
                    match op {
                        "*" => k,
                        "/" => 1.0 / k,
                        _ => {
                            return Err(format!(
                                "prior.at {s:?}: after the variable, `*K` or `/K` with a number K"
                            ))
                        }
                    }
                };
                return Ok(At::Var {
                    name: name.to_owned(),
                    factor,
                });
            }
        }
        match p.fit(at) {
            Some(v) if v == *at || matches!((&p.kind, at), (Kind::Float { .. }, Value::Int(_))) => {
                Ok(At::Value(v))
            }
            _ => Err(format!("prior value {at} is not a value of the parameter")),
        }
    }
}
