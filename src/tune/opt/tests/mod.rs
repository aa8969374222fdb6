//! Optimiser tests on a small analytic landscape with a crash region.

use super::*;
use crate::space::Value;

const TOY: &str = r#"
[engine]
name = "toy"
binary = "toy"
argv = ["{binary}", "--port", "{port}"]

[[param]]
name = "x"
flag = "--x"
type = "float"
min = 0.0
max = 1.0
default = 0.1
source = "test"

[[param]]
name = "y"
flag = "--y"
type = "int"
min = 1
max = 64
log = true
default = 4
source = "test"

[[param]]
name = "mode"
flag = "--mode"
type = "categorical"
values = ["a", "b", "c"]
default = "a"
source = "test"
"#;

fn toy() -> Space {
    Space::parse(TOY, "toy.toml").unwrap()
}

fn num(c: &Config, k: &str) -> f64 {
    match c.get(k) {
        Some(Value::Float(x)) => *x,
        Some(Value::Int(x)) => *x as f64,
        _ => panic!("{k} missing in {c:?}"),
    }
}

/// Peak at x = 0.7, y = 16, mode b; x > 0.85 crashes.
fn evaluate(c: &Config) -> Obs {
    let x = num(c, "x");
    let y = num(c, "y").log2();
    if x > 0.85 {
        return Obs {
            config: c.clone(),
            value: None,
            failed: true,
            measured: None,
            slack: Vec::new(),
            decode: None,
        };
    }
    let m = match c.get("mode") {
        Some(Value::Str(s)) if s == "b" => 1.0,
        Some(Value::Str(s)) if s == "c" => 0.8,
        _ => 0.6,
    };
    ran(
        c,
        m * (100.0 - 80.0 * (x - 0.7).powi(2) - 2.0 * (y - 4.0).powi(2)),
    )
}

/// A run that met its constraints at value `v`.
fn ran(c: &Config, v: f64) -> Obs {
    Obs {
        config: c.clone(),
        value: Some(v),
        failed: false,
        measured: Some(v),
        slack: Vec::new(),
        decode: None,
    }
}

fn run(kind: Algorithm, seed: u64, n: usize) -> Vec<Obs> {
    run_with(kind, seed, n, &Plan::budget(n))
}

fn run_with(kind: Algorithm, seed: u64, n: usize, plan: &Plan) -> Vec<Obs> {
    let space = toy();
    let mut opt = make(kind, &space, seed, plan);
    let mut hist = Vec::new();
    for _ in 0..n {
        let p = opt.propose(&hist).unwrap();
        hist.push(evaluate(&p.config));
    }
    hist
}

#[test]
fn the_first_trial_is_always_the_defaults() {
    for k in Algorithm::ALL {
        let h = run(k, 7, 1);
        assert_eq!(h[0].config, toy().defaults(), "{}", k.name());
    }
}

#[test]
fn proposals_are_deterministic_for_a_seed_and_differ_across_seeds() {
    for k in Algorithm::ALL {
        let a: Vec<Config> = run(k, 3, 14).into_iter().map(|o| o.config).collect();
        let b: Vec<Config> = run(k, 3, 14).into_iter().map(|o| o.config).collect();
        assert_eq!(a, b, "{} is not deterministic", k.name());
        if k != Algorithm::Reports {
            let c: Vec<Config> = run(k, 4, 14).into_iter().map(|o| o.config).collect();
            assert_ne!(a, c, "{} ignores the seed", k.name());
        }
    }
}

#[test]
fn a_resumed_optimiser_proposes_what_the_original_would_have() {
    for k in Algorithm::ALL {
        let h = run(k, 11, 12);
        let mut fresh = make(k, &toy(), 11, &Plan::budget(12));
        let p = fresh.propose(&h[..9]).unwrap();
        assert_eq!(p.config, h[9].config, "{}", k.name());
    }
}

#[test]
fn model_based_optimisers_find_the_peak_and_avoid_the_crash_region() {
    let best_of = |h: &[Obs]| best_value(h).unwrap();
    let crashes = |h: &[Obs]| h.iter().filter(|o| o.failed).count();
    let (mut tpe_best, mut gp_best, mut rnd_best) = (0.0, 0.0, 0.0);
    let (mut tpe_crash, mut gp_crash, mut rnd_crash) = (0, 0, 0);
    for seed in 0..4 {
        let t = run(Algorithm::Tpe, seed, 30);
        let g = run(Algorithm::Gp, seed, 30);
        let r = run(Algorithm::Random, seed, 30);
        tpe_best += best_of(&t);
        gp_best += best_of(&g);
        rnd_best += best_of(&r);
        // Crashes after the start-up phase.
        tpe_crash += crashes(&t[10..]);
        gp_crash += crashes(&g[10..]);
        rnd_crash += crashes(&r[10..]);
    }
    assert!(gp_best >= rnd_best, "gp {gp_best} random {rnd_best}");
    assert!(
        tpe_best >= 0.97 * rnd_best,
        "tpe {tpe_best} random {rnd_best}"
    );
    assert!(gp_best / 4.0 > 95.0, "gp mean best {}", gp_best / 4.0);
    assert!(gp_crash < rnd_crash, "gp {gp_crash} random {rnd_crash}");
    assert!(tpe_crash < rnd_crash, "tpe {tpe_crash} random {rnd_crash}");
}

#[test]
fn grid_visits_distinct_points_then_says_it_is_exhausted() {
    let space = toy();
    let grid = reference::Grid::new(space.clone(), 0);
    // 3 levels of x, 3 of y, 3 modes.
    assert_eq!(grid.len(), 27);
    let mut opt = make(Algorithm::Grid, &space, 0, &Plan::budget(28));
    let mut hist = Vec::new();
    while let Ok(p) = opt.propose(&hist) {
        assert!(!hist.iter().any(|h: &Obs| h.config == p.config));
        hist.push(evaluate(&p.config));
        assert!(hist.len() <= 28);
    }
    assert_eq!(hist.len(), 28, "27 grid points and the defaults");
}

#[test]
fn reports_method_changes_one_option_at_a_time_then_combines_the_winners() {
    let h = run(Algorithm::Reports, 0, 40);
    let d = toy().defaults();
    let changed = |c: &Config| c.iter().filter(|(k, v)| d.get(*k) != Some(v)).count();
    let singles = h[1..]
        .iter()
        .take_while(|o| changed(&o.config) == 1)
        .count();
    // x: 5 levels (0.1 is not one of them), y: 1, 3, 8, 23, 64 (4 is not one), mode: 2 others.
    assert_eq!(singles, 5 + 5 + 2);
    let next = &h[1 + singles];
    assert!(changed(&next.config) >= 2, "{:?}", next.config);
}

/// Priors on the toy space: x near `x`, y near `y` (log2), mode `mode` (index), sure ones.
fn priors(x: f64, y: f64, mode: usize) -> Plan {
    Plan {
        budget: 0,
        priors: vec![
            Some(Prior::Num { mu: x, sigma: 0.05 }),
            Some(Prior::Num {
                mu: y / 6.0,
                sigma: 0.05,
            }),
            Some(Prior::Cat {
                index: mode,
                arity: 3,
            }),
        ],
        ..Plan::default()
    }
}

#[test]
fn start_up_scales_with_the_budget_and_never_fills_a_small_one() {
    let space = toy();
    for k in [Algorithm::Tpe, Algorithm::Gp] {
        // 12 trials, one baseline: 11 left, a quarter of them start-up (3), at most dims + 1.
        assert_eq!(startup_trials(k, &space, &Plan::budget(12), 0), 3);
        assert_eq!(startup_trials(k, &space, &Plan::budget(40), 0), 4);
        assert_eq!(startup_trials(k, &space, &Plan::budget(4), 0), 2);
        assert_eq!(startup_trials(k, &space, &Plan::budget(2), 0), 1);
        // The notes say which phase each trial is in: the model proposes from trial 5 on.
        let h = run(k, 1, 12);
        let mut opt = make(k, &space, 1, &Plan::budget(12));
        let notes: Vec<String> = (1..h.len())
            .map(|i| opt.propose(&h[..i]).unwrap().note)
            .collect();
        assert!(
            notes[..3].iter().all(|n| n.contains("start-up design")),
            "{notes:?}"
        );
        assert!(
            notes[3..].iter().all(|n| !n.contains("start-up")),
            "{notes:?}"
        );
    }
    assert_eq!(
        startup_trials(Algorithm::Random, &space, &Plan::budget(12), 0),
        0
    );
}

#[test]
fn the_workload_prior_is_tried_right_after_the_defaults() {
    let plan = Plan {
        budget: 12,
        ..priors(0.7, 4.0, 1)
    };
    let h = run_with(Algorithm::Gp, 0, 2, &plan);
    assert_eq!(h[0].config, toy().defaults());
    assert_eq!(num(&h[1].config, "x"), 0.7);
    assert_eq!(num(&h[1].config, "y"), 16.0);
    assert_eq!(h[1].config.get("mode"), Some(&Value::Str("b".into())));
}

#[test]
fn a_right_prior_speeds_the_search_and_a_wrong_one_does_not_stop_it() {
    // The peak is 100 at x = 0.7, y = 16, mode b. Trials until within 2% of it, per seed.
    let to_2pct = |h: &[Obs]| {
        let mut best = f64::NEG_INFINITY;
        h.iter()
            .position(|o| {
                best = best.max(o.value.unwrap_or(f64::NEG_INFINITY));
                best >= 98.0
            })
            .map_or(usize::MAX, |i| i + 1)
    };
    for k in [Algorithm::Gp, Algorithm::Tpe] {
        let (mut right, mut none, mut wrong) = (Vec::new(), Vec::new(), Vec::new());
        for seed in 0..6 {
            let n = 40;
            right.push(to_2pct(&run_with(
                k,
                seed,
                n,
                &Plan {
                    budget: n,
                    ..priors(0.7, 4.0, 1)
                },
            )));
            none.push(to_2pct(&run_with(k, seed, n, &Plan::budget(n))));
            // Wrong everywhere: x at the far end, y at the bottom, mode a.
            wrong.push(to_2pct(&run_with(
                k,
                seed,
                n,
                &Plan {
                    budget: n,
                    ..priors(0.0, 0.0, 0)
                },
            )));
        }
        let median = |mut v: Vec<usize>| {
            v.sort();
            v[v.len() / 2]
        };
        let (r, o, w) = (
            median(right.clone()),
            median(none.clone()),
            median(wrong.clone()),
        );
        assert!(
            r <= 2,
            "{}: the right prior is the second trial: {right:?}",
            k.name()
        );
        assert!(r <= o, "{}: right {right:?} none {none:?}", k.name());
        assert!(
            w <= 40,
            "{}: a wrong prior never converged: {wrong:?}",
            k.name()
        );
    }
}

/// The objective rises with x (and peaks at y = 16), but a latency limit, latency = 2x, caps
/// x at 0.6: the best feasible point is x = 0.6 on the boundary, as a TPOT SLO caps the batch.
fn bounded(c: &Config, with_slack: bool) -> Obs {
    let x = num(c, "x");
    let y = num(c, "y").log2();
    let v = 50.0 + 50.0 * x - 2.0 * (y - 4.0).powi(2);
    let latency = 2.0 * x;
    let ok = latency <= 1.2;
    Obs {
        config: c.clone(),
        value: ok.then_some(v),
        failed: false,
        measured: Some(v),
        slack: if with_slack {
            vec![Some((latency.max(1e-3) / 1.2).ln())]
        } else {
            Vec::new()
        },
        decode: None,
    }
}

#[test]
fn the_gp_learns_a_latency_boundary_from_the_measured_slack() {
    // Within 2% of the best feasible value (80 at x = 0.6, y = 16), per seed, in 14 trials.
    let reached = |with_slack: bool| {
        (0..6)
            .filter(|seed| {
                let space = toy();
                let mut opt = make(Algorithm::Gp, &space, *seed, &Plan::budget(14));
                let mut hist = Vec::new();
                for _ in 0..14 {
                    let p = opt.propose(&hist).unwrap();
                    hist.push(bounded(&p.config, with_slack));
                }
                best_value(&hist).unwrap_or(0.0) >= 0.98 * 80.0
            })
            .count()
    };
    let (with, without) = (reached(true), reached(false));
    assert!(with >= 5, "with the slack: {with}/6 seeds");
    assert!(with >= without, "with {with}, without {without}");
}

#[test]
fn the_effects_estimate_ranks_the_knobs_that_move_the_objective_and_not_the_idle_one() {
    // x moves the objective by ~30% over its range, y by ~15%, mode not at all.
    let space = toy();
    let f = |c: &Config| {
        let (x, y) = (num(c, "x"), num(c, "y").log2());
        ran(
            c,
            100.0 - 40.0 * (x - 0.7).powi(2) - 1.0 * (y - 4.0).powi(2),
        )
    };
    let mut opt = make(Algorithm::Random, &space, 5, &Plan::budget(24));
    let mut hist = Vec::new();
    for _ in 0..24 {
        let p = opt.propose(&hist).unwrap();
        hist.push(f(&p.config));
    }
    let (found, noise) = effects(&space, &hist).expect("a model from 24 runs");
    let names: Vec<&str> = found.iter().map(|e| e.param.as_str()).collect();
    assert_eq!(names, ["x", "y", "mode"], "{found:?}");
    assert!(found[0].measurable && found[0].pct > 10.0, "{found:?}");
    assert!(
        !found[2].measurable && found[2].pct < 1.0,
        "{found:?} noise {noise}"
    );
    assert!(effects(&space, &hist[..2]).is_none());
}

mod batch;
mod importance;
mod startup;
