//! Simulated annealing as an ask/tell optimiser. The walk starts at the engine's defaults;
//! each proposal is a neighbour of the current point (one or two parameters moved, numeric ones
//! by a step that shrinks with the temperature). A better trial is always accepted, a worse one
//! with probability exp(−relative loss / T); a failed or infeasible one never. With no new best
//! for `RESTART_AFTER` trials the walk restarts from the best point.
//!
//! The walk is replayed from the history on every proposal (acceptances draw from a stream
//! seeded by trial number), so nothing but the history needs saving.

use rand::Rng;

use super::{rng_for, Obs, Optimizer, Proposal};
use crate::space::Space;
use crate::tune::encode::{decode, encode, neighbour};

/// Initial temperature, in relative objective units: a 5% loss is accepted with p = 1/e.
const T0: f64 = 0.05;
const COOLING: f64 = 0.92;
const RESTART_AFTER: usize = 8;

pub struct Anneal {
    space: Space,
    seed: u64,
}

impl Anneal {
    pub fn new(space: Space, seed: u64) -> Self {
        Anneal { space, seed }
    }
}

struct Walk {
    current: usize,
    best: Option<usize>,
    since_best: usize,
    temperature: f64,
}

impl Anneal {
    fn replay(&self, history: &[Obs]) -> Option<Walk> {
        let baselines = self.space.baselines().len();
        // Start from the best baseline that worked, else from the first feasible trial.
        let start = (0..baselines.min(history.len()))
            .filter(|i| history[*i].value.is_some())
            .max_by(|a, b| {
                history[*a]
                    .value
                    .unwrap()
                    .total_cmp(&history[*b].value.unwrap())
            })
            .or_else(|| history.iter().position(|h| h.value.is_some()))?;
        let mut w = Walk {
            current: start,
            best: Some(start),
            since_best: 0,
            temperature: T0,
        };
        for (j, h) in history.iter().enumerate().skip(baselines.max(start + 1)) {
            let cur = history[w.current].value.unwrap_or(f64::NEG_INFINITY);
            if let Some(v) = h.value {
                let accept = v >= cur || {
                    let loss = (cur - v) / cur.abs().max(1e-12);
                    rng_for(self.seed ^ 0xACCE, j)
                        .random_bool((-loss / w.temperature).exp().min(1.0))
                };
                if accept {
                    w.current = j;
                }
                if w.best
                    .is_none_or(|b| v > history[b].value.unwrap_or(f64::NEG_INFINITY))
                {
                    w.best = Some(j);
                    w.since_best = 0;
                } else {
                    w.since_best += 1;
                }
            } else {
                w.since_best += 1;
            }
            if w.since_best >= RESTART_AFTER {
                w.current = w.best.unwrap_or(w.current);
                w.since_best = 0;
            }
            w.temperature *= COOLING;
        }
        Some(w)
    }
}

impl Optimizer for Anneal {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        // Its own stream: before a feasible start it samples at random, and must not repeat
        // the random optimiser's points.
        let mut rng = rng_for(self.seed ^ 0xA77EA1, history.len());
        let Some(w) = self.replay(history) else {
            return Ok(Proposal {
                config: crate::tune::encode::random_config(&self.space, &mut rng)?,
                note: "anneal: no feasible start yet; random".into(),
                expected_improvement: None,
            });
        };
        let from = encode(&self.space, &history[w.current].config);
        let scale = (0.35 * (w.temperature / T0).sqrt()).clamp(0.05, 0.35);
        for _ in 0..20 {
            let moves = rng.random_range(1..=2);
            let n = neighbour(&self.space, &from, moves, scale, &mut rng);
            if let Ok(config) = decode(&self.space, &n) {
                if config != history[w.current].config {
                    return Ok(Proposal {
                        config,
                        note: format!(
                            "anneal: neighbour of trial {} (T = {:.4})",
                            w.current, w.temperature
                        ),
                        expected_improvement: None,
                    });
                }
            }
        }
        Ok(Proposal {
            config: self.space.sample(&mut rng)?,
            note: "anneal: no valid neighbour; random".into(),
            expected_improvement: None,
        })
    }
}
