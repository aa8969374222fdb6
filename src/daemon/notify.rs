//! systemd's notification protocol (`sd_notify(3)`), without libsystemd: datagrams such as
//! `READY=1`, `STATUS=…`, `WATCHDOG=1`, `STOPPING=1` sent to the socket named by
//! `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace). Outside systemd the
//! variable is unset and every call is a no-op. `$WATCHDOG_USEC` gives the watchdog period;
//! the daemon pings at half of it, and only while its worker is alive.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// A connection to systemd's notification socket, or nothing outside systemd.
#[derive(Debug, Default)]
pub struct Notifier {
    socket: Option<(UnixDatagram, String)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From the environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`).
    pub fn from_env() -> Notifier {
        let socket = std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|s| !s.is_empty())
            .and_then(|path| UnixDatagram::unbound().ok().map(|s| (s, path)));
        let pid_ok = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0 && pid_ok)
            .map(Duration::from_micros);
        Notifier { socket, watchdog }
    }

    /// The watchdog period systemd expects pings within, if it set one.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines); errors are logged, never fatal.
    pub fn send(&self, state: &str) {
        let Some((sock, path)) = &self.socket else {
            return;
        };
        let r = match path.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                    .and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr))
            }
            None => sock.send_to(state.as_bytes(), path),
        };
        if let Err(e) = r {
            tracing::warn!("sd_notify to {path}: {e}");
        }
    }

    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping: tearing the engine down");
    }

    pub fn ping(&self) {
        self.send("WATCHDOG=1");
    }
}

/// A status is one line.
fn one_line(s: &str) -> String {
    crate::util::excerpt(&s.replace(['\n', '\r'], " "), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), path.display().to_string())),
            watchdog: None,
        };
        n.ready("idle\nnext");
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=idle next");
        n.ping();
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn without_systemd_nothing_is_sent() {
        let n = Notifier::default();
        n.ready("x");
        assert!(n.watchdog().is_none());
    }
}
