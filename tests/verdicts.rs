//! The verdict under noise, disturbances and faults, in virtual time: the mock engine's
//! performance model (`SimEvaluator`) behind a wrapper that disturbs chosen runs (a CPU hog
//! during one trial), injects a transient failed request, or fails to start an engine for a
//! reason that is servetune's own (infrastructure). Each test fails on the code before the
//! verdict gate (`tune::decide`) and the fixes of the verdicts issues.
//!
//! Issue 20 ("the gate says yes when it should and only then"), item by item, with the test
//! that fails without each fix (here unless another file is named):
//! 1. infeasible defaults: `tune::decide`'s
//!    `defaults_just_over_a_limit_are_not_infeasible_and_a_slower_candidate_is_not_recommended`
//!    and `against_defaults_that_surely_miss_a_limit_a_candidate_may_not_lose_beyond_the_tolerance`;
//! 2. "failed to start": `defaults_that_crash_once_run_again_and_are_not_taken_as_unable_to_start`,
//!    `a_candidates_round_run_that_crashes_once_runs_again_and_the_round_counts`,
//!    `a_candidates_round_run_that_crashes_twice_fails_without_a_third_attempt`, and
//!    `tests/engines.rs`'s `an_engine_that_lost_the_race_for_its_port_is_started_again_on_another`;
//! 3. the reference: `in_a_study_of_two_engines_every_engines_defaults_are_remeasured_and_the_best_is_the_reference`;
//! 4. mixed units: `tune::decide`'s `a_round_without_the_objective_moves_the_whole_comparison_to_the_fallback`;
//! 5. alpha spending: `mock::gate_bench`'s
//!    `at_the_shipped_level_a_candidate_no_better_than_the_defaults_is_rarely_recommended`
//!    (the gain test) and
//!    `a_guard_read_after_every_round_passes_a_loss_at_the_tolerance_at_most_2_5_percent`
//!    (the checks, read at the level per look);
//! 6. the ITL abort: `bench::abort`'s `itl_limit_tests_the_pooled_gaps_in_dispatch_order`;
//! 7. guards that cannot be decided: `tests/tune.rs`'s
//!    `a_guard_that_cannot_be_decided_at_the_workloads_size_is_refused_at_the_start` and
//!    `the_default_guard_is_mean_ttft_not_the_tpot_the_objective_trades`;
//! 8. defaults that cannot start: `tune::decide`'s
//!    `defaults_that_cannot_start_leave_the_best_feasible_candidate_judged_on_its_constraints`;
//! 9. the runner-up: `tune::decide`'s
//!    `a_runner_up_that_passes_every_check_is_recommended_when_the_leader_fails_a_guard` and
//!    `a_runner_up_is_validated_in_rounds_of_its_own_when_the_leader_is_passed_over_at_the_cap`;
//! 10. a run stopped at one failure: `a_run_stopped_at_its_first_failed_request_is_confirmed_whatever_it_read`;
//! 11. the wording: `tune::decide`'s `with_no_feasible_candidate_the_verdict_says_so_and_claims_no_comparison`;
//!     the daemon's time left: `daemon::views`'s `the_time_left_does_not_count_the_time_a_study_was_paused`;
//! 12. the machine's round: `tune::decide`'s
//!     `a_round_in_which_the_defaults_fail_too_is_the_machines_and_is_set_aside`, on the real
//!     engine `tests/vllm.rs`'s `a_round_the_machine_fails_for_both_arms_is_set_aside_and_rerun`,
//!     and `tune`'s `a_cpu_study_of_vllm_without_a_kv_cache_size_is_warned_of_its_memory_at_start`.

// These tests run the mock engine (the `mock` feature, on by default).
#![cfg(feature = "mock")]

use std::path::{Path, PathBuf};

use servetune::mock::evaluator::{SimEvaluator, SimWorkload};
use servetune::mock::profile::{default_version, Machine};
use servetune::mock::sim::{Hardware, ModelSpec};
use servetune::space::{Config, Space};
use servetune::store::Store;
use servetune::telemetry::TelemetrySummary;
use servetune::tune::eval::{Evaluator, Measurement, RunSpec, Started, TrialFailure};
use servetune::tune::records::{BestRecord, Phase, Records, TrialKind, TrialRecord, TrialStatus};
use servetune::tune::spec::Study;
use servetune::tune::study::Runner;
use servetune::tune::TuneError;

fn spaces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces")
}

/// What to do to a run: `(run index, the engine's config, the run) → changed run`.
type Disturb = Box<dyn FnMut(usize, &Config, &RunSpec, &mut Measurement) + Send>;

/// A `SimEvaluator` with injected faults.
struct Faulty {
    inner: SimEvaluator,
    current: Option<Config>,
    runs: usize,
    starts: usize,
    disturb: Disturb,
    /// Starts (by index) that fail as servetune's own fault.
    infra_fail_starts: Vec<usize>,
    /// Starts that die with an unclassified crash (no log line proves a refusal).
    crash_starts: Vec<usize>,
    /// `(from, n)`: from this start on, the first configuration other than the defaults to
    /// start dies with an unclassified crash, for its next `n` starts.
    crash_a_candidate: Option<(usize, usize)>,
    crashed: Option<Config>,
    /// How often the study waited for the machine to be quiet.
    settles: usize,
}

impl Evaluator for Faulty {
    async fn start(&mut self, cfg: &Config, dir: &Path) -> Result<Started, TrialFailure> {
        let i = self.starts;
        self.starts += 1;
        if self.infra_fail_starts.contains(&i) {
            return Err(TrialFailure {
                class: "infrastructure".into(),
                evidence: "refusing to start: 1 foreign process holds the GPU".into(),
                log_excerpt: String::new(),
            });
        }
        let candidate_crash = match self.crash_a_candidate {
            Some((from, left))
                if left > 0
                    && i >= from
                    && *cfg != self.inner.space.defaults()
                    && self.crashed.as_ref().is_none_or(|c| c == cfg) =>
            {
                self.crashed = Some(cfg.clone());
                self.crash_a_candidate = Some((from, left - 1));
                true
            }
            _ => false,
        };
        if self.crash_starts.contains(&i) || candidate_crash {
            return Err(TrialFailure {
                class: "crash".into(),
                evidence: "the engine exited (signal 11) during start-up".into(),
                log_excerpt: String::new(),
            });
        }
        self.current = Some(cfg.clone());
        self.inner.start(cfg, dir).await
    }
    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        let mut m = self.inner.run(spec).await?;
        let i = self.runs;
        self.runs += 1;
        let cfg = self.current.clone().unwrap_or_default();
        (self.disturb)(i, &cfg, spec, &mut m);
        Ok(m)
    }
    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        self.current = None;
        self.inner.stop().await
    }
    fn workloads(&self) -> Vec<String> {
        self.inner.workloads()
    }
    async fn settle(&mut self, _max_cores: f64, _limit: std::time::Duration) -> Option<f64> {
        self.settles += 1;
        Some(0.0)
    }
}

fn workload(name: &str, n: usize, conc: usize) -> SimWorkload {
    SimWorkload {
        name: name.into(),
        num_prompts: n,
        input_len: 512,
        output_len: 128,
        prefix_len: 0,
        request_rate: f64::INFINITY,
        max_concurrency: Some(conc),
    }
}

fn text(name: &str, params: &str, slo: &str, extra: &str) -> String {
    format!(
        r#"
[study]
name = "{name}"
model = "mock-8b"
engines = "vllm"
platform = "gpu"                  # the mock engine imitates vLLM on a GPU
optimizer = "tpe"
seed = 5
space_dir = "{spaces}"
params = [{params}]

[constraints]
min_success_rate = 0.99
slo = [{slo}]

[budget]
trials = 14

[remeasure]
top = 2
repeats = 3
max_repeats = 5

{extra}

[[workload]]
name = "main"
args = ["--dataset-name", "random", "--num-prompts", "400", "--max-concurrency", "32", "--tokenizer", "words"]
"#,
        spaces = spaces_dir().display()
    )
}

fn runner(store: &Store, text: &str, disturb: Disturb) -> Runner<Faulty> {
    let study = Study::parse(text, Path::new("v.toml")).unwrap();
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let space = servetune::tune::restrict(space, study.spec.study.params.as_deref()).unwrap();
    let machine = Machine {
        hw: Hardware::preset("a100", 16).unwrap(),
        model: ModelSpec::preset("8b").unwrap(),
        version: default_version("vllm").to_owned(),
    };
    let mut inner = SimEvaluator::new(
        space.clone(),
        machine,
        vec![workload("main", 400, 32)],
        0.02,
        9,
    );
    inner.limits = study.limits.clone();
    let eval = Faulty {
        inner,
        current: None,
        runs: 0,
        starts: 0,
        disturb,
        infra_fail_starts: Vec::new(),
        crash_starts: Vec::new(),
        crash_a_candidate: None,
        crashed: None,
        settles: 0,
    };
    let dir = tempfile::tempdir().unwrap().keep();
    Runner::new(store.clone(), study, space, eval, dir)
}

fn none() -> Disturb {
    Box::new(|_, _, _, _| {})
}

/// The defaults' mean TPOT on the main workload, undisturbed.
async fn defaults_tpot(store: &Store) -> f64 {
    let mut r = runner(
        store,
        &text("probe", "\"enable_prefix_caching\"", "", ""),
        none(),
    );
    let d = r.space.defaults();
    r.eval.start(&d, Path::new("/nonexistent")).await.unwrap();
    let m = r
        .eval
        .run(&RunSpec {
            workload: 0,
            fraction: 1.0,
            rate: None,
            abort: false,
            seed_offset: 0,
        })
        .await
        .unwrap();
    m.latencies_ms["tpot:mean"]
}

fn search(ts: &[TrialRecord]) -> Vec<&TrialRecord> {
    ts.iter().filter(|t| t.kind == TrialKind::Search).collect()
}

#[tokio::test]
async fn a_cpu_hog_during_the_defaults_run_does_not_make_a_loss_the_verdict() {
    // A space where nothing matters on this load (prefix caching, no shared prefix): the
    // right verdict is "keep the defaults". A hog during the defaults' search run makes it
    // read 40% slower with TPOT over the SLO; before the fix the defaults were then never
    // measured again and the first candidate that met the SLO was recommended against that
    // one run.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tpot = defaults_tpot(&store).await;
    let slo = format!("\"tpot:mean:{:.1}\"", tpot * 1.25);
    let t = text(
        "hog",
        "\"enable_prefix_caching\", \"block_size\"",
        &slo,
        "[screening]\nfraction = 1\n",
    );
    let hogged = Box::new(|i: usize, _: &Config, _: &RunSpec, m: &mut Measurement| {
        if i == 0 {
            m.total_token_throughput *= 0.6;
            m.output_throughput *= 0.6;
            for (k, v) in m.latencies_ms.iter_mut() {
                if k.starts_with("tpot") || k.starts_with("itl") {
                    *v *= 1.5;
                }
            }
        }
    });
    let mut r = runner(&store, &t, hogged);
    let rec = r.run().await.unwrap();
    let o = rec.outcome.unwrap();
    let ts = Records::new(store.clone()).trials("hog").unwrap();
    assert_eq!(
        search(&ts)[0].status,
        TrialStatus::Infeasible,
        "the hog hit"
    );
    // The defaults ran in every re-measurement round, whatever their search run said.
    let base_rounds = ts
        .iter()
        .filter(|t| matches!(t.kind, TrialKind::Remeasure { candidate: 0, .. }))
        .count();
    assert!(base_rounds >= 3, "{base_rounds} rounds of the defaults");
    assert_eq!(
        o.baseline_infeasible, None,
        "pooled, the defaults meet the SLO"
    );
    assert_eq!(o.recommended, None, "{}", o.verdict);
    assert!(o.verdict.starts_with("keep the defaults"), "{}", o.verdict);
    // The report's conclusion table is about the leader, and does not call it recommended
    // (it said "recommended #0" for a kept-defaults study on the real engine).
    let leader = o
        .leader
        .expect("a candidate was re-measured against the defaults");
    let md = servetune::report::render(&store, "hog", "md", None).unwrap();
    assert!(
        md.contains(&format!("| candidate #{leader} (not recommended) |")),
        "{md}"
    );
    assert!(!md.contains("| recommended #"), "{md}");
}

#[tokio::test]
async fn a_run_disturbed_by_foreign_load_is_run_again_and_the_rerun_counts() {
    // The same hog on the defaults' search run, now seen: the run reports 1.5 foreign cores
    // (`telemetry::host`), so the study runs it again once the machine is quiet, and the
    // defaults' trial is recorded from the quiet run (feasible, at its undisturbed speed).
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let tpot = defaults_tpot(&store).await;
    let slo = format!("\"tpot:mean:{:.1}\"", tpot * 1.25);
    let t = text(
        "seen",
        "\"enable_prefix_caching\", \"block_size\"",
        &slo,
        "[screening]\nfraction = 1\n[budget]\ntrials = 4\n",
    )
    .replace("[budget]\ntrials = 14\n", "");
    let hogged = Box::new(|i: usize, _: &Config, _: &RunSpec, m: &mut Measurement| {
        m.foreign_cores = Some(0.02);
        if i == 0 {
            m.foreign_cores = Some(1.5);
            m.total_token_throughput *= 0.6;
            for (k, v) in m.latencies_ms.iter_mut() {
                if k.starts_with("tpot") {
                    *v *= 1.5;
                }
            }
        }
    });
    let mut r = runner(&store, &t, hogged);
    r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("seen").unwrap();
    let d = search(&ts)[0];
    assert_eq!(d.status, TrialStatus::Ok, "{:?}", d.early_stop);
    let full = d.full.as_ref().unwrap();
    assert!(
        full.replaces
            .as_deref()
            .unwrap_or("")
            .contains("other processes kept 1.50 cores busy"),
        "{:?}",
        full.replaces
    );
    assert_eq!(full.foreign_cores, Some(0.02));
    assert!(
        full.latencies_ms["tpot:mean"] < tpot * 1.1,
        "the quiet run counts"
    );
    assert_eq!(
        r.eval.settles, 1,
        "it waited for quiet once, before the rerun"
    );
}

#[tokio::test]
async fn a_study_run_beside_a_persistent_hog_recommends_nothing() {
    // Another process keeps the machine busy for the whole study, and on the busy machine the
    // other configurations read 50% faster than the defaults (as fewer threads do on a
    // half-busy CPU). Every run reports the foreign load; no verdict may come of it.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text(
        "busy",
        "\"enable_prefix_caching\", \"block_size\"",
        "",
        "[foreign_load]\nsettle_s = 0\n",
    );
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let moved = |defaults: Config| -> Disturb {
        Box::new(
            move |_: usize, cfg: &Config, _: &RunSpec, m: &mut Measurement| {
                m.foreign_cores = Some(1.0);
                if cfg.get("block_size") != defaults.get("block_size")
                    || cfg.get("enable_prefix_caching") != defaults.get("enable_prefix_caching")
                {
                    m.total_token_throughput *= 1.5;
                }
            },
        )
    };
    let mut r = runner(&store, &t, moved(space.defaults()));
    let rec = r.run().await.unwrap();
    let o = rec.outcome.unwrap();
    assert_eq!(o.recommended, None, "{}", o.verdict);
    assert!(
        o.verdict
            .starts_with("keep the defaults: other processes kept this machine busy"),
        "{}",
        o.verdict
    );
    assert!(!o.set_aside.is_empty());
    // Control: the same study with the check off recommends the "gain" the busy machine shows.
    let off = t
        .replace("[foreign_load]\n", "[foreign_load]\nmax_cores = inf\n")
        .replace("name = \"busy\"", "name = \"busy-off\"");
    let mut r = runner(&store, &off, moved(space.defaults()));
    let o = r.run().await.unwrap().outcome.unwrap();
    assert!(o.recommended.is_some(), "{}", o.verdict);
}

#[tokio::test]
async fn one_failed_request_of_a_promising_run_is_confirmed_before_it_counts() {
    // The defaults' first run loses one request of 400 (a transport glitch). At a 99% floor
    // one failure would pass; with a 100% floor it is a miss by one request, so the run is
    // confirmed with a second one, which is clean, and the second counts.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text(
        "glitch",
        "\"enable_prefix_caching\"",
        "",
        "[screening]\nfraction = 1\n",
    )
    .replace("min_success_rate = 0.99", "min_success_rate = 1.0");
    let glitch = Box::new(|i: usize, _: &Config, _: &RunSpec, m: &mut Measurement| {
        if i == 0 {
            m.completed -= 1;
            m.failed += 1;
            m.success_rate = m.completed as f64 / (m.completed + m.failed) as f64;
            m.failures.insert("stream_interrupted".into(), 1);
        }
    });
    let mut r = runner(&store, &t, glitch);
    r.study.spec.budget.trials = 3;
    r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("glitch").unwrap();
    let base = search(&ts)[0];
    assert_eq!(base.status, TrialStatus::Ok, "{base:?}");
    let m = base.full.as_ref().unwrap();
    assert_eq!(m.failed, 0);
    assert!(
        m.replaces.as_deref().unwrap_or("").contains("narrowly"),
        "{:?}",
        m.replaces
    );
}

#[tokio::test]
async fn a_run_stopped_at_its_first_failed_request_is_confirmed_whatever_it_read() {
    // Issue 20 item 10: an unscreened search run loses one request early; with a 100% floor
    // one failure stops the run at once (the abort rule), and the truncated run reads a
    // twentieth of the throughput. Before, its
    // confirmation was asked only of runs that read as promising, which a truncated run
    // never does: the configuration was condemned by one glitch.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text(
        "stopped",
        "\"enable_prefix_caching\"",
        "",
        "[screening]\nfraction = 1\n",
    )
    .replace("min_success_rate = 0.99", "min_success_rate = 1.0");
    let glitch = Box::new(|i: usize, _: &Config, _: &RunSpec, m: &mut Measurement| {
        if i == 1 {
            m.completed = 19;
            m.failed = 1;
            m.success_rate = 0.95;
            m.total_token_throughput *= 0.05;
            m.output_throughput *= 0.05;
            m.request_throughput *= 0.05;
            m.aborted =
                Some("success rate can no longer reach 100.0%: 1 of 400 requests failed".into());
            m.failures.insert("stream_interrupted".into(), 1);
        }
    });
    let mut r = runner(&store, &t, glitch);
    r.study.spec.budget.trials = 2;
    r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("stopped").unwrap();
    let first = search(&ts)[1];
    assert_eq!(first.status, TrialStatus::Ok, "{first:?}");
    let m = first.full.as_ref().unwrap();
    assert_eq!(m.failed, 0);
    assert!(
        m.replaces
            .as_deref()
            .unwrap_or("")
            .contains("was stopped at its one failed request"),
        "{:?}",
        m.replaces
    );
}

#[tokio::test]
async fn defaults_that_crash_once_run_again_and_are_not_taken_as_unable_to_start() {
    // Issue 20 item 2: the defaults' first start dies with an unclassified crash (a port race,
    // the previous engine's memory not yet back). Before, that counted as "the defaults failed
    // to start", and every candidate was judged on its constraints alone, with nothing to
    // beat. Only a refusal the log proves counts so; the defaults run once more, and are the
    // reference.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text(
        "crash",
        "\"enable_prefix_caching\"",
        "",
        "[screening]\nfraction = 1\n",
    );
    let mut r = runner(&store, &t, none());
    r.eval.crash_starts = vec![0];
    r.study.spec.budget.trials = 3;
    r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("crash").unwrap();
    let base = search(&ts)[0];
    assert_eq!(base.status, TrialStatus::Ok, "{base:?}");
    assert!(base.objective.is_some());
    assert_eq!(
        base.retried_after.as_ref().map(|f| f.class.as_str()),
        Some("crash"),
        "{base:?}"
    );
    // The defaults were re-measured as the reference.
    assert!(ts.iter().any(
        |t| matches!(t.kind, TrialKind::Remeasure { candidate, .. } if candidate == base.seq)
    ));
    let rec = Records::new(store.clone()).study("crash").unwrap().unwrap();
    let out = rec.outcome.unwrap();
    assert!(!out.verdict.contains("failed to start"), "{}", out.verdict);
}

/// A three-trial study of `max_num_seqs` whose first candidate, from start 3 on (starts 0 to
/// 2 are the search), crashes at its next `crashes` starts: the store, the trials, and the
/// crashes left (`(3, 0)` once all happened); the directory lives as long as its handle.
async fn round_crash_study(
    name: &str,
    crashes: usize,
) -> (
    tempfile::TempDir,
    Store,
    Vec<TrialRecord>,
    Option<(usize, usize)>,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text(name, "\"max_num_seqs\"", "", "[screening]\nfraction = 1\n");
    let mut r = runner(&store, &t, none());
    r.study.spec.budget.trials = 3;
    r.eval.crash_a_candidate = Some((3, crashes));
    r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials(name).unwrap();
    (dir, store, ts, r.eval.crash_a_candidate)
}

/// Issue 20, item 2, in the rounds: a candidate's re-measurement run whose engine crashes
/// without a refusal its log proves (the defaults' run of the round did fine) runs once more,
/// and the round counts. Before, the crash made the candidate's arm fail ("the engine
/// failed"), on a failure that may well have been the machine's.
#[tokio::test]
async fn a_candidates_round_run_that_crashes_once_runs_again_and_the_round_counts() {
    let (_dir, store, ts, left) = round_crash_study("round-crash", 1).await;
    assert_eq!(left, Some((3, 0)), "no candidate run crashed");
    let retried: Vec<&TrialRecord> = ts.iter().filter(|t| t.retried_after.is_some()).collect();
    assert_eq!(retried.len(), 1, "{ts:#?}");
    let run = retried[0];
    assert!(
        matches!(run.kind, TrialKind::Remeasure { .. }),
        "{:?}",
        run.kind
    );
    assert_eq!(run.status, TrialStatus::Ok, "{run:?}");
    assert!(run.objective.is_some());
    assert!(
        ts.iter().all(|t| t.status != TrialStatus::Failed),
        "{ts:#?}"
    );
    let out = Records::new(store.clone())
        .study("round-crash")
        .unwrap()
        .unwrap()
        .outcome
        .unwrap();
    assert!(!out.verdict.contains("failed"), "{}", out.verdict);
}

/// The other half: a round's run that crashes on its second attempt too counts against its
/// arm, and is not run a third time (a third start would have succeeded here).
#[tokio::test]
async fn a_candidates_round_run_that_crashes_twice_fails_without_a_third_attempt() {
    let (_dir, _store, ts, left) = round_crash_study("round-crash-2", 2).await;
    assert_eq!(left, Some((3, 0)), "two crashes");
    let failed: Vec<&TrialRecord> = ts
        .iter()
        .filter(|t| t.status == TrialStatus::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{ts:#?}");
    let run = failed[0];
    assert!(
        matches!(run.kind, TrialKind::Remeasure { .. }),
        "{:?}",
        run.kind
    );
    assert_eq!(
        run.retried_after.as_ref().map(|f| f.class.as_str()),
        Some("crash")
    );
    assert_eq!(
        run.failure.as_ref().map(|f| f.class.as_str()),
        Some("crash")
    );
}

#[tokio::test]
async fn an_infrastructure_failure_runs_again_once_the_cause_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text("infra", "\"enable_prefix_caching\"", "", "");
    let mut r = runner(&store, &t, none());
    r.study.spec.budget.trials = 2;
    r.eval.infra_fail_starts = vec![0];
    let err = r.run().await.unwrap_err();
    assert!(matches!(err, TuneError::Infrastructure(_)), "{err}");
    let ts = Records::new(store.clone()).trials("infra").unwrap();
    assert_eq!(ts[0].status, TrialStatus::Running, "kept to run again");
    // The foreign process is gone: the study resumes and the defaults are measured.
    let mut r = runner(&store, &t, none());
    r.study.spec.budget.trials = 2;
    let rec = r.run().await.unwrap();
    assert_eq!(rec.phase, Phase::Done);
    let ts = Records::new(store.clone()).trials("infra").unwrap();
    assert_eq!(ts[0].status, TrialStatus::Ok, "{:?}", ts[0]);
    assert_eq!(ts[0].failure, None);
    assert!(ts.iter().all(|t| t.status != TrialStatus::Failed));
}

#[tokio::test]
async fn a_trial_that_kills_servetune_three_times_is_recorded_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text("oom", "\"enable_prefix_caching\"", "", "");
    let mut r = runner(&store, &t, none());
    r.study.spec.budget.trials = 3;
    let rec = r.open().unwrap();
    // Trial 0 was started three times and servetune died each time (host OOM).
    let mut t0: TrialRecord = serde_json::from_value(serde_json::json!({
        "study": rec.id, "seq": 0, "kind": "search", "config": r.space.defaults(),
        "note": "engine defaults (baseline)", "expected_improvement": null, "status": "running",
        "engine": null, "command": null, "engine_version": null, "hardware": "", "screen": null,
        "full": null, "screen_objective": null, "objective": null, "promoted": false,
        "failure": null, "early_stop": null, "telemetry": null, "started": 0.0, "ended": null,
        "bench_s": 0.0, "saved_s": 0.0, "attempts": 3
    }))
    .unwrap();
    t0.stopped = 0;
    Records::new(store.clone()).put_trial(&t0).unwrap();
    let rec = r.run().await.unwrap();
    assert_eq!(rec.phase, Phase::Done);
    let ts = Records::new(store.clone()).trials("oom").unwrap();
    assert_eq!(ts[0].status, TrialStatus::Failed);
    assert!(
        ts[0]
            .failure
            .as_ref()
            .unwrap()
            .evidence
            .contains("killed 3 times"),
        "{:?}",
        ts[0].failure
    );
    assert_eq!(ts[0].attempts, 3, "not started a fourth time");
}

#[tokio::test]
async fn min_trials_zero_and_a_paused_study_do_not_cut_the_search_short() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // min_trials = 0 and patience = 0 used to underflow (a panic in debug builds); a study
    // created long ago (paused for days) used to stop at once on its wall-time budget.
    let t = text(
        "floor",
        "\"max_num_seqs\", \"max_num_batched_tokens\"",
        "",
        "[stopping]\nmin_trials = 0\npatience = 0\n\n[budget]\ntrials = 14\nwall_time_s = 3600\n",
    )
    .replace("[budget]\ntrials = 14\n\n[remeasure]", "[remeasure]");
    let mut r = runner(&store, &t, none());
    let mut rec = r.open().unwrap();
    rec.created -= 10.0 * 86400.0;
    Records::new(store.clone()).put_study(&rec).unwrap();
    let rec = r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("floor").unwrap();
    let n = search(&ts).len() as u32;
    let plan = servetune::tune::prior::plan(&r.study, &r.space).0;
    let floor = servetune::tune::opt::convergence_floor(r.algorithm, &r.space, &plan, 0);
    assert!(
        n >= floor.min(14),
        "{n} search trials, floor {floor}: {:?}",
        rec.stop_reason
    );
    assert!(!rec.stop_reason.unwrap().contains("wall time"));
}

#[tokio::test]
async fn a_retune_with_no_significant_gain_keeps_the_proven_best() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text("keep", "\"enable_prefix_caching\"", "", "");
    let mut r = runner(&store, &t, none());
    r.study.spec.budget.trials = 3;
    // An earlier study proved a configuration for this model, node, engine and workload.
    let key = format!(
        "{}|{}|vllm@{}|main",
        r.study.model,
        "",
        default_version("vllm")
    );
    let proven = BestRecord {
        key: key.clone(),
        model: r.study.model.clone(),
        hardware: String::new(),
        engine: "vllm".into(),
        engine_version: Some(default_version("vllm").into()),
        workload: "main".into(),
        study: "earlier".into(),
        trial: 7,
        config: Config::new(),
        command: Some(servetune::space::CommandLine::parse("vllm serve proven").unwrap()),
        objective: Some(1.0),
        metric: "total token throughput (tok/s)".into(),
        improved: true,
        at: 1.0,
    };
    Records::new(store.clone()).put_best(&proven).unwrap();
    let rec = r.run().await.unwrap();
    assert_eq!(rec.outcome.unwrap().recommended, None);
    let now: BestRecord = Records::new(store.clone()).best(&key).unwrap().unwrap();
    assert_eq!(now, proven, "the defaults overwrote the proven best");
}

/// Two engines whose readings are scripted: `vllm` at its defaults truly reads 100, `sglang` at
/// its defaults 90, any other configuration 95; each run a little noise. The first run of the
/// `vllm` defaults reads 60 (a slowdown no load monitor saw).
struct TwoEngines {
    current: Option<Config>,
    runs: usize,
    vllm_runs: usize,
    defaults: Vec<Config>,
}

impl Evaluator for TwoEngines {
    async fn start(&mut self, cfg: &Config, _dir: &Path) -> Result<Started, TrialFailure> {
        self.current = Some(cfg.clone());
        let engine = match cfg.get("engine") {
            Some(servetune::space::Value::Str(e)) => e.clone(),
            _ => "vllm".into(),
        };
        Ok(Started {
            command: servetune::space::CommandLine {
                env: Vec::new(),
                argv: vec![engine.clone()],
            },
            engine,
            engine_version: None,
            startup_s: 1.0,
        })
    }
    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        let cfg = self.current.clone().unwrap_or_default();
        let truth = if cfg == self.defaults[0] {
            self.vllm_runs += 1;
            if self.vllm_runs == 1 {
                60.0
            } else {
                100.0
            }
        } else if cfg == self.defaults[1] {
            90.0
        } else {
            95.0
        };
        self.runs += 1;
        let v = truth * (1.0 + 0.004 * ((self.runs % 5) as f64 - 2.0));
        let n = ((400.0 * spec.fraction).round() as usize).max(1);
        Ok(scripted_measurement("main".into(), n, v))
    }
    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        self.current = None;
        Ok(None)
    }
    fn workloads(&self) -> Vec<String> {
        vec!["main".into()]
    }
}

#[tokio::test]
async fn in_a_study_of_two_engines_every_engines_defaults_are_remeasured_and_the_best_is_the_reference(
) {
    // Issue 20 item 3: the vLLM defaults' one search run read 60 (disturbed unseen), so the
    // SGLang defaults (90) became the reference and a configuration at 95, 5% slower than the
    // vLLM defaults, was recommended against them. Now both defaults are re-measured, the
    // vLLM defaults' pooled 100 is the reference, and the 95 is no gain.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text(
        "two",
        "\"vllm.max_num_seqs\", \"sglang.max_running_requests\"",
        "",
        "[screening]\nfraction = 1\n",
    )
    .replace("engines = \"vllm\"", "engines = \"vllm+sglang\"")
    .replace("optimizer = \"tpe\"", "optimizer = \"random\"");
    let study = Study::parse(&t, Path::new("v.toml")).unwrap();
    let space = Space::load_engines(&spaces_dir(), "vllm+sglang").unwrap();
    let names: Vec<String> = ["vllm.max_num_seqs", "sglang.max_running_requests"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let space = servetune::tune::restrict(space, Some(&names)).unwrap();
    let defaults = space.baselines();
    assert_eq!(defaults.len(), 2);
    let eval = TwoEngines {
        current: None,
        runs: 0,
        vllm_runs: 0,
        defaults,
    };
    let mut r = Runner::new(store.clone(), study, space, eval, dir.path().join("trials"));
    r.study.spec.budget.trials = 4;
    r.run().await.unwrap();
    let ts = Records::new(store.clone()).trials("two").unwrap();
    let s = search(&ts);
    // Both defaults were re-measured.
    for base in &s[..2] {
        assert!(
            ts.iter().any(|t| matches!(t.kind, TrialKind::Remeasure { candidate, .. } if candidate == base.seq)),
            "defaults #{} not re-measured",
            base.seq
        );
    }
    let rec = Records::new(store.clone()).study("two").unwrap().unwrap();
    let out = rec.outcome.unwrap();
    assert_eq!(out.baseline_trial, s[0].seq, "{}", out.verdict);
    assert_eq!(out.recommended, None, "{}", out.verdict);
    assert!(
        out.verdict.starts_with("keep the defaults"),
        "{}",
        out.verdict
    );
}

/// Scripted readings for a study with a validation workload: on `main` the defaults read 100
/// and every other configuration 110 + its `max_num_seqs` / 100 (so the candidates rank by it);
/// on `other` the defaults read 100, the first candidate validated there reads 80 and 112 in
/// turn (4% slower on average, the interval far wider than the 5% tolerance: inconclusive at
/// any cap) and every other candidate 110.
struct Validation {
    current: Option<Config>,
    runs: usize,
    defaults: Config,
    first_validated: Option<Config>,
    first_runs: usize,
}

impl Evaluator for Validation {
    async fn start(&mut self, cfg: &Config, _dir: &Path) -> Result<Started, TrialFailure> {
        self.current = Some(cfg.clone());
        Ok(Started {
            command: servetune::space::CommandLine {
                env: Vec::new(),
                argv: vec!["vllm".into()],
            },
            engine: "vllm".into(),
            engine_version: None,
            startup_s: 1.0,
        })
    }
    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        let cfg = self.current.clone().unwrap_or_default();
        let seqs = match cfg.get("max_num_seqs") {
            Some(servetune::space::Value::Int(n)) => *n as f64,
            _ => 0.0,
        };
        let truth = if cfg == self.defaults {
            100.0
        } else if spec.workload == 0 {
            110.0 + seqs / 100.0
        } else {
            if self.first_validated.is_none() {
                self.first_validated = Some(cfg.clone());
            }
            if self.first_validated.as_ref() == Some(&cfg) {
                self.first_runs += 1;
                if self.first_runs % 2 == 1 {
                    80.0
                } else {
                    112.0
                }
            } else {
                110.0
            }
        };
        self.runs += 1;
        let v = truth * (1.0 + 0.004 * ((self.runs % 5) as f64 - 2.0));
        let n = ((400.0 * spec.fraction).round() as usize).max(1);
        Ok(scripted_measurement(
            self.workloads()[spec.workload].clone(),
            n,
            v,
        ))
    }
    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        self.current = None;
        Ok(None)
    }
    fn workloads(&self) -> Vec<String> {
        vec!["main".into(), "other".into()]
    }
}

#[tokio::test]
async fn a_runner_up_is_validated_in_rounds_of_its_own_when_the_leader_is_passed_over_at_the_cap() {
    // Issue 20 item 9, validation: the fastest candidate stays inconclusive on the validation
    // workload up to the cap of 5 rounds and is passed over; the runner-up, +10% there, used to
    // get no validation round at all (the cap counted every leader's rounds together) and the
    // study kept the defaults "not validated on every workload".
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let t = text("runner-up", "\"max_num_seqs\"", "", "[screening]\nfraction = 1\n")
        .replace("optimizer = \"tpe\"", "optimizer = \"random\"")
        + "\n[[workload]]\nname = \"other\"\nargs = [\"--dataset-name\", \"random\", \"--num-prompts\", \"400\", \"--max-concurrency\", \"8\", \"--tokenizer\", \"words\"]\n";
    let study = Study::parse(&t, Path::new("v.toml")).unwrap();
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let space = servetune::tune::restrict(space, study.spec.study.params.as_deref()).unwrap();
    let eval = Validation {
        current: None,
        runs: 0,
        defaults: space.defaults(),
        first_validated: None,
        first_runs: 0,
    };
    let mut r = Runner::new(store.clone(), study, space, eval, dir.path().join("trials"));
    r.study.spec.budget.trials = 4;
    r.run().await.unwrap();
    let first = r
        .eval
        .first_validated
        .clone()
        .expect("a candidate was validated");
    let ts = Records::new(store.clone()).trials("runner-up").unwrap();
    let seq_of = |cfg: &Config| {
        search(&ts)
            .iter()
            .find(|t| &t.config == cfg)
            .map(|t| t.seq)
            .unwrap()
    };
    let leader = seq_of(&first);
    let rounds = |cand: u32| {
        ts.iter()
            .filter(
                |t| matches!(&t.kind, TrialKind::Validate { candidate, .. } if *candidate == cand),
            )
            .count()
    };
    assert_eq!(rounds(leader), 5, "the leader ran to the cap");
    let rec = Records::new(store.clone())
        .study("runner-up")
        .unwrap()
        .unwrap();
    let out = rec.outcome.unwrap();
    let recommended = out.recommended.expect(&out.verdict);
    assert_ne!(recommended, leader, "{}", out.verdict);
    assert!(
        (3..=5).contains(&rounds(recommended)),
        "the runner-up's own validation rounds: {}",
        rounds(recommended)
    );
    assert!(out.verdict.starts_with("run trial #"), "{}", out.verdict);
}

/// A scripted run of `n` requests at `v` tok/s with fixed latencies (the scripted
/// evaluators' measurement).
fn scripted_measurement(workload: String, n: usize, v: f64) -> Measurement {
    let mut lat = std::collections::BTreeMap::new();
    lat.insert("tpot:mean".to_owned(), 10.0);
    lat.insert("ttft:p99".to_owned(), 100.0);
    lat.insert("ttft:mean".to_owned(), 50.0);
    Measurement {
        workload,
        num_prompts: n,
        duration_s: 10.0,
        completed: n,
        success_rate: 1.0,
        total_token_throughput: v,
        output_throughput: v / 2.0,
        request_throughput: v / 100.0,
        latencies_ms: lat,
        ..Default::default()
    }
}
