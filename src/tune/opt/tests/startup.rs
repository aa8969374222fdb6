//! The start-up after the workload's prior point: back-offs of the batch cap under a
//! per-token latency limit, and the memory-edge point.

use super::*;

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

#[test]
fn parallel_slots_spend_the_wait_for_the_workloads_point_on_a_ladder_of_its_cap_then_back_off_from_it(
) {
    let plan = Plan {
        budget: 16,
        cap: Some("y".into()),
        ..priors(0.7, 4.0, 1)
    };
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        let n = startup_trials(kind, &toy(), &plan, 0);
        let mut opt = make(kind, &toy(), 0, &plan);
        // Every slot starts at once: the defaults, the workload's point, the design, then
        // (no trial has finished, the back-off has nothing to read) the cap's ladder.
        let mut running: Vec<Config> = Vec::new();
        let mut notes = Vec::new();
        for _ in 0..(1 + n + 4) {
            let p = opt.propose_batch(&[], &running).unwrap().unwrap();
            notes.push(p.note.clone());
            running.push(p.config);
        }
        let point = running[1].clone();
        assert!(notes[1].contains("the workload's prior"), "{notes:?}");
        assert_eq!(num(&point, "y"), 16.0);
        let ladder: Vec<f64> = running[1 + n..].iter().map(|c| num(c, "y")).collect();
        assert_eq!(ladder, [11.0, 8.0, 5.0, 4.0], "{notes:?}");
        for (c, note) in running[1 + n..].iter().zip(&notes[1 + n..]) {
            assert!(note.contains("batch ladder"), "{note}");
            let mut c = c.clone();
            c.insert("y".into(), Value::Int(16));
            assert_eq!(c, point, "a ladder step moves the cap alone");
        }
        // The ladder spent, nothing feasible yet: the space fill, elsewhere.
        let p = opt.propose_batch(&[], &running).unwrap().unwrap();
        assert!(p.note.contains("space fill"), "{}", p.note);
        assert!(!running.contains(&p.config));
        // The workload's point finishes over its limit while the rest still run: the next
        // slot gets the back-off it implies (16 -> 12, as a sequential study's).
        let history = vec![decode_bound(&running[0]), decode_bound(&point)];
        let still: Vec<Config> = running[2..].to_vec();
        let p = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(p.note.contains("back-off: y 16 -> 12"), "{}", p.note);
        assert!(!p.note.contains("bracket"), "{}", p.note);
        // While that step runs, the next slot brackets it: of 12.4 sequences aimed at ±3.5%
        // and ±7%, only +7% (13) is neither the step's 12 nor the ladder's 11, which runs;
        // once that runs too, no more back-off.
        let mut still = still;
        still.push(p.config.clone());
        let q = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(q.note.contains("back-off: y 16 -> 13"), "{}", q.note);
        assert!(q.note.contains("bracket +7.0%"), "{}", q.note);
        still.push(q.config);
        let r = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(!r.note.contains("back-off"), "{}", r.note);
        // Once a ladder step finished within the limit, no back-off below it.
        let mut history = history;
        let fits = running[1 + n + 1].clone(); // y = 8: 7.2 at once, 17.2 ms
        history.push(decode_bound(&fits));
        let still: Vec<Config> = running[2..]
            .iter()
            .filter(|c| **c != fits)
            .cloned()
            .collect();
        let p = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(!p.note.contains("back-off"), "{}", p.note);
        assert!(!p.note.contains("batch ladder"), "{}", p.note);
    }
}

#[test]
fn an_edge_taken_beside_a_point_that_misses_its_limit_does_not_stand_for_the_feasible_bases() {
    let space = Space::parse(MEMORY, "memory.toml").unwrap();
    // `other` as the batch cap: a lower one is the back-off.
    let plan = Plan {
        cap: Some("other".into()),
        ..memory_plan(&space, 12)
    };
    let eval = memory_bound(0.965);
    let missed = |c: &Config| Obs {
        value: None,
        failed: false,
        slack: vec![Some(0.2)],
        ..eval(c)
    };
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        let n = startup_trials(kind, &space, &plan, 0);
        let mut opt = make(kind, &space, 0, &plan);
        let mut running: Vec<Config> = Vec::new();
        for _ in 0..(1 + n) {
            let p = opt.propose_batch(&[], &running).unwrap().unwrap();
            running.push(p.config);
        }
        let (point, edge) = (running[1].clone(), running[2].clone());
        assert_eq!(num(&edge, "frac"), 0.95, "the edge ran beside the point");
        // The point and its edge both miss the latency limit; a back-off of the point fits.
        let mut base = point.clone();
        base.insert("other".into(), Value::Int(num(&point, "other") as i64 - 1));
        let history = vec![
            eval(&running[0]),
            missed(&point),
            missed(&edge),
            eval(&base),
        ];
        let still = vec![running[3].clone()];
        let p = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(
            p.note.contains("memory edge"),
            "{}: {}",
            kind.name(),
            p.note
        );
        let mut want = edge.clone();
        want.insert("other".into(), base["other"].clone());
        assert_eq!(p.config, want, "the edge at the feasible base's cap");
        // An edge that ran feasible at another cap is the same edge: not again.
        let history = vec![eval(&running[0]), eval(&point), eval(&edge), eval(&base)];
        let p = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(
            !p.note.contains("memory edge"),
            "{}: {}",
            kind.name(),
            p.note
        );
    }
}

#[test]
fn with_parallel_trials_the_memory_edge_runs_beside_the_workloads_point_and_once() {
    let space = Space::parse(MEMORY, "memory.toml").unwrap();
    let plan = memory_plan(&space, 12);
    for kind in [Algorithm::Gp, Algorithm::Tpe] {
        let n = startup_trials(kind, &space, &plan, 0);
        assert!(n >= 3);
        // Room for the edge. The defaults, the workload's point, its edge (it does not wait
        // for the point's result) and the rest of the design start at once: the edge takes a
        // design point's place, as it does sequentially.
        let eval = memory_bound(0.965);
        let mut opt = make(kind, &space, 0, &plan);
        let mut running: Vec<Config> = Vec::new();
        let mut notes = Vec::new();
        for _ in 0..(1 + n) {
            let p = opt.propose_batch(&[], &running).unwrap().unwrap();
            notes.push(p.note);
            running.push(p.config);
        }
        assert!(notes[1].contains("workload's prior"), "{notes:?}");
        assert!(
            notes[2].contains("memory edge")
                && notes[2].contains("while the workload's point runs"),
            "{}: {notes:?}",
            kind.name()
        );
        let (point, edge) = (running[1].clone(), running[2].clone());
        assert_eq!((num(&edge, "frac"), num(&edge, "chunk")), (0.95, 2048.0));
        assert_eq!(edge["other"], point["other"], "only the edge's knobs move");
        assert!(
            notes[3..].iter().all(|n| n.contains("start-up design")),
            "the design after it: {notes:?}"
        );
        // The point is read (feasible, the best of its line): its edge is the one that runs,
        // so no other; nor once the edge has finished.
        let mut history = vec![eval(&running[0]), eval(&point)];
        let still: Vec<Config> = running[2..].to_vec();
        let next = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(!next.note.contains("memory edge"), "{}", next.note);
        history.push(eval(&edge));
        let still: Vec<Config> = running[3..].to_vec();
        let next = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(!next.note.contains("memory edge"), "{}", next.note);

        // No room for it: the edge is refused while the point still runs, and the next slot
        // measures half-way back, from the point still.
        let eval = memory_bound(0.93);
        let history = vec![eval(&running[0]), eval(&edge)];
        assert!(history[1].failed);
        let still: Vec<Config> = [&running[1]]
            .into_iter()
            .chain(&running[3..])
            .cloned()
            .collect();
        let mut opt = make(kind, &space, 0, &plan);
        let half = opt.propose_batch(&history, &still).unwrap().unwrap();
        assert!(half.note.contains("half-way back"), "{}", half.note);
        assert!((num(&half.config, "frac") - 0.9125).abs() < 1e-3);
    }
}
