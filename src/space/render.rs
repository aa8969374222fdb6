//! Rendering a point of a space to what the launcher runs: an argv vector (one element per
//! argument, never a shell), environment variables, and the files the command refers to (the
//! YAML of TensorRT-LLM's `--extra_llm_api_options`). Pure: the caller writes the files.
//!
//! Rules: a parameter at the engine's default is left out, so the defaults render as the bare
//! command; a categorical `"none"` is left out; parameters sharing a `json_flag` become one JSON
//! object (all its active members, or nothing when every member is at its default); `yaml_key`
//! parameters become one YAML file of nested maps.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Config, Param, Render, Space, Value, NONE};

/// An engine command line as launched: environment assignments and the argv vector, one
/// element per argument, never a shell string. Trial records keep it in this form; `display`
/// quotes it (POSIX shell rules, `shlex`) for a person to read or paste.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "CommandRepr")]
pub struct CommandLine {
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
}

/// What a stored command may be: the parts, or (records written before schema version 2) the
/// display string, split back by shell rules.
#[derive(Deserialize)]
#[serde(untagged)]
enum CommandRepr {
    Parts {
        env: Vec<(String, String)>,
        argv: Vec<String>,
    },
    Text(String),
}

impl TryFrom<CommandRepr> for CommandLine {
    type Error = String;

    fn try_from(r: CommandRepr) -> Result<Self, String> {
        match r {
            CommandRepr::Parts { env, argv } => Ok(CommandLine { env, argv }),
            CommandRepr::Text(s) => CommandLine::parse(&s),
        }
    }
}

impl CommandLine {
    /// Splits a displayed command (`K=V … argv…`) back into its parts.
    pub fn parse(text: &str) -> Result<CommandLine, String> {
        let words =
            shlex::split(text).ok_or_else(|| format!("unbalanced quotes in command {text:?}"))?;
        let is_assignment = |w: &str| {
            w.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty()
                    && !k.starts_with(|c: char| c.is_ascii_digit())
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        };
        let n_env = words.iter().take_while(|w| is_assignment(w)).count();
        let mut words = words.into_iter();
        let env = words
            .by_ref()
            .take(n_env)
            .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        Ok(CommandLine {
            env,
            argv: words.collect(),
        })
    }

    /// The command as a person would type it (for reports and logs; never executed).
    pub fn display(&self) -> String {
        // `try_quote` fails only on a NUL byte, which no argv element can hold.
        let quote =
            |s: &str| shlex::try_quote(s).map_or_else(|_| s.replace('\0', ""), |q| q.into_owned());
        let mut parts: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .collect();
        parts.extend(self.argv.iter().map(|a| quote(a)));
        parts.join(" ")
    }

    /// The command to serve with: the trial's free port (`--port N`, `--port=N`) replaced by
    /// 8000, everything else as it was.
    pub fn serving(&self) -> CommandLine {
        let mut argv = self.argv.clone();
        let mut i = 0;
        while i < argv.len() {
            if argv[i] == "--port" && i + 1 < argv.len() {
                argv[i + 1] = "8000".into();
                i += 1;
            } else if argv[i].starts_with("--port=") {
                argv[i] = "--port=8000".into();
            }
            i += 1;
        }
        CommandLine {
            env: self.env.clone(),
            argv,
        }
    }
}

/// What a rendering needs besides the point.
pub struct RenderCtx<'a> {
    pub model: &'a str,
    pub host: &'a str,
    pub port: u16,
    /// Replaces the `{binary}` element (several elements allowed: the mock engine runs as
    /// `servetune mock-engine --profile vllm --`); `None` = the file's `binary`.
    pub binary: Option<&'a [String]>,
    /// Where files the command refers to go (the trial's directory).
    pub workdir: &'a Path,
}

/// A rendered command.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Files to write before launching: path and content.
    pub files: Vec<(PathBuf, String)>,
}

impl Rendered {
    /// The command line: environment and argv.
    pub fn command_line(&self) -> CommandLine {
        CommandLine {
            env: self.env.clone(),
            argv: self.argv.clone(),
        }
    }

    /// The command line as a person would type it (for reports and logs; never executed).
    pub fn display(&self) -> String {
        self.command_line().display()
    }
}

/// A categorical value typed for JSON/YAML: `"true"`, `"16"`, `"0.5"` become a bool or a
/// number, other strings stay strings.
fn typed(v: &Value) -> serde_json::Value {
    match v {
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::Float(x) => {
            serde_json::Number::from_f64(*x).map_or(serde_json::Value::Null, Into::into)
        }
        Value::Str(s) => {
            if let Ok(b) = s.parse::<bool>() {
                b.into()
            } else if let Ok(i) = s.parse::<i64>() {
                i.into()
            } else if let Some(n) = s.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                n.into()
            } else {
                s.clone().into()
            }
        }
    }
}

/// Inserts `value` at a dotted key of a JSON object, creating the maps on the way.
fn insert_dotted(
    obj: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
    value: serde_json::Value,
) {
    match key.split_once('.') {
        None => {
            obj.insert(key.to_owned(), value);
        }
        Some((head, rest)) => {
            let child = obj
                .entry(head.to_owned())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if !child.is_object() {
                *child = serde_json::Value::Object(Default::default());
            }
            if let serde_json::Value::Object(m) = child {
                insert_dotted(m, rest, value);
            }
        }
    }
}

/// YAML for a tree of maps and scalars (strings double-quoted, JSON-style, which YAML reads).
pub(crate) fn to_yaml(
    obj: &serde_json::Map<String, serde_json::Value>,
    indent: usize,
    out: &mut String,
) {
    for (k, v) in obj {
        out.push_str(&" ".repeat(indent));
        out.push_str(k);
        out.push(':');
        match v {
            serde_json::Value::Object(m) => {
                out.push('\n');
                to_yaml(m, indent + 2, out);
            }
            scalar => {
                out.push(' ');
                out.push_str(&scalar.to_string());
                out.push('\n');
            }
        }
    }
}

fn is_none(v: &Value) -> bool {
    matches!(v, Value::Str(s) if s == NONE)
}

impl Space {
    /// The argv, environment and files of a point. For a joint space, the chosen engine's.
    pub fn render(&self, cfg: &Config, ctx: &RenderCtx) -> Result<Rendered, String> {
        if !self.members.is_empty() {
            let (member, sub) = self.split(cfg)?;
            return member.render(&sub, ctx);
        }
        let port = ctx.port.to_string();
        let mut argv: Vec<String> = Vec::new();
        for a in self.engine.argv.iter().chain(&self.engine.fixed) {
            if a == "{binary}" {
                match ctx.binary {
                    Some(b) => argv.extend(b.iter().cloned()),
                    None => argv.push(self.engine.binary.clone()),
                }
                continue;
            }
            let mut s = a
                .replace("{binary}", &self.engine.binary)
                .replace("{model}", ctx.model)
                .replace("{host}", ctx.host)
                .replace("{port}", &port);
            for (k, v) in &self.vars {
                s = s.replace(&format!("{{{k}}}"), &v.to_string());
            }
            argv.push(s);
        }
        let mut env: Vec<(String, String)> = self
            .engine
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut json_done: Vec<&str> = Vec::new();
        let mut yaml = serde_json::Map::new();
        for p in &self.params {
            let Some(v) = cfg.get(&p.name) else { continue };
            if let Some(jf) = &p.json_flag {
                if json_done.contains(&jf.as_str()) {
                    continue;
                }
                json_done.push(jf);
                if let Some(obj) = self.json_object(jf, cfg) {
                    argv.push(jf.clone());
                    argv.push(obj);
                }
                continue;
            }
            if *v == p.default || is_none(v) {
                continue;
            }
            if let Some(e) = &p.env {
                env.retain(|(k, _)| k != e);
                env.push((e.clone(), v.to_string()));
            }
            if let Some(key) = &p.yaml_key {
                insert_dotted(&mut yaml, key, typed(v));
                continue;
            }
            let Some(flag) = &p.flag else { continue };
            render_flag(p, flag, v, &mut argv);
        }
        let mut files = Vec::new();
        if !yaml.is_empty() {
            let flag = self
                .engine
                .yaml_flag
                .as_ref()
                .ok_or("yaml_key parameters without engine.yaml_flag")?;
            let path = ctx
                .workdir
                .join(format!("{}-extra-options.yaml", self.engine.name));
            let mut text = format!(
                "# written by servetune for {}; passed with {flag}\n",
                self.engine.name
            );
            to_yaml(&yaml, 0, &mut text);
            argv.push(flag.clone());
            argv.push(path.display().to_string());
            files.push((path, text));
        }
        Ok(Rendered { argv, env, files })
    }

    /// The JSON object of a `json_flag` group, or `None` when every active member is at its
    /// default (or `"none"`).
    fn json_object(&self, flag: &str, cfg: &Config) -> Option<String> {
        let members: Vec<(&Param, &Value)> = self
            .params
            .iter()
            .filter(|p| p.json_flag.as_deref() == Some(flag))
            .filter_map(|p| cfg.get(&p.name).map(|v| (p, v)))
            .collect();
        if members.iter().all(|(p, v)| **v == p.default || is_none(v)) {
            return None;
        }
        let mut obj = serde_json::Map::new();
        for (p, v) in members {
            if !is_none(v) {
                let key = p.json_key.as_deref().unwrap_or(&p.name);
                insert_dotted(&mut obj, key, typed(v));
            }
        }
        (!obj.is_empty()).then(|| serde_json::Value::Object(obj).to_string())
    }
}

fn render_flag(p: &Param, flag: &str, v: &Value, argv: &mut Vec<String>) {
    match (p.render, v) {
        (Render::Switch, Value::Bool(true)) | (Render::Present, Value::Bool(true)) => {
            argv.push(flag.to_owned())
        }
        (Render::Switch, Value::Bool(false)) => {
            argv.push(format!("--no-{}", flag.trim_start_matches('-')))
        }
        (Render::Present, Value::Bool(false)) => {}
        (Render::Equals, v) => argv.push(format!("{flag}={v}")),
        (_, v) => {
            argv.push(flag.to_owned());
            argv.push(v.to_string());
        }
    }
}
