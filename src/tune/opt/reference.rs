//! The optimisers to beat: random sampling, a shuffled grid, and the method of the hand-tuning
//! reports in `shared/seeds/` (defaults, one option at a time, then the winners combined).

use std::collections::HashSet;

use rand::seq::SliceRandom;

use super::{key, rng_for, Obs, Optimizer, Proposal};
use crate::space::{Config, Space};
use crate::tune::encode::{arity, decode, encode, Coord};

pub struct Random {
    space: Space,
    seed: u64,
}

impl Random {
    pub fn new(space: Space, seed: u64) -> Self {
        Random { space, seed }
    }
}

impl Optimizer for Random {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        let mut rng = rng_for(self.seed, history.len());
        Ok(Proposal {
            config: self.space.sample(&mut rng)?,
            note: "random".into(),
            expected_improvement: None,
        })
    }
}

/// Levels of a numeric parameter on the grid, in unit coordinates.
const GRID_LEVELS: [f64; 3] = [0.0, 0.5, 1.0];
/// A grid larger than this uses two levels per numeric parameter.
const GRID_MAX: usize = 200_000;

pub struct Grid {
    /// Distinct valid configurations of the grid, in a seeded random order.
    points: Vec<(String, Config)>,
}

impl Grid {
    pub fn new(space: Space, seed: u64) -> Self {
        let mut levels: Vec<Vec<Coord>> = space
            .params
            .iter()
            .map(|p| match arity(p) {
                Some(k) => (0..k).map(Coord::Cat).collect(),
                None => GRID_LEVELS.iter().map(|u| Coord::Num(*u)).collect(),
            })
            .collect();
        let size = |l: &Vec<Vec<Coord>>| {
            l.iter()
                .map(|v| v.len())
                .try_fold(1usize, |a, n| a.checked_mul(n))
        };
        if size(&levels).is_none_or(|s| s > GRID_MAX) {
            for (l, p) in levels.iter_mut().zip(&space.params) {
                if arity(p).is_none() {
                    *l = vec![Coord::Num(0.0), Coord::Num(1.0)];
                }
            }
        }
        let mut points = Vec::new();
        let mut seen = HashSet::new();
        if size(&levels).is_some_and(|s| s <= GRID_MAX * 4) {
            let mut idx = vec![0usize; levels.len()];
            loop {
                let coords: Vec<Coord> = idx.iter().zip(&levels).map(|(i, l)| l[*i]).collect();
                if let Ok(cfg) = decode(&space, &coords) {
                    let k = key(&cfg);
                    if seen.insert(k.clone()) {
                        points.push((k, cfg));
                    }
                }
                // Odometer increment.
                let mut d = 0;
                while d < idx.len() {
                    idx[d] += 1;
                    if idx[d] < levels[d].len() {
                        break;
                    }
                    idx[d] = 0;
                    d += 1;
                }
                if d == idx.len() {
                    break;
                }
            }
        }
        points.shuffle(&mut rng_for(seed, usize::MAX));
        Grid { points }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// The grid's configurations, in its order.
    pub fn configs(&self) -> impl Iterator<Item = &Config> {
        self.points.iter().map(|(_, c)| c)
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

impl Optimizer for Grid {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        let seen: HashSet<String> = history.iter().map(|h| key(&h.config)).collect();
        let done = self.points.iter().filter(|(k, _)| seen.contains(k)).count();
        match self.points.iter().find(|(k, _)| !seen.contains(k)) {
            Some((_, cfg)) => Ok(Proposal {
                config: cfg.clone(),
                note: format!("grid point {} of {}", done + 1, self.points.len()),
                expected_improvement: None,
            }),
            None => Err(format!(
                "the grid's {} points are all measured",
                self.points.len()
            )),
        }
    }
}

/// Numeric levels the reports try for one option (quarters of the range).
const REPORT_LEVELS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

pub struct Reports {
    space: Space,
    /// Phase 1: the defaults with one option changed, each tagged with that option.
    singles: Vec<(String, Config)>,
}

impl Reports {
    pub fn new(space: Space) -> Self {
        let mut singles = Vec::new();
        let mut seen = HashSet::new();
        for base in space.baselines() {
            seen.insert(key(&base));
            let coords = encode(&space, &base);
            for (i, p) in space.params.iter().enumerate() {
                if p.name == "engine" || coords[i] == Coord::Off {
                    continue;
                }
                let alts: Vec<Coord> = match arity(p) {
                    Some(k) => (0..k).map(Coord::Cat).collect(),
                    None => REPORT_LEVELS.iter().map(|u| Coord::Num(*u)).collect(),
                };
                for a in alts {
                    let mut c = coords.clone();
                    c[i] = a;
                    if let Ok(cfg) = decode(&space, &c) {
                        if seen.insert(key(&cfg)) {
                            singles.push((p.name.clone(), cfg));
                        }
                    }
                }
            }
        }
        Reports { space, singles }
    }
}

impl Optimizer for Reports {
    fn propose(&mut self, history: &[Obs]) -> Result<Proposal, String> {
        let seen: HashSet<String> = history.iter().map(|h| key(&h.config)).collect();
        if let Some((name, cfg)) = self.singles.iter().find(|(_, c)| !seen.contains(&key(c))) {
            return Ok(Proposal {
                config: cfg.clone(),
                note: format!("one option at a time: {name}"),
                expected_improvement: None,
            });
        }
        // Phase 2: per option, its best single change if it beat the baseline of its engine;
        // then the winners combined cumulatively in the order of their gains.
        let value_of = |c: &Config| {
            history
                .iter()
                .find(|h| &h.config == c)
                .and_then(|h| h.value)
        };
        let mut best_engine: Option<(Config, f64)> = None;
        for b in self.space.baselines() {
            if let Some(v) = value_of(&b) {
                if best_engine.as_ref().is_none_or(|(_, bv)| v > *bv) {
                    best_engine = Some((b, v));
                }
            }
        }
        // Defaults that fail or miss the constraints: a person would start from the best
        // single change that works.
        if best_engine.is_none() {
            best_engine = self
                .singles
                .iter()
                .filter_map(|(_, c)| value_of(c).map(|v| (c.clone(), v)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
        }
        let Some((base, base_v)) = best_engine else {
            let mut rng = rng_for(0x5E_ED5, history.len());
            return Ok(Proposal {
                config: self.space.sample(&mut rng)?,
                note: "reports' method: nothing works yet; random".into(),
                expected_improvement: None,
            });
        };
        let mut winners: Vec<(String, f64, Config)> = Vec::new();
        for (name, cfg) in &self.singles {
            if cfg.get("engine") != base.get("engine") {
                continue;
            }
            let Some(v) = value_of(cfg) else { continue };
            if v <= base_v {
                continue;
            }
            match winners.iter_mut().find(|w| &w.0 == name) {
                Some(w) if v > w.1 => *w = (name.clone(), v, cfg.clone()),
                Some(_) => {}
                None => winners.push((name.clone(), v, cfg.clone())),
            }
        }
        winners.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut combined = base.clone();
        let mut names = Vec::new();
        for (name, _, cfg) in &winners {
            for (k, v) in cfg {
                if base.get(k) != Some(v) {
                    combined.insert(k.clone(), v.clone());
                }
            }
            self.space.prune(&mut combined);
            names.push(name.clone());
            let mut c = combined.clone();
            if self.space.repair(&mut c).is_ok() && !seen.contains(&key(&c)) && names.len() > 1 {
                return Ok(Proposal {
                    config: c,
                    note: format!("combination: {}", names.join(" + ")),
                    expected_improvement: None,
                });
            }
        }
        // The reports stop here; with budget left, sample at random.
        let mut rng = rng_for(0x5E_ED5, history.len());
        Ok(Proposal {
            config: self.space.sample(&mut rng)?,
            note: "reports' plan exhausted: random".into(),
            expected_improvement: None,
        })
    }
}
