//! Reading a search-space file: the TOML into its raw form, then every check that names the
//! file, the line and the field (a parameter's carriers, type, range, default, prior and
//! platforms; the constraints' parameters and bounds; the engine's failure classes, metric
//! names and paths).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    var_ref, Constraint, EngineMeta, Kind, Param, Render, Space, SpaceError, Value,
    FAILURE_CLASSES, METRIC_KEYS, PLATFORMS,
};

/// The keys a `[[param]]` table may have (serde cannot deny unknown ones through `flatten`).
const PARAM_KEYS: &[&str] = &[
    "name",
    "flag",
    "env",
    "yaml_key",
    "json_flag",
    "json_key",
    "type",
    "min",
    "max",
    "log",
    "step",
    "values",
    "default",
    "render",
    "when",
    "source",
    "since",
    "until",
    "platform",
    "platform_default",
    "prior",
    "slot_default",
    "gpu_factor",
];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    engine: EngineMeta,
    #[serde(default, rename = "param")]
    params: Vec<toml::Spanned<Param>>,
    #[serde(default, rename = "constraint")]
    constraints: Vec<toml::Spanned<Constraint>>,
}

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

pub(super) fn validate_kind(q: &Param) -> Result<(), String> {
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
                return Err(format!("min {min} > max {max}"));
            }
            if *log && *min <= 0 {
                return Err("a log-scale range needs min > 0".into());
            }
            if step.is_some_and(|s| s <= 0) {
                return Err("step must be > 0".into());
            }
            if !matches!(d, Value::Int(_)) {
                return Err(format!("default {d} is not an integer"));
            }
        }
        (Kind::Float { min, max, log }, d) => {
            if !(min.is_finite() && max.is_finite()) || min > max {
                return Err(format!("invalid range [{min}, {max}]"));
            }
            if *log && *min <= 0.0 {
                return Err("a log-scale range needs min > 0".into());
            }
            if !matches!(d, Value::Float(_) | Value::Int(_)) {
                return Err(format!("default {d} is not a number"));
            }
        }
        (Kind::Categorical { values }, d) => {
            if values.is_empty() {
                return Err("`values` is empty".into());
            }
            if !values.iter().any(|v| *v == d.to_string()) {
                return Err(format!("default {d:?} is not one of {values:?}"));
            }
        }
        (Kind::Bool, d) => {
            if !matches!(d, Value::Bool(_)) {
                return Err(format!("default {d} is not a boolean"));
            }
        }
    }
    if matches!(q.render, Render::Switch | Render::Present) && !matches!(q.kind, Kind::Bool) {
        return Err("render `switch`/`present` is for booleans".into());
    }
    if q.render != Render::Space && q.flag.is_none() {
        return Err("`render` applies to a `flag`".into());
    }
    Ok(())
}

/// Where a file's errors point: its path and text.
struct Source<'a> {
    text: &'a str,
    path: &'a str,
}

impl Source<'_> {
    fn invalid(&self, line: usize, message: String) -> SpaceError {
        SpaceError::Invalid {
            path: self.path.to_owned(),
            line,
            message,
        }
    }

    fn line(&self, offset: usize) -> usize {
        line_of(self.text, offset)
    }

    /// The line of the first `marker` in the file (1 without it).
    fn line_at(&self, marker: &str) -> usize {
        self.line(self.text.find(marker).unwrap_or(0))
    }
}

impl Space {
    /// Parses and validates; every error names the file, the line and the field.
    pub fn parse(text: &str, path: &str) -> Result<Space, SpaceError> {
        let src = Source { text, path };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            src.invalid(line, e.message().to_owned())
        })?;
        unknown_param_keys(&src, &raw)?;
        let mut names = BTreeMap::new();
        for p in &raw.params {
            let line = src.line(p.span().start);
            let q = p.get_ref();
            let bad = |m: String| src.invalid(line, format!("param {:?}: {m}", q.name));
            if names.insert(q.name.clone(), line).is_some() {
                return Err(bad("defined twice".into()));
            }
            check_param(q, &raw.engine).map_err(bad)?;
        }
        for p in &raw.params {
            for dep in p.get_ref().when.keys() {
                if !names.contains_key(dep) {
                    return Err(src.invalid(
                        src.line(p.span().start),
                        format!(
                            "param {:?}: `when` names unknown parameter {dep:?}",
                            p.get_ref().name
                        ),
                    ));
                }
            }
        }
        for c in &raw.constraints {
            check_constraint(c.get_ref(), &names, &raw.engine)
                .map_err(|m| src.invalid(src.line(c.span().start), m))?;
        }
        check_engine(&src, &raw.engine)?;
        let vars = raw.engine.vars.clone();
        Ok(Space {
            engine: raw.engine,
            params: raw.params.into_iter().map(|p| p.into_inner()).collect(),
            constraints: raw
                .constraints
                .into_iter()
                .map(|c| c.into_inner())
                .collect(),
            vars,
            members: Vec::new(),
        })
    }
}

/// Unknown keys inside `[[param]]` (serde's `flatten` lets them through).
fn unknown_param_keys(src: &Source, raw: &RawFile) -> Result<(), SpaceError> {
    let Ok(toml::Value::Table(t)) = toml::from_str::<toml::Value>(src.text) else {
        return Ok(());
    };
    let Some(toml::Value::Array(ps)) = t.get("param") else {
        return Ok(());
    };
    for (i, p) in ps.iter().enumerate() {
        let Some(p) = p.as_table() else { continue };
        if let Some(k) = p.keys().find(|k| !PARAM_KEYS.contains(&k.as_str())) {
            let line = raw.params.get(i).map_or(0, |s| src.line(s.span().start));
            return Err(src.invalid(
                line,
                format!(
                    "param {:?}: unknown field `{k}` (known: {})",
                    p.get("name").and_then(|n| n.as_str()).unwrap_or("?"),
                    PARAM_KEYS.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// One parameter on its own: its name, how it reaches the engine (one carrier), its source,
/// type and default, prior and platforms.
fn check_param(q: &Param, engine: &EngineMeta) -> Result<(), String> {
    if q.name == "engine" || q.name.contains('.') {
        return Err("`engine` and names with a dot are reserved".into());
    }
    let carriers = [
        q.flag.is_some(),
        q.yaml_key.is_some(),
        q.json_flag.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if carriers > 1 {
        return Err("has more than one of `flag`, `yaml_key`, `json_flag`".into());
    }
    if carriers == 0 && q.env.is_none() {
        return Err("needs a `flag`, `env`, `yaml_key` or `json_flag`".into());
    }
    if q.json_flag.is_some() != q.json_key.is_some() {
        return Err("`json_flag` and `json_key` go together".into());
    }
    if q.yaml_key.is_some() && engine.yaml_flag.is_none() {
        return Err("has a `yaml_key` but [engine] has no `yaml_flag`".into());
    }
    if q.source.trim().is_empty() {
        return Err("`source` must say where the flag and its default come from".into());
    }
    validate_kind(q)?;
    if q.gpu_factor && !matches!(q.kind, Kind::Int { min, .. } if min >= 1) {
        return Err(
            "`gpu_factor` is for an integer parameter with min >= 1 (the GPUs a trial needs)"
                .into(),
        );
    }
    if let Some(pr) = &q.prior {
        let vars: Vec<&str> = engine.vars.keys().map(String::as_str).collect();
        pr.at(q, &vars)?;
    }
    if let Some(pl) = &q.platform {
        if !PLATFORMS.contains(&pl.as_str()) {
            return Err(format!(
                "`platform` {pl:?} is not one of {}",
                PLATFORMS.join(", ")
            ));
        }
    }
    for (pl, v) in &q.platform_default {
        if !PLATFORMS.contains(&pl.as_str()) {
            return Err(format!(
                "`platform_default` names {pl:?}, not one of {}",
                PLATFORMS.join(", ")
            ));
        }
        if q.fit(v).as_ref() != Some(v) {
            return Err(format!(
                "`platform_default.{pl}` {v} is not a value of the parameter"
            ));
        }
    }
    Ok(())
}

/// One constraint: its parameters known, its bound a parameter, an integer or a study
/// variable, its operator and repair known.
fn check_constraint(
    k: &Constraint,
    names: &BTreeMap<String, usize>,
    engine: &EngineMeta,
) -> Result<(), String> {
    if !names.contains_key(&k.lhs) {
        return Err(format!(
            "constraint: unknown parameter {:?} in `lhs`",
            k.lhs
        ));
    }
    let rhs_ok = names.contains_key(&k.rhs)
        || k.rhs.parse::<i64>().is_ok()
        || var_ref(&k.rhs).is_some_and(|v| engine.vars.contains_key(v));
    if !rhs_ok {
        return Err(format!(
            "constraint: `rhs` {:?} is not a parameter, an integer or a variable of [engine.vars] ({})",
            k.rhs,
            engine.vars.keys().map(|v| format!("{{{v}}}")).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(dep) = k.when.keys().find(|d| !names.contains_key(*d)) {
        return Err(format!(
            "constraint: `when` names unknown parameter {dep:?}"
        ));
    }
    if k.op != "<=" && k.op != ">=" {
        return Err(format!(
            "constraint: op must be \"<=\" or \">=\", got {:?}",
            k.op
        ));
    }
    if k.repair != "clamp" && k.repair != "reject" {
        return Err(format!(
            "constraint: repair must be \"clamp\" or \"reject\", got {:?}",
            k.repair
        ));
    }
    Ok(())
}

/// The `[engine]` table: known failure classes and metric names, `{binary}` in the argv,
/// absolute health and models paths.
fn check_engine(src: &Source, engine: &EngineMeta) -> Result<(), SpaceError> {
    for k in engine.failures.keys() {
        if !FAILURE_CLASSES.contains(&k.as_str()) {
            return Err(src.invalid(
                src.line_at("[engine.failures]"),
                format!(
                    "engine.failures: unknown class {k:?} (one of {:?})",
                    FAILURE_CLASSES
                ),
            ));
        }
    }
    if let Some(k) = engine
        .metrics
        .keys()
        .find(|k| !METRIC_KEYS.contains(&k.as_str()))
    {
        return Err(src.invalid(
            src.line_at("[engine.metrics]"),
            format!("engine.metrics: unknown metric {k:?} (one of {METRIC_KEYS:?})"),
        ));
    }
    let engine_line = src.line_at("[engine");
    if !engine.argv.iter().any(|a| a.contains("{binary}")) {
        return Err(src.invalid(engine_line, "engine.argv must contain {binary}".into()));
    }
    for (what, s) in [("health", &engine.health), ("models", &engine.models)] {
        if !s.starts_with('/') {
            return Err(src.invalid(
                engine_line,
                format!("engine.{what} must be a path starting with '/', got {s:?}"),
            ));
        }
    }
    Ok(())
}
