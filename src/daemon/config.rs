//! The daemon's configuration file (`/etc/servetune/config.toml`), validated whole before any
//! port is bound: unknown keys, a bad address, an unreadable or world-readable token file, a
//! bad cron expression, or a study file that does not load are all refused with a message
//! naming the field (`study[1].file: …`); the daemon then exits with status 64 (EX_USAGE).
//!
//! ```toml
//! [daemon]
//! listen = "127.0.0.1:7878"          # loopback unless told otherwise
//! token_file = "/etc/servetune/token" # default: <state_dir>/token, created (0600) if missing
//! state_dir = "/var/lib/servetune"
//! schedule = "0 3 * * *"              # cron: the nightly re-tune
//! schedule_tz = "Europe/Berlin"       # the zone the schedule is read in (IANA; default UTC)
//! probe_interval_s = 3600             # how often engine versions, GPU and driver are probed
//! search_spaces = "search-spaces"     # default: beside this file
//!
//! [[study]]
//! file = "studies/llama.toml"         # relative to this file
//! ```

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::cron::{CronError, Schedule};
use super::DaemonError;
use crate::tune::spec::Study;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    daemon: RawDaemon,
    #[serde(default)]
    study: Vec<RawStudy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    listen: Option<String>,
    token_file: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    schedule: Option<String>,
    schedule_tz: Option<String>,
    probe_interval_s: Option<f64>,
    max_body_bytes: Option<usize>,
    stop_timeout_s: Option<f64>,
    tune_on_start: Option<bool>,
    warm_top: Option<usize>,
    search_spaces: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStudy {
    file: PathBuf,
    #[serde(default = "yes")]
    nightly: bool,
    #[serde(default = "yes")]
    on_upgrade: bool,
}

fn yes() -> bool {
    true
}

/// A study the daemon keeps tuned.
#[derive(Debug, Clone)]
pub struct KeptStudy {
    pub file: PathBuf,
    pub study: Study,
    /// Re-tuned on the schedule.
    pub nightly: bool,
    /// Re-tuned when the engine version, the GPU or the driver changes.
    pub on_upgrade: bool,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub path: PathBuf,
    pub listen: SocketAddr,
    pub token_file: PathBuf,
    /// Whether `token_file` was named (then it must exist) or is the default (then it is made).
    pub token_file_given: bool,
    pub state_dir: PathBuf,
    pub schedule: Schedule,
    pub probe_interval_s: f64,
    pub max_body_bytes: usize,
    /// How long SIGTERM waits for the running trial's engine to be torn down.
    pub stop_timeout_s: f64,
    /// Tune the kept studies that were never tuned as soon as the daemon starts.
    pub tune_on_start: bool,
    /// How many of the previous study's top trials a re-tune measures first.
    pub warm_top: usize,
    /// Where studies without a `space_dir` find the search-space files.
    pub search_spaces: Option<PathBuf>,
    pub studies: Vec<KeptStudy>,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
pub const DEFAULT_SCHEDULE: &str = "0 3 * * *";

/// An error with its causes: `cannot read x.toml: No such file or directory (os error 2)`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

fn bad(path: &Path, field: &str, msg: impl std::fmt::Display) -> DaemonError {
    DaemonError::Config(format!("{}: {field}: {msg}", path.display()))
}

impl DaemonConfig {
    pub fn load(path: &Path) -> Result<DaemonConfig, DaemonError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| DaemonError::Config(format!("cannot read {}: {e}", path.display())))?;
        DaemonConfig::parse(&text, path)
    }

    /// Parses and checks everything; nothing is bound or started.
    pub fn parse(text: &str, path: &Path) -> Result<DaemonConfig, DaemonError> {
        let raw: Raw = toml::from_str(text)
            .map_err(|e| DaemonError::Config(format!("{}: {e}", path.display())))?;
        let d = raw.daemon;
        let base = path.parent().unwrap_or(Path::new("."));
        let anchor = |p: PathBuf| anchored(base, p);

        let listen = parse_listen(path, d.listen.as_deref())?;

        let state_dir = anchor(
            d.state_dir
                .unwrap_or_else(|| PathBuf::from("/var/lib/servetune")),
        );
        check_state_dir(path, &state_dir)?;

        let token_file_given = d.token_file.is_some();
        let token_file = d
            .token_file
            .map(anchor)
            .unwrap_or_else(|| state_dir.join("token"));
        if token_file_given || token_file.exists() {
            read_token(&token_file).map_err(|m| bad(path, "daemon.token_file", m))?;
        }

        let schedule = parse_schedule(path, d.schedule.as_deref(), d.schedule_tz.as_deref())?;
        let limits = Limits::check(
            path,
            d.probe_interval_s,
            d.max_body_bytes,
            d.stop_timeout_s,
            d.warm_top,
        )?;
        let search_spaces = search_spaces_dir(path, base, d.search_spaces.map(anchor))?;
        let studies = kept_studies(path, base, raw.study, search_spaces.as_deref())?;
        Ok(DaemonConfig {
            path: path.to_owned(),
            listen,
            token_file,
            token_file_given,
            state_dir,
            schedule,
            probe_interval_s: limits.probe_interval_s,
            max_body_bytes: limits.max_body_bytes,
            stop_timeout_s: limits.stop_timeout_s,
            tune_on_start: d.tune_on_start.unwrap_or(true),
            warm_top: limits.warm_top,
            search_spaces,
            studies,
        })
    }

    /// The bearer token: read from the token file, or (for the default path only) made.
    pub fn token(&self) -> Result<String, DaemonError> {
        if !self.token_file.exists() && !self.token_file_given {
            let token = random_token();
            token
                .and_then(|t| write_private(&self.token_file, &t).map(|_| t))
                .map_err(|e| {
                    DaemonError::Config(format!(
                        "cannot create the token file {}: {e}",
                        self.token_file.display()
                    ))
                })?;
            tracing::info!(
                "created the API token in {} (readable by this user only)",
                self.token_file.display()
            );
        }
        read_token(&self.token_file).map_err(|m| bad(&self.path, "daemon.token_file", m))
    }
}

/// Resolves a path of the configuration file against the file's own directory, unless it is
/// absolute.
fn anchored(base: &Path, p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        base.join(p)
    }
}

/// Parses `daemon.listen`, the default address when it is not set.
fn parse_listen(path: &Path, listen: Option<&str>) -> Result<SocketAddr, DaemonError> {
    let listen_text = listen.unwrap_or(DEFAULT_LISTEN);
    listen_text.parse().map_err(|_| {
        bad(
            path,
            "daemon.listen",
            format!("{listen_text:?} is not an IP:PORT address (e.g. \"127.0.0.1:7878\")"),
        )
    })
}

/// Creates the state directory if it is missing and checks that the daemon can write in it.
fn check_state_dir(path: &Path, state_dir: &Path) -> Result<(), DaemonError> {
    std::fs::create_dir_all(state_dir).map_err(|e| {
        bad(
            path,
            "daemon.state_dir",
            format!("{}: {e}", state_dir.display()),
        )
    })?;
    let probe = state_dir.join(".servetune-write-check");
    std::fs::write(&probe, b"")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| {
            bad(
                path,
                "daemon.state_dir",
                format!("{} is not writable: {e}", state_dir.display()),
            )
        })
}

/// Parses `daemon.schedule` in the zone `daemon.schedule_tz` (the defaults when they are not
/// set), and refuses a schedule that never fires.
fn parse_schedule(
    path: &Path,
    schedule: Option<&str>,
    tz: Option<&str>,
) -> Result<Schedule, DaemonError> {
    let sched_text = schedule.unwrap_or(DEFAULT_SCHEDULE);
    let tz = tz.unwrap_or("UTC");
    let schedule = Schedule::parse(sched_text, tz).map_err(|e| match e {
        CronError::TimeZone(_) => bad(path, "daemon.schedule_tz", e),
        CronError::Expression { .. } => bad(path, "daemon.schedule", e),
    })?;
    if schedule
        .next_after(crate::util::unix_now() as i64)
        .is_none()
    {
        return Err(bad(
            path,
            "daemon.schedule",
            format!("{sched_text:?} never fires (no such date in the coming year or more)"),
        ));
    }
    Ok(schedule)
}

/// The daemon's numeric settings, each with its default and checked against its range.
struct Limits {
    probe_interval_s: f64,
    max_body_bytes: usize,
    stop_timeout_s: f64,
    warm_top: usize,
}

impl Limits {
    /// Applies the defaults to the numeric settings of `[daemon]` and refuses the first one
    /// out of its range, in the order the file documents them.
    fn check(
        path: &Path,
        probe_interval_s: Option<f64>,
        max_body_bytes: Option<usize>,
        stop_timeout_s: Option<f64>,
        warm_top: Option<usize>,
    ) -> Result<Limits, DaemonError> {
        let probe_interval_s = probe_interval_s.unwrap_or(3600.0);
        if !(probe_interval_s.is_finite() && probe_interval_s >= 10.0) {
            return Err(bad(
                path,
                "daemon.probe_interval_s",
                format!("{probe_interval_s} must be at least 10 seconds"),
            ));
        }
        let max_body_bytes = max_body_bytes.unwrap_or(256 * 1024);
        if !(1024..=64 * 1024 * 1024).contains(&max_body_bytes) {
            return Err(bad(
                path,
                "daemon.max_body_bytes",
                format!("{max_body_bytes} must be between 1024 and 67108864"),
            ));
        }
        let stop_timeout_s = stop_timeout_s.unwrap_or(90.0);
        if !(stop_timeout_s.is_finite() && (1.0..=3600.0).contains(&stop_timeout_s)) {
            return Err(bad(
                path,
                "daemon.stop_timeout_s",
                format!("{stop_timeout_s} must be between 1 and 3600 seconds"),
            ));
        }
        let warm_top = warm_top.unwrap_or(3);
        if warm_top > 20 {
            return Err(bad(
                path,
                "daemon.warm_top",
                format!("{warm_top} must be at most 20"),
            ));
        }
        Ok(Limits {
            probe_interval_s,
            max_body_bytes,
            stop_timeout_s,
            warm_top,
        })
    }
}

/// The directory of search-space files: the one `daemon.search_spaces` names (already
/// anchored), which must hold some, else `search-spaces` beside the configuration file if it
/// exists.
fn search_spaces_dir(
    path: &Path,
    base: &Path,
    named: Option<PathBuf>,
) -> Result<Option<PathBuf>, DaemonError> {
    Ok(match named {
        Some(dir) => {
            if crate::space::Space::available(&dir).is_empty() {
                return Err(bad(
                    path,
                    "daemon.search_spaces",
                    format!("{} holds no search-space files (*.toml)", dir.display()),
                ));
            }
            Some(dir)
        }
        None => Some(base.join("search-spaces")).filter(|d| d.is_dir()),
    })
}

/// Loads every `[[study]]` of the configuration file, refusing one that does not load and a
/// second study with the same name.
fn kept_studies(
    path: &Path,
    base: &Path,
    raw: Vec<RawStudy>,
    search_spaces: Option<&Path>,
) -> Result<Vec<KeptStudy>, DaemonError> {
    let mut studies = Vec::new();
    let mut names = BTreeSet::new();
    for (i, s) in raw.into_iter().enumerate() {
        let file = anchored(base, s.file);
        let field = format!("study[{i}].file");
        let text = std::fs::read_to_string(&file)
            .map_err(|e| bad(path, &field, format!("cannot read {}: {e}", file.display())))?;
        let study = Study::parse_in(&text, &file, search_spaces)
            .map_err(|e| bad(path, &field, chain(&e)))?;
        if !names.insert(study.id().to_owned()) {
            return Err(bad(
                path,
                &field,
                format!(
                    "a second study named {:?}; study names must be unique",
                    study.id()
                ),
            ));
        }
        studies.push(KeptStudy {
            file,
            study,
            nightly: s.nightly,
            on_upgrade: s.on_upgrade,
        });
    }
    Ok(studies)
}

/// The token in `path`: at least 16 characters, the file not readable by other users.
pub fn read_token(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o007 != 0 {
        return Err(format!(
            "{} is accessible to every user (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.trim();
    if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{} must hold one token of at least 16 characters without spaces",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}
