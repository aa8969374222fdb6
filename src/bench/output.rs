//! Printing and saving results: the "Serving Benchmark Result" block exactly as
//! `vllm bench serve` prints it (same labels, widths and order), servetune's extra lines below
//! it, and the result JSON with vLLM's keys (plus ours under `servetune`).

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use super::metrics::{Metric, Summary};
use super::record::RequestRecord;
use super::BenchOutcome;

/// Settings echoed in the block and the JSON.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub backend: String,
    pub label: Option<String>,
    pub model_id: String,
    pub tokenizer_id: String,
    pub num_prompts: usize,
    pub request_rate: f64,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub percentile_metrics: Vec<Metric>,
    pub goodput: bool,
    pub date: String,
}

fn centred(title: &str, fill: char) -> String {
    // Python "{s:{c}^{n}}" with n = 50: the extra fill character goes to the right.
    let len = title.chars().count();
    if len >= 50 {
        return title.to_owned();
    }
    let left = (50 - len) / 2;
    let right = 50 - len - left;
    format!(
        "{}{}{}",
        fill.to_string().repeat(left),
        title,
        fill.to_string().repeat(right)
    )
}

fn line_i(out: &mut String, label: &str, v: impl std::fmt::Display) {
    let _ = writeln!(out, "{:<40} {:<10}", label, v.to_string());
}

fn line_f(out: &mut String, label: &str, v: f64) {
    let _ = writeln!(out, "{:<40} {:<10}", label, format!("{v:.2}"));
}

fn metric_names(m: Metric) -> (&'static str, &'static str) {
    match m {
        Metric::Ttft => ("TTFT", "Time to First Token"),
        Metric::Tpot => ("TPOT", "Time per Output Token (excl. 1st token)"),
        Metric::Itl => ("ITL", "Inter-token Latency"),
        Metric::E2el => ("E2EL", "End-to-end Latency"),
    }
}

/// `str(int(p)) if int(p) == p else str(p)`.
pub fn p_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// The vLLM block.
pub fn vllm_block(s: &Summary, info: &RunInfo) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{}", centred(" Serving Benchmark Result ", '='));
    line_i(&mut o, "Successful requests:", s.completed);
    line_i(&mut o, "Failed requests:", s.failed);
    if let Some(c) = info.max_concurrency {
        line_i(&mut o, "Maximum request concurrency:", c);
    }
    if info.request_rate.is_finite() {
        line_f(&mut o, "Request rate configured (RPS):", info.request_rate);
    }
    line_f(&mut o, "Benchmark duration (s):", s.duration);
    line_i(&mut o, "Total input tokens:", s.total_input_tokens);
    line_i(&mut o, "Total generated tokens:", s.total_output_tokens);
    line_f(&mut o, "Request throughput (req/s):", s.request_throughput);
    if let Some(g) = s.request_goodput {
        line_f(&mut o, "Request goodput (req/s):", g);
    }
    line_f(
        &mut o,
        "Output token throughput (tok/s):",
        s.output_throughput,
    );
    line_f(
        &mut o,
        "Peak output token throughput (tok/s):",
        s.max_output_tokens_per_s,
    );
    line_f(
        &mut o,
        "Peak concurrent requests:",
        s.max_concurrent_requests as f64,
    );
    line_f(
        &mut o,
        "Total token throughput (tok/s):",
        s.total_token_throughput,
    );
    for m in Metric::ALL {
        if !info.percentile_metrics.contains(&m) {
            continue;
        }
        let (name, header) = metric_names(m);
        let st = s.metric(m);
        let _ = writeln!(o, "{}", centred(header, '-'));
        line_f(&mut o, &format!("Mean {name} (ms):"), st.mean_ms);
        line_f(&mut o, &format!("Median {name} (ms):"), st.median_ms);
        for (p, v) in &st.percentiles_ms {
            line_f(&mut o, &format!("P{} {name} (ms):", p_word(*p)), *v);
        }
    }
    let _ = writeln!(o, "{}", "=".repeat(50));
    o
}

/// servetune's additions, printed under the vLLM block.
pub fn extras_block(outcome: &BenchOutcome) -> String {
    let s = &outcome.summary;
    let mut o = String::new();
    let _ = writeln!(o, "{}", centred(" servetune additions ", '='));
    line_f(&mut o, "Success rate (%):", s.success_rate * 100.0);
    for (k, n) in &s.failed_by_reason {
        line_i(&mut o, &format!("Failed ({}):", k.as_str()), n);
    }
    line_f(
        &mut o,
        "Peak output tok/s (token-weighted):",
        s.max_output_tokens_per_s_token_weighted,
    );
    let t = &s.token_itl;
    line_f(&mut o, "Mean token ITL (ms):", t.mean_ms);
    line_f(&mut o, "Median token ITL (ms):", t.median_ms);
    for (p, v) in &t.percentiles_ms {
        line_f(&mut o, &format!("P{} token ITL (ms):", p_word(*p)), *v);
    }
    line_f(&mut o, "Client CPU (s):", outcome.client_cpu_s);
    if s.total_output_tokens > 0 {
        line_f(
            &mut o,
            "Client CPU-s per M output tokens:",
            outcome.client_cpu_s / s.total_output_tokens as f64 * 1e6,
        );
    }
    if outcome.client_cpu_s > 0.0 {
        line_f(
            &mut o,
            "Streamed events per client CPU-s:",
            outcome.events as f64 / outcome.client_cpu_s,
        );
    }
    if let Some(why) = &outcome.aborted {
        let _ = writeln!(o, "ABORTED early: {why}");
        line_i(&mut o, "Requests not sent:", outcome.not_sent);
    }
    let _ = writeln!(o, "{}", "=".repeat(50));
    o
}

/// The first few errors, as vLLM prints them before the block.
pub fn error_lines(outcome: &BenchOutcome) -> String {
    let mut o = String::new();
    let failed: Vec<_> = outcome
        .records
        .iter()
        .filter(|r| !r.success && !r.warmup)
        .collect();
    if failed.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "Failed requests during benchmark run detected (capping to 10):"
    );
    for (i, r) in failed.iter().take(10).enumerate() {
        let kind = r.failure.map(|k| k.as_str()).unwrap_or("unknown");
        let _ = writeln!(o, "Error {i}: [{kind}] {}", r.error);
    }
    o
}

fn rate_value(rate: f64) -> Value {
    if rate.is_infinite() {
        Value::String("inf".into())
    } else {
        json!(rate)
    }
}

/// vLLM's default file name: `{label}-{rate}qps[-concurrency{N}]-{model base}-{date}.json`.
pub fn default_filename(info: &RunInfo) -> String {
    let label = info.label.clone().unwrap_or_else(|| info.backend.clone());
    let base = info.model_id.rsplit('/').next().unwrap_or(&info.model_id);
    let rate = if info.request_rate.is_infinite() {
        "inf".to_owned()
    } else {
        python_float(info.request_rate)
    };
    let conc = info
        .max_concurrency
        .map(|c| format!("-concurrency{c}"))
        .unwrap_or_default();
    format!("{label}-{rate}qps{conc}-{base}-{}.json", info.date)
}

/// Python's `repr(float)` for the values a rate takes (always shows a fractional part).
fn python_float(x: f64) -> String {
    let s = format!("{x}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// The result JSON: vLLM's keys in vLLM's order, then `servetune` with our additions.
pub fn result_json(outcome: &BenchOutcome, info: &RunInfo, detailed: bool) -> Value {
    let s = &outcome.summary;
    let mut m = Map::new();
    insert_settings_and_totals(&mut m, info, s);
    let measured: Vec<_> = outcome.records.iter().filter(|r| !r.warmup).collect();
    insert_per_request(&mut m, &measured, detailed);
    insert_peaks_and_percentiles(&mut m, info, s);
    m.insert("servetune".into(), servetune_json(outcome, detailed));
    Value::Object(m)
}

/// Inserts vLLM's first keys: the run's settings, then its totals and throughputs.
fn insert_settings_and_totals(m: &mut Map<String, Value>, info: &RunInfo, s: &Summary) {
    m.insert("date".into(), json!(info.date));
    m.insert("endpoint_type".into(), json!(info.backend));
    m.insert("backend".into(), json!(info.backend));
    m.insert("label".into(), json!(info.label));
    m.insert("model_id".into(), json!(info.model_id));
    m.insert("tokenizer_id".into(), json!(info.tokenizer_id));
    m.insert("num_prompts".into(), json!(info.num_prompts));
    m.insert("request_rate".into(), rate_value(info.request_rate));
    m.insert("burstiness".into(), json!(info.burstiness));
    m.insert("max_concurrency".into(), json!(info.max_concurrency));
    m.insert("duration".into(), json!(s.duration));
    m.insert("completed".into(), json!(s.completed));
    m.insert("failed".into(), json!(s.failed));
    m.insert("total_input_tokens".into(), json!(s.total_input_tokens));
    m.insert("total_output_tokens".into(), json!(s.total_output_tokens));
    m.insert("request_throughput".into(), json!(s.request_throughput));
    m.insert("request_goodput".into(), json!(s.request_goodput));
    m.insert("output_throughput".into(), json!(s.output_throughput));
    m.insert(
        "total_token_throughput".into(),
        json!(s.total_token_throughput),
    );
}

/// Inserts vLLM's per-request arrays of the measured requests (the warm-ups left out); the
/// input and output lengths, TTFTs, ITLs, start times, texts and errors only when `detailed`.
fn insert_per_request(m: &mut Map<String, Value>, measured: &[&RequestRecord], detailed: bool) {
    if detailed {
        m.insert(
            "input_lens".into(),
            json!(measured
                .iter()
                .map(|r| r.server_prompt_tokens.unwrap_or(r.prompt_len))
                .collect::<Vec<_>>()),
        );
        m.insert(
            "output_lens".into(),
            json!(measured
                .iter()
                .map(|r| if r.success { r.output_tokens } else { 0 })
                .collect::<Vec<_>>()),
        );
        m.insert(
            "ttfts".into(),
            json!(measured
                .iter()
                .map(|r| if r.success { r.ttft_s } else { 0.0 })
                .collect::<Vec<_>>()),
        );
        let empty: Vec<f64> = Vec::new();
        m.insert(
            "itls".into(),
            json!(measured
                .iter()
                .map(|r| if r.success { &r.itl_s } else { &empty })
                .collect::<Vec<_>>()),
        );
    }
    // vLLM writes 0 and [] for failed requests in its arrays; the real values stay in
    // `servetune.records`.
    m.insert(
        "latencies".into(),
        json!(measured
            .iter()
            .map(|r| if r.success { r.latency_s } else { 0.0 })
            .collect::<Vec<_>>()),
    );
    if detailed {
        m.insert(
            "start_times".into(),
            json!(measured.iter().map(|r| r.start_s).collect::<Vec<_>>()),
        );
    }
    m.insert(
        "queue_times".into(),
        json!(measured.iter().map(|r| r.queue_s).collect::<Vec<_>>()),
    );
    if detailed {
        m.insert(
            "generated_texts".into(),
            json!(measured
                .iter()
                .map(|r| r.generated_text.clone().unwrap_or_default())
                .collect::<Vec<_>>()),
        );
        m.insert(
            "errors".into(),
            json!(measured.iter().map(|r| r.error.clone()).collect::<Vec<_>>()),
        );
    }
}

/// Inserts the peak output rate and concurrency, vLLM's `rtfx`, and the mean, median, standard
/// deviation and percentiles of each metric asked for.
fn insert_peaks_and_percentiles(m: &mut Map<String, Value>, info: &RunInfo, s: &Summary) {
    m.insert(
        "max_output_tokens_per_s".into(),
        json!(s.max_output_tokens_per_s),
    );
    m.insert(
        "max_concurrent_requests".into(),
        json!(s.max_concurrent_requests),
    );
    m.insert("rtfx".into(), json!(0.0));
    for metric in Metric::ALL {
        if !info.percentile_metrics.contains(&metric) {
            continue;
        }
        let k = metric.key();
        let st = s.metric(metric);
        m.insert(format!("mean_{k}_ms"), json!(st.mean_ms));
        m.insert(format!("median_{k}_ms"), json!(st.median_ms));
        m.insert(format!("std_{k}_ms"), json!(st.std_ms));
        for (p, v) in &st.percentiles_ms {
            m.insert(format!("p{}_{k}_ms", p_word(*p)), json!(v));
        }
    }
}

/// The `servetune` object: our additions to vLLM's keys, with every record when `detailed`.
fn servetune_json(outcome: &BenchOutcome, detailed: bool) -> Value {
    let s = &outcome.summary;
    let failed_by: Map<String, Value> = s
        .failed_by_reason
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), json!(v)))
        .collect();
    let mut ours = json!({
        "success_rate": s.success_rate,
        "failed_by_reason": failed_by,
        "max_output_tokens_per_s_token_weighted": s.max_output_tokens_per_s_token_weighted,
        "token_itl": s.token_itl,
        "ttft": s.ttft, "tpot": s.tpot, "itl": s.itl, "e2el": s.e2el,
        "aborted": outcome.aborted,
        "not_sent": outcome.not_sent,
        "client_cpu_s": outcome.client_cpu_s,
        "events": outcome.events,
        "warmup_requests": outcome.records.iter().filter(|r| r.warmup).count(),
    });
    if detailed {
        ours["records"] = json!(outcome.records);
    }
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_centred_like_python() {
        assert_eq!(
            centred(" Serving Benchmark Result ", '='),
            "============ Serving Benchmark Result ============"
        );
        assert_eq!(
            centred("Time per Output Token (excl. 1st token)", '-'),
            "-----Time per Output Token (excl. 1st token)------"
        );
        assert_eq!(
            centred("Time to First Token", '-'),
            "---------------Time to First Token----------------"
        );
        assert_eq!(
            centred("End-to-end Latency", '-'),
            "----------------End-to-end Latency----------------"
        );
    }

    #[test]
    fn lines_are_padded_like_python() {
        let mut s = String::new();
        line_i(&mut s, "Successful requests:", 1000);
        assert_eq!(s, "Successful requests:                     1000      \n");
        let mut s = String::new();
        line_f(&mut s, "Benchmark duration (s):", 241.9351);
        assert_eq!(s, "Benchmark duration (s):                  241.94    \n");
    }

    #[test]
    fn percentile_words_and_filenames() {
        assert_eq!(p_word(99.0), "99");
        assert_eq!(p_word(99.9), "99.9");
        let info = RunInfo {
            backend: "openai".into(),
            label: None,
            model_id: "Qwen/Qwen3-32B".into(),
            tokenizer_id: "Qwen/Qwen3-32B".into(),
            num_prompts: 10,
            request_rate: 10.0,
            burstiness: 1.0,
            max_concurrency: Some(8),
            percentile_metrics: vec![],
            goodput: false,
            date: "20260101-120000".into(),
        };
        assert_eq!(
            default_filename(&info),
            "openai-10.0qps-concurrency8-Qwen3-32B-20260101-120000.json"
        );
    }
}
