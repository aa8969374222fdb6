//! Shared harness for integration tests: an in-process mock engine, a raw TCP server that
//! answers with scripted bytes (for malformed and interrupted streams), flag parsing, and the
//! shipped studies shrunk to smoke runs.

#![allow(dead_code)]

use servetune::bench::args::BenchArgs;
use servetune::bench::{self, BenchOutcome};
#[cfg(feature = "mock")]
use servetune::mock::{self, MockConfig, MockHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Parses `servetune bench` flags.
pub fn args(flags: &[&str]) -> BenchArgs {
    let mut v = vec!["--disable-tqdm"];
    v.extend_from_slice(flags);
    BenchArgs::from_flags(&v).expect("valid flags")
}

#[cfg(feature = "mock")]
pub async fn start_mock(cfg: MockConfig) -> MockHandle {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    mock::serve(l, cfg).unwrap()
}

/// Runs a benchmark against `base` with the given extra flags.
pub async fn bench_at(base: &str, flags: &[&str]) -> BenchOutcome {
    let mut v = vec!["--base-url", base, "--tokenizer", "words"];
    v.extend_from_slice(flags);
    let (plan, _info) = args(&v).prepare().await.expect("prepare");
    bench::run(plan).await.expect("run")
}

/// A server that reads one request per connection and answers with `response` bytes verbatim,
/// then closes. Good for malformed streams, missing content and connections cut mid-stream.
pub async fn scripted_server(response: &'static [u8]) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                break;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut seen = Vec::new();
                // Read until the end of the headers and the body (Content-Length).
                loop {
                    let n = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    if let Some(h) = find(&seen, b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..h]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= h + 4 + len {
                            break;
                        }
                    }
                }
                let _ = s.write_all(response).await;
                let _ = s.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Live (non-zombie) mock engines whose command line contains `marker`.
pub fn engines_with(marker: &str) -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let p = e.path();
        let Ok(cmd) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let zombie = std::fs::read_to_string(p.join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if !zombie && cmd.contains("mock-engine") && cmd.contains(marker) {
            left.push(cmd);
        }
    }
    left
}

/// The shipped study with its budget and workloads shrunk (`trials` trials, 2 rounds, a few
/// short requests per workload, no importance phase), edited as TOML so that retuning the shipped file does not
/// break it.
pub fn shrink_to_smoke(text: &str, space_dir: &std::path::Path, trials: i64) -> String {
    let mut doc: toml::Table = text.parse().expect("the shipped study is TOML");
    let mut study = table(&mut doc, "study");
    study.insert("space_dir".into(), space_dir.display().to_string().into());
    doc.insert("study".into(), study.into());
    let mut budget = table(&mut doc, "budget");
    budget.insert("trials".into(), trials.into());
    budget.remove("min_trials");
    budget.remove("wall_time_s");
    doc.insert("budget".into(), budget.into());
    // The importance phase moves every option once (a trial each): a smoke budget cannot hold
    // it (the study refuses it, naming the budget it needs); the mock tests exercise the phase.
    doc.remove("importance");
    // The other tests of this binary load the machine meanwhile: the foreign-load check stays
    // on (its real path is exercised), with a short wait for quiet.
    let mut foreign = table(&mut doc, "foreign_load");
    foreign.insert("settle_s".into(), 5.0.into());
    doc.insert("foreign_load".into(), foreign.into());
    let mut remeasure = table(&mut doc, "remeasure");
    remeasure.insert("repeats".into(), 2.into());
    remeasure.insert("max_repeats".into(), 2.into());
    doc.insert("remeasure".into(), remeasure.into());
    let workloads = doc
        .get_mut("workload")
        .and_then(|w| w.as_array_mut())
        .expect("the shipped study has workloads");
    for (i, w) in workloads.iter_mut().enumerate() {
        let args = w
            .get_mut("args")
            .and_then(|a| a.as_array_mut())
            .expect("every workload has args");
        let mut seen = Vec::new();
        for k in 0..args.len().saturating_sub(1) {
            let flag = args[k].as_str().unwrap_or_default().to_string();
            let value = match flag.as_str() {
                "--num-prompts" => Some(if i == 0 { "8" } else { "3" }),
                "--sharegpt-output-len" | "--random-output-len" => Some("16"),
                _ => None,
            };
            if let Some(v) = value {
                args[k + 1] = v.into();
                seen.push(flag);
            }
        }
        assert!(
            seen.iter().any(|f| f == "--num-prompts"),
            "workload {i} of the shipped study sets no --num-prompts"
        );
    }
    toml::to_string(&doc).expect("the smoke study serialises")
}

/// A copy of the table `key` of `doc` (empty when absent).
fn table(doc: &mut toml::Table, key: &str) -> toml::Table {
    doc.get(key)
        .and_then(|v| v.as_table())
        .cloned()
        .unwrap_or_default()
}

/// Live processes whose stdout is a file under `dir` (an engine's log in a trial directory
/// there): what a torn-down study must not leave.
pub fn engines_logging_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
        {
            continue;
        }
        if let Ok(target) = std::fs::read_link(e.path().join("fd/1")) {
            if target.starts_with(dir) {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                out.push(format!(
                    "{name}: {}",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                ));
            }
        }
    }
    out
}

/// The mock engine imitating `profile`, with extra mock flags, as the argv that replaces an
/// engine file's `{binary}`.
pub fn mock_engine(profile: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        env!("CARGO_BIN_EXE_servetune"),
        "mock-engine",
        "--profile",
        profile,
        "--mock-startup-s",
        "0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.push("--".into());
    v
}

/// A launcher without GPU telemetry whose engines run `binary` for `{binary}`.
pub fn launcher(
    store: Option<servetune::store::Store>,
    binary: Vec<String>,
) -> servetune::engine::trial::Launcher {
    let mut l =
        servetune::engine::trial::Launcher::new(store, servetune::telemetry::Telemetry::off());
    l.binary = Some(binary);
    l
}

/// `cfg` with the given values set.
pub fn with(
    mut cfg: servetune::space::Config,
    kv: &[(&str, servetune::space::Value)],
) -> servetune::space::Config {
    for (k, v) in kv {
        cfg.insert(k.to_string(), v.clone());
    }
    cfg
}

/// How a start of `cfg` (serving `model`) fails: the rung, the class and the log line that
/// proved it. Panics when it starts.
pub async fn start_failure(
    s: &servetune::space::Space,
    cfg: &servetune::space::Config,
    binary: Vec<String>,
    model: &str,
) -> (
    servetune::engine::launch::Rung,
    servetune::engine::failure::FailureClass,
    String,
) {
    use servetune::engine::launch::LaunchError;
    use servetune::engine::trial::TrialError;
    let dir = tempfile::tempdir().unwrap();
    match launcher(None, binary)
        .start(s, cfg, model, dir.path())
        .await
    {
        Err(TrialError::Launch(LaunchError::Failed { rung, failure, .. })) => {
            (rung, failure.class, failure.evidence)
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(e) => {
            let argv = e.rendered.display();
            let _ = e.stop();
            panic!("expected a start-up failure: {argv}")
        }
    }
}

/// What `servetune tune` printed for a shipped study shrunk to `trials` trials (see
/// `shrink_to_smoke`), run in a fresh state directory (kept in `dir`).
pub struct SmokeRun {
    pub dir: tempfile::TempDir,
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the shipped study `studies/<name>.toml` shrunk to `trials` trials.
pub fn run_smoke_study(name: &str, trials: i64) -> SmokeRun {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(format!("studies/{name}.toml"))).unwrap();
    let smoke = shrink_to_smoke(&text, &root.join("search-spaces"), trials);
    let dir = tempfile::tempdir().unwrap();
    let studies = dir.path().join("studies");
    std::fs::create_dir_all(&studies).unwrap();
    let file = studies.join("smoke.toml");
    std::fs::write(&file, smoke).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_servetune"))
        .args([
            "tune",
            file.to_str().unwrap(),
            "--state",
            dir.path().join("state").to_str().unwrap(),
        ])
        .env("SERVETUNE_LOG", "warn")
        .output()
        .unwrap();
    SmokeRun {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        dir,
    }
}

/// A headless Chromium, or `None` (the test is then skipped with a message; it fails instead
/// when SERVETUNE_REQUIRE_CHROMIUM is set, as in CI).
pub fn chromium() -> Option<std::path::PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|n| {
            std::env::var_os("PATH")
                .map(|p| {
                    std::env::split_paths(&p)
                        .map(|d| d.join(n))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("SERVETUNE_REQUIRE_CHROMIUM").is_none(),
            "SERVETUNE_REQUIRE_CHROMIUM is set and no chromium is installed"
        );
        eprintln!("skipped: no chromium (apt-get install chromium)");
    }
    found
}

/// The DOM of `url` after its scripts ran, from headless Chromium in a `width`-pixel window.
pub async fn dump_dom(
    browser: &std::path::Path,
    url: &str,
    profile: &std::path::Path,
    width: u32,
) -> String {
    let out = tokio::process::Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            "--virtual-time-budget=3000",
            &format!("--window-size={width},900"),
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            url,
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
        .await
        .expect("chromium hung")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
