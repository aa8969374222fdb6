//! Bayesian optimisation with a Gaussian process: Matérn 5/2 kernel over the unit-cube
//! coordinates (numeric distance, 0/1 for categorical values, 1 between an inactive and an
//! active parameter), hyper-parameters by marginal likelihood over a small grid, expected
//! improvement on the log objective times the probability of feasibility: a GP per latency
//! limit on each run's measured slack (log measured / limit), and a GP fit to ±1 labels for
//! what no slack explains (failed starts, crashes, missed success rates). The acquisition is maximised over
//! random and local candidates, then refined with argmin's simulated annealing.

use std::cell::RefCell;

use argmin::core::{CostFunction, Error as ArgminError, Executor, State};
use argmin::solver::simulatedannealing::{Anneal, SimulatedAnnealing};
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::prior::{exponent, log_density};
use super::{guided, ranked, rng_for, Algorithm, Obs, Optimizer, Plan, Proposal};
use crate::space::{Config, Space};
use crate::tune::encode::{
    arity, coord_distance, decode, edges, encode, neighbour, random_config, Coord,
};
use crate::tune::significance::{cdf, pdf};

const RANDOM_CANDIDATES: usize = 256;
const LOCAL_CANDIDATES: usize = 24;
const ANNEAL_ITERS: u64 = 80;

pub struct Gp {
    space: Space,
    seed: u64,
    plan: Plan,
}

impl Gp {
    pub fn new(space: Space, seed: u64, plan: Plan) -> Self {
        Gp { space, seed, plan }
    }
}

/// A fitted GP on standardised targets.
struct Model {
    x: Vec<Vec<Coord>>,
    chol: Vec<Vec<f64>>,
    alpha: Vec<f64>,
    /// One length scale per coordinate (automatic relevance determination).
    ls: Vec<f64>,
    noise: f64,
    mean: f64,
    sd: f64,
}

fn kernel(a: &[Coord], b: &[Coord], ls: &[f64]) -> f64 {
    let r2: f64 = a
        .iter()
        .zip(b)
        .zip(ls)
        .map(|((x, y), l)| (coord_distance(*x, *y) / l).powi(2))
        .sum();
    let r = r2.sqrt();
    let s5 = 5f64.sqrt() * r;
    (1.0 + s5 + 5.0 * r * r / 3.0) * (-s5).exp()
}

/// Factors by which a coordinate's length scale is tried around the isotropic fit; the last
/// one makes the coordinate irrelevant.
const ARD_FACTORS: [f64; 6] = [0.25, 0.5, 1.0, 2.0, 4.0, 1e3];
/// Coordinate-descent passes over the length scales.
const ARD_PASSES: usize = 2;

/// The fit of `ys` with these hyper-parameters: the log marginal likelihood, the Cholesky
/// factor and K⁻¹y.
fn fit_with(
    x: &[Vec<Coord>],
    ys: &[f64],
    ls: &[f64],
    noise: f64,
) -> Option<(f64, Vec<Vec<f64>>, Vec<f64>)> {
    let n = ys.len();
    let k: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| kernel(&x[i], &x[j], ls) + if i == j { noise + 1e-9 } else { 0.0 })
                .collect()
        })
        .collect();
    let chol = cholesky(&k)?;
    let alpha = solve_upper_t(&chol, &solve_lower(&chol, ys));
    let fit: f64 = ys.iter().zip(&alpha).map(|(a, b)| a * b).sum();
    let logdet: f64 = (0..n).map(|i| chol[i][i].ln()).sum();
    Some((-0.5 * fit - logdet, chol, alpha))
}

fn cholesky(k: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = k.len();
    let mut l = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|m| l[i][m] * l[j][m]).sum();
            if i == j {
                let d = k[i][i] - s;
                if d <= 0.0 {
                    return None;
                }
                l[i][j] = d.sqrt();
            } else {
                l[i][j] = (k[i][j] - s) / l[j][j];
            }
        }
    }
    Some(l)
}

fn solve_lower(l: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; b.len()];
    for i in 0..b.len() {
        let s: f64 = (0..i).map(|j| l[i][j] * y[j]).sum();
        y[i] = (b[i] - s) / l[i][i];
    }
    y
}

fn solve_upper_t(l: &[Vec<f64>], y: &[f64]) -> Vec<f64> {
    let n = y.len();
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|j| l[j][i] * x[j]).sum();
        x[i] = (y[i] - s) / l[i][i];
    }
    x
}

impl Model {
    /// Fits with the hyper-parameters of highest marginal likelihood (or the given ones): an
    /// isotropic length scale and the noise over a small grid, then, once there are more
    /// trials than coordinates, one length scale per coordinate by coordinate descent over
    /// `ARD_FACTORS` (a knob that does not matter gets a long one, and stops diluting the
    /// distance between configurations that differ in the knobs that do).
    fn fit(x: Vec<Vec<Coord>>, y: &[f64], fixed: Option<(&[f64], f64)>) -> Option<Model> {
        let n = y.len();
        let d = x.first().map(|v| v.len()).unwrap_or(1).max(1);
        let mean = y.iter().sum::<f64>() / n as f64;
        let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let sd = if var > 1e-24 { var.sqrt() } else { 1.0 };
        let ys: Vec<f64> = y.iter().map(|v| (v - mean) / sd).collect();
        let model = |lml_fit: Option<(f64, Vec<Vec<f64>>, Vec<f64>)>, ls: Vec<f64>, noise| {
            lml_fit.map(|(lml, chol, alpha)| {
                (
                    lml,
                    Model {
                        x: x.clone(),
                        chol,
                        alpha,
                        ls,
                        noise,
                        mean,
                        sd,
                    },
                )
            })
        };
        if let Some((ls, noise)) = fixed {
            return model(fit_with(&x, &ys, ls, noise), ls.to_vec(), noise).map(|(_, m)| m);
        }
        let mut best: Option<(f64, Model)> = None;
        for l in [0.1, 0.2, 0.35, 0.6, 1.0] {
            for noise in [1e-4, 1e-2, 0.1] {
                let ls = vec![l * (d as f64).sqrt(); d];
                if let Some((lml, m)) = model(fit_with(&x, &ys, &ls, noise), ls, noise) {
                    if best.as_ref().is_none_or(|(b, _)| lml > *b) {
                        best = Some((lml, m));
                    }
                }
            }
        }
        let (mut lml, mut m) = best?;
        if n > d + 1 {
            let base = m.ls.clone();
            for _ in 0..ARD_PASSES {
                for i in 0..d {
                    for f in ARD_FACTORS {
                        let mut ls = m.ls.clone();
                        ls[i] = base[i] * f;
                        if ls[i] == m.ls[i] {
                            continue;
                        }
                        if let Some((l2, m2)) = model(fit_with(&x, &ys, &ls, m.noise), ls, m.noise)
                        {
                            if l2 > lml {
                                (lml, m) = (l2, m2);
                            }
                        }
                    }
                }
            }
        }
        Some(m)
    }

    /// This model conditioned on more points, `ys` in its standardised scale, with its
    /// hyper-parameters and its standardisation (its prior mean and scale stay).
    fn conditioned(&self, more: Vec<Vec<Coord>>, ys: Vec<f64>, own: &[f64]) -> Option<Model> {
        let x: Vec<Vec<Coord>> = self.x.iter().cloned().chain(more).collect();
        let y: Vec<f64> = own.iter().copied().chain(ys).collect();
        let (_, chol, alpha) = fit_with(&x, &y, &self.ls, self.noise)?;
        Some(Model {
            x,
            chol,
            alpha,
            ls: self.ls.clone(),
            noise: self.noise,
            mean: self.mean,
            sd: self.sd,
        })
    }

    /// Posterior mean and standard deviation in the standardised scale.
    fn predict(&self, c: &[Coord]) -> (f64, f64) {
        let ks: Vec<f64> = self.x.iter().map(|xi| kernel(xi, c, &self.ls)).collect();
        let mu: f64 = ks.iter().zip(&self.alpha).map(|(a, b)| a * b).sum();
        let v = solve_lower(&self.chol, &ks);
        let var = (1.0 - v.iter().map(|x| x * x).sum::<f64>()).max(1e-12);
        (mu, var.sqrt())
    }
}

/// The acquisition: expected improvement (standardised) times the probability of feasibility.
struct Acquisition<'a> {
    space: &'a Space,
    obj: Model,
    feas: Option<Model>,
    /// One model per latency limit of the slack (log measured / limit; feasible below 0).
    slack: Vec<Model>,
    /// Best standardised target.
    best: f64,
    rng: RefCell<StdRng>,
    /// The workload's priors and πBO's exponent on them (`prior::exponent`).
    priors: &'a [Option<super::Prior>],
    beta: f64,
    /// With trials running, the finished trials' own model (`obj` believes the running
    /// points): what the study's expected improvement is read from (`unbelieved`).
    finished: Option<Model>,
}

impl Acquisition<'_> {
    /// The acquisition (EI × P(feasible) × prior) and the expected improvement at `c`.
    fn value(&self, c: &[Coord]) -> (f64, f64) {
        self.value_by(&self.obj, c)
    }

    /// The expected improvement where the finished trials' own model puts its acquisition's
    /// best among `cands`: what a sequential study would have reported there, a little below
    /// it (no annealing refines the point, the candidates are this proposal's, and the
    /// prior's exponent counts the running trials as guided). None with nothing running
    /// (`value` is that).
    fn unbelieved(&self, cands: &[Vec<Coord>]) -> Option<f64> {
        let m = self.finished.as_ref()?;
        cands
            .iter()
            .map(|c| self.value_by(m, c))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, ei)| ei)
    }

    fn value_by(&self, obj: &Model, c: &[Coord]) -> (f64, f64) {
        let (mu, sd) = obj.predict(c);
        let z = (mu - self.best - 0.01) / sd;
        let ei = sd * (z * cdf(z) + pdf(z));
        let pf = match &self.feas {
            Some(f) => {
                let (m, s) = f.predict(c);
                // Back to label units, then a probit.
                cdf((m * f.sd + f.mean) / (s * f.sd).max(0.3))
            }
            None => 1.0,
        };
        let pf = self.slack.iter().fold(pf, |p, m| {
            let (mu, s) = m.predict(c);
            // Back to slack units: P(slack <= 0).
            p * cdf(-(mu * m.sd + m.mean) / (s * m.sd).max(1e-9))
        });
        let prior = (self.beta * log_density(self.priors, c)).exp();
        (ei.max(0.0) * pf * prior, ei.max(0.0))
    }

    fn of_params(&self, p: &[f64]) -> Vec<Coord> {
        self.space
            .params
            .iter()
            .zip(p)
            .map(|(q, x)| match arity(q) {
                Some(k) => Coord::Cat((x.round().max(0.0) as usize).min(k - 1)),
                None => Coord::Num(x.clamp(0.0, 1.0)),
            })
            .collect()
    }
}

fn to_params(c: &[Coord]) -> Vec<f64> {
    c.iter()
        .map(|x| match x {
            Coord::Num(u) => *u,
            Coord::Cat(i) => *i as f64,
            Coord::Off => 0.0,
        })
        .collect()
}

impl CostFunction for Acquisition<'_> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, p: &Vec<f64>) -> Result<f64, ArgminError> {
        let coords = self.of_params(p);
        match decode(self.space, &coords) {
            Ok(cfg) => {
                let (a, _) = self.value(&encode(self.space, &cfg));
                Ok(-(a + 1e-12).ln())
            }
            Err(_) => Ok(1e3),
        }
    }
}

impl Anneal for Acquisition<'_> {
    type Param = Vec<f64>;
    type Output = Vec<f64>;
    type Float = f64;
    fn anneal(&self, p: &Vec<f64>, extent: f64) -> Result<Vec<f64>, ArgminError> {
        let coords = self.of_params(p);
        let scale = (0.3 * extent).clamp(0.02, 0.3);
        let mut rng = self.rng.borrow_mut();
        let moves = rng.random_range(1..=2);
        Ok(to_params(&neighbour(
            self.space, &coords, moves, scale, &mut *rng,
        )))
    }
}

impl Gp {
    /// The feasibility models: one GP per latency limit on the measured slack (log measured
    /// / limit) of every run that measured it, so the boundary is learnt from feasible and
    /// infeasible runs alike; and a classifier on ±1 labels for what no slack explains (a
    /// crash, a failed start, a missed success rate), with the objective's length scales.
    fn feasibility(&self, history: &[Obs], obj: &Model) -> (Vec<Model>, Option<Model>) {
        let limits = history.iter().map(|h| h.slack.len()).max().unwrap_or(0);
        let mut slack_models = Vec::new();
        for j in 0..limits {
            let (xs, ys): (Vec<Vec<Coord>>, Vec<f64>) = history
                .iter()
                .filter_map(|h| {
                    h.slack
                        .get(j)
                        .copied()
                        .flatten()
                        .filter(|v| v.is_finite())
                        .map(|v| (encode(&self.space, &h.config), v))
                })
                .unzip();
            if ys.len() >= 2 {
                if let Some(m) = Model::fit(xs, &ys, None) {
                    slack_models.push(m);
                }
            }
        }
        let unexplained = |h: &Obs| {
            h.value.is_none() && (h.failed || slack_models.is_empty() || !h.missed_a_limit())
        };
        let feas = if history.iter().any(unexplained) {
            let xs: Vec<Vec<Coord>> = history
                .iter()
                .map(|h| encode(&self.space, &h.config))
                .collect();
            let labels: Vec<f64> = history
                .iter()
                .map(|h| if unexplained(h) { -1.0 } else { 1.0 })
                .collect();
            Model::fit(xs, &labels, Some((&obj.ls, 0.05)))
        } else {
            None
        };
        (slack_models, feas)
    }

    /// The acquisition's candidates: random points, draws from the prior (so that its region
    /// is among them), and the edges and neighbours of the best three feasible trials.
    fn candidates(&self, history: &[Obs], rng: &mut StdRng) -> Vec<Vec<Coord>> {
        let mut cands: Vec<Vec<Coord>> = Vec::new();
        for _ in 0..RANDOM_CANDIDATES {
            if let Ok(c) = random_config(&self.space, rng) {
                cands.push(encode(&self.space, &c));
            }
        }
        if self.plan.priors.iter().any(Option::is_some) {
            for _ in 0..RANDOM_CANDIDATES / 4 {
                let c: Vec<Coord> = self
                    .space
                    .params
                    .iter()
                    .enumerate()
                    .map(|(i, p)| match self.plan.priors.get(i).copied().flatten() {
                        Some(pr) => pr.quantile(rng.random_range(0.0..1.0)),
                        None => crate::tune::encode::random_coord(p, rng),
                    })
                    .collect();
                if let Ok(cfg) = decode(&self.space, &c) {
                    cands.push(encode(&self.space, &cfg));
                }
            }
        }
        for t in ranked(history).into_iter().take(3) {
            if history[t].value.is_none() {
                continue;
            }
            let start = encode(&self.space, &history[t].config);
            for e in edges(&self.space, &start) {
                if let Ok(c) = decode(&self.space, &e) {
                    cands.push(encode(&self.space, &c));
                }
            }
            for _ in 0..LOCAL_CANDIDATES {
                let n = neighbour(&self.space, &start, rng.random_range(1..=2), 0.1, rng);
                if let Ok(c) = decode(&self.space, &n) {
                    cands.push(encode(&self.space, &c));
                }
            }
        }
        cands
    }
}

impl Optimizer for Gp {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        self.believing(history, &[])
    }

    /// With trials running: the Kriging believer (Ginsbourger et al. 2010). The model is fit
    /// on the finished trials, then conditioned, with the same hyper-parameters and
    /// standardisation, on each running configuration at its own posterior mean: the mean
    /// surface is unchanged (nothing false is learnt, the fit's length scales are the
    /// history's), the variance collapses at and near the running points, so the expected
    /// improvement there does too and the next proposal goes elsewhere, yet stays where the
    /// model expects the best. (A constant liar
    /// at the worst value, tried first, pulled the mean of the best region down with every
    /// running trial placed there: with 8 slots on the 10-parameter landscape fewer seeds came
    /// within 2% of the optimum than with one.)
    fn propose_batch(
        &mut self,
        history: &[Obs],
        running: &[Config],
    ) -> Result<Option<Proposal>, String> {
        self.believing(history, running).map(Some)
    }
}

impl Gp {
    /// The model to propose with, and the finished trials' own beside it when trials run:
    /// `fitted` conditioned on each running point at its posterior mean, in the history's
    /// standardisation and with its hyper-parameters (the mean surface is the history's; only
    /// the variance falls at and near the running points). With nothing running, or a kernel
    /// matrix that is not positive definite (which the noise term all but rules out; the
    /// repeat check still spreads the batch), `fitted` alone.
    fn believe(&self, fitted: Model, y: &[f64], running: &[Config]) -> (Model, Option<Model>) {
        if running.is_empty() {
            return (fitted, None);
        }
        let xr: Vec<Vec<Coord>> = running.iter().map(|c| encode(&self.space, c)).collect();
        let believed: Vec<f64> = xr.iter().map(|c| fitted.predict(c).0).collect();
        let own: Vec<f64> = y.iter().map(|v| (v - fitted.mean) / fitted.sd).collect();
        match fitted.conditioned(xr, believed, &own) {
            Some(m) => (m, Some(fitted)),
            None => (fitted, None),
        }
    }

    /// The proposal after `history` with `running` believed at the model's mean (none: the
    /// sequential proposal). The random streams are numbered by finished plus running trials,
    /// so that each proposal of a batch has its own.
    fn believing(&mut self, history: &[Obs], running: &[Config]) -> Result<Proposal, String> {
        let n = history.len() + running.len();
        let mut rng = rng_for(self.seed, n);
        let feasible: Vec<&Obs> = history.iter().filter(|h| h.value.is_some()).collect();
        if feasible.is_empty() {
            return Ok(Proposal {
                config: random_config(&self.space, &mut rng)?,
                note: "gp: no feasible trial yet; random".into(),
                expected_improvement: None,
            });
        }
        let values: Vec<f64> = feasible.iter().filter_map(|h| h.value).collect();
        let use_log = values.iter().all(|v| *v > 0.0);
        let tr = |v: f64| if use_log { v.ln() } else { v };
        // The objective model sees every trial that ran, feasible or not (a run that missed
        // an SLO still tells how fast that region is; the feasibility model handles the SLO).
        // Crashed trials enter at the worst value seen, as SMAC does, so that its mean, not
        // only the feasibility model, steers away from them.
        let worst = values.iter().map(|v| tr(*v)).fold(f64::INFINITY, f64::min);
        let y: Vec<f64> = history
            .iter()
            .map(|h| match (h.value, h.measured) {
                (Some(v), _) => tr(v),
                (None, Some(m)) if m > 0.0 || !use_log => tr(m),
                _ => worst,
            })
            .collect();
        let x: Vec<Vec<Coord>> = history
            .iter()
            .map(|h| encode(&self.space, &h.config))
            .collect();
        let Some(fitted) = Model::fit(x, &y, None) else {
            return Ok(Proposal {
                config: self.space.sample(&mut rng)?,
                note: "gp: kernel matrix not positive definite; random".into(),
                expected_improvement: None,
            });
        };
        let (slack_models, feas) = self.feasibility(history, &fitted);
        let (obj, finished) = self.believe(fitted, &y, running);
        // The best finished feasible value: a believed value is no result (and may turn out
        // infeasible).
        let best = values
            .iter()
            .map(|v| (tr(*v) - obj.mean) / obj.sd)
            .fold(f64::NEG_INFINITY, f64::max);
        let acq = Acquisition {
            space: &self.space,
            obj,
            feas,
            slack: slack_models,
            best,
            rng: RefCell::new(rng_for(self.seed ^ 0xA11EA1, n)),
            priors: &self.plan.priors,
            beta: exponent(
                self.plan.budget,
                guided(Algorithm::Gp, &self.space, &self.plan, n),
            ),
            finished,
        };
        let cands = self.candidates(history, &mut rng);
        let Some(start) = cands
            .iter()
            .max_by(|a, b| acq.value(a).0.total_cmp(&acq.value(b).0))
            .cloned()
        else {
            return Err("gp: no valid candidate in the space".into());
        };
        // Refine with argmin's simulated annealing on the acquisition.
        let init = to_params(&crate::tune::encode::complete(&self.space, &start));
        let solver = SimulatedAnnealing::new_with_rng(1.0, rng_for(self.seed ^ 0x5A, n))
            .map_err(|e| format!("gp: {e}"))?;
        let refined = Executor::new(&acq, solver)
            .configure(|s| s.param(init).max_iters(ANNEAL_ITERS))
            .run()
            .ok()
            .and_then(|r| r.state().get_best_param().cloned())
            .map(|p| acq.of_params(&p))
            .and_then(|c| decode(&self.space, &c).ok())
            .map(|cfg| encode(&self.space, &cfg));
        let chosen = match refined {
            Some(r) if acq.value(&r).0 >= acq.value(&start).0 => r,
            _ => start,
        };
        let (a, ei) = acq.value(&chosen);
        let config = decode(&self.space, &chosen)?;
        // EI on the log objective, back in the original units: a relative improvement.
        let scale = if use_log {
            acq.obj.sd
        } else {
            acq.obj.sd
                / values
                    .iter()
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max)
                    .abs()
                    .max(1e-12)
        };
        let rel = ei * scale;
        // With trials running, the study's expected improvement (the convergence rule's) is
        // the finished trials' own, not this point's with the running ones believed: their
        // variance gone from the model makes every EI near them small, and a study that read
        // it would stop while the region it believes in is still being measured.
        let (expected, note) = match acq.unbelieved(&cands) {
            Some(alone) => (
                alone * scale,
                format!(
                    "gp: EI {:.2}% by the finished trials; here {:.2}% with {} running believed (× P(feasible) × prior = {a:.3})",
                    100.0 * alone * scale,
                    100.0 * rel,
                    running.len()
                ),
            ),
            None => (
                rel,
                format!("gp: EI {:.2}% (× P(feasible) × prior = {a:.3})", 100.0 * rel),
            ),
        };
        Ok(Proposal {
            config,
            note,
            expected_improvement: Some(expected),
        })
    }
}

impl<'a> CostFunction for &Acquisition<'a> {
    type Param = Vec<f64>;
    type Output = f64;
    fn cost(&self, p: &Vec<f64>) -> Result<f64, ArgminError> {
        (*self).cost(p)
    }
}

impl<'a> Anneal for &Acquisition<'a> {
    type Param = Vec<f64>;
    type Output = Vec<f64>;
    type Float = f64;
    fn anneal(&self, p: &Vec<f64>, extent: f64) -> Result<Vec<f64>, ArgminError> {
        (*self).anneal(p, extent)
    }
}

/// How much one parameter moves the objective near the best trial, by the GP's posterior mean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    pub param: String,
    /// The predicted objective's spread (max / min − 1, %) as this parameter alone sweeps its
    /// range (9 points, or every value), the others held at the best trial's.
    pub pct: f64,
    /// Whether the spread exceeds twice the run-to-run noise the model fitted (in %): below
    /// it, the study cannot tell the parameter's effect from noise. Never with no more runs
    /// than parameters + 1: the model can then fit any pattern and its noise means nothing.
    pub measurable: bool,
}

/// The effect of every parameter around the best trial (sorted largest first), and the noise
/// the model fitted (%), from the GP fit to every run's measured objective. None with fewer
/// than 3 runs that measured the objective, or when the model cannot be fitted.
pub fn effects(space: &Space, history: &[Obs]) -> Option<(Vec<Effect>, f64)> {
    let ran: Vec<&Obs> = history
        .iter()
        .filter(|h| h.measured.is_some_and(|m| m > 0.0))
        .collect();
    if ran.len() < 3 {
        return None;
    }
    // The log objective, as the optimiser models it: effects read as ratios.
    let y: Vec<f64> = ran.iter().filter_map(|h| h.measured).map(f64::ln).collect();
    let x: Vec<Vec<Coord>> = ran.iter().map(|h| encode(space, &h.config)).collect();
    let m = Model::fit(x, &y, None)?;
    let best = ranked(history)
        .into_iter()
        .map(|i| &history[i])
        .find(|h| h.value.is_some() || h.measured.is_some())?;
    let at = crate::tune::encode::complete(space, &encode(space, &best.config));
    let mean_at = |c: &[Coord]| m.predict(c).0 * m.sd + m.mean;
    let noise_pct = 100.0 * (m.noise.sqrt() * m.sd).exp_m1();
    let determined = ran.len() > space.params.len() + 1;
    let mut out: Vec<Effect> = space
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let points: Vec<Coord> = match arity(p) {
                Some(k) => (0..k).map(Coord::Cat).collect(),
                None => (0..9).map(|j| Coord::Num(j as f64 / 8.0)).collect(),
            };
            let preds: Vec<f64> = points
                .into_iter()
                .map(|c| {
                    let mut v = at.clone();
                    v[i] = c;
                    mean_at(&v)
                })
                .collect();
            let hi = preds.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lo = preds.iter().cloned().fold(f64::INFINITY, f64::min);
            let pct = 100.0 * (hi - lo).exp_m1();
            Effect {
                param: p.name.clone(),
                pct,
                measurable: determined && pct > 2.0 * noise_pct,
            }
        })
        .collect();
    out.sort_by(|a, b| b.pct.total_cmp(&a.pct));
    Some((out, noise_pct))
}
