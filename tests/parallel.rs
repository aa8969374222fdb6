//! Parallel trials, in process and in virtual time (`SimEvaluator` behind a wrapper that makes
//! each run last a real millisecond per simulated second, so that trials really overlap): a parallel study never runs more trials than slots nor shares a device, finishes
//! its budget, stores the interference check and each trial's slot; the check falls back to
//! fewer slots when running them at once slows the defaults; a study interrupted with several
//! trials running resumes every one of them and loses none.

// These tests run the mock engine's model (the `mock` feature, on by default).
#![cfg(feature = "mock")]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use servetune::engine::slots::{Node, Placement, Pool};
use servetune::mock::evaluator::{SimEvaluator, SimWorkload};
use servetune::mock::profile::{default_version, Machine};
use servetune::mock::sim::{Hardware, ModelSpec};
use servetune::space::{Config, Space};
use servetune::store::Store;
use servetune::telemetry::{Link, TelemetrySummary};
use servetune::tune::eval::{Evaluator, Measurement, RunSpec, Started, TrialFailure};
use servetune::tune::records::{Phase, Records, TrialKind, TrialStatus};
use servetune::tune::spec::Study;
use servetune::tune::study::{Runner, Slots};
use servetune::tune::TuneError;

fn spaces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("search-spaces")
}

fn study_text(name: &str, trials: u32, params: &str, extra: &str) -> String {
    format!(
        r#"
[study]
name = "{name}"
model = "mock-8b"
engines = "vllm"
platform = "gpu"
optimizer = "tpe"
seed = 5
space_dir = "{spaces}"
params = [{params}]
{extra}

[constraints]
min_success_rate = 0.99

[budget]
trials = {trials}

[stopping]
patience = 100
min_trials = 100

[remeasure]
top = 2
repeats = 3

[[workload]]
name = "random"
args = ["--dataset-name", "random", "--num-prompts", "200", "--max-concurrency", "32", "--tokenizer", "words"]
"#,
        spaces = spaces_dir().display()
    )
}

/// What every evaluator of a study saw: the engines running now (their placements), the most
/// that ran at once, and any device two running engines shared.
#[derive(Default)]
struct Seen {
    running: Vec<Placement>,
    most: usize,
    shared: Vec<String>,
    starts: usize,
}

/// A slot's evaluator: the simulator, each run lasting its simulated duration (times `slow`
/// while other engines run, the interference a test asks for).
struct Tracked {
    sim: SimEvaluator,
    seen: Arc<Mutex<Seen>>,
    placed: Option<Placement>,
    started: bool,
    slow: f64,
}

impl Evaluator for Tracked {
    async fn start(&mut self, cfg: &Config, dir: &Path) -> Result<Started, TrialFailure> {
        self.stop().await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let s = self.sim.start(cfg, dir).await?;
        let p = self.placed.clone().unwrap_or(Placement {
            gpus: vec![],
            cores: vec![],
        });
        let mut seen = self.seen.lock().unwrap();
        let clashes: Vec<String> = seen
            .running
            .iter()
            .filter(|q| {
                let gpus: BTreeSet<_> = q.gpus.iter().collect();
                let cores: BTreeSet<_> = q.cores.iter().collect();
                p.gpus.iter().any(|g| gpus.contains(g)) || p.cores.iter().any(|c| cores.contains(c))
            })
            .map(|q| format!("{p:?} and {q:?}"))
            .collect();
        seen.shared.extend(clashes);
        seen.running.push(p);
        seen.most = seen.most.max(seen.running.len());
        seen.starts += 1;
        self.started = true;
        Ok(s)
    }

    async fn run(&mut self, spec: &RunSpec) -> Result<Measurement, TrialFailure> {
        // The engines a round starts at once have all started before any measures.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut m = self.sim.run(spec).await?;
        let others = self.seen.lock().unwrap().running.len() > 1;
        let f = if others { self.slow } else { 1.0 };
        // A simulated second lasts a real millisecond.
        tokio::time::sleep(Duration::from_secs_f64(m.duration_s * f / 1000.0)).await;
        m.duration_s *= f;
        m.output_throughput /= f;
        m.total_token_throughput /= f;
        m.request_throughput /= f;
        Ok(m)
    }

    async fn stop(&mut self) -> Result<Option<TelemetrySummary>, TrialFailure> {
        if self.started {
            self.started = false;
            let p = self.placed.clone().unwrap_or(Placement {
                gpus: vec![],
                cores: vec![],
            });
            let mut seen = self.seen.lock().unwrap();
            if let Some(i) = seen.running.iter().position(|q| *q == p) {
                seen.running.remove(i);
            }
        }
        self.sim.stop().await
    }

    fn workloads(&self) -> Vec<String> {
        self.sim.workloads()
    }

    fn place(&mut self, placement: Option<&Placement>) {
        self.placed = placement.cloned();
        self.sim.place(placement);
    }
}

fn machine(gpus: u32) -> Machine {
    let mut hw = Hardware::preset("h100", 16).unwrap();
    hw.gpus = gpus;
    Machine {
        hw,
        model: ModelSpec::preset("8b").unwrap(),
        version: default_version("vllm").to_owned(),
    }
}

fn sim(space: &Space, study: &Study, gpus: u32) -> SimEvaluator {
    let mut e = SimEvaluator::new(
        space.clone(),
        machine(gpus),
        vec![SimWorkload {
            name: "random".into(),
            num_prompts: 200,
            input_len: 512,
            output_len: 128,
            prefix_len: 0,
            request_rate: f64::INFINITY,
            max_concurrency: Some(32),
        }],
        0.02,
        7,
    );
    e.limits = study.limits.clone();
    e
}

/// A runner of `text` on a node of `gpus` GPUs with `slots` evaluators (at most `slots`
/// trials at once), each seeing `seen`; `slow` the interference.
fn runner(
    store: &Store,
    text: &str,
    gpus: u32,
    slots: usize,
    seen: &Arc<Mutex<Seen>>,
    slow: f64,
) -> Runner<Tracked> {
    let study = Study::parse(text, Path::new("par.toml")).unwrap();
    let space = Space::load(&spaces_dir().join("vllm.toml")).unwrap();
    let mut space = servetune::tune::restrict(space, study.spec.study.params.as_deref()).unwrap();
    // The study's node: its GPUs bound the tensor-parallel size (`{gpu_count}`).
    space
        .vars
        .insert("gpu_count".into(), i64::from(gpus.max(1)));
    let tracked = |seen: &Arc<Mutex<Seen>>| Tracked {
        sim: sim(&space, &study, gpus),
        seen: seen.clone(),
        placed: None,
        started: false,
        slow,
    };
    let node = Node::fake((0..gpus).collect(), islands(gpus), (0..16).collect());
    let pool = Pool::new(node, 0, Some(slots)).unwrap();
    let evals = (0..slots).map(|_| tracked(seen)).collect();
    let dir = tempfile::tempdir().unwrap().keep();
    let mut r = Runner::new(
        store.clone(),
        study.clone(),
        space.clone(),
        tracked(seen),
        dir,
    );
    r.parallel = Some(Slots { pool, evals });
    r
}

/// Two NVLink islands of four GPUs each (0-3, 4-7), joined across NUMA nodes.
fn islands(gpus: u32) -> Vec<Vec<Link>> {
    (0..gpus)
        .map(|a| {
            (0..gpus)
                .map(|b| {
                    if a / 4 == b / 4 {
                        Link::NvLink
                    } else {
                        Link::Numa
                    }
                })
                .collect()
        })
        .collect()
}

const PARAMS: &str = "\"max_num_seqs\", \"max_num_batched_tokens\", \"enable_chunked_prefill\"";

#[tokio::test]
async fn a_parallel_study_runs_its_slots_at_once_on_disjoint_devices_and_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut r = runner(&store, &study_text("par", 12, PARAMS, ""), 8, 4, &seen, 1.0);
    let rec = r.run().await.unwrap();
    assert_eq!(rec.phase, Phase::Done);
    let seen = seen.lock().unwrap();
    assert!(seen.shared.is_empty(), "devices shared: {:?}", seen.shared);
    assert_eq!(
        seen.most, 4,
        "four slots, never more nor fewer at the busiest"
    );
    let i = rec
        .interference
        .as_ref()
        .expect("the interference check is stored");
    assert_eq!(i.kept, 4, "{}", i.why);
    assert_eq!(i.checks[0].placements.len(), 4);
    let trials = Records::new(store.clone()).trials(&rec.id).unwrap();
    let search: Vec<_> = trials
        .iter()
        .filter(|t| t.kind == TrialKind::Search)
        .collect();
    assert_eq!(search.len(), 12);
    assert!(search.iter().all(|t| t.status != TrialStatus::Running));
    assert!(search
        .iter()
        .all(|t| t.slot.as_ref().is_some_and(|p| p.gpus.len() == 1)));
    // A batch never collapses onto one point: no configuration is proposed twice.
    let configs: BTreeSet<String> = search
        .iter()
        .map(|t| serde_json::to_string(&t.config).unwrap())
        .collect();
    assert_eq!(configs.len(), search.len());
    // The seq numbers have no gaps.
    let seqs: Vec<u32> = trials.iter().map(|t| t.seq).collect();
    assert_eq!(seqs, (0..trials.len() as u32).collect::<Vec<_>>());
}

#[tokio::test]
async fn slots_that_slow_each_other_beyond_the_threshold_fall_back_to_one_trial_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let text = study_text("slow", 6, PARAMS, "max_interference = 0.1");
    let mut r = runner(&store, &text, 8, 4, &seen, 1.3);
    let rec = r.run().await.unwrap();
    let i = rec.interference.as_ref().unwrap();
    assert_eq!(i.kept, 1, "{}", i.why);
    // Four at once, then two, each ~23% slower than alone.
    assert_eq!(
        i.checks
            .iter()
            .map(|c| c.placements.len())
            .collect::<Vec<_>>(),
        vec![4, 2]
    );
    for c in &i.checks {
        let s = c.slowdown.unwrap();
        assert!((0.15..0.3).contains(&s), "{s}");
    }
    assert!(i.why.contains("one trial at a time"), "{}", i.why);
    // After the check, one engine at a time.
    let trials = Records::new(store.clone()).trials(&rec.id).unwrap();
    assert_eq!(
        trials
            .iter()
            .filter(|t| t.kind == TrialKind::Search)
            .count(),
        6
    );
}

#[tokio::test]
async fn a_parallel_study_interrupted_with_trials_running_resumes_every_one_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let text = study_text("resume", 12, PARAMS, "");
    let mut r = runner(&store, &text, 8, 4, &seen, 1.0);
    // Interrupt once five search trials have finished: three or four are running then.
    let cancel = r.cancel.clone();
    let lines = Arc::new(Mutex::new(0usize));
    let l2 = lines.clone();
    r.progress = Arc::new(move |s: &str| {
        if s.starts_with("trial ") {
            let mut n = l2.lock().unwrap();
            *n += 1;
            if *n == 5 {
                cancel.cancel();
            }
        }
    });
    let e = r.run().await.unwrap_err();
    assert!(matches!(e, TuneError::Interrupted), "{e}");
    assert!(
        seen.lock().unwrap().running.is_empty(),
        "an engine was left running"
    );
    let records = Records::new(store.clone());
    let before = records.trials("resume").unwrap();
    let finished: Vec<_> = before
        .iter()
        .filter(|t| t.status != TrialStatus::Running)
        .cloned()
        .collect();
    let running: Vec<_> = before
        .iter()
        .filter(|t| t.status == TrialStatus::Running)
        .cloned()
        .collect();
    assert!(
        running.len() >= 2,
        "{} running at the interrupt: {:?}",
        running.len(),
        before
            .iter()
            .map(|t| (t.seq, t.status, t.stopped))
            .collect::<Vec<_>>()
    );
    assert!(running.iter().all(|t| t.stopped == 1));
    let mut again = runner(&store, &text, 8, 4, &seen, 1.0);
    let rec = again.run().await.unwrap();
    assert_eq!(rec.phase, Phase::Done);
    let after = records.trials("resume").unwrap();
    for t in &finished {
        assert!(after.contains(t), "trial {} changed or vanished", t.seq);
    }
    for t in &running {
        let now = after.iter().find(|a| a.seq == t.seq).unwrap();
        assert_ne!(now.status, TrialStatus::Running);
        assert_eq!(
            now.config, t.config,
            "trial {} ran another configuration",
            t.seq
        );
        assert_eq!(now.attempts, 2, "trial {} was not run again", t.seq);
    }
    assert_eq!(
        after.iter().filter(|t| t.kind == TrialKind::Search).count(),
        12
    );
}

#[tokio::test]
async fn mixed_tensor_parallel_sizes_on_an_8_gpu_node_get_their_gpus_in_one_island_and_share_none()
{
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let params = "\"max_num_seqs\", \"max_num_batched_tokens\", \"tensor_parallel_size\"";
    let text = study_text("mixed", 16, params, "");
    let mut r = runner(&store, &text, 8, 8, &seen, 1.0);
    let rec = r.run().await.unwrap();
    assert_eq!(rec.phase, Phase::Done);
    assert!(
        seen.lock().unwrap().shared.is_empty(),
        "{:?}",
        seen.lock().unwrap().shared
    );
    assert!(seen.lock().unwrap().most <= 8);
    let trials = Records::new(store.clone()).trials(&rec.id).unwrap();
    let search: Vec<_> = trials
        .iter()
        .filter(|t| t.kind == TrialKind::Search)
        .collect();
    assert_eq!(search.len(), 16);
    let mut sizes = BTreeSet::new();
    for t in &search {
        let tp = match t.config.get("tensor_parallel_size") {
            Some(servetune::space::Value::Int(v)) => *v as usize,
            _ => 1,
        };
        sizes.insert(tp);
        let p = t.slot.as_ref().expect("every trial has its slot");
        assert_eq!(p.gpus.len(), tp, "trial {}: {p:?} for TP {tp}", t.seq);
        if tp <= 4 {
            let island = p.gpus[0] / 4;
            assert!(
                p.gpus.iter().all(|g| g / 4 == island),
                "trial {}: TP {tp} across islands: {p:?}",
                t.seq
            );
        }
    }
    assert!(sizes.len() >= 2, "the test needs mixed sizes: {sizes:?}");
}
