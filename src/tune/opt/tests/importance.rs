//! The importance phase: each option moved alone from the defaults, judged against the
//! readings' noise, frozen only when it moved nothing, and said why.

use super::*;

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
