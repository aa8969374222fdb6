//! Engine profiles of the mock: `servetune mock-engine --profile vllm -- serve MODEL --port P
//! --max-num-seqs 64 …` accepts exactly the flags of that engine's shipped search space (at the
//! faked engine version), rejects others with the engine's own message and exit code, reads
//! JSON-valued flags and the TensorRT-LLM YAML file, budgets memory the way the engine does and
//! fails at start with the engine's real message (out of memory, KV cache too small, capture
//! OOM, unsupported hardware, too many GPUs), and turns the flags into scheduler [`Settings`].
//!
//! The messages are the engines' own (sources in `ARCHITECTURE.md` and `engine/failure.rs`).

use std::collections::BTreeMap;

use crate::space::{Kind, Param, Render, Space, Value};

use super::sim::Settings;

// Defined in `engines`, which builds on them (so that it need not name this file); kept
// reachable here, at their old paths.
pub use super::engines::{Fatal, Machine};

/// The engines the mock can imitate, with their embedded search spaces.
pub const PROFILES: &[(&str, &str)] = &[
    ("vllm", include_str!("../../search-spaces/vllm.toml")),
    ("sglang", include_str!("../../search-spaces/sglang.toml")),
    ("trtllm", include_str!("../../search-spaces/trtllm.toml")),
    (
        "llamacpp",
        include_str!("../../search-spaces/llamacpp.toml"),
    ),
];

/// Default faked versions (what `--version` prints unless `--mock-version` says otherwise).
pub fn default_version(profile: &str) -> &'static str {
    match profile {
        "vllm" => "0.17.1",
        "sglang" => "0.5.9",
        "trtllm" => "1.2.0",
        _ => "0.6.0-dev",
    }
}

/// What the command line asks for, besides the settings.
#[derive(Debug, Clone)]
pub enum Parsed {
    /// Print and exit 0.
    Print(String),
    Serve(Box<Launch>),
}

#[derive(Debug, Clone)]
pub struct Launch {
    pub host: String,
    pub port: u16,
    pub model: String,
    pub settings: Settings,
    /// The log lines of a successful start.
    pub banner: String,
    /// The engine's parameter values, as understood.
    pub config: BTreeMap<String, Value>,
    /// A run-time out-of-memory: the engine dies when a step prefills more tokens than this.
    pub oom_prefill_tokens: Option<u64>,
}

/// `flag` is the unknown option as the engine names it (its `_` already turned into `-` where
/// the engine does that), with the value after it where the engine's parser lists that too.
fn bad_flag(profile: &str, flag: &str) -> Fatal {
    let (log, code) = match profile {
        // vllm/utils/argparse_utils.py FlexibleArgumentParser (top-level parser, `_` → `-`);
        // seen verbatim in vllm-project/vllm-omni#1364.
        "vllm" => (
            format!("usage: vllm [-h] [-v] {{chat,complete,serve,bench,collect-env,run-batch}} ...\nvllm: error: unrecognized arguments: {flag}\n"),
            2,
        ),
        // sglang#12818 (v0.5.5): plain argparse, prog launch_server.py.
        "sglang" => (
            format!("usage: launch_server.py [-h] --model-path MODEL_PATH [--host HOST] [--port PORT] ...\nlaunch_server.py: error: unrecognized arguments: {flag}\n"),
            2,
        ),
        // click, as trtllm-serve's `serve` command prints it (TRT-LLM#3583 for the form).
        "trtllm" => (
            format!("Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\nError: No such option: {flag}\n"),
            2,
        ),
        // common/arg.cpp common_params_parse_ex.
        _ => (format!("error: invalid argument: {flag}\n"), 1),
    };
    Fatal {
        log,
        exit_code: code,
        after_s: 0.0,
    }
}

fn bad_value(profile: &str, flag: &str, value: &str, why: &str) -> Fatal {
    let log = match profile {
        "vllm" => format!("usage: vllm serve [model_tag] [options]\nvllm serve: error: argument {flag}: {why}: '{value}'\n"),
        "sglang" => format!("launch_server.py: error: argument {flag}: {why}: '{value}'\n"),
        "trtllm" => format!("Error: Invalid value for '{flag}': '{value}' is not a valid {why}.\n"),
        _ => format!("error while handling argument \"{flag}\": {why}: {value}\n"),
    };
    Fatal {
        log,
        exit_code: if profile == "llamacpp" { 1 } else { 2 },
        after_s: 0.0,
    }
}

/// The profile's space at the faked version.
pub fn space(profile: &str, version: &str) -> Result<Space, String> {
    let text = PROFILES
        .iter()
        .find(|(p, _)| *p == profile)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            format!(
                "unknown profile {profile:?} (one of {})",
                PROFILES
                    .iter()
                    .map(|(p, _)| *p)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let s =
        Space::parse(text, &format!("search-spaces/{profile}.toml")).map_err(|e| e.to_string())?;
    Ok(s.for_version(version).0)
}

/// The flags of the command template and the fixed arguments: name → takes a value.
fn template_flags(s: &Space) -> BTreeMap<String, bool> {
    let mut m = BTreeMap::new();
    for list in [&s.engine.argv, &s.engine.fixed] {
        for (i, a) in list.iter().enumerate() {
            if a.starts_with('-') {
                let takes = list.get(i + 1).is_some_and(|n| !n.starts_with('-'));
                m.insert(a.clone(), takes);
            }
        }
    }
    m
}

fn help_text(profile: &str, s: &Space, version: &str) -> String {
    let mut out = String::new();
    if profile == "trtllm" {
        // tensorrt_llm/__init__.py prints this banner on import, so it heads every output.
        out.push_str(&format!("[TensorRT-LLM] TensorRT LLM version: {version}\n"));
    }
    out.push_str(&format!(
        "usage: {} [options]\n\noptions:\n",
        s.engine.binary
    ));
    for (f, takes) in template_flags(s) {
        out.push_str(&format!("  {f}{}\n", if takes { " VALUE" } else { "" }));
    }
    for p in &s.params {
        if let Some(f) = &p.flag {
            match p.render {
                Render::Switch => {
                    out.push_str(&format!("  {f}, --no-{}\n", f.trim_start_matches('-')))
                }
                Render::Present => out.push_str(&format!("  {f}\n")),
                _ => out.push_str(&format!("  {f} VALUE\n")),
            }
        }
    }
    let mut extra: Vec<&String> = s
        .params
        .iter()
        .filter_map(|p| p.json_flag.as_ref())
        .collect();
    extra.dedup();
    extra.extend(s.engine.yaml_flag.as_ref());
    for f in extra {
        out.push_str(&format!("  {f} VALUE\n"));
    }
    out
}

fn parse_value(kind: &Kind, raw: &str) -> Result<Value, &'static str> {
    match kind {
        Kind::Int { .. } => raw.parse().map(Value::Int).map_err(|_| "invalid int value"),
        Kind::Float { .. } => raw
            .parse()
            .map(Value::Float)
            .map_err(|_| "invalid float value"),
        Kind::Bool => match raw {
            "true" | "True" | "1" => Ok(Value::Bool(true)),
            "false" | "False" | "0" => Ok(Value::Bool(false)),
            _ => Err("invalid bool value"),
        },
        Kind::Categorical { .. } => Ok(Value::Str(raw.to_owned())),
    }
}

/// A JSON/YAML scalar as the parameter's value.
fn from_json(kind: &Kind, v: &serde_json::Value) -> Option<Value> {
    match (kind, v) {
        (Kind::Int { .. }, serde_json::Value::Number(n)) => n.as_i64().map(Value::Int),
        (Kind::Float { .. }, serde_json::Value::Number(n)) => n.as_f64().map(Value::Float),
        (Kind::Bool, serde_json::Value::Bool(b)) => Some(Value::Bool(*b)),
        (Kind::Categorical { .. }, serde_json::Value::String(s)) => Some(Value::Str(s.clone())),
        (Kind::Categorical { .. }, other) => Some(Value::Str(other.to_string())),
        _ => None,
    }
}

fn dotted<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    key.split('.').try_fold(v, |cur, k| cur.get(k))
}

/// Reads the YAML subset servetune writes (nested maps of scalars, two-space indents).
pub fn parse_yaml(text: &str) -> Result<serde_json::Value, String> {
    let mut root = serde_json::Map::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let body = line.split(" #").next().unwrap_or("");
        if body.trim().is_empty() || body.trim_start().starts_with('#') {
            continue;
        }
        let indent = body.len() - body.trim_start().len();
        let (k, v) = body
            .trim()
            .split_once(':')
            .ok_or_else(|| format!("line {}: expected `key: value`", n + 1))?;
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let mut cur = &mut root;
        for (_, name) in &stack {
            cur = cur
                .entry(name.clone())
                .or_insert_with(|| serde_json::Value::Object(Default::default()))
                .as_object_mut()
                .ok_or_else(|| format!("line {}: {name} is not a map", n + 1))?;
        }
        let v = v.trim();
        if v.is_empty() {
            cur.insert(
                k.trim().to_owned(),
                serde_json::Value::Object(Default::default()),
            );
            stack.push((indent, k.trim().to_owned()));
        } else {
            let val =
                serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_owned()));
            cur.insert(k.trim().to_owned(), val);
        }
    }
    Ok(serde_json::Value::Object(root))
}

/// Parses an engine command line (what follows `--`) the way the profile's engine would.
pub fn parse(profile: &str, args: &[String], m: &Machine) -> Result<Parsed, Fatal> {
    let s = space(profile, &m.version).map_err(|e| Fatal {
        log: format!("{e}\n"),
        exit_code: 2,
        after_s: 0.0,
    })?;
    let (vals, positionals) = match scan(profile, args, &s, &m.version)? {
        Scanned::Print(text) => return Ok(Parsed::Print(text)),
        Scanned::Flags { vals, positionals } => (vals, positionals),
    };
    let (model, host, port) = address(profile, &s, &vals, positionals)?;
    let cfg = engine_config(profile, &s, &vals)?;
    let max_model_len = context_length(&s, &vals);
    super::engines::settings(profile, &cfg, max_model_len, m).map(|(settings, banner, oom)| {
        Parsed::Serve(Box::new(Launch {
            host,
            port,
            model,
            settings,
            banner,
            config: cfg,
            oom_prefill_tokens: oom,
        }))
    })
}

/// What one pass over the command line found.
enum Scanned {
    /// `--help` or `--version`: the text to print.
    Print(String),
    /// The value of each flag given (by the flag's name) and the positional arguments.
    Flags {
        vals: BTreeMap<String, String>,
        positionals: Vec<String>,
    },
}

/// Reads the command line token by token as the engine's parser does. `--help` and
/// `--version` end the pass with a text to print; a flag the engine does not know, or one
/// missing its value, fails with the engine's message.
fn scan(profile: &str, args: &[String], s: &Space, version: &str) -> Result<Scanned, Fatal> {
    let tmpl = template_flags(s);
    let mut vals: BTreeMap<String, String> = BTreeMap::new();
    let mut positionals: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some(text) = print_request(profile, a, s, version)? {
            return Ok(Scanned::Print(text));
        }
        if !a.starts_with('-') {
            positionals.push(a.clone());
            i += 1;
            continue;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (a.clone(), None),
        };
        let name = if name.starts_with("--") {
            flag_name(profile, &name)
        } else {
            name
        };
        if let Some(p) = negated(s, &name) {
            vals.insert(p.flag.clone().unwrap_or_default(), "false".into());
            i += 1;
            continue;
        }
        let Some(takes) = takes_value(s, &tmpl, &name) else {
            return Err(unknown_flag(
                profile,
                &name,
                args.get(i + 1).map(String::as_str),
            ));
        };
        if takes {
            let v = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| bad_value(profile, &name, "", "expected one argument"))?
                }
            };
            vals.insert(name, v);
        } else {
            vals.insert(name, "true".into());
        }
        i += 1;
    }
    Ok(Scanned::Flags { vals, positionals })
}

/// The text that `a` asks the engine to print, if it is `--help` or `--version` (`-h`, `-v`).
/// TensorRT-LLM's `serve` has no `--version`: it fails on it as on any unknown option.
fn print_request(
    profile: &str,
    a: &str,
    s: &Space,
    version: &str,
) -> Result<Option<String>, Fatal> {
    if a == "--help" || a.starts_with("--help=") || a == "-h" {
        return Ok(Some(help_text(profile, s, version)));
    }
    if a == "--version" || a == "-v" {
        return Ok(Some(match profile {
            "llamacpp" => format!(
                "version: {version} (build 0, commit mock)\nbuilt with servetune mock-engine\n"
            ),
            "trtllm" => return Err(bad_flag(profile, a)),
            _ => format!("{version}\n"),
        }));
    }
    Ok(None)
}

/// A long flag's name as the engine reads it: vLLM and llama.cpp accept `_` for `-`.
fn flag_name(profile: &str, name: &str) -> String {
    if profile == "vllm" || profile == "llamacpp" {
        name.replace('_', "-")
    } else {
        name.to_owned()
    }
}

/// The switch parameter that `name` turns off (`--no-<flag>`), if it is one.
fn negated<'a>(s: &'a Space, name: &str) -> Option<&'a Param> {
    s.params.iter().find(|p| {
        p.render == Render::Switch
            && p.flag
                .as_ref()
                .is_some_and(|f| format!("--no-{}", f.trim_start_matches('-')) == name)
    })
}

/// Whether the flag `name` takes a value: as the command template writes it, or for a
/// parameter's flag, a JSON-valued flag or the YAML file's flag, unless it is a switch. None
/// when the engine does not know the flag.
fn takes_value(s: &Space, tmpl: &BTreeMap<String, bool>, name: &str) -> Option<bool> {
    let is_switch = s.params.iter().any(|p| {
        p.flag.as_deref() == Some(name) && matches!(p.render, Render::Switch | Render::Present)
    });
    tmpl.get(name).copied().or_else(|| {
        let param = s.params.iter().any(|p| p.flag.as_deref() == Some(name));
        let json = s
            .params
            .iter()
            .any(|p| p.json_flag.as_deref() == Some(name));
        let yaml = s.engine.yaml_flag.as_deref() == Some(name);
        (param || json || yaml).then_some(!is_switch)
    })
}

/// The engine's failure on the unknown flag `name`, followed on the command line by `next`.
fn unknown_flag(profile: &str, name: &str, next: Option<&str>) -> Fatal {
    // argparse (vLLM, SGLang) lists every token it could not place: the unknown flag
    // and the value after it (real vLLM 0.32.0: "unrecognized arguments: --bogus-flag 3").
    let mut unknown = name.to_owned();
    if profile == "vllm" || profile == "sglang" {
        if let Some(next) = next.filter(|n| !n.starts_with('-')) {
            unknown = format!("{unknown} {next}");
        }
    }
    bad_flag(profile, &unknown)
}

/// The model (the positional argument, or the value of the template's model flag), host and
/// port the command line asks for; a port that is not a number fails as the engine's parser
/// does.
fn address(
    profile: &str,
    s: &Space,
    vals: &BTreeMap<String, String>,
    mut positionals: Vec<String>,
) -> Result<(String, String, u16), Fatal> {
    // Literal sub-commands of the template (`serve`) and the positional model.
    let literals: Vec<&String> = s.engine.argv[1..]
        .iter()
        .enumerate()
        .filter(|(i, a)| {
            !a.starts_with('-') && !a.contains('{') && !s.engine.argv[*i].starts_with('-')
        })
        .map(|(_, a)| a)
        .collect();
    let positional_model = s
        .engine
        .argv
        .windows(2)
        .any(|w| w[1] == "{model}" && !w[0].starts_with('-'));
    for lit in &literals {
        if positionals.first() == Some(*lit) {
            positionals.remove(0);
        }
    }
    let model = if positional_model {
        positionals
            .first()
            .cloned()
            .unwrap_or_else(|| "mock-model".into())
    } else {
        s.engine
            .argv
            .windows(2)
            .find(|w| w[1] == "{model}")
            .and_then(|w| vals.get(&w[0]).cloned())
            .unwrap_or_else(|| "mock-model".into())
    };
    let host_flag = s
        .engine
        .argv
        .windows(2)
        .find(|w| w[1] == "{host}")
        .map(|w| w[0].clone());
    let port_flag = s
        .engine
        .argv
        .windows(2)
        .find(|w| w[1] == "{port}")
        .map(|w| w[0].clone());
    let host = host_flag
        .and_then(|f| vals.get(&f).cloned())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port_raw = port_flag
        .as_ref()
        .and_then(|f| vals.get(f).cloned())
        .unwrap_or_else(|| "8000".into());
    let port: u16 = port_raw.parse().map_err(|_| {
        bad_value(
            profile,
            port_flag.as_deref().unwrap_or("--port"),
            &port_raw,
            "invalid int value",
        )
    })?;
    Ok((model, host, port))
}

/// The engine's parameter values: each parameter's default, overridden by its flag, by its
/// key in a JSON-valued flag or by its key in the YAML file; a value the engine would reject,
/// or a YAML key it does not know, fails with the engine's message.
fn engine_config(
    profile: &str,
    s: &Space,
    vals: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Value>, Fatal> {
    // The engine's parameters, defaults first.
    let yaml = read_yaml(s, vals)?;
    let jsons = json_flags(profile, s, vals)?;
    let mut cfg: BTreeMap<String, Value> = BTreeMap::new();
    for p in &s.params {
        let mut v = p.default.clone();
        if let Some(f) = &p.flag {
            if let Some(raw) = vals.get(f) {
                v = parse_value(&p.kind, raw).map_err(|why| bad_value(profile, f, raw, why))?;
                if let Kind::Categorical { values } = &p.kind {
                    if !values.contains(raw) && profile != "llamacpp" {
                        return Err(bad_value(profile, f, raw, "invalid choice"));
                    }
                }
            }
        } else if let (Some(f), Some(k)) = (&p.json_flag, &p.json_key) {
            if let Some(x) = jsons.get(f).and_then(|j| dotted(j, k)) {
                v = from_json(&p.kind, x)
                    .ok_or_else(|| bad_value(profile, f, &x.to_string(), "invalid value"))?;
            }
        } else if let (Some(k), Some(y)) = (&p.yaml_key, &yaml) {
            if let Some(x) = dotted(y, k) {
                v = from_json(&p.kind, x).ok_or_else(|| Fatal {
                    log: format!("pydantic_core._pydantic_core.ValidationError: 1 validation error for TorchLlmArgs\n{k}\n  Input should be a valid value [input_value={x}]\n"),
                    exit_code: 1,
                    after_s: 0.5,
                })?;
            }
        }
        cfg.insert(p.name.clone(), v);
    }
    if let Some(y) = &yaml {
        check_yaml_keys(s, y)?;
    }
    Ok(cfg)
}

/// The YAML file that the engine's YAML flag names, read and parsed; None when the command
/// line gives no such flag.
fn read_yaml(
    s: &Space,
    vals: &BTreeMap<String, String>,
) -> Result<Option<serde_json::Value>, Fatal> {
    let Some(path) = s.engine.yaml_flag.as_ref().and_then(|f| vals.get(f)) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| Fatal {
        log: format!("FileNotFoundError: [Errno 2] No such file or directory: '{path}' ({e})\n"),
        exit_code: 1,
        after_s: 0.0,
    })?;
    let yaml = parse_yaml(&text).map_err(|e| Fatal {
        log: format!("yaml.scanner.ScannerError: {path}: {e}\n"),
        exit_code: 1,
        after_s: 0.0,
    })?;
    Ok(Some(yaml))
}

/// The value of each JSON-valued flag given, parsed, by the flag's name.
fn json_flags(
    profile: &str,
    s: &Space,
    vals: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, serde_json::Value>, Fatal> {
    let mut jsons: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for p in &s.params {
        if let Some(f) = &p.json_flag {
            if let Some(raw) = vals.get(f) {
                if !jsons.contains_key(f) {
                    let v: serde_json::Value = serde_json::from_str(raw)
                        .map_err(|_| bad_value(profile, f, raw, "invalid loads value"))?;
                    jsons.insert(f.clone(), v);
                }
            }
        }
    }
    Ok(jsons)
}

/// Fails, as TensorRT-LLM does, when the YAML file `y` sets a key that no parameter reads.
fn check_yaml_keys(s: &Space, y: &serde_json::Value) -> Result<(), Fatal> {
    // TorchLlmArgs forbids extra fields.
    let known: Vec<&str> = s
        .params
        .iter()
        .filter_map(|p| p.yaml_key.as_deref())
        .collect();
    let mut leaves = Vec::new();
    collect_leaves(y, String::new(), &mut leaves);
    if let Some(extra) = leaves.iter().find(|l| !known.contains(&l.as_str())) {
        return Err(Fatal {
            log: format!("pydantic_core._pydantic_core.ValidationError: 1 validation error for TorchLlmArgs\n{extra}\n  Extra inputs are not permitted [type=extra_forbidden]\n"),
            exit_code: 1,
            after_s: 0.5,
        });
    }
    Ok(())
}

/// The context length that the template's fixed arguments set (`{max_model_len}` or
/// `{ctx_size}`), 8192 when the command line sets neither.
fn context_length(s: &Space, vals: &BTreeMap<String, String>) -> u64 {
    let vars: BTreeMap<String, i64> = s
        .engine
        .fixed
        .windows(2)
        .filter_map(|w| {
            let var = w[1].strip_prefix('{')?.strip_suffix('}')?;
            let v = vals.get(&w[0])?.parse().ok()?;
            Some((var.to_owned(), v))
        })
        .collect();
    vars.get("max_model_len")
        .or(vars.get("ctx_size"))
        .copied()
        .unwrap_or(8192)
        .max(1) as u64
}

fn collect_leaves(v: &serde_json::Value, prefix: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                collect_leaves(x, key, out);
            }
        }
        _ => out.push(prefix),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::{Hardware, ModelSpec};
    use super::*;

    fn machine(hw: &str, version: &str) -> Machine {
        Machine {
            hw: Hardware::preset(hw, 16).unwrap(),
            model: ModelSpec::preset("8b").unwrap(),
            version: version.into(),
        }
    }

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn fatal(profile: &str, args: &str, m: &Machine) -> Fatal {
        match parse(profile, &argv(args), m) {
            Err(f) => f,
            Ok(_) => panic!("{profile} {args}: expected a failure"),
        }
    }

    fn serve(profile: &str, args: &str, m: &Machine) -> Launch {
        match parse(profile, &argv(args), m) {
            Ok(Parsed::Serve(l)) => *l,
            Ok(Parsed::Print(p)) => panic!("printed {p}"),
            Err(f) => panic!("{profile} {args}: {}", f.log),
        }
    }

    #[test]
    fn unknown_and_version_gated_flags_fail_as_the_engine_does() {
        let m = machine("h100", "0.17.1");
        let f = fatal("vllm", "serve m --port 1 --max-num-seq 8", &m);
        assert!(f
            .log
            .contains("vllm: error: unrecognized arguments: --max-num-seq"));
        assert_eq!(f.exit_code, 2);
        // --performance-mode came with 0.17.0: an older fake version lacks it.
        let old = machine("h100", "0.16.0");
        let f = fatal("vllm", "serve m --performance-mode throughput", &old);
        assert!(
            f.log.contains("unrecognized arguments: --performance-mode"),
            "{}",
            f.log
        );
        let f = fatal("llamacpp", "-m x --bogus-flag", &m);
        assert_eq!(
            (f.log.as_str(), f.exit_code),
            ("error: invalid argument: --bogus-flag\n", 1)
        );
        let f = fatal("trtllm", "serve m --max_batch_sise 8", &m);
        assert!(f.log.contains("Error: No such option: --max_batch_sise"));
        let f = fatal("vllm", "serve m --max-num-seqs lots", &m);
        assert!(
            f.log
                .contains("argument --max-num-seqs: invalid int value: 'lots'"),
            "{}",
            f.log
        );
        // The help lists the version's flags: what `probe_help` reads.
        let Ok(Parsed::Print(h)) = parse("vllm", &argv("serve --help=all"), &old) else {
            panic!()
        };
        assert!(h.contains("--max-num-seqs") && !h.contains("--performance-mode"));
    }

    #[test]
    fn flags_json_and_yaml_reach_the_settings() {
        let m = machine("h100", "0.17.1");
        let l = serve(
            "vllm",
            r#"serve m --host 127.0.0.1 --port 9 --max-model-len 4096 --max-num-seqs 64 --no-enable-prefix-caching --speculative-config {"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}"#,
            &m,
        );
        assert_eq!((l.port, l.model.as_str()), (9, "m"));
        assert_eq!(l.settings.max_seqs, 64);
        assert!(!l.settings.prefix_cache);
        assert_eq!(l.settings.spec_k, 4);
        let dir = tempfile::tempdir().unwrap();
        let y = dir.path().join("x.yaml");
        std::fs::write(&y, "kv_cache_config:\n  enable_block_reuse: false\n  dtype: \"fp8\"\nenable_chunked_prefill: true\n").unwrap();
        let l = serve(
            "trtllm",
            &format!(
                "serve m --port 5 --max_batch_size 32 --extra_llm_api_options {}",
                y.display()
            ),
            &m,
        );
        assert_eq!(l.settings.max_seqs, 32);
        assert!(!l.settings.prefix_cache && l.settings.chunked_prefill);
        assert!((l.settings.kv_factor - 0.5).abs() < 1e-9);
        std::fs::write(&y, "kv_cache_config:\n  enable_blok_reuse: false\n").unwrap();
        let f = fatal(
            "trtllm",
            &format!("serve m --extra_llm_api_options {}", y.display()),
            &m,
        );
        assert!(
            f.log.contains("Extra inputs are not permitted"),
            "{}",
            f.log
        );
    }
}
