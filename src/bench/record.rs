//! One request's measurements, as the streaming client records them.
//!
//! Times are seconds (f64) so that the statistics match `vllm bench serve`, which keeps
//! `time.perf_counter()` differences as Python floats. `start_s` is relative to the start of the
//! benchmark; every other time is relative to the request's own start.

use serde::{Deserialize, Serialize};

/// Why a request failed. Each kind is counted separately in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// TCP connect refused / reset before the request was sent.
    Connect,
    /// The server answered with a non-200 status.
    HttpStatus,
    /// The body was not a valid event stream, or an event was not valid JSON.
    MalformedStream,
    /// The server returned an `error` object inside the stream.
    ServerError,
    /// The stream ended (connection closed, body error) before the response was complete.
    StreamInterrupted,
    /// The stream completed but carried no event with `choices` (vLLM: "Never received a valid
    /// chunk to calculate TTFT.").
    NoContent,
    /// The per-request time limit passed.
    Timeout,
    /// The run was aborted (early-abort policy) while this request was in flight.
    Aborted,
}

impl FailureKind {
    pub const ALL: [FailureKind; 8] = [
        FailureKind::Connect,
        FailureKind::HttpStatus,
        FailureKind::MalformedStream,
        FailureKind::ServerError,
        FailureKind::StreamInterrupted,
        FailureKind::NoContent,
        FailureKind::Timeout,
        FailureKind::Aborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::HttpStatus => "http_status",
            FailureKind::MalformedStream => "malformed_stream",
            FailureKind::ServerError => "server_error",
            FailureKind::StreamInterrupted => "stream_interrupted",
            FailureKind::NoContent => "no_content",
            FailureKind::Timeout => "timeout",
            FailureKind::Aborted => "aborted",
        }
    }
}

/// The measurements of one request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RequestRecord {
    /// Position of the prompt in the dataset sample.
    pub index: usize,
    pub success: bool,
    /// Why it failed; `None` on success.
    pub failure: Option<FailureKind>,
    /// Error text (HTTP body excerpt, I/O error, ...); empty on success.
    pub error: String,
    /// Start of the request, seconds since the benchmark started.
    pub start_s: f64,
    /// Time to the first event with `choices` (vLLM's definition), seconds.
    pub ttft_s: f64,
    /// End-to-end latency, seconds.
    pub latency_s: f64,
    /// Gaps between consecutive events with `choices` (vLLM's chunk-based ITL), seconds.
    /// Events that arrived in the same read share a timestamp and give a 0 gap, as in vLLM.
    pub itl_s: Vec<f64>,
    /// Arrival time (since the request start) of each distinct read that carried generated text,
    /// and how many text events it carried: the basis of the token-based ITL.
    pub text_reads: Vec<(f64, u32)>,
    /// Prompt length in tokens as the dataset measured it (vLLM's `prompt_len`).
    pub prompt_len: u64,
    /// `usage.prompt_tokens` from the server, when it sent usage.
    pub server_prompt_tokens: Option<u64>,
    /// `usage.completion_tokens` from the server, when it sent usage.
    pub server_output_tokens: Option<u64>,
    /// Output tokens as used in the statistics: the server's count, else the tokenizer's count of
    /// the generated text (filled in after the run), else the number of text events.
    pub output_tokens: u64,
    /// The tokens that the request asked for (`max_tokens`).
    pub expected_output_len: u64,
    /// Generated text, kept only when detailed results are requested.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub generated_text: Option<String>,
    /// Time between the request's release by the arrival process and its sending (waiting for a
    /// `--max-concurrency` slot): vLLM's `queue_times`.
    #[serde(default)]
    pub queue_s: f64,
    /// Warm-up requests are measured but excluded from every statistic.
    #[serde(default)]
    pub warmup: bool,
}

impl RequestRecord {
    /// TPOT as `vllm bench serve` defines it: (E2EL - TTFT) / (output tokens - 1), only when
    /// more than one token was generated.
    pub fn tpot_s(&self) -> Option<f64> {
        (self.success && self.output_tokens > 1)
            .then(|| (self.latency_s - self.ttft_s) / (self.output_tokens - 1) as f64)
    }

    /// The tokens each text-carrying read delivered, as `(time since request start, tokens)`.
    /// The request's output tokens (the server's count) are spread over the reads in proportion
    /// to the text events each carried, with cumulative rounding so that they sum exactly and
    /// every read carries at least one token.
    pub fn read_tokens(&self) -> Vec<(f64, u64)> {
        let text_events: u64 = self.text_reads.iter().map(|r| r.1 as u64).sum();
        if !self.success || text_events == 0 {
            return Vec::new();
        }
        let tokens = self.output_tokens.max(text_events);
        let per_event = tokens as f64 / text_events as f64;
        let mut carried = 0.0f64;
        let mut assigned = 0u64;
        let mut out = Vec::with_capacity(self.text_reads.len());
        for &(t, n) in &self.text_reads {
            carried += n as f64 * per_event;
            let k = (carried.round() as u64).saturating_sub(assigned).max(1);
            assigned += k;
            out.push((t, k));
        }
        out
    }

    /// Token-based inter-token latencies: each read after the first that carried text
    /// contributes `k` samples of `gap / k`, where `k` is the number of tokens it delivered.
    /// A chunk with several tokens thus yields its real per-token latency, never a run of
    /// 0.00 ms values as the chunk-based ITL does.
    pub fn token_itls_s(&self, out: &mut Vec<f64>) {
        let reads = self.read_tokens();
        for w in reads.windows(2) {
            let (t0, _) = w[0];
            let (t1, k) = w[1];
            let each = (t1 - t0).max(0.0) / k as f64;
            out.extend(std::iter::repeat_n(each, k as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(reads: Vec<(f64, u32)>, out_tokens: u64) -> RequestRecord {
        RequestRecord {
            success: true,
            text_reads: reads,
            output_tokens: out_tokens,
            ..Default::default()
        }
    }

    #[test]
    fn tpot_matches_vllm_definition() {
        let r = RequestRecord {
            success: true,
            ttft_s: 0.1,
            latency_s: 1.1,
            output_tokens: 11,
            ..Default::default()
        };
        assert!((r.tpot_s().unwrap() - 0.1).abs() < 1e-12);
        let one = RequestRecord {
            output_tokens: 1,
            ..r.clone()
        };
        assert_eq!(one.tpot_s(), None);
    }

    #[test]
    fn token_itl_spreads_multi_token_chunks() {
        // Three reads of 1, 4 and 4 events for 9 tokens, 40 ms apart.
        let r = rec(vec![(0.1, 1), (0.14, 4), (0.18, 4)], 9);
        let mut v = Vec::new();
        r.token_itls_s(&mut v);
        assert_eq!(v.len(), 8);
        for x in v {
            assert!((x - 0.01).abs() < 1e-9, "{x}");
        }
    }

    #[test]
    fn token_itl_uses_server_token_count_when_chunks_carry_several_tokens() {
        // Two events each carrying 5 tokens (speculative decoding): 10 tokens in all.
        let r = rec(vec![(0.1, 1), (0.2, 1)], 10);
        let mut v = Vec::new();
        r.token_itls_s(&mut v);
        assert_eq!(v.len(), 5);
        assert!(v.iter().all(|&x| (x - 0.02).abs() < 1e-9));
        assert!(v.iter().all(|&x| x > 0.0));
    }
}
