//! Small helpers shared by several modules: time stamps without a date crate, cache paths.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYYMMDD-HHMMSS` in UTC (vLLM uses local time; servers run in UTC).
pub fn timestamp_compact(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

/// RFC 3339 in UTC, to the second.
pub fn timestamp_rfc3339(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

fn civil(t: SystemTime) -> (i64, u32, u32, u32, u32, u32) {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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
