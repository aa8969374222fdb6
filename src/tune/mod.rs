//! Tuning studies: the study file (`spec`), the optimisers (`opt`, over the unit-cube
//! coordinates of `encode`), the study loop (`study`), its records and their one typed layer
//! over the store (`records`), the evaluator that measures a configuration for real (`eval`;
//! the mock's `evaluator` does it in virtual time), the recommendation gate (`decide`) and its
//! statistics (`significance`). The `tune|trials|best` commands are the top-level `cli`.

pub mod best;
pub mod decide;
pub mod encode;
pub mod eval;
pub mod opt;
pub mod prior;
pub mod records;
pub mod significance;
pub mod spec;
pub mod study;
pub mod warm;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::engine::inventory;
use crate::engine::trial::Launcher;
use crate::space::{Space, SpaceError};
use crate::store::{Store, StoreError};
use crate::telemetry::Telemetry;
use eval::EngineEvaluator;
use spec::Study;
use study::Runner;

#[derive(Debug, Error)]
pub enum TuneError {
    #[error("study file: {0}")]
    Spec(String),
    #[error("cannot read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Space(#[from] SpaceError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Conflict(String),
    #[error("engine: {0}")]
    Engine(String),
    #[error("an engine could not be torn down, so the study stopped: {0}")]
    Teardown(String),
    #[error("servetune could not run a trial: {0}")]
    Infrastructure(String),
    #[error("interrupted; run the same command again to resume")]
    Interrupted,
    #[error("no study {0:?} in the store")]
    NoStudy(String),
}

/// A study's engines as installed on this node.
pub struct Engines {
    /// The (joint) space, gated to the installed versions and restricted to `study.params`.
    pub space: Space,
    pub versions: BTreeMap<String, Option<String>>,
    /// Flags of the space files the installed engines lack (`<engine>.<param>`).
    pub dropped: Vec<String>,
    /// The argv that replaces `{binary}` per engine: the study's, else the resolved path.
    pub binaries: BTreeMap<String, Vec<String>>,
}

/// Engine spaces of a study, gated to the installed versions, with each engine's version and
/// binary, and the flags dropped because the installed engine lacks them.
pub async fn engine_space(study: &Study, telemetry: &Telemetry) -> Result<Engines, TuneError> {
    let fp = telemetry.fingerprint();
    let mut members = Vec::new();
    let mut versions = BTreeMap::new();
    let mut dropped = Vec::new();
    let mut binaries = study.spec.binaries.clone();
    let platform = match &study.spec.study.platform {
        Some(p) => p.clone(),
        None if telemetry.gpu_count() > 0 => "gpu".into(),
        None => "cpu".into(),
    };
    for e in study.spec.study.engines.split('+') {
        let mut sp = Space::load(&study.space_dir.join(format!("{e}.toml")))?;
        let mut vars = study.spec.vars.clone();
        vars.entry("gpu_count".into())
            .or_insert(telemetry.gpu_count().max(1) as i64);
        // A parallel CPU study's engines each run on a slot of `cores_per_trial` cores.
        let cores = study
            .spec
            .study
            .cores_per_trial
            .unwrap_or(fp.cpu_cores as usize);
        vars.entry("cores".into()).or_insert(cores as i64);
        vars.retain(|k, _| sp.vars.contains_key(k));
        let unknown: Vec<&String> = study
            .spec
            .vars
            .keys()
            .filter(|k| !sp.vars.contains_key(*k))
            .collect();
        if !unknown.is_empty() && study.spec.study.engines == e {
            return Err(TuneError::Spec(format!(
                "vars: {} not declared by {e}.toml (declared: {})",
                unknown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                sp.vars.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        sp.set_vars(&vars)?;
        sp.set_env(&study.spec.env);
        let (s, gone) = sp.for_platform(&platform)?;
        if !gone.is_empty() {
            tracing::debug!(
                "{e}: {platform} platform, not searching: {}",
                gone.join(", ")
            );
        }
        sp = s;
        let binary = study.spec.binaries.get(e).map(|v| v.as_slice());
        let inst = inventory::probe(&sp, binary, Duration::from_secs(60)).await;
        let Some(path) = &inst.path else {
            return Err(TuneError::Engine(format!(
                "{e} is not installed: {}",
                inst.note.unwrap_or_default()
            )));
        };
        binaries
            .entry(e.to_owned())
            .or_insert_with(|| vec![path.display().to_string()]);
        if inst.version.is_none() {
            tracing::warn!(
                "{e}: version unknown ({})",
                inst.note.as_deref().unwrap_or("no version command")
            );
        }
        if !inst.missing_flags.is_empty() {
            tracing::warn!(
                "{e} {}: dropping flags it does not have: {}",
                inst.version.as_deref().unwrap_or("?"),
                inst.missing_flags.join(", ")
            );
            let (s, gone) = sp.without(&inst.missing_flags);
            sp = s;
            dropped.extend(gone.into_iter().map(|g| format!("{e}.{g}")));
        }
        versions.insert(e.to_owned(), inst.version);
        members.push(sp);
    }
    let space = if members.len() == 1 {
        members.pop().expect("one member")
    } else {
        Space::joint(members)?
    };
    let space = restrict(space, study.spec.study.params.as_deref())?;
    Ok(Engines {
        space,
        versions,
        dropped,
        binaries,
    })
}

/// The space with only the named parameters searched (`study.params`).
pub fn restrict(space: Space, only: Option<&[String]>) -> Result<Space, TuneError> {
    let Some(only) = only else {
        return Ok(space);
    };
    for name in only {
        if !space.params.iter().any(|p| &p.name == name) {
            return Err(TuneError::Spec(format!(
                "study.params: unknown parameter {name:?} (known: {})",
                space
                    .params
                    .iter()
                    .map(|p| p.name.as_str())
                    .filter(|n| *n != "engine")
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let drop: Vec<String> = space
        .params
        .iter()
        .filter(|p| p.name != "engine" && !only.contains(&p.name))
        .map(|p| p.name.clone())
        .collect();
    Ok(space.without(&drop).0)
}

/// Everything a real study needs, assembled: reaps engines a killed servetune left behind,
/// probes the engines, builds the launcher and the runner.
pub async fn engine_runner(
    study: Study,
    store: Store,
    trial_root: PathBuf,
    telemetry: Telemetry,
) -> Result<Runner<EngineEvaluator>, TuneError> {
    for r in crate::engine::reap::reap(&store)? {
        if !r.killed.is_empty() {
            tracing::warn!(
                "killed engine {} left running by an earlier servetune (process groups {:?})",
                r.tag,
                r.killed
            );
        }
    }
    let Engines {
        space,
        versions,
        dropped,
        binaries,
    } = engine_space(&study, &telemetry).await?;
    if study.spec.objective.metric == spec::ObjectiveMetric::TokensPerJoule && !telemetry.enabled()
    {
        return Err(TuneError::Spec(
            "objective.metric: tokens_per_joule needs GPU energy readings (NVML), and this node has none".into(),
        ));
    }
    let fingerprint = telemetry.fingerprint();
    let hardware = fingerprint.key();
    let mut study = study;
    // A study resumed keeps the footprint it was created with (its priors, and so its
    // proposals, follow from it); a new one measures it.
    let stored = records::Records::new(store.clone())
        .study(study.id())?
        .filter(|r| r.spec_text == study.text)
        .and_then(|r| r.footprint);
    study.footprint =
        stored.unwrap_or_else(|| prior::Footprint::measure(&study.model, &fingerprint.gpus));
    let on_cpu = match &study.spec.study.platform {
        Some(p) => p == "cpu",
        None => fingerprint.gpus.is_empty(),
    };
    if let Some(w) =
        vllm_cpu_memory_warning(&study, on_cpu, crate::telemetry::host_memory::mem_total())
    {
        study.warnings.push(w);
    }
    let mut launcher = Launcher::new(Some(store.clone()), telemetry);
    launcher.refuse_foreign_gpu_processes = study.spec.study.refuse_foreign_gpu_processes;
    let eval = EngineEvaluator::new(
        launcher,
        space.clone(),
        study.model.clone(),
        study.workloads.clone(),
        study.limits.clone(),
        binaries,
        versions.clone(),
    );
    let parallel = slots(&study, &eval, on_cpu)?;
    let mut runner = Runner::new(store, study, space, eval, trial_root);
    runner.parallel = parallel;
    runner.hardware = hardware;
    runner.engine_versions = versions;
    runner.dropped_flags = dropped;
    Ok(runner)
}

/// A study's slots for parallel trials: the node's GPUs (the study's list of them), or on a
/// CPU node its cores in sets of `cores_per_trial`, and one evaluator per trial that fits at
/// once (`max_parallel_trials` bounds it). None on a CPU node without `cores_per_trial`: one
/// trial at a time on the whole machine, as always.
fn slots(
    study: &Study,
    eval: &EngineEvaluator,
    on_cpu: bool,
) -> Result<Option<study::Slots<EngineEvaluator>>, TuneError> {
    use crate::engine::slots::{Node, Pool};
    let s = &study.spec.study;
    let mut node = Node::detect(&eval.launcher.telemetry, s.gpus.as_deref())
        .map_err(|e| TuneError::Spec(format!("study.gpus: {e}")))?;
    if on_cpu {
        node.gpus.clear();
    }
    let per = if node.gpus.is_empty() {
        match s.cores_per_trial {
            Some(c) => c,
            None => return Ok(None),
        }
    } else {
        s.cores_per_trial.unwrap_or(0)
    };
    let pool = Pool::new(node, per, s.max_parallel_trials)
        .map_err(|e| TuneError::Spec(format!("study.cores_per_trial: {e}")))?;
    let k = pool.capacity(1);
    let evals = (0..k).map(|_| eval.sibling()).collect();
    Ok(Some(study::Slots { pool, evals }))
}

/// vLLM's CPU build sizes its KV cache from `--gpu-memory-utilization` of the host's memory
/// (0.92 by default) unless `VLLM_CPU_KVCACHE_SPACE` sets it, and refuses to start when other
/// processes hold part of that: said at the start of a CPU study of vLLM that leaves it unset
/// (seen 2026-12-05: "Available memory on node 0 (20.29/23.54 GiB) … is less than requested").
/// `host_bytes`: the host's memory, for the figure.
pub fn vllm_cpu_memory_warning(
    study: &Study,
    on_cpu: bool,
    host_bytes: Option<u64>,
) -> Option<String> {
    let vllm = study.spec.study.engines.split('+').any(|e| e == "vllm");
    if !(on_cpu && vllm) || study.spec.env.contains_key("VLLM_CPU_KVCACHE_SPACE") {
        return None;
    }
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let total = host_bytes
        .map(|b| {
            format!(
                " ({:.1} GiB of {:.1} GiB here)",
                gib(0.92 * b as f64),
                gib(b as f64)
            )
        })
        .unwrap_or_default();
    Some(format!(
        "vLLM's CPU defaults ask for 92% of this machine's memory for their KV cache{total} and refuse to start when other processes hold part of it; set `[env] VLLM_CPU_KVCACHE_SPACE` (GiB) for a cache of a known size, as studies/vllm-cpu-smollm2.toml does"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_study_of_vllm_without_a_kv_cache_size_is_warned_of_its_memory_at_start() {
        let path = std::path::Path::new("studies/vllm-cpu-smollm2.toml");
        let shipped = Study::load(path).unwrap();
        assert_eq!(
            vllm_cpu_memory_warning(&shipped, true, Some(24 << 30)),
            None
        );
        let text = std::fs::read_to_string(path)
            .unwrap()
            .replace("VLLM_CPU_KVCACHE_SPACE = \"1\"", "");
        let bare = Study::parse(&text, path).unwrap();
        let w = vllm_cpu_memory_warning(&bare, true, Some(24 << 30)).unwrap();
        assert!(w.contains("92% of this machine's memory"), "{w}");
        assert!(w.contains("(22.1 GiB of 24.0 GiB here)"), "{w}");
        // On a GPU node the fraction is of the GPU's memory: nothing to say here.
        assert_eq!(vllm_cpu_memory_warning(&bare, false, Some(24 << 30)), None);
    }
}
