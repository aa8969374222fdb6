//! Descriptive statistics computed exactly as numpy computes them, so that every figure matches
//! `vllm bench serve` (which calls `np.mean`, `np.std`, `np.median`, `np.percentile`):
//! pairwise summation for sums, population standard deviation (`ddof=0`), and the default
//! `linear` percentile method with numpy's two-sided `_lerp`.

/// numpy's `pairwise_sum` for float64 (numpy/_core/src/umath/loops_utils.h.src).
fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for &x in a {
            res += x;
        }
        res
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

/// `np.sum` of a 1-D float64 array.
pub fn sum(a: &[f64]) -> f64 {
    pairwise_sum(a)
}

/// `np.mean(a or 0)`: the mean, 0 for an empty sample (vLLM's convention).
pub fn mean(a: &[f64]) -> f64 {
    if a.is_empty() {
        return 0.0;
    }
    sum(a) / a.len() as f64
}

/// `np.std(a or 0)`: population standard deviation.
pub fn std(a: &[f64]) -> f64 {
    if a.is_empty() {
        return 0.0;
    }
    let m = mean(a);
    let sq: Vec<f64> = a.iter().map(|&x| (x - m) * (x - m)).collect();
    (sum(&sq) / a.len() as f64).sqrt()
}

/// A sample sorted once, for several quantiles.
pub struct Sorted(Vec<f64>);

impl Sorted {
    /// Sorts a copy (NaN, which no timing produces, sorts last as in numpy).
    pub fn new(a: &[f64]) -> Self {
        let mut v = a.to_vec();
        v.sort_by(|x, y| x.total_cmp(y));
        Sorted(v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `np.percentile(a or 0, p)` with the default `linear` method.
    pub fn percentile(&self, p: f64) -> f64 {
        let v = &self.0;
        if v.is_empty() {
            return 0.0;
        }
        let n = v.len();
        let q = p / 100.0;
        let virtual_index = (n - 1) as f64 * q;
        let prev = virtual_index.floor().clamp(0.0, (n - 1) as f64);
        let gamma = virtual_index - prev;
        let lo = prev as usize;
        let hi = (lo + 1).min(n - 1);
        lerp(v[lo], v[hi], gamma)
    }

    /// `np.median`: the mean of the two middle values for an even count.
    pub fn median(&self) -> f64 {
        let v = &self.0;
        let n = v.len();
        if n == 0 {
            return 0.0;
        }
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }
}

/// numpy's `_lerp`: interpolates from the nearer end to keep monotonicity and exact endpoints.
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if t >= 0.5 {
        b - diff * (1.0 - t)
    } else {
        a + diff * t
    }
}

/// The statistics printed for one latency metric, in milliseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetricStats {
    pub mean_ms: f64,
    pub median_ms: f64,
    pub std_ms: f64,
    /// `(percentile, value)` for each requested percentile.
    pub percentiles_ms: Vec<(f64, f64)>,
    pub count: usize,
}

impl MetricStats {
    /// From samples in seconds, as vLLM does: every statistic on seconds, then times 1000.
    pub fn from_seconds(samples: &[f64], percentiles: &[f64]) -> Self {
        let sorted = Sorted::new(samples);
        MetricStats {
            mean_ms: mean(samples) * 1000.0,
            median_ms: sorted.median() * 1000.0,
            std_ms: std(samples) * 1000.0,
            percentiles_ms: percentiles
                .iter()
                .map(|&p| (p, sorted.percentile(p) * 1000.0))
                .collect(),
            count: samples.len(),
        }
    }

    pub fn percentile(&self, p: f64) -> Option<f64> {
        self.percentiles_ms
            .iter()
            .find(|(q, _)| (*q - p).abs() < 1e-9)
            .map(|x| x.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-300)
    }

    // Fixtures computed with numpy 1.26 (np.percentile default method, np.std ddof=0).
    #[test]
    fn percentiles_match_numpy() {
        let a = [0.3, 0.1, 0.7, 0.2, 0.9];
        let s = Sorted::new(&a);
        // np.percentile([0.3,0.1,0.7,0.2,0.9], [50, 90, 95, 99, 0, 100])
        assert!(close(s.percentile(50.0), 0.3));
        assert!(close(s.percentile(90.0), 0.82));
        assert!(close(s.percentile(95.0), 0.86));
        assert!(close(s.percentile(99.0), 0.892));
        assert_eq!(s.percentile(0.0), 0.1);
        assert_eq!(s.percentile(100.0), 0.9);
        assert!(close(s.median(), 0.3));
        assert!(close(Sorted::new(&[1.0, 2.0, 3.0, 4.0]).median(), 2.5));
    }

    #[test]
    fn empty_samples_are_zero_like_vllm() {
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(std(&[]), 0.0);
        assert_eq!(Sorted::new(&[]).percentile(99.0), 0.0);
        assert_eq!(Sorted::new(&[]).median(), 0.0);
    }

    #[test]
    fn std_is_population() {
        // np.std([1,2,3,4]) == 1.118033988749895
        assert!(close(std(&[1.0, 2.0, 3.0, 4.0]), 1.118_033_988_749_895));
    }

    #[test]
    fn pairwise_sum_matches_naive_for_exact_values() {
        let v: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        assert_eq!(sum(&v), 499_500.0);
    }
}
