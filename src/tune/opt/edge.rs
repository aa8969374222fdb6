//! The start-up's memory-edge point: the expert's move once the workload's point has run. A
//! memory-bound engine (SGLang's static fraction, vLLM's memory utilisation) serves more from
//! a larger KV cache, and the knobs that hold memory for other uses (a prefill chunk larger
//! than any prompt) only take from it. So the next trial gives the KV cache everything the
//! workload does not need: every `edge = "high"` knob at the top of its range, every
//! `edge = "low"` knob at its prior's bound (the space file says which, `space::prior::Edge`).
//! When the engine refuses that (out of memory), once more half-way back. Both take the place
//! of start-up design points, so the start-up's size, and the model-guided trials after it,
//! are unchanged.
//!
//! With parallel trials the edge does not wait for the workload's point: while the point runs,
//! a free slot measures the edge taken from it (the edge it will be if the point turns out
//! feasible and the best of its line, as it does wherever the workload's priors hold). Once
//! the point is read the usual rule applies, and proposes the edge of a better base if the
//! line has one. On `search-bench --parallel` (8 slots, 10 seeds) the SGLang landscape came
//! within 2% of its optimum with 1.27× the one-slot trials in place of 1.54×, 6.4× faster in
//! place of 5.7×.

use super::prior::Prior;
use super::{Algorithm, Obs, Plan, Proposal, Search};
use crate::space::prior::Edge;
use crate::space::{Config, Param, Space, Value};
use crate::tune::encode::{coord_of, from_unit, Coord};

/// The knobs the edge moves: `(parameter, its edge, its prior's bound)`, where the space
/// states an edge and the prior applies to this study (resolved `at_least`; `plan`'s priors
/// are `space`'s, in its order).
fn knobs<'a>(space: &'a Space, plan: &Plan) -> Vec<(&'a Param, Edge, f64)> {
    space
        .params
        .iter()
        .zip(&plan.priors)
        .filter_map(|(p, prior)| {
            let edge = p.prior.as_ref()?.edge?;
            match prior {
                Some(Prior::AtLeast { lo, .. }) => Some((p, edge, *lo)),
                _ => None,
            }
        })
        .collect()
}

/// `base` with the high knobs at `high` of the way from where `base` has them to the top of
/// their ranges, and the low knobs at their bounds; None where that is `base` itself.
fn toward_edge(
    space: &Space,
    knobs: &[(&Param, Edge, f64)],
    base: &Config,
    high: f64,
) -> Option<Config> {
    let mut cfg = base.clone();
    for &(p, edge, lo) in knobs {
        let now = match base.get(&p.name).map(|v| coord_of(p, v)) {
            Some(Coord::Num(u)) => u,
            _ => continue,
        };
        let u = match edge {
            Edge::High => now + high * (1.0 - now),
            // Only down: a base already under the bound keeps its value.
            Edge::Low => lo.min(now),
        };
        cfg.insert(p.name.clone(), from_unit(p, u));
    }
    space.repair(&mut cfg).ok()?;
    (cfg != *base).then_some(cfg)
}

/// The edge's proposal, if it is due: `search` holds the space the start-up searches, its
/// plan and the workload's point (the start-up's first), `space` is the whole space (the
/// configurations' own), `tried` the history since the start-up began,
/// `left` whether a start-up slot is left, `runs` whether the workload's point runs now
/// (parallel trials). The base is the best feasible run among the workload's point and its
/// back-offs (the trials that differ from the point at most in the batch cap); with none, the
/// point itself while it runs; else no edge.
pub(super) fn propose(
    kind: &Algorithm,
    search: &Search,
    space: &Space,
    tried: &[Obs],
    left: bool,
    runs: bool,
) -> Option<Proposal> {
    if (tried.is_empty() && !runs) || !left {
        return None;
    }
    let (searched, plan) = (&search.space, &search.plan);
    let (point, _) = search.startup.first()?;
    let knobs = knobs(searched, plan);
    if !knobs.iter().any(|(_, e, _)| *e == Edge::High) {
        return None;
    }
    let cap = plan.cap.as_deref();
    let line = tried
        .iter()
        .take_while(|o| super::on_line(point, cap, &o.config));
    let best = line
        .filter_map(|o| o.value.map(|v| (v, o)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, o)| &o.config);
    let (base, ahead) = match best {
        Some(c) => (c, false),
        None if runs => (point, true),
        None => return None,
    };
    // Up to the cap: with parallel trials a later back-off of the line may become the base,
    // and the edge moved from it is the same edge (sequentially the base cannot change after
    // the edge ran: no back-off follows a point off the line); but not an edge that missed a
    // limit at another cap (taken from the point while it ran, which missed it too): the
    // edge at the feasible base's cap is still to measure.
    let ran = |c: &Config| {
        tried.iter().find(|o| {
            super::on_line(c, cap, &o.config)
                && (o.value.is_some()
                    || o.failed
                    || cap.is_none_or(|k| o.config.get(k) == c.get(k)))
        })
    };
    let full = toward_edge(space, &knobs, base, 1.0)?;
    let (cfg, why) = match ran(&full) {
        None => (full, "the KV cache gets what the workload does not need"),
        Some(o) if o.failed => {
            let half = toward_edge(space, &knobs, base, 0.5)?;
            if ran(&half).is_some() {
                return None;
            }
            (half, "half-way back: the engine refused the edge")
        }
        Some(_) => return None,
    };
    let moved: Vec<String> = knobs
        .iter()
        .map(|(p, _, _)| &p.name)
        .filter_map(|n| match (base.get(n), cfg.get(n)) {
            (Some(a), Some(b)) if a != b => Some(format!("{n} {} -> {}", show(a), show(b))),
            _ => None,
        })
        .collect();
    Some(Proposal {
        note: format!(
            "{}: memory edge: {} ({why}){}",
            kind.name(),
            moved.join(", "),
            if ahead {
                "; while the workload's point runs"
            } else {
                ""
            }
        ),
        config: cfg,
        expected_improvement: None,
    })
}

fn show(v: &Value) -> String {
    match v {
        Value::Float(x) => format!("{x:.3}"),
        other => other.to_string(),
    }
}
