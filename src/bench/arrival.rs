//! When each request is sent: `vllm bench serve`'s `get_request` schedule. With an infinite
//! rate every request goes at once; otherwise the gaps are gamma-distributed with shape
//! `burstiness` and mean `1/rate` (burstiness 1 is a Poisson process, lower is burstier), and the
//! cumulative schedule is rescaled so that the last request goes out at exactly `N / rate`, as the
//! current vLLM does.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};

/// Offsets in seconds from the start of the run at which requests 0..n are released.
pub fn schedule(n: usize, request_rate: f64, burstiness: f64, seed: u64) -> Vec<f64> {
    if n == 0 || request_rate.is_infinite() {
        return vec![0.0; n];
    }
    let mut cum = Vec::with_capacity(n);
    let mut t = 0.0;
    if burstiness.is_infinite() {
        for _ in 0..n {
            t += 1.0 / request_rate;
            cum.push(t);
        }
    } else {
        let gamma = Gamma::new(burstiness, 1.0 / (request_rate * burstiness))
            .expect("validated: rate > 0 and burstiness > 0");
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..n {
            t += gamma.sample(&mut rng);
            cum.push(t);
        }
    }
    let last = *cum.last().expect("n > 0");
    if last > 0.0 {
        let scale = (n as f64 / request_rate) / last;
        for c in &mut cum {
            *c *= scale;
        }
    }
    cum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(s: &[f64]) -> Vec<f64> {
        let mut prev = 0.0;
        s.iter()
            .map(|&t| {
                let g = t - prev;
                prev = t;
                g
            })
            .collect()
    }

    fn cv(g: &[f64]) -> f64 {
        let m = g.iter().sum::<f64>() / g.len() as f64;
        let v = g.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / g.len() as f64;
        v.sqrt() / m
    }

    #[test]
    fn infinite_rate_releases_everything_at_once() {
        assert_eq!(schedule(3, f64::INFINITY, 1.0, 0), vec![0.0; 3]);
    }

    #[test]
    fn last_request_at_n_over_rate_and_monotone() {
        let s = schedule(1000, 20.0, 1.0, 42);
        assert!((s[999] - 50.0).abs() < 1e-9);
        assert!(s.windows(2).all(|w| w[1] >= w[0]));
    }

    #[test]
    fn poisson_gaps_have_unit_coefficient_of_variation() {
        // Exponential gaps: CV = 1. Gamma(shape k): CV = 1/sqrt(k).
        let g = gaps(&schedule(20_000, 10.0, 1.0, 1));
        assert!((cv(&g) - 1.0).abs() < 0.05, "cv {}", cv(&g));
        let g = gaps(&schedule(20_000, 10.0, 0.25, 1));
        assert!((cv(&g) - 2.0).abs() < 0.15, "cv {}", cv(&g));
        let g = gaps(&schedule(20_000, 10.0, 4.0, 1));
        assert!((cv(&g) - 0.5).abs() < 0.03, "cv {}", cv(&g));
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        assert!((mean - 0.1).abs() < 1e-6);
    }

    #[test]
    fn seeded() {
        assert_eq!(schedule(10, 5.0, 1.0, 9), schedule(10, 5.0, 1.0, 9));
        assert_ne!(schedule(10, 5.0, 1.0, 9), schedule(10, 5.0, 1.0, 10));
    }
}
