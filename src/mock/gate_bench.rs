//! `servetune gate-bench`: the gate's error rates by simulation (issue 20's A/A and A/B
//! tables). Each virtual study is the re-measurement as `tune::study` runs it: the defaults
//! and one candidate measured in interleaved rounds, the gate (`decide::decide`, the code a
//! study runs) asked after every round from `repeats` on, the study stopping at the first look
//! that leaves nothing pending or at `max_repeats`. A run's reading is the arm's true value
//! times a factor shared by the round (the machine's drift) times its own noise.
//!
//! A/A (the candidate is the defaults) counts false recommendations: the error the gate
//! promises to keep at `decide::ALPHA`. A/B (the candidate faster by a given share) counts
//! recommendations: the power at the shipped round caps. Rows compare the per-look level a
//! study uses (`decide::alpha_per_look`) with the old one (2.5% at every look).
//!
//! The guard table counts the other error a look can make: a candidate clearly faster (+20%)
//! whose guard (mean TTFT) is worse by exactly the tolerance, so that "within the tolerance"
//! is false and every recommendation of it is an error. A check read at 95% after every round
//! passes it more often than 2.5%; read at the level per look, it does not (issue 20, item 5).

use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use crate::tune::decide::{self, Input, Pending, Rules};
use crate::tune::eval::Measurement;
use crate::tune::records::{TrialKind, TrialRecord, TrialStatus};
use crate::tune::spec::ObjectiveMetric;

pub struct GateOptions {
    /// Virtual studies per cell.
    pub studies: usize,
    /// A run's own noise, relative (0.05: 5% standard deviation).
    pub sd: f64,
    /// The machine's drift shared by the runs of a round, relative.
    pub drift: f64,
    pub seed: u64,
}

/// One way of running the gate: its rounds and its level per look.
struct Design {
    name: String,
    repeats: u32,
    max_repeats: u32,
    alpha: f64,
}

/// The gains of the A/B columns.
const GAINS: [f64; 3] = [0.05, 0.10, 0.20];

/// The candidate's gain in the guard rows: large enough that the gain test passes at the
/// first look, so that the guard alone decides.
const GUARDED_GAIN: f64 = 0.20;

fn trial(seq: u32, kind: TrialKind, v: f64, ttft: f64) -> TrialRecord {
    let m = Measurement {
        latencies_ms: [("ttft:mean".to_owned(), ttft)].into_iter().collect(),
        workload: "main".into(),
        num_prompts: 100,
        completed: 100,
        success_rate: 1.0,
        total_token_throughput: v,
        output_throughput: v / 2.0,
        request_throughput: v / 100.0,
        ..Default::default()
    };
    TrialRecord {
        study: "gate-bench".into(),
        seq,
        kind,
        config: Default::default(),
        defaults: false,
        note: String::new(),
        expected_improvement: None,
        status: TrialStatus::Ok,
        engine: Some("mock".into()),
        command: None,
        engine_version: None,
        hardware: String::new(),
        screen: Some(m.clone()),
        objective: Some(v),
        screen_objective: Some(v),
        full: Some(m),
        promoted: true,
        failure: None,
        early_stop: None,
        telemetry: None,
        started: 0.0,
        ended: Some(1.0),
        bench_s: 1.0,
        saved_s: 0.0,
        attempts: 1,
        stopped: 0,
        startup_s: None,
        retried_after: None,
        slot: None,
    }
}

/// One virtual study: whether it recommended the candidate, and after how many rounds. The
/// candidate's objective is `1 + gain` times the defaults', its mean TTFT `1 + ttft_loss`
/// times theirs (a guard reads it when `rules.guards` names `ttft:mean`).
fn study(
    rules: &Rules,
    d: &Design,
    (gain, ttft_loss): (f64, f64),
    o: &GateOptions,
    rng: &mut StdRng,
) -> (bool, u32) {
    let mut n = || -> f64 { StandardNormal.sample(&mut *rng) };
    let arms = [
        (0u32, 100.0, 50.0),
        (1, 100.0 * (1.0 + gain), 50.0 * (1.0 + ttft_loss)),
    ];
    let mut trials = vec![
        trial(0, TrialKind::Search, arms[0].1, arms[0].2),
        trial(1, TrialKind::Search, arms[1].1, arms[1].2),
    ];
    let workloads = vec!["main".to_owned()];
    for round in 0..d.max_repeats {
        let f = 1.0 + o.drift * n();
        for (arm, truth, ttft) in arms {
            let v = truth * f * (1.0 + o.sd * n());
            let t = ttft / f * (1.0 + o.sd * n());
            let seq = trials.len() as u32 + 100;
            trials.push(trial(
                seq,
                TrialKind::Remeasure {
                    round,
                    candidate: arm,
                },
                v.max(1e-6),
                t.max(1e-6),
            ));
        }
        let rounds = round + 1;
        if rounds < d.repeats {
            continue;
        }
        let last = rounds >= d.max_repeats;
        let decision = decide::decide(
            rules,
            &Input {
                workloads: &workloads,
                baseline: &trials[0],
                candidates: &[1],
                trials: &trials,
                last,
                open: &[],
            },
        );
        if decision.pending != Pending::Remeasure || last {
            return (decision.recommended.is_some(), rounds);
        }
    }
    (false, d.max_repeats)
}

/// The gate's rules for a simulation at `alpha` per look, with no SLOs. Without guards the
/// gain test alone decides, the case with the most recommendations (a guard can only block
/// one); with the mean-TTFT guard, the guard rows.
fn rules(alpha: f64, guarded: bool) -> Rules {
    Rules {
        metric: ObjectiveMetric::TotalTokenThroughput,
        min_success_rate: 0.0,
        limits: Vec::new(),
        tolerance: 0.05,
        guards: if guarded {
            vec![decide::Guard {
                key: "ttft:mean".into(),
            }]
        } else {
            Vec::new()
        },
        alpha,
        max_foreign_cores: f64::INFINITY,
    }
}

/// Runs the simulation and returns the table (Markdown).
pub fn run(o: &GateOptions) -> String {
    let mut designs = Vec::new();
    for (min, max) in [(3, 5), (3, 3), (2, 6)] {
        designs.push(Design {
            name: format!("{min} to {max} rounds, 2.5% at every look (before)"),
            repeats: min,
            max_repeats: max,
            alpha: decide::ALPHA,
        });
        designs.push(Design {
            name: format!("{min} to {max} rounds, per-look level (shipped)"),
            repeats: min,
            max_repeats: max,
            alpha: decide::alpha_per_look(min, max),
        });
    }
    let t0 = std::time::Instant::now();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| design | level per look | A/A: false recommendations | mean rounds (A/A) | {} |",
        GAINS
            .iter()
            .map(|g| format!("A/B +{:.0}%: recommended", 100.0 * g))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(out, "|---|---|---|---|{}", "---|".repeat(GAINS.len()));
    for (i, d) in designs.iter().enumerate() {
        let rules = rules(d.alpha, false);
        let mut rng = StdRng::seed_from_u64(o.seed.wrapping_add(i as u64 * 7919));
        let rate = |gain: f64, rng: &mut StdRng| {
            let (mut yes, mut rounds) = (0usize, 0u64);
            for _ in 0..o.studies {
                let (r, n) = study(&rules, d, (gain, 0.0), o, rng);
                yes += r as usize;
                rounds += u64::from(n);
            }
            (
                yes as f64 / o.studies as f64,
                rounds as f64 / o.studies as f64,
            )
        };
        let (aa, rounds) = rate(0.0, &mut rng);
        // The rate's binomial standard error, to read the table against 2.5%.
        let se = (aa * (1.0 - aa) / o.studies as f64).sqrt();
        let ab: Vec<String> = GAINS
            .iter()
            .map(|g| format!("{:.1}%", 100.0 * rate(*g, &mut rng).0))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {:.2}% | {:.2}% (± {:.2}) | {rounds:.2} | {} |",
            d.name,
            100.0 * d.alpha,
            100.0 * aa,
            100.0 * se,
            ab.join(" | ")
        );
    }
    let _ = writeln!(
        out,
        "\n| design | level per look | guard worse by the tolerance: recommended (false) | mean rounds |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for (i, d) in designs.iter().enumerate() {
        let rules = rules(d.alpha, true);
        let mut rng = StdRng::seed_from_u64(o.seed.wrapping_add(1 + i as u64 * 104_729));
        let (mut yes, mut rounds) = (0usize, 0u64);
        for _ in 0..o.studies {
            let (r, n) = study(&rules, d, (GUARDED_GAIN, rules.tolerance), o, &mut rng);
            yes += r as usize;
            rounds += u64::from(n);
        }
        let rate = yes as f64 / o.studies as f64;
        let se = (rate * (1.0 - rate) / o.studies as f64).sqrt();
        let _ = writeln!(
            out,
            "| {} | {:.2}% | {:.2}% (± {:.2}) | {:.2} |",
            d.name,
            100.0 * d.alpha,
            100.0 * rate,
            100.0 * se,
            rounds as f64 / o.studies as f64
        );
    }
    let _ = writeln!(
        out,
        "\n({} virtual studies per cell; guard rows: the candidate +{:.0}% on the objective, its mean TTFT worse by exactly the tolerance; a run's noise {:.0}%, the round's drift {:.0}%; seed {}; {:.1} s)",
        o.studies,
        100.0 * GUARDED_GAIN,
        100.0 * o.sd,
        100.0 * o.drift,
        o.seed,
        t0.elapsed().as_secs_f64()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_shipped_level_a_candidate_no_better_than_the_defaults_is_rarely_recommended() {
        // 2,000 A/A studies of 3 to 5 rounds: the shipped level stays near or under 2.5%
        // (3.2% allows for the simulation's own error, about 0.35 points), where 2.5% at
        // every look recommends clearly more often.
        let o = GateOptions {
            studies: 2000,
            sd: 0.05,
            drift: 0.0,
            seed: 11,
        };
        let count = |alpha: f64| {
            let d = Design {
                name: String::new(),
                repeats: 3,
                max_repeats: 5,
                alpha,
            };
            let rules = rules(alpha, false);
            let mut rng = StdRng::seed_from_u64(3);
            (0..o.studies)
                .filter(|_| study(&rules, &d, (0.0, 0.0), &o, &mut rng).0)
                .count()
        };
        let shipped = count(decide::alpha_per_look(3, 5));
        let before = count(decide::ALPHA);
        assert!(shipped <= 64, "{shipped} of 2000");
        assert!(before > shipped + 20, "before {before}, shipped {shipped}");
    }

    /// Issue 20, item 5: a guard read at 95% after each of rounds 3, 4 and 5 passes a
    /// candidate whose mean TTFT is worse by exactly the tolerance more often than 2.5%; read
    /// at the level per look, at most 2.5%.
    #[test]
    fn a_guard_read_after_every_round_passes_a_loss_at_the_tolerance_at_most_2_5_percent() {
        let o = GateOptions {
            studies: 4000,
            sd: 0.05,
            drift: 0.0,
            seed: 5,
        };
        let d = Design {
            name: String::new(),
            repeats: 3,
            max_repeats: 5,
            alpha: decide::alpha_per_look(3, 5),
        };
        let count = |check_alpha: f64| {
            // `rules.alpha` sets the gain test's level too, but a +20% gain over 5% noise
            // passes it at the first look at either level: the guard decides.
            let mut rules = rules(d.alpha, true);
            rules.alpha = check_alpha;
            let mut rng = StdRng::seed_from_u64(9);
            (0..o.studies)
                .filter(|_| study(&rules, &d, (GUARDED_GAIN, rules.tolerance), &o, &mut rng).0)
                .count()
        };
        let shipped = count(d.alpha);
        let at_95 = count(decide::ALPHA);
        // 2.5% of 4,000 is 100 (the shipped rate reads about 1.8%; the simulation's standard
        // error is about 10).
        assert!(shipped <= 100, "shipped: {shipped} of 4000");
        assert!(at_95 > 110, "at 95%: {at_95} of 4000");
    }

    #[test]
    fn the_level_per_look_follows_the_number_of_looks() {
        assert_eq!(decide::alpha_per_look(3, 3), decide::ALPHA);
        assert_eq!(decide::alpha_per_look(3, 5), 0.0110);
        assert_eq!(decide::alpha_per_look(0, 1), 0.025);
        assert!((decide::alpha_per_look(1, 20) - decide::ALPHA / 20.0).abs() < 1e-12);
        assert!(decide::alpha_per_look(2, 6) < decide::alpha_per_look(3, 5));
    }
}
