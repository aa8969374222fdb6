//! The smoke test of a built llama-server: started once on SmolLM2, it must answer `/health`
//! and one short completion; a build killed by a fault signal cannot run on this CPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::LlamaPaths;

/// Where the smoke test of a build `variant` (native, portable, cached) writes llama-server's
/// output: one file per variant, so that the portable build's check keeps the native one's
/// crash for the record.
pub(super) fn smoke_log(paths: &LlamaPaths, variant: &str) -> PathBuf {
    paths
        .root
        .join("llamacpp")
        .join(format!("smoke-{variant}.log"))
}

/// How a smoke test failed.
#[derive(Debug)]
pub(super) struct SmokeFailure {
    /// The server was killed by a fault signal (SIGILL, SIGSEGV, SIGBUS, SIGFPE): the build
    /// cannot run on this CPU. Otherwise it exited with an error, did not answer in time or answered wrong, which
    /// a busy machine or a taken port can cause.
    pub(super) crashed: bool,
    pub(super) why: String,
}

/// A failure of a server that was not killed by a fault signal (or of the test around it).
fn alive(why: String) -> SmokeFailure {
    SmokeFailure {
        crashed: false,
        why,
    }
}

/// The started server, killed and waited for when dropped, whatever happens.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the built llama-server serves here: started on SmolLM2 (which computes a warm-up
/// batch while loading), it must answer `/health` and one four-token completion within a
/// minute. The server is killed and waited for whatever happens, and dies with setup if setup
/// is killed (`PR_SET_PDEATHSIG`).
pub(super) fn smoke_test(paths: &LlamaPaths, variant: &str) -> Result<(), SmokeFailure> {
    use std::time::{Duration, Instant};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| alive(format!("no free port: {e}")))?
        .port();
    let log = smoke_log(paths, variant);
    let mut child = start_server(paths, port, &log)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let exited = |c: &mut Reaped| -> Option<SmokeFailure> {
        c.0.try_wait()
            .ok()
            .flatten()
            .map(|st| exit_failure(st, &log))
    };
    loop {
        if let Some(f) = exited(&mut child) {
            return Err(f);
        }
        if http(port, "GET", "/health", "").is_some_and(|s| s == 200) {
            break;
        }
        if Instant::now() > deadline {
            return Err(alive(format!(
                "no healthy answer within 60 s (see {})",
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let status = http(
        port,
        "POST",
        "/completion",
        r#"{"prompt": "Hello", "n_predict": 4}"#,
    );
    if status != Some(200) {
        // A server that crashed while answering may not be reaped yet: give it a moment, so
        // that the failure names the signal rather than a missing answer.
        for _ in 0..20 {
            if let Some(f) = exited(&mut child) {
                return Err(f);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        return Err(alive(format!(
            "a four-token completion answered {status:?} (see {})",
            log.display()
        )));
    }
    match exited(&mut child) {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// Starts llama-server on SmolLM2 at 127.0.0.1:`port`, its output written to `log`; the
/// server is killed when setup dies.
fn start_server(paths: &LlamaPaths, port: u16, log: &Path) -> Result<Reaped, SmokeFailure> {
    use std::os::unix::process::CommandExt;
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| alive(format!("{}: {e}", dir.display())))?;
    }
    let out = std::fs::File::create(log).map_err(|e| alive(format!("{}: {e}", log.display())))?;
    let err = out.try_clone().map_err(|e| alive(e.to_string()))?;
    let mut cmd = Command::new(&paths.server);
    cmd.arg("-m")
        .arg(&paths.model)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "-c",
            "512",
        ])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: prctl is async-signal-safe; between fork and exec the child only asks the kernel
    // to kill it when its parent (setup) dies, so no server outlives a killed setup.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| alive(format!("cannot start {}: {e}", paths.server.display())))?;
    Ok(Reaped(child))
}

/// The failure of a server that exited with `st`: a crash when a fault signal killed it.
fn exit_failure(st: std::process::ExitStatus, log: &Path) -> SmokeFailure {
    use std::os::unix::process::ExitStatusExt;
    match st.signal() {
        // A fault of the code on this CPU. SIGKILL (the OOM killer, an operator) or
        // SIGTERM says nothing about the build.
        Some(sig) if [libc::SIGILL, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE].contains(&sig) => {
            SmokeFailure {
                crashed: true,
                why: format!("killed by signal {sig} (see {})", log.display()),
            }
        }
        Some(sig) => SmokeFailure {
            crashed: false,
            why: format!("killed by signal {sig} (see {})", log.display()),
        },
        None => SmokeFailure {
            crashed: false,
            why: format!("exited with {st} (see {})", log.display()),
        },
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; the response's status code, or `None` when
/// there was no answer.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
