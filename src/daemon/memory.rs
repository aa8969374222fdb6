//! The scheduler's memory, kept in the store (tree `daemon`) so that a restart neither fires a
//! nightly re-tune twice nor misses an upgrade that happened while the daemon was down: the
//! next nightly time with the schedule it was computed from, and the last probe of each kept
//! study. The one layer over that tree (`tests/architecture.rs`).

use serde::{Deserialize, Serialize};

use super::Probe;
use crate::store::{Store, StoreError};

pub const DAEMON: &str = "daemon";
const NIGHTLY_NEXT: &str = "nightly_next";

/// The next nightly time, for the schedule it was computed from (`Schedule::key`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NightlyPlan {
    pub schedule: String,
    pub next: Option<i64>,
}

fn probe_key(study: &str) -> String {
    format!("probe/{study}")
}

pub struct SchedulerMemory {
    store: Store,
}

impl SchedulerMemory {
    pub fn new(store: Store) -> SchedulerMemory {
        SchedulerMemory { store }
    }

    pub fn nightly(&self) -> Result<Option<NightlyPlan>, StoreError> {
        self.store.get(DAEMON, NIGHTLY_NEXT)
    }

    pub fn put_nightly(&self, plan: &NightlyPlan) -> Result<(), StoreError> {
        self.store.put(DAEMON, NIGHTLY_NEXT, plan)
    }

    /// The last probe of the study named `study` that was acted on.
    pub fn probe(&self, study: &str) -> Result<Option<Probe>, StoreError> {
        self.store.get(DAEMON, &probe_key(study))
    }

    pub fn put_probe(&self, study: &str, probe: &Probe) -> Result<(), StoreError> {
        self.store.put(DAEMON, &probe_key(study), probe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_and_each_studys_probe_survive_reopening_and_stay_apart() {
        let dir = tempfile::tempdir().unwrap();
        let plan = NightlyPlan {
            schedule: "0 3 * * * Europe/Berlin".into(),
            next: Some(1_800_000_000),
        };
        let probe = |v: &str| -> Probe {
            serde_json::from_value(serde_json::json!({
                "engines": {"vllm": v}, "hardware": "1x H100", "driver": "550.54"
            }))
            .unwrap()
        };
        {
            let m = SchedulerMemory::new(Store::open(dir.path()).unwrap());
            assert_eq!(m.nightly().unwrap(), None);
            assert_eq!(m.probe("a").unwrap(), None);
            m.put_nightly(&plan).unwrap();
            m.put_probe("a", &probe("0.10.1")).unwrap();
            m.put_probe("b", &probe("0.11.0")).unwrap();
        }
        let m = SchedulerMemory::new(Store::open(dir.path()).unwrap());
        assert_eq!(m.nightly().unwrap(), Some(plan));
        assert_eq!(m.probe("a").unwrap(), Some(probe("0.10.1")));
        assert_eq!(m.probe("b").unwrap(), Some(probe("0.11.0")));
    }
}
