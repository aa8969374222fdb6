//! The importance phase (optional: `[importance] one_at_a_time` in a study file). Before the
//! search, every parameter is moved alone from its engine's defaults, one trial each, the way
//! the seeds' reports tune by hand; then a parameter whose move changed neither the objective
//! nor any latency limit beyond the noise (`freeze_below` at least; from 8 readings on, the
//! margin of error the readings themselves give, as in Lenth's method), nor whether the run
//! met the constraints, is frozen at its default for the rest of the study, so the
//! model-guided search works in fewer dimensions. The margin's reference is the median of the
//! readings, and it stands for the defaults only while their own reading lies within the
//! margin of it; where it does not (most options moved the objective, or the defaults' run was
//! disturbed), nothing of that engine is frozen. The noise comes from the readings that kept
//! the defaults' feasibility; the moves run in full like the defaults (the runner sees to it).
//! The moves are ordinary search trials: they feed the model and the report's effect charts.
//! Pure functions of (space, plan, history), like every proposal.
//!
//! Where a move goes: to what the workload implies when a prior says so (the expert's first
//! move), else to the far side of the range (the 20% or 80% point of the unit coordinate,
//! away from the default: a large move that stays off the range's extreme, where engines fail
//! more often), else to the next categorical value; a boolean is flipped.

use serde::{Deserialize, Serialize};

use super::{Obs, Plan};
use crate::space::{Config, Kind, Space, Value};
use crate::tune::encode::{arity, coord_of, decode, Coord};

/// What a study asks of the phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// A move that changed the objective and every latency limit's statistic by less than this
    /// (relative) and kept the run's feasibility freezes its parameter.
    pub freeze_below: f64,
}

/// One move of the phase: `param` alone moved from `baseline` (its engine's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub param: String,
    pub value: Value,
    pub config: Config,
    pub baseline: Config,
    /// The other parameters the space's `clamp` constraints moved with it (their value differs
    /// from the baseline's): the move's effect is theirs too.
    pub with: Vec<String>,
}

/// The unit coordinate a numeric move goes to on the side away from a default at `u`.
const FAR: f64 = 0.8;

/// The phase's moves, in the space's order: one per parameter active in one of the
/// baselines (the engine choice of a joint space excepted: its moves are the baselines), empty
/// when the plan does not ask for the phase.
pub fn moves(space: &Space, plan: &Plan) -> Vec<Move> {
    if plan.one_at_a_time.is_none() {
        return Vec::new();
    }
    let baselines = space.baselines();
    let mut out: Vec<Move> = Vec::new();
    for (i, p) in space.params.iter().enumerate() {
        if p.name == "engine" && !space.members.is_empty() {
            continue;
        }
        let Some(base) = baselines.iter().find(|b| b.contains_key(&p.name)) else {
            continue;
        };
        let from = coord_of(p, &p.default);
        let in_range = match (&p.kind, &p.default) {
            (Kind::Int { min, max, .. }, Value::Int(d)) => (*min..=*max).contains(d),
            (Kind::Float { min, max, .. }, Value::Float(d)) => (*min..=*max).contains(d),
            _ => true,
        };
        let prior = plan.priors.get(i).copied().flatten().map(|pr| pr.mode());
        let target = match (prior, arity(p), from) {
            (Some(c), _, _) if c != from || !in_range => c,
            (_, Some(k), Coord::Cat(d)) if k > 1 => Coord::Cat((d + 1) % k),
            (_, Some(_), _) => continue,
            (_, None, Coord::Num(_)) if !in_range => Coord::Num(0.5),
            (_, None, Coord::Num(u)) => Coord::Num(if u <= 0.5 { FAR } else { 1.0 - FAR }),
            _ => continue,
        };
        // Every other parameter at its default (`Off`), the engine of this baseline chosen.
        let coords: Vec<Coord> = space
            .params
            .iter()
            .enumerate()
            .map(|(j, q)| match (j == i, base.get(&q.name)) {
                (true, _) => target,
                (false, Some(v)) if q.name == "engine" && !space.members.is_empty() => {
                    coord_of(q, v)
                }
                _ => Coord::Off,
            })
            .collect();
        let Ok(config) = decode(space, &coords) else {
            continue;
        };
        let Some(value) = config.get(&p.name).cloned() else {
            continue;
        };
        if config == *base || out.iter().any(|m| m.config == config) {
            continue;
        }
        let with = config
            .iter()
            .filter(|(k, v)| **k != p.name && base.get(*k).is_some_and(|b| b != *v))
            .map(|(k, _)| k.clone())
            .collect();
        out.push(Move {
            param: p.name.clone(),
            value,
            config,
            baseline: base.clone(),
            with,
        });
    }
    out
}

/// What one move showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Moved {
    pub param: String,
    /// The value it was moved to.
    pub value: Value,
    /// The other parameters a constraint moved with it (empty for records written before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// The objective's change against the phase's reference, % (None: not measured).
    pub objective_pct: Option<f64>,
    /// The largest change of a latency limit's statistic against its reference, % (None: no
    /// limit measured).
    pub latency_pct: Option<f64>,
    /// The change below which this move counts as no effect, %: `freeze_below`, or the
    /// phase's margin of error where the noise is larger.
    pub margin_pct: f64,
    /// Frozen at its default for the rest of the study.
    pub frozen: bool,
    /// Why it was frozen or kept, in words.
    pub why: String,
}

/// The phase's findings, once every move has been measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Findings {
    pub freeze_below: f64,
    /// The objective's reference level (the median of the defaults' and the moves' readings).
    pub reference: Option<f64>,
    /// The defaults' own reading against it, %.
    pub defaults_pct: Option<f64>,
    /// The margin of error of the readings (Lenth's, %): changes below it are noise.
    pub noise_margin_pct: Option<f64>,
    /// In the space's order.
    pub moved: Vec<Moved>,
}

impl Findings {
    /// The parameters frozen at their defaults.
    pub fn frozen(&self) -> Vec<String> {
        self.moved
            .iter()
            .filter(|m| m.frozen)
            .map(|m| m.param.clone())
            .collect()
    }
}

/// The parameters other parameters' conditions name (`when`): freezing one would decide
/// whether the others exist, so they are never frozen. (A constraint may name a frozen
/// parameter: `fill` repairs every configuration against the whole space.)
fn depended_on(space: &Space) -> Vec<String> {
    space
        .params
        .iter()
        .flat_map(|p| p.when.keys().cloned())
        .collect()
}

/// The fewest readings (the defaults' and the moves') the noise is estimated from.
pub const LENTH_MIN: usize = 8;

/// The largest margin of error (relative) at which the phase freezes anything: beyond it, an
/// effect of the size tuning looks for would be lost in the noise, so the phase cannot tell an
/// option that does nothing and every option stays in the search (the real llama-server demo
/// study of 2026-12-05 read the same configuration at 206 and 264 tok/s ten minutes apart: a
/// margin of ±63%).
pub const MAX_MARGIN: f64 = 0.25;

fn median(v: &[f64]) -> f64 {
    crate::bench::stats::Sorted::new(v).median()
}

/// The reference level of one engine's readings (logs: the defaults' and its moves') and the
/// margin of error around it. A screening design measures each move once, so the noise comes
/// from the readings themselves, as in Lenth's method for unreplicated designs (Lenth 1989,
/// Technometrics 31(4)): most options do little (effect sparsity), so the median reading is a
/// level that one slow or fast reading of the defaults cannot move, and the deviations from
/// it, trimmed of the large ones, give a pseudo standard error; the margin is its
/// t(0.975, m/3) multiple. None with fewer than `LENTH_MIN` readings: the method needs enough
/// of them for most to be noise, and below that the defaults' own reading is the reference
/// and `freeze_below` alone the margin.
fn reference_and_margin(logs: &[f64]) -> Option<(f64, f64)> {
    if logs.len() < LENTH_MIN {
        return None;
    }
    let reference = median(logs);
    let dev: Vec<f64> = logs.iter().map(|v| (v - reference).abs()).collect();
    let s0 = 1.5 * median(&dev);
    let trimmed: Vec<f64> = dev.iter().copied().filter(|d| *d < 2.5 * s0).collect();
    let pse = if trimmed.is_empty() {
        s0
    } else {
        1.5 * median(&trimmed)
    };
    let df = logs.len() as f64 / 3.0;
    Some((
        reference,
        crate::tune::significance::t_quantile(0.975, df) * pse,
    ))
}

/// One engine's scales: the objective's and each limit's reference and margin (logs), and why
/// its moves cannot be judged against them, if they cannot.
struct Scales {
    objective: Option<(f64, f64)>,
    limits: Vec<Option<(f64, f64)>>,
    unanchored: Option<String>,
}

/// The parameters a `clamp` constraint bounds by another parameter (`lhs`): frozen at its
/// default, such a parameter is still moved by the constraint when the other one moves.
fn clamped_by_param(space: &Space, param: &str) -> Option<String> {
    space
        .constraints
        .iter()
        .find(|c| {
            c.lhs == param && c.repair == "clamp" && space.params.iter().any(|p| p.name == c.rhs)
        })
        .map(|c| format!("{} {} {}", c.lhs, c.op, c.rhs))
}

/// A run's reading of the objective on a log scale: what it measured (else its value), none
/// for a failed run or one that read nothing.
fn reading(o: &Obs) -> Option<f64> {
    o.measured
        .or(o.value)
        .filter(|v| *v > 0.0 && !o.failed)
        .map(f64::ln)
}

/// A change on the log scale as a percentage.
fn pct(l: f64) -> f64 {
    100.0 * l.exp_m1()
}

/// What the phase reads: the history, its moves with their runs and the defaults' runs
/// beside them (`observed`), the number of latency limits, and the freeze floor (log).
struct Readings<'a> {
    history: &'a [Obs],
    moves: &'a [Move],
    observed: Vec<(&'a Obs, &'a Obs)>,
    limits: usize,
    floor: f64,
}

impl Readings<'_> {
    /// One engine's scales (the moves from the defaults `base`).
    fn scales(&self, base: &Config) -> Scales {
        let group: Vec<&(&Obs, &Obs)> = self
            .moves
            .iter()
            .zip(&self.observed)
            .filter(|(m, _)| &m.baseline == base)
            .map(|(_, ob)| ob)
            .collect();
        let b = group.first().map(|(_, b)| *b);
        // The defaults and the moves that kept their feasibility: a run that missed a
        // constraint the defaults met (or met one they missed) is another regime, whose
        // readings say nothing of the noise.
        let pool: Vec<&Obs> = b
            .into_iter()
            .chain(
                group
                    .iter()
                    .map(|(o, _)| *o)
                    .filter(|o| b.is_some_and(|b| o.value.is_some() == b.value.is_some())),
            )
            .filter(|o| !o.failed)
            .collect();
        let objective =
            reference_and_margin(&pool.iter().filter_map(|o| reading(o)).collect::<Vec<_>>());
        let limit_scales: Vec<Option<(f64, f64)>> = (0..self.limits)
            .map(|k| {
                let v: Vec<f64> = pool
                    .iter()
                    .filter_map(|o| o.slack.get(k).copied().flatten())
                    .collect();
                reference_and_margin(&v)
            })
            .collect();
        // The defaults' own level: the median of every reading of their configuration.
        let runs: Vec<&Obs> = self
            .history
            .iter()
            .filter(|h| &h.config == base && !h.failed)
            .collect();
        let own = |v: Vec<f64>| (!v.is_empty()).then(|| median(&v));
        let floor = self.floor;
        // Why the defaults' own level lies beyond `scale`'s margin of its reference, if it does.
        let off = |what: &str, scale: Option<(f64, f64)>, level: Option<f64>| {
            let ((r, e), d) = (scale?, level?);
            let margin = e.max(floor);
            ((d - r).abs() > margin).then(|| format!(
                "{what} {:+.1}% from the phase's median, beyond its ±{:.1}% margin: most options may matter, or that reading of the defaults was off",
                pct(d - r),
                pct(margin)
            ))
        };
        let unanchored = off(
            "the defaults read",
            objective,
            own(runs.iter().filter_map(|o| reading(o)).collect()),
        )
        .or_else(|| {
            limit_scales.iter().enumerate().find_map(|(k, sc)| {
                off(
                    "a latency limit's statistic of the defaults reads",
                    *sc,
                    own(runs
                        .iter()
                        .filter_map(|o| o.slack.get(k).copied().flatten())
                        .collect()),
                )
            })
        });
        Scales {
            objective,
            limits: limit_scales,
            unanchored,
        }
    }
}

/// One move judged against its engine's scales: its change of the objective and of the
/// latency limit that moved most (log), and whether it is frozen, and why.
fn judge(
    space: &Space,
    m: &Move,
    (o, b): (&Obs, &Obs),
    sc: &Scales,
    floor: f64,
    depended: &[String],
) -> Moved {
    let obj = sc.objective;
    let margin = obj.map_or(0.0, |(_, e)| e).max(floor);
    let blind = obj.is_some_and(|(_, e)| e > MAX_MARGIN.ln_1p());
    let change = match (reading(o), obj) {
        (Some(r), Some((reference, _))) => Some(r - reference),
        (Some(r), None) => reading(b).map(|rb| r - rb),
        _ => None,
    };
    let latency = sc
        .limits
        .iter()
        .enumerate()
        .filter_map(|(k, lsc)| {
            let x = o.slack.get(k).copied().flatten()?;
            let reference = match lsc {
                Some((reference, _)) => *reference,
                None => b.slack.get(k).copied().flatten()?,
            };
            let limit_margin = lsc.map_or(0.0, |(_, e)| e).max(floor);
            Some((x - reference, limit_margin))
        })
        .max_by(|a, b| (a.0.abs() - a.1).total_cmp(&(b.0.abs() - b.1)));
    let (frozen, mut why) = if o.failed {
        (false, "the engine failed with it".to_owned())
    } else if b.failed {
        (false, "the defaults failed: nothing to compare".to_owned())
    } else if o.value.is_some() != b.value.is_some() {
        let what = if o.value.is_some() {
            "it met the constraints, the defaults did not"
        } else {
            "it missed a constraint the defaults met"
        };
        (false, what.to_owned())
    } else if depended.contains(&m.param) {
        (false, "other options depend on it".to_owned())
    } else if blind {
        (
            false,
            format!(
                "the phase's readings vary by ±{:.0}% (more than {:.0}%): too noisy to tell an option that does nothing",
                pct(margin),
                100.0 * MAX_MARGIN
            ),
        )
    } else if let Some(reason) = &sc.unanchored {
        (false, reason.clone())
    } else {
        by_change(change, latency, margin)
    };
    if !m.with.is_empty() {
        why = format!("{why} (a constraint moved {} with it)", m.with.join(", "));
    }
    if frozen {
        if let Some(c) = clamped_by_param(space, &m.param) {
            why = format!("{why}; the constraint {c} still clamps it");
        }
    }
    Moved {
        param: m.param.clone(),
        value: m.value.clone(),
        with: m.with.clone(),
        objective_pct: change.map(pct),
        latency_pct: latency.map(|(l, _)| pct(l)),
        margin_pct: pct(margin),
        frozen,
        why,
    }
}

/// Frozen or not by the measured changes alone: the objective's `change` against `margin`,
/// and the latency limit that moved most (`latency`: change and its own margin).
fn by_change(change: Option<f64>, latency: Option<(f64, f64)>, margin: f64) -> (bool, String) {
    match change {
        None => (false, "the objective was not measured".to_owned()),
        Some(r) if r.abs() >= margin => (
            false,
            format!(
                "the objective moved {:+.1}% (beyond ±{:.1}%)",
                pct(r),
                pct(margin)
            ),
        ),
        Some(_) if latency.is_some_and(|(l, e)| l.abs() >= e) => {
            let (l, e) = latency.unwrap_or_default();
            (
                false,
                format!(
                    "a latency limit's statistic moved {:+.1}% (beyond ±{:.1}%)",
                    pct(l),
                    pct(e)
                ),
            )
        }
        Some(_) => (
            true,
            match latency {
                // Each latency limit has its own margin (its readings' spread).
                Some((l, e)) => format!(
                    "the objective moved less than ±{:.1}%, and a latency limit's statistic {:+.1}% (within ±{:.1}%)",
                    pct(margin),
                    pct(l),
                    pct(e)
                ),
                None => format!("the objective moved less than ±{:.1}%", pct(margin)),
            },
        ),
    }
}

/// The findings of the phase from `history`, None until every move of `moves` has been
/// measured (a move and its baseline are found by configuration). Each move's change is
/// measured against its engine's reference (`reference_and_margin`, over the readings that
/// met the constraints as the defaults did, or missed them as they did), and it counts as no
/// effect below the larger of `freeze_below` and the margin of error. The reference is the
/// readings' median only while the defaults read within that margin of it: otherwise most
/// options may have moved the objective the same way (the median is then theirs, not the
/// defaults'), or the defaults' reading was off, and the phase freezes nothing of that engine.
pub fn assess(
    space: &Space,
    moves: &[Move],
    settings: Settings,
    history: &[Obs],
) -> Option<Findings> {
    if moves.is_empty() {
        return None;
    }
    let find = |c: &Config| history.iter().find(|h| &h.config == c);
    let observed: Vec<(&Obs, &Obs)> = moves
        .iter()
        .map(|m| Some((find(&m.config)?, find(&m.baseline)?)))
        .collect::<Option<_>>()?;
    let limits = observed
        .iter()
        .map(|(o, b)| o.slack.len().max(b.slack.len()))
        .max()
        .unwrap_or(0);
    let phase = Readings {
        history,
        moves,
        observed,
        limits,
        floor: settings.freeze_below.ln_1p(),
    };
    let depended = depended_on(space);
    // Once per engine, in the order of first appearance.
    let mut by_base: Vec<(&Config, Scales)> = Vec::new();
    for m in moves {
        if !by_base.iter().any(|(b, _)| *b == &m.baseline) {
            by_base.push((&m.baseline, phase.scales(&m.baseline)));
        }
    }
    let mut moved = Vec::new();
    for (m, ob) in moves.iter().zip(&phase.observed) {
        let Some((_, sc)) = by_base.iter().find(|(base, _)| *base == &m.baseline) else {
            continue;
        };
        moved.push(judge(space, m, *ob, sc, phase.floor, &depended));
    }
    let first = by_base.first().and_then(|(_, sc)| sc.objective);
    let base = phase.observed.first().map(|(_, b)| *b);
    Some(Findings {
        freeze_below: settings.freeze_below,
        reference: first.map(|(r, _)| r.exp()),
        defaults_pct: match (first, base.and_then(reading)) {
            (Some((r, _)), Some(b)) => Some(pct(b - r)),
            _ => None,
        },
        noise_margin_pct: first.map(|(_, e)| pct(e)),
        moved,
    })
}

/// `space` without the `frozen` parameters (the search's space once the phase has frozen
/// them; `fill` puts their defaults back into its configurations).
pub fn reduce(space: &Space, frozen: &[String]) -> Space {
    let mut s = space.clone();
    s.params.retain(|p| !frozen.contains(&p.name));
    s
}

/// `cfg` (a configuration of the reduced space) with every frozen parameter whose conditions
/// hold at its default, then repaired against the whole space's constraints (which the
/// reduced space skips where they name a frozen parameter): the error of a `reject` one.
pub fn fill(space: &Space, frozen: &[String], cfg: &mut Config) -> Result<(), String> {
    if frozen.is_empty() {
        return Ok(());
    }
    for p in &space.params {
        if frozen.contains(&p.name) && space.active(p, cfg) {
            cfg.insert(p.name.clone(), p.default.clone());
        }
    }
    space.repair(cfg)
}

/// The priors of the parameters `reduce` keeps, in its order.
pub fn reduce_priors(space: &Space, plan: &Plan, frozen: &[String]) -> Plan {
    let priors = if plan.priors.is_empty() {
        Vec::new()
    } else {
        space
            .params
            .iter()
            .zip(&plan.priors)
            .filter(|(p, _)| !frozen.contains(&p.name))
            .map(|(_, pr)| *pr)
            .collect()
    };
    Plan {
        budget: plan.budget,
        priors,
        one_at_a_time: None,
        guided_from: plan.guided_from,
        cap: plan.cap.clone().filter(|c| !frozen.contains(c)),
    }
}
