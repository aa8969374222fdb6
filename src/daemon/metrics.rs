//! `GET /metrics`: the daemon's state in Prometheus' text format (0.0.4), encoded by
//! `prometheus-client`. The values are not live counters kept in the process: each scrape reads
//! them from the catalog (built from the store), so a restarted daemon reports what it reported
//! before. They are registered per scrape as custom metrics: labelled series in a fixed order
//! (the crate's `Family` writes its label sets in hash order), and the stored histograms with
//! their bucket counts.

use std::fmt;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{Backend, Daemon, DaemonError};
use crate::tune::records::{Histogram, DURATION_BUCKETS, LAUNCH_BUCKETS};

/// The content type of the answer.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Labels of one sample.
type Labels = Vec<(&'static str, String)>;

/// A gauge sample's value: a count (written as an integer) or a measurement.
#[derive(Debug)]
enum Num {
    Count(u64),
    Real(f64),
}

/// One gauge's labelled samples, written in the order given.
#[derive(Debug)]
struct Gauges(Vec<(Labels, Num)>);

impl EncodeMetric for Gauges {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (labels, v) in &self.0 {
            let mut e = encoder.encode_family(labels)?;
            match v {
                Num::Count(n) => e.encode_gauge(n)?,
                Num::Real(x) => e.encode_gauge(x)?,
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// One counter's labelled counts, written in the order given.
#[derive(Debug)]
struct Counts(Vec<(Labels, u64)>);

impl EncodeMetric for Counts {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (labels, n) in &self.0 {
            encoder
                .encode_family(labels)?
                .encode_counter::<NoLabelSet, u64, u64>(n, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A stored histogram (`tune::records::Histogram`: cumulative counts at fixed bounds).
#[derive(Debug)]
struct Stored {
    sum: f64,
    count: u64,
    /// Per bucket, the count in it alone (the encoder sums them), `+Inf` last.
    buckets: Vec<(f64, u64)>,
}

impl Stored {
    fn of(bounds: &[f64], h: &Histogram) -> Stored {
        let mut below = 0;
        let mut buckets = Vec::with_capacity(bounds.len() + 1);
        for (i, b) in bounds.iter().enumerate() {
            let n = h.buckets.get(i).copied().unwrap_or(0).max(below);
            buckets.push((*b, n - below));
            below = n;
        }
        buckets.push((f64::INFINITY, h.count.saturating_sub(below)));
        Stored {
            sum: h.sum,
            count: h.count,
            buckets,
        }
    }
}

impl EncodeMetric for Stored {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A gauge holding `v`.
fn gauge(v: i64) -> Gauge {
    let g = Gauge::<i64>::default();
    g.set(v);
    g
}

/// `GET /metrics`.
pub fn render<B: Backend>(d: &Daemon<B>) -> Result<String, DaemonError> {
    let c = d.catalog()?;
    let total = &c.totals;
    let mut r = Registry::default();
    r.register("servetune_up", "Whether the daemon is serving", gauge(1));
    r.register(
        "servetune_queue_length",
        "Studies waiting to run (queued or paused)",
        gauge(c.waiting.len() as i64),
    );
    r.register(
        "servetune_study_running",
        "Whether a study is being tuned now",
        gauge(i64::from(d.current().is_some())),
    );
    r.register(
        "servetune_studies",
        "Daemon study runs by queue state",
        Gauges(
            c.jobs_by_state
                .iter()
                .map(|(st, n)| {
                    (
                        vec![("state", st.label().to_owned())],
                        Num::Count(*n as u64),
                    )
                })
                .collect(),
        ),
    );
    r.register(
        "servetune_trials",
        "Finished engine runs (search, re-measurement, validation) by outcome",
        Counts(
            [
                ("ok", total.ok),
                ("infeasible", total.infeasible),
                ("failed", total.failed),
            ]
            .into_iter()
            .map(|(label, n)| (vec![("outcome", label.to_owned())], n as u64))
            .collect(),
        ),
    );
    r.register(
        "servetune_early_stops",
        "Trials stopped early: a constraint (success rate, SLO) missed, or not promoted past screening",
        Counts(vec![
            (vec![("reason", "constraint".to_owned())], total.infeasible as u64),
            (vec![("reason", "screened_out".to_owned())], total.screened_out as u64),
        ]),
    );
    r.register(
        "servetune_best_objective",
        "The best objective of the latest study of each name",
        Gauges(
            c.latest
                .iter()
                .map(|b| {
                    (
                        vec![
                            ("study", b.name.clone()),
                            ("run", b.study.clone()),
                            ("metric", b.metric.clone()),
                        ],
                        Num::Real(b.objective),
                    )
                })
                .collect(),
        ),
    );
    r.register(
        "servetune_trial_duration_seconds",
        "Wall time of finished trials (launch, benchmark runs, teardown)",
        Stored::of(&DURATION_BUCKETS, &total.durations),
    );
    r.register(
        "servetune_launch_duration_seconds",
        "Seconds from spawning an engine to its first answered request",
        Stored::of(&LAUNCH_BUCKETS, &total.launches),
    );
    if let Some(t) = *d.next_nightly.lock().unwrap_or_else(|p| p.into_inner()) {
        r.register(
            "servetune_next_nightly_timestamp_seconds",
            "When the next nightly re-tune is due",
            gauge(t),
        );
    }
    let mut s = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut s, &r)
        .map_err(|e| DaemonError::Internal(format!("encoding the metrics: {e}")))?;
    Ok(s)
}
