//! The best known configuration for a model on a node, per engine version and workload: what a
//! finished study proposes for it, and the rule that decides whether the proposal replaces the
//! stored one. `servetune best`, `GET /v1/best` and the daemon's views read what this writes
//! (through `Records`).

use super::decide::Comparison;
use super::records::{BestRecord, Outcome, Records, TrialRecord};
use crate::space::CommandLine;
use crate::store::StoreError;

/// The key of a best record: model, node, engine@version and workload.
pub fn key(
    model: &str,
    hardware: &str,
    engine: &str,
    version: Option<&str>,
    workload: &str,
) -> String {
    format!(
        "{model}|{hardware}|{engine}@{}|{workload}",
        version.unwrap_or("?")
    )
}

/// The objective a best record states: for a recommendation, the candidate's mean in the
/// pooled re-measurement rounds; for the defaults, their own mean there (both are what the
/// gate judged, not a single lucky search run); `own`, the trial's own objective, when the
/// rounds give none or were compared on the objective's fallback (another unit).
pub fn objective(
    comparisons: &[Comparison],
    recommended: Option<u32>,
    own: Option<f64>,
) -> Option<f64> {
    let in_unit = |c: &&Comparison| !c.fallback;
    let pooled = match recommended {
        Some(r) => comparisons
            .iter()
            .find(|c| c.candidate == r)
            .filter(in_unit)
            .and_then(|c| c.diff.as_ref().map(|d| d.mean_a)),
        None => comparisons
            .first()
            .filter(in_unit)
            .and_then(|c| c.diff.as_ref().map(|d| d.mean_b)),
    };
    pooled.filter(|v| v.is_finite() && *v > 0.0).or(own)
}

/// What a finished study proposes as the best record of `workload`: its recommended trial
/// (`improved`: it beat the defaults significantly), else the defaults' trial `chosen`.
pub fn proposed(
    model: &str,
    hardware: &str,
    study: &str,
    workload: &str,
    outcome: &Outcome,
    chosen: &TrialRecord,
    at: f64,
) -> BestRecord {
    let improved = outcome.recommended == Some(chosen.seq);
    let engine = chosen.engine.clone().unwrap_or_default();
    let version = chosen.engine_version.clone();
    BestRecord {
        key: key(model, hardware, &engine, version.as_deref(), workload),
        model: model.to_owned(),
        hardware: hardware.to_owned(),
        engine,
        engine_version: version,
        workload: workload.to_owned(),
        study: study.to_owned(),
        trial: chosen.seq,
        config: chosen.config.clone(),
        command: chosen.command.as_ref().map(CommandLine::serving),
        objective: objective(
            &outcome.comparisons,
            improved.then_some(chosen.seq),
            chosen.objective,
        ),
        metric: outcome.metric.clone(),
        improved,
        at,
    }
}

/// Writes `b`, unless it only restates the defaults and the stored record is a configuration
/// an earlier study proved better than them: a re-tune that finds nothing significant keeps
/// the proven one. Returns the record kept instead of `b`, if any.
pub fn keep_or_write(records: &Records, b: &BestRecord) -> Result<Option<BestRecord>, StoreError> {
    if !b.improved {
        if let Some(prev) = records.best(&b.key)? {
            if prev.improved {
                return Ok(Some(prev));
            }
        }
    }
    records.put_best(b)?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn best(study: &str, improved: bool) -> BestRecord {
        BestRecord {
            key: key("m", "1x H100", "vllm", Some("0.10.1"), "chat"),
            model: "m".into(),
            hardware: "1x H100".into(),
            engine: "vllm".into(),
            engine_version: Some("0.10.1".into()),
            workload: "chat".into(),
            study: study.into(),
            trial: 3,
            config: Default::default(),
            command: None,
            objective: Some(100.0),
            metric: "total_token_throughput".into(),
            improved,
            at: 0.0,
        }
    }

    #[test]
    fn the_key_keeps_the_stored_format() {
        // Stored keys from earlier versions must still be found: the format cannot drift.
        assert_eq!(
            key("m", "1x H100", "vllm", Some("0.10.1"), "chat"),
            "m|1x H100|vllm@0.10.1|chat"
        );
        assert_eq!(
            key("m", "cpu", "llamacpp", None, "c4"),
            "m|cpu|llamacpp@?|c4"
        );
    }

    #[test]
    fn a_proven_best_survives_a_retune_that_finds_nothing_and_yields_to_a_new_proof() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(Store::open(dir.path()).unwrap());
        let key = best("a", false).key;
        // Nothing stored: the defaults are written.
        assert_eq!(keep_or_write(&records, &best("a", false)).unwrap(), None);
        // An unproven record gives way to anything, a proven one included.
        assert_eq!(keep_or_write(&records, &best("b", true)).unwrap(), None);
        assert_eq!(records.best(&key).unwrap().unwrap().study, "b");
        // A re-tune that only restates the defaults keeps the proven record.
        let kept = keep_or_write(&records, &best("c", false)).unwrap();
        assert_eq!(kept.map(|k| k.study).as_deref(), Some("b"));
        assert_eq!(records.best(&key).unwrap().unwrap().study, "b");
        // A newer proof replaces it.
        assert_eq!(keep_or_write(&records, &best("d", true)).unwrap(), None);
        assert_eq!(records.best(&key).unwrap().unwrap().study, "d");
    }

    #[test]
    fn the_objective_is_the_pooled_mean_of_what_was_chosen() {
        let cmp = |candidate: u32, a: f64, b: f64| -> Comparison {
            let mut diff =
                crate::tune::significance::welch(&[a - 1.0, a + 1.0], &[b - 1.0, b + 1.0]);
            if a.is_nan() {
                diff.mean_a = f64::NAN;
            }
            Comparison {
                candidate,
                command: None,
                diff: Some(diff),
                p_adjusted: None,
                significant: false,
                disqualified: None,
                fallback: false,
            }
        };
        let cs = [cmp(5, 120.0, 100.0), cmp(7, 130.0, 101.0)];
        assert_eq!(objective(&cs, Some(7), Some(150.0)), Some(130.0));
        // Rounds compared on the fallback (another unit): the trial's own figure.
        let mut other = cs.clone();
        other[1].fallback = true;
        assert_eq!(objective(&other, Some(7), Some(150.0)), Some(150.0));
        assert_eq!(objective(&cs, None, Some(150.0)), Some(100.0));
        // No usable rounds: the trial's own figure.
        assert_eq!(objective(&[], Some(7), Some(150.0)), Some(150.0));
        assert_eq!(objective(&[cmp(7, f64::NAN, 1.0)], Some(7), None), None);
    }
}
