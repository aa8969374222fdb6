//! Finding and killing engines left behind by a servetune that died (SIGKILL, power loss):
//! every engine is recorded in the store before it is spawned, with a tag that is also in its
//! environment (`SERVETUNE_ENGINE_TAG`, inherited by its worker processes). On start-up the
//! recorded engines are looked up by that tag in `/proc`, so a process group whose id was
//! recycled by an unrelated program is never signalled.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::store::{Store, StoreError};

use super::process::terminate_group;

/// The environment variable that marks an engine's processes.
pub const TAG_ENV: &str = "SERVETUNE_ENGINE_TAG";

/// Process groups with a process whose environment carries `TAG_ENV=tag`.
pub fn groups_with_tag(tag: &str) -> BTreeSet<i32> {
    let needle = format!("{TAG_ENV}={tag}");
    let mut groups = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return groups;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            // SAFETY: plain syscall on a pid; -1 if it is gone.
            let pgid = unsafe { libc::getpgid(pid) };
            if pgid > 1 {
                groups.insert(pgid);
            }
        }
    }
    groups
}

/// What the reaper did about one recorded engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Reaped {
    pub tag: String,
    /// Process groups that were still alive and were killed.
    pub killed: Vec<i32>,
}

/// Kills every recorded engine that is still running and forgets the records. Engines owned
/// by a live process other than this one (a servetune still running) are left alone.
pub fn reap(store: &Store) -> Result<Vec<Reaped>, StoreError> {
    let me = std::process::id();
    let mut out = Vec::new();
    for rec in store.engines()? {
        if rec.owner_pid != me && owner_alive(rec.owner_pid) && !is_zombie(rec.owner_pid) {
            continue;
        }
        let mut killed = Vec::new();
        for pgid in groups_with_tag(&rec.tag) {
            if pgid == own_pgid() {
                continue;
            }
            match terminate_group(pgid, None, Duration::from_secs(10)) {
                Ok(()) => killed.push(pgid),
                Err(e) => tracing::warn!("engine {}: {e}", rec.tag),
            }
        }
        if !killed.is_empty() {
            tracing::warn!(
                "killed engine {} left behind by servetune pid {} (process groups {killed:?})",
                rec.tag,
                rec.owner_pid
            );
        }
        store.engine_gone(&rec.tag)?;
        out.push(Reaped {
            tag: rec.tag,
            killed,
        });
    }
    Ok(out)
}

fn own_pgid() -> i32 {
    // SAFETY: plain syscall.
    unsafe { libc::getpgid(0) }
}

fn owner_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    pid > 0 && unsafe { libc::kill(pid as i32, 0) == 0 }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
