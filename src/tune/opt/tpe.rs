//! Tree-structured Parzen estimator (Bergstra et al., "Algorithms for Hyper-Parameter
//! Optimization", NeurIPS 2011), independent per parameter as in Optuna's default sampler.
//!
//! Trials are split into "good" (the best fraction of the feasible ones) and "bad" (the rest,
//! *including* infeasible and failed trials). Each parameter gets a density over the good
//! values, l(x), and one over the bad, g(x), built only from trials where the parameter was
//! active (which is how conditional parameters are handled). Candidates drawn from l are scored
//! by Σ log l − log g; the best wins. Because failed trials sit in g, the region that crashed
//! scores low: that is the feasibility model.

use rand::Rng;

use super::prior::{exponent, log_density};
use super::{guided, ranked, rng_for, Algorithm, Obs, Optimizer, Plan, Proposal};
use crate::space::Space;
use crate::tune::encode::{arity, decode, encode, random_config, random_coord, random_unit, Coord};
use crate::tune::significance::cdf;

/// The share of a parameter's candidate values drawn from its prior while the prior has its
/// full weight (πBO's exponent at 1 or more).
const PRIOR_DRAWS: f64 = 0.2;
/// Candidates drawn from l per proposal.
const CANDIDATES: usize = 32;

pub struct Tpe {
    space: Space,
    seed: u64,
    plan: Plan,
}

impl Tpe {
    pub fn new(space: Space, seed: u64, plan: Plan) -> Self {
        Tpe { space, seed, plan }
    }
}

/// A Parzen density over one parameter's coordinate, mixed with a uniform prior (weight 1 for
/// a numeric parameter, one pseudo-count per value for a categorical one, so that a value no
/// good trial had keeps a fair chance).
enum Density {
    Num { mus: Vec<f64>, sigmas: Vec<f64> },
    Cat { probs: Vec<f64> },
}

impl Density {
    fn fit(points: &[Coord], arity: Option<usize>) -> Density {
        match arity {
            Some(k) => {
                let mut counts = vec![1.0; k];
                for p in points {
                    if let Coord::Cat(i) = p {
                        counts[(*i).min(k - 1)] += 1.0;
                    }
                }
                let total: f64 = counts.iter().sum();
                Density::Cat {
                    probs: counts.into_iter().map(|c| c / total).collect(),
                }
            }
            None => {
                let mut mus: Vec<f64> = points
                    .iter()
                    .filter_map(|p| match p {
                        Coord::Num(u) => Some(*u),
                        _ => None,
                    })
                    .collect();
                mus.sort_by(f64::total_cmp);
                // Bandwidth: the larger gap to a neighbour (bounds count as neighbours),
                // clipped so that few points still spread and many still focus.
                let n = mus.len();
                let min_bw = (1.0 / (n as f64 + 1.0)).clamp(0.02, 0.1);
                let sigmas = (0..n)
                    .map(|i| {
                        let left = if i == 0 { mus[0] } else { mus[i] - mus[i - 1] };
                        let right = if i + 1 == n {
                            1.0 - mus[i]
                        } else {
                            mus[i + 1] - mus[i]
                        };
                        left.max(right).clamp(min_bw, 1.0)
                    })
                    .collect();
                Density::Num { mus, sigmas }
            }
        }
    }

    fn pdf(&self, c: Coord) -> f64 {
        match (self, c) {
            (Density::Cat { probs }, Coord::Cat(i)) => probs[i.min(probs.len() - 1)],
            (Density::Num { mus, sigmas }, Coord::Num(x)) => {
                // Prior: uniform on [0, 1] (density 1), weight 1.
                let mut s = 1.0;
                for (m, sg) in mus.iter().zip(sigmas) {
                    let mass = cdf((1.0 - m) / sg) - cdf(-m / sg);
                    let z = (x - m) / sg;
                    s += (-0.5 * z * z).exp()
                        / (sg * (2.0 * std::f64::consts::PI).sqrt())
                        / mass.max(1e-12);
                }
                s / (mus.len() as f64 + 1.0)
            }
            _ => 1.0,
        }
    }

    fn sample(&self, rng: &mut impl Rng) -> Coord {
        match self {
            Density::Cat { probs } => {
                let mut r: f64 = rng.random_range(0.0..1.0);
                for (i, p) in probs.iter().enumerate() {
                    if r < *p {
                        return Coord::Cat(i);
                    }
                    r -= p;
                }
                Coord::Cat(probs.len() - 1)
            }
            Density::Num { mus, sigmas } => {
                let j = rng.random_range(0..=mus.len());
                if j == mus.len() {
                    // The prior component (with its mass at the bounds).
                    return Coord::Num(random_unit(rng));
                }
                let normal = rand_distr::Normal::new(mus[j], sigmas[j]).expect("sigma > 0");
                for _ in 0..100 {
                    let x: f64 = rand_distr::Distribution::sample(&normal, rng);
                    if (0.0..=1.0).contains(&x) {
                        return Coord::Num(x);
                    }
                }
                Coord::Num(mus[j].clamp(0.0, 1.0))
            }
        }
    }
}

impl Optimizer for Tpe {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        let mut rng = rng_for(self.seed, history.len());
        let feasible = history.iter().filter(|h| h.value.is_some()).count();
        if feasible < 2 {
            return Ok(Proposal {
                config: random_config(&self.space, &mut rng)?,
                note: "tpe: fewer than two feasible trials; random".into(),
                expected_improvement: None,
            });
        }
        // πBO: the prior's log density, weighted by an exponent that fades with evidence.
        let beta = exponent(
            self.plan.budget,
            guided(Algorithm::Tpe, &self.space, &self.plan, history.len()),
        );
        let order = ranked(history);
        // γ = 25% of the feasible trials (at least one) are "good".
        let n_good = ((feasible as f64) * 0.25).ceil().max(1.0) as usize;
        let coords: Vec<Vec<Coord>> = history
            .iter()
            .map(|h| encode(&self.space, &h.config))
            .collect();
        let (good, bad): (Vec<usize>, Vec<usize>) =
            (order[..n_good].to_vec(), order[n_good..].to_vec());
        let dens = |set: &[usize], i: usize| {
            let pts: Vec<Coord> = set
                .iter()
                .map(|t| coords[*t][i])
                .filter(|c| *c != Coord::Off)
                .collect();
            Density::fit(&pts, arity(&self.space.params[i]))
        };
        let l: Vec<Density> = (0..self.space.params.len())
            .map(|i| dens(&good, i))
            .collect();
        let g: Vec<Density> = (0..self.space.params.len())
            .map(|i| dens(&bad, i))
            .collect();
        let mut best: Option<(f64, crate::space::Config)> = None;
        for _ in 0..CANDIDATES {
            let cand: Vec<Coord> = self
                .space
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let prior = self.plan.priors.get(i).copied().flatten();
                    match prior {
                        // A share of the draws from the prior keeps its region in reach; it
                        // fades with the prior's weight, so a wrong prior stops crowding
                        // the candidates once the evidence is in.
                        Some(pr) if rng.random_bool(PRIOR_DRAWS * beta.min(1.0)) => {
                            pr.quantile(rng.random_range(0.0..1.0))
                        }
                        _ if rng.random_bool(0.1) => random_coord(p, &mut rng),
                        _ => l[i].sample(&mut rng),
                    }
                })
                .collect();
            let Ok(cfg) = decode(&self.space, &cand) else {
                continue;
            };
            let actual = encode(&self.space, &cfg);
            let score: f64 = actual
                .iter()
                .enumerate()
                .filter(|(_, c)| **c != Coord::Off)
                .map(|(i, c)| l[i].pdf(*c).max(1e-300).ln() - g[i].pdf(*c).max(1e-300).ln())
                .sum::<f64>()
                + beta * log_density(&self.plan.priors, &actual);
            if best.as_ref().is_none_or(|(s, _)| score > *s) {
                best = Some((score, cfg));
            }
        }
        match best {
            Some((score, config)) => Ok(Proposal {
                config,
                note: format!(
                    "tpe: log l/g = {score:.2} ({n_good} good of {})",
                    history.len()
                ),
                expected_improvement: None,
            }),
            None => Ok(Proposal {
                config: self.space.sample(&mut rng)?,
                note: "tpe: no valid candidate; random".into(),
                expected_improvement: None,
            }),
        }
    }
}
