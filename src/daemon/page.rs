//! The status page at `/`: server-rendered HTML (no external assets), with the current study,
//! its best configuration's command line, a chart of its trials, the queue and the recent
//! studies. A few lines of script poll `/v1/status` every 5 s, update the live line and reload
//! the page when a trial finishes; without script, a meta refresh does the same every 30 s.

use std::fmt::Write as _;

use super::views::{self, Status, StudyView};
use super::{Backend, Daemon, DaemonError};
use crate::report::svg;
use crate::tune::records::{TrialKind, TrialStatus};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The chart of the current study, else of the latest one with trials.
fn chart<B: Backend>(
    d: &Daemon<B>,
    st: &Status,
    list: &[StudyView],
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
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>servetune — {node}</title>
<noscript><meta http-equiv="refresh" content="30"></noscript>
<style>
body{{font:14px/1.45 system-ui,sans-serif;margin:24px;max-width:1000px;color:#1d2433}}
h1{{font-size:20px;margin:0 0 4px}} h2{{font-size:16px;margin:24px 0 8px}}
.muted{{color:#667}} code,pre{{font:12px ui-monospace,monospace;background:#f3f4f7;padding:2px 4px;border-radius:4px}}
pre{{padding:8px;white-space:pre-wrap;word-break:break-all}}
table{{border-collapse:collapse;width:100%}} td,th{{text-align:left;padding:4px 8px;border-bottom:1px solid #e3e5ea;vertical-align:top}}
.pill{{display:inline-block;padding:1px 8px;border-radius:10px;background:#e8ecf5}}
#live[data-state=error]{{color:#b00020}}
</style></head><body data-measurements="{done}">
<h1>servetune on {node}</h1>
<div class="muted">version {version} · schedule <code>{sched}</code> ({tz}) · next nightly {next}</div>
<p>Phase: <span class="pill" id="phase">{phase}</span> <span id="live" data-state="static">server-rendered</span></p>
"#,
        node = esc(&st.node),
        version = st.version,
        sched = esc(&st.schedule),
        tz = esc(&st.schedule_tz),
        next = esc(st.next_nightly.as_deref().unwrap_or("-")),
        phase = st.phase,
    );
    match &st.current {
        Some(c) => {
            let _ = write!(
                h,
                "<h2>Now: {} <span class=\"pill\">{}</span></h2>\n<p>Trigger: {} · phase {} · {} of {} search trials · {}</p>\n",
                esc(&c.study),
                esc(&c.state),
                esc(&c.trigger),
                c.phase
                    .map(|p| format!("{p:?}").to_lowercase())
                    .unwrap_or_else(|| "starting".into()),
                c.search_trials_done,
                c.search_budget,
                match c.time_left_s {
                    Some(t) => format!("about {:.0} min left ({})", t / 60.0, esc(&c.time_left_basis)),
                    None => esc(&c.time_left_basis),
                }
            );
            if let Some(t) = &c.trial {
                let _ = writeln!(
                    h,
                    "<p>Trial #{} ({}, {:.0} s): {}</p>",
                    t.seq,
                    esc(&t.kind),
                    t.running_s,
                    esc(&t.note)
                );
            }
            if let Some(b) = &c.best {
                let _ = writeln!(
                    h,
                    "<p>Best so far: {:.2} {} (trial #{})</p><pre id=\"best-command\">{}</pre>",
                    b.objective,
                    esc(&b.metric),
                    b.trial,
                    esc(b.command.as_deref().unwrap_or(""))
                );
            }
            if !c.events.is_empty() {
                let _ = writeln!(h, "<pre id=\"events\">{}</pre>", esc(&c.events.join("\n")));
            }
        }
        None => h.push_str("<h2>Now: idle</h2>\n"),
    }
    if let Some((id, svg)) = &chart {
        let _ = write!(
            h,
            "<h2>Trials of {}</h2>\n<figure id=\"chart\">{svg}</figure>\n",
            esc(id)
        );
    }
    h.push_str("<h2>Queue</h2>\n");
    if st.queue.is_empty() {
        h.push_str("<p class=\"muted\">empty</p>\n");
    } else {
        h.push_str(
            "<table><tr><th>study</th><th>state</th><th>trigger</th><th>submitted</th></tr>\n",
        );
        for q in &st.queue {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&q.study),
                q.state.label(),
                esc(&q.trigger),
                esc(&q.submitted)
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("<h2>Studies</h2>\n<table id=\"studies\"><tr><th>study</th><th>state</th><th>trigger</th><th>trials</th><th>best</th><th>verdict</th></tr>\n");
    for s in list.iter().rev().take(30) {
        let _ = writeln!(
            h,
            "<tr><td><a href=\"/v1/studies/{}/report\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.id),
            esc(&s.id),
            esc(&s.state),
            esc(&s.trigger),
            s.trials,
            s.best_objective
                .map(|v| format!("{v:.2} {}", esc(s.metric.as_deref().unwrap_or(""))))
                .unwrap_or_else(|| "-".into()),
            esc(s.verdict.as_deref().or(s.error.as_deref()).unwrap_or(""))
        );
    }
    h.push_str("</table>\n");
    h.push_str(
        r#"<p class="muted">API: <a href="/v1/status">/v1/status</a> · <a href="/v1/studies">/v1/studies</a> · <a href="/v1/best">/v1/best</a> · <a href="/metrics">/metrics</a></p>
<script>
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
</script>
</body></html>
"#,
    );
    Ok(h)
}
