//! An engine process: spawned from an argv vector (never a shell) in its own process group,
//! output captured to a log file, and torn down as a group: SIGTERM, a grace period, SIGKILL,
//! then a check that no process of the group is left. Dropping an [`EngineProcess`] tears it
//! down too, so a panic or an early return never leaves an engine running. A trial's
//! [`Placement`] confines the engine at spawn: its devices through the environment, its cores
//! through `sched_setaffinity` in the child before `exec`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::slots::Placement;

#[derive(Debug, Error)]
pub enum ProcessError {
    #[error("cannot start {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the engine log {path}")]
    Log {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} exited during start-up ({status}); last log lines:\n{excerpt}")]
    Exited {
        program: String,
        status: String,
        excerpt: String,
    },
    #[error("{url} did not answer 200 within {secs:.0} s; last log lines:\n{excerpt}")]
    NotReady {
        url: String,
        secs: f64,
        excerpt: String,
    },
    #[error("process group {pgid} still has processes after SIGKILL")]
    Leftover { pgid: i32 },
}

/// A running engine.
#[derive(Debug)]
pub struct EngineProcess {
    child: Option<Child>,
    pgid: i32,
    program: String,
    log: PathBuf,
}

/// A free TCP port on the loopback interface (the OS picks it).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Whether any process of group `pgid` is alive.
pub fn group_alive(pgid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Whether group `pgid` has a process that is not a zombie. A zombie holds no memory and no
/// port; it stays until its parent reaps it, which for an engine whose servetune died is init.
pub fn group_running(pgid: i32) -> bool {
    if !group_alive(pgid) {
        return false;
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) S ppid pgrp ...": the fields after the last ')'.
        let Some(rest) = stat.rsplit(')').next() else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 2 && f[2].parse::<i32>().ok() == Some(pgid) && f[0] != "Z" {
            return true;
        }
    }
    false
}

/// Sends `sig` to every process of group `pgid`.
pub fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: plain syscall; a dead group gives ESRCH, which is fine.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// SIGTERM to the group, up to `grace` for it to exit, SIGKILL, and a final check. `leader`
/// is our own child when we have it: it is reaped so that its zombie does not count as alive
/// (only our own child is reaped; other children of this process are left alone).
pub fn terminate_group(
    pgid: i32,
    mut leader: Option<&mut Child>,
    grace: Duration,
) -> Result<(), ProcessError> {
    if pgid <= 1 {
        return Ok(()); // never signal group 0/1 (ourselves / init)
    }
    let gone = |leader: &mut Option<&mut Child>| {
        if let Some(c) = leader.as_mut() {
            let _ = c.try_wait();
        }
        !group_running(pgid)
    };
    // Once nothing runs, give the parents of the zombies (init, for grandchildren) a moment to
    // reap them; a zombie holds no memory or port, so waiting is a courtesy, not a condition.
    let settle = || {
        let until = Instant::now() + Duration::from_secs(1);
        while group_alive(pgid) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    signal_group(pgid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if gone(&mut leader) {
            settle();
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    signal_group(pgid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if gone(&mut leader) {
            settle();
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(ProcessError::Leftover { pgid })
}

/// A CPU set holding `cores`; a core beyond the set's capacity is an error naming it.
fn cpu_set(cores: &[usize]) -> std::io::Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "core {c} is beyond the {} a CPU set holds",
                    libc::CPU_SETSIZE
                ),
            ));
        }
        // SAFETY: c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    Ok(set)
}

/// The last `n` lines of a log file.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl EngineProcess {
    /// Spawns `argv` in a new process group with stdout and stderr appended to `log`.
    pub fn spawn(
        argv: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self, ProcessError> {
        Self::spawn_placed(argv, env, log, None)
    }

    /// As `spawn`, confined to `placement`: its environment (`CUDA_VISIBLE_DEVICES`) over
    /// `env`, and, when it names cores, the child's CPU affinity set to them before `exec`
    /// (inherited by every process the engine starts). The CPU set is built here, before the
    /// fork; the child only makes the one async-signal-safe `sched_setaffinity` call.
    pub fn spawn_placed(
        argv: &[String],
        env: &[(String, String)],
        log: &Path,
        placement: Option<&Placement>,
    ) -> Result<Self, ProcessError> {
        let Some(program) = argv.first().cloned() else {
            return Err(ProcessError::Spawn {
                program: String::new(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"),
            });
        };
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| ProcessError::Log {
                path: log.display().to_string(),
                source,
            })?;
        let errf = logf.try_clone().map_err(|source| ProcessError::Log {
            path: log.display().to_string(),
            source,
        })?;
        let mut cmd = Command::new(&program);
        cmd.args(&argv[1..])
            // systemd's notification socket is the daemon's, not the engine's.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(logf)
            .stderr(errf)
            .process_group(0);
        if let Some(p) = placement {
            cmd.envs(p.env());
            if !p.cores.is_empty() {
                let set = cpu_set(&p.cores).map_err(|source| ProcessError::Spawn {
                    program: program.clone(),
                    source,
                })?;
                // SAFETY: the closure runs in the child between fork and exec; it only calls
                // sched_setaffinity (async-signal-safe) on a set built before the fork, and
                // reads errno without allocating.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
                            != 0
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
        }
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            program: program.clone(),
            source,
        })?;
        let pgid = child.id() as i32;
        Ok(EngineProcess {
            child: Some(child),
            pgid,
            program,
            log: log.to_path_buf(),
        })
    }

    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` if the leader has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Polls `url` until it answers 200, the process exits, or `timeout` passes.
    pub async fn wait_http_ok(&mut self, url: &str, timeout: Duration) -> Result<(), ProcessError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("a client without TLS always builds");
        let start = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return Err(ProcessError::Exited {
                    program: self.program.clone(),
                    status: status.to_string(),
                    excerpt: log_tail(&self.log, 20),
                });
            }
            if let Ok(r) = client.get(url).send().await {
                if r.status() == reqwest::StatusCode::OK {
                    return Ok(());
                }
            }
            if start.elapsed() > timeout {
                return Err(ProcessError::NotReady {
                    url: url.to_owned(),
                    secs: timeout.as_secs_f64(),
                    excerpt: log_tail(&self.log, 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Tears the whole group down and verifies that nothing is left.
    pub fn terminate(mut self, grace: Duration) -> Result<(), ProcessError> {
        self.shutdown(grace)
    }

    /// `terminate` for a process that stays owned (a second call is a no-op).
    pub fn shutdown(&mut self, grace: Duration) -> Result<(), ProcessError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // Leader reaped and group empty: nothing to signal (and the group id may be reused).
        if matches!(child.try_wait(), Ok(Some(_))) && !group_alive(self.pgid) {
            return Ok(());
        }
        let r = terminate_group(self.pgid, Some(&mut child), grace);
        if r.is_ok() {
            // The leader may be a zombie still: reap it (it has exited, so this returns at once).
            let _ = child.wait();
        }
        r
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(Duration::from_secs(10)) {
            tracing::error!("engine teardown: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn group_is_gone_after_terminate_even_when_sigterm_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("e.log");
        // A leader that ignores SIGTERM and a child in the same group.
        let argv: Vec<String> = ["sh", "-c", "trap '' TERM; sleep 60 & echo started; wait"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let p = EngineProcess::spawn(&argv, &[], &log).unwrap();
        let pgid = p.pgid();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(group_alive(pgid));
        p.terminate(Duration::from_millis(300)).unwrap();
        assert!(!group_running(pgid), "a process of the group still runs");
        assert!(log_tail(&log, 5).contains("started"));
    }

    /// A placement pins the engine: `cat /proc/self/status` (no shell) runs on the one core
    /// it was given, and the devices are in its environment (`/proc/<pid>/environ` of a
    /// sleeping engine).
    #[tokio::test]
    async fn a_placement_sets_the_cores_and_the_visible_devices() {
        let dir = tempfile::tempdir().unwrap();
        let core = *crate::engine::slots::affinity().unwrap().last().unwrap();
        let placement = Placement {
            gpus: vec![2, 3],
            cores: vec![core],
        };
        let log = dir.path().join("status.log");
        let argv = vec!["cat".to_string(), "/proc/self/status".to_string()];
        let mut p = EngineProcess::spawn_placed(&argv, &[], &log, Some(&placement)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.exited().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let status = std::fs::read_to_string(&log).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_else(|| panic!("no Cpus_allowed_list in {status}"));
        assert_eq!(allowed.trim(), core.to_string());

        let env = [("CUDA_VISIBLE_DEVICES".to_string(), "0".to_string())];
        let argv = vec!["sleep".to_string(), "30".to_string()];
        let log = dir.path().join("sleep.log");
        let p = EngineProcess::spawn_placed(&argv, &env, &log, Some(&placement)).unwrap();
        let environ = std::fs::read(format!("/proc/{}/environ", p.pgid())).unwrap();
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        assert!(
            vars.contains(&"CUDA_VISIBLE_DEVICES=2,3".to_string()),
            "{vars:?}"
        );
        assert!(
            !vars.contains(&"CUDA_VISIBLE_DEVICES=0".to_string()),
            "the placement wins"
        );
        assert!(vars.contains(&"CUDA_DEVICE_ORDER=PCI_BUS_ID".to_string()));
        p.terminate(Duration::from_secs(5)).unwrap();

        let far = Placement {
            gpus: vec![],
            cores: vec![1 << 20],
        };
        let e = EngineProcess::spawn_placed(&argv, &[], &log, Some(&far)).unwrap_err();
        assert!(format!("{e:?}").contains("core 1048576"), "{e:?}");
    }

    #[tokio::test]
    async fn start_up_exit_is_reported_with_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("e.log");
        let argv: Vec<String> = [
            "sh",
            "-c",
            "echo 'error: unknown argument --bogus' >&2; exit 3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut p = EngineProcess::spawn(&argv, &[], &log).unwrap();
        let e = p
            .wait_http_ok("http://127.0.0.1:9/health", Duration::from_secs(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown argument --bogus"), "{e}");
        let missing = EngineProcess::spawn(&["/nonexistent/engine".to_string()], &[], &log);
        assert!(missing
            .unwrap_err()
            .to_string()
            .contains("/nonexistent/engine"));
    }
}
