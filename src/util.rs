//! Small helpers shared by several modules: time stamps (chrono), cache paths, how long an
//! HTTP client keeps an idle connection to an engine.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYYMMDD-HHMMSS` in UTC (vLLM uses local time; servers run in UTC).
pub fn timestamp_compact(t: SystemTime) -> String {
    utc(t).format("%Y%m%d-%H%M%S").to_string()
}

/// RFC 3339 in UTC, to the second.
pub fn timestamp_rfc3339(t: SystemTime) -> String {
    utc(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A time as a UTC date-time, whole seconds; before 1970 reads as the epoch.
fn utc(t: SystemTime) -> chrono::DateTime<chrono::Utc> {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default()
}

/// At most `max` bytes of `s`, cut at a character boundary, with an ellipsis when cut.
pub fn excerpt(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Writes `text` to stderr as it is; a stderr that cannot be written to (a pipe whose reader
/// is gone) is ignored, where `eprint!` would panic.
pub fn to_stderr(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// A line on stderr, as [`to_stderr`].
pub fn say(line: &str) {
    to_stderr(&format!("{line}\n"));
}

/// CPU seconds (user + system) this process has used so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Where heavy artefacts (engine builds, models, datasets) are cached, outside any repository:
/// `$SERVETUNE_CACHE`, else `$XDG_CACHE_HOME/servetune`, else `~/.cache/servetune`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("SERVETUNE_CACHE").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join("servetune");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".cache").join("servetune")
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How long an HTTP client to an engine keeps an idle pooled connection: under the 5 s after
/// which the engines' servers close one (uvicorn's keep-alive timeout in vLLM and SGLang,
/// cpp-httplib's in llama-server). A client that reuses a connection the server has just
/// closed fails the request with "error sending request"; with a shorter idle time it opens a
/// new one instead (`tests/llama_server.rs`,
/// `the_tokenizer_survives_a_connection_the_server_closed_while_idle`).
pub const ENGINE_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn excerpt_cuts_at_a_character_boundary() {
        let s = "é".repeat(150); // 300 bytes, 2 per character
        let e = excerpt(&s, 201);
        assert!(e.ends_with('…'));
        assert_eq!(e.trim_end_matches('…').len(), 200);
        assert_eq!(excerpt("short", 10), "short");
    }

    #[test]
    fn formats_known_instants() {
        let t = UNIX_EPOCH + Duration::from_secs(1_798_200_000); // 2026-12-25T12:00:00Z
        assert_eq!(timestamp_compact(t), "20261225-120000");
        assert_eq!(timestamp_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(timestamp_rfc3339(leap), "2000-02-29T00:00:00Z");
    }
}
