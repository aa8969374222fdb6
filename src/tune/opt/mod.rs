//! Optimisers, ask/tell style with no I/O: each is built from the space and the study's seed
//! and proposes the next configuration from the trials so far. A proposal is a pure function of
//! (space, seed, history), so the history stored after every trial *is* the optimiser's state:
//! a resumed study rebuilds the optimiser and gets exactly the proposal it would have had.
//!
//! The first proposals are always the engines' defaults (one per engine of a joint space): the
//! baselines every result is compared with.

mod anneal;
mod batch;
mod edge;
mod gp;
pub mod oat;
pub mod prior;
pub mod reference;
mod tpe;

pub use gp::{effects, Effect};
pub use prior::Prior;

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::space::{Config, Space};
use crate::tune::encode::{arity, coord_of, decode, from_unit, Coord};

/// Which optimiser a study uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Tree-structured Parzen estimator (Bergstra et al. 2011), per-parameter densities.
    #[default]
    Tpe,
    /// Gaussian process with expected improvement times the probability of feasibility.
    Gp,
    /// Simulated annealing from the defaults.
    Anneal,
    Random,
    /// A shuffled grid (3 levels per numeric parameter, every categorical value).
    Grid,
    /// The seeds' method: defaults, then one option at a time, then the winners combined.
    Reports,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Tpe,
        Algorithm::Gp,
        Algorithm::Anneal,
        Algorithm::Random,
        Algorithm::Grid,
        Algorithm::Reports,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Tpe => "tpe",
            Algorithm::Gp => "gp",
            Algorithm::Anneal => "anneal",
            Algorithm::Random => "random",
            Algorithm::Grid => "grid",
            Algorithm::Reports => "reports",
        }
    }
    pub fn parse(s: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// What the optimiser learnt from one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Obs {
    pub config: Config,
    /// The objective (higher is better) when the trial met every constraint.
    pub value: Option<f64>,
    /// The engine failed (start-up failure, crash, hang), as opposed to running but missing
    /// a constraint.
    pub failed: bool,
    /// The objective as measured even when a constraint was missed (what the run did reach).
    #[serde(default)]
    pub measured: Option<f64>,
    /// Per latency limit of the study, in its order, how far the run was from it: the log of
    /// measured / limit (above 0: missed). None where the run did not measure it. The GP
    /// models each limit from these, so it learns where the boundary lies from every run.
    #[serde(default)]
    pub slack: Vec<Option<f64>>,
    /// The run's decode load against the study's per-token latency limits, where it has any
    /// (what the start-up's back-off steers by).
    #[serde(default)]
    pub decode: Option<DecodeLoad>,
}

/// How loaded a run's decode was, against the study's per-token latency limits (TPOT, ITL).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DecodeLoad {
    /// The sequences decoding at once on average: output tokens per second times the mean time
    /// per output token (Little's law). Below the batch cap when the KV cache, the prefills or
    /// the offered load keep the batch smaller.
    pub batch: f64,
    /// The largest log of measured / limit over the per-token limits (above 0: missed).
    pub slack: f64,
}

impl Obs {
    /// Whether the run missed a latency limit (so its infeasibility is the slack models').
    pub fn missed_a_limit(&self) -> bool {
        self.slack.iter().flatten().any(|s| *s > 0.0)
    }
}

/// A proposed configuration and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub config: Config,
    pub note: String,
    /// Expected improvement relative to the best value, where the optimiser models it.
    pub expected_improvement: Option<f64>,
}

/// The interface every optimiser implements. `&mut self` only for caches derived from the
/// space and seed; the result depends on nothing but the history.
pub trait Optimizer {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String>;

    /// The next proposal while the trials of `running` (proposed earlier, in the order they
    /// were proposed) have not finished: parallel trials. A pure function of the history and
    /// the running configurations, so that a resumed study gets the same proposals. `None`:
    /// nothing can be proposed before one of them finishes (wait for it). This default waits
    /// whenever a trial runs, which is the sequential study.
    fn propose_batch(
        &mut self,
        history: &[Obs],
        running: &[Config],
    ) -> Result<Option<Proposal>, String> {
        if running.is_empty() {
            self.propose(history).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The optimiser a study of `budget` trials gets when its file names none, by the space's
/// dimension and the budget, from `servetune search-bench` (benches/search-quality.md): the
/// Gaussian process up to 6 parameters (with its slack models and per-coordinate length
/// scales it is within 2% of the optimum by 10 trials on the 3-parameter landscapes, a
/// misleading prior included, and ahead of TPE on the 6-parameter one) and above 6 from 20
/// trials (on the 10-parameter landscape, after the memory edge, 1.4% against TPE's 2.1% at
/// 20 trials and 0.9% against 1.6% at 40); TPE above 6 parameters under 20 trials (the two
/// tie there, 2.1% at 10 trials, and the llama.cpp studies' real-engine verdicts were measured
/// with TPE).
pub fn default_for(space: &Space, budget: usize) -> Algorithm {
    if space.params.len() <= GP_MAX_DIMS || budget >= GP_MIN_BUDGET {
        Algorithm::Gp
    } else {
        Algorithm::Tpe
    }
}

/// The largest space the Gaussian process is the default for at any budget.
pub const GP_MAX_DIMS: usize = 6;

/// The budget from which the Gaussian process is the default in a larger space.
pub const GP_MIN_BUDGET: usize = 20;

/// What a study tells its optimiser beyond the space and the seed: its budget (the start-up
/// design and the prior's fading scale with it) and the priors the workload implies, one per
/// parameter of the space (`tune::prior` resolves them; empty: none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Search trials the study may run (`budget.trials`).
    pub budget: usize,
    pub priors: Vec<Option<Prior>>,
    /// The importance phase (`oat`), when the study asks for it.
    pub one_at_a_time: Option<oat::Settings>,
    /// Where the model-guided trials start in the history, when the caller knows it better
    /// than the space does (the search in a space the importance phase reduced); None: after
    /// the baselines, the phase and the start-up.
    pub guided_from: Option<usize>,
    /// The batch cap: the parameter whose prior is the workload's concurrency (`at =
    /// "{concurrency}"`: vLLM's `max_num_seqs`, SGLang's `max_running_requests`, llama.cpp's
    /// `parallel`). When the workload's point misses a per-token latency limit, the start-up
    /// lowers it (`back_off`) before its design.
    pub cap: Option<String>,
}

impl Plan {
    /// A plan with no priors.
    pub fn budget(budget: usize) -> Plan {
        Plan {
            budget,
            ..Plan::default()
        }
    }

    fn has_priors(&self) -> bool {
        self.priors.iter().any(Option::is_some)
    }
}

/// Whether the optimiser models the objective (and so starts with a space-filling design).
fn model_based(kind: Algorithm) -> bool {
    matches!(kind, Algorithm::Tpe | Algorithm::Gp)
}

/// Start-up trials a model-based optimiser runs after the baselines, the warm start and the
/// importance phase: the workload's prior point (when the space has priors) and a
/// space-filling design. They scale with the budget and the dimension: a quarter of the trials
/// left (two at least), never more than one per parameter plus one, so that most of a small
/// budget is model-guided.
pub fn startup_trials(kind: Algorithm, space: &Space, plan: &Plan, warm: usize) -> usize {
    if !model_based(kind) {
        return 0;
    }
    let left = plan
        .budget
        .saturating_sub(space.baselines().len() + warm + oat::moves(space, plan).len());
    let dims = space.params.len();
    left.div_ceil(4).clamp(2, dims + 1).min(left)
}

/// The fewest search trials before a convergence rule may stop a study: the baselines, the
/// warm start, the importance phase and the optimiser's start-up, then at least as many
/// model-guided trials as twice the number of parameters (five at least), so that the model
/// has had its chance.
pub fn convergence_floor(kind: Algorithm, space: &Space, plan: &Plan, warm: usize) -> u32 {
    let dims = space.params.len();
    (space.baselines().len()
        + warm
        + oat::moves(space, plan).len()
        + startup_trials(kind, space, plan, warm)
        + (2 * dims).max(5)) as u32
}

/// Builds an optimiser.
pub fn make(kind: Algorithm, space: &Space, seed: u64, plan: &Plan) -> Box<dyn Optimizer + Send> {
    make_warm(kind, space, seed, plan, Vec::new())
}

/// Builds an optimiser that, after the baselines, proposes `warm` (configurations that were
/// best before, with where they come from) before its own: a warm start. They enter the
/// history like any trial, so the optimiser's model starts from them.
pub fn make_warm(
    kind: Algorithm,
    space: &Space,
    seed: u64,
    plan: &Plan,
    warm: Vec<(Config, String)>,
) -> Box<dyn Optimizer + Send> {
    let mut w = WithBaselines {
        kind,
        baselines: space.baselines(),
        warm,
        moves: oat::moves(space, plan),
        space: space.clone(),
        seed,
        plan: plan.clone(),
        search: None,
    };
    if w.moves.is_empty() {
        w.search = Some(w.search_for(Vec::new()));
    }
    Box::new(w)
}

/// The optimiser of `kind` alone (no baselines, no start-up).
fn inner(kind: Algorithm, space: &Space, seed: u64, plan: Plan) -> Box<dyn Optimizer + Send> {
    match kind {
        Algorithm::Tpe => Box::new(tpe::Tpe::new(space.clone(), seed, plan)),
        Algorithm::Gp => Box::new(gp::Gp::new(space.clone(), seed, plan)),
        Algorithm::Anneal => Box::new(anneal::Anneal::new(space.clone(), seed)),
        Algorithm::Random => Box::new(reference::Random::new(space.clone(), seed)),
        Algorithm::Grid => Box::new(reference::Grid::new(space.clone(), seed)),
        Algorithm::Reports => Box::new(reference::Reports::new(space.clone())),
    }
}

/// The `n` start-up proposals of a model-based optimiser (see `startup_trials`): the point
/// the workload implies (every parameter with a prior at its mode, the others at their
/// defaults), then a prior-shaped Latin hypercube.
fn start_up(
    kind: Algorithm,
    space: &Space,
    seed: u64,
    plan: &Plan,
    n: usize,
) -> Vec<(Config, String)> {
    let mut out: Vec<(Config, String)> = Vec::new();
    if n == 0 {
        return out;
    }
    if plan.has_priors() {
        // The others at their defaults: `Off` decodes to the engine's own default, which may
        // lie outside the searched range (llama.cpp's `-1` = auto), where a coordinate would
        // clamp it to the range's end.
        let coords: Vec<Coord> = (0..space.params.len())
            .map(|i| match plan.priors.get(i).copied().flatten() {
                Some(p) => p.mode(),
                None => Coord::Off,
            })
            .collect();
        if let Ok(cfg) = decode(space, &coords) {
            let named: Vec<&str> = space
                .params
                .iter()
                .zip(&plan.priors)
                .filter(|(_, p)| p.is_some())
                .map(|(q, _)| q.name.as_str())
                .collect();
            out.push((
                cfg,
                format!(
                    "{}: the workload's prior ({})",
                    kind.name(),
                    named.join(", ")
                ),
            ));
        }
    }
    let arities: Vec<Option<usize>> = space.params.iter().map(arity).collect();
    let rest = n.saturating_sub(out.len());
    let shaped = if plan.has_priors() {
        ", prior-shaped"
    } else {
        ""
    };
    for (i, coords) in prior::design(&arities, &plan.priors, rest, seed)
        .into_iter()
        .enumerate()
    {
        if let Ok(cfg) = decode(space, &coords) {
            out.push((
                cfg,
                format!(
                    "{}: start-up design {}/{rest} (Latin hypercube{shaped})",
                    kind.name(),
                    i + 1
                ),
            ));
        }
    }
    out
}

/// The search after the importance phase: its start-up design and optimiser work in the
/// space less the frozen parameters (all of it without the phase).
struct Search {
    frozen: Vec<String>,
    space: Space,
    /// The plan of `space` (its priors in its order).
    plan: Plan,
    startup: Vec<(Config, String)>,
    inner: Box<dyn Optimizer + Send>,
}

/// The baselines first, then the warm-start points, then the importance phase's moves, then
/// the start-up design; afterwards the inner optimiser, with a proposal that repeats an
/// earlier trial replaced by a fresh random point (a repeat teaches nothing).
struct WithBaselines {
    kind: Algorithm,
    baselines: Vec<Config>,
    warm: Vec<(Config, String)>,
    moves: Vec<oat::Move>,
    space: Space,
    seed: u64,
    plan: Plan,
    /// Built once the phase's findings are known (at once without the phase); rebuilt only
    /// if they differ, which a history that grows never makes them.
    search: Option<Search>,
}

impl WithBaselines {
    fn search_for(&self, frozen: Vec<String>) -> Search {
        let n = startup_trials(self.kind, &self.space, &self.plan, self.warm.len());
        let (space, plan) = if self.moves.is_empty() {
            (self.space.clone(), self.plan.clone())
        } else {
            let before = self.baselines.len() + self.warm.len() + self.moves.len();
            let mut plan = oat::reduce_priors(&self.space, &self.plan, &frozen);
            plan.guided_from = Some(before + n);
            (oat::reduce(&self.space, &frozen), plan)
        };
        let mut startup = start_up(self.kind, &space, self.seed, &plan, n);
        startup.retain_mut(|(c, _)| oat::fill(&self.space, &frozen, c).is_ok());
        Search {
            inner: inner(self.kind, &space, self.seed, plan.clone()),
            plan,
            frozen,
            space,
            startup,
        }
    }
}

impl Optimizer for WithBaselines {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        // Nothing runs, so no stage waits.
        self.next(history, &[])?
            .ok_or_else(|| "no proposal with nothing running".into())
    }

    /// Parallel trials. Every stage passes over a configuration that has run or still runs,
    /// and the start-up design counts the running trials in its position, so K proposals in a
    /// row take K different points; the stages that read a result (the importance phase's
    /// assessment, the back-off, the memory edge's base) read finished trials only, and the
    /// phase waits while one of its moves runs; where a sequential study would wait, a free
    /// slot takes a parallel stage (`batch`, and the memory edge from the workload's point
    /// while it runs). The model-guided stage fantasises the running trials' results
    /// (`fantasised`).
    fn propose_batch(
        &mut self,
        history: &[Obs],
        running: &[Config],
    ) -> Result<Option<Proposal>, String> {
        self.next(history, running)
    }
}

impl WithBaselines {
    /// The next proposal (see `propose_batch`); with nothing running, `propose`'s.
    fn next(&mut self, history: &[Obs], running: &[Config]) -> Result<Option<Proposal>, String> {
        let taken = |c: &Config| running.contains(c) || history.iter().any(|h| &h.config == c);
        if let Some(p) = self.fixed(&taken) {
            return Ok(Some(p));
        }
        if let Some(settings) = self.plan.one_at_a_time {
            // The assessment reads every move against its defaults: not before they finished.
            let phase = |c: &Config| {
                self.baselines.contains(c) || self.moves.iter().any(|m| &m.config == c)
            };
            if running.iter().any(phase) {
                return Ok(None);
            }
            let frozen = oat::assess(&self.space, &self.moves, settings, history)
                .map(|f| f.frozen())
                .unwrap_or_default();
            if self.search.as_ref().is_none_or(|s| s.frozen != frozen) {
                self.search = Some(self.search_for(frozen));
            }
        }
        let tried = self.after_stages(history);
        let Some(search) = self.search.as_mut() else {
            return Err("no search after the importance phase".into());
        };
        // The start-up design, by position: its k-th point once k trials came after the
        // baselines, the warm start and the phase, the running ones included (a point that
        // repeats an earlier or a running trial is passed over).
        let before = self.baselines.len() + self.warm.len() + self.moves.len();
        let k = (history.len() + running.len()).saturating_sub(before);
        let free = |p: &Proposal| !running.contains(&p.config);
        // The workload's line (its point and the point's back-offs) among the finished
        // trials, then the rest. Sequentially the line is the start-up's prefix, and both the
        // back-off and the edge read the finished trials as they are; with trials running,
        // design points may finish before the line's: the back-off reads the line's finished
        // points (the round's ladder included) and the edge the line's first.
        let cap = self.plan.cap.as_deref();
        let (line, rest): (Vec<Obs>, Vec<Obs>) = match search.startup.first() {
            Some((point, _)) if !running.is_empty() => tried
                .iter()
                .cloned()
                .partition(|o| on_line(point, cap, &o.config)),
            _ => (tried.clone(), Vec::new()),
        };
        let limit = if running.is_empty() {
            search.startup.len()
        } else {
            search.startup.len() + batch::LADDER_STEPS
        };
        // Sequentially one step; with trials running, once it runs, a bracket around it.
        let nudges: &[f64] = if running.is_empty() {
            &[1.0]
        } else {
            &batch::BRACKET
        };
        for nudge in nudges {
            if let Some(p) = back_off(
                &self.kind,
                &self.space,
                search,
                &self.plan,
                &line,
                limit,
                *nudge,
            )
            .filter(free)
            .filter(|p| running.is_empty() || !taken(&p.config))
            {
                return Ok(Some(p));
            }
        }
        if let Some((point, _)) = search.startup.first() {
            // The edge is due, sequentially, in a start-up slot; with trials running from the
            // workload's point while it runs, then whenever a better base has finished (it
            // runs once, and once more half-way back, whatever the base's cap, unless it
            // missed a limit at another cap; nor while one runs).
            let left = !running.is_empty() || tried.len() < search.startup.len();
            let tried: Vec<Obs> = line.iter().chain(&rest).cloned().collect();
            if let Some(p) = edge::propose(
                &self.kind,
                search,
                &self.space,
                &tried,
                left,
                running.contains(point),
            )
            .filter(|p| !running.iter().any(|r| on_line(&p.config, cap, r)))
            {
                return Ok(Some(p));
            }
        }
        if let Some((c, note)) = search.startup.iter().skip(k).find(|(c, _)| !taken(c)) {
            return Ok(Some(Proposal {
                config: c.clone(),
                note: note.clone(),
                expected_improvement: None,
            }));
        }
        // With trials running, the model proposes once two trials have finished feasible:
        // fitted on one, it has no second feasible reading to set its scale by and proposed
        // the prior's corners again under a misleading prior (`batch::fill`). Until then the
        // ladder (nothing feasible yet), then the space fill.
        let feasible = history.iter().filter(|o| o.value.is_some()).count();
        if model_based(self.kind) && !running.is_empty() && feasible < batch::MODEL_READS {
            if feasible == 0 {
                if let Some(p) = batch::ladder(self.kind, &self.space, search, &taken) {
                    return Ok(Some(p));
                }
            }
            if let Some(mut p) = batch::fill(
                self.kind,
                &self.space,
                search,
                self.seed,
                history,
                running,
                &taken,
            ) {
                p.note = format!(
                    "{}; {feasible} feasible so far, the model waits for {}",
                    p.note,
                    batch::MODEL_READS
                );
                return Ok(Some(p));
            }
        }
        guided_proposal(self.kind, self.seed, &self.space, search, history, running)
    }

    /// The baselines, then the warm start, then the importance phase's moves: the first that
    /// has not run (`taken`: ran or runs).
    fn fixed(&self, taken: &dyn Fn(&Config) -> bool) -> Option<Proposal> {
        if let Some(b) = self.baselines.iter().find(|b| !taken(b)) {
            return Some(Proposal {
                config: b.clone(),
                note: "engine defaults (baseline)".into(),
                expected_improvement: None,
            });
        }
        if let Some((c, from)) = self.warm.iter().find(|(c, _)| !taken(c)) {
            return Some(Proposal {
                config: c.clone(),
                note: format!("warm start: {from}"),
                expected_improvement: None,
            });
        }
        let n = self.moves.len();
        let (i, m) = self
            .moves
            .iter()
            .enumerate()
            .find(|(_, m)| !taken(&m.config))?;
        Some(Proposal {
            config: m.config.clone(),
            note: format!(
                "importance phase {}/{n}: {} alone to {}",
                i + 1,
                m.param,
                m.value
            ),
            expected_improvement: None,
        })
    }

    /// The finished trials after the baselines, the warm start and the phase, in the
    /// history's order: the history less the first reading of each of their configurations
    /// (a sequential study's history after its first `before` trials; with parallel trials
    /// a baseline may finish after a start-up point).
    fn after_stages(&self, history: &[Obs]) -> Vec<Obs> {
        let mut first: HashSet<String> = self
            .baselines
            .iter()
            .chain(self.warm.iter().map(|(c, _)| c))
            .chain(self.moves.iter().map(|m| &m.config))
            .map(key)
            .collect();
        history
            .iter()
            .filter(|h| !first.remove(&key(&h.config)))
            .cloned()
            .collect()
    }
}

/// The model-guided proposal: the inner optimiser's on the history and the running trials'
/// fantasised results, a configuration that ran or runs replaced by a fresh random point (a
/// repeat teaches nothing). None: wait (the reports' procedure, or an exhausted space whose
/// only proposal runs).
fn guided_proposal(
    kind: Algorithm,
    seed: u64,
    whole: &Space,
    search: &mut Search,
    history: &[Obs],
    running: &[Config],
) -> Result<Option<Proposal>, String> {
    let Some(seen_so_far) = fantasised(kind, history, running) else {
        return Ok(None);
    };
    // The GP believes its own model at the running points (`Gp::propose_batch`); the others
    // read the fantasised history.
    let mut p = if kind == Algorithm::Gp && !running.is_empty() {
        match search.inner.propose_batch(history, running)? {
            Some(p) => p,
            None => return Ok(None),
        }
    } else {
        search.inner.propose(&seen_so_far)?
    };
    // With nothing running, the history itself.
    let history = &seen_so_far[..];
    let valid = oat::fill(whole, &search.frozen, &mut p.config).is_ok();
    let seen: HashSet<String> = history.iter().map(|h| key(&h.config)).collect();
    if valid && !seen.contains(&key(&p.config)) {
        return Ok(Some(p));
    }
    // The history's length counts the running trials: each proposal has its own stream.
    let mut rng = rng_for(seed ^ 0xD0_0B1E, history.len());
    for _ in 0..50 {
        let mut c = search.space.sample(&mut rng)?;
        if oat::fill(whole, &search.frozen, &mut c).is_ok() && !seen.contains(&key(&c)) {
            return Ok(Some(Proposal {
                config: c,
                note: format!("{} (already tried; random instead)", p.note),
                expected_improvement: p.expected_improvement,
            }));
        }
    }
    // A space this small is exhausted: measuring a point again at least narrows its noise,
    // but measuring one twice at once does not.
    if running.contains(&p.config) {
        return Ok(None);
    }
    Ok(Some(p))
}

/// The history the inner optimiser proposes from while trials run: the finished trials, then
/// each running one with a fantasised result (a "lie", Ginsbourger et al. 2010), so that the
/// next proposal goes elsewhere. The history alone when nothing runs; None where the optimiser
/// cannot propose before a running trial finishes. Its length counts the running trials, so
/// the inner optimisers' per-proposal random streams (`rng_for(seed, history.len())`) differ
/// across a batch. The lie, per optimiser:
/// - TPE: Optuna's `constant_liar`: a running trial counts as the worst, infeasible but not
///   failed (no value, nothing measured), so it lands in the "bad" density g and the next
///   candidates are drawn away from it, without the crash region growing;
/// - GP: no lie in the history (the TPE's shape, for its length and its configurations):
///   it proposes with `Gp::propose_batch`, the Kriging believer, its model conditioned on
///   each running point at its own posterior mean;
/// - Anneal: a rejected move (no value): the walk stays where it is and the next proposal is
///   another neighbour of the current point;
/// - Random and Grid read only the configurations (and the history's length): the TPE's lie;
/// - Reports: its one-option-at-a-time procedure reads each result before the next step:
///   None (wait).
fn fantasised(kind: Algorithm, history: &[Obs], running: &[Config]) -> Option<Vec<Obs>> {
    if running.is_empty() {
        return Some(history.to_vec());
    }
    if kind == Algorithm::Reports {
        return None;
    }
    let lie = |c: &Config| Obs {
        config: c.clone(),
        value: None,
        failed: false,
        measured: None,
        slack: Vec::new(),
        decode: None,
    };
    Some(
        history
            .iter()
            .cloned()
            .chain(running.iter().map(lie))
            .collect(),
    )
}

/// Whether `c` is the workload's `point` or one of its back-offs: the same configuration but
/// for the batch `cap`.
fn on_line(point: &Config, cap: Option<&str>, c: &Config) -> bool {
    c.len() == point.len()
        && c.iter()
            .all(|(k, v)| Some(k.as_str()) == cap || point.get(k) == Some(v))
}

/// How far under a per-token latency limit a back-off aims (5%: a run's noise).
const BACK_OFF_MARGIN: f64 = 0.05;

/// A run's cap bound its decode batch when the batch came this close to it.
const CAP_BOUND: f64 = 0.8;

/// The expert's first move when the workload's point misses a per-token latency limit (TPOT,
/// ITL): the same point with a lower batch cap, in place of the start-up design's next point,
/// again while the last one still misses and start-up trials are left. `tried` is the
/// history after the baselines, the warm start and the importance phase.
///
/// A step aims at the largest decode batch under the limit, 5% below it. The batch a run
/// held is its `DecodeLoad::batch` (Little's law), not the cap: the KV cache or the prefills
/// may keep it far below (a cap of 600 may run 220 sequences). With one run on the line the
/// per-token time is taken as proportional to the batch (an overestimate of the batch that
/// fits, since a step has a fixed part, the weights' read); with two, as affine through the
/// last two (the fixed part measured), never above the proportional step.
fn back_off(
    kind: &Algorithm,
    space: &Space,
    search: &Search,
    plan: &Plan,
    tried: &[Obs],
    limit: usize,
    nudge: f64,
) -> Option<Proposal> {
    let cap = plan.cap.as_deref()?;
    let (point, _) = search.startup.first()?;
    if tried.is_empty() || tried.len() >= limit {
        return None;
    }
    // The line: the workload's point and its back-offs, all that ran since the design began.
    if !tried.iter().all(|o| on_line(point, Some(cap), &o.config)) {
        return None;
    }
    let loads: Vec<(DecodeLoad, i64)> = tried
        .iter()
        .map(|o| match (o.failed, o.decode, o.config.get(cap)) {
            (false, Some(d), Some(crate::space::Value::Int(c))) if d.slack > 0.0 => Some((d, *c)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    // Highest cap first: a sequential line's order (each back-off below the lowest so far);
    // parallel trials may finish out of it.
    let mut loads = loads;
    loads.sort_by_key(|(_, c)| std::cmp::Reverse(*c));
    let param = space.params.iter().find(|p| p.name == cap)?;
    let crate::space::Kind::Int { min, .. } = param.kind else {
        return None;
    };
    let target = (-BACK_OFF_MARGIN).exp();
    let (last, last_cap) = *loads.last()?;
    let lowest_cap = loads.iter().map(|(_, c)| *c).min()?;
    let proportional = last.batch * target / last.slack.exp();
    let batch = match loads.len() {
        1 => proportional,
        n => {
            let (a, b) = (loads[n - 2].0, last);
            let slope = (b.slack.exp() - a.slack.exp()) / (b.batch - a.batch);
            if slope.is_finite() && slope > 0.0 {
                (b.batch + (target - b.slack.exp()) / slope).min(proportional)
            } else {
                proportional
            }
        }
    };
    // The cap that gives that batch: where the last run's cap bound its batch (prefills
    // keep a few of its sequences from decoding), the same ratio of cap to batch; where it did
    // not (the KV cache or the load kept the batch below it), the batch itself.
    let bound = last.batch >= CAP_BOUND * last_cap as f64;
    let scale = if bound {
        last_cap as f64 / last.batch
    } else {
        1.0
    };
    if lowest_cap <= min {
        return None;
    }
    let want = ((batch * scale * nudge).floor() as i64).clamp(min, lowest_cap - 1);
    let cfg = with_cap(space, param, point, want)?;
    let got = match cfg.get(cap) {
        Some(crate::space::Value::Int(c)) if *c < lowest_cap => *c,
        _ => return None,
    };
    Some(Proposal {
        note: format!(
            "{}: back-off: {cap} {last_cap} -> {got} (the last run decoded {:.0} sequences at once, {:+.0}% over its per-token latency limit){}",
            kind.name(),
            last.batch,
            100.0 * (last.slack.exp() - 1.0),
            if nudge == 1.0 {
                String::new()
            } else {
                format!("; bracket {:+.1}%", 100.0 * (nudge - 1.0))
            }
        ),
        config: cfg,
        expected_improvement: None,
    })
}

/// `point` with its batch cap `param` at `want`, snapped to the parameter's grid and
/// repaired in `space`; None where the cap is not numeric or the space refuses it.
fn with_cap(
    space: &Space,
    param: &crate::space::Param,
    point: &Config,
    want: i64,
) -> Option<Config> {
    let snapped = match coord_of(param, &crate::space::Value::Int(want)) {
        Coord::Num(u) => from_unit(param, u),
        _ => return None,
    };
    let mut cfg = point.clone();
    cfg.insert(param.name.clone(), snapped);
    space.repair(&mut cfg).ok()?;
    Some(cfg)
}

/// The number of model-guided trials in `history` (those after the baselines, the warm start
/// and the start-up design), for the prior's fading.
pub fn guided(kind: Algorithm, space: &Space, plan: &Plan, history_len: usize) -> usize {
    if let Some(from) = plan.guided_from {
        return history_len.saturating_sub(from);
    }
    history_len.saturating_sub(
        space.baselines().len()
            + oat::moves(space, plan).len()
            + startup_trials(kind, space, plan, 0),
    )
}

/// A canonical text of a configuration, for equality and hashing.
pub fn key(cfg: &Config) -> String {
    serde_json::to_string(cfg).unwrap_or_default()
}

/// The random stream of proposal number `n` of a study with this seed.
pub fn rng_for(seed: u64, n: usize) -> StdRng {
    StdRng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(n as u64)
            .rotate_left(17)
            ^ 0x5EED,
    )
}

/// Observations ordered best first: feasible by value, then infeasible, then failed.
pub fn ranked(history: &[Obs]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..history.len()).collect();
    let rank = |o: &Obs| match (o.value, o.failed) {
        (Some(v), _) => (0, -v),
        (None, false) => (1, 0.0),
        (None, true) => (2, 0.0),
    };
    idx.sort_by(|a, b| {
        let (ra, rb) = (rank(&history[*a]), rank(&history[*b]));
        ra.0.cmp(&rb.0).then(ra.1.total_cmp(&rb.1)).then(a.cmp(b))
    });
    idx
}

/// The best feasible value so far.
pub fn best_value(history: &[Obs]) -> Option<f64> {
    history.iter().filter_map(|o| o.value).reduce(f64::max)
}

#[cfg(test)]
mod tests;
