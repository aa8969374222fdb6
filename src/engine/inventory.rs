//! Which engines are installed on this node: for every search-space file, the executable its
//! `binary` names (on `PATH`, or servetune's own llama-server build in the cache), the version
//! its `version_argv` prints, and the flags of the space its `--help` does not list (dropped
//! from studies with a warning). Commands run as argv vectors with a time limit, in their own
//! process group, killed on timeout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::space::{parse_version, Space};

/// One engine as found on this node.
#[derive(Debug, Clone, Serialize)]
pub struct Installed {
    pub engine: String,
    pub binary: String,
    pub path: Option<PathBuf>,
    pub version: Option<String>,
    /// Parameters whose flags the installed engine's `--help` lacks (or whose version gates
    /// exclude the installed version).
    pub missing_flags: Vec<String>,
    /// Why the engine counts as not installed, or a problem reading it.
    pub note: Option<String>,
}

/// `binary` on PATH (or as a path), else what `servetune setup` installed (llama-server, vllm).
pub fn resolve_binary(binary: &str) -> Option<PathBuf> {
    let p = Path::new(binary);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let c = dir.join(binary);
            if is_executable(&c) {
                return Some(c);
            }
        }
    }
    // What `servetune setup` installed, when nothing on PATH has the name.
    let cached = match binary {
        "llama-server" => crate::setup::LlamaPaths::default_paths().server,
        "vllm" => crate::setup::VllmPaths::default_paths().vllm,
        _ => return None,
    };
    is_executable(&cached).then_some(cached)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Runs an argv (no shell) with a time limit; stdout and stderr together, and whether it
/// exited 0.
pub async fn run_captured(argv: &[String], limit: Duration) -> Result<(bool, String), String> {
    let Some((prog, args)) = argv.split_first() else {
        return Err("empty command".into());
    };
    let child = tokio::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    let pid = child.id().map(|p| p as i32);
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            Ok((out.status.success(), text))
        }
        Ok(Err(e)) => Err(format!("{prog}: {e}")),
        Err(_) => {
            if let Some(pgid) = pid {
                super::process::signal_group(pgid, libc::SIGKILL);
            }
            Err(format!(
                "{} did not finish within {:.0} s",
                argv.join(" "),
                limit.as_secs_f64()
            ))
        }
    }
}

fn subst(argv: &[String], binary: &[String]) -> Vec<String> {
    argv.iter()
        .flat_map(|a| {
            if a == "{binary}" {
                binary.to_vec()
            } else {
                vec![a.clone()]
            }
        })
        .collect()
}

/// Probes one engine. `binary` overrides the file's (e.g. the mock engine).
pub async fn probe(space: &Space, binary: Option<&[String]>, limit: Duration) -> Installed {
    let mut out = Installed {
        engine: space.engine.name.clone(),
        binary: space.engine.binary.clone(),
        path: None,
        version: None,
        missing_flags: Vec::new(),
        note: None,
    };
    let bin: Vec<String> = match binary {
        Some(b) => b.to_vec(),
        None => match resolve_binary(&space.engine.binary) {
            Some(p) => {
                out.path = Some(p.clone());
                vec![p.display().to_string()]
            }
            None => {
                out.note = Some(format!("{} not found on PATH", space.engine.binary));
                return out;
            }
        },
    };
    if binary.is_some() {
        out.path = bin.first().map(PathBuf::from);
    }
    if !space.engine.version_argv.is_empty() {
        match run_captured(&subst(&space.engine.version_argv, &bin), limit).await {
            Ok((true, text)) => out.version = parse_version(&text),
            Ok((false, text)) => {
                let last = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                out.note = Some(format!(
                    "version command failed: {}",
                    crate::util::excerpt(last.trim(), 160)
                ));
                return out;
            }
            Err(e) => {
                out.note = Some(e);
                return out;
            }
        }
    }
    let mut gated = space.clone();
    if let Some(v) = &out.version {
        let (s, dropped) = gated.for_version(v);
        gated = s;
        out.missing_flags.extend(dropped);
    }
    if !space.engine.help_argv.is_empty() {
        match run_captured(&subst(&space.engine.help_argv, &bin), limit).await {
            Ok((_, text)) => {
                let (_, dropped) = gated.probe_help(&text);
                for d in dropped {
                    if !out.missing_flags.contains(&d) {
                        out.missing_flags.push(d);
                    }
                }
            }
            Err(e) => out.note = Some(format!("help: {e}")),
        }
    }
    out
}

/// The `servetune engines` table.
pub fn table(rows: &[Installed]) -> String {
    let mut s = format!(
        "{:<10} {:<14} {:<48} {}\n",
        "ENGINE", "VERSION", "PATH", "NOTES"
    );
    for r in rows {
        let mut notes = Vec::new();
        if let Some(n) = &r.note {
            notes.push(n.clone());
        }
        if !r.missing_flags.is_empty() {
            notes.push(format!("lacks: {}", r.missing_flags.join(", ")));
        }
        s.push_str(&format!(
            "{:<10} {:<14} {:<48} {}\n",
            r.engine,
            r.version.as_deref().unwrap_or("-"),
            r.path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "not installed".into()),
            notes.join("; ")
        ));
    }
    s
}
