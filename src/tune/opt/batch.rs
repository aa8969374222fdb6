//! What a free slot runs while other trials run, where a sequential study would wait for a
//! result: the start-up's parallel stages. Each is a pure function of the finished and the
//! running trials (the optimisers' contract), and none applies with nothing running, so a
//! one-slot study is the sequential one.
//!
//! - The back-off's **bracket**: while the back-off's step runs, the cap a few percent either
//!   side of it (its factors, `BRACKET`; `WithBaselines::next` proposes them).
//! - The **batch ladder**: while the workload's point runs and nothing has finished feasible,
//!   the point with its batch cap lowered by steps of √2 (`ladder`).
//! - The **space fill**: while fewer than two trials have finished feasible (`MODEL_READS`;
//!   with none, once the ladder is spent or where the study has no cap), the point farthest
//!   from every trial that ran or runs (`fill`).
//!
//! (The memory edge's parallel form, taken from the workload's point while it still runs, is
//! in `edge`.)

use rand::Rng;

use super::{oat, rng_for, with_cap, Algorithm, Obs, Proposal, Search};
use crate::space::{Config, Kind, Space, Value};
use crate::tune::encode::{arity, complete, coord_distance, decode, encode, Coord};

/// With trials running, the back-off's step and a bracket around it, in this order (as
/// factors of the batch it aims at): a slot that would wait for the step's reading measures
/// the cap a few percent either side of it instead, where the optimum of a latency-bound
/// workload lies (the step's affine model of the per-token time is an estimate).
pub(super) const BRACKET: [f64; 5] = [1.0, 1.035, 0.965, 1.07, 0.93];

/// The most points of the batch ladder (`ladder`): caps down to a quarter of the
/// workload's.
pub(super) const LADDER_STEPS: usize = 4;

/// The feasible results the model waits for while trials run (a sequential study's model
/// proposes from the first): fitted on one, it has no second feasible reading to compare, and
/// under a misleading prior it sent the slots back to the prior's corners (see `fill`).
pub(super) const MODEL_READS: usize = 2;

/// Random candidates the space fill picks the farthest of.
const FILL_CANDIDATES: usize = 256;

/// A free slot's proposal while trials run and none has finished feasible, after the start-up
/// design: where a sequential study would wait for the workload's point to read its back-off
/// from it, a parallel one spends the slot on what the back-off would try, the ladder: the
/// workload's point with its batch cap lowered by steps of √2, down to a quarter (a per-token
/// latency limit or the memory is what makes a cap too high, and a lower one is what the
/// back-off tries next). None when it is spent (`taken`: ran or runs) or the study has no
/// cap: then the space fill (`fill`).
pub(super) fn ladder(
    kind: Algorithm,
    whole: &Space,
    search: &Search,
    taken: &dyn Fn(&Config) -> bool,
) -> Option<Proposal> {
    let cap = search.plan.cap.as_deref()?;
    let (point, _) = search.startup.first()?;
    if !search.plan.has_priors() {
        return None;
    }
    let param = search.space.params.iter().find(|p| p.name == cap)?;
    let Kind::Int { min, .. } = param.kind else {
        return None;
    };
    let Some(Value::Int(top)) = point.get(cap) else {
        return None;
    };
    (1..=LADDER_STEPS).find_map(|j| {
        let want = ((*top as f64) * 0.5f64.powf(j as f64 / 2.0)).floor() as i64;
        let cfg = with_cap(whole, param, point, want.max(min))?;
        let snapped = cfg.get(cap)?.clone();
        (!taken(&cfg)).then(|| Proposal {
            note: format!(
                "{}: batch ladder {j}/{LADDER_STEPS}: {cap} {top} -> {snapped} (while the workload's point runs)",
                kind.name()
            ),
            config: cfg,
            expected_improvement: None,
        })
    })
}

/// A free slot's proposal while trials run and fewer than `MODEL_READS` have finished
/// feasible, once the start-up design (and, with none feasible, the ladder) is spent: the
/// configuration farthest (Euclidean, in unit coordinates; a categorical one differs by zero
/// or one) from every trial that ran or runs, the best of `FILL_CANDIDATES` uniform draws, so the
/// slots a sequential study would not have spread out over the space instead of landing where
/// the model would send them with so little to fit: at random with nothing feasible, and with
/// one feasible result, under a misleading prior, back where the prior-shaped design already
/// went. The draws' stream is numbered by finished plus running trials, so each
/// proposal of a batch has its own. A draw that ran or runs (`ran`) is passed over; None when no
/// draw is left (a space that small is the model's: `guided_proposal`).
///
/// Measured on `search-bench --parallel` (8 slots, 10 seeds): under a misleading prior, 1.61×
/// the one-slot trials to 2% in place of 1.96× with random draws, and 3.88× faster in place
/// of 3.54×; filling also while only one has finished feasible, 1.48× (4.02× faster; 20 seeds
/// 1.48× and 4.10×), the other landscapes unchanged but 6p (8.81× in place of 9.06×, within
/// 2% on 9 seeds of 10, not 10). Tried and worse there: waiting for a feasible result instead
/// of filling (1.83× the trials, 20 seeds), a fill kept half a spacing off the faces (1.87×),
/// MaxPro's projection criterion in place of the distance (more trials), dropping a prior the
/// incumbent lies outside (1.67×, 20 seeds), filling until as many trials have finished as
/// the sequential model first reads (1.43×, but SGLang 10p fell to 3.18× at 4 slots).
pub(super) fn fill(
    kind: Algorithm,
    whole: &Space,
    search: &Search,
    seed: u64,
    history: &[Obs],
    running: &[Config],
    ran: &dyn Fn(&Config) -> bool,
) -> Option<Proposal> {
    let space = &search.space;
    let at = |c: &Config| complete(space, &encode(space, c));
    let taken: Vec<Vec<Coord>> = history
        .iter()
        .map(|o| &o.config)
        .chain(running)
        .map(at)
        .collect();
    let mut rng = rng_for(seed ^ 0xF111, history.len() + running.len());
    let mut best: Option<(f64, Config)> = None;
    for _ in 0..FILL_CANDIDATES {
        let coords: Vec<Coord> = space
            .params
            .iter()
            .map(|p| match arity(p) {
                Some(k) => Coord::Cat(rng.random_range(0..k)),
                None => Coord::Num(rng.random_range(0.0..=1.0)),
            })
            .collect();
        let Ok(mut cfg) = decode(space, &coords) else {
            continue;
        };
        if oat::fill(whole, &search.frozen, &mut cfg).is_err() || ran(&cfg) {
            continue;
        }
        let c = at(&cfg);
        let nearest = taken
            .iter()
            .map(|q| {
                q.iter()
                    .zip(&c)
                    .map(|(a, b)| coord_distance(*a, *b).powi(2))
                    .sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min);
        if best.as_ref().is_none_or(|(b, _)| nearest > *b) {
            best = Some((nearest, cfg));
        }
    }
    let (nearest, config) = best?;
    Some(Proposal {
        note: format!(
            "{}: space fill (the farthest from every trial, {:.2} away)",
            kind.name(),
            nearest.sqrt()
        ),
        config,
        expected_improvement: None,
    })
}
