//! The host's free memory, and waiting for an engine's memory to come back after it stops. On
//! a CPU node the engine's KV cache lives in host memory (vLLM's CPU build asks for most of
//! it), and the kernel frees a large address space some time after the process is signalled:
//! the next engine, started at once, can find its memory still held and fail for it (seen on
//! the real vLLM CPU build, 2026-12-05: "Available memory on node 0 (20.29/23.54 GiB) … is
//! less than requested"). So a teardown waits until `MemAvailable` is back near where it was
//! before the launch. Other processes may have taken memory meanwhile, so not getting it back
//! is said, not an error. Linux only (`/proc/meminfo`); elsewhere nothing is read or waited.

use std::time::{Duration, Instant};

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    parse_field(meminfo, "MemAvailable")
}

/// The field `name` (`MemTotal`) of a `/proc/meminfo` text, in bytes.
fn parse_field(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find(|l| l.split(':').next() == Some(name))?;
    let mut f = line.split_whitespace().skip(1);
    let n: u64 = f.next()?.parse().ok()?;
    match f.next() {
        Some("kB") | None => n.checked_mul(1024),
        Some(_) => None,
    }
}

/// The host's available memory now, in bytes (None where `/proc/meminfo` cannot be read).
pub fn mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The host's memory in all (`MemTotal`), in bytes (None where `/proc/meminfo` cannot be read).
pub fn mem_total() -> Option<u64> {
    parse_field(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal")
}

/// How much of the memory available before a launch may still be missing when it counts as
/// given back: 512 MiB or 2% of it, whichever is larger (page cache and other tenants move).
pub fn release_slack(before: u64) -> u64 {
    (before / 50).max(512 << 20)
}

/// Waits until `read` says at least `before - release_slack(before)` bytes are available, up
/// to `timeout`, polling every `every`. The bytes still missing when it gave up (None: back).
pub fn wait_released(
    before: u64,
    timeout: Duration,
    every: Duration,
    mut read: impl FnMut() -> Option<u64>,
) -> Option<u64> {
    let want = before.saturating_sub(release_slack(before));
    let start = Instant::now();
    loop {
        let now = read()?;
        if now >= want {
            return None;
        }
        if start.elapsed() >= timeout {
            return Some(want - now);
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_field(text, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(parse_field(text, "Mem"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 5 MB\n"), None);
    }

    #[test]
    fn the_wait_ends_when_the_memory_is_back_and_says_what_is_missing_when_it_is_not() {
        let gib = 1u64 << 30;
        // Freed over three polls: back on the third.
        let mut seen = vec![20 * gib, 10 * gib, 4 * gib];
        let mut polls = 0;
        let missing = wait_released(20 * gib, Duration::from_secs(5), Duration::ZERO, || {
            polls += 1;
            seen.pop()
        });
        assert_eq!((missing, polls), (None, 3));
        // Within the slack (2% of 20 GiB) counts as back.
        let slack_ok = wait_released(20 * gib, Duration::ZERO, Duration::ZERO, || {
            Some(20 * gib - 300 * (1 << 20))
        });
        assert_eq!(slack_ok, None);
        // Never back: the shortfall beyond the slack is said once the time is up.
        let missing = wait_released(20 * gib, Duration::ZERO, Duration::ZERO, || Some(15 * gib));
        assert_eq!(missing, Some(20 * gib - release_slack(20 * gib) - 15 * gib));
        // Nothing to read: nothing to wait for.
        assert_eq!(
            wait_released(20 * gib, Duration::from_secs(5), Duration::ZERO, || None),
            None
        );
    }
}
