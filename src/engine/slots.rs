//! Slots for parallel trials: the node's accelerators (NVML's GPUs, with the links between
//! them) or, on a node without GPUs, the cores this process may run on, divided among trials
//! that run at the same time. A [`Pool`] hands out [`Placement`]s: a trial that needs `k`
//! GPUs gets `k` free ones chosen so that the worst link among them is as good as it can be
//! (a tensor-parallel group inside one NVLink island rather than across PCIe), and an engine
//! started with a placement sees only its devices (`CUDA_VISIBLE_DEVICES`) and runs only on
//! its cores (`sched_setaffinity`, applied by `process.rs` at spawn). The pool never hands a
//! device or a core to two placements, and never has more than `max_parallel` out.
//!
//! GPUs are named by their NVML index everywhere; `Placement::env` also sets
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so that CUDA numbers the devices as NVML does (CUDA's own
//! default order is fastest first, which need not be NVML's PCI bus order).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::telemetry::{Link, Telemetry};

#[derive(Debug, Error)]
pub enum SlotError {
    #[error("GPU {gpu} is not on this node (NVML lists {})", list(.have))]
    NoSuchGpu { gpu: u32, have: Vec<u32> },
    #[error("GPU {gpu} is listed twice")]
    GpuTwice { gpu: u32 },
    #[error("cannot read the CPU affinity of this process")]
    Affinity(#[source] std::io::Error),
    #[error("the link matrix has {rows} rows for {gpus} GPUs (it must be {gpus}x{gpus})")]
    Links { gpus: usize, rows: usize },
    #[error("max_parallel_trials must be at least 1, got 0")]
    MaxParallel,
    #[error("{per_trial} cores per trial is more than the {have} cores this process may run on")]
    Cores { per_trial: usize, have: usize },
    #[error("the node has no GPU and no core to place a trial on")]
    Empty,
}

fn joined<T: std::fmt::Display>(v: &[T], sep: &str) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    joined(v, ", ")
}

/// Where one trial's engine runs: the GPUs it sees (NVML indices) and the cores it may use.
/// Either may be empty: no GPU on a CPU node; no core pinning for a GPU trial unless the pool
/// was asked for cores per trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub gpus: Vec<u32>,
    pub cores: Vec<usize>,
}

impl Placement {
    /// The environment that confines an engine to the placement's GPUs:
    /// `CUDA_VISIBLE_DEVICES=2,3` and `CUDA_DEVICE_ORDER=PCI_BUS_ID` (CUDA then numbers the
    /// devices as NVML does). Empty when the placement has no GPU.
    pub fn env(&self) -> Vec<(String, String)> {
        if self.gpus.is_empty() {
            return Vec::new();
        }
        vec![
            ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
            ("CUDA_VISIBLE_DEVICES".into(), joined(&self.gpus, ",")),
        ]
    }

    /// "gpu 2,3", "cores 0-3", "cores 0,2", "gpu 0 cores 0-7"; "unpinned" when empty.
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if !self.gpus.is_empty() {
            parts.push(format!("gpu {}", joined(&self.gpus, ",")));
        }
        if !self.cores.is_empty() {
            parts.push(format!("cores {}", cpu_list(&self.cores)));
        }
        if parts.is_empty() {
            return "unpinned".into();
        }
        parts.join(" ")
    }

    /// The threads the engine should run: one per core of the placement (0 when unpinned).
    pub fn threads(&self) -> usize {
        self.cores.len()
    }
}

/// Cores in the kernel's cpu-list form (`Cpus_allowed_list`): runs as `a-b`, `0-3,8,10-11`.
pub fn cpu_list(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", sorted[i], sorted[j])
        } else {
            sorted[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// The cores this process may run on (`sched_getaffinity`), ascending.
pub fn affinity() -> std::io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: c < CPU_SETSIZE, the set's capacity.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// What a node offers to trials: its GPUs (NVML indices), how each pair is linked (`links[i][j]`
/// for `gpus[i]` and `gpus[j]`, the diagonal `Link::NvLink`) and the cores this process may
/// run on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub gpus: Vec<u32>,
    pub links: Vec<Vec<Link>>,
    pub cores: Vec<usize>,
}

impl Node {
    /// The node as NVML and the scheduler see it. `gpus`, the study's GPU list, restricts it
    /// to those GPUs (an index the node lacks, or one listed twice, is an error naming it).
    /// Without telemetry (a CPU node) there are no GPUs, and a GPU list is an error.
    pub fn detect(telemetry: &Telemetry, gpus: Option<&[u32]>) -> Result<Node, SlotError> {
        let all = telemetry.gpu_indices();
        let matrix = telemetry.links();
        let keep: Vec<usize> = match gpus {
            None => (0..all.len()).collect(),
            Some(wanted) => {
                let mut keep = Vec::new();
                for (n, g) in wanted.iter().enumerate() {
                    if wanted[..n].contains(g) {
                        return Err(SlotError::GpuTwice { gpu: *g });
                    }
                    let at = all
                        .iter()
                        .position(|a| a == g)
                        .ok_or(SlotError::NoSuchGpu {
                            gpu: *g,
                            have: all.clone(),
                        })?;
                    keep.push(at);
                }
                keep
            }
        };
        let link = |i: usize, j: usize| {
            matrix
                .get(i)
                .and_then(|r| r.get(j))
                .copied()
                .unwrap_or(if i == j { Link::NvLink } else { Link::System })
        };
        Ok(Node {
            gpus: keep.iter().map(|&i| all[i]).collect(),
            links: keep
                .iter()
                .map(|&i| keep.iter().map(|&j| link(i, j)).collect())
                .collect(),
            cores: affinity().map_err(SlotError::Affinity)?,
        })
    }

    /// A node as a test describes it.
    pub fn fake(gpus: Vec<u32>, links: Vec<Vec<Link>>, cores: Vec<usize>) -> Node {
        Node { gpus, links, cores }
    }
}

/// How a set of GPUs ranks, lowest best: its worst link; per link level, best first, the summed
/// sizes of the free groups its GPUs come from (small: islands stay whole); its positions.
type Score = (Link, Vec<usize>, Vec<usize>);

/// Above this many candidate sets, a GPU group is chosen greedily instead of by trying every
/// set (nodes have 8 or 16 GPUs: C(16, 8) = 12,870 sets are tried exactly).
const EXACT_SETS: u64 = 50_000;

/// The free slots of a node, handed out as placements.
///
/// On a GPU node a trial that needs `k` GPUs gets `k` free GPUs: those whose worst pairwise
/// link is best; among equals, those taken from the smallest free group (so that a whole NVLink
/// island, or PCIe switch, stays free for a larger trial); then the lowest indices. With
/// `cores_per_trial > 0` each GPU placement also gets that many free cores; with 0 (the usual
/// case) GPU placements carry no core pinning. On a node without GPUs a trial gets
/// `cores_per_trial` free cores (0: all of them, one trial at a time), consecutive core ids
/// first; the GPUs it asks for are ignored there.
#[derive(Debug, Clone)]
pub struct Pool {
    node: Node,
    cores_per_trial: usize,
    max_parallel: Option<usize>,
    gpu_busy: Vec<bool>,
    core_busy: Vec<bool>,
    out: Vec<Placement>,
}

impl Pool {
    /// Checks the node (a square link matrix, something to place on) and the bounds
    /// (`max_parallel` at least 1, `cores_per_trial` no more than the node's cores).
    pub fn new(
        node: Node,
        cores_per_trial: usize,
        max_parallel: Option<usize>,
    ) -> Result<Pool, SlotError> {
        let n = node.gpus.len();
        if node.links.len() != n || node.links.iter().any(|r| r.len() != n) {
            return Err(SlotError::Links {
                gpus: n,
                rows: node.links.len(),
            });
        }
        if max_parallel == Some(0) {
            return Err(SlotError::MaxParallel);
        }
        if n == 0 && node.cores.is_empty() {
            return Err(SlotError::Empty);
        }
        if cores_per_trial > node.cores.len() {
            return Err(SlotError::Cores {
                per_trial: cores_per_trial,
                have: node.cores.len(),
            });
        }
        let cores_per_trial = if n == 0 && cores_per_trial == 0 {
            node.cores.len()
        } else {
            cores_per_trial
        };
        Ok(Pool {
            gpu_busy: vec![false; n],
            core_busy: vec![false; node.cores.len()],
            node,
            cores_per_trial,
            max_parallel,
            out: Vec::new(),
        })
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// How many placements are out.
    pub fn out(&self) -> usize {
        self.out.len()
    }

    /// A placement for a trial that needs `gpus_needed` GPUs (0 counts as 1 on a GPU node),
    /// or `None` when it does not fit now (too few free devices or cores, or `max_parallel`
    /// placements out).
    pub fn take(&mut self, gpus_needed: u32) -> Option<Placement> {
        if self.max_parallel.is_some_and(|m| self.out.len() >= m) {
            return None;
        }
        let gpus = if self.node.gpus.is_empty() {
            Vec::new()
        } else {
            self.pick_gpus(gpus_needed.max(1) as usize)?
        };
        let cores = if self.cores_per_trial > 0 {
            self.pick_cores(self.cores_per_trial)?
        } else {
            Vec::new()
        };
        for &i in &gpus {
            self.gpu_busy[i] = true;
        }
        for &i in &cores {
            self.core_busy[i] = true;
        }
        let p = Placement {
            gpus: gpus.iter().map(|&i| self.node.gpus[i]).collect(),
            cores: cores.iter().map(|&i| self.node.cores[i]).collect(),
        };
        self.out.push(p.clone());
        Some(p)
    }

    /// Returns a placement's devices and cores. One that is not out (given twice) is ignored
    /// with a warning.
    pub fn give(&mut self, p: &Placement) {
        let Some(at) = self.out.iter().position(|o| o == p) else {
            tracing::warn!("placement {} given back but not out; ignored", p.label());
            return;
        };
        self.out.swap_remove(at);
        for g in &p.gpus {
            if let Some(i) = self.node.gpus.iter().position(|x| x == g) {
                self.gpu_busy[i] = false;
            }
        }
        for c in &p.cores {
            if let Some(i) = self.node.cores.iter().position(|x| x == c) {
                self.core_busy[i] = false;
            }
        }
    }

    /// Whether a trial of this size can run on this node at all (on an empty node). One that
    /// cannot must be failed by the caller, not left waiting.
    pub fn fits_ever(&self, gpus_needed: u32) -> bool {
        self.node.gpus.is_empty() || gpus_needed.max(1) as usize <= self.node.gpus.len()
    }

    /// How many trials of this size fit on the empty node at once, bounded by `max_parallel`:
    /// the parallelism a study gets by default.
    pub fn capacity(&self, gpus_needed: u32) -> usize {
        let mut empty = Pool {
            gpu_busy: vec![false; self.gpu_busy.len()],
            core_busy: vec![false; self.core_busy.len()],
            out: Vec::new(),
            ..self.clone()
        };
        let mut n = 0;
        while empty.take(gpus_needed).is_some() {
            n += 1;
        }
        n
    }

    /// `k` free GPUs (positions in `node.gpus`), best connected first.
    fn pick_gpus(&self, k: usize) -> Option<Vec<usize>> {
        let free: Vec<usize> = (0..self.node.gpus.len())
            .filter(|&i| !self.gpu_busy[i])
            .collect();
        if free.len() < k {
            return None;
        }
        let sizes = self.group_sizes(&free);
        let score = |set: &[usize]| -> Score {
            let worst = self.worst(set);
            let fit = sizes
                .iter()
                .map(|per_gpu| set.iter().map(|&i| per_gpu[i]).sum())
                .collect();
            (worst, fit, set.to_vec())
        };
        if binomial(free.len() as u64, k as u64) <= EXACT_SETS {
            // The score ends with the set itself, so the best score carries its set.
            let mut best: Option<Score> = None;
            for_each_subset(&free, k, &mut |set| {
                let s = score(set);
                if best.as_ref().is_none_or(|b| s < *b) {
                    best = Some(s);
                }
            });
            return best.map(|(_, _, set)| set);
        }
        // Greedy from each free GPU: add the GPU that keeps the set best; keep the best set.
        free.iter()
            .filter_map(|&seed| {
                let mut set = vec![seed];
                while set.len() < k {
                    let next = free
                        .iter()
                        .filter(|i| !set.contains(i))
                        .min_by_key(|&&i| {
                            let mut s = set.clone();
                            s.push(i);
                            s.sort_unstable();
                            score(&s)
                        })
                        .copied()?;
                    set.push(next);
                    set.sort_unstable();
                }
                Some(set)
            })
            .min_by_key(|s| score(s))
    }

    /// The worst link among the GPUs at these positions.
    fn worst(&self, set: &[usize]) -> Link {
        let mut w = Link::NvLink;
        for (n, &a) in set.iter().enumerate() {
            for &b in &set[n + 1..] {
                w = w.max(self.node.links[a][b]);
            }
        }
        w
    }

    /// For each link level, best first, the size of the group of free GPUs each GPU belongs to
    /// when GPUs joined by a link that good or better are one group (0 for a busy GPU).
    fn group_sizes(&self, free: &[usize]) -> Vec<Vec<usize>> {
        use Link::*;
        [NvLink, Board, Switch, HostBridge, Numa, System]
            .iter()
            .map(|&level| {
                let mut size = vec![0; self.node.gpus.len()];
                let mut seen = vec![false; self.node.gpus.len()];
                for &start in free {
                    if seen[start] {
                        continue;
                    }
                    let mut group = vec![start];
                    seen[start] = true;
                    let mut at = 0;
                    while at < group.len() {
                        let a = group[at];
                        for &b in free {
                            if !seen[b] && self.node.links[a][b] <= level {
                                seen[b] = true;
                                group.push(b);
                            }
                        }
                        at += 1;
                    }
                    for &g in &group {
                        size[g] = group.len();
                    }
                }
                size
            })
            .collect()
    }

    /// `k` free cores (positions in `node.cores`): the first run of consecutive core ids long
    /// enough, else the lowest free ones.
    fn pick_cores(&self, k: usize) -> Option<Vec<usize>> {
        let free: Vec<usize> = (0..self.node.cores.len())
            .filter(|&i| !self.core_busy[i])
            .collect();
        if free.len() < k {
            return None;
        }
        let ids = &self.node.cores;
        let run = free
            .windows(k)
            .find(|w| w.windows(2).all(|p| ids[p[1]] == ids[p[0]] + 1));
        Some(run.map_or_else(|| free[..k].to_vec(), <[usize]>::to_vec))
    }
}

/// C(n, k), saturating.
fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n.saturating_sub(k));
    let mut r: u64 = 1;
    for i in 0..k {
        r = r.saturating_mul(n - i) / (i + 1);
    }
    r
}

/// Calls `f` with every `k`-subset of `items`, in lexicographic order.
fn for_each_subset(items: &[usize], k: usize, f: &mut impl FnMut(&[usize])) {
    fn go(
        items: &[usize],
        k: usize,
        from: usize,
        cur: &mut Vec<usize>,
        f: &mut impl FnMut(&[usize]),
    ) {
        if cur.len() == k {
            f(cur);
            return;
        }
        for i in from..items.len() {
            if items.len() - i < k - cur.len() {
                break;
            }
            cur.push(items[i]);
            go(items, k, i + 1, cur, f);
            cur.pop();
        }
    }
    go(items, k, 0, &mut Vec::with_capacity(k), f);
}

#[cfg(test)]
mod tests;
