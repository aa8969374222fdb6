//! `servetune search-bench --warm`: a re-tune after a change, cold against warm-started with
//! what the daemon's policy takes from the study before the change.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::mock::profile::Machine;
use crate::mock::sim::Hardware;
use crate::space::Config;
use crate::tune::opt::{Algorithm, Obs};
use crate::tune::warm::{self, Earlier};

use super::{landscapes, median, optimum, trajectory_warm, trials_to, BenchOptions, Landscape};

/// `servetune search-bench --warm`: a re-tune after a change (an engine upgrade with the same
/// performance, a new GPU), cold against warm-started with what the daemon's policy
/// (`tune::warm::select`, at most `top` configurations) takes from a study before the change.
/// Trials count every measurement, the warm-start ones included.
pub fn run_warm(opts: &BenchOptions, top: usize) -> Result<String, String> {
    let ls = landscapes()?;
    let scenarios = scenarios(&ls)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| change | optimiser | cold: trials to 2% (median) | warm: trials to 2% (median) | cold gap @10 | warm gap @10 | warm faster on |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for (name, before, after) in &scenarios {
        if opts
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()))
        {
            continue;
        }
        let mut truths_before = HashMap::new();
        let mut truths = HashMap::new();
        for kind in [Algorithm::Tpe, Algorithm::Gp] {
            let (cold_runs, warm_runs) = cold_and_warm(
                before,
                after,
                kind,
                opts,
                top,
                &mut truths_before,
                &mut truths,
            );
            let best = optimum(after, &mut truths, opts.optimum_samples);
            write_row(&mut out, name, kind, opts, best, &cold_runs, &warm_runs);
        }
    }
    let _ = writeln!(
        out,
        "
({} seeds, budget {} trials, warm start = at most {top} configurations of the study before the change, chosen by the daemon's policy: its best, then its best feasible search trials)",
        opts.seeds, opts.budget
    );
    Ok(out)
}

/// The changes benchmarked, each with the landscape before it and the one after it: an engine
/// upgrade with the same performance, and two GPU changes (to an H200).
fn scenarios(ls: &[Landscape]) -> Result<Vec<(String, &Landscape, Landscape)>, String> {
    let base = &ls[1]; // vllm 3p, H100 8B, TPOT SLO, 5% noise
    let six = &ls[2]; // vllm 6p, A100 32B, OOM region
    let h200 = |l: &Landscape| -> Result<Landscape, String> {
        Ok(Landscape {
            name: String::new(),
            space: l.space.clone(),
            machine: Machine {
                hw: Hardware::preset("h200", 16).ok_or("no h200 preset")?,
                ..l.machine.clone()
            },
            workload: l.workload.clone(),
            limits: l.limits.clone(),
            noise: l.noise,
        })
    };
    let same = |l: &Landscape| Landscape {
        name: String::new(),
        space: l.space.clone(),
        machine: l.machine.clone(),
        workload: l.workload.clone(),
        limits: l.limits.clone(),
        noise: l.noise,
    };
    Ok(vec![
        (
            "vllm 3p, H100 8B: engine upgrade, same performance".into(),
            base,
            same(base),
        ),
        (
            "vllm 3p, 8B: GPU change H100 → H200".into(),
            base,
            h200(base)?,
        ),
        (
            "vllm 6p, 32B: GPU change A100 → H200".into(),
            six,
            h200(six)?,
        ),
    ])
}

/// Per seed, a study of `before` to its budget, then on `after` a cold study and one
/// warm-started from what the first left; returns the cold and the warm trajectories.
fn cold_and_warm(
    before: &Landscape,
    after: &Landscape,
    kind: Algorithm,
    opts: &BenchOptions,
    top: usize,
    truths_before: &mut HashMap<String, Option<f64>>,
    truths: &mut HashMap<String, Option<f64>>,
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let mut cold_runs = Vec::new();
    let mut warm_runs = Vec::new();
    for seed in 0..opts.seeds {
        // The study before the change, to its budget.
        let (_, hist) = trajectory_warm(before, kind, seed, opts.budget, truths_before, Vec::new());
        let warm = warm_start(after, &hist, top);
        let s2 = seed + 1000;
        cold_runs.push(trajectory_warm(after, kind, s2, opts.budget, truths, Vec::new()).0);
        warm_runs.push(trajectory_warm(after, kind, s2, opts.budget, truths, warm).0);
    }
    (cold_runs, warm_runs)
}

/// The configurations a re-tune on `after` starts from, as the daemon's policy
/// (`tune::warm::select`, at most `top`) picks them from the history `hist` of the study
/// before the change.
fn warm_start(after: &Landscape, hist: &[Obs], top: usize) -> Vec<(Config, String)> {
    // The daemon's policy (`tune::warm`) over what that study left: its
    // recommendation (here the best feasible trial: validation is not simulated)
    // and its search trials (every trial here, the baselines among them).
    let search: Vec<Earlier> = hist
        .iter()
        .enumerate()
        .map(|(i, o)| Earlier {
            config: o.config.clone(),
            objective: o.value,
            from: format!("before #{i}"),
        })
        .collect();
    let recommended = search
        .iter()
        .filter(|e| e.objective.is_some_and(f64::is_finite))
        .max_by(|a, b| {
            a.objective
                .unwrap_or(0.0)
                .total_cmp(&b.objective.unwrap_or(0.0))
        })
        .cloned();
    warm::select(&after.space, recommended, search, top)
        .into_iter()
        .map(|w| (w.config, w.from))
        .collect()
}

/// Appends one row to `out`: the change `name` and optimiser `kind`, trials to within 2% of
/// `best` cold and warm (medians), the gaps at 10 trials, and on how many seeds warm was faster.
fn write_row(
    out: &mut String,
    name: &str,
    kind: Algorithm,
    opts: &BenchOptions,
    best: f64,
    cold_runs: &[Vec<f64>],
    warm_runs: &[Vec<f64>],
) {
    let mut cold_n = Vec::new();
    let mut warm_n = Vec::new();
    for (c, w) in cold_runs.iter().zip(warm_runs) {
        cold_n.push(trials_to(c, best));
        warm_n.push(trials_to(w, best));
    }
    let faster = cold_n.iter().zip(&warm_n).filter(|(c, w)| w < c).count();
    let gap = |runs: &[Vec<f64>]| {
        median(
            runs.iter()
                .map(|r| {
                    let v = r.get(9).or(r.last()).copied().unwrap_or(0.0);
                    100.0 * (1.0 - v / best)
                })
                .collect(),
        )
    };
    let fmt = |v: f64| {
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            format!("> {}", opts.budget)
        }
    };
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {:.1}% | {:.1}% | {faster}/{} seeds |",
        kind.name(),
        fmt(median(cold_n.clone())),
        fmt(median(warm_n.clone())),
        gap(cold_runs),
        gap(warm_runs),
        opts.seeds
    );
}
