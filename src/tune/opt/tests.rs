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

/// The toy space and a fourth option, `z`, that the landscape ignores.
fn toy_with_idle() -> Space {
    Space::parse(&toy_with_idle_text(), "toy.toml").unwrap()
}

fn toy_with_idle_text() -> String {
    format!(
        "{TOY}\n[[param]]\nname = \"z\"\nflag = \"--z\"\ntype = \"int\"\nmin = 1\nmax = 8\ndefault = 2\nsource = \"test\"\n"
    )
}

fn with_phase(budget: usize) -> Plan {
    Plan {
        budget,
        one_at_a_time: Some(oat::Settings { freeze_below: 0.03 }),
        ..Plan::default()
    }
}

fn run_space(kind: Algorithm, space: &Space, seed: u64, plan: &Plan) -> Vec<Obs> {
    let mut opt = make(kind, space, seed, plan);
    let mut hist = Vec::new();
    for _ in 0..plan.budget {
        let p = opt.propose(&hist).unwrap();
        hist.push(evaluate(&p.config));
    }
    hist
}

#[test]
fn the_importance_phase_moves_each_option_alone_then_freezes_the_one_that_moved_nothing() {
    let space = toy_with_idle();
    let defaults = space.defaults();
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        let plan = with_phase(16);
        let h = run_space(kind, &space, 5, &plan);
        // Trials 1–4: x, y, mode and z, each alone away from its default.
        for (i, name) in ["x", "y", "mode", "z"].iter().enumerate() {
            let c = &h[1 + i].config;
            let changed: Vec<&String> = c
                .iter()
                .filter(|(k, v)| defaults.get(*k) != Some(*v))
                .map(|(k, _)| k)
                .collect();
            assert_eq!(changed, vec![*name], "{}: move {i}: {c:?}", kind.name());
        }
        let moves = oat::moves(&space, &plan);
        let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
        assert_eq!(f.frozen(), vec!["z".to_owned()], "{}: {f:?}", kind.name());
        // x and mode moved the objective far beyond 3%, y by about 10%.
        for m in &f.moved[..3] {
            assert!(
                m.objective_pct.unwrap().abs() > 3.0,
                "{}: {m:?}",
                kind.name()
            );
        }
        // The search after the phase keeps z at its default and still moves the others.
        let after = &h[5..];
        assert!(after
            .iter()
            .all(|o| o.config.get("z") == Some(&Value::Int(2))));
        for name in ["x", "y", "mode"] {
            assert!(
                after
                    .iter()
                    .any(|o| o.config.get(name) != defaults.get(name)),
                "{}: {name} never searched",
                kind.name()
            );
        }
    }
}

#[test]
fn the_importance_phase_is_deterministic_and_resumes_exactly() {
    let space = toy_with_idle();
    let plan = with_phase(14);
    let a = run_space(Algorithm::Gp, &space, 9, &plan);
    let b = run_space(Algorithm::Gp, &space, 9, &plan);
    assert_eq!(
        a.iter().map(|o| &o.config).collect::<Vec<_>>(),
        b.iter().map(|o| &o.config).collect::<Vec<_>>()
    );
    // A fresh optimiser given the first k trials proposes what the running one did.
    for k in [3, 5, 6, 9] {
        let mut fresh = make(Algorithm::Gp, &space, 9, &plan);
        assert_eq!(
            fresh.propose(&a[..k]).unwrap().config,
            a[k].config,
            "at {k}"
        );
    }
}

#[test]
fn a_move_that_changes_feasibility_or_that_others_depend_on_is_never_frozen() {
    let space = toy_with_idle();
    let plan = with_phase(12);
    let moves = oat::moves(&space, &plan);
    let settings = plan.one_at_a_time.unwrap();
    let base = ran(&space.defaults(), 50.0);
    // Every move reads the defaults' value, but z's run missed a latency limit at the same
    // throughput, and x's engine failed.
    let mut h = vec![base];
    for m in &moves {
        let mut o = ran(&m.config, 50.0);
        if m.param == "z" {
            o.value = None;
            o.slack = vec![Some(0.2)];
        }
        if m.param == "x" {
            o = Obs {
                config: m.config.clone(),
                value: None,
                failed: true,
                measured: None,
                slack: Vec::new(),
                decode: None,
            };
        }
        h.push(o);
    }
    let f = oat::assess(&space, &moves, settings, &h).unwrap();
    let get = |n: &str| f.moved.iter().find(|m| m.param == n).unwrap();
    assert!(!get("z").frozen && get("z").why.contains("missed a constraint"));
    assert!(!get("x").frozen && get("x").why.contains("failed"));
    assert!(get("y").frozen && get("mode").frozen);
    // Until every move is measured there are no findings.
    assert!(oat::assess(&space, &moves, settings, &h[..3]).is_none());
    // An option another option's condition names is never frozen (mode: w exists only at
    // mode b); one a constraint names may be, and then the constraint still holds in every
    // configuration of the search (z <= y, y frozen at 4: z clamped to 4).
    let text = format!(
        "{}\n[[param]]\nname = \"w\"\nflag = \"--w\"\ntype = \"bool\"\ndefault = false\nwhen = {{ mode = \"b\" }}\nsource = \"test\"\n\n[[constraint]]\nlhs = \"z\"\nop = \"<=\"\nrhs = \"y\"\n",
        toy_with_idle_text()
    );
    let constrained = Space::parse(&text, "toy.toml").unwrap();
    let moves = oat::moves(&constrained, &plan);
    let h = phase_run(&constrained, &moves, 50.0, [50.0; 16]);
    let f = oat::assess(&constrained, &moves, settings, &h).unwrap();
    let get = |n: &str| f.moved.iter().find(|m| m.param == n).unwrap();
    assert!(
        !get("mode").frozen && get("mode").why.contains("depend"),
        "{f:?}"
    );
    assert!(get("y").frozen && get("z").frozen, "{f:?}");
    assert!(
        get("z")
            .why
            .contains("the constraint z <= y still clamps it"),
        "{f:?}"
    );
    let frozen = f.frozen();
    let mut cfg = Config::new();
    cfg.insert("x".into(), Value::Float(0.5));
    cfg.insert("mode".into(), Value::Str("a".into()));
    cfg.insert("z".into(), Value::Int(8));
    let reduced = oat::reduce(&constrained, &["y".to_owned()]);
    assert!(reduced.params.iter().all(|p| p.name != "y"));
    oat::fill(&constrained, &["y".to_owned()], &mut cfg).unwrap();
    assert_eq!(cfg.get("y"), Some(&Value::Int(4)));
    assert_eq!(cfg.get("z"), Some(&Value::Int(4)), "{cfg:?}");
    assert!(frozen.contains(&"x".to_owned()));
}

/// The history of an importance phase: the defaults read `defaults`, then each move in turn
/// one of `readings`, every run within the constraints.
fn phase_run(
    space: &Space,
    moves: &[oat::Move],
    defaults: f64,
    readings: impl IntoIterator<Item = f64>,
) -> Vec<Obs> {
    std::iter::once(ran(&space.defaults(), defaults))
        .chain(moves.iter().zip(readings).map(|(m, v)| ran(&m.config, v)))
        .collect()
}

/// Nine integer options `p0`…`p8` (default 2, range 1–8).
fn nine() -> Space {
    let mut text = String::from(
        "[engine]\nname = \"toy\"\nbinary = \"toy\"\nargv = [\"{binary}\", \"--port\", \"{port}\"]\n",
    );
    for i in 0..9 {
        text.push_str(&format!(
            "\n[[param]]\nname = \"p{i}\"\nflag = \"--p{i}\"\ntype = \"int\"\nmin = 1\nmax = 8\ndefault = 2\nsource = \"test\"\n"
        ));
    }
    Space::parse(&text, "nine.toml").unwrap()
}

/// A screening of nine options where two matter (p0 +40%, p4 −30%) and the rest read within
/// ±6% of 100 (noise): against the median of the readings, with their margin of error, only
/// the two real effects count. When the defaults' own reading lies beyond that margin (a slow
/// moment of the machine, 75 against ~100), the median is no longer theirs: every neutral move
/// would look like a gain of a third, and the phase freezes nothing and says why.
#[test]
fn the_importance_phase_judges_moves_against_the_readings_noise_and_freezes_nothing_when_the_defaults_read_off_it(
) {
    let space = nine();
    let plan = with_phase(16);
    let moves = oat::moves(&space, &plan);
    assert_eq!(moves.len(), 9);
    let noise = [3.0, -4.0, 6.0, 0.0, -2.0, 5.0, -6.0, 1.0, 4.0];
    let readings = || {
        (0..9).map(|i| match i {
            0 => 140.0,
            4 => 70.0,
            _ => 100.0 + noise[i],
        })
    };
    let h = phase_run(&space, &moves, 98.0, readings());
    let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
    let kept: Vec<&str> = f
        .moved
        .iter()
        .filter(|m| !m.frozen)
        .map(|m| m.param.as_str())
        .collect();
    assert_eq!(kept, vec!["p0", "p4"], "{f:#?}");
    let r = f.reference.unwrap();
    assert!((99.0..=104.0).contains(&r), "reference {r}");
    let e = f.noise_margin_pct.unwrap();
    assert!(e > 5.0 && e < 30.0, "margin {e}");
    // The defaults read 75: beyond the margin, nothing is frozen.
    let h = phase_run(&space, &moves, 75.0, readings());
    let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
    assert!(f.defaults_pct.unwrap() < -20.0, "{f:?}");
    assert!(f.frozen().is_empty(), "{f:#?}");
    assert!(
        f.moved
            .iter()
            .filter(|m| !["p0", "p4"].contains(&m.param.as_str()))
            .all(|m| m.why.contains("the defaults read")),
        "{f:#?}"
    );
    // With fewer readings than the noise needs, the defaults' reading is the reference and
    // freeze_below the margin: the same moves, judged on 4 options only against defaults that
    // read 90, all count.
    let h = phase_run(&space, &moves, 90.0, readings());
    let four: Vec<oat::Move> = moves[..4].to_vec();
    let f = oat::assess(&space, &four, plan.one_at_a_time.unwrap(), &h).unwrap();
    assert!(
        f.reference.is_none() && f.moved.iter().all(|m| !m.frozen),
        "{f:#?}"
    );
}

/// Effect sparsity inverted: six of nine options each give +30% and three do nothing. The
/// readings' median is then the movers' level, the defaults read 23% below it, and against
/// that median the six real gains would look like no effect and be frozen. The phase sees
/// that the defaults lie off the median and freezes none of them.
#[test]
fn when_most_options_matter_the_phase_freezes_none_of_them() {
    let space = nine();
    let plan = with_phase(16);
    let moves = oat::moves(&space, &plan);
    let readings = [130.0, 131.0, 129.0, 100.5, 130.5, 99.0, 128.0, 101.0, 132.0];
    let h = phase_run(&space, &moves, 100.0, readings);
    let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
    for (m, r) in f.moved.iter().zip(readings) {
        if r > 120.0 {
            assert!(!m.frozen, "{m:?}");
        }
    }
    assert!(f.frozen().is_empty(), "{f:#?}");
}

/// A move that misses a constraint the defaults met (another regime: the run overloaded)
/// does not count among the readings the noise is taken from: one such reading, far off,
/// with seven neutral ones around the defaults, leaves the margin that of the neutral ones.
#[test]
fn readings_of_another_feasibility_are_not_the_phases_noise() {
    let space = nine();
    let plan = with_phase(16);
    let moves = oat::moves(&space, &plan);
    let readings = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.0, 100.0];
    let mut h = phase_run(&space, &moves, 100.0, readings);
    // Move 0 (p0) and move 1 (p1) overload the engine: far-off readings, infeasible.
    for (i, v) in [(1, 40.0), (2, 250.0)] {
        h[i].measured = Some(v);
        h[i].value = None;
    }
    let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
    let e = f.noise_margin_pct.unwrap();
    assert!(e < 3.0, "margin {e}: {f:#?}");
    assert!(!f.moved[0].frozen && !f.moved[1].frozen, "{f:#?}");
    assert_eq!(f.frozen().len(), 7, "{f:#?}");
}

/// A move that a `clamp` constraint carries another option with (a to 4 pulls b, bounded by
/// a, from 8 to 4) says so: its effect is both options'.
#[test]
fn a_move_a_constraint_carries_another_option_with_names_it() {
    let text = "[engine]\nname = \"toy\"\nbinary = \"toy\"\nargv = [\"{binary}\"]\n\n[[param]]\nname = \"a\"\nflag = \"--a\"\ntype = \"int\"\nmin = 1\nmax = 16\ndefault = 12\nsource = \"test\"\n\n[[param]]\nname = \"b\"\nflag = \"--b\"\ntype = \"int\"\nmin = 1\nmax = 16\ndefault = 8\nsource = \"test\"\n\n[[constraint]]\nlhs = \"b\"\nop = \"<=\"\nrhs = \"a\"\n";
    let space = Space::parse(text, "ab.toml").unwrap();
    let plan = with_phase(8);
    let moves = oat::moves(&space, &plan);
    let a = moves.iter().find(|m| m.param == "a").unwrap();
    assert_eq!(a.with, vec!["b".to_owned()], "{a:?}");
    assert!(moves
        .iter()
        .find(|m| m.param == "b")
        .unwrap()
        .with
        .is_empty());
    let h = phase_run(&space, &moves, 100.0, [130.0, 100.0]);
    let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
    assert!(
        f.moved[0].why.contains("a constraint moved b with it"),
        "{f:#?}"
    );
    assert_eq!(f.moved[0].with, vec!["b".to_owned()]);
}

/// The readings of the real llama-server demo study's importance phase (2026-12-05: the
/// defaults, then nine moves, most of them the same configuration as the defaults on this
/// machine, drifting from 206 to 279 tok/s in ten minutes): the margin of error they give is
/// beyond what the phase can use, so it freezes nothing and says why (before, against the
/// defaults' single reading, every move looked like an effect beyond 5%).
#[test]
fn a_phase_whose_readings_are_too_noisy_freezes_nothing_and_says_so() {
    let space = nine();
    let plan = with_phase(16);
    let moves = oat::moves(&space, &plan);
    let readings = [
        208.3, 179.3, 187.8, 238.3, 264.1, 278.9, 269.1, 254.3, 268.8,
    ];
    let h = phase_run(&space, &moves, 206.1, readings);
    let f = oat::assess(&space, &moves, plan.one_at_a_time.unwrap(), &h).unwrap();
    assert!(f.noise_margin_pct.unwrap() > 50.0, "{f:?}");
    assert!(f.frozen().is_empty(), "{f:#?}");
    assert!(
        f.moved.iter().all(|m| m.why.contains("too noisy")),
        "{f:#?}"
    );
}

/// A decode-bound toy: `y` is the batch cap, 90% of it decodes at once, each token takes
/// 10 ms plus 1 ms per sequence in the batch, against a 20 ms TPOT limit.
fn decode_bound(c: &Config) -> Obs {
    let batch = 0.9 * num(c, "y");
    let tpot = 10.0 + batch;
    let slack = (tpot / 20.0f64).ln();
    let v = 100.0 * batch / tpot;
    Obs {
        config: c.clone(),
        value: (slack <= 0.0).then_some(v),
        failed: false,
        measured: Some(v),
        slack: vec![Some(slack)],
        decode: Some(DecodeLoad { batch, slack }),
    }
}

#[test]
fn a_workload_point_over_a_per_token_limit_backs_off_its_batch_cap_until_it_fits() {
    let plan = Plan {
        budget: 16,
        cap: Some("y".into()),
        ..priors(0.7, 4.0, 1)
    };
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        let mut opt = make(kind, &toy(), 0, &plan);
        let mut h: Vec<Obs> = Vec::new();
        let mut notes = Vec::new();
        for _ in 0..5 {
            let p = opt.propose(&h).unwrap();
            notes.push(p.note.clone());
            h.push(decode_bound(&p.config));
        }
        let ys: Vec<f64> = h.iter().map(|o| num(&o.config, "y")).collect();
        // The prior's point (y = 16) decodes 14.4 at once, 22% over: a proportional step to
        // 95% of the limit (y = 12, still 4% over), then an affine one through both (y = 10,
        // 19 ms): the largest cap under the limit with its margin.
        assert_eq!(ys[1..4], [16.0, 12.0, 10.0], "{notes:?}");
        assert!(notes[2].contains("back-off: y 16 -> 12"), "{notes:?}");
        assert!(notes[3].contains("back-off: y 12 -> 10"), "{notes:?}");
        assert!(h[3].value.is_some());
        for o in &h[2..4] {
            let mut c = o.config.clone();
            c.insert("y".into(), Value::Int(16));
            assert_eq!(c, h[1].config, "a back-off moves the cap alone");
        }
        // Once a point fits, the design goes on.
        assert!(notes[4].contains("start-up design"), "{notes:?}");
    }
    // A cap already at its least cannot back off: the design goes on.
    let at_least = Plan {
        budget: 16,
        cap: Some("y".into()),
        ..priors(0.0, 0.0, 1)
    };
    let mut opt = make(Algorithm::Gp, &toy(), 0, &at_least);
    let mut h: Vec<Obs> = Vec::new();
    for _ in 0..2 {
        let p = opt.propose(&h).unwrap();
        let mut o = decode_bound(&p.config);
        o.value = None;
        o.decode = Some(DecodeLoad {
            batch: 0.9,
            slack: 0.5,
        });
        h.push(o);
    }
    assert_eq!(num(&h[1].config, "y"), 1.0);
    let next = opt.propose(&h).unwrap();
    assert!(next.note.contains("start-up design"), "{}", next.note);
}

#[test]
fn no_back_off_without_a_cap_a_per_token_limit_or_a_run_that_missed_it() {
    let with_cap = Plan {
        budget: 16,
        cap: Some("y".into()),
        ..priors(0.7, 4.0, 1)
    };
    let without_cap = Plan {
        budget: 16,
        ..priors(0.7, 4.0, 1)
    };
    let crashed = |c: &Config| Obs {
        failed: true,
        value: None,
        measured: None,
        slack: Vec::new(),
        decode: None,
        ..decode_bound(c)
    };
    let no_limit = |c: &Config| Obs {
        decode: None,
        ..decode_bound(c)
    };
    type Eval<'a> = &'a dyn Fn(&Config) -> Obs;
    let cases: [(&Plan, Eval); 3] = [
        (&without_cap, &decode_bound),
        (&with_cap, &crashed),
        (&with_cap, &no_limit),
    ];
    for (plan, eval) in cases {
        let mut opt = make(Algorithm::Gp, &toy(), 0, plan);
        let mut h: Vec<Obs> = Vec::new();
        for _ in 0..2 {
            let p = opt.propose(&h).unwrap();
            h.push(eval(&p.config));
        }
        let next = opt.propose(&h).unwrap();
        assert!(next.note.contains("start-up design"), "{}", next.note);
    }
}

/// A memory-bound toy: `frac` is the KV cache's share (more serves more), `chunk` a prefill
/// chunk whose activations take memory from it; the engine refuses to start (out of memory)
/// when `frac + chunk / 16384 × 0.1` exceeds `room`.
const MEMORY: &str = r#"
[engine]
name = "toy"
binary = "toy"
argv = ["{binary}", "--port", "{port}"]

[[param]]
name = "frac"
flag = "--frac"
type = "float"
min = 0.7
max = 0.95
default = 0.75
source = "test"
prior = { at_least = 0.8, edge = "high", source = "test: more memory, more cache" }

[[param]]
name = "chunk"
flag = "--chunk"
type = "int"
min = 1024
max = 16384
log = true
default = 8192
source = "test"
prior = { at_least = "{prompt_tokens}", edge = "low", source = "test: a chunk that holds the prompt" }

[[param]]
name = "other"
flag = "--other"
type = "int"
min = 1
max = 8
default = 2
source = "test"
"#;

fn memory_bound(room: f64) -> impl Fn(&Config) -> Obs {
    move |c: &Config| {
        let (frac, chunk) = (num(c, "frac"), num(c, "chunk"));
        let fits = frac + chunk / 16384.0 * 0.1 <= room;
        let v = fits.then_some(1000.0 * frac);
        Obs {
            config: c.clone(),
            value: v,
            failed: !fits,
            measured: v,
            slack: Vec::new(),
            decode: None,
        }
    }
}

fn memory_plan(space: &Space, budget: usize) -> Plan {
    let shape = crate::tune::prior::Shape {
        concurrency: Some(8.0),
        prompt_tokens: 2048.0,
        output_tokens: 128.0,
    };
    let (priors, _) = crate::tune::prior::resolve(space, &[shape], &Default::default());
    Plan {
        budget,
        priors,
        ..Plan::default()
    }
}

#[test]
fn after_the_workloads_point_the_start_up_gives_the_kv_cache_the_memory_the_workload_does_not_need()
{
    let space = Space::parse(MEMORY, "memory.toml").unwrap();
    let plan = memory_plan(&space, 12);
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        // Room for the edge: frac at the top of its range, the chunk at the prompt's length.
        let eval = memory_bound(0.965);
        let mut opt = make(kind, &space, 0, &plan);
        let mut h: Vec<Obs> = Vec::new();
        let mut notes = Vec::new();
        for _ in 0..3 {
            let p = opt.propose(&h).unwrap();
            notes.push(p.note.clone());
            h.push(eval(&p.config));
        }
        assert!(notes[1].contains("workload's prior"), "{notes:?}");
        // The prior's point: the middle of what `frac >= 0.8` allows (its default is under).
        assert_eq!(
            (num(&h[1].config, "frac"), num(&h[1].config, "chunk")),
            (0.875, 8192.0)
        );
        assert!(notes[2].contains("memory edge"), "{notes:?}");
        assert_eq!(
            (num(&h[2].config, "frac"), num(&h[2].config, "chunk")),
            (0.95, 2048.0)
        );
        assert_eq!(
            h[2].config["other"], h[1].config["other"],
            "only the edge's knobs move"
        );
        assert_eq!(h[2].value, Some(950.0));
        let next = opt.propose(&h).unwrap();
        assert!(!next.note.contains("memory edge"), "{}", next.note);

        // No room for it: the engine refuses, and the next point is half-way back.
        let eval = memory_bound(0.93);
        let mut opt = make(kind, &space, 0, &plan);
        let mut h: Vec<Obs> = Vec::new();
        let mut notes = Vec::new();
        for _ in 0..4 {
            let p = opt.propose(&h).unwrap();
            notes.push(p.note.clone());
            h.push(eval(&p.config));
        }
        assert!(h[2].failed, "{notes:?}");
        assert!(notes[3].contains("half-way back"), "{notes:?}");
        assert!(
            (num(&h[3].config, "frac") - 0.9125).abs() < 1e-3,
            "{notes:?}"
        );
        assert_eq!(num(&h[3].config, "chunk"), 2048.0);
        assert!(h[3].value.is_some(), "{notes:?}");
        let next = opt.propose(&h).unwrap();
        assert!(!next.note.contains("memory edge"), "{}", next.note);
    }
}

#[test]
fn no_memory_edge_without_a_high_knob_whose_prior_applies_or_a_feasible_workload_point() {
    let space = Space::parse(MEMORY, "memory.toml").unwrap();
    // The memory fraction's prior left out (as when its `if` does not hold): nothing to raise.
    let mut plan = memory_plan(&space, 12);
    plan.priors[0] = None;
    let mut opt = make(Algorithm::Gp, &space, 0, &plan);
    let mut h: Vec<Obs> = Vec::new();
    for _ in 0..2 {
        let p = opt.propose(&h).unwrap();
        h.push(memory_bound(0.965)(&p.config));
    }
    let next = opt.propose(&h).unwrap();
    assert!(next.note.contains("start-up design"), "{}", next.note);
    // The workload's point itself refused: no base to raise from.
    let plan = memory_plan(&space, 12);
    let mut opt = make(Algorithm::Gp, &space, 0, &plan);
    let mut h: Vec<Obs> = Vec::new();
    for _ in 0..2 {
        let p = opt.propose(&h).unwrap();
        h.push(memory_bound(0.8)(&p.config));
    }
    assert!(h[1].failed);
    let next = opt.propose(&h).unwrap();
    assert!(next.note.contains("start-up design"), "{}", next.note);
}

#[test]
fn an_edge_is_only_for_an_at_least_prior() {
    let text = MEMORY.replace(
        "prior = { at_least = 0.8, edge = \"high\"",
        "prior = { at = 0.8, edge = \"high\"",
    );
    let err = Space::parse(&text, "memory.toml").unwrap_err().to_string();
    assert!(
        err.contains("prior.edge is only for an `at_least` prior"),
        "{err}"
    );
}
