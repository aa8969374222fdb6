//! Search spaces: one TOML file per engine (`search-spaces/*.toml`) describing how to start the
//! engine and which of its flags to search, with each flag's type, range, engine default, the
//! source the default was read from, conditions, and known constraints between flags.
//! Pure: parsing, validation, sampling, constraint repair and rendering to an argv vector. No
//! I/O beyond reading the file, never a shell.
//!
//! This is the first part of the engines issue: version gates, JSON/YAML-valued flags and the
//! cross-engine choice parameter come next.

use std::collections::BTreeMap;
use std::path::Path;

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

/// One point of the space: parameter name → value (inactive parameters are absent).
pub type Config = BTreeMap<String, Value>;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The command, one argv element each; `{binary}`, `{model}`, `{host}`, `{port}` are replaced
    /// element by element (never through a shell).
    pub argv: Vec<String>,
    /// The executable `{binary}` stands for.
    pub binary: String,
    #[serde(default)]
    pub version_argv: Vec<String>,
    #[serde(default = "default_health")]
    pub health: String,
    /// Arguments every trial gets (the study's fixed arguments).
    #[serde(default)]
    pub fixed: Vec<String>,
    /// Log substrings that prove a failure class (`oom`, `unsupported`, `bad_flag`,
    /// `port_in_use`), checked before the built-in ones.
    #[serde(default)]
    pub failures: BTreeMap<String, Vec<String>>,
}

fn default_health() -> String {
    "/health".into()
}

/// How a parameter's value becomes arguments.
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
    /// The command-line flag (`--parallel`); absent for environment-only parameters.
    #[serde(default)]
    pub flag: Option<String>,
    /// An environment variable that carries the value instead of (or besides) the flag.
    #[serde(default)]
    pub env: Option<String>,
    #[serde(flatten)]
    pub kind: Kind,
    /// The engine's own default.
    pub default: Value,
    #[serde(default)]
    pub render: Render,
    /// Active only when every listed parameter has the given value.
    #[serde(default)]
    pub when: BTreeMap<String, Value>,
    /// Where the name, default and range come from (file and line of the engine's source).
    pub source: String,
    /// Version gate: the flag exists from this engine version on (new or renamed flags).
    #[serde(default)]
    pub since: Option<String>,
    /// Version gate: the flag exists only before this engine version.
    #[serde(default)]
    pub until: Option<String>,
}

/// Compares dotted versions numerically (`0.10.2` > `0.9.12`); a non-numeric suffix of a part
/// (`1.2.0rc1`, `0.5.5.post1`) is ignored, so pre-releases count as their release.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<u64> {
        v.trim_start_matches('v')
            .split('.')
            .map(|p| {
                let digits: String = p.chars().take_while(|c| c.is_ascii_digit()).collect();
                digits.parse().unwrap_or(0)
            })
            .collect()
    };
    let (pa, pb) = (parts(a), parts(b));
    for i in 0..pa.len().max(pb.len()) {
        let (x, y) = (
            pa.get(i).copied().unwrap_or(0),
            pb.get(i).copied().unwrap_or(0),
        );
        if x != y {
            return x.cmp(&y);
        }
    }
    std::cmp::Ordering::Equal
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

/// `lhs <= rhs` (or `>=`) between two integer parameters.
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
    pub source: String,
}

fn default_repair() -> String {
    "clamp".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    engine: EngineMeta,
    #[serde(default, rename = "param")]
    params: Vec<toml::Spanned<Param>>,
    #[serde(default, rename = "constraint")]
    constraints: Vec<toml::Spanned<Constraint>>,
}

/// A validated search space.
#[derive(Debug, Clone)]
pub struct Space {
    pub engine: EngineMeta,
    pub params: Vec<Param>,
    pub constraints: Vec<Constraint>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Space {
    pub fn load(path: &Path) -> Result<Space, SpaceError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpaceError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Space::parse(&text, &path.display().to_string())
    }

    /// Parses and validates; every error names the file, the line and the field.
    pub fn parse(text: &str, path: &str) -> Result<Space, SpaceError> {
        let invalid = |line: usize, message: String| SpaceError::Invalid {
            path: path.to_owned(),
            line,
            message,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            invalid(line, e.message().to_owned())
        })?;
        let mut names = BTreeMap::new();
        for p in &raw.params {
            let line = line_of(text, p.span().start);
            let q = p.get_ref();
            let bad = |m: String| invalid(line, format!("param {:?}: {m}", q.name));
            if names.insert(q.name.clone(), line).is_some() {
                return Err(bad("defined twice".into()));
            }
            if q.flag.is_none() && q.env.is_none() {
                return Err(bad("needs a `flag` or an `env`".into()));
            }
            if q.source.trim().is_empty() {
                return Err(bad(
                    "`source` must say where the flag and its default come from".into(),
                ));
            }
            match (&q.kind, &q.default) {
                (
                    Kind::Int {
                        min,
                        max,
                        log,
                        step,
                    },
                    d,
                ) => {
                    if min > max {
                        return Err(bad(format!("min {min} > max {max}")));
                    }
                    if *log && *min <= 0 {
                        return Err(bad("a log-scale range needs min > 0".into()));
                    }
                    if step.is_some_and(|s| s <= 0) {
                        return Err(bad("step must be > 0".into()));
                    }
                    if !matches!(d, Value::Int(_)) {
                        return Err(bad(format!("default {d} is not an integer")));
                    }
                }
                (Kind::Float { min, max, log }, d) => {
                    if !(min.is_finite() && max.is_finite()) || min > max {
                        return Err(bad(format!("invalid range [{min}, {max}]")));
                    }
                    if *log && *min <= 0.0 {
                        return Err(bad("a log-scale range needs min > 0".into()));
                    }
                    if !matches!(d, Value::Float(_) | Value::Int(_)) {
                        return Err(bad(format!("default {d} is not a number")));
                    }
                }
                (Kind::Categorical { values }, d) => {
                    if values.is_empty() {
                        return Err(bad("`values` is empty".into()));
                    }
                    if !values.iter().any(|v| *v == d.to_string()) {
                        return Err(bad(format!("default {d:?} is not one of {values:?}")));
                    }
                }
                (Kind::Bool, d) => {
                    if !matches!(d, Value::Bool(_)) {
                        return Err(bad(format!("default {d} is not a boolean")));
                    }
                }
            }
            if matches!(q.render, Render::Switch | Render::Present) && !matches!(q.kind, Kind::Bool)
            {
                return Err(bad("render `switch`/`present` is for booleans".into()));
            }
        }
        for p in &raw.params {
            for dep in p.get_ref().when.keys() {
                if !names.contains_key(dep) {
                    return Err(invalid(
                        line_of(text, p.span().start),
                        format!(
                            "param {:?}: `when` names unknown parameter {dep:?}",
                            p.get_ref().name
                        ),
                    ));
                }
            }
        }
        for c in &raw.constraints {
            let line = line_of(text, c.span().start);
            let k = c.get_ref();
            for side in [&k.lhs, &k.rhs] {
                if !names.contains_key(side) {
                    return Err(invalid(
                        line,
                        format!("constraint: unknown parameter {side:?}"),
                    ));
                }
            }
            if k.op != "<=" && k.op != ">=" {
                return Err(invalid(
                    line,
                    format!("constraint: op must be \"<=\" or \">=\", got {:?}", k.op),
                ));
            }
            if k.repair != "clamp" && k.repair != "reject" {
                return Err(invalid(
                    line,
                    format!(
                        "constraint: repair must be \"clamp\" or \"reject\", got {:?}",
                        k.repair
                    ),
                ));
            }
        }
        for k in raw.engine.failures.keys() {
            if !crate::engine::failure::CLASS_KEYS.contains(&k.as_str()) {
                return Err(invalid(
                    line_of(text, text.find("[engine.failures]").unwrap_or(0)),
                    format!(
                        "engine.failures: unknown class {k:?} (one of {:?})",
                        crate::engine::failure::CLASS_KEYS
                    ),
                ));
            }
        }
        if !raw.engine.argv.iter().any(|a| a.contains("{binary}")) {
            return Err(invalid(1, "engine.argv must contain {binary}".into()));
        }
        Ok(Space {
            engine: raw.engine,
            params: raw.params.into_iter().map(|p| p.into_inner()).collect(),
            constraints: raw
                .constraints
                .into_iter()
                .map(|c| c.into_inner())
                .collect(),
        })
    }

    /// The space as a given engine version sees it: parameters whose version gates exclude the
    /// version are dropped (with the constraints and conditions that name them), and their names
    /// returned so that the caller can warn.
    pub fn for_version(&self, version: &str) -> (Space, Vec<String>) {
        let (keep, dropped): (Vec<&Param>, Vec<&Param>) =
            self.params.iter().partition(|p| p.exists_in(version));
        let dropped: Vec<String> = dropped.iter().map(|p| p.name.clone()).collect();
        let gone = |n: &String| dropped.contains(n);
        let params = keep
            .into_iter()
            .filter(|p| !p.when.keys().any(gone))
            .cloned()
            .collect();
        let constraints = self
            .constraints
            .iter()
            .filter(|c| !gone(&c.lhs) && !gone(&c.rhs))
            .cloned()
            .collect();
        (
            Space {
                engine: self.engine.clone(),
                params,
                constraints,
            },
            dropped,
        )
    }

    fn active(&self, p: &Param, cfg: &Config) -> bool {
        p.when.iter().all(|(k, v)| cfg.get(k) == Some(v))
    }

    /// The engine's defaults: the baseline every trial is compared with.
    pub fn defaults(&self) -> Config {
        let mut cfg = Config::new();
        for p in &self.params {
            if self.active(p, &cfg) {
                cfg.insert(p.name.clone(), p.default.clone());
            }
        }
        cfg
    }

    /// A uniformly random point (log-uniform where marked), repaired against the constraints.
    pub fn sample(&self, rng: &mut impl Rng) -> Result<Config, String> {
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
                Kind::Float { min, max, log } => Value::Float(if *log {
                    rng.random_range(min.ln()..=max.ln()).exp()
                } else {
                    rng.random_range(*min..=*max)
                }),
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

    /// Applies the known constraints: clamps where allowed, else says why the point is invalid.
    pub fn repair(&self, cfg: &mut Config) -> Result<(), String> {
        for c in &self.constraints {
            let (Some(Value::Int(l)), Some(Value::Int(r))) = (cfg.get(&c.lhs), cfg.get(&c.rhs))
            else {
                continue;
            };
            let (l, r) = (*l, *r);
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
            cfg.insert(c.lhs.clone(), Value::Int(r));
        }
        Ok(())
    }

    /// The argv and environment of a point. Parameters at their engine default are left out,
    /// so the defaults render as the bare command.
    pub fn render(
        &self,
        cfg: &Config,
        model: &str,
        host: &str,
        port: u16,
    ) -> (Vec<String>, Vec<(String, String)>) {
        let subst = |a: &str| {
            a.replace("{binary}", &self.engine.binary)
                .replace("{model}", model)
                .replace("{host}", host)
                .replace("{port}", &port.to_string())
        };
        let mut argv: Vec<String> = self.engine.argv.iter().map(|a| subst(a)).collect();
        argv.extend(self.engine.fixed.iter().map(|a| subst(a)));
        let mut env = Vec::new();
        for p in &self.params {
            let Some(v) = cfg.get(&p.name) else { continue };
            if *v == p.default {
                continue;
            }
            if let Some(e) = &p.env {
                env.push((e.clone(), v.to_string()));
            }
            let Some(flag) = &p.flag else { continue };
            match (p.render, v) {
                (Render::Switch, Value::Bool(true)) | (Render::Present, Value::Bool(true)) => {
                    argv.push(flag.clone())
                }
                (Render::Switch, Value::Bool(false)) => {
                    argv.push(format!("--no-{}", flag.trim_start_matches('-')))
                }
                (Render::Present, Value::Bool(false)) => {}
                (Render::Equals, v) => argv.push(format!("{flag}={v}")),
                (_, v) => {
                    argv.push(flag.clone());
                    argv.push(v.to_string());
                }
            }
        }
        (argv, env)
    }
}

#[cfg(test)]
mod tests {
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
        let (argv, env) = s.render(&d, "m.gguf", "127.0.0.1", 9);
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
        let (argv, _) = s.render(&c, "m", "h", 1);
        assert!(argv.contains(&"--no-cb".to_string()));
        assert!(argv.windows(2).any(|w| w == ["--batch", "64"]));
    }

    #[test]
    fn version_gates_drop_flags_outside_their_versions() {
        assert_eq!(
            compare_versions("0.10.2", "0.9.12"),
            std::cmp::Ordering::Greater
        );
        assert_eq!(
            compare_versions("v1.2.0rc1", "1.2.0"),
            std::cmp::Ordering::Equal
        );
        assert_eq!(
            compare_versions("0.5.5.post1", "0.5.5"),
            std::cmp::Ordering::Equal
        );
        let gated = MINI.replace(
            "render = \"equals\"",
            "render = \"equals\"\nsince = \"2.0\"",
        );
        let s = Space::parse(&gated, "g.toml").unwrap();
        let (old, dropped) = s.for_version("1.9.9");
        assert_eq!(dropped, vec!["mode".to_string()]);
        assert!(old.params.iter().all(|p| p.name != "mode"));
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
}
