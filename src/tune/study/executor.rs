//! The executor boundary: a search trial as a self-contained, serialisable `TrialSpec` (the
//! study file, the engines' search-space files, the trial's record with its configuration and
//! slot, and what it runs against), and its execution, which gives back the trial's record.
//!
//! A parallel study's local slots run `Exec` on exactly these contents; `servetune run-trial
//! SPEC.json` runs one anywhere servetune is installed (`cli::run_trial`): it renders the
//! engine's argv, environment and files from the spec's space files, pins the engine to the
//! slot, runs the workloads with the study's abort policy (its constraints) and prints the
//! record. A cluster executor (a Kubernetes Job per trial asking for `nvidia.com/gpu: N`)
//! would hand the spec over the same way and return the record through the daemon's API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::exec::Against;
use super::Runner;
use crate::tune::eval::Evaluator;
use crate::tune::records::{TrialKind, TrialRecord, TrialStatus};
use crate::tune::TuneError;

/// The version of the `TrialSpec` format.
pub const TRIAL_SPEC_VERSION: u32 = 1;

/// A search trial handed to an executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialSpec {
    pub version: u32,
    /// The study file's text: its workloads (as `servetune bench` flags), its constraints
    /// (each run's early-abort policy), its binaries and model.
    pub study_file: String,
    /// The engines' search-space files by file name (`vllm.toml`): how the configuration
    /// renders as argv, environment and files.
    pub spaces: BTreeMap<String, String>,
    /// The trial's record as stored before it runs: its sequence number, configuration and
    /// slot (`slot`: the devices the executor pins its engine to).
    pub trial: TrialRecord,
    /// What it runs against: the search so far (promotion and confirmation).
    pub against: Against,
}

impl<E: Evaluator> Runner<E> {
    /// The spec of a search trial of this study (its space files read now).
    pub fn trial_spec(&self, t: &TrialRecord, against: Against) -> Result<TrialSpec, TuneError> {
        let mut spaces = BTreeMap::new();
        for e in self.study.spec.study.engines.split('+') {
            let name = format!("{e}.toml");
            let path = self.study.space_dir.join(&name);
            let text = std::fs::read_to_string(&path).map_err(|source| TuneError::Io {
                path: path.display().to_string(),
                source,
            })?;
            spaces.insert(name, text);
        }
        Ok(TrialSpec {
            version: TRIAL_SPEC_VERSION,
            study_file: self.study.text.clone(),
            spaces,
            trial: t.clone(),
            against,
        })
    }

    /// Runs a spec's trial on this runner's evaluator, pinned to its slot, and gives back its
    /// record (also written to this runner's store).
    pub async fn execute(&mut self, spec: &TrialSpec) -> Result<TrialRecord, TuneError> {
        if spec.version != TRIAL_SPEC_VERSION {
            return Err(TuneError::Spec(format!(
                "trial spec version {} (this servetune reads version {TRIAL_SPEC_VERSION})",
                spec.version
            )));
        }
        if spec.trial.kind != TrialKind::Search || spec.trial.status != TrialStatus::Running {
            return Err(TuneError::Spec(
                "trial spec: `trial` must be a search trial that has not run (status running)"
                    .into(),
            ));
        }
        let mut t = spec.trial.clone();
        self.eval.place(t.slot.as_ref());
        self.put_trial(&t)?;
        self.exec().run_search_trial(&mut t, &spec.against).await?;
        self.put_trial(&t)?;
        Ok(t)
    }
}
