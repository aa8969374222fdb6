//! Unit-cube coordinates of a configuration, for the model-based optimisers: a number in
//! [0, 1] per numeric parameter (log-scaled where the space says so), an index per categorical
//! or boolean one, and "off" for a parameter whose condition does not hold.

use rand::Rng;

use crate::space::{round_float, Config, Kind, Param, Space, Value};

/// One parameter's coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Coord {
    Num(f64),
    Cat(usize),
    Off,
}

/// How many choices a categorical coordinate has (`None` for numeric parameters).
pub fn arity(p: &Param) -> Option<usize> {
    match &p.kind {
        Kind::Categorical { values } => Some(values.len()),
        Kind::Bool => Some(2),
        _ => None,
    }
}

fn unit(p: &Param, x: f64) -> f64 {
    let (lo, hi, log) = match p.kind {
        Kind::Int { min, max, log, .. } => (min as f64, max as f64, log),
        Kind::Float { min, max, log } => (min, max, log),
        _ => return 0.0,
    };
    if hi <= lo {
        return 0.0;
    }
    let u = if log && lo > 0.0 {
        (x.max(lo).ln() - lo.ln()) / (hi.ln() - lo.ln())
    } else {
        (x - lo) / (hi - lo)
    };
    u.clamp(0.0, 1.0)
}

/// The value of a numeric parameter at unit coordinate `u`.
pub fn from_unit(p: &Param, u: f64) -> Value {
    let u = u.clamp(0.0, 1.0);
    match p.kind {
        Kind::Int {
            min,
            max,
            log,
            step,
        } => {
            let (lo, hi) = (min as f64, max as f64);
            let x = if log && lo > 0.0 {
                (lo.ln() + u * (hi.ln() - lo.ln())).exp()
            } else {
                lo + u * (hi - lo)
            };
            let s = step.unwrap_or(1).max(1);
            let k = ((x - lo) / s as f64).round() as i64;
            Value::Int((min + k * s).clamp(min, max))
        }
        Kind::Float { min, max, log } => {
            let x = if log && min > 0.0 {
                (min.ln() + u * (max.ln() - min.ln())).exp()
            } else {
                min + u * (max - min)
            };
            Value::Float(round_float(x).clamp(min, max))
        }
        _ => p.default.clone(),
    }
}

/// The coordinates of `cfg`, one per parameter of `space` (in file order).
pub fn encode(space: &Space, cfg: &Config) -> Vec<Coord> {
    space
        .params
        .iter()
        .map(|p| cfg.get(&p.name).map_or(Coord::Off, |v| coord_of(p, v)))
        .collect()
}

/// The coordinate of value `v` of parameter `p`.
pub fn coord_of(p: &Param, v: &Value) -> Coord {
    match (v, &p.kind) {
        (Value::Int(x), _) => Coord::Num(unit(p, *x as f64)),
        (Value::Float(x), _) => Coord::Num(unit(p, *x)),
        (Value::Bool(b), _) => Coord::Cat(*b as usize),
        (Value::Str(s), Kind::Categorical { values }) => {
            Coord::Cat(values.iter().position(|v| v == s).unwrap_or(0))
        }
        (Value::Str(_), _) => Coord::Off,
    }
}

/// The configuration at `coords` (an `Off` coordinate means the engine's default): only the
/// parameters whose conditions hold, then the constraints repaired (or the reason it is invalid).
pub fn decode(space: &Space, coords: &[Coord]) -> Result<Config, String> {
    let mut cfg = Config::new();
    for (p, c) in space.params.iter().zip(coords) {
        if !space.active(p, &cfg) {
            continue;
        }
        let v = match (c, &p.kind) {
            (Coord::Off, _) => p.default.clone(),
            (Coord::Num(u), Kind::Int { .. } | Kind::Float { .. }) => from_unit(p, *u),
            (Coord::Cat(i), Kind::Categorical { values }) => {
                Value::Str(values[(*i).min(values.len() - 1)].clone())
            }
            (Coord::Cat(i), Kind::Bool) => Value::Bool(*i == 1),
            _ => p.default.clone(),
        };
        cfg.insert(p.name.clone(), v);
    }
    space.repair(&mut cfg)?;
    Ok(cfg)
}

/// A unit coordinate that lands on a bound a quarter of the time, else uniform. Engine knobs
/// often do best at an end of their sensible range (the largest batch, the most memory), which
/// a uniform draw almost never hits.
pub fn random_unit(rng: &mut impl Rng) -> f64 {
    let r: f64 = rng.random_range(0.0..1.0);
    if r < 0.125 {
        0.0
    } else if r < 0.25 {
        1.0
    } else {
        rng.random_range(0.0..=1.0)
    }
}

/// A random coordinate for parameter `p`: a uniform value of a categorical one, `random_unit`
/// for a numeric one.
pub fn random_coord(p: &Param, rng: &mut impl Rng) -> Coord {
    match arity(p) {
        Some(k) => Coord::Cat(rng.random_range(0..k)),
        None => Coord::Num(random_unit(rng)),
    }
}

/// A random configuration drawn with `random_coord` (valid: drawn again up to 100 times).
pub fn random_config(space: &Space, rng: &mut impl Rng) -> Result<Config, String> {
    let mut last = String::new();
    for _ in 0..100 {
        let c: Vec<Coord> = space.params.iter().map(|p| random_coord(p, rng)).collect();
        match decode(space, &c) {
            Ok(cfg) => return Ok(cfg),
            Err(e) => last = e,
        }
    }
    Err(format!("no valid point in 100 draws; the last: {last}"))
}

/// Copies of `coords` with one numeric coordinate at a bound (both bounds, every one).
pub fn edges(space: &Space, coords: &[Coord]) -> Vec<Vec<Coord>> {
    let full = complete(space, coords);
    let mut out = Vec::new();
    for (i, p) in space.params.iter().enumerate() {
        if arity(p).is_some() {
            continue;
        }
        for b in [0.0, 1.0] {
            if full[i] != Coord::Num(b) {
                let mut c = full.clone();
                c[i] = Coord::Num(b);
                out.push(c);
            }
        }
    }
    out
}

/// Coordinates for every parameter, with defaults in place of `Off`, so that a move that
/// switches a condition on has a value to start from.
pub fn complete(space: &Space, coords: &[Coord]) -> Vec<Coord> {
    let defaults = encode(space, &all_defaults(space));
    coords
        .iter()
        .zip(defaults)
        .map(|(c, d)| if *c == Coord::Off { d } else { *c })
        .collect()
}

/// Every parameter at its default, conditions ignored.
fn all_defaults(space: &Space) -> Config {
    space
        .params
        .iter()
        .map(|p| (p.name.clone(), p.default.clone()))
        .collect()
}

/// Distance between two coordinates of one parameter, in [0, 1].
pub fn coord_distance(a: Coord, b: Coord) -> f64 {
    match (a, b) {
        (Coord::Num(x), Coord::Num(y)) => (x - y).abs(),
        (Coord::Cat(x), Coord::Cat(y)) => (x != y) as u8 as f64,
        (Coord::Off, Coord::Off) => 0.0,
        _ => 1.0,
    }
}

/// A neighbour: `moves` parameters changed (numeric ones by a Gaussian step of `scale`).
pub fn neighbour(
    space: &Space,
    coords: &[Coord],
    moves: usize,
    scale: f64,
    rng: &mut impl Rng,
) -> Vec<Coord> {
    let mut out = complete(space, coords);
    if out.is_empty() {
        return out;
    }
    for _ in 0..moves.max(1) {
        let i = rng.random_range(0..out.len());
        let p = &space.params[i];
        out[i] = match (out[i], arity(p)) {
            (Coord::Num(u), None) => {
                let step: f64 = rand_distr::Distribution::sample(
                    &rand_distr::Normal::new(0.0, scale).expect("positive scale"),
                    rng,
                );
                Coord::Num((u + step).clamp(0.0, 1.0))
            }
            (Coord::Cat(c), Some(k)) if k > 1 => {
                let mut n = rng.random_range(0..k - 1);
                if n >= c {
                    n += 1;
                }
                Coord::Cat(n)
            }
            (c, _) => c,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Space {
        Space::parse(
            r#"
[engine]
name = "t"
argv = ["{binary}", "-m", "{model}", "--port", "{port}"]
binary = "t"
[[param]]
name = "seqs"
flag = "--seqs"
type = "int"
min = 1
max = 1024
log = true
default = 256
source = "test"
[[param]]
name = "spec"
flag = "--spec"
type = "categorical"
values = ["none", "ngram"]
default = "none"
source = "test"
[[param]]
name = "k"
flag = "--k"
type = "int"
min = 1
max = 8
default = 3
when = { spec = "ngram" }
source = "test"
[[param]]
name = "util"
flag = "--util"
type = "float"
min = 0.5
max = 0.95
default = 0.9
source = "test"
"#,
            "t.toml",
        )
        .unwrap()
    }

    #[test]
    fn encode_then_decode_gives_the_same_configuration() {
        let s = space();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(3);
        for _ in 0..200 {
            let cfg = s.sample(&mut rng).unwrap();
            let back = decode(&s, &encode(&s, &cfg)).unwrap();
            assert_eq!(back, cfg);
        }
    }

    #[test]
    fn inactive_parameters_are_off_and_log_scale_is_used() {
        let s = space();
        let d = s.defaults();
        let c = encode(&s, &d);
        assert_eq!(c[2], Coord::Off, "k is inactive without speculation");
        // 256 on a log scale of [1, 1024] is at 0.8.
        match c[0] {
            Coord::Num(u) => assert!((u - 0.8).abs() < 1e-9, "{u}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(coord_distance(Coord::Off, Coord::Num(0.3)), 1.0);
    }

    #[test]
    fn neighbours_stay_in_the_cube_and_change_something() {
        let s = space();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
        let start = encode(&s, &s.defaults());
        let mut changed = 0;
        for _ in 0..100 {
            let n = neighbour(&s, &start, 1, 0.2, &mut rng);
            for c in &n {
                if let Coord::Num(u) = c {
                    assert!((0.0..=1.0).contains(u));
                }
            }
            if decode(&s, &n).unwrap() != s.defaults() {
                changed += 1;
            }
        }
        assert!(changed > 50, "{changed}");
    }
}
