//! Statistics and the vLLM summary against fixtures computed with numpy
//! (tests/fixtures/gen_numpy_stats.py ports `calculate_metrics` line by line).

use serde_json::Value;
use servetune::bench::metrics::{summarize, GoodputSlo, SummaryConfig};
use servetune::bench::record::{FailureKind, RequestRecord};
use servetune::bench::stats::{mean, std, Sorted};

fn fixture() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/numpy_stats.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

fn assert_close(got: f64, want: f64, what: &str) {
    let tol = 1e-12 * want.abs().max(1e-9);
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got:e}, numpy {want:e}"
    );
}

#[test]
fn mean_std_median_percentiles_match_numpy() {
    let fx = fixture();
    for (i, s) in fx["samples"].as_array().unwrap().iter().enumerate() {
        let x: Vec<f64> = s["x"].as_array().unwrap().iter().map(f).collect();
        let sorted = Sorted::new(&x);
        assert_close(mean(&x), f(&s["mean"]), &format!("mean #{i} n={}", x.len()));
        assert_close(std(&x), f(&s["std"]), &format!("std #{i}"));
        assert_close(sorted.median(), f(&s["median"]), &format!("median #{i}"));
        for p in s["percentiles"].as_array().unwrap() {
            let (q, want) = (f(&p[0]), f(&p[1]));
            assert_close(sorted.percentile(q), want, &format!("p{q} #{i}"));
        }
    }
}

#[test]
fn summary_matches_vllm_calculate_metrics() {
    let fx = fixture();
    let records: Vec<RequestRecord> = fx["records"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let ok = r["success"].as_bool().unwrap();
            let itl: Vec<f64> = r["itl"].as_array().unwrap().iter().map(f).collect();
            RequestRecord {
                index: i,
                success: ok,
                failure: (!ok).then_some(FailureKind::HttpStatus),
                start_s: f(&r["start"]),
                ttft_s: f(&r["ttft"]),
                latency_s: f(&r["latency"]),
                itl_s: itl,
                output_tokens: r["output_tokens"].as_u64().unwrap(),
                prompt_len: r["prompt_len"].as_u64().unwrap(),
                ..Default::default()
            }
        })
        .collect();
    let cfg = SummaryConfig {
        percentiles: vec![99.0, 90.0],
        goodput: GoodputSlo {
            ttft_ms: Some(f(&fx["goodput"]["ttft"])),
            tpot_ms: Some(f(&fx["goodput"]["tpot"])),
            e2el_ms: None,
        },
    };
    let s = summarize(&records, f(&fx["duration"]), &cfg);
    let w = &fx["summary"];
    assert_eq!(s.completed as u64, w["completed"].as_u64().unwrap());
    assert_eq!(s.failed as u64, w["failed"].as_u64().unwrap());
    assert_eq!(
        s.total_input_tokens,
        w["total_input_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        s.total_output_tokens,
        w["total_output_tokens"].as_u64().unwrap()
    );
    assert_close(s.request_throughput, f(&w["request_throughput"]), "req/s");
    assert_close(
        s.request_goodput.unwrap(),
        f(&w["request_goodput"]),
        "goodput",
    );
    assert_close(s.output_throughput, f(&w["output_throughput"]), "out tok/s");
    assert_close(
        s.total_token_throughput,
        f(&w["total_token_throughput"]),
        "total tok/s",
    );
    assert_close(
        s.max_output_tokens_per_s,
        f(&w["max_output_tokens_per_s"]),
        "peak",
    );
    assert_eq!(
        s.max_concurrent_requests,
        w["max_concurrent_requests"].as_u64().unwrap()
    );
    for (name, st) in [
        ("ttft", &s.ttft),
        ("tpot", &s.tpot),
        ("itl", &s.itl),
        ("e2el", &s.e2el),
    ] {
        let ww = &w[name];
        assert_close(st.mean_ms, f(&ww["mean_ms"]), &format!("{name} mean"));
        assert_close(st.median_ms, f(&ww["median_ms"]), &format!("{name} median"));
        assert_close(st.std_ms, f(&ww["std_ms"]), &format!("{name} std"));
        for (i, p) in ww["percentiles_ms"].as_array().unwrap().iter().enumerate() {
            assert_close(
                st.percentiles_ms[i].1,
                f(&p[1]),
                &format!("{name} p{}", p[0]),
            );
        }
    }
}
