//! Foreign CPU load: how much of the host's CPU time during a benchmark run went to processes
//! that are neither servetune nor the engine under test (a compiler, a cron job, another
//! tenant's steal time). On a shared machine such load slows one run and not the next, or
//! slows a whole study and moves its optimum (fewer threads win on a half-busy machine); the
//! study sets disturbed runs aside and says so. Linux only (`/proc`); elsewhere it reads
//! nothing and every run counts as undisturbed.
//!
//! Busy time is `user + nice + system + steal` of `/proc/stat`'s `cpu` line: interrupt time
//! is left out because the kernel charges the loopback traffic of the run itself there.
//! Ours is `utime + stime + cutime + cstime` of `/proc/self` and of every process in the
//! engine's process group or the group of any process servetune started (`/proc/<pid>/stat`,
//! fields 4 and 5: a parallel study's other engines, from their first tick; a stopped one's
//! time moves into our `cutime` when it is reaped); all counters are in clock ticks.

use std::time::Instant;

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    at: Instant,
    /// Busy ticks of the whole host.
    busy: u64,
    /// Ticks of servetune and the engine's process group.
    ours: u64,
}

/// The busy ticks of the aggregate `cpu` line of `/proc/stat`.
pub fn parse_host_busy(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    // user nice system idle iowait irq softirq steal guest guest_nice
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    (f.len() >= 4).then(|| at(0) + at(1) + at(2) + at(7))
}

/// `(process group, ticks used by the process and its reaped children)` from a
/// `/proc/<pid>/stat` line. The command name may hold spaces and parentheses: the fields
/// start after the last `)`.
pub fn parse_proc_stat(stat: &str) -> Option<(i32, u64)> {
    parse_proc_line(stat).map(|p| (p.pgrp, p.ticks))
}

/// What a `/proc/<pid>/stat` line says about CPU time: the parent, the process group and
/// the ticks used by the process and its reaped children.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ProcTicks {
    ppid: i32,
    pgrp: i32,
    ticks: u64,
}

fn parse_proc_line(stat: &str) -> Option<ProcTicks> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) pgrp(2) … utime(11) stime(12) cutime(13) cstime(14).
    let ppid = f.get(1)?.parse().ok()?;
    let pgrp = f.get(2)?.parse().ok()?;
    let mut ticks = 0u64;
    for i in 11..=14 {
        // cutime/cstime are signed in the kernel's format; negative never happens in practice.
        ticks += f.get(i)?.parse::<i64>().ok()?.max(0) as u64;
    }
    Some(ProcTicks { ppid, pgrp, ticks })
}

/// The ticks of servetune's own process groups: `groups` and the group of every process
/// servetune started (its children: each engine leads its own group), summed over their
/// processes; a child in servetune's own group counts alone (`own_group` may hold the shell
/// that started servetune). An engine that starts during a span counts from its first tick (not once it is
/// ready), and one that is stopped and reaped during it moves its time into servetune's own
/// `cutime`/`cstime`: so neither a parallel study's other slots nor their start-up and stop
/// read as foreign load.
fn ours_in(procs: &[(i32, ProcTicks)], me: i32, own_group: i32, groups: &[i32]) -> u64 {
    // A child that stayed in servetune's own group counts alone: that group may hold the
    // shell or the service manager that started servetune, which are not ours.
    let mut ours: Vec<i32> = groups.iter().copied().filter(|g| *g != own_group).collect();
    ours.extend(
        procs
            .iter()
            .filter(|(_, p)| p.ppid == me && p.pgrp != own_group)
            .map(|(_, p)| p.pgrp),
    );
    procs
        .iter()
        .filter(|(pid, p)| {
            *pid != me && (ours.contains(&p.pgrp) || (p.ppid == me && p.pgrp == own_group))
        })
        .map(|(_, p)| p.ticks)
        .sum()
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The counters now; `groups` are the engine's process groups (servetune's children's groups
/// count besides, see `ours_in`). `None` where `/proc` cannot be read.
pub fn snapshot(groups: &[i32]) -> Option<Snapshot> {
    let at = Instant::now();
    let busy = parse_host_busy(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let own = parse_proc_line(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let me = std::process::id() as i32;
    let mut procs: Vec<(i32, ProcTicks)> = Vec::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // A process may exit between the listing and the read: skip it.
        let Ok(text) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some(p) = parse_proc_line(&text) {
            procs.push((pid, p));
        }
    }
    Some(Snapshot {
        at,
        busy,
        ours: own.ticks + ours_in(&procs, me, own.pgrp, groups),
    })
}

/// The mean number of cores foreign processes kept busy between two snapshots (never
/// negative). A process of the engine's group that exited and was reaped outside servetune
/// (an engine's worker reaped by init) takes its time with it: that time then reads as
/// foreign (an overstatement, never an understatement, of the disturbance).
pub fn foreign_cores(a: &Snapshot, b: &Snapshot) -> f64 {
    let secs = b.at.duration_since(a.at).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    let busy = b.busy.saturating_sub(a.busy) as f64;
    let ours = b.ours.saturating_sub(a.ours) as f64;
    ((busy - ours) / ticks_per_s() / secs).max(0.0)
}

/// Measures the foreign load over a span: `start()` before, `finish()` after.
#[derive(Debug, Clone)]
pub struct LoadSpan {
    groups: Vec<i32>,
    first: Option<Snapshot>,
}

impl LoadSpan {
    pub fn start(groups: Vec<i32>) -> LoadSpan {
        let first = snapshot(&groups);
        LoadSpan { groups, first }
    }

    /// The mean foreign cores since `start()`; `None` where `/proc` could not be read.
    pub fn finish(&self) -> Option<f64> {
        let a = self.first?;
        let b = snapshot(&self.groups)?;
        Some(foreign_cores(&a, &b))
    }
}

/// Waits until a window of `window` reads at most `max_cores` foreign cores, or `limit`
/// has passed; the last window's reading (`None` without `/proc`).
pub async fn wait_quiet(
    groups: &[i32],
    max_cores: f64,
    window: std::time::Duration,
    limit: std::time::Duration,
) -> Option<f64> {
    let start = Instant::now();
    loop {
        let p = LoadSpan::start(groups.to_vec());
        tokio::time::sleep(window).await;
        let f = p.finish()?;
        if f <= max_cores || start.elapsed() >= limit {
            return Some(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn host_busy_counts_user_nice_system_and_steal_only() {
        let stat = "cpu  100 20 30 5000 40 7 9 11 0 0\ncpu0 50 10 15 2500 20 3 4 5 0 0\nintr 1 2\n";
        assert_eq!(parse_host_busy(stat), Some(100 + 20 + 30 + 11));
        // Old kernels without steal.
        assert_eq!(parse_host_busy("cpu  1 2 3 4\n"), Some(6));
        assert_eq!(parse_host_busy("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_host_busy("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn ours_counts_the_given_groups_and_every_child_s_group_but_not_others_or_self() {
        let p = |ppid, pgrp, ticks| ProcTicks { ppid, pgrp, ticks };
        let me = 100;
        let procs = vec![
            (me, p(1, me, 1000)),  // servetune itself: counted from /proc/self
            (200, p(me, 200, 10)), // an engine we started (its own group)
            (201, p(200, 200, 5)), // its worker, same group
            (300, p(me, 300, 7)),  // another slot's engine, not in `groups`
            (400, p(1, 400, 50)),  // a foreign process
            (500, p(1, 500, 3)),   // a group named explicitly
        ];
        assert_eq!(ours_in(&procs, me, 90, &[500]), 10 + 5 + 7 + 3);
        assert_eq!(ours_in(&procs, me, 90, &[]), 10 + 5 + 7);
        // A child left in servetune's own group (90) counts alone, not the group: the shell
        // that started servetune is in it too.
        let mut procs = procs;
        procs.push((600, p(me, 90, 4)));
        procs.push((80, p(1, 90, 1000)));
        assert_eq!(ours_in(&procs, me, 90, &[]), 10 + 5 + 7 + 4);
        assert_eq!(ours_in(&procs, me, 90, &[90]), 10 + 5 + 7 + 4);
    }

    #[test]
    fn proc_stat_survives_names_with_spaces_and_parentheses() {
        let line = "4242 (llama (server) 1) S 1 4240 4240 0 -1 4194560 100 0 0 0 \
                    250 50 7 3 20 0 8 0 12345 1000 100";
        assert_eq!(parse_proc_stat(line), Some((4240, 250 + 50 + 7 + 3)));
        assert_eq!(parse_proc_stat("no parenthesis"), None);
        assert_eq!(parse_proc_stat("1 (x) S 1"), None);
    }

    #[test]
    fn foreign_cores_subtracts_ours_and_never_goes_negative() {
        let t0 = Instant::now();
        let tps = ticks_per_s();
        let a = Snapshot {
            at: t0,
            busy: 0,
            ours: 0,
        };
        // 2 s: the host was busy 3 core-seconds, 1 of them ours → 1 foreign core.
        let b = Snapshot {
            at: t0 + Duration::from_secs(2),
            busy: (3.0 * tps) as u64,
            ours: tps as u64,
        };
        assert!((foreign_cores(&a, &b) - 1.0).abs() < 1e-9);
        let c = Snapshot {
            at: t0 + Duration::from_secs(2),
            busy: 0,
            ours: tps as u64,
        };
        assert_eq!(foreign_cores(&a, &c), 0.0);
        assert_eq!(foreign_cores(&b, &b), 0.0);
    }

    /// CPU ticks a process has used so far.
    fn ticks_of(pid: u32) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        parse_proc_stat(&text).unwrap().1
    }

    /// A busy loop that is no descendant of ours (`setsid` in a shell that exits: init adopts
    /// it), and the cores it used over `span` (its own counters), with the two probes read
    /// over the same span: `(cores, outside, inside)`; `inside` names the loop's group. Under
    /// contention (the other tests of this binary) the loop gets less than a core; the probes
    /// must account for what it did get.
    fn busy_outsider(span: Duration) -> (f64, f64, f64) {
        /// Kills the loop however the test ends (it would spin on, adopted by init).
        struct Killed(u32);
        impl Drop for Killed {
            fn drop(&mut self) {
                // SAFETY: kill has no memory preconditions; the pid is the loop's.
                unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
            }
        }
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                "setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $!",
            ])
            .output()
            .unwrap();
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let guard = Killed(pid);
        let pid = guard.0;
        std::thread::sleep(Duration::from_millis(100));
        let t0 = ticks_of(pid);
        let outside = LoadSpan::start(Vec::new());
        let inside = LoadSpan::start(vec![pid as i32]);
        let at = Instant::now();
        std::thread::sleep(span);
        let (fo, fi) = (outside.finish().unwrap(), inside.finish().unwrap());
        let used = (ticks_of(pid) - t0) as f64 / ticks_per_s() / at.elapsed().as_secs_f64();
        drop(guard);
        (used, fo, fi)
    }

    /// A busy process that is not ours reads as foreign load unless its group is named; one
    /// servetune started (an engine of another slot) is ours without being named. Reads the
    /// real /proc.
    #[test]
    fn a_busy_outsider_is_foreign_and_a_named_group_or_a_child_is_ours() {
        if std::fs::read_to_string("/proc/stat").is_err() {
            return;
        }
        let (used, fo, fi) = busy_outsider(Duration::from_millis(1500));
        assert!(used > 0.02, "the busy loop got {used:.2} cores");
        // Not named: at least what the loop used is foreign (other processes may add more).
        // Named: the difference between the two readings is the loop's own use. A clock tick
        // per counter of slack (1/100 s over 1.5 s) and 20% for the snapshots' skew.
        assert!(
            fo >= 0.8 * used - 0.03,
            "the loop used {used:.2} cores; not named, {fo:.2} read as foreign"
        );
        assert!(
            ((fo - fi) - used).abs() <= 0.2 * used + 0.05,
            "the loop used {used:.2} cores; naming its group removed {:.2}",
            fo - fi
        );
        // Our child in its own group, unnamed: its ticks are in our count (servetune's own
        // ticks, which the other tests' threads move, taken out), whatever else runs on the
        // machine. A few ticks of slack between the reads.
        let mut child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let own = || {
            parse_proc_line(&std::fs::read_to_string("/proc/self/stat").unwrap())
                .unwrap()
                .ticks
        };
        std::thread::sleep(Duration::from_millis(100));
        let (a, sa, ta) = (snapshot(&[]).unwrap(), own(), ticks_of(child.id()));
        std::thread::sleep(Duration::from_millis(1000));
        let (b, sb, tb) = (snapshot(&[]).unwrap(), own(), ticks_of(child.id()));
        let _ = child.kill();
        let _ = child.wait();
        let counted = (b.ours as i64 - sb as i64) - (a.ours as i64 - sa as i64);
        let used = (tb - ta) as i64;
        assert!(used > 5, "the busy child got {used} ticks");
        assert!(
            (counted - used).abs() <= 4,
            "our child used {used} ticks; {counted} counted as ours"
        );
    }
}
