//! The persistent store (sled): one database under the state directory, JSON values so that a
//! person can inspect them, a schema version checked at open, and a flush after every write
//! that must survive a SIGKILL.
//!
//! Trees: `meta` (schema version), `engines` (every engine servetune has started and not yet
//! seen gone: its tag, argv, log and process group, written *before* the engine is spawned so
//! that a restart can find and kill an engine left behind).
//!
//! sled admits one process. So that a person can look at a study while a foreground `tune` or
//! the daemon holds the store, the writer mirrors every record as a file
//! (`<dir>/mirror/<tree>/<name>.json`: the key on its first line, the value after it; written
//! to a temporary name and renamed, so a reader never sees half a record; rewritten whole at
//! open). [`Store::open_for_reading`] opens the
//! store itself when it is free, and otherwise loads the mirror into a temporary, read-only
//! copy: never a second writer.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Bumped whenever a stored record changes shape. A writer opening an older store marks it
/// with this version; the records themselves read back through their types' own fallbacks.
/// - 1: the first.
/// - 2: a trial's command is its environment and argv (`space::CommandLine`), no longer the
///   display string; version 1's strings are split back by shell rules when read.
pub const SCHEMA_VERSION: u32 = 2;

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
    #[error("no store at {path}: nothing has run with this state directory (pass --state)")]
    Missing { path: String },
    #[error("the store at {path} is held by another servetune and has no readable mirror ({why}); stop that process or wait for it to finish")]
    Held { path: String, why: String },
    #[error(
        "the store at {path} is held by another servetune; this is a read-only view of its mirror"
    )]
    ReadOnly { path: String },
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
    /// Where the writer mirrors its records; `None` in a read-only view of that mirror.
    mirror: Option<PathBuf>,
    /// Held across a write and its mirror write, so that two threads writing one key (clones of
    /// one store) leave the mirror with the value sled has.
    writes: std::sync::Arc<std::sync::Mutex<()>>,
    /// Counts this process's writes (`put`, `remove`) through any clone of this store, so that
    /// a view built from the store can tell whether it is still current (`generation`).
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A file name for a key: its bytes in hex when that is short, else a hash of them (a `best`
/// key holds a model path and the hardware: hex of it can pass the 255-byte name limit). The
/// key itself is inside the file, so the name only has to be unique.
fn key_file(key: &[u8]) -> String {
    if key.len() <= 100 {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}.json")
    } else {
        // FNV-1a, 64 bits: stable across builds (std's hasher is not promised to be).
        let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("h{h:016x}-{}.json", key.len())
    }
}

/// A mirror file: the key as a JSON string on the first line, then the stored JSON value as
/// it is (no newline can occur in a JSON string, so the first one ends the key).
fn mirror_bytes(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = serde_json::to_vec(&String::from_utf8_lossy(key)).expect("a string serialises");
    out.push(b'\n');
    out.extend_from_slice(value);
    out
}

/// The key and value of a mirror file.
fn mirror_record(bytes: &[u8]) -> Option<(String, &[u8])> {
    let nl = bytes.iter().position(|b| *b == b'\n')?;
    let key = serde_json::from_slice(&bytes[..nl]).ok()?;
    Some((key, &bytes[nl + 1..]))
}

/// Writes `bytes` to `path` through a temporary file and a rename (readers see the old record
/// or the new one, never part of one). Callers hold the store's write lock, so one temporary
/// name per record is enough.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Whether opening failed because another process holds sled's lock. sled 0.34 reports it as
/// an `Other` I/O error with this text (config.rs, `try_lock`); the unit test
/// `a_held_store_is_read_through_its_mirror` fails if a sled upgrade changes it.
fn is_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io)
        if io.kind() == std::io::ErrorKind::WouldBlock
            || io.to_string().starts_with("could not acquire lock"))
}

impl Store {
    /// The store of a servetune state directory (`<state>/db`), to write.
    pub fn open_state(state: &Path) -> Result<Store, StoreError> {
        Store::open(&state.join("db"))
    }

    /// The store of a state directory, to read (see `open_for_reading`).
    pub fn open_state_for_reading(state: &Path) -> Result<Store, StoreError> {
        Store::open_for_reading(&state.join("db"))
    }

    /// Opens (or creates) the store in `dir` to write it. A reader (`open_for_reading`) holds
    /// the lock for milliseconds, so a held lock is retried for a few seconds first.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(dir, std::time::Duration::from_secs(5), true)
    }

    fn open_with(dir: &Path, wait: std::time::Duration, writer: bool) -> Result<Store, StoreError> {
        let path = dir.join("servetune.sled");
        let deadline = std::time::Instant::now() + wait;
        let db = loop {
            match sled::Config::new().path(&path).open() {
                Ok(db) => break db,
                Err(e) if is_held(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        path: path.display().to_string(),
                        source,
                    })
                }
            }
        };
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
                if found < SCHEMA_VERSION && writer {
                    meta.insert("schema_version", SCHEMA_VERSION.to_string().as_bytes())?;
                    db.flush()?;
                }
            }
            None => {
                meta.insert("schema_version", SCHEMA_VERSION.to_string().as_bytes())?;
                db.flush()?;
            }
        }
        let store = Store {
            db,
            path,
            mirror: Some(dir.join("mirror")),
            writes: Default::default(),
            generation: Default::default(),
        };
        if writer {
            store.mirror_all();
        }
        Ok(store)
    }

    /// Opens the store to read it: the store itself when no other process holds it, else a
    /// read-only copy of the mirror its holder keeps (writes to it fail with `ReadOnly`).
    /// A reader never creates a store, and does not wait for a held one.
    pub fn open_for_reading(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join("servetune.sled");
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.display().to_string(),
            });
        }
        match Store::open_with(dir, std::time::Duration::ZERO, false) {
            Err(StoreError::Open { path, source }) if is_held(&source) => {
                Store::from_mirror(dir).map_err(|why| StoreError::Held { path, why })
            }
            other => other,
        }
    }

    /// Whether this is a read-only view of another process's mirror.
    pub fn is_read_only(&self) -> bool {
        self.mirror.is_none()
    }

    /// The mirror as a read-only store; read again once if it changed under the reader (the
    /// writer swaps in a rebuilt mirror at open).
    fn from_mirror(dir: &Path) -> Result<Store, String> {
        Store::load_mirror(dir).or_else(|_| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            Store::load_mirror(dir)
        })
    }

    fn load_mirror(dir: &Path) -> Result<Store, String> {
        let root = dir.join("mirror");
        let trees = std::fs::read_dir(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let db = sled::Config::new()
            .temporary(true)
            .open()
            .map_err(|e| e.to_string())?;
        for tree in trees {
            let tree = tree.map_err(|e| e.to_string())?;
            let name = tree.file_name().to_string_lossy().into_owned();
            let t = db.open_tree(&name).map_err(|e| e.to_string())?;
            for f in std::fs::read_dir(tree.path()).map_err(|e| e.to_string())? {
                let f = f.map_err(|e| e.to_string())?;
                if !f.file_name().to_string_lossy().ends_with(".json") {
                    continue; // a temporary file being written
                }
                // A record removed between listing and reading is simply not shown.
                let Ok(bytes) = std::fs::read(f.path()) else {
                    continue;
                };
                let (key, value) = mirror_record(&bytes)
                    .ok_or_else(|| format!("{}: not a mirrored record", f.path().display()))?;
                t.insert(key.as_bytes(), value).map_err(|e| e.to_string())?;
            }
        }
        let path = dir.join("servetune.sled");
        let found = db
            .open_tree("meta")
            .and_then(|m| m.get("schema_version"))
            .map_err(|e| e.to_string())?
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u32>().ok());
        match found {
            Some(v) if v <= SCHEMA_VERSION => {}
            Some(v) => {
                return Err(format!(
                    "its schema version is {v}; this servetune reads up to {SCHEMA_VERSION}"
                ))
            }
            None => return Err("it has no schema version yet".into()),
        }
        Ok(Store {
            db,
            path,
            mirror: None,
            writes: Default::default(),
            generation: Default::default(),
        })
    }

    /// Rewrites the whole mirror from the database (at open: it may be missing or stale).
    /// A mirror that cannot be written costs readers their view, not the writer its data.
    fn mirror_all(&self) {
        let Some(root) = &self.mirror else { return };
        let fresh = root.with_extension("new");
        let old = root.with_extension("old");
        let mut skipped = 0usize;
        let result = (|| -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&fresh);
            let _ = std::fs::remove_dir_all(&old);
            for name in self.db.tree_names() {
                let name = String::from_utf8_lossy(&name).into_owned();
                if name.starts_with("__sled") {
                    continue;
                }
                let dir = fresh.join(&name);
                std::fs::create_dir_all(&dir)?;
                let tree = self.db.open_tree(&name).map_err(std::io::Error::other)?;
                for kv in tree.iter() {
                    let (k, v) = kv.map_err(std::io::Error::other)?;
                    // One record that cannot be mirrored costs readers that record only.
                    let written = std::fs::write(dir.join(key_file(&k)), mirror_bytes(&k, &v));
                    if let Err(e) = written {
                        skipped += 1;
                        tracing::warn!("cannot mirror {name}/{}: {e}", String::from_utf8_lossy(&k));
                    }
                }
            }
            // Swapped by renames: a reader finds a whole mirror, old or new, at every moment but
            // the one between the two renames, and reads again after it.
            if root.exists() {
                std::fs::rename(root, &old)?;
            }
            std::fs::rename(&fresh, root)?;
            let _ = std::fs::remove_dir_all(&old);
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!("cannot mirror the store to {}: {e}", root.display());
        } else if skipped > 0 {
            tracing::warn!("{skipped} records of the store are not in its mirror");
        }
    }

    fn mirror_put(&self, tree: &str, key: &str, bytes: &[u8]) {
        let Some(root) = &self.mirror else { return };
        let dir = root.join(tree);
        let r = std::fs::create_dir_all(&dir).and_then(|_| {
            write_atomic(
                &dir.join(key_file(key.as_bytes())),
                &mirror_bytes(key.as_bytes(), bytes),
            )
        });
        if let Err(e) = r {
            tracing::warn!("cannot mirror {tree}/{key} to {}: {e}", root.display());
        }
    }

    fn mirror_remove(&self, tree: &str, key: &str) {
        let Some(root) = &self.mirror else { return };
        let path = root.join(tree).join(key_file(key.as_bytes()));
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("cannot remove the mirror of {tree}/{key}: {e}");
            }
        }
    }

    fn writable(&self) -> Result<(), StoreError> {
        match self.mirror {
            Some(_) => Ok(()),
            None => Err(StoreError::ReadOnly {
                path: self.path.display().to_string(),
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many writes this process has made to the store (any tree, any clone). Bumped after
    /// the write reaches sled: a reader that takes the generation before reading, and finds it
    /// unchanged later, read nothing older than what it would read now. Another process cannot
    /// write the store while this one holds it (sled's lock), so the count is complete.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Writes everything buffered to disk (every `put` already does).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Writes a JSON value and flushes it to disk.
    pub(crate) fn put<T: Serialize>(
        &self,
        tree: &str,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        self.writable()?;
        let bytes = serde_json::to_vec(value).expect("store records serialise");
        let _one_writer = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        self.db.open_tree(tree)?.insert(key, bytes.as_slice())?;
        self.generation.fetch_add(1, Ordering::Release);
        self.db.flush()?;
        self.mirror_put(tree, key, &bytes);
        Ok(())
    }

    pub(crate) fn get<T: DeserializeOwned>(
        &self,
        tree: &str,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
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

    pub(crate) fn remove(&self, tree: &str, key: &str) -> Result<(), StoreError> {
        self.writable()?;
        let _one_writer = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        self.db.open_tree(tree)?.remove(key)?;
        self.generation.fetch_add(1, Ordering::Release);
        self.db.flush()?;
        self.mirror_remove(tree, key);
        Ok(())
    }

    /// Every record of a tree whose key starts with `prefix`, in key order.
    pub(crate) fn scan<T: DeserializeOwned>(
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
    fn every_write_through_any_clone_moves_the_generation_and_reads_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(dir.path()).unwrap();
        let b = a.clone();
        let g0 = a.generation();
        a.put("studies", "x", &1).unwrap();
        assert_eq!(b.generation(), g0 + 1);
        let _: Option<i32> = b.get("studies", "x").unwrap();
        let _: Vec<(String, i32)> = b.scan("studies", "").unwrap();
        assert_eq!(a.generation(), g0 + 1);
        b.remove("studies", "x").unwrap();
        assert_eq!(a.generation(), g0 + 2);
        // A refused write (a read-only view) changes nothing.
        let r = Store {
            mirror: None,
            ..a.clone()
        };
        assert!(r.put("studies", "y", &2).is_err());
        assert_eq!(a.generation(), g0 + 2);
    }

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

    #[test]
    fn a_held_store_is_read_through_its_mirror() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            Store::open_for_reading(dir.path()),
            Err(StoreError::Missing { .. })
        ));
        assert!(
            !dir.path().join("servetune.sled").exists(),
            "a reader created a store"
        );
        let writer = Store::open(dir.path()).unwrap();
        writer.put("studies", "a/b:1", &"first").unwrap();
        writer.put("studies", "gone", &"x").unwrap();
        writer.remove("studies", "gone").unwrap();
        // sled admits one open database: a second open of the held store fails with the lock
        // error `is_held` recognises (flock conflicts between two opens in one process too).
        let held = sled::Config::new()
            .path(dir.path().join("servetune.sled"))
            .open()
            .expect_err("a second open of a held store fails");
        assert!(is_held(&held), "{held}");
        let reader = Store::open_for_reading(dir.path()).unwrap();
        assert!(reader.is_read_only());
        let got: Vec<(String, String)> = reader.scan("studies", "").unwrap();
        assert_eq!(got, vec![("a/b:1".to_string(), "first".to_string())]);
        let e = reader.put("studies", "c", &"no").unwrap_err();
        assert!(matches!(e, StoreError::ReadOnly { .. }), "{e}");
        // The writer's later records reach a later reader.
        writer.put("studies", "a/b:1", &"second").unwrap();
        let again = Store::open_for_reading(dir.path()).unwrap();
        assert_eq!(
            again.get::<String>("studies", "a/b:1").unwrap().as_deref(),
            Some("second")
        );
        // A key longer than a file name can hold in hex (a `best` key carries a model path and
        // the hardware) is mirrored too.
        let long = format!(
            "/models/{}|cpu: Intel(R) Xeon(R) (2 cores)|llamacpp@0.6.0|chat",
            "m".repeat(200)
        );
        writer.put("best", &long, &1.5).unwrap();
        let with_long = Store::open_for_reading(dir.path()).unwrap();
        assert_eq!(with_long.get::<f64>("best", &long).unwrap(), Some(1.5));
        // Once the writer is gone, a reader opens the store itself; the next writer rebuilds
        // the mirror whole (a record the mirror missed or kept is put right).
        drop((writer, reader, again, with_long));
        std::fs::write(
            dir.path()
                .join("mirror")
                .join("studies")
                .join(key_file(b"stale")),
            mirror_bytes(b"stale", br#""old""#),
        )
        .unwrap();
        let writer = Store::open(dir.path()).unwrap();
        let sled_held = Store::open_for_reading(dir.path()).unwrap();
        assert!(sled_held.is_read_only());
        assert_eq!(sled_held.get::<String>("studies", "stale").unwrap(), None);
        assert_eq!(sled_held.get::<f64>("best", &long).unwrap(), Some(1.5));
        drop((writer, sled_held));
        let free = Store::open_for_reading(dir.path()).unwrap();
        assert!(!free.is_read_only());
        assert_eq!(free.scan::<String>("studies", "").unwrap().len(), 1);
    }
}
