//! The HTML report, generated from the report's data with `maud` (every text escaped by
//! construction), not from the Markdown. The verdict is a banner marked "recommend" or "keep
//! the defaults"; a REGRESSION or inconclusive check is marked in its cell; commands wrap
//! instead of running off the page; the charts are inline SVG.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::{
    blocks, change_text, charts, comparison_cells, config_text, disturbed_lines, importance,
    leader_column, level_of, mean_ci, one_at_a_time, primary_name, ReportData,
};
use crate::space::CommandLine;
use crate::tune::decide::CheckState;
use crate::tune::records::TrialRecord;

const CSS: &str = "\
body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.4}\
table{border-collapse:collapse;margin:0.5em 0 1em}\
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}\
th{background:#f3f3f3}\
pre{background:#f6f6f6;padding:8px;overflow-x:auto}\
pre.command{white-space:pre-wrap;overflow-wrap:anywhere;overflow-x:visible}\
code{overflow-wrap:anywhere}\
.verdict{border-left:6px solid;padding:8px 12px;margin:1em 0;font-size:1.05em}\
.verdict.recommend{border-color:#2a9d4a;background:#eaf7ee}\
.verdict.keep{border-color:#b07d00;background:#fdf6e3}\
.verdict .label{font-weight:bold;text-transform:uppercase;letter-spacing:0.03em}\
td.regression{color:#b00020;font-weight:bold;background:#fdecee}\
td.inconclusive{font-style:italic;color:#555}\
td.within{color:#2a6f3a}\
svg{display:block;margin:1em 0;max-width:100%;height:auto}";

/// A self-contained HTML page: the report with its charts inline.
pub fn page(d: &ReportData) -> String {
    let rec = &d.study;
    let title = format!("servetune report: {}", rec.id);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                h1 { (title) }
                h2 { "Conclusion" }
                (conclusion(d))
                (environment(d))
                (engines(d))
                (mattered(d))
                (options(d))
                (trials(d))
                (failures(d))
                (disturbed(d))
                (stops(d))
                h2 { "Serving Benchmark Result blocks (" (primary_name(d)) ")" }
                @for (label, seq, block) in blocks(d) {
                    p { (label) " (#" (seq) "):" }
                    pre { (block) }
                }
                h2 { "Charts" }
                @for (name, svg) in charts(d) {
                    figure id=(format!("chart-{name}")) { (PreEscaped(svg)) }
                }
            }
        }
    }
    .into_string()
}

fn conclusion(d: &ReportData) -> Markup {
    let rec = &d.study;
    let Some(out) = &rec.outcome else {
        return html! {
            p.unfinished {
                "The study has not finished (phase: " (format!("{:?}", rec.phase))
                "); what follows is the state so far."
            }
        };
    };
    let recommended = out.recommended.is_some();
    html! {
        div #verdict .verdict .(if recommended { "recommend" } else { "keep" }) {
            span.label { (if recommended { "Recommended" } else { "Keep the defaults" }) }
            ": " (out.verdict)
        }
        @if let Some(c) = &d.recommended_command {
            p { "Recommended command:" }
            pre.command #command { (c) }
        } @else if let Some(c) = &d.baseline_command {
            p { "Keep the defaults:" }
            pre.command #command { (c) }
        }
        @if !d.rows.is_empty() {
            table #conclusion {
                tr {
                    th { "workload" } th { "metric" }
                    th { "baseline #" (d.baseline_trial.unwrap_or(0)) " (mean ± 95% CI)" }
                    th { (leader_column(d)) } th { "change [95% CI]" }
                }
                @for r in &d.rows {
                    @let change = change_text(r);
                    tr {
                        td { (r.workload) } td { (r.metric) }
                        td { (mean_ci(&r.baseline)) } td { (mean_ci(&r.recommended)) }
                        @match (r.state, r.gate) {
                            (CheckState::Regression, _) => td.regression { (change) " " (r.state.label()) },
                            (CheckState::Inconclusive, _) => td.inconclusive { (change) " (" (r.state.label()) ")" },
                            (CheckState::Ok, true) => td.within { (change) " (" (r.state.label()) ")" },
                            _ => td { (change) },
                        }
                    }
                }
            }
        }
        @if !out.comparisons.is_empty() {
            p { "Candidates re-measured against the baseline (interleaved rounds):" }
            table #comparisons {
                tr { th { "trial" } th { "change of the objective [95% CI]" } th { "note" } }
                @let level = level_of(&d.study);
                @for c in &out.comparisons {
                    @let (value, note) = comparison_cells(c, level);
                    tr { td { "#" (c.candidate) } td { (value) } td { (note) } }
                }
            }
        }
        @if out.rounds.remeasure > 0 || out.rounds.validation > 0 {
            p {
                "Rounds: " (out.rounds.remeasure)
                " interleaved re-measurement round(s) on the primary workload, "
                (out.rounds.validation) " validation round(s) per other workload; stopped because "
                (out.rounds.why) "."
            }
        }
    }
}

fn environment(d: &ReportData) -> Markup {
    let rec = &d.study;
    html! {
        h2 { "Environment" }
        ul {
            li { "model: " code { (d.model) } }
            li { "hardware: " (rec.hardware) }
            @for (e, v) in &rec.engine_versions {
                li { "engine: " (e) " " (v.as_deref().unwrap_or("(version unknown)")) }
            }
            @if !rec.dropped_flags.is_empty() {
                li { "flags the installed engine lacks (not searched): " (rec.dropped_flags.join(", ")) }
            }
            li { "trigger: " (rec.trigger) }
            li { "search stopped: " (rec.stop_reason.as_deref().unwrap_or("(running)")) }
            @if let Some(out) = &rec.outcome {
                li {
                    "objective: " (out.metric) "; " (out.search_trials) " search trials, "
                    (out.screened_only) " screened only; benchmark time "
                    (format!("{:.0}", out.bench_s)) " s, " (format!("{:.0}", out.saved_s))
                    " s saved by screening"
                }
            }
        }
        p { "Workloads (load-generator settings, " code { "servetune bench" } " flags):" }
        ul {
            @for (i, (name, args)) in d.workloads.iter().enumerate() {
                li { (name) @if i == 0 { " (primary)" } ": " code { (args.join(" ")) } }
            }
        }
    }
}

fn num(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

fn engines(d: &ReportData) -> Markup {
    html! {
        h2 { "Engine selection" }
        table {
            tr { th { "engine" } th { "version" } th { "defaults" } th { "best found" } th { "trials" } }
            @for e in &d.engines {
                tr {
                    td { (e.engine) } td { (e.version.as_deref().unwrap_or("?")) }
                    td { (num(e.defaults)) } td { (num(e.best)) } td { (e.trials) }
                }
            }
        }
    }
}

fn mattered(d: &ReportData) -> Markup {
    let phase = one_at_a_time(d);
    let estimate = importance(d);
    html! {
        @if phase.is_some() || estimate.is_some() {
            h2 { "What mattered" }
        }
        @if let Some((intro, rows)) = &phase {
            h3 { "One at a time from the defaults" }
            p { (intro) }
            table {
                tr {
                    th { "option" } th { "moved to" } th { "objective" } th { "latency" }
                    th { "for the search" }
                }
                @for r in rows {
                    tr { @for c in r { td { (c) } } }
                }
            }
            @if estimate.is_some() {
                h3 { "Around the best trial" }
            }
        }
        @if let Some((intro, rows)) = estimate {
            p { (intro) }
            table {
                tr { th { "option" } th { "effect around the best" } th { "beyond the noise" } }
                @for (param, effect, measurable) in rows {
                    tr { td { (param) } td { (effect) } td { (measurable) } }
                }
            }
        }
    }
}

fn options(d: &ReportData) -> Markup {
    html! {
        h2 { "Options explored" }
        table {
            tr {
                th { "option" } th { "value" } th { "trials" } th { "failed" }
                th { "infeasible" } th { "best" } th { "vs baseline" }
            }
            @for r in &d.options {
                tr {
                    td { (r.param) } td { (r.value) } td { (r.trials) } td { (r.failed) }
                    td { (r.infeasible) } td { (num(r.best)) }
                    td { (r.effect_pct.map(|v| format!("{v:+.1}%")).unwrap_or_else(|| "-".into())) }
                }
            }
        }
    }
}

fn trials(d: &ReportData) -> Markup {
    html! {
        h2 { "Trials" }
        table #trials {
            tr {
                th { "#" } th { "kind" } th { "status" } th { "objective" } th { "screen" }
                th { "configuration" }
            }
            @for t in &d.trials {
                tr {
                    td { (t.seq) } td { (t.kind.label()) }
                    td { (format!("{:?}", t.status).to_lowercase()) }
                    td { (num(t.objective)) } td { (num(t.screen_objective)) }
                    td { code { (config_text(&t.config)) } }
                }
            }
        }
    }
}

fn failures(d: &ReportData) -> Markup {
    let failed: Vec<&TrialRecord> = d.trials.iter().filter(|t| t.failure.is_some()).collect();
    html! {
        @if !failed.is_empty() {
            h2 { "Failures" }
            ul {
                @for t in failed {
                    @if let Some(f) = &t.failure {
                        li {
                            "#" (t.seq) " " strong { (f.class) } ": "
                            (crate::util::excerpt(&f.evidence, 300))
                            @if let Some(c) = &t.command {
                                pre.command { (CommandLine::display(c)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn disturbed(d: &ReportData) -> Markup {
    let lines = disturbed_lines(d);
    html! {
        @if !lines.is_empty() {
            h2 { "Runs replaced or set aside" }
            ul { @for l in &lines { li { (l) } } }
        }
    }
}

fn stops(d: &ReportData) -> Markup {
    let stopped: Vec<&TrialRecord> = d.trials.iter().filter(|t| t.early_stop.is_some()).collect();
    html! {
        @if !stopped.is_empty() {
            h2 { "Early stops and missed constraints" }
            ul {
                @for t in stopped {
                    li { "#" (t.seq) ": " (t.early_stop.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}
