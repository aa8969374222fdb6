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
        Notifier::from_vars(|k| std::env::var(k).ok())
    }

    /// From variables looked up by `var` (the environment, or a test's map).
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Notifier {
        let socket = var("NOTIFY_SOCKET")
            .filter(|s| !s.is_empty())
            .and_then(|path| UnixDatagram::unbound().ok().map(|s| (s, path)));
        // A watchdog meant for another process (systemd sets the main PID) is not ours.
        let pid_ok = var("WATCHDOG_PID")
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let watchdog = var("WATCHDOG_USEC")
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

    fn vars(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    fn recv(server: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..len]).into_owned()
    }

    /// `NOTIFY_SOCKET` as a path and as an abstract name (`@…`), as systemd sets it: the
    /// datagrams arrive, a status is one line.
    #[test]
    fn notify_socket_from_the_environment_receives_the_states() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::from_vars(vars(&[("NOTIFY_SOCKET", path.display().to_string())]));
        n.ready("idle\nnext");
        assert_eq!(recv(&server), "READY=1\nSTATUS=idle next");
        n.ping();
        assert_eq!(recv(&server), "WATCHDOG=1");
        n.stopping();
        assert!(recv(&server).starts_with("STOPPING=1\n"));

        use std::os::linux::net::SocketAddrExt;
        let name = format!("servetune-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_server = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::from_vars(vars(&[("NOTIFY_SOCKET", format!("@{name}"))]));
        n.status("busy");
        assert_eq!(recv(&abstract_server), "STATUS=busy");
    }

    /// The watchdog period is `WATCHDOG_USEC`, only when `WATCHDOG_PID` is absent or ours, and
    /// never for zero or garbage.
    #[test]
    fn the_watchdog_is_ours_only_for_our_pid() {
        let me = std::process::id().to_string();
        let usec = |u: &str, pid: Option<&str>| {
            let mut v = vec![("WATCHDOG_USEC", u.to_string())];
            if let Some(p) = pid {
                v.push(("WATCHDOG_PID", p.to_string()));
            }
            Notifier::from_vars(vars(&v)).watchdog()
        };
        assert_eq!(usec("3000000", None), Some(Duration::from_secs(3)));
        assert_eq!(usec("3000000", Some(&me)), Some(Duration::from_secs(3)));
        assert_eq!(usec("3000000", Some("1")), None);
        assert_eq!(usec("0", None), None);
        assert_eq!(usec("soon", None), None);
    }

    /// Outside systemd (no variables) every call is a no-op and there is no watchdog.
    #[test]
    fn without_systemd_nothing_is_sent() {
        let n = Notifier::from_vars(vars(&[]));
        assert!(n.socket.is_none());
        n.ready("x");
        assert!(n.watchdog().is_none());
    }
}
