//! Shaping a space before a study: the cross-engine space (the engine choice as a parameter),
//! version gates, and dropping the flags the installed engine's `--help` does not mention.

use super::{Cond, Config, EngineMeta, Kind, Param, Space, SpaceError, Value};

/// Whether `help` (an engine's `--help` output) mentions `flag` as a whole word: `--batch`
/// does not match `--batch-size`, and `--x` matches in `--x/--no-x`, `[--x X]` or `--x=X`.
pub fn help_mentions(help: &str, flag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut from = 0;
    while let Some(i) = help[from..].find(flag) {
        let at = from + i;
        let before = help[..at].chars().next_back();
        let after = help[at + flag.len()..].chars().next();
        if !before.is_some_and(word) && !after.is_some_and(word) {
            return true;
        }
        from = at + flag.len();
    }
    false
}

impl Space {
    /// One space over several engines: an `engine` categorical parameter first, then each
    /// engine's parameters as `<engine>.<name>`, active only when that engine is chosen.
    pub fn joint(members: Vec<Space>) -> Result<Space, SpaceError> {
        let mut names: Vec<String> = Vec::new();
        for m in &members {
            if !m.members.is_empty() {
                return Err(SpaceError::Usage("a joint space cannot nest".into()));
            }
            if names.contains(&m.engine.name) {
                return Err(SpaceError::Usage(format!(
                    "engine {:?} listed twice",
                    m.engine.name
                )));
            }
            names.push(m.engine.name.clone());
        }
        let Some(first) = names.first().cloned() else {
            return Err(SpaceError::Usage("a joint space needs an engine".into()));
        };
        let mut params = vec![Param {
            name: "engine".into(),
            flag: None,
            env: None,
            yaml_key: None,
            json_flag: None,
            json_key: None,
            kind: Kind::Categorical {
                values: names.clone(),
            },
            default: Value::Str(first),
            render: Default::default(),
            when: Default::default(),
            source: "servetune: the engine choice".into(),
            since: None,
            until: None,
            platform: None,
            platform_default: Default::default(),
            prior: None,
            slot_default: None,
            gpu_factor: false,
        }];
        let mut constraints = Vec::new();
        for m in &members {
            let pre = |n: &str| format!("{}.{n}", m.engine.name);
            let on = (
                "engine".to_string(),
                Cond::One(Value::Str(m.engine.name.clone())),
            );
            for p in &m.params {
                let mut q = p.clone();
                q.name = pre(&p.name);
                q.when = std::iter::once(on.clone())
                    .chain(p.when.iter().map(|(k, c)| (pre(k), c.clone())))
                    .collect();
                params.push(q);
            }
            for c in &m.constraints {
                let mut k = c.clone();
                k.lhs = pre(&c.lhs);
                if m.params.iter().any(|p| p.name == c.rhs) {
                    k.rhs = pre(&c.rhs);
                }
                k.when = std::iter::once(on.clone())
                    .chain(c.when.iter().map(|(n, w)| (pre(n), w.clone())))
                    .collect();
                constraints.push(k);
            }
        }
        Ok(Space {
            engine: EngineMeta {
                name: names.join("+"),
                description: format!("choice of engine: {}", names.join(", ")),
                argv: Vec::new(),
                binary: String::new(),
                version_argv: Vec::new(),
                help_argv: Vec::new(),
                health: "/health".into(),
                models: "/v1/models".into(),
                ready: Default::default(),
                fixed: Vec::new(),
                vars: Default::default(),
                yaml_flag: None,
                env: Default::default(),
                metrics: Default::default(),
                failures: Default::default(),
            },
            params,
            constraints,
            vars: Default::default(),
            members,
        })
    }

    /// For a joint space: the chosen engine's space and the point in its own names. For a
    /// single engine: itself and the point.
    pub fn split(&self, cfg: &Config) -> Result<(&Space, Config), String> {
        if self.members.is_empty() {
            return Ok((self, cfg.clone()));
        }
        let Some(Value::Str(e)) = cfg.get("engine") else {
            return Err("the point has no `engine`".into());
        };
        let m = self
            .members
            .iter()
            .find(|m| m.engine.name == *e)
            .ok_or_else(|| format!("engine {e:?} is not in this space"))?;
        let pre = format!("{e}.");
        let sub = cfg
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&pre).map(|n| (n.to_owned(), v.clone())))
            .collect();
        Ok((m, sub))
    }

    /// The space without the named parameters, and without the conditions and constraints that
    /// need them (a parameter conditional on a dropped one goes too).
    pub fn without(&self, names: &[String]) -> (Space, Vec<String>) {
        let mut gone: Vec<String> = names.to_vec();
        loop {
            let more: Vec<String> = self
                .params
                .iter()
                .filter(|p| !gone.contains(&p.name) && p.when.keys().any(|k| gone.contains(k)))
                .map(|p| p.name.clone())
                .collect();
            if more.is_empty() {
                break;
            }
            gone.extend(more);
        }
        let params = self
            .params
            .iter()
            .filter(|p| !gone.contains(&p.name))
            .cloned()
            .collect();
        let constraints = self
            .constraints
            .iter()
            .filter(|c| {
                !gone.contains(&c.lhs)
                    && !gone.contains(&c.rhs)
                    && !c.when.keys().any(|k| gone.contains(k))
            })
            .cloned()
            .collect();
        let mut s = self.clone();
        s.params = params;
        s.constraints = constraints;
        (s, gone)
    }

    /// The space as a given engine version sees it: parameters whose version gates exclude the
    /// version are dropped (with what depends on them), and their names returned so that the
    /// caller can warn.
    pub fn for_version(&self, version: &str) -> (Space, Vec<String>) {
        let out: Vec<String> = self
            .params
            .iter()
            .filter(|p| !p.exists_in(version))
            .map(|p| p.name.clone())
            .collect();
        self.without(&out)
    }

    /// The space as the installed engine's `--help` shows it: parameters whose flag (or JSON
    /// flag, or the YAML file's flag) the help text does not mention are dropped and named.
    /// A help text that mentions none of the flags is taken as no help at all (an engine that
    /// prints help in a sub-command), and nothing is dropped.
    pub fn probe_help(&self, help: &str) -> (Space, Vec<String>) {
        let carrier = |p: &Param| -> Option<String> {
            p.flag
                .clone()
                .or_else(|| p.json_flag.clone())
                .or_else(|| p.yaml_key.as_ref().and(self.engine.yaml_flag.clone()))
        };
        let with_flag: Vec<(&Param, String)> = self
            .params
            .iter()
            .filter_map(|p| carrier(p).map(|f| (p, f)))
            .collect();
        let missing: Vec<String> = with_flag
            .iter()
            .filter(|(_, f)| !help_mentions(help, f))
            .map(|(p, _)| p.name.clone())
            .collect();
        if missing.len() == with_flag.len() {
            return (self.clone(), Vec::new());
        }
        self.without(&missing)
    }
}
