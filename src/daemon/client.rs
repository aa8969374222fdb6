//! `servetune status`, `servetune studies`, `servetune submit STUDY.toml` and
//! `servetune cancel|pause|resume STUDY`: clients of the daemon's API. The address comes from
//! `--url` (or `$SERVETUNE_URL`, default `http://127.0.0.1:7878`), the token for changes from
//! `--token-file` (or `$SERVETUNE_TOKEN_FILE`, default `/var/lib/servetune/token`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use crate::api::{ListedStudyV1, StatusV1};

#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The daemon's address.
    #[arg(long, env = "SERVETUNE_URL", default_value = "http://127.0.0.1:7878")]
    pub url: String,
    /// The file holding the API token (for requests that change something).
    #[arg(
        long,
        env = "SERVETUNE_TOKEN_FILE",
        default_value = "/var/lib/servetune/token"
    )]
    pub token_file: PathBuf,
    /// Print the daemon's JSON as it is.
    #[arg(long)]
    pub json: bool,
}

fn client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("HTTP client")
}

fn token(path: &Path) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .with_context(|| format!("reading the token file {} (--token-file)", path.display()))?;
    Ok(t.trim().to_owned())
}

/// Sends a request; a non-2xx answer becomes an error carrying the daemon's message.
async fn send(req: reqwest::RequestBuilder, url: &str) -> anyhow::Result<String> {
    let resp = req.send().await.map_err(|e| {
        anyhow!("cannot reach the daemon at {url}: {e} (is `servetune daemon` running? see --url)")
    })?;
    let status = resp.status();
    let body = resp.text().await.context("reading the answer")?;
    if !status.is_success() {
        let msg = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or(body);
        bail!("{status}: {msg}");
    }
    Ok(body)
}

fn base(url: &str) -> String {
    url.trim_end_matches('/').to_owned()
}

pub async fn status(a: &ClientArgs) -> anyhow::Result<String> {
    let body = send(client()?.get(format!("{}/v1/status", base(&a.url))), &a.url).await?;
    if a.json {
        return Ok(body + "\n");
    }
    let s: StatusV1 = serde_json::from_str(&body).context("the daemon's status")?;
    Ok(status_text(&s))
}

pub fn status_text(s: &StatusV1) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "servetune {} on {}: {}", s.version, s.node, s.activity);
    match &s.current {
        Some(c) => {
            let _ = writeln!(
                o,
                "study {} ({}), {}, phase {}: {} of {} search trials",
                c.study,
                c.trigger,
                c.state,
                c.phase
                    .map(|p| format!("{p:?}").to_lowercase())
                    .unwrap_or_else(|| "starting".into()),
                c.search_trials_done,
                c.search_budget
            );
            if let Some(t) = &c.trial {
                let _ = writeln!(
                    o,
                    "  trial #{} ({}), running {:.0} s: {}",
                    t.seq, t.kind, t.running_s, t.note
                );
            }
            if let Some(b) = &c.best {
                let _ = writeln!(
                    o,
                    "  best so far: {:.2} {} (#{})\n    {}",
                    b.objective,
                    b.metric,
                    b.trial,
                    b.command.as_deref().unwrap_or("")
                );
            }
            match c.time_left_s {
                Some(t) => {
                    let _ = writeln!(
                        o,
                        "  time left: about {:.0} min ({})",
                        t / 60.0,
                        c.time_left_basis
                    );
                }
                None => {
                    let _ = writeln!(o, "  time left: {}", c.time_left_basis);
                }
            }
        }
        None => o.push_str("no study running\n"),
    }
    let _ = writeln!(o, "queue: {} waiting", s.queue.len());
    for q in &s.queue {
        let _ = writeln!(o, "  {} [{}] {}", q.study, q.state.label(), q.trigger);
    }
    let _ = writeln!(
        o,
        "next nightly re-tune: {} (schedule {:?} in {})",
        s.next_nightly.as_deref().unwrap_or("-"),
        s.schedule,
        s.schedule_tz
    );
    o
}

pub async fn studies(a: &ClientArgs) -> anyhow::Result<String> {
    let body = send(
        client()?.get(format!("{}/v1/studies", base(&a.url))),
        &a.url,
    )
    .await?;
    if a.json {
        return Ok(body + "\n");
    }
    let list: Vec<ListedStudyV1> = serde_json::from_str(&body).context("the daemon's studies")?;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<44} {:<10} {:>6} {:>12}  trigger / verdict",
        "study", "state", "trials", "best"
    );
    for s in list {
        let _ = writeln!(
            o,
            "{:<44} {:<10} {:>6} {:>12}  {}{}",
            s.id,
            s.state,
            s.trials,
            s.best_objective
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into()),
            s.trigger,
            s.verdict
                .or(s.error)
                .map(|v| format!(" / {v}"))
                .unwrap_or_default()
        );
    }
    Ok(o)
}

pub async fn submit(a: &ClientArgs, file: &Path, cold: bool) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the study file {}", file.display()))?;
    let body = serde_json::json!({ "study": text, "warm": !cold });
    let req = client()?
        .post(format!("{}/v1/studies", base(&a.url)))
        .bearer_auth(token(&a.token_file)?)
        .json(&body);
    let answer = send(req, &a.url).await?;
    if a.json {
        return Ok(answer + "\n");
    }
    let job: crate::api::JobV1 = serde_json::from_str(&answer).context("the daemon's answer")?;
    Ok(format!(
        "queued study {} (follow it with `servetune status`)\n",
        job.study
    ))
}

/// `cancel`, `pause` or `resume`.
pub async fn control(a: &ClientArgs, study: &str, action: &str) -> anyhow::Result<String> {
    let req = client()?
        .post(format!("{}/v1/studies/{study}/{action}", base(&a.url)))
        .bearer_auth(token(&a.token_file)?);
    let answer = send(req, &a.url).await?;
    if a.json {
        return Ok(answer + "\n");
    }
    let job: crate::api::JobV1 = serde_json::from_str(&answer).context("the daemon's answer")?;
    Ok(if job.state == crate::api::JobStateV1::Running {
        format!(
            "study {}: {action} requested; the engine is being torn down\n",
            job.study
        )
    } else {
        format!("study {}: {}\n", job.study, job.state.label())
    })
}
