//! The benchmark summary: `vllm bench serve`'s `calculate_metrics` (vllm/benchmarks/serve.py),
//! figure for figure, plus servetune's additions (failures by reason, token-based ITL, a
//! token-weighted peak, server-reported token totals).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record::{FailureKind, RequestRecord};
use super::stats::MetricStats;

/// The latency metrics that can be printed and constrained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    Ttft,
    Tpot,
    Itl,
    E2el,
}

impl Metric {
    pub const ALL: [Metric; 4] = [Metric::Ttft, Metric::Tpot, Metric::Itl, Metric::E2el];

    pub fn key(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Tpot => "tpot",
            Metric::Itl => "itl",
            Metric::E2el => "e2el",
        }
    }

    pub fn parse(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.key() == s.trim())
    }
}

/// `--goodput ttft:MS tpot:MS e2el:MS`: a request is good when it meets every given limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GoodputSlo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl GoodputSlo {
    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }
}

/// What shapes the summary besides the records.
#[derive(Debug, Clone)]
pub struct SummaryConfig {
    /// `--metric-percentiles`, e.g. `[99.0]`.
    pub percentiles: Vec<f64>,
    pub goodput: GoodputSlo,
}

/// The figures of one run. Field names follow vLLM's result JSON where vLLM has the figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    pub duration: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    pub request_goodput: Option<f64>,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub max_output_tokens_per_s: f64,
    pub max_concurrent_requests: u64,
    pub ttft: MetricStats,
    pub tpot: MetricStats,
    pub itl: MetricStats,
    pub e2el: MetricStats,
    // --- servetune additions ---
    /// Failed requests counted by reason.
    pub failed_by_reason: BTreeMap<FailureKind, usize>,
    /// Token-based ITL: gaps divided over the tokens each chunk delivered.
    pub token_itl: MetricStats,
    /// Peak of tokens (not chunks) received in a 1-second bucket.
    pub max_output_tokens_per_s_token_weighted: f64,
    /// Successful requests / all measured requests (1.0 when none were sent).
    pub success_rate: f64,
}

impl Summary {
    pub fn metric(&self, m: Metric) -> &MetricStats {
        match m {
            Metric::Ttft => &self.ttft,
            Metric::Tpot => &self.tpot,
            Metric::Itl => &self.itl,
            Metric::E2el => &self.e2el,
        }
    }
}

/// Computes the summary of the measured (non-warm-up) records over `duration` seconds.
pub fn summarize(records: &[RequestRecord], duration: f64, cfg: &SummaryConfig) -> Summary {
    let measured: Vec<&RequestRecord> = records.iter().filter(|r| !r.warmup).collect();
    let mut total_input = 0u64;
    let mut total_output = 0u64;
    let mut completed = 0usize;
    let mut ttfts = Vec::new();
    let mut tpots = Vec::new();
    let mut all_tpots = Vec::new();
    let mut itls = Vec::new();
    let mut e2els = Vec::new();
    let mut token_itls = Vec::new();
    let mut failed_by_reason = BTreeMap::new();
    for r in &measured {
        if !r.success {
            *failed_by_reason
                .entry(r.failure.unwrap_or(FailureKind::NoContent))
                .or_insert(0) += 1;
            continue;
        }
        completed += 1;
        total_output += r.output_tokens;
        // Newest vLLM: the server's `usage.prompt_tokens` replaces the dataset's prompt length.
        total_input += r.server_prompt_tokens.unwrap_or(r.prompt_len);
        // vLLM: TPOT only when output_len > 1; counted as 0 for goodput otherwise.
        let tpot = r.tpot_s();
        if let Some(t) = tpot {
            tpots.push(t);
        }
        all_tpots.push(tpot.unwrap_or(0.0));
        itls.extend_from_slice(&r.itl_s);
        ttfts.push(r.ttft_s);
        e2els.push(r.latency_s);
        r.token_itls_s(&mut token_itls);
    }
    let failed = measured.len() - completed;

    let request_goodput = (!cfg.goodput.is_empty()).then(|| {
        let good = (0..ttfts.len())
            .filter(|&i| {
                let ok = |limit: Option<f64>, v: f64| limit.is_none_or(|l| l / 1000.0 >= v);
                ok(cfg.goodput.ttft_ms, ttfts[i])
                    && ok(cfg.goodput.tpot_ms, all_tpots[i])
                    && ok(cfg.goodput.e2el_ms, e2els[i])
            })
            .count();
        good as f64 / duration
    });

    let (peak_events, peak_conc, peak_tokens) = peaks(&measured);
    let p = &cfg.percentiles;
    Summary {
        completed,
        failed,
        duration,
        total_input_tokens: total_input,
        total_output_tokens: total_output,
        request_throughput: completed as f64 / duration,
        request_goodput,
        output_throughput: total_output as f64 / duration,
        total_token_throughput: (total_input + total_output) as f64 / duration,
        max_output_tokens_per_s: peak_events,
        max_concurrent_requests: peak_conc,
        ttft: MetricStats::from_seconds(&ttfts, p),
        tpot: MetricStats::from_seconds(&tpots, p),
        itl: MetricStats::from_seconds(&itls, p),
        e2el: MetricStats::from_seconds(&e2els, p),
        failed_by_reason,
        token_itl: MetricStats::from_seconds(&token_itls, p),
        max_output_tokens_per_s_token_weighted: peak_tokens,
        success_rate: if measured.is_empty() {
            1.0
        } else {
            completed as f64 / measured.len() as f64
        },
    }
}

/// vLLM's peaks over successful requests: chunks per 1-second bucket (each event with
/// `choices` counts one, whatever it carried), the exact peak of concurrently active requests
/// (a sweep over `[start, end)`, ends before starts at a tie), and our token-weighted bucket
/// peak (each read counts the tokens it delivered).
fn peaks(measured: &[&RequestRecord]) -> (f64, u64, f64) {
    let ok: Vec<&&RequestRecord> = measured.iter().filter(|r| r.success).collect();
    if ok.is_empty() {
        return (0.0, 0, 0.0);
    }
    let min_start = ok.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let max_end = ok
        .iter()
        .map(|r| r.start_s + r.latency_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let n = (max_end - min_start).ceil() as usize + 1;
    let mut events = vec![0u64; n];
    let mut tokens = vec![0u64; n];
    let bucket = |t: f64| -> Option<usize> {
        let b = (t - min_start) as i64; // Python int() truncates toward zero
        (b >= 0 && (b as usize) < n).then_some(b as usize)
    };
    let mut edges: Vec<(f64, i8)> = Vec::with_capacity(ok.len() * 2);
    for r in ok {
        let mut t = r.start_s + r.ttft_s;
        if let Some(b) = bucket(t) {
            events[b] += 1;
        }
        for &gap in &r.itl_s {
            t += gap;
            if let Some(b) = bucket(t) {
                events[b] += 1;
            }
        }
        for (t, k) in r.read_tokens() {
            if let Some(b) = bucket(r.start_s + t) {
                tokens[b] += k;
            }
        }
        edges.push((r.start_s, 1));
        edges.push((r.start_s + r.latency_s, -1));
    }
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut peak) = (0i64, 0i64);
    for (_, d) in edges {
        cur += d as i64;
        peak = peak.max(cur);
    }
    (
        *events.iter().max().unwrap_or(&0) as f64,
        peak as u64,
        *tokens.iter().max().unwrap_or(&0) as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(start: f64, ttft: f64, lat: f64, out: u64, itl: Vec<f64>) -> RequestRecord {
        let mut t = ttft;
        let mut reads = vec![(ttft, 1)];
        for g in &itl {
            t += g;
            reads.push((t, 1));
        }
        RequestRecord {
            success: true,
            start_s: start,
            ttft_s: ttft,
            latency_s: lat,
            output_tokens: out,
            server_output_tokens: Some(out),
            prompt_len: 10,
            server_prompt_tokens: Some(11),
            itl_s: itl,
            text_reads: reads,
            ..Default::default()
        }
    }

    fn cfg() -> SummaryConfig {
        SummaryConfig {
            percentiles: vec![99.0],
            goodput: GoodputSlo::default(),
        }
    }

    #[test]
    fn totals_throughputs_and_failures() {
        let recs = vec![
            ok(0.0, 0.1, 0.5, 5, vec![0.1; 4]),
            ok(0.2, 0.2, 0.6, 5, vec![0.1; 4]),
            RequestRecord {
                failure: Some(FailureKind::HttpStatus),
                error: "HTTP 503".into(),
                prompt_len: 10,
                ..Default::default()
            },
            RequestRecord {
                warmup: true,
                ..ok(0.0, 9.0, 9.0, 1, vec![])
            },
        ];
        let s = summarize(&recs, 2.0, &cfg());
        assert_eq!(s.completed, 2);
        assert_eq!(s.failed, 1);
        assert_eq!(
            s.total_input_tokens, 22,
            "server prompt counts, failed requests' prompts not counted"
        );
        assert_eq!(s.total_output_tokens, 10);
        assert!((s.request_throughput - 1.0).abs() < 1e-12);
        assert!((s.total_token_throughput - 16.0).abs() < 1e-12);
        assert_eq!(s.failed_by_reason[&FailureKind::HttpStatus], 1);
        assert!((s.ttft.mean_ms - 150.0).abs() < 1e-9, "warm-up excluded");
        assert!((s.tpot.mean_ms - 100.0).abs() < 1e-9);
        assert_eq!(s.itl.count, 8);
        assert!((s.success_rate - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.max_concurrent_requests, 2);
        assert_eq!(s.max_output_tokens_per_s, 10.0);
    }

    #[test]
    fn goodput_uses_inclusive_limits_and_zero_tpot_for_single_tokens() {
        let recs = vec![
            ok(0.0, 0.1, 0.5, 5, vec![0.1; 4]), // tpot 100 ms
            ok(0.0, 0.3, 0.3, 1, vec![]),       // tpot counted as 0
        ];
        let mut c = cfg();
        c.goodput.tpot_ms = Some(100.0);
        let s = summarize(&recs, 1.0, &c);
        assert_eq!(s.request_goodput, Some(2.0));
        c.goodput.ttft_ms = Some(200.0);
        let s = summarize(&recs, 1.0, &c);
        assert_eq!(s.request_goodput, Some(1.0));
    }

    #[test]
    fn token_weighted_peak_counts_tokens_not_chunks() {
        // One chunk of 50 tokens after the first token: vLLM's peak sees 2 events.
        let mut r = ok(0.0, 0.1, 0.3, 51, vec![0.1]);
        r.text_reads = vec![(0.1, 1), (0.2, 1)];
        let s = summarize(&[r], 1.0, &cfg());
        assert_eq!(s.max_output_tokens_per_s, 2.0);
        assert_eq!(s.max_output_tokens_per_s_token_weighted, 51.0);
    }
}
