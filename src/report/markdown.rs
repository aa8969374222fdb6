//! The Markdown report (`markdown`), written section by section from the report's data: the
//! conclusion first, then the environment, the engines, what mattered, the options, the trials,
//! the failures and early stops, the benchmark blocks and the chart files.

use std::fmt::Write as _;

use super::{
    blocks, change_text, comparison_cells, config_text, disturbed_lines, importance, leader_column,
    level_of, mean_ci, one_at_a_time, primary_name, ReportData,
};
use crate::tune::decide::CheckState;
use crate::tune::records::TrialRecord;

/// The Markdown report. `embed_charts` puts the SVGs inline (for HTML); else they are listed
/// as files written next to the report.
pub fn markdown(d: &ReportData, chart_files: &[(String, String)]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# servetune report: {}\n", d.study.id);
    // Conclusion first.
    verdict(&mut o, d);
    conclusion_table(&mut o, d);
    comparisons(&mut o, d);
    environment(&mut o, d);
    engines(&mut o, d);
    mattered(&mut o, d);
    options(&mut o, d);
    trials(&mut o, d);
    failures(&mut o, d);
    disturbed(&mut o, d);
    stops(&mut o, d);
    benchmark_blocks(&mut o, d);
    charts(&mut o, chart_files);
    o
}

/// Writes the conclusion's heading and verdict with the command to run, or that the study
/// has not finished.
fn verdict(o: &mut String, d: &ReportData) {
    let rec = &d.study;
    let _ = writeln!(o, "## Conclusion\n");
    match &rec.outcome {
        Some(out) => {
            let _ = writeln!(o, "{}\n", out.verdict);
            if let Some(c) = &d.recommended_command {
                let _ = writeln!(o, "Recommended command:\n\n```sh\n{c}\n```\n");
            } else if let Some(c) = &d.baseline_command {
                let _ = writeln!(o, "Keep the defaults:\n\n```sh\n{c}\n```\n");
            }
        }
        None => {
            let _ = writeln!(
                o,
                "The study has not finished (phase: {:?}); what follows is the state so far.\n",
                rec.phase
            );
        }
    }
}

/// Writes the conclusion table: baseline against the leader on every check, each change
/// marked with the gate's state of it.
fn conclusion_table(o: &mut String, d: &ReportData) {
    if d.rows.is_empty() {
        return;
    }
    let column = leader_column(d);
    let _ = writeln!(
        o,
        "| workload | metric | baseline #{} (mean ± 95% CI) | {column} | change [95% CI] |",
        d.baseline_trial.unwrap_or(0),
    );
    let _ = writeln!(o, "|---|---|---|---|---|");
    for r in &d.rows {
        let change = change_text(r);
        let change = match (r.state, r.gate) {
            (CheckState::Regression, _) => format!("**{change} {}**", r.state.label()),
            (CheckState::Inconclusive, _) => format!("{change} *{}*", r.state.label()),
            (CheckState::Ok, true) => format!("{change} ({})", r.state.label()),
            _ => change,
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            r.workload,
            r.metric,
            mean_ci(&r.baseline),
            mean_ci(&r.recommended),
            change
        );
    }
    let _ = writeln!(o);
}

/// Writes the candidates re-measured against the baseline and the rounds the gate ran, when
/// the study has an outcome.
fn comparisons(o: &mut String, d: &ReportData) {
    let rec = &d.study;
    if let Some(out) = &rec.outcome {
        if !out.comparisons.is_empty() {
            let _ = writeln!(
                o,
                "Candidates re-measured against the baseline (interleaved rounds):\n"
            );
            let _ = writeln!(o, "| trial | change of the objective [95% CI] | note |");
            let _ = writeln!(o, "|---|---|---|");
            let level = level_of(rec);
            for c in &out.comparisons {
                let (value, note) = comparison_cells(c, level);
                let _ = writeln!(o, "| #{} | {value} | {note} |", c.candidate);
            }
            let _ = writeln!(o);
        }
    }
    if let Some(out) = &rec.outcome {
        if out.rounds.remeasure > 0 || out.rounds.validation > 0 {
            let _ = writeln!(
                o,
                "Rounds: {} interleaved re-measurement round(s) on the primary workload, {} validation round(s) per other workload; stopped because {}.\n",
                out.rounds.remeasure, out.rounds.validation, out.rounds.why
            );
        }
    }
}

/// Writes the environment: the model, the hardware, the engines, the search and the
/// workloads.
fn environment(o: &mut String, d: &ReportData) {
    let rec = &d.study;
    let _ = writeln!(o, "## Environment\n");
    let _ = writeln!(o, "- model: `{}`", d.model);
    let _ = writeln!(o, "- hardware: {}", rec.hardware);
    for (e, v) in &rec.engine_versions {
        let _ = writeln!(
            o,
            "- engine: {e} {}",
            v.as_deref().unwrap_or("(version unknown)")
        );
    }
    if !rec.dropped_flags.is_empty() {
        let _ = writeln!(
            o,
            "- flags the installed engine lacks (not searched): {}",
            rec.dropped_flags.join(", ")
        );
    }
    let _ = writeln!(o, "- trigger: {}", rec.trigger);
    let _ = writeln!(
        o,
        "- search stopped: {}",
        rec.stop_reason.as_deref().unwrap_or("(running)")
    );
    if let Some(out) = &rec.outcome {
        let _ = writeln!(
            o,
            "- objective: {}; {} search trials, {} screened only; benchmark time {:.0} s, {:.0} s saved by screening",
            out.metric, out.search_trials, out.screened_only, out.bench_s, out.saved_s
        );
    }
    let _ = writeln!(
        o,
        "\nWorkloads (load-generator settings, `servetune bench` flags):\n"
    );
    for (i, (name, args)) in d.workloads.iter().enumerate() {
        let _ = writeln!(
            o,
            "- {}{}: `{}`",
            name,
            if i == 0 { " (primary)" } else { "" },
            args.join(" ")
        );
    }
}

/// Writes the engine selection table: per engine its version, its defaults' objective and
/// the best found.
fn engines(o: &mut String, d: &ReportData) {
    let _ = writeln!(o, "\n## Engine selection\n");
    let _ = writeln!(o, "| engine | version | defaults | best found | trials |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for e in &d.engines {
        let f = |x: Option<f64>| x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            e.engine,
            e.version.as_deref().unwrap_or("?"),
            f(e.defaults),
            f(e.best),
            e.trials
        );
    }
}

/// Writes what mattered: the one-at-a-time phase and the model's estimate around the best
/// trial, when the study has them.
fn mattered(o: &mut String, d: &ReportData) {
    let phase = one_at_a_time(d);
    let estimate = importance(d);
    if phase.is_some() || estimate.is_some() {
        let _ = writeln!(o, "\n## What mattered\n");
    }
    if let Some((intro, rows)) = phase {
        let _ = writeln!(o, "### One at a time from the defaults\n");
        let _ = writeln!(o, "{intro}\n");
        let _ = writeln!(
            o,
            "| option | moved to | objective | latency | for the search |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|");
        for r in rows {
            let _ = writeln!(o, "| {} |", r.join(" | "));
        }
        if estimate.is_some() {
            let _ = writeln!(o, "\n### Around the best trial\n");
        }
    }
    if let Some((intro, rows)) = estimate {
        let _ = writeln!(o, "{intro}\n");
        let _ = writeln!(o, "| option | effect around the best | beyond the noise |");
        let _ = writeln!(o, "|---|---|---|");
        for (param, effect, measurable) in rows {
            let _ = writeln!(o, "| {param} | {effect} | {measurable} |");
        }
    }
}

/// Writes the table of every option explored, with its effect against the baseline.
fn options(o: &mut String, d: &ReportData) {
    let _ = writeln!(o, "\n## Options explored\n");
    let _ = writeln!(
        o,
        "| option | value | trials | failed | infeasible | best | vs baseline |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for r in &d.options {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.param,
            r.value,
            r.trials,
            r.failed,
            r.infeasible,
            r.best
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.effect_pct
                .map(|v| format!("{v:+.1}%"))
                .unwrap_or_else(|| "-".into())
        );
    }
}

/// Writes the table of every trial: its kind, status, objectives and configuration.
fn trials(o: &mut String, d: &ReportData) {
    let _ = writeln!(o, "\n## Trials\n");
    let _ = writeln!(
        o,
        "| # | kind | status | objective | screen | configuration |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|");
    for t in &d.trials {
        let kind = t.kind.label();
        let f = |x: Option<f64>| x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} |",
            t.seq,
            kind,
            format!("{:?}", t.status).to_lowercase(),
            f(t.objective),
            f(t.screen_objective),
            config_text(&t.config)
        );
    }
}

/// Writes the failed trials with their class, evidence and command, if any failed.
fn failures(o: &mut String, d: &ReportData) {
    let failures: Vec<&TrialRecord> = d.trials.iter().filter(|t| t.failure.is_some()).collect();
    if !failures.is_empty() {
        let _ = writeln!(o, "\n## Failures\n");
        for t in failures {
            let f = t.failure.as_ref().expect("filtered");
            let _ = writeln!(
                o,
                "- #{} **{}**: {}",
                t.seq,
                f.class,
                crate::util::excerpt(&f.evidence, 300)
            );
            if let Some(c) = &t.command {
                let _ = writeln!(o, "  - command: `{}`", c.display());
            }
        }
    }
}

/// Writes the runs that were replaced or set aside because other processes disturbed them,
/// if any were.
fn disturbed(o: &mut String, d: &ReportData) {
    let disturbed = disturbed_lines(d);
    if !disturbed.is_empty() {
        let _ = writeln!(o, "\n## Runs replaced or set aside\n");
        for line in disturbed {
            let _ = writeln!(o, "- {line}");
        }
    }
}

/// Writes the trials stopped early or that missed the constraints, if any did.
fn stops(o: &mut String, d: &ReportData) {
    let stops: Vec<&TrialRecord> = d.trials.iter().filter(|t| t.early_stop.is_some()).collect();
    if !stops.is_empty() {
        let _ = writeln!(o, "\n## Early stops and missed constraints\n");
        for t in stops {
            let _ = writeln!(o, "- #{}: {}", t.seq, t.early_stop.as_deref().unwrap_or(""));
        }
    }
}

/// Writes the "Serving Benchmark Result" blocks of the baseline and the recommended trial on
/// the primary workload.
fn benchmark_blocks(o: &mut String, d: &ReportData) {
    let _ = writeln!(
        o,
        "\n## Serving Benchmark Result blocks ({})\n",
        primary_name(d)
    );
    for (label, seq, b) in blocks(d) {
        let _ = writeln!(o, "{label} (#{seq}):\n\n```\n{b}```\n");
    }
}

/// Writes the list of chart files written beside the report, if there are any.
fn charts(o: &mut String, chart_files: &[(String, String)]) {
    if !chart_files.is_empty() {
        let _ = writeln!(o, "## Charts\n");
        for (name, path) in chart_files {
            let _ = writeln!(o, "![{name}]({path})");
        }
    }
}
