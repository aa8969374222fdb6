//! The warm-start policy: which configurations of an earlier study a re-tune measures first,
//! right after the engine's defaults. One policy, used by the daemon's re-tunes (`from_store`,
//! after an engine upgrade or a GPU change) and by `servetune search-bench --warm`, which
//! measures what it gains over a cold start (so the benchmark measures the daemon's policy).

use std::collections::HashSet;

use super::opt;
use super::records::{Records, TrialKind, WarmStart};
use crate::space::{Config, Space};
use crate::store::StoreError;

/// A measured configuration of the earlier study.
#[derive(Debug, Clone)]
pub struct Earlier {
    pub config: Config,
    /// Its objective when it met every constraint (`None`: infeasible or failed).
    pub objective: Option<f64>,
    /// Where it comes from, for the proposal's note.
    pub from: String,
}

/// The policy. The earlier study's recommendation first (it beat that study's defaults in
/// validation), then its feasible search trials, best objective first; each carried over into
/// `space` (the engine installed now: a removed flag takes its default, a value out of a new
/// range is clamped), a configuration equal to one already chosen or to one of `space`'s
/// baselines dropped after the carry-over (a baseline is measured first anyway, and a repeat
/// teaches nothing); at most `top` in all. `search` is the earlier study's search trials (its
/// baselines among them, as they are search trials too; re-measurement rounds are not).
pub fn select(
    space: &Space,
    recommended: Option<Earlier>,
    search: Vec<Earlier>,
    top: usize,
) -> Vec<WarmStart> {
    let mut ranked: Vec<Earlier> = search
        .into_iter()
        .filter(|e| e.objective.is_some_and(f64::is_finite))
        .collect();
    ranked.sort_by(|a, b| {
        b.objective
            .unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&a.objective.unwrap_or(f64::NEG_INFINITY))
    });
    let mut seen: HashSet<String> = space.baselines().iter().map(opt::key).collect();
    let mut out = Vec::new();
    for e in recommended.into_iter().chain(ranked) {
        if out.len() >= top {
            break;
        }
        let Some(config) = space.carry_over(&e.config) else {
            continue;
        };
        if seen.insert(opt::key(&config)) {
            out.push(WarmStart {
                config,
                from: e.from,
            });
        }
    }
    out
}

/// The daemon's warm start for a run of the study `name`: `select` over the latest finished
/// study of that name other than `except` (its recommendation and its search trials).
pub fn from_store(
    records: &Records,
    name: &str,
    except: &str,
    space: &Space,
    top: usize,
) -> Result<Vec<WarmStart>, StoreError> {
    if top == 0 {
        return Ok(Vec::new());
    }
    let Some(prev) = records.latest_finished(name, except)? else {
        return Ok(Vec::new());
    };
    let recommended = prev.outcome.as_ref().and_then(|o| {
        Some(Earlier {
            config: o.recommended_config.clone()?,
            objective: None,
            from: format!("study {} #{}, recommended", prev.id, o.recommended?),
        })
    });
    let search = records
        .trials(&prev.id)?
        .into_iter()
        .filter(|t| t.kind == TrialKind::Search)
        .map(|t| Earlier {
            from: format!(
                "study {} #{} ({:.1})",
                prev.id,
                t.seq,
                t.objective.unwrap_or(0.0)
            ),
            objective: t.objective,
            config: t.config,
        })
        .collect();
    Ok(select(space, recommended, search, top))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::Value;

    /// `seqs` (default 256, at most 512 in this "new" version) and `chunked` (default off).
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
max = 512
default = 256
source = "test"
[[param]]
name = "chunked"
flag = "--chunked"
type = "bool"
default = false
source = "test"
"#,
            "t.toml",
        )
        .unwrap()
    }

    fn cfg(seqs: i64, chunked: bool) -> Config {
        [
            ("seqs".to_owned(), Value::Int(seqs)),
            ("chunked".to_owned(), Value::Bool(chunked)),
        ]
        .into_iter()
        .collect()
    }

    fn earlier(seqs: i64, chunked: bool, objective: Option<f64>, from: &str) -> Earlier {
        Earlier {
            config: cfg(seqs, chunked),
            objective,
            from: from.into(),
        }
    }

    #[test]
    fn the_recommendation_comes_first_then_the_best_feasible_trials_up_to_top() {
        let s = space();
        let got = select(
            &s,
            Some(earlier(128, true, None, "rec")),
            vec![
                earlier(64, false, Some(90.0), "a"),
                earlier(32, true, None, "infeasible"),
                earlier(16, true, Some(120.0), "b"),
                earlier(8, true, Some(100.0), "c"),
                earlier(4, true, Some(f64::NAN), "nan"),
            ],
            3,
        );
        let from: Vec<&str> = got.iter().map(|w| w.from.as_str()).collect();
        assert_eq!(from, ["rec", "b", "c"]);
        assert_eq!(got[0].config, cfg(128, true));
        // With room for all, the infeasible and the NaN one still stay out.
        let all = select(
            &s,
            None,
            vec![
                earlier(64, false, Some(90.0), "a"),
                earlier(32, true, None, "infeasible"),
                earlier(4, true, Some(f64::NAN), "nan"),
            ],
            10,
        );
        let from: Vec<&str> = all.iter().map(|w| w.from.as_str()).collect();
        assert_eq!(from, ["a"]);
    }

    #[test]
    fn from_store_reads_the_latest_finished_run_of_the_name_and_only_its_search_trials() {
        use crate::store::Store;
        use crate::tune::records::fixtures::{named, trial};
        use crate::tune::records::{Outcome, Phase, TrialStatus};
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(Store::open(dir.path()).unwrap());
        let s = space();
        let study = |id: &str, name: &str, created: f64, phase: Phase| {
            records.put_study(&named(id, name, created, phase)).unwrap()
        };
        let put = |id: &str, seq: u32, kind: TrialKind, seqs: i64, objective: Option<f64>| {
            let mut t = trial(id, seq, kind, TrialStatus::Ok);
            t.config = cfg(seqs, false);
            t.objective = objective;
            records.put_trial(&t).unwrap();
        };
        let search = || TrialKind::Search;
        let remeasure = || TrialKind::Remeasure {
            round: 1,
            candidate: 2,
        };
        // Nothing earlier: no warm start.
        assert!(from_store(&records, "n", "now", &s, 3).unwrap().is_empty());
        // An older finished run, the latest finished one, an unfinished later one, another
        // name, and the run being started (`except`).
        study("old", "n", 1.0, Phase::Done);
        put("old", 1, search(), 11, Some(500.0));
        let mut latest = named("latest", "n", 2.0, Phase::Done);
        let mut o: Outcome = serde_json::from_value(serde_json::json!({
            "metric": "total_token_throughput", "baseline_trial": 0, "recommended": 2,
            "recommended_command": null, "recommended_config": cfg(40, false),
            "comparisons": [], "verdict": "run it", "search_trials": 3,
            "screened_only": 0, "bench_s": 1.0, "saved_s": 0.0
        }))
        .unwrap();
        latest.outcome = Some(o.clone());
        records.put_study(&latest).unwrap();
        // The defaults (a search trial like the others) read best.
        put("latest", 0, search(), 256, Some(900.0));
        put("latest", 1, search(), 30, Some(100.0));
        put("latest", 2, search(), 40, Some(200.0));
        put("latest", 3, search(), 50, Some(150.0));
        put("latest", 4, remeasure(), 20, Some(990.0));
        study("running", "n", 3.0, Phase::Search);
        put("running", 1, search(), 60, Some(999.0));
        study("other", "m", 4.0, Phase::Done);
        put("other", 1, search(), 70, Some(999.0));
        study("now", "n", 5.0, Phase::Done);
        put("now", 1, search(), 80, Some(999.0));

        let got = from_store(&records, "n", "now", &s, 3).unwrap();
        let seqs: Vec<&Value> = got.iter().map(|w| &w.config["seqs"]).collect();
        // The recommendation (40), then the best other search trials (50, 30); never the
        // defaults (256, the best objective: measured first anyway), a re-measurement round
        // (20) or another run's trials.
        assert_eq!(seqs, [&Value::Int(40), &Value::Int(50), &Value::Int(30)]);
        assert_eq!(got[0].from, "study latest #2, recommended");
        // A recommendation without its configuration is not invented.
        o.recommended_config = None;
        latest.outcome = Some(o);
        records.put_study(&latest).unwrap();
        let got = from_store(&records, "n", "now", &s, 3).unwrap();
        let seqs: Vec<&Value> = got.iter().map(|w| &w.config["seqs"]).collect();
        assert_eq!(seqs, [&Value::Int(40), &Value::Int(50), &Value::Int(30)]);
        assert!(got[0].from.starts_with("study latest #2 ("));
        assert!(from_store(&records, "n", "now", &s, 0).unwrap().is_empty());
    }

    #[test]
    fn carried_over_duplicates_and_the_new_baseline_do_not_take_a_place() {
        let s = space();
        let got = select(
            &s,
            // 4096 is out of the new range: it is clamped to 512, as is 1024 below.
            Some(earlier(4096, true, None, "rec")),
            vec![
                earlier(1024, true, Some(130.0), "dup after carry-over"),
                earlier(256, false, Some(120.0), "the defaults"),
                earlier(100, false, Some(110.0), "kept"),
                earlier(50, false, Some(100.0), "kept too"),
            ],
            3,
        );
        let from: Vec<&str> = got.iter().map(|w| w.from.as_str()).collect();
        assert_eq!(from, ["rec", "kept", "kept too"]);
        assert_eq!(got[0].config, cfg(512, true));
        assert!(select(&s, Some(earlier(128, true, None, "rec")), vec![], 0).is_empty());
    }
}
