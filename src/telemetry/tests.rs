//! Telemetry logic against a scripted GPU source: the foreign-process refusal, the wait for
//! memory to be released, sampling with and without an energy counter, and the CPU fallback.

use super::*;

struct Fake {
    mem: Mutex<Vec<u64>>,
    procs: Mutex<Vec<GpuProcess>>,
    energy: bool,
    t0: Instant,
}

impl GpuSource for Fake {
    fn gpus(&self) -> Vec<GpuInfo> {
        vec![GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-0".into(),
            memory_total_bytes: 141 << 30,
        }]
    }
    fn read(&self, gpu: u32) -> Option<Reading> {
        let mut m = self.mem.lock().unwrap();
        let used = if m.len() > 1 { m.remove(0) } else { m[0] };
        Some(Reading {
            memory_used_bytes: used + gpu as u64,
            util_pct: 50,
            power_mw: 400_000,
            // 400 W since t0, in mJ.
            energy_mj: self
                .energy
                .then(|| (self.t0.elapsed().as_secs_f64() * 400_000.0) as u64),
        })
    }
    fn processes(&self) -> Vec<GpuProcess> {
        self.procs.lock().unwrap().clone()
    }
    fn driver_version(&self) -> Option<String> {
        Some("570.86".into())
    }
    fn cuda_version(&self) -> Option<String> {
        Some("12.8".into())
    }
}

fn fake(mem: Vec<u64>, energy: bool) -> Arc<Fake> {
    Arc::new(Fake {
        mem: Mutex::new(mem),
        procs: Mutex::new(Vec::new()),
        energy,
        t0: Instant::now(),
    })
}

#[test]
fn foreign_gpu_processes_refuse_a_launch_and_our_own_do_not() {
    let f = fake(vec![1 << 30], true);
    let t = Telemetry::with_source(f.clone());
    assert_eq!(t.check_no_foreign(&[]), Ok(()));
    // This test process stands in for an engine: its group is ours or foreign.
    f.procs.lock().unwrap().push(GpuProcess {
        gpu: 0,
        pid: std::process::id(),
        used_bytes: Some(1 << 30),
    });
    let own = unsafe { libc::getpgid(0) };
    assert_eq!(t.check_no_foreign(&[own]), Ok(()));
    let e = t.check_no_foreign(&[]).unwrap_err();
    assert_eq!(
        e,
        TelemetryError::ForeignProcesses {
            gpu: 0,
            pids: vec![std::process::id()]
        }
    );
    assert!(e.to_string().contains("refuse_foreign_gpu_processes"));
}

#[test]
fn teardown_waits_for_the_memory_and_reports_what_stays_held() {
    let gib = 1u64 << 30;
    // Released after three readings.
    let t = Telemetry::with_source(fake(vec![70 * gib, 40 * gib, 2 * gib, gib], false));
    t.wait_released(&[(0, gib)], 256 << 20, Duration::from_secs(5))
        .unwrap();
    // Never released.
    let t = Telemetry::with_source(fake(vec![70 * gib], false));
    let e = t
        .wait_released(&[(0, gib)], 256 << 20, Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(e, TelemetryError::MemoryHeld { held_mib, .. } if held_mib == 69 * 1024));
}

#[test]
fn sampling_reports_peak_memory_power_and_energy() {
    let gib = 1u64 << 30;
    for energy in [true, false] {
        // The first reading is the energy baseline; then the sampled ones.
        let t = Telemetry::with_source(fake(vec![gib, gib, 30 * gib, 80 * gib, 50 * gib], energy));
        let s = t.sample(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(300));
        let sum = s.finish().unwrap();
        assert_eq!(sum.max_memory_used_bytes, 80 * gib);
        assert!((sum.mean_power_w - 400.0).abs() < 1e-9);
        // About 400 W × 0.3 s, whichever way it was measured.
        assert!((60.0..250.0).contains(&sum.energy_j), "{energy}: {sum:?}");
        assert!(sum.tokens_per_joule(1000).unwrap() > 0.0);
    }
    let fp = Telemetry::with_source(fake(vec![gib], true)).fingerprint();
    assert_eq!(fp.key(), "1x NVIDIA H200");
    assert_eq!(fp.cuda_version.as_deref(), Some("12.8"));
}

#[test]
fn without_a_driver_everything_is_off_and_the_cpu_is_the_fingerprint() {
    let t = Telemetry::off();
    assert!(!t.enabled());
    assert_eq!(t.check_no_foreign(&[]), Ok(()));
    assert!(t.sample(Duration::from_millis(10)).finish().is_none());
    let fp = t.fingerprint();
    assert!(fp.gpus.is_empty() && fp.cpu_cores >= 1 && !fp.cpu_model.is_empty());
    assert!(fp.key().starts_with("cpu: "));
    // On this machine there is no driver: detect() must not fail either.
    let _ = Telemetry::detect().fingerprint();
}

/// Four GPUs: 0-1 and 2-3 on NVLink, the pairs under one PCIe switch, GPU 3 unknown to 0;
/// GPU i draws (i + 1) × 100 W and holds i + 1 GiB, with no energy counter.
struct Topo;

impl GpuSource for Topo {
    fn gpus(&self) -> Vec<GpuInfo> {
        (0..4)
            .map(|i| GpuInfo {
                index: i,
                name: "NVIDIA H100".into(),
                uuid: format!("GPU-{i}"),
                memory_total_bytes: 80 << 30,
            })
            .collect()
    }
    fn read(&self, gpu: u32) -> Option<Reading> {
        Some(Reading {
            memory_used_bytes: (gpu as u64 + 1) << 30,
            util_pct: 50,
            power_mw: (gpu + 1) * 100_000,
            energy_mj: None,
        })
    }
    fn processes(&self) -> Vec<GpuProcess> {
        Vec::new()
    }
    fn driver_version(&self) -> Option<String> {
        None
    }
    fn cuda_version(&self) -> Option<String> {
        None
    }
    fn link(&self, a: u32, b: u32) -> Option<Link> {
        match (a.min(b), a.max(b)) {
            (0, 3) => None,
            (x, y) if x / 2 == y / 2 => Some(Link::NvLink),
            _ => Some(Link::Switch),
        }
    }
}

#[test]
fn the_link_matrix_is_the_sources_with_nvlink_on_the_diagonal_and_unknown_as_system() {
    let t = Telemetry::with_source(Arc::new(Topo));
    let m = t.links();
    use Link::*;
    assert_eq!(
        m,
        vec![
            vec![NvLink, NvLink, Switch, System],
            vec![NvLink, NvLink, Switch, Switch],
            vec![Switch, Switch, NvLink, NvLink],
            vec![System, Switch, NvLink, NvLink],
        ]
    );
    assert_eq!(t.gpu_indices(), vec![0, 1, 2, 3]);
    assert!(Telemetry::off().links().is_empty());
    // Best first: a set of GPUs is as good as its worst pair.
    assert!(NvLink < Board && Board < Switch && Switch < HostBridge);
    assert!(HostBridge < Numa && Numa < System);
    assert_eq!(
        serde_json::to_string(&HostBridge).unwrap(),
        "\"hostbridge\""
    );
    assert_eq!(serde_json::from_str::<Link>("\"nvlink\"").unwrap(), NvLink);
    // A source that says nothing about links (the default) gives System off the diagonal.
    let one = Telemetry::with_source(fake(vec![0], false));
    assert_eq!(one.links(), vec![vec![NvLink]]);
}

#[test]
fn pci_bus_ids_compare_by_value_whatever_the_domain_padding() {
    assert!(same_pci("00000000:07:00.0", "0000:07:00.0"));
    assert!(same_pci("0000:0A:00.0", "00000000:0a:00.0"));
    assert!(!same_pci("0000:07:00.0", "0000:08:00.0"));
    assert!(!same_pci("garbage", "garbage"));
}

#[test]
fn a_placed_trial_looks_for_foreign_processes_on_its_own_gpus_only() {
    let f = fake(vec![1 << 30], true);
    let t = Telemetry::with_source(f.clone());
    f.procs.lock().unwrap().push(GpuProcess {
        gpu: 5,
        pid: std::process::id(),
        used_bytes: None,
    });
    assert_eq!(t.check_no_foreign_on(&[], Some(&[0, 1])), Ok(()));
    assert!(t.check_no_foreign_on(&[], Some(&[5])).is_err());
    assert!(t.check_no_foreign_on(&[], None).is_err());
}

#[test]
fn a_slots_sampling_reads_its_own_gpus_only() {
    let t = Telemetry::with_source(Arc::new(Topo));
    let mine = t.sample_on(Duration::from_millis(10), Some(&[1, 2]));
    let all = t.sample(Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(100));
    let (mine, all) = (mine.finish().unwrap(), all.finish().unwrap());
    assert!((mine.mean_power_w - 500.0).abs() < 1e-9, "{mine:?}");
    assert_eq!(mine.max_memory_used_bytes, 5 << 30);
    assert!((all.mean_power_w - 1000.0).abs() < 1e-9, "{all:?}");
    assert_eq!(all.max_memory_used_bytes, 10 << 30);
    // No energy counter: the slot's power integrated over its window, about half the node's.
    assert!(mine.energy_j > 0.0 && mine.energy_j < all.energy_j);
    assert!((mine.energy_j - 500.0 * mine.seconds).abs() < 0.25 * 500.0 * mine.seconds);
}
