//! Search spaces: one TOML file per engine (`search-spaces/*.toml`) describing how to start the
//! engine (argv template, version and `--help` commands, readiness endpoints and time limits,
//! Prometheus metric names, failure log patterns, study variables) and which of its flags to
//! search, with each flag's type, range, engine default, the source the default was read from,
//! conditions, version gates and known constraints between flags.
//!
//! Pure: parsing, validation, sampling and constraint repair live here; rendering to an argv
//! vector (never a shell) in `render`; the cross-engine space, version gates and `--help`
//! probing in `joint`. No I/O beyond reading the file.

mod joint;
mod parse;
pub mod prior;
mod render;
pub mod text;

pub use joint::help_mentions;
pub use prior::{At, PriorSpec};
pub use render::{CommandLine, RenderCtx, Rendered};

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SpaceError {
    #[error("cannot read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Invalid {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
}

/// A parameter value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => write!(f, "{s}"),
        }
    }
}

/// The categorical value that means "leave this out" (flag omitted, key absent).
pub const NONE: &str = "none";

/// One point of the space: parameter name → value (inactive parameters are absent).
pub type Config = BTreeMap<String, Value>;

impl Param {
    /// `v` as a value of this parameter: clamped into an integer or float range (on the
    /// step grid), kept when it is one of the categories; `None` when it cannot be one.
    pub fn fit(&self, v: &Value) -> Option<Value> {
        match (&self.kind, v) {
            (Kind::Int { min, max, step, .. }, Value::Int(x)) => {
                let s = step.unwrap_or(1).max(1);
                let x = (*x).clamp(*min, *max);
                Some(Value::Int((min + (x - min) / s * s).clamp(*min, *max)))
            }
            (Kind::Float { min, max, .. }, Value::Float(x)) if x.is_finite() => {
                Some(Value::Float(x.clamp(*min, *max)))
            }
            (Kind::Float { min, max, .. }, Value::Int(x)) => {
                Some(Value::Float((*x as f64).clamp(*min, *max)))
            }
            (Kind::Categorical { values }, Value::Str(x)) if values.contains(x) => Some(v.clone()),
            (Kind::Bool, Value::Bool(_)) => Some(v.clone()),
            _ => None,
        }
    }
}

/// A `when` condition on another parameter: one value, or any of several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Cond {
    One(Value),
    Any(Vec<Value>),
}

impl Cond {
    pub fn holds(&self, v: Option<&Value>) -> bool {
        match (self, v) {
            (Cond::One(want), Some(v)) => want == v,
            (Cond::Any(want), Some(v)) => want.contains(v),
            (_, None) => false,
        }
    }
}

/// Seconds per readiness rung; absent ones take the launcher's defaults.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReadyLimits {
    pub alive_s: Option<f64>,
    pub port_s: Option<f64>,
    pub health_s: Option<f64>,
    pub models_s: Option<f64>,
    pub first_token_s: Option<f64>,
}

/// The canonical metric keys an engine file may map to its Prometheus names.
pub const METRIC_KEYS: &[&str] = &[
    "running",
    "waiting",
    "kv_cache_usage",
    "prefix_cache_hit_rate",
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The command, one argv element each; `{binary}`, `{model}`, `{host}`, `{port}` and the
    /// study variables (`{max_model_len}`…) are replaced element by element (never a shell).
    pub argv: Vec<String>,
    /// The executable `{binary}` stands for.
    pub binary: String,
    /// Prints the engine's version (the first dotted number in its output is taken).
    #[serde(default)]
    pub version_argv: Vec<String>,
    /// Prints the engine's flags; flags of the space it does not mention are dropped.
    #[serde(default)]
    pub help_argv: Vec<String>,
    #[serde(default = "default_health")]
    pub health: String,
    #[serde(default = "default_models")]
    pub models: String,
    #[serde(default)]
    pub ready: ReadyLimits,
    /// Arguments every trial gets (the study's fixed arguments).
    #[serde(default)]
    pub fixed: Vec<String>,
    /// Study variables with their defaults (`max_model_len`, `gpu_count`…): usable as `{name}`
    /// in `argv`/`fixed` and as the right-hand side of a constraint; a study overrides them.
    #[serde(default)]
    pub vars: BTreeMap<String, i64>,
    /// The flag that takes the YAML file built from the `yaml_key` parameters.
    #[serde(default)]
    pub yaml_flag: Option<String>,
    /// Environment every launch gets (a study's `[env]` adds to it and overrides it); a
    /// parameter carried by the same variable overrides both when it leaves its default.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Canonical metric (one of `METRIC_KEYS`) → Prometheus names, newest first (engines
    /// rename them: vLLM's `gpu_cache_usage_perc` became `kv_cache_usage_perc`).
    #[serde(default)]
    pub metrics: BTreeMap<String, Vec<String>>,
    /// Log substrings that prove a failure class (`oom`, `unsupported`, `bad_flag`,
    /// `port_in_use`), checked before the built-in ones.
    #[serde(default)]
    pub failures: BTreeMap<String, Vec<String>>,
}

fn default_health() -> String {
    "/health".into()
}

fn default_models() -> String {
    "/v1/models".into()
}

/// The readiness ladder's time limit per rung (`engine::launch` climbs it); an engine file
/// overrides them under `[engine.ready]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ladder {
    pub alive: Duration,
    pub port: Duration,
    pub health: Duration,
    pub models: Duration,
    pub first_token: Duration,
}

impl Default for Ladder {
    fn default() -> Self {
        Ladder {
            alive: Duration::from_millis(300),
            port: Duration::from_secs(600),
            health: Duration::from_secs(600),
            models: Duration::from_secs(30),
            first_token: Duration::from_secs(120),
        }
    }
}

impl EngineMeta {
    /// The readiness ladder with this engine's time limits.
    pub fn ladder(&self) -> Ladder {
        let d = Ladder::default();
        let secs = |s: Option<f64>, dflt: Duration| s.map(Duration::from_secs_f64).unwrap_or(dflt);
        Ladder {
            alive: secs(self.ready.alive_s, d.alive),
            port: secs(self.ready.port_s, d.port),
            health: secs(self.ready.health_s, d.health),
            models: secs(self.ready.models_s, d.models),
            first_token: secs(self.ready.first_token_s, d.first_token),
        }
    }
}

/// How a flag parameter's value becomes arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Render {
    /// `--flag value`
    #[default]
    Space,
    /// `--flag=value`
    Equals,
    /// booleans: `--flag` when true, `--no-<flag>` when false
    Switch,
    /// booleans: `--flag` when true, nothing when false
    Present,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Kind {
    Int {
        min: i64,
        max: i64,
        #[serde(default)]
        log: bool,
        #[serde(default)]
        step: Option<i64>,
    },
    Float {
        min: f64,
        max: f64,
        #[serde(default)]
        log: bool,
    },
    Categorical {
        values: Vec<String>,
    },
    Bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Param {
    pub name: String,
    /// The command-line flag (`--parallel`).
    #[serde(default)]
    pub flag: Option<String>,
    /// An environment variable that carries the value instead of (or besides) the flag.
    #[serde(default)]
    pub env: Option<String>,
    /// A dotted key in the YAML file passed with `engine.yaml_flag`
    /// (`kv_cache_config.enable_block_reuse`).
    #[serde(default)]
    pub yaml_key: Option<String>,
    /// A JSON-valued flag (`--speculative-config`) this parameter is one key of; every
    /// parameter naming the same flag is merged into one object.
    #[serde(default)]
    pub json_flag: Option<String>,
    /// The (dotted) key inside that JSON object.
    #[serde(default)]
    pub json_key: Option<String>,
    #[serde(flatten)]
    pub kind: Kind,
    /// The engine's own default.
    pub default: Value,
    #[serde(default)]
    pub render: Render,
    /// Active only when every listed parameter has the given value (or one of the values).
    #[serde(default)]
    pub when: BTreeMap<String, Cond>,
    /// Where the name, default and range come from (file and line of the engine's source).
    pub source: String,
    /// Version gate: the flag exists from this engine version on (new or renamed flags).
    #[serde(default)]
    pub since: Option<String>,
    /// Version gate: the flag exists only before this engine version.
    #[serde(default)]
    pub until: Option<String>,
    /// The platform the parameter exists on (`cpu` or `gpu`, see `PLATFORMS`); absent: both.
    /// A study on the other platform does not search it.
    #[serde(default)]
    pub platform: Option<String>,
    /// The engine's default where it differs by platform (vLLM's `--max-num-seqs` is 128 on
    /// the CPU, 1024 on an H100): `platform_default = { cpu = 128 }` replaces `default` there.
    #[serde(default)]
    pub platform_default: BTreeMap<String, Value>,
    /// What the workload implies for this parameter (`prior`): where the search starts and
    /// what its acquisition favours until the evidence outweighs it.
    #[serde(default)]
    pub prior: Option<PriorSpec>,
    /// What the parameter's default becomes on a parallel CPU study's core slot
    /// (`slot_default = "cores"`: the slot's core count). For a thread count whose engine
    /// default counts the machine's cores, not the ones the slot pins it to (llama.cpp's
    /// `--threads -1`): left to it, every engine of a slot would start a thread per core of
    /// the machine on its one core.
    #[serde(default)]
    pub slot_default: Option<SlotDefault>,
    /// The value multiplies the GPUs a trial needs (`tensor_parallel_size`: one GPU per rank);
    /// an integer parameter of at least 1. See `Space::gpus_needed`.
    #[serde(default)]
    pub gpu_factor: bool,
}

/// See `Param::slot_default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotDefault {
    /// The slot's core count.
    Cores,
}

/// The platforms a study runs on: `gpu` where NVML finds a GPU, else `cpu`, unless the study
/// names one.
pub const PLATFORMS: &[&str] = &["cpu", "gpu"];

/// The failure classes an engine file may give patterns for under `[engine.failures]`
/// (`engine::failure` classifies start-up logs with them).
pub const FAILURE_CLASSES: &[&str] = &["oom", "unsupported", "bad_flag", "port_in_use"];

/// Compares engine versions in PEP 440 order (vLLM, SGLang and TensorRT-LLM are Python
/// packages): the release numbers numerically (`0.10.2` > `0.9.12`), then a development
/// release before a pre-release before the release before a post-release
/// (`1.2.0.dev1` < `1.2.0a1` < `1.2.0b1` < `1.2.0rc1` < `1.2.0` < `1.2.0.post1`). So a flag
/// gated `since = "0.10.0"` is absent from `0.10.0rc1`, which came before it. A local part
/// (`+cu121`) is ignored; llama.cpp's `0.6.0-dev` counts as a development release of 0.6.0.
/// Hand-written (30 lines) rather than a PEP 440 crate: only the ordering is needed, and the
/// crates that implement all of PEP 440 bring parsers for specifiers this never reads.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(v: &str) -> (Vec<u64>, u8, u64) {
        let v = v.trim_start_matches('v');
        let v = v.split('+').next().unwrap_or(v).to_ascii_lowercase();
        let mut release = Vec::new();
        let mut rest = v.as_str();
        loop {
            let digits: &str = &rest[..rest.chars().take_while(char::is_ascii_digit).count()];
            if digits.is_empty() {
                break;
            }
            release.push(digits.parse().unwrap_or(u64::MAX));
            rest = &rest[digits.len()..];
            match rest.strip_prefix('.') {
                Some(r) if r.starts_with(|c: char| c.is_ascii_digit()) => rest = r,
                _ => break,
            }
        }
        while release.last() == Some(&0) {
            release.pop(); // 1.2 == 1.2.0
        }
        let tag = rest.trim_start_matches(['.', '-', '_']);
        let letters: String = tag.chars().take_while(char::is_ascii_alphabetic).collect();
        let n: u64 = tag[letters.len()..]
            .trim_start_matches(['.', '-', '_'])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(0);
        let rank = match letters.as_str() {
            "" => 4,
            "dev" => 0,
            "a" | "alpha" => 1,
            "b" | "beta" => 2,
            "rc" | "c" | "pre" | "preview" => 3,
            "post" | "rev" | "r" => 5,
            _ => 4, // an unknown suffix: as the release
        };
        (release, rank, n)
    }
    key(a).cmp(&key(b))
}

/// The version in an engine's `--version` output: the first token that starts with a digit
/// and is made of digits and dots (with an optional suffix such as `rc1` or `.post1`).
pub fn parse_version(output: &str) -> Option<String> {
    output
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '(' | ')' | ':' | '='))
        .map(|t| t.trim_start_matches('v'))
        .find(|t| {
            t.chars().next().is_some_and(|c| c.is_ascii_digit())
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '+' || c == '-')
                && t.chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .count()
                    >= 1
        })
        .map(str::to_owned)
}

impl Param {
    /// Whether the flag exists in engine `version` (by its `since`/`until` gates).
    pub fn exists_in(&self, version: &str) -> bool {
        use std::cmp::Ordering::Less;
        self.since
            .as_deref()
            .is_none_or(|s| compare_versions(version, s) != Less)
            && self
                .until
                .as_deref()
                .is_none_or(|u| compare_versions(version, u) == Less)
    }
}

/// `lhs <= rhs` (or `>=`): `lhs` a parameter, `rhs` a parameter, a study variable `{name}` or an
/// integer; optionally only when other parameters have given values.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Constraint {
    pub lhs: String,
    pub op: String,
    pub rhs: String,
    /// `clamp`: move `lhs` to the bound; `reject`: the point is invalid.
    #[serde(default = "default_repair")]
    pub repair: String,
    #[serde(default)]
    pub when: BTreeMap<String, Cond>,
    #[serde(default)]
    pub source: String,
}

fn default_repair() -> String {
    "clamp".into()
}

/// A validated search space: one engine's, or (see `Space::joint`) several engines' behind an
/// `engine` choice parameter.
#[derive(Debug, Clone)]
pub struct Space {
    pub engine: EngineMeta,
    pub params: Vec<Param>,
    pub constraints: Vec<Constraint>,
    /// Study variables in force (the file's defaults, then the study's overrides).
    pub vars: BTreeMap<String, i64>,
    /// For a joint space: the engines' own spaces, in the order of the `engine` values.
    pub members: Vec<Space>,
}

/// The name of the study variable in `{name}`, if `s` is one.
fn var_ref(s: &str) -> Option<&str> {
    s.strip_prefix('{').and_then(|r| r.strip_suffix('}'))
}

impl Space {
    pub fn load(path: &Path) -> Result<Space, SpaceError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpaceError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Space::parse(&text, &path.display().to_string())
    }

    /// Loads `<dir>/<engine>.toml`, or every engine of a `a+b` list as a joint space.
    pub fn load_engines(dir: &Path, engines: &str) -> Result<Space, SpaceError> {
        let names: Vec<&str> = engines.split(['+', ',']).map(str::trim).collect();
        let mut spaces = Vec::new();
        for n in &names {
            let path = dir.join(format!("{n}.toml"));
            if !path.exists() {
                let known = Space::available(dir);
                return Err(SpaceError::Usage(format!(
                    "no search space for engine {n:?} in {} (have: {})",
                    dir.display(),
                    known.join(", ")
                )));
            }
            spaces.push(Space::load(&path)?);
        }
        if spaces.len() == 1 {
            Ok(spaces.remove(0))
        } else {
            Space::joint(spaces)
        }
    }

    /// The engine names with a space file in `dir`, sorted.
    pub fn available(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let p = e.path();
                (p.extension()? == "toml").then(|| p.file_stem()?.to_str().map(str::to_owned))?
            })
            .collect();
        v.sort();
        v
    }

    /// Adds a study's environment to every launch (over the engine file's own `env`).
    pub fn set_env(&mut self, env: &BTreeMap<String, String>) {
        self.engine.env.extend(env.clone());
        for m in &mut self.members {
            m.engine.env.extend(env.clone());
        }
    }

    /// Sets study variables (`max_model_len`, `gpu_count`…); a name the engine file does not
    /// declare is an error naming it.
    pub fn set_vars(&mut self, vars: &BTreeMap<String, i64>) -> Result<(), SpaceError> {
        for (k, v) in vars {
            let mut known = self.vars.contains_key(k);
            for m in &mut self.members {
                if m.vars.contains_key(k) {
                    m.vars.insert(k.clone(), *v);
                    known = true;
                }
            }
            if !known {
                return Err(SpaceError::Usage(format!(
                    "unknown variable {k:?} for engine {} (declared: {})",
                    self.engine.name,
                    self.vars.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            if self.vars.contains_key(k) {
                self.vars.insert(k.clone(), *v);
            }
        }
        Ok(())
    }

    /// The space as it is on `platform`: parameters of the other platform dropped (with those
    /// that depend on them, as `without` does), platform defaults in place. Returns the
    /// dropped names.
    pub fn for_platform(&self, platform: &str) -> Result<(Space, Vec<String>), SpaceError> {
        if !PLATFORMS.contains(&platform) {
            return Err(SpaceError::Usage(format!(
                "unknown platform {platform:?} (known: {})",
                PLATFORMS.join(", ")
            )));
        }
        let other: Vec<String> = self
            .params
            .iter()
            .filter(|p| p.platform.as_deref().is_some_and(|pl| pl != platform))
            .map(|p| p.name.clone())
            .collect();
        let (mut s, gone) = self.without(&other);
        for p in &mut s.params {
            if let Some(v) = p.platform_default.get(platform) {
                p.default = v.clone();
            }
        }
        Ok((s, gone))
    }

    pub fn active(&self, p: &Param, cfg: &Config) -> bool {
        p.when.iter().all(|(k, c)| c.holds(cfg.get(k)))
    }

    /// The GPUs a trial of `cfg` needs: the product of its active `gpu_factor` parameters
    /// (an absent one at its default), 1 when there are none. For a joint space, the chosen
    /// engine's (1 when the point names no engine of the space).
    pub fn gpus_needed(&self, cfg: &Config) -> u32 {
        if !self.members.is_empty() {
            return self
                .split(cfg)
                .map_or(1, |(member, sub)| member.gpus_needed(&sub));
        }
        self.params
            .iter()
            .filter(|p| p.gpu_factor && self.active(p, cfg))
            .map(|p| match cfg.get(&p.name).unwrap_or(&p.default) {
                Value::Int(i) => u32::try_from((*i).max(1)).unwrap_or(u32::MAX),
                _ => 1,
            })
            .fold(1u32, u32::saturating_mul)
    }

    /// The engine's defaults: the baseline every trial is compared with (for a joint space,
    /// the first engine's).
    pub fn defaults(&self) -> Config {
        let mut cfg = Config::new();
        for p in &self.params {
            if self.active(p, &cfg) {
                cfg.insert(p.name.clone(), p.default.clone());
            }
        }
        cfg
    }

    /// Every engine's defaults: one baseline per engine of a joint space, else one.
    pub fn baselines(&self) -> Vec<Config> {
        if self.members.is_empty() {
            return vec![self.defaults()];
        }
        self.members
            .iter()
            .map(|m| {
                let mut cfg = Config::new();
                cfg.insert("engine".into(), Value::Str(m.engine.name.clone()));
                for p in &self.params {
                    if p.name != "engine" && self.active(p, &cfg) {
                        cfg.insert(p.name.clone(), p.default.clone());
                    }
                }
                cfg
            })
            .collect()
    }

    /// A uniformly random point (log-uniform where marked), repaired against the constraints;
    /// points a `reject` constraint refuses are drawn again (up to 100 times).
    pub fn sample(&self, rng: &mut impl Rng) -> Result<Config, String> {
        let mut last = String::new();
        for _ in 0..100 {
            match self.sample_once(rng) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(format!("no valid point in 100 draws; the last: {last}"))
    }

    fn sample_once(&self, rng: &mut impl Rng) -> Result<Config, String> {
        let mut cfg = Config::new();
        // Parameters are sampled in file order, so a condition refers to an earlier one.
        for p in &self.params {
            if !self.active(p, &cfg) {
                continue;
            }
            let v = match &p.kind {
                Kind::Int {
                    min,
                    max,
                    log,
                    step,
                } => {
                    let x = if *log {
                        let (a, b) = ((*min as f64).ln(), (*max as f64 + 1.0).ln());
                        (rng.random_range(a..b).exp().floor() as i64).clamp(*min, *max)
                    } else {
                        rng.random_range(*min..=*max)
                    };
                    let s = step.unwrap_or(1);
                    Value::Int((min + (x - min) / s * s).clamp(*min, *max))
                }
                Kind::Float { min, max, log } => {
                    let x = if *log {
                        rng.random_range(min.ln()..=max.ln()).exp()
                    } else {
                        rng.random_range(*min..=*max)
                    };
                    Value::Float(round_float(x).clamp(*min, *max))
                }
                Kind::Categorical { values } => {
                    Value::Str(values[rng.random_range(0..values.len())].clone())
                }
                Kind::Bool => Value::Bool(rng.random_bool(0.5)),
            };
            cfg.insert(p.name.clone(), v);
        }
        self.repair(&mut cfg)?;
        Ok(cfg)
    }

    /// A configuration measured on another version of this space (or another space file),
    /// carried over for a warm start: parameters this space lacks are dropped, those it adds
    /// take their defaults, numbers outside the range are clamped and categories it does not
    /// offer fall back to the default; then the constraints apply. `None` when they reject it.
    pub fn carry_over(&self, cfg: &Config) -> Option<Config> {
        let mut out = Config::new();
        for p in &self.params {
            if !self.active(p, &out) {
                continue;
            }
            let v = cfg
                .get(&p.name)
                .and_then(|v| p.fit(v))
                .unwrap_or_else(|| p.default.clone());
            out.insert(p.name.clone(), v);
        }
        self.repair(&mut out).ok()?;
        Some(out)
    }

    /// Drops values of parameters whose conditions no longer hold, in file order.
    pub fn prune(&self, cfg: &mut Config) {
        let mut out = Config::new();
        if let Some(e) = cfg.get("engine") {
            out.insert("engine".into(), e.clone());
        }
        for p in &self.params {
            if let Some(v) = cfg.get(&p.name) {
                if self.active(p, &out) {
                    out.insert(p.name.clone(), v.clone());
                }
            }
        }
        *cfg = out;
    }

    /// A study variable's value (a joint space keeps the variables in its members; names are
    /// the same).
    pub fn var(&self, name: &str) -> Option<i64> {
        self.vars
            .get(name)
            .or_else(|| self.members.iter().find_map(|m| m.vars.get(name)))
            .copied()
    }

    /// The names of the study variables (a joint space's: its members').
    pub fn var_names(&self) -> Vec<&str> {
        self.vars
            .keys()
            .chain(self.members.iter().flat_map(|m| m.vars.keys()))
            .map(String::as_str)
            .collect()
    }

    /// The right-hand side of a constraint for a point, if it has one.
    fn rhs_value(&self, c: &Constraint, cfg: &Config) -> Option<i64> {
        if let Ok(n) = c.rhs.parse::<i64>() {
            return Some(n);
        }
        if let Some(v) = var_ref(&c.rhs) {
            return self.var(v);
        }
        match cfg.get(&c.rhs) {
            Some(Value::Int(r)) => Some(*r),
            _ => None,
        }
    }

    /// Applies the known constraints: clamps where allowed, else says why the point is invalid.
    pub fn repair(&self, cfg: &mut Config) -> Result<(), String> {
        for c in &self.constraints {
            if !c.when.iter().all(|(k, w)| w.holds(cfg.get(k))) {
                continue;
            }
            let Some(Value::Int(l)) = cfg.get(&c.lhs) else {
                continue;
            };
            let l = *l;
            let Some(r) = self.rhs_value(c, cfg) else {
                continue;
            };
            let ok = if c.op == "<=" { l <= r } else { l >= r };
            if ok {
                continue;
            }
            if c.repair == "reject" {
                return Err(format!(
                    "{} = {l} violates {} {} {} = {r}",
                    c.lhs, c.lhs, c.op, c.rhs
                ));
            }
            let bound = self
                .params
                .iter()
                .find(|p| p.name == c.lhs)
                .and_then(|p| match p.kind {
                    Kind::Int { min, max, .. } => Some((min, max)),
                    _ => None,
                });
            if let Some((min, max)) = bound {
                if r < min || r > max {
                    return Err(format!(
                        "{} cannot satisfy {} {} {} = {r} within its range [{min}, {max}]",
                        c.lhs, c.lhs, c.op, c.rhs
                    ));
                }
            }
            cfg.insert(c.lhs.clone(), Value::Int(r));
        }
        Ok(())
    }
}

/// Three significant digits: a command line reads `0.873`, not `0.8731951`, and no engine
/// knob is finer than that.
pub fn round_float(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(2 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests;
