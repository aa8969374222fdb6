//! The status page at `/`: server-rendered HTML (no external assets), with the current study,
//! its best configuration's command line, a chart of its trials, the queue and the recent
//! studies. A few lines of script poll `/v1/status` every 5 s, update the live line and reload
//! the page when a trial finishes; without script, a meta refresh does the same every 30 s.
//! The HTML is generated with `maud`, which escapes every text by construction.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::views;
use super::{Backend, Daemon, DaemonError};
use crate::api::{CurrentV1, ListedStudyV1, QueueItemV1, StatusV1};
use crate::report::svg;
use crate::tune::records::{TrialKind, TrialStatus};

/// The page's style sheet, inline.
const CSS: &str = r"
body{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1000px;color:#1d2433}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.muted{color:#667} code,pre{font:12px ui-monospace,monospace;background:#f3f4f7;padding:2px 4px;border-radius:4px}
pre{padding:8px;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;width:100%} td,th{text-align:left;padding:4px 8px;border-bottom:1px solid #e3e5ea;vertical-align:top}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;background:#e8ecf5}
#live[data-state=error]{color:#b00020}
";

/// The script that polls `/v1/status`, writes the live line and reloads the page when a
/// measurement finishes.
const SCRIPT: &str = r#"
(function () {
  var live = document.getElementById("live");
  function poll() {
    fetch("/v1/status", {cache: "no-store"}).then(function (r) {
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.json();
    }).then(function (s) {
      document.getElementById("phase").textContent = s.phase;
      var c = s.current;
      live.dataset.state = "ok";
      live.textContent = c
        ? c.study + ": " + c.search_trials_done + "/" + c.search_budget + " search trials" +
          (c.best ? ", best " + c.best.objective.toFixed(2) : "") + " · " + s.queue.length + " waiting"
        : "idle · " + s.queue.length + " waiting";
      var done = c ? c.measurements_done : 0;
      if (String(done) !== document.body.dataset.measurements) { location.reload(); }
    }).catch(function (e) {
      live.dataset.state = "error";
      live.textContent = "cannot reach the daemon: " + e.message;
    });
  }
  poll();
  setInterval(poll, 5000);
})();
"#;

/// The chart of the current study, else of the latest one with trials.
fn chart<B: Backend>(
    d: &Daemon<B>,
    st: &StatusV1,
    list: &[ListedStudyV1],
) -> Result<Option<(String, String)>, DaemonError> {
    let id = st.current.as_ref().map(|c| c.study.clone()).or_else(|| {
        list.iter()
            .rev()
            .find(|s| s.trials > 0)
            .map(|s| s.id.clone())
    });
    let Some(id) = id else { return Ok(None) };
    let trials: Vec<_> = d
        .records()
        .trials(&id)?
        .into_iter()
        .filter(|t| t.kind == TrialKind::Search && t.status != TrialStatus::Running)
        .collect();
    if trials.is_empty() {
        return Ok(None);
    }
    let best = list.iter().find(|s| s.id == id).and_then(|_| {
        d.records()
            .study(&id)
            .ok()
            .flatten()
            .and_then(|r| r.best_trial)
    });
    let pts = crate::report::best_so_far_points(&trials, best);
    let metric = list
        .iter()
        .find(|s| s.id == id)
        .and_then(|s| s.metric.clone())
        .unwrap_or_else(|| "objective".into());
    Ok(Some((id, svg::best_so_far(&pts, &metric))))
}

/// Renders the status page from the daemon's status, its catalog of studies and the chart of
/// the current or latest study.
pub fn render<B: Backend>(d: &Daemon<B>) -> Result<String, DaemonError> {
    let st = views::status(d)?;
    let catalog = d.catalog()?;
    let list = &catalog.studies;
    let chart = chart(d, &st, list)?;
    let done = st
        .current
        .as_ref()
        .map(|c| c.measurements_done)
        .unwrap_or(0);
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "servetune — " (st.node) }
                noscript { meta http-equiv="refresh" content="30"; }
                style { (PreEscaped(CSS)) }
            }
            body data-measurements=(done) {
                (header(&st))
                (now(st.current.as_ref()))
                @if let Some((id, svg)) = &chart {
                    h2 { "Trials of " (id) }
                    figure #chart { (PreEscaped(svg)) }
                }
                (queue(&st.queue))
                (studies(list))
                p.muted {
                    "API: " a href="/v1/status" { "/v1/status" }
                    " · " a href="/v1/studies" { "/v1/studies" }
                    " · " a href="/v1/best" { "/v1/best" }
                    " · " a href="/metrics" { "/metrics" }
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    };
    Ok(page.into_string())
}

/// The page's heading: the node, the version, the schedule and what the daemon is doing, with the
/// live line the script writes.
fn header(st: &StatusV1) -> Markup {
    html! {
        h1 { "servetune on " (st.node) }
        div.muted {
            "version " (st.version) " · schedule " code { (st.schedule) }
            " (" (st.schedule_tz) ") · next nightly " (st.next_nightly.as_deref().unwrap_or("-"))
        }
        p {
            "Phase: " span.pill #phase { (st.activity) } " "
            span #live data-state="static" { "server-rendered" }
        }
    }
}

/// The estimate of the time left of the current study, with what it is based on.
fn time_left(c: &CurrentV1) -> String {
    match c.time_left_s {
        Some(t) => format!("about {:.0} min left ({})", t / 60.0, c.time_left_basis),
        None => c.time_left_basis.clone(),
    }
}

/// The section on what the daemon is doing now: the current study, its running trial, its
/// best configuration so far and its events, or that it is idle.
fn now(current: Option<&CurrentV1>) -> Markup {
    let Some(c) = current else {
        return html! { h2 { "Now: idle" } };
    };
    let phase = c
        .phase
        .map(|p| format!("{p:?}").to_lowercase())
        .unwrap_or_else(|| "starting".into());
    html! {
        h2 { "Now: " (c.study) " " span.pill { (c.state) } }
        p {
            "Trigger: " (c.trigger) " · phase " (phase) " · " (c.search_trials_done) " of "
            (c.search_budget) " search trials · " (time_left(c))
        }
        @for t in &c.running {
            p {
                "Trial #" (t.seq) " (" (t.kind) ", " (format!("{:.0}", t.running_s)) " s"
                @if let Some(slot) = &t.slot { ", on " (slot) }
                "): " (t.note)
            }
        }
        @if let Some(b) = &c.best {
            p {
                "Best so far: " (format!("{:.2}", b.objective)) " " (b.metric) " (trial #"
                (b.trial) ")"
            }
            pre #best-command { (b.command.as_deref().unwrap_or("")) }
        }
        @if !c.events.is_empty() {
            pre #events { (c.events.join("\n")) }
        }
    }
}

/// The queue: one row per waiting or running job, or a line saying it is empty.
fn queue(items: &[QueueItemV1]) -> Markup {
    html! {
        h2 { "Queue" }
        @if items.is_empty() {
            p.muted { "empty" }
        } @else {
            table {
                tr { th { "study" } th { "state" } th { "trigger" } th { "submitted" } }
                @for q in items {
                    tr {
                        td { (q.study) } td { (q.state.label()) } td { (q.trigger) }
                        td { (q.submitted) }
                    }
                }
            }
        }
    }
}

/// The latest 30 studies, newest first, each linked to its report.
fn studies(list: &[ListedStudyV1]) -> Markup {
    html! {
        h2 { "Studies" }
        table #studies {
            tr {
                th { "study" } th { "state" } th { "trigger" } th { "trials" } th { "best" }
                th { "verdict" }
            }
            @for s in list.iter().rev().take(30) {
                tr {
                    td { a href=(format!("/v1/studies/{}/report", s.id)) { (s.id) } }
                    td { (s.state) } td { (s.trigger) } td { (s.trials) }
                    td {
                        (s.best_objective
                            .map(|v| format!("{v:.2} {}", s.metric.as_deref().unwrap_or("")))
                            .unwrap_or_else(|| "-".into()))
                    }
                    td { (s.verdict.as_deref().or(s.error.as_deref()).unwrap_or("")) }
                }
            }
        }
    }
}
