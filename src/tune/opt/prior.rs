//! Priors over the unit-cube coordinates (`space::prior` states them, `tune::prior` resolves
//! them against the workload) and the start-up design that uses them.
//!
//! A prior is a mixture: half uniform, half a normal around what the workload implies
//! (truncated to [0, 1]) for a numeric parameter, or half on the implied value for a
//! categorical one. The uniform half is what keeps a wrong prior from stopping convergence:
//! its density never falls below half the uniform's, so the weight it puts on the acquisition
//! (`weight`, πBO: Hvarfner et al., ICLR 2022, the prior to the power β/n) is bounded and fades
//! as model-guided trials accumulate.
//!
//! The start-up design is a Latin hypercube (the most spread of a few, by the smallest
//! distance between two points), each coordinate passed through its prior's quantile function,
//! so the design is stratified under the prior: where the prior is sure, more points land near
//! its value, and every stratum of the range still gets one. Hand-written (a permutation per
//! dimension and a bisection): the crates that offer LHS or Sobol bring a numeric stack for
//! what is twenty lines here, and the design must be a pure function of the seed.

use rand::seq::SliceRandom;
use rand::Rng;

use super::rng_for;
use crate::tune::encode::Coord;
use crate::tune::significance::cdf;

/// The share of a prior's mass on what the workload implies (the rest is uniform).
pub const WEIGHT: f64 = 0.5;

/// One parameter's prior in its unit coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Prior {
    /// A normal around `mu` with standard deviation `sigma`, truncated to [0, 1].
    Num { mu: f64, sigma: f64 },
    /// The value of index `index` among `arity`.
    Cat { index: usize, arity: usize },
    /// Anywhere at or above `lo` (uniformly), with `mode` the point to try first.
    AtLeast { lo: f64, mode: f64 },
}

impl Prior {
    /// The density relative to the uniform (1 where the prior says nothing; at least
    /// `1 - WEIGHT` everywhere).
    pub fn density(&self, c: Coord) -> f64 {
        match (self, c) {
            (Prior::Num { mu, sigma }, Coord::Num(u)) => {
                let mass = cdf((1.0 - mu) / sigma) - cdf(-mu / sigma);
                let z = (u - mu) / sigma;
                let n = (-0.5 * z * z).exp()
                    / (sigma * (2.0 * std::f64::consts::PI).sqrt())
                    / mass.max(1e-12);
                (1.0 - WEIGHT) + WEIGHT * n
            }
            (Prior::Cat { index, arity }, Coord::Cat(i)) => {
                let k = *arity as f64;
                let p = (1.0 - WEIGHT) / k + if i == *index { WEIGHT } else { 0.0 };
                p * k
            }
            (Prior::AtLeast { lo, .. }, Coord::Num(u)) => {
                let lo = lo.min(0.999);
                (1.0 - WEIGHT) + if u >= lo { WEIGHT / (1.0 - lo) } else { 0.0 }
            }
            _ => 1.0,
        }
    }

    /// The coordinate at quantile `q` of the prior (the inverse of its distribution function).
    pub fn quantile(&self, q: f64) -> Coord {
        let q = q.clamp(0.0, 1.0);
        let invert = |f: &dyn Fn(f64) -> f64| {
            let (mut a, mut b) = (0.0, 1.0);
            for _ in 0..60 {
                let m = 0.5 * (a + b);
                if f(m) < q {
                    a = m;
                } else {
                    b = m;
                }
            }
            Coord::Num(0.5 * (a + b))
        };
        match self {
            Prior::Num { mu, sigma } => {
                let lo = cdf(-mu / sigma);
                let mass = (cdf((1.0 - mu) / sigma) - lo).max(1e-12);
                invert(&|x| (1.0 - WEIGHT) * x + WEIGHT * (cdf((x - mu) / sigma) - lo) / mass)
            }
            Prior::AtLeast { lo, .. } => {
                let lo = lo.min(0.999);
                invert(&|x| (1.0 - WEIGHT) * x + WEIGHT * ((x - lo).max(0.0) / (1.0 - lo)))
            }
            Prior::Cat { index, arity } => {
                let k = *arity as f64;
                let mut acc = 0.0;
                for i in 0..*arity {
                    acc += (1.0 - WEIGHT) / k + if i == *index { WEIGHT } else { 0.0 };
                    if q < acc {
                        return Coord::Cat(i);
                    }
                }
                Coord::Cat(arity - 1)
            }
        }
    }

    /// What the workload implies: the prior's mode.
    pub fn mode(&self) -> Coord {
        match self {
            Prior::Num { mu, .. } => Coord::Num(*mu),
            Prior::Cat { index, .. } => Coord::Cat(*index),
            Prior::AtLeast { mode, .. } => Coord::Num(*mode),
        }
    }
}

/// The log of the prior density of a point (relative to the uniform): 0 without priors.
pub fn log_density(priors: &[Option<Prior>], coords: &[Coord]) -> f64 {
    priors
        .iter()
        .zip(coords)
        .filter_map(|(p, c)| p.as_ref().map(|p| p.density(*c).ln()))
        .sum()
}

/// πBO's exponent for the prior after `guided` model-guided trials, in a study of `budget`
/// trials: β/n with β = budget/10 (the paper's choice), so the prior counts as much as about
/// a tenth of the budget's evidence and fades as 1/n.
pub fn exponent(budget: usize, guided: usize) -> f64 {
    (budget as f64 / 10.0).max(1.0) / (guided as f64 + 1.0)
}

/// A space-filling start-up design of `n` points over parameters of the given arities
/// (`None`: numeric): a maximin Latin hypercube shaped by the priors (see the module header).
/// A pure function of the seed.
pub fn design(
    arities: &[Option<usize>],
    priors: &[Option<Prior>],
    n: usize,
    seed: u64,
) -> Vec<Vec<Coord>> {
    if n == 0 {
        return Vec::new();
    }
    let mut rng = rng_for(seed ^ 0x1A7_1CE, 0);
    let d = arities.len();
    let mut best: Option<(f64, Vec<Vec<f64>>)> = None;
    for _ in 0..24 {
        // One stratified column per dimension: point i lies in stratum perm[i].
        let cols: Vec<Vec<f64>> = (0..d)
            .map(|_| {
                let mut perm: Vec<usize> = (0..n).collect();
                perm.shuffle(&mut rng);
                perm.into_iter()
                    .map(|s| (s as f64 + rng.random_range(0.0..1.0)) / n as f64)
                    .collect()
            })
            .collect();
        let pts: Vec<Vec<f64>> = (0..n)
            .map(|i| cols.iter().map(|c| c[i]).collect())
            .collect();
        let mut closest = f64::INFINITY;
        for a in 0..n {
            for b in a + 1..n {
                let d2: f64 = pts[a]
                    .iter()
                    .zip(&pts[b])
                    .map(|(x, y)| (x - y).powi(2))
                    .sum();
                closest = closest.min(d2);
            }
        }
        if best.as_ref().is_none_or(|(c, _)| closest > *c) {
            best = Some((closest, pts));
        }
    }
    let pts = best.map(|(_, p)| p).unwrap_or_default();
    pts.into_iter()
        .map(|row| {
            row.into_iter()
                .enumerate()
                .map(
                    |(j, q)| match (priors.get(j).copied().flatten(), arities[j]) {
                        (Some(p), _) => p.quantile(q),
                        (None, Some(k)) => Coord::Cat(((q * k as f64) as usize).min(k - 1)),
                        (None, None) => Coord::Num(q),
                    },
                )
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_density_never_falls_below_the_uniform_share_and_peaks_at_the_mode() {
        let p = Prior::Num {
            mu: 0.8,
            sigma: 0.1,
        };
        for i in 0..=100 {
            let d = p.density(Coord::Num(i as f64 / 100.0));
            assert!(d >= 1.0 - WEIGHT - 1e-12, "{d} at {i}");
        }
        assert!(p.density(Coord::Num(0.8)) > 2.0);
        assert!(p.density(Coord::Num(0.8)) > p.density(Coord::Num(0.6)));
        let c = Prior::Cat { index: 1, arity: 3 };
        assert!((c.density(Coord::Cat(1)) - (0.5 / 3.0 + 0.5) * 3.0).abs() < 1e-12);
        assert!((c.density(Coord::Cat(0)) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn the_quantile_inverts_the_mixture_and_concentrates_near_the_mode() {
        let p = Prior::Num {
            mu: 0.7,
            sigma: 0.05,
        };
        // Half the mass is the normal: the quantiles from 0.35 + 0.25 ± ... fall near 0.7.
        let Coord::Num(median) = p.quantile(0.5) else {
            panic!()
        };
        assert!(median > 0.55 && median < 0.72, "{median}");
        let mut last = -1.0;
        for i in 0..=20 {
            let Coord::Num(x) = p.quantile(i as f64 / 20.0) else {
                panic!()
            };
            assert!(x >= last && (0.0..=1.0).contains(&x));
            last = x;
        }
        let near = (0..100)
            .filter(|i| match p.quantile((*i as f64 + 0.5) / 100.0) {
                Coord::Num(x) => (x - 0.7).abs() < 0.1,
                _ => false,
            })
            .count();
        // Uniform: 20 of 100 within ±0.1; the prior puts about half its mass there besides.
        assert!(near >= 55, "{near}");
    }

    #[test]
    fn the_design_is_a_latin_hypercube_without_priors_and_deterministic() {
        let ar = [None, None, Some(3)];
        let a = design(&ar, &[], 6, 7);
        assert_eq!(a, design(&ar, &[], 6, 7));
        assert_eq!(a.len(), 6);
        for j in 0..2 {
            let mut strata: Vec<usize> = a
                .iter()
                .map(|r| match r[j] {
                    Coord::Num(x) => (x * 6.0) as usize,
                    _ => panic!(),
                })
                .collect();
            strata.sort();
            assert_eq!(strata, (0..6).collect::<Vec<_>>(), "one point per stratum");
        }
        // Every categorical value appears (6 strata over 3 values: two each).
        for v in 0..3 {
            assert_eq!(a.iter().filter(|r| r[2] == Coord::Cat(v)).count(), 2);
        }
    }

    #[test]
    fn an_at_least_prior_favours_everything_above_its_bound_alike() {
        let p = Prior::AtLeast { lo: 0.5, mode: 0.7 };
        assert_eq!(p.density(Coord::Num(0.2)), 1.0 - WEIGHT);
        assert!((p.density(Coord::Num(0.6)) - p.density(Coord::Num(0.99))).abs() < 1e-12);
        assert!((p.density(Coord::Num(0.6)) - 1.5).abs() < 1e-12);
        let Coord::Num(x) = p.quantile(0.5) else {
            panic!()
        };
        // F(x) = 0.5 x + (x - 0.5): 0.5 at x = 2/3.
        assert!((x - 2.0 / 3.0).abs() < 1e-6, "{x}");
        assert_eq!(p.mode(), Coord::Num(0.7));
    }

    #[test]
    fn the_prior_exponent_fades_with_guided_trials() {
        assert!(exponent(12, 0) > exponent(12, 4));
        assert!((exponent(40, 3) - 1.0).abs() < 1e-12);
        assert_eq!(exponent(5, 0), 1.0);
    }
}
