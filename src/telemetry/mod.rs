//! Hardware fingerprint and telemetry. With an NVIDIA driver (NVML, through `nvml-wrapper`,
//! loaded at run time so that the binary runs anywhere): GPU names, UUIDs, memory, driver and
//! CUDA versions; during a trial, sampled memory used (max), utilisation, power and energy (for
//! tokens per joule); the processes that hold each GPU, so that a launch is refused on a GPU
//! foreign processes use and a teardown waits until the memory its engine held is free again.
//! Without a driver: telemetry is off (one info line, never an error) and the fingerprint is
//! the CPU's model and core count.

pub mod host;
pub mod host_memory;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum TelemetryError {
    #[error("GPU {gpu} is in use by processes that are not servetune's engines (pids {pids:?}); stop them or set refuse_foreign_gpu_processes = false")]
    ForeignProcesses { gpu: u32, pids: Vec<u32> },
    #[error("GPU {gpu} still holds {held_mib} MiB more than before the engine started, {secs:.0} s after teardown")]
    MemoryHeld { gpu: u32, held_mib: u64, secs: f64 },
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_bytes: u64,
}

/// What a result was measured on; part of the key of the best configurations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub gpus: Vec<GpuInfo>,
    pub driver_version: Option<String>,
    /// e.g. "12.4".
    pub cuda_version: Option<String>,
    pub cpu_model: String,
    pub cpu_cores: u32,
}

impl Fingerprint {
    /// A short key: "2x NVIDIA H200" or "cpu: AMD EPYC 7B13 (2 cores)".
    pub fn key(&self) -> String {
        match self.gpus.first() {
            Some(g) => format!("{}x {}", self.gpus.len(), g.name),
            None => format!("cpu: {} ({} cores)", self.cpu_model, self.cpu_cores),
        }
    }
}

/// A reading of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    pub memory_used_bytes: u64,
    pub util_pct: u32,
    pub power_mw: u32,
    /// Energy since the driver loaded, mJ (Volta and newer).
    pub energy_mj: Option<u64>,
}

/// A process using a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProcess {
    pub gpu: u32,
    pub pid: u32,
    pub used_bytes: Option<u64>,
}

/// How two GPUs of the node are connected, best first (so `Ord` ranks them: a set of GPUs is
/// as well connected as its worst pair). NVLink, directly or through NVSwitch, then NVML's
/// PCIe topology levels (`nvmlDeviceGetTopologyCommonAncestor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Link {
    /// An active NVLink between the two, or NVLink peer access through an NVSwitch.
    NvLink,
    /// On one board (NVML `Internal`, e.g. the two GPUs of a K80).
    Board,
    /// Under one PCIe switch tree (NVML `Single` and `Multiple`): no host bridge crossed.
    Switch,
    /// Through one host bridge (NVML `HostBridge`).
    HostBridge,
    /// Within one NUMA node, across host bridges (NVML `Node`).
    Numa,
    /// Across NUMA nodes (NVML `System`); also what an unknown link counts as.
    System,
}

/// The source of GPU readings: NVML on a real node, a scripted one in tests.
pub trait GpuSource: Send + Sync {
    fn gpus(&self) -> Vec<GpuInfo>;
    fn read(&self, gpu: u32) -> Option<Reading>;
    fn processes(&self) -> Vec<GpuProcess>;
    fn driver_version(&self) -> Option<String>;
    fn cuda_version(&self) -> Option<String>;
    /// How GPUs `a` and `b` (indices) are connected; `None` when the source cannot tell.
    fn link(&self, _a: u32, _b: u32) -> Option<Link> {
        None
    }
}

/// NVML's `NVML_NVLINK_MAX_LINKS` (nvml.h, 18 since Hopper): the link numbers to look at.
const NVLINK_MAX_LINKS: u32 = 18;

/// Whether two PCI bus ids (`00000000:07:00.0`, `0000:07:00.0`) name the same function: NVML
/// pads the domain differently in different structures, so they are compared as numbers.
fn same_pci(a: &str, b: &str) -> bool {
    let parse = |s: &str| -> Option<Vec<u64>> {
        s.trim()
            .split([':', '.'])
            .map(|p| u64::from_str_radix(p, 16).ok())
            .collect()
    };
    matches!((parse(a), parse(b)), (Some(x), Some(y)) if x == y)
}

struct NvmlSource {
    nvml: nvml_wrapper::Nvml,
}

impl GpuSource for NvmlSource {
    fn gpus(&self) -> Vec<GpuInfo> {
        let n = self.nvml.device_count().unwrap_or(0);
        (0..n)
            .filter_map(|i| {
                let d = self.nvml.device_by_index(i).ok()?;
                Some(GpuInfo {
                    index: i,
                    name: d.name().unwrap_or_default(),
                    uuid: d.uuid().unwrap_or_default(),
                    memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
                })
            })
            .collect()
    }

    fn read(&self, gpu: u32) -> Option<Reading> {
        let d = self.nvml.device_by_index(gpu).ok()?;
        Some(Reading {
            memory_used_bytes: d.memory_info().map(|m| m.used).unwrap_or(0),
            util_pct: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
            power_mw: d.power_usage().unwrap_or(0),
            energy_mj: d.total_energy_consumption().ok(),
        })
    }

    fn processes(&self) -> Vec<GpuProcess> {
        let n = self.nvml.device_count().unwrap_or(0);
        let mut out = Vec::new();
        for i in 0..n {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            for p in d.running_compute_processes().unwrap_or_default() {
                out.push(GpuProcess {
                    gpu: i,
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                    },
                });
            }
        }
        out
    }

    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn cuda_version(&self) -> Option<String> {
        self.nvml.sys_cuda_driver_version().ok().map(|v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        })
    }

    /// NVLink when one of `a`'s active links ends at `b`'s PCI address, or NVML reports NVLink
    /// peer access between them (through an NVSwitch, where the link's far end is the switch);
    /// otherwise their closest common PCIe ancestor.
    fn link(&self, a: u32, b: u32) -> Option<Link> {
        use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
        let da = self.nvml.device_by_index(a).ok()?;
        let db = self.nvml.device_by_index(b).ok()?;
        if let Ok(pci_b) = db.pci_info() {
            let direct = (0..NVLINK_MAX_LINKS).any(|l| {
                let w = da.link_wrapper_for(l);
                w.is_active().unwrap_or(false)
                    && w.remote_pci_info()
                        .is_ok_and(|p| same_pci(&p.bus_id, &pci_b.bus_id))
            });
            if direct {
                return Some(Link::NvLink);
            }
        }
        if matches!(
            da.p2p_status(&db, P2pCapabilitiesIndex::NvLink),
            Ok(P2pStatus::Ok)
        ) {
            return Some(Link::NvLink);
        }
        Some(match da.topology_common_ancestor(db).ok()? {
            TopologyLevel::Internal => Link::Board,
            TopologyLevel::Single | TopologyLevel::Multiple => Link::Switch,
            TopologyLevel::HostBridge => Link::HostBridge,
            TopologyLevel::Node => Link::Numa,
            TopologyLevel::System => Link::System,
        })
    }
}

/// The node's telemetry: GPUs through a source, or none.
#[derive(Clone)]
pub struct Telemetry {
    source: Option<Arc<dyn GpuSource>>,
}

impl Telemetry {
    /// NVML if a driver is present; otherwise off, with one info line.
    pub fn detect() -> Telemetry {
        match nvml_wrapper::Nvml::init() {
            Ok(nvml) => Telemetry {
                source: Some(Arc::new(NvmlSource { nvml })),
            },
            Err(e) => {
                tracing::info!("no NVIDIA driver ({e}): GPU telemetry off, fingerprinting the CPU");
                Telemetry::off()
            }
        }
    }

    pub fn off() -> Telemetry {
        Telemetry { source: None }
    }

    pub fn with_source(source: Arc<dyn GpuSource>) -> Telemetry {
        Telemetry {
            source: Some(source),
        }
    }

    pub fn enabled(&self) -> bool {
        self.source.is_some()
    }

    pub fn gpu_count(&self) -> u32 {
        self.source.as_ref().map_or(0, |s| s.gpus().len() as u32)
    }

    /// How every pair of GPUs is connected: a square matrix over the indices of `gpus()` (row
    /// `i` is the `i`-th GPU the source lists). The diagonal is `Link::NvLink` (a GPU reaches
    /// itself as well as anything can); a pair the source cannot tell counts as
    /// `Link::System`, the worst. Empty when telemetry is off.
    pub fn links(&self) -> Vec<Vec<Link>> {
        let Some(s) = &self.source else {
            return Vec::new();
        };
        let gpus: Vec<u32> = s.gpus().iter().map(|g| g.index).collect();
        gpus.iter()
            .map(|&a| {
                gpus.iter()
                    .map(|&b| {
                        if a == b {
                            Link::NvLink
                        } else {
                            s.link(a, b).unwrap_or(Link::System)
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// The indices of the node's GPUs, in the source's order (empty when telemetry is off).
    pub fn gpu_indices(&self) -> Vec<u32> {
        self.source
            .as_ref()
            .map_or_else(Vec::new, |s| s.gpus().iter().map(|g| g.index).collect())
    }

    pub fn fingerprint(&self) -> Fingerprint {
        let (cpu_model, cpu_cores) = cpu();
        match &self.source {
            Some(s) => Fingerprint {
                gpus: s.gpus(),
                driver_version: s.driver_version(),
                cuda_version: s.cuda_version(),
                cpu_model,
                cpu_cores,
            },
            None => Fingerprint {
                gpus: Vec::new(),
                driver_version: None,
                cuda_version: None,
                cpu_model,
                cpu_cores,
            },
        }
    }

    /// Memory used per GPU now (the baseline a teardown returns to).
    pub fn memory_used(&self) -> Vec<(u32, u64)> {
        let Some(s) = &self.source else {
            return Vec::new();
        };
        s.gpus()
            .iter()
            .filter_map(|g| s.read(g.index).map(|r| (g.index, r.memory_used_bytes)))
            .collect()
    }

    /// Refuses when a GPU has compute processes outside the process groups in `ours`.
    pub fn check_no_foreign(&self, ours: &[i32]) -> Result<(), TelemetryError> {
        self.check_no_foreign_on(ours, None)
    }

    /// `check_no_foreign` on the GPUs in `gpus` only (`None`: every GPU): a parallel trial
    /// looks at its own GPUs, the others being other trials'.
    pub fn check_no_foreign_on(
        &self,
        ours: &[i32],
        gpus: Option<&[u32]>,
    ) -> Result<(), TelemetryError> {
        let Some(s) = &self.source else {
            return Ok(());
        };
        let mut by_gpu: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for p in s.processes() {
            if gpus.is_some_and(|g| !g.contains(&p.gpu)) {
                continue;
            }
            // SAFETY: plain syscall; -1 for a process we cannot see (another container).
            let pgid = unsafe { libc::getpgid(p.pid as i32) };
            if !ours.contains(&pgid) {
                by_gpu.entry(p.gpu).or_default().push(p.pid);
            }
        }
        match by_gpu.into_iter().next() {
            Some((gpu, pids)) => Err(TelemetryError::ForeignProcesses { gpu, pids }),
            None => Ok(()),
        }
    }

    /// After a teardown: waits until every GPU is back within `slack` bytes of `baseline`.
    pub fn wait_released(
        &self,
        baseline: &[(u32, u64)],
        slack: u64,
        timeout: Duration,
    ) -> Result<(), TelemetryError> {
        let Some(s) = &self.source else {
            return Ok(());
        };
        let start = Instant::now();
        loop {
            let over = baseline.iter().find_map(|(g, base)| {
                let now = s.read(*g)?.memory_used_bytes;
                (now > base + slack).then_some((*g, now - base))
            });
            match over {
                None => return Ok(()),
                Some((gpu, held)) if start.elapsed() >= timeout => {
                    return Err(TelemetryError::MemoryHeld {
                        gpu,
                        held_mib: held >> 20,
                        secs: start.elapsed().as_secs_f64(),
                    })
                }
                Some(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Starts sampling every GPU every `every` until the sampler is stopped.
    pub fn sample(&self, every: Duration) -> Sampler {
        self.sample_on(every, None)
    }

    /// `sample` on the GPUs in `gpus` only (`None`: every GPU): a parallel trial's memory,
    /// power and energy are its own GPUs', the others being other trials'.
    pub fn sample_on(&self, every: Duration, gpus: Option<&[u32]>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let acc = Arc::new(Mutex::new(Acc::default()));
        let only: Option<Vec<u32>> = gpus.map(<[u32]>::to_vec);
        let handle = self.source.clone().map(|s| {
            let (stop, acc) = (stop.clone(), acc.clone());
            std::thread::spawn(move || {
                let gpus: Vec<u32> = s
                    .gpus()
                    .iter()
                    .map(|g| g.index)
                    .filter(|g| only.as_ref().is_none_or(|o| o.contains(g)))
                    .collect();
                let first: Vec<Option<u64>> = gpus
                    .iter()
                    .map(|g| s.read(*g).and_then(|r| r.energy_mj))
                    .collect();
                let t0 = Instant::now();
                let mut last = Instant::now();
                loop {
                    let each: Vec<Option<Reading>> = gpus.iter().map(|g| s.read(*g)).collect();
                    let readings: Vec<Reading> = each.iter().flatten().copied().collect();
                    let dt = last.elapsed().as_secs_f64();
                    last = Instant::now();
                    {
                        let mut a = acc.lock().expect("sampler lock");
                        a.add(&readings, dt);
                        let energy: Option<u64> = each
                            .iter()
                            .zip(&first)
                            .map(|(r, f)| Some(r.as_ref()?.energy_mj?.saturating_sub((*f)?)))
                            .sum();
                        a.counter_energy_mj = energy;
                        a.seconds = t0.elapsed().as_secs_f64();
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(every);
                }
            })
        });
        Sampler { stop, acc, handle }
    }
}

#[derive(Default)]
struct Acc {
    samples: u64,
    max_memory: u64,
    util_sum: f64,
    power_sum_w: f64,
    integrated_j: f64,
    counter_energy_mj: Option<u64>,
    seconds: f64,
}

impl Acc {
    fn add(&mut self, r: &[Reading], dt: f64) {
        if r.is_empty() {
            return;
        }
        let mem: u64 = r.iter().map(|x| x.memory_used_bytes).sum();
        let power_w: f64 = r.iter().map(|x| x.power_mw as f64 / 1000.0).sum();
        let util = r.iter().map(|x| x.util_pct as f64).sum::<f64>() / r.len() as f64;
        self.samples += 1;
        self.max_memory = self.max_memory.max(mem);
        self.util_sum += util;
        self.power_sum_w += power_w;
        if self.samples > 1 {
            self.integrated_j += power_w * dt;
        }
    }
}

/// What a trial's GPUs did, summed over GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TelemetrySummary {
    pub samples: u64,
    pub seconds: f64,
    pub max_memory_used_bytes: u64,
    pub mean_util_pct: f64,
    pub mean_power_w: f64,
    /// From the energy counter when the GPUs have one, else power integrated over time.
    pub energy_j: f64,
}

impl TelemetrySummary {
    /// Tokens per joule for `tokens` produced during the sampled window.
    pub fn tokens_per_joule(&self, tokens: u64) -> Option<f64> {
        (self.energy_j > 0.0).then(|| tokens as f64 / self.energy_j)
    }
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    acc: Arc<Mutex<Acc>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Stops sampling; `None` when telemetry is off.
    pub fn finish(self) -> Option<TelemetrySummary> {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.handle?;
        let _ = h.join();
        let a = self.acc.lock().expect("sampler lock");
        if a.samples == 0 {
            return None;
        }
        Some(TelemetrySummary {
            samples: a.samples,
            seconds: a.seconds,
            max_memory_used_bytes: a.max_memory,
            mean_util_pct: a.util_sum / a.samples as f64,
            mean_power_w: a.power_sum_w / a.samples as f64,
            energy_j: a
                .counter_energy_mj
                .map(|mj| mj as f64 / 1000.0)
                .unwrap_or(a.integrated_j),
        })
    }
}

/// The CPU's model name and logical core count (from /proc/cpuinfo and the scheduler).
pub fn cpu() -> (String, u32) {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    (model, cores)
}

#[cfg(test)]
mod tests;
