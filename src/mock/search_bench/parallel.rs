//! `servetune search-bench --parallel 1,2,4,8`: the default optimiser's study run with K
//! trials at once, in virtual time, on every landscape.
//!
//! A trial lasts its engine's start-up plus its benchmark's simulated duration (a trial that
//! fails to start, its start-up). K slots run trials at once: whenever one is free the
//! optimiser is asked for a proposal with the running trials' configurations
//! (`Optimizer::propose_batch`, as the study's parallel loop asks it); when it answers "wait"
//! or every slot is busy, virtual time moves to the next trial's end and its result enters
//! the history. Reported per K: trials finished and wall-clock time until the recommendation
//! (the best feasible trial so far, as the study's) is within 2% of the optimum, medians over
//! seeds, and both as ratios to one slot. The optimum is the best of every point visited, a
//! random sample and the grid, climbed one parameter at a time from the best eight (`polish`).
//! With `SERVETUNE_DEBUG_BENCH` set, every proposal and, per landscape and K, each seed's
//! trials and hours to 2% go to stderr.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::space::{Config, Kind, Value};
use crate::tune::encode::{coord_of, from_unit, Coord};
use crate::tune::opt::{self, Obs};

use super::{bench_landscapes, median, optimum, BenchOptions, Landscape, Oracle};

/// A trial's engine start-up in virtual seconds (an 8–32B model on an H100 node: load, graph
/// capture, warm-up).
pub const STARTUP_S: f64 = 90.0;

/// The share of the K-slot target: on 8 slots, wall-clock to 2% at least this many times
/// shorter than on one slot...
pub const TARGET_SPEEDUP: f64 = 4.0;
/// ... with no more than this many times the trials.
pub const TARGET_TRIALS: f64 = 1.5;

/// One study with K slots, in virtual time.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// After each finished trial: (virtual seconds, trials finished, trials started, the true
    /// value of the recommendation then).
    pub points: Vec<(f64, usize, usize, f64)>,
    /// The most trials that ran at once.
    pub peak: usize,
}

/// One study with `k` slots. `n` trials are finished in all (or fewer, when the optimiser
/// stops).
pub fn study(
    l: &Landscape,
    k: usize,
    seed: u64,
    n: usize,
    truths: &mut HashMap<String, Option<f64>>,
) -> Run {
    let k = k.max(1);
    let plan = l.plan(n);
    let kind = opt::default_for(&l.space, n);
    let mut o = Oracle::new(l, seed);
    std::mem::swap(&mut o.cache, truths);
    let mut optimiser = opt::make(kind, &l.space, seed, &plan);
    let mut history: Vec<Obs> = Vec::new();
    // Running trials: (end time, start order, configuration, its result).
    let mut running: Vec<(f64, usize, Config, Obs)> = Vec::new();
    let mut started = 0usize;
    let mut now = 0.0f64;
    let mut best: Option<(f64, Config)> = None;
    let mut out = Vec::new();
    let mut stopped = false;
    let mut peak = 0;
    let debug = std::env::var_os("SERVETUNE_DEBUG_BENCH").is_some();
    while history.len() < n {
        while !stopped && running.len() < k && started < n {
            let configs: Vec<Config> = running.iter().map(|r| r.2.clone()).collect();
            match optimiser.propose_batch(&history, &configs) {
                Ok(Some(p)) => {
                    let (obs, secs) = o.observe_timed(&p.config);
                    if debug {
                        eprintln!(
                            "k={k} seed={seed} t={now:.0} #{started} {:?} {} ({})",
                            obs.value.map(|v| v as i64),
                            serde_json::to_string(&p.config).unwrap_or_default(),
                            p.note
                        );
                    }
                    running.push((now + STARTUP_S + secs, started, p.config, obs));
                    started += 1;
                }
                Ok(None) => break,
                Err(_) => stopped = true,
            }
        }
        peak = peak.max(running.len());
        // The next trial to end (the earlier started one on a tie).
        let Some(i) = (0..running.len()).min_by(|a, b| {
            let (x, y) = (&running[*a], &running[*b]);
            x.0.total_cmp(&y.0).then(x.1.cmp(&y.1))
        }) else {
            break;
        };
        let (end, _, config, obs) = running.swap_remove(i);
        now = end;
        if let Some(v) = obs.value {
            if best.as_ref().is_none_or(|(b, _)| v > *b) {
                best = Some((v, config));
            }
        }
        history.push(obs);
        let t = best.as_ref().and_then(|(_, c)| o.truth(c)).unwrap_or(0.0);
        out.push((now, history.len(), started, t));
    }
    std::mem::swap(&mut o.cache, truths);
    Run { points: out, peak }
}

/// Climbs from the best eight points in `truths` one parameter at a time (every value of a
/// categorical one, steps of 1/128 to 1/4 of a numeric one's range) on the noise-free
/// landscape, so that the optimum the trials are measured against is the top of its hill, not
/// only the best of what the studies and the samples happened to visit (the visited points
/// differ from one run of the benchmark to the next).
fn polish(l: &Landscape, truths: &mut HashMap<String, Option<f64>>) {
    const STEPS: [f64; 6] = [
        1.0 / 128.0,
        1.0 / 64.0,
        1.0 / 32.0,
        1.0 / 16.0,
        1.0 / 8.0,
        0.25,
    ];
    let mut o = Oracle::new(l, 0);
    std::mem::swap(&mut o.cache, truths);
    let mut starts: Vec<(f64, Config)> = o
        .cache
        .iter()
        .filter_map(|(k, v)| Some(((*v)?, serde_json::from_str::<Config>(k).ok()?)))
        .collect();
    starts.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (mut best, mut at) in starts.into_iter().take(8) {
        for _ in 0..8 {
            let mut moved = false;
            for p in &l.space.params {
                let Some(now) = at.get(&p.name).cloned() else {
                    continue;
                };
                let options: Vec<Value> = match (&p.kind, coord_of(p, &now)) {
                    (Kind::Categorical { values }, _) => {
                        values.iter().map(|v| Value::Str(v.clone())).collect()
                    }
                    (Kind::Bool, _) => vec![Value::Bool(false), Value::Bool(true)],
                    (_, Coord::Num(u)) => STEPS
                        .iter()
                        .flat_map(|d| [u - d, u + d])
                        .map(|x| from_unit(p, x))
                        .collect(),
                    _ => Vec::new(),
                };
                for v in options {
                    if v == now {
                        continue;
                    }
                    let mut c = at.clone();
                    c.insert(p.name.clone(), v);
                    if l.space.repair(&mut c).is_err() {
                        continue;
                    }
                    if let Some(x) = o.truth(&c) {
                        if x > best {
                            (best, at, moved) = (x, c, true);
                        }
                    }
                }
            }
            if !moved {
                break;
            }
        }
    }
    std::mem::swap(&mut o.cache, truths);
}

/// Trials finished, trials started and virtual seconds until the trajectory is within 2% of
/// `optimum` (infinity when never).
fn to_two_percent(traj: &[(f64, usize, usize, f64)], optimum: f64) -> (f64, f64, f64) {
    traj.iter()
        .find(|p| p.3 >= 0.98 * optimum)
        .map(|(t, n, s, _)| (*n as f64, *s as f64, *t))
        .unwrap_or((f64::INFINITY, f64::INFINITY, f64::INFINITY))
}

/// Runs the benchmark for each `ks` (1 first, the reference) and returns the table
/// (Markdown).
pub fn run_parallel(opts: &BenchOptions, ks: &[usize]) -> Result<String, String> {
    let mut ks: Vec<usize> = ks.iter().copied().filter(|k| *k > 0).collect();
    if !ks.contains(&1) {
        ks.push(1);
    }
    ks.sort_unstable();
    ks.dedup();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| landscape | slots | trials to 2% (median) | started by then (median) | wall-clock to 2% (median) | speed-up vs 1 slot | trials vs 1 slot | within 2% on |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let mut met = Vec::new();
    for l in bench_landscapes(opts)? {
        let mut truths = HashMap::new();
        let runs: Vec<Vec<Run>> = ks
            .iter()
            .map(|k| {
                (0..opts.seeds)
                    .map(|s| study(&l, *k, s, opts.budget, &mut truths))
                    .collect()
            })
            .collect();
        polish(&l, &mut truths);
        let best = optimum(&l, &mut truths, opts.optimum_samples);
        let mut reference: Option<(f64, f64)> = None;
        for (k, per_seed) in ks.iter().zip(&runs) {
            let reached: Vec<(f64, f64, f64)> = per_seed
                .iter()
                .map(|t| to_two_percent(&t.points, best))
                .collect();
            if std::env::var_os("SERVETUNE_DEBUG_BENCH").is_some() {
                eprintln!(
                    "{} k={k} per seed (trials, hours): {}",
                    l.name,
                    reached
                        .iter()
                        .map(|r| format!("({}, {:.2})", r.0, r.2 / 3600.0))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            let trials = median(reached.iter().map(|r| r.0).collect());
            let started = median(reached.iter().map(|r| r.1).collect());
            let secs = median(reached.iter().map(|r| r.2).collect());
            let hit = reached.iter().filter(|r| r.0.is_finite()).count();
            if *k == 1 {
                reference = Some((trials, secs));
            }
            let (r_trials, r_secs) = reference.unwrap_or((f64::NAN, f64::NAN));
            let ratio = |a: f64, b: f64| {
                if a.is_finite() && b.is_finite() {
                    a / b
                } else {
                    f64::NAN
                }
            };
            let speedup = ratio(r_secs, secs);
            let more = ratio(trials, r_trials);
            if *k == 8 {
                met.push((
                    l.name.clone(),
                    speedup >= TARGET_SPEEDUP && more <= TARGET_TRIALS,
                ));
            }
            let shown = |x: f64, f: &dyn Fn(f64) -> String| {
                if x.is_finite() {
                    f(x)
                } else {
                    "-".to_string()
                }
            };
            let _ = writeln!(
                out,
                "| {} | {k} | {} | {} | {} | {} | {} | {hit}/{} |",
                l.name,
                shown(trials, &|x| format!("{x:.1}")),
                shown(started, &|x| format!("{x:.1}")),
                shown(secs, &|x| format!("{:.2} h", x / 3600.0)),
                shown(speedup, &|x| format!("{x:.2}×")),
                shown(more, &|x| format!("{x:.2}×")),
                opts.seeds
            );
        }
    }
    let _ = writeln!(
        out,
        "\n({} seeds, {} trials per study, the default optimiser (`opt::default_for`) with the workload's priors; a trial lasts {STARTUP_S:.0} s of start-up plus its benchmark; trials counted when they finish, the target's ratio too; \"started\": the trials begun by then, the ones still running included)",
        opts.seeds, opts.budget
    );
    if !met.is_empty() {
        let _ = writeln!(
            out,
            "\nTarget on 8 slots (wall-clock to 2% at least {TARGET_SPEEDUP}× shorter, at most {TARGET_TRIALS}× the trials): {}",
            met.iter()
                .map(|(n, ok)| format!("{n}: {}", if *ok { "met" } else { "missed" }))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::trajectory;
    use super::*;

    #[test]
    fn one_slot_is_the_sequential_study_and_k_slots_keep_k_trials_running() {
        let ls = super::super::landscapes().unwrap();
        let l = &ls[0];
        let n = 12;
        let mut truths = HashMap::new();
        for seed in 0..2 {
            let one = study(l, 1, seed, n, &mut truths);
            let sequential = trajectory(l, opt::default_for(&l.space, n), seed, n, &mut truths);
            let values: Vec<f64> = one.points.iter().map(|p| p.3).collect();
            assert_eq!(values, sequential, "seed {seed}");
            assert_eq!(one.peak, 1);
            assert!(
                one.points.iter().all(|p| p.1 == p.2),
                "one slot: started = finished"
            );
            for k in [2, 4] {
                let r = study(l, k, seed, n, &mut truths);
                assert_eq!(r.points.len(), n, "k = {k}: every trial finishes");
                assert_eq!(r.peak, k, "k = {k}: every slot is used");
                assert!(r.points.iter().enumerate().all(|(i, p)| p.1 == i + 1));
                // Until the budget is all started, each finished trial's slot is refilled.
                assert!(
                    r.points
                        .iter()
                        .all(|p| p.2 == (p.1 + k - 1).min(n) || p.2 == n),
                    "k = {k}: {:?}",
                    r.points
                );
                // In parallel the same number of trials takes less virtual time.
                let (t1, tk) = (one.points[n - 1].0, r.points[n - 1].0);
                assert!(tk < t1, "k = {k}: {tk:.0} s against {t1:.0} s on one slot");
            }
        }
    }
}
