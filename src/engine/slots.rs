//! Slots (stand-in until the placement module lands): a trial's devices.

use serde::{Deserialize, Serialize};

/// The devices one trial's engine is pinned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Placement {
    pub gpus: Vec<u32>,
    pub cores: Vec<usize>,
}

impl Placement {
    pub fn env(&self) -> Vec<(String, String)> {
        if self.gpus.is_empty() {
            return Vec::new();
        }
        let ids: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        vec![("CUDA_VISIBLE_DEVICES".into(), ids.join(","))]
    }
    pub fn label(&self) -> String {
        if !self.gpus.is_empty() {
            let ids: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
            return format!("gpu {}", ids.join(","));
        }
        let ids: Vec<String> = self.cores.iter().map(usize::to_string).collect();
        format!("cores {}", ids.join(","))
    }
    pub fn threads(&self) -> usize {
        self.cores.len()
    }
}

#[derive(Debug, Clone)]
pub struct Node {
    pub gpus: Vec<u32>,
    pub cores: Vec<usize>,
}

impl Node {
    pub fn fake(gpus: Vec<u32>, _links: Vec<Vec<()>>, cores: Vec<usize>) -> Node {
        Node { gpus, cores }
    }
    pub fn detect(
        t: &crate::telemetry::Telemetry,
        gpus: Option<&[u32]>,
    ) -> Result<Node, SlotError> {
        let all: Vec<u32> = (0..t.gpu_count()).collect();
        let gpus = match gpus {
            Some(g) => g.to_vec(),
            None => all,
        };
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Node {
            gpus,
            cores: (0..n).collect(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("{0}")]
    Bad(String),
}

pub struct Pool {
    free_gpus: Vec<u32>,
    free_cores: Vec<usize>,
    node: Node,
    per: usize,
    max: Option<usize>,
    out: usize,
}

impl Pool {
    pub fn new(
        node: Node,
        cores_per_trial: usize,
        max_parallel: Option<usize>,
    ) -> Result<Pool, SlotError> {
        Ok(Pool {
            free_gpus: node.gpus.clone(),
            free_cores: node.cores.clone(),
            node,
            per: cores_per_trial,
            max: max_parallel,
            out: 0,
        })
    }
    pub fn take(&mut self, gpus_needed: u32) -> Option<Placement> {
        if self.max.is_some_and(|m| self.out >= m) {
            return None;
        }
        let mut p = Placement::default();
        if !self.node.gpus.is_empty() {
            if self.free_gpus.len() < gpus_needed as usize {
                return None;
            }
            p.gpus = self.free_gpus.drain(..gpus_needed as usize).collect();
        }
        if self.per > 0 {
            if self.free_cores.len() < self.per {
                self.free_gpus.extend(p.gpus);
                return None;
            }
            p.cores = self.free_cores.drain(..self.per).collect();
        }
        self.out += 1;
        Some(p)
    }
    pub fn give(&mut self, p: &Placement) {
        self.free_gpus.extend(&p.gpus);
        self.free_gpus.sort_unstable();
        self.free_cores.extend(&p.cores);
        self.free_cores.sort_unstable();
        self.out -= 1;
    }
    pub fn fits_ever(&self, gpus_needed: u32) -> bool {
        self.node.gpus.is_empty() || gpus_needed as usize <= self.node.gpus.len()
    }
    pub fn capacity(&self, gpus_needed: u32) -> usize {
        let g = if self.node.gpus.is_empty() {
            usize::MAX
        } else {
            self.node.gpus.len() / gpus_needed.max(1) as usize
        };
        let c = if self.per == 0 {
            usize::MAX
        } else {
            self.node.cores.len() / self.per
        };
        let n = g.min(c);
        let n = if n == usize::MAX { 1 } else { n };
        self.max.map_or(n, |m| n.min(m)).max(1)
    }
    pub fn out(&self) -> usize {
        self.out
    }
}
