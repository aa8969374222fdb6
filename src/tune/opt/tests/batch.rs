//! Parallel trials: `propose_batch` while trials still run. K proposals in a row are K
//! different points, the start-up design is taken in order across them, the stages that read
//! a result wait for it, and nothing running is `propose` itself.

use super::*;

/// `k` proposals in a row while every earlier one still runs, after the finished `history`.
fn batch(opt: &mut Box<dyn Optimizer + Send>, history: &[Obs], k: usize) -> Vec<Proposal> {
    let mut running: Vec<Config> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..k {
        let p = opt
            .propose_batch(history, &running)
            .unwrap()
            .expect("a model-based optimiser proposes while trials run");
        running.push(p.config.clone());
        out.push(p);
    }
    out
}

fn with_priors(budget: usize) -> Plan {
    Plan {
        budget,
        ..priors(0.7, 4.0, 1)
    }
}

#[test]
fn k_proposals_while_k_run_are_pairwise_distinct_and_distinct_from_the_running_ones() {
    for kind in [Algorithm::Tpe, Algorithm::Gp] {
        for (plan, what) in [(Plan::budget(20), "no priors"), (with_priors(20), "priors")] {
            for seed in 0..3 {
                // Past the baselines and the start-up: the model proposes.
                let h = run_with(kind, seed, 8, &plan);
                let mut opt = make(kind, &toy(), seed, &plan);
                let ps = batch(&mut opt, &h, 6);
                let keys: HashSet<String> = ps.iter().map(|p| key(&p.config)).collect();
                assert_eq!(keys.len(), 6, "{} {what} seed {seed}: {ps:?}", kind.name());
                assert!(
                    ps.iter().all(|p| !h.iter().any(|o| o.config == p.config)),
                    "{} {what}: a batch repeats a finished trial",
                    kind.name()
                );
                assert!(
                    ps.iter().all(|p| !p.note.contains("start-up")),
                    "{} {what}: {ps:?}",
                    kind.name()
                );
                // The lie itself spreads the batch: no proposal had to be replaced by a
                // random point for repeating a running one.
                assert!(
                    ps.iter().all(|p| !p.note.contains("random instead")),
                    "{} {what} seed {seed}: {ps:?}",
                    kind.name()
                );
                // The first is what a sequential study would propose there.
                let alone = opt.propose(&h).unwrap();
                assert_eq!(ps[0], alone, "{} {what}", kind.name());
            }
        }
    }
}

#[test]
fn the_start_up_design_is_taken_in_order_across_a_batch() {
    for kind in [Algorithm::Tpe, Algorithm::Gp] {
        for plan in [Plan::budget(12), with_priors(12)] {
            let n = startup_trials(kind, &toy(), &plan, 0);
            assert!(n >= 3);
            // Sequentially: the defaults, then the start-up's n points.
            let h = run_with(kind, 4, 1 + n, &plan);
            // In parallel from the start: the defaults still running take the first slot.
            let mut opt = make(kind, &toy(), 4, &plan);
            let ps = batch(&mut opt, &[], 1 + n);
            let got: Vec<&Config> = ps.iter().map(|p| &p.config).collect();
            let want: Vec<&Config> = h.iter().map(|o| &o.config).collect();
            assert_eq!(got, want, "{}", kind.name());
            // With the defaults finished and the first two design points running, the third.
            let running = vec![h[1].config.clone(), h[2].config.clone()];
            let p = opt.propose_batch(&h[..1], &running).unwrap().unwrap();
            assert_eq!(p.config, h[3].config, "{}: {}", kind.name(), p.note);
            // With the second finished before the first: still the third.
            let finished = vec![h[0].clone(), h[2].clone()];
            let p = opt
                .propose_batch(&finished, &[h[1].config.clone()])
                .unwrap()
                .unwrap();
            assert_eq!(p.config, h[3].config, "{}: {}", kind.name(), p.note);
        }
    }
}

#[test]
fn a_batch_proposal_is_a_pure_function_of_the_history_and_the_running_trials() {
    for kind in Algorithm::ALL {
        let plan = with_priors(20);
        let h = run_with(kind, 9, 10, &plan);
        let running = vec![h[8].config.clone(), h[9].config.clone()];
        let mut a = make(kind, &toy(), 9, &plan);
        let mut b = make(kind, &toy(), 9, &plan);
        // `a` has proposed before (its caches warm), `b` is fresh.
        let _ = a.propose(&h[..5]);
        let pa = a.propose_batch(&h[..8], &running).unwrap();
        let pb = b.propose_batch(&h[..8], &running).unwrap();
        assert_eq!(pa, pb, "{}", kind.name());
        if kind != Algorithm::Reports {
            let p = pa.expect("proposes while trials run");
            assert!(!running.contains(&p.config), "{}", kind.name());
            assert!(
                !h[..8].iter().any(|o| o.config == p.config),
                "{}",
                kind.name()
            );
        }
    }
}

#[test]
fn with_nothing_running_a_batch_proposal_is_the_sequential_one() {
    for kind in Algorithm::ALL {
        for plan in [Plan::budget(14), with_priors(14)] {
            let h = run_with(kind, 2, 14, &plan);
            let mut opt = make(kind, &toy(), 2, &plan);
            for i in 0..h.len() {
                let p = opt.propose_batch(&h[..i], &[]).unwrap();
                assert_eq!(
                    p.map(|p| p.config),
                    Some(h[i].config.clone()),
                    "{} at {i}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn the_importance_phase_runs_its_moves_in_parallel_then_waits_for_them() {
    let plan = Plan {
        budget: 16,
        one_at_a_time: Some(oat::Settings { freeze_below: 0.03 }),
        ..Plan::default()
    };
    let space = toy();
    let moves = oat::moves(&space, &plan);
    assert_eq!(moves.len(), 3);
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        let mut opt = make(kind, &space, 1, &plan);
        // The defaults and the three moves at once.
        let ps = batch(&mut opt, &[], 4);
        assert_eq!(ps[0].config, space.defaults());
        for (p, m) in ps[1..].iter().zip(&moves) {
            assert_eq!(p.config, m.config, "{}", kind.name());
        }
        // Then nothing while a move or the defaults run.
        let all: Vec<Obs> = ps.iter().map(|p| evaluate(&p.config)).collect();
        for i in 0..4 {
            let finished: Vec<Obs> = all.iter().take(i).cloned().collect();
            let running: Vec<Config> = all[i..].iter().map(|o| o.config.clone()).collect();
            let p = opt.propose_batch(&finished, &running).unwrap();
            assert_eq!(p, None, "{} with {} finished", kind.name(), i);
        }
        // Once they finished, the search.
        let p = opt.propose_batch(&all, &[]).unwrap().unwrap();
        assert!(!p.note.contains("importance"), "{}", p.note);
    }
}

#[test]
fn the_reports_procedure_waits_while_a_trial_runs() {
    let space = toy();
    let mut opt = make(Algorithm::Reports, &space, 0, &Plan::budget(20));
    assert_eq!(opt.propose_batch(&[], &[space.defaults()]).unwrap(), None);
    let h = run(Algorithm::Reports, 0, 5);
    let running = vec![h[4].config.clone()];
    assert_eq!(opt.propose_batch(&h[..4], &running).unwrap(), None);
    // The others propose a different point.
    for kind in [Algorithm::Anneal, Algorithm::Random, Algorithm::Grid] {
        let h = run(kind, 0, 5);
        let mut opt = make(kind, &space, 0, &Plan::budget(20));
        let ps = batch(&mut opt, &h[..4], 3);
        let keys: HashSet<String> = ps.iter().map(|p| key(&p.config)).collect();
        assert_eq!(keys.len(), 3, "{}: {ps:?}", kind.name());
    }
}

#[test]
fn tpe_lies_as_the_worst_trial_and_the_gp_believes_its_model_at_the_running_points() {
    let h = run(Algorithm::Gp, 0, 6);
    let running = vec![toy().defaults()];
    let tpe = fantasised(Algorithm::Tpe, &h, &running).unwrap();
    assert_eq!(tpe.len(), 7);
    assert_eq!(
        (tpe[6].value, tpe[6].measured, tpe[6].failed),
        (None, None, false)
    );
    assert_eq!(fantasised(Algorithm::Reports, &h, &running), None);
    assert_eq!(fantasised(Algorithm::Reports, &h, &[]), Some(h.clone()));
    // The Kriging believer: with the sequential proposal running, the next one goes
    // elsewhere, though no result was invented; nothing running, it is the sequential one.
    let plan = Plan::budget(20);
    let mut gp = gp::Gp::new(toy(), 0, plan.clone());
    let alone = gp.propose(&h).unwrap();
    assert_eq!(gp.propose_batch(&h, &[]).unwrap(), Some(alone.clone()));
    let next = gp
        .propose_batch(&h, std::slice::from_ref(&alone.config))
        .unwrap()
        .unwrap();
    assert_ne!(next.config, alone.config);
    assert!(!next.note.contains("random instead"), "{}", next.note);
    assert!(next.expected_improvement.is_some(), "{}", next.note);
    // It is the belief that moves it, not the proposal's random stream (numbered by finished
    // plus running trials): with a running point far from the sequential proposal instead,
    // the same stream proposes elsewhere than with the sequential proposal running.
    let mut far = alone.config.clone();
    let x = num(&far, "x");
    far.insert("x".into(), Value::Float(if x > 0.5 { 0.0 } else { 1.0 }));
    let y = num(&far, "y");
    far.insert("y".into(), Value::Int(if y > 8.0 { 1 } else { 64 }));
    let elsewhere = gp
        .propose_batch(&h, std::slice::from_ref(&far))
        .unwrap()
        .unwrap();
    assert_ne!(elsewhere.config, next.config, "{elsewhere:?} {next:?}");
}

/// Distance between two configurations of the toy space in unit coordinates.
fn apart(a: &Config, b: &Config) -> f64 {
    let s = toy();
    let (a, b) = (
        crate::tune::encode::encode(&s, a),
        crate::tune::encode::encode(&s, b),
    );
    a.iter()
        .zip(&b)
        .map(|(x, y)| crate::tune::encode::coord_distance(*x, *y).powi(2))
        .sum::<f64>()
        .sqrt()
}

#[test]
fn until_two_trials_finish_feasible_the_slots_past_the_design_spread_out_over_the_space() {
    use rand::SeedableRng;
    for kind in [Algorithm::Tpe, Algorithm::Gp] {
        // No cap, so no ladder: past the defaults and the design, a space fill per slot.
        let plan = Plan::budget(12);
        let n = startup_trials(kind, &toy(), &plan, 0);
        let mut opt = make(kind, &toy(), 3, &plan);
        let ps = batch(&mut opt, &[], 1 + n + 4);
        let fills = &ps[1 + n..];
        assert!(
            fills.iter().all(|p| p.note.contains("space fill")),
            "{}: {ps:?}",
            kind.name()
        );
        // Each lies farther from every trial before it than nine random points in ten would.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (i, p) in fills.iter().enumerate() {
            let before: Vec<&Config> = ps[..1 + n + i].iter().map(|q| &q.config).collect();
            let nearest = |c: &Config| {
                before
                    .iter()
                    .map(|b| apart(c, b))
                    .fold(f64::INFINITY, f64::min)
            };
            let mut random: Vec<f64> = (0..200)
                .map(|_| nearest(&toy().sample(&mut rng).unwrap()))
                .collect();
            random.sort_by(f64::total_cmp);
            assert!(
                nearest(&p.config) >= random[180],
                "{} fill {i}: {:.3} from the nearest trial, random points' 90th percentile {:.3}",
                kind.name(),
                nearest(&p.config),
                random[180]
            );
        }
        // The model proposes again once two trials have finished feasible; with one, the
        // slot still fills.
        let done: Vec<Obs> = ps[..1 + n].iter().map(|p| evaluate(&p.config)).collect();
        let feasible: Vec<usize> = (0..done.len())
            .filter(|i| done[*i].value.is_some())
            .collect();
        assert!(feasible.len() >= 2, "{done:?}");
        let upto = feasible[1] + 1;
        let running: Vec<Config> = ps[upto..].iter().map(|p| p.config.clone()).collect();
        let next = opt.propose_batch(&done[..upto], &running).unwrap().unwrap();
        assert!(!next.note.contains("space fill"), "{}", next.note);
        let running: Vec<Config> = ps[upto - 1..].iter().map(|p| p.config.clone()).collect();
        let early = opt
            .propose_batch(&done[..upto - 1], &running)
            .unwrap()
            .unwrap();
        assert!(
            early.note.contains("space fill") && early.note.contains("1 feasible so far"),
            "{}",
            early.note
        );
        // Nothing running, the same one feasible result: the sequential model proposes.
        let seq = opt.propose(&done[..upto - 1]).unwrap();
        assert!(!seq.note.contains("space fill"), "{}", seq.note);
        // With nothing running there is no fill, nothing feasible though: the sequential
        // study is unchanged.
        let crashed: Vec<Obs> = ps[..1 + n]
            .iter()
            .map(|p| Obs {
                value: None,
                failed: true,
                measured: None,
                ..evaluate(&p.config)
            })
            .collect();
        let alone = opt.propose(&crashed).unwrap();
        assert!(!alone.note.contains("space fill"), "{}", alone.note);
        // A fill never repeats a trial that ran or runs.
        assert!(fills
            .iter()
            .all(|p| !ps[..1 + n].iter().any(|q| q.config == p.config)));
    }
}

#[test]
fn the_gps_expected_improvement_with_trials_running_does_not_collapse_near_them() {
    // The convergence rule reads a trial's expected improvement. With the best region's
    // points running and believed, the EI there collapses (to about 0.6 of the sequential
    // one on this landscape); the study's, the finished trials' own, must not, or a parallel
    // study would stop while that region is still being measured.
    for seed in 0..3 {
        let h = run(Algorithm::Gp, seed, 10);
        let mut gp = gp::Gp::new(toy(), seed, Plan::budget(20));
        let alone = gp.propose(&h).unwrap();
        let ei = alone.expected_improvement.expect("the GP says its EI");
        // The sequential proposal and its neighbours all run.
        let mut running = vec![alone.config.clone()];
        for dx in [-0.04, -0.02, 0.02, 0.04] {
            let mut c = alone.config.clone();
            let x = (num(&c, "x") + dx).clamp(0.0, 1.0);
            c.insert("x".into(), Value::Float(x));
            running.push(c);
        }
        let next = gp.propose_batch(&h, &running).unwrap().unwrap();
        let here: f64 = next
            .note
            .split("here ")
            .nth(1)
            .and_then(|t| t.split('%').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("seed {seed}: {}", next.note));
        let said = next.expected_improvement.unwrap();
        assert!(
            said >= 0.8 * ei,
            "seed {seed}: {said} against {ei} alone ({})",
            next.note
        );
        // The premise: believed, it collapses.
        assert!(
            here < 0.8 * 100.0 * ei,
            "seed {seed}: the believed EI {here}% against {ei} alone"
        );
    }
}
