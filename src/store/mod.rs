//! The persistent store (sled): one database under the state directory, JSON values so that a
//! person can inspect them, a schema version checked at open, and a flush after every write
//! that must survive a SIGKILL.
//!
//! Trees: `meta` (schema version), `engines` (every engine servetune has started and not yet
//! seen gone: its tag, argv, log and process group, written *before* the engine is spawned so
//! that a restart can find and kill an engine left behind).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Bumped whenever a stored record changes shape incompatibly.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot open the store at {path} (is another servetune using it?)")]
    Open {
        path: String,
        #[source]
        source: sled::Error,
    },
    #[error("the store at {path} has schema version {found}; this servetune reads up to {SCHEMA_VERSION}: upgrade servetune or point --state-dir elsewhere")]
    Schema { path: String, found: u32 },
    #[error("store: {0}")]
    Db(#[from] sled::Error),
    #[error("store: record {key:?} in {tree} is not valid: {source}")]
    Decode {
        tree: String,
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

/// An engine servetune started (or is about to start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineRecord {
    /// Unique tag, also in the engine's environment as `SERVETUNE_ENGINE_TAG`.
    pub tag: String,
    pub argv: Vec<String>,
    pub log: PathBuf,
    /// Known once spawned.
    pub pgid: Option<i32>,
    /// The servetune process that started it.
    pub owner_pid: u32,
    pub started_unix: f64,
}

#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join("servetune.sled");
        let db = sled::Config::new()
            .path(&path)
            .open()
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        let meta = db.open_tree("meta")?;
        match meta.get("schema_version")? {
            Some(v) => {
                let found = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(u32::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StoreError::Schema {
                        path: path.display().to_string(),
                        found,
                    });
                }
            }
            None => {
                meta.insert("schema_version", SCHEMA_VERSION.to_string().as_bytes())?;
                db.flush()?;
            }
        }
        Ok(Store { db, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes everything buffered to disk (every `put` already does).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Writes a JSON value and flushes it to disk.
    pub fn put<T: Serialize>(&self, tree: &str, key: &str, value: &T) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(value).expect("store records serialise");
        self.db.open_tree(tree)?.insert(key, bytes)?;
        self.db.flush()?;
        Ok(())
    }

    pub fn get<T: DeserializeOwned>(&self, tree: &str, key: &str) -> Result<Option<T>, StoreError> {
        match self.db.open_tree(tree)?.get(key)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|source| StoreError::Decode {
                    tree: tree.into(),
                    key: key.into(),
                    source,
                }),
        }
    }

    pub fn remove(&self, tree: &str, key: &str) -> Result<(), StoreError> {
        self.db.open_tree(tree)?.remove(key)?;
        self.db.flush()?;
        Ok(())
    }

    /// Every record of a tree whose key starts with `prefix`, in key order.
    pub fn scan<T: DeserializeOwned>(
        &self,
        tree: &str,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.db.open_tree(tree)?.scan_prefix(prefix) {
            let (k, v) = kv?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let value = serde_json::from_slice(&v).map_err(|source| StoreError::Decode {
                tree: tree.into(),
                key: key.clone(),
                source,
            })?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// Records an engine before it is spawned.
    pub fn engine_intent(&self, rec: &EngineRecord) -> Result<(), StoreError> {
        self.put("engines", &rec.tag, rec)
    }

    /// Adds the process group of a spawned engine.
    pub fn engine_started(&self, tag: &str, pgid: i32) -> Result<(), StoreError> {
        if let Some(mut rec) = self.get::<EngineRecord>("engines", tag)? {
            rec.pgid = Some(pgid);
            self.put("engines", tag, &rec)?;
        }
        Ok(())
    }

    /// The engine is gone (torn down and verified).
    pub fn engine_gone(&self, tag: &str) -> Result<(), StoreError> {
        self.remove("engines", tag)
    }

    pub fn engines(&self) -> Result<Vec<EngineRecord>, StoreError> {
        Ok(self
            .scan("engines", "")?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening_and_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let rec = EngineRecord {
            tag: "t1".into(),
            argv: vec!["x".into()],
            log: "/tmp/x.log".into(),
            pgid: None,
            owner_pid: 1,
            started_unix: 0.0,
        };
        {
            let s = Store::open(dir.path()).unwrap();
            s.engine_intent(&rec).unwrap();
            s.engine_started("t1", 4242).unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        let got = s.engines().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].pgid, Some(4242));
        s.engine_gone("t1").unwrap();
        assert!(s.engines().unwrap().is_empty());
        s.db.open_tree("meta")
            .unwrap()
            .insert("schema_version", "99")
            .unwrap();
        s.db.flush().unwrap();
        drop(s);
        let e = Store::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("schema version 99"), "{e}");
    }
}
