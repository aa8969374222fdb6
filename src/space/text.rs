//! Human-readable views of a space for the `servetune space` commands: the parameter table and
//! sampled, rendered command lines.

use std::fmt::Write as _;
use std::path::Path;

use rand::SeedableRng;

use super::{Cond, Param, RenderCtx, Space};

fn carrier(s: &Space, p: &Param) -> String {
    if let Some(f) = &p.flag {
        f.clone()
    } else if let (Some(f), Some(k)) = (&p.json_flag, &p.json_key) {
        format!("{f} {{{k}}}")
    } else if let Some(k) = &p.yaml_key {
        format!("{} {k}", s.engine.yaml_flag.as_deref().unwrap_or("yaml"))
    } else {
        format!("env {}", p.env.as_deref().unwrap_or("-"))
    }
}

fn cond_text(when: &std::collections::BTreeMap<String, Cond>) -> String {
    when.iter()
        .map(|(k, c)| match c {
            Cond::One(v) => format!("{k}={v}"),
            Cond::Any(vs) => format!(
                "{k}∈{{{}}}",
                vs.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The parameter table of `servetune space show`.
pub fn show(s: &Space) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "engine {} ({})", s.engine.name, s.engine.description);
    if !s.vars.is_empty() {
        let vars: Vec<String> = s.vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "  variables: {}", vars.join(" "));
    }
    for p in &s.params {
        let range = match &p.kind {
            super::Kind::Int {
                min,
                max,
                log,
                step,
            } => format!(
                "int [{min}, {max}]{}{}",
                if *log { " log" } else { "" },
                step.map(|s| format!(" step {s}")).unwrap_or_default()
            ),
            super::Kind::Float { min, max, log } => {
                format!("float [{min}, {max}]{}", if *log { " log" } else { "" })
            }
            super::Kind::Categorical { values } => format!("one of {}", values.join(" | ")),
            super::Kind::Bool => "bool".into(),
        };
        let mut extra = String::new();
        if !p.when.is_empty() {
            let _ = write!(extra, "  when {}", cond_text(&p.when));
        }
        if let Some(v) = &p.since {
            let _ = write!(extra, "  since {v}");
        }
        if let Some(v) = &p.until {
            let _ = write!(extra, "  until {v}");
        }
        if let Some(v) = &p.platform {
            let _ = write!(extra, "  {v} only");
        }
        for (pl, v) in &p.platform_default {
            let _ = write!(extra, "  default {v} on {pl}");
        }
        let _ = writeln!(
            out,
            "  {:<24} {:<34} default {:<10} {range}{extra}",
            p.name,
            carrier(s, p),
            p.default.to_string()
        );
    }
    for c in &s.constraints {
        let when = if c.when.is_empty() {
            String::new()
        } else {
            format!(" when {}", cond_text(&c.when))
        };
        let _ = writeln!(
            out,
            "  constraint: {} {} {} ({}){when}",
            c.lhs, c.op, c.rhs, c.repair
        );
    }
    out
}

/// `n` command lines: first every engine's defaults, then constraint-repaired random points,
/// with the files they need shown after them.
pub fn sample(s: &Space, n: usize, seed: u64, model: &str) -> Result<String, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ctx = RenderCtx {
        model,
        host: "127.0.0.1",
        port: 8000,
        binary: None,
        workdir: Path::new("TRIAL_DIR"),
    };
    let mut out = String::new();
    let baselines = s.baselines();
    for i in 0..n {
        let cfg = match baselines.get(i) {
            Some(b) => b.clone(),
            None => s.sample(&mut rng)?,
        };
        let r = s.render(&cfg, &ctx)?;
        let _ = writeln!(out, "{}", r.display());
        for (path, text) in &r.files {
            let _ = writeln!(out, "  # {}:", path.display());
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let _ = writeln!(out, "  #   {line}");
            }
        }
    }
    Ok(out)
}
