//! The pool on faked nodes: an 8-GPU node of two NVLink islands joined across NUMA nodes, a
//! DGX-like all-NVLink node, a PCIe node of switch pairs and a CPU node; trials of 1, 2, 4 and 8
//! GPUs; and random take/give sequences that must never share a device or a core.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::telemetry::{GpuInfo, GpuProcess, GpuSource, Reading};

use Link::*;

/// Eight GPUs, `link(a, b)` between each pair.
fn node8(link: impl Fn(u32, u32) -> Link) -> Node {
    let gpus: Vec<u32> = (0..8).collect();
    let links = gpus
        .iter()
        .map(|&a| {
            gpus.iter()
                .map(|&b| if a == b { NvLink } else { link(a, b) })
                .collect()
        })
        .collect();
    Node::fake(gpus, links, (0..16).collect())
}

/// 0-3 and 4-7 are NVLink islands; across them, PCIe through the other NUMA node.
fn two_islands() -> Node {
    node8(|a, b| if a / 4 == b / 4 { NvLink } else { System })
}

fn dgx() -> Node {
    node8(|_, _| NvLink)
}

/// PCIe only: pairs under one switch, fours under one host bridge, halves per NUMA node.
fn pcie_pairs() -> Node {
    node8(|a, b| match (a / 2 == b / 2, a / 4 == b / 4) {
        (true, _) => Switch,
        (false, true) => HostBridge,
        _ => System,
    })
}

fn no_device_shared(out: &[Placement]) {
    let mut gpus: Vec<u32> = out.iter().flat_map(|p| p.gpus.clone()).collect();
    let mut cores: Vec<usize> = out.iter().flat_map(|p| p.cores.clone()).collect();
    let (g, c) = (gpus.len(), cores.len());
    gpus.sort_unstable();
    gpus.dedup();
    cores.sort_unstable();
    cores.dedup();
    assert_eq!((gpus.len(), cores.len()), (g, c), "shared: {out:?}");
}

#[test]
fn tensor_parallel_groups_stay_inside_an_nvlink_island() {
    let node = two_islands();
    let mut pool = Pool::new(node.clone(), 0, None).unwrap();
    let a = pool.take(2).unwrap();
    let b = pool.take(4).unwrap();
    let c = pool.take(2).unwrap();
    assert_eq!(a.gpus, vec![0, 1]);
    assert_eq!(b.gpus, vec![4, 5, 6, 7], "the whole free island");
    assert_eq!(c.gpus, vec![2, 3]);
    for p in [&a, &b, &c] {
        assert!(p.gpus.iter().all(|g| g / 4 == p.gpus[0] / 4), "{p:?}");
        assert!(
            p.cores.is_empty(),
            "GPU placements carry no cores by default"
        );
    }
    assert_eq!(pool.take(1), None, "the node is full");
    assert_eq!(pool.out(), 3);
    no_device_shared(&[a, b, c]);
    // A 4-GPU trial on a node with 2 free in each island gets them, across (worst: System).
    let mut pool = Pool::new(node, 0, None).unwrap();
    let x = pool.take(2).unwrap();
    let y = pool.take(2).unwrap();
    let z = pool.take(2).unwrap();
    assert_eq!((x.gpus.clone(), y.gpus.clone()), (vec![0, 1], vec![2, 3]));
    assert_eq!(z.gpus, vec![4, 5]);
    pool.give(&y);
    let w = pool.take(4).unwrap();
    assert_eq!(w.gpus, vec![2, 3, 6, 7]);
    no_device_shared(&[x, z, w]);
}

#[test]
fn a_lone_free_gpu_is_taken_before_a_whole_island_is_broken() {
    let mut pool = Pool::new(two_islands(), 0, None).unwrap();
    let big = pool.take(4).unwrap();
    let three = [
        pool.take(1).unwrap(),
        pool.take(1).unwrap(),
        pool.take(1).unwrap(),
    ];
    assert_eq!(big.gpus, vec![0, 1, 2, 3]);
    assert_eq!(
        three.iter().map(|p| p.gpus[0]).collect::<Vec<_>>(),
        [4, 5, 6]
    );
    pool.give(&big);
    // Free: the island 0-3 whole, and 7 alone: a single GPU takes 7.
    assert_eq!(pool.take(1).unwrap().gpus, vec![7]);
    assert_eq!(pool.take(4).unwrap().gpus, vec![0, 1, 2, 3]);
    // PCIe: a pair under one switch is kept for a 2-GPU trial.
    let mut pool = Pool::new(pcie_pairs(), 0, None).unwrap();
    let pair = pool.take(2).unwrap();
    let single = pool.take(1).unwrap();
    assert_eq!((pair.gpus, single.gpus.clone()), (vec![0, 1], vec![2]));
    assert_eq!(
        pool.take(1).unwrap().gpus,
        vec![3],
        "the other half of 2's pair"
    );
    assert_eq!(pool.take(2).unwrap().gpus, vec![4, 5]);
    assert_eq!(pool.take(4), None, "6 and 7 only");
}

#[test]
fn mixed_sizes_on_a_dgx_fill_the_node_without_sharing() {
    let mut pool = Pool::new(dgx(), 0, None).unwrap();
    let mut out = Vec::new();
    for k in [1, 2, 4, 1] {
        out.push(pool.take(k).unwrap());
    }
    assert_eq!(
        out.iter().map(|p| p.gpus.clone()).collect::<Vec<_>>(),
        vec![vec![0], vec![1, 2], vec![3, 4, 5, 6], vec![7]]
    );
    no_device_shared(&out);
    assert_eq!(pool.take(1), None);
    for p in &out {
        pool.give(p);
    }
    assert_eq!(pool.out(), 0);
    assert_eq!(pool.take(8).unwrap().gpus, (0..8).collect::<Vec<_>>());
}

#[test]
fn an_eight_gpu_trial_fits_only_the_empty_node_and_a_larger_one_never() {
    let mut pool = Pool::new(two_islands(), 0, None).unwrap();
    assert!(pool.fits_ever(8));
    assert!(!pool.fits_ever(9));
    let one = pool.take(1).unwrap();
    assert_eq!(pool.take(8), None, "waits for the whole node");
    pool.give(&one);
    let all = pool.take(8).unwrap();
    assert_eq!(all.gpus.len(), 8);
    assert_eq!(pool.take(1), None);
    assert_eq!(pool.take(9), None);
}

#[test]
fn max_parallel_bounds_the_placements_out_and_capacity_counts_what_fits() {
    let mut pool = Pool::new(dgx(), 0, Some(3)).unwrap();
    let got: Vec<Placement> = (0..5).filter_map(|_| pool.take(1)).collect();
    assert_eq!(got.len(), 3);
    assert_eq!(pool.out(), 3);
    pool.give(&got[1]);
    assert_eq!(pool.take(1).unwrap().gpus, vec![1]);
    // Capacity is counted on the empty node, whatever is out now.
    assert_eq!(pool.capacity(1), 3);
    let free = Pool::new(two_islands(), 0, None).unwrap();
    assert_eq!(
        [1, 2, 4, 8, 3, 9].map(|k| free.capacity(k)),
        [8, 4, 2, 1, 2, 0]
    );
    assert!(matches!(
        Pool::new(dgx(), 0, Some(0)),
        Err(SlotError::MaxParallel)
    ));
}

#[test]
fn give_and_take_round_trip_and_a_second_give_is_ignored() {
    let mut pool = Pool::new(two_islands(), 2, None).unwrap();
    let p = pool.take(2).unwrap();
    assert_eq!(
        p.cores,
        vec![0, 1],
        "cores asked for: GPU placements get them too"
    );
    pool.give(&p);
    pool.give(&p);
    assert_eq!(pool.out(), 0);
    assert_eq!(pool.take(2).unwrap(), p);
    // Cores run out before GPUs: 16 cores, 4 per trial.
    let mut pool = Pool::new(dgx(), 4, None).unwrap();
    assert_eq!((0..8).filter_map(|_| pool.take(1)).count(), 4);
}

#[test]
fn a_cpu_node_hands_out_runs_of_adjacent_cores() {
    let node = Node::fake(Vec::new(), Vec::new(), vec![0, 1, 2, 3, 4, 5, 6, 8, 9, 10]);
    let mut pool = Pool::new(node.clone(), 3, None).unwrap();
    let a = pool.take(4).unwrap();
    assert_eq!((a.gpus.clone(), a.cores.clone()), (vec![], vec![0, 1, 2]));
    let b = pool.take(1).unwrap();
    assert_eq!(b.cores, vec![3, 4, 5]);
    let c = pool.take(1).unwrap();
    assert_eq!(c.cores, vec![8, 9, 10], "6 alone is skipped for a run");
    assert_eq!(pool.take(1), None);
    pool.give(&a);
    let d = pool.take(1).unwrap();
    assert_eq!(d.cores, vec![0, 1, 2]);
    pool.give(&b);
    pool.give(&d);
    // 0, 1, 2, 3, 4, 5, 6 free: a run; then with only scattered cores free, the lowest.
    let e = pool.take(1).unwrap();
    assert_eq!(e.cores, vec![0, 1, 2]);
    assert_eq!(e.label(), "cores 0-2");
    assert_eq!(e.threads(), 3);
    assert!(e.env().is_empty());
    assert_eq!(Pool::new(node.clone(), 0, None).unwrap().capacity(1), 1);
    assert!(matches!(
        Pool::new(node, 11, None),
        Err(SlotError::Cores {
            per_trial: 11,
            have: 10
        })
    ));
    let mut scattered = Pool::new(Node::fake(vec![], vec![], vec![0, 2, 4]), 2, None).unwrap();
    assert_eq!(scattered.take(1).unwrap().label(), "cores 0,2");
}

#[test]
fn placement_environment_and_label() {
    let p = Placement {
        gpus: vec![2, 3],
        cores: vec![],
    };
    assert_eq!(
        p.env(),
        vec![
            ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "2,3".to_string())
        ]
    );
    assert_eq!(p.label(), "gpu 2,3");
    let q = Placement {
        gpus: vec![0],
        cores: vec![0, 1, 2, 3, 8, 10, 11],
    };
    assert_eq!(q.label(), "gpu 0 cores 0-3,8,10-11");
    assert_eq!(q.threads(), 7);
    let json = serde_json::to_string(&q).unwrap();
    assert_eq!(serde_json::from_str::<Placement>(&json).unwrap(), q);
    assert_eq!(
        Placement {
            gpus: vec![],
            cores: vec![]
        }
        .label(),
        "unpinned"
    );
}

#[test]
fn a_bad_link_matrix_or_an_empty_node_is_refused() {
    let mut n = dgx();
    n.links.pop();
    let e = Pool::new(n, 0, None).unwrap_err().to_string();
    assert!(e.contains("7 rows for 8 GPUs"), "{e}");
    assert!(matches!(
        Pool::new(Node::fake(vec![], vec![], vec![]), 0, None),
        Err(SlotError::Empty)
    ));
}

/// Four GPUs 0-3 in two NVLink pairs.
struct Four;

impl GpuSource for Four {
    fn gpus(&self) -> Vec<GpuInfo> {
        (0..4)
            .map(|index| GpuInfo {
                index,
                name: "NVIDIA H100".into(),
                uuid: format!("GPU-{index}"),
                memory_total_bytes: 80 << 30,
            })
            .collect()
    }
    fn read(&self, _: u32) -> Option<Reading> {
        None
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
        Some(if a / 2 == b / 2 { NvLink } else { Numa })
    }
}

#[test]
fn detect_reads_the_topology_and_the_study_list_restricts_it() {
    let t = Telemetry::with_source(Arc::new(Four));
    let node = Node::detect(&t, None).unwrap();
    assert_eq!(node.gpus, vec![0, 1, 2, 3]);
    assert_eq!(node.links[0], vec![NvLink, NvLink, Numa, Numa]);
    assert_eq!(node.cores, affinity().unwrap());
    assert!(!node.cores.is_empty());
    let some = Node::detect(&t, Some(&[3, 1, 2])).unwrap();
    assert_eq!(some.gpus, vec![3, 1, 2]);
    assert_eq!(
        some.links,
        vec![
            vec![NvLink, Numa, NvLink],
            vec![Numa, NvLink, Numa],
            vec![NvLink, Numa, NvLink]
        ]
    );
    let mut pool = Pool::new(some, 0, None).unwrap();
    assert_eq!(pool.take(2).unwrap().gpus, vec![3, 2]);
    let e = Node::detect(&t, Some(&[1, 7])).unwrap_err().to_string();
    assert_eq!(e, "GPU 7 is not on this node (NVML lists 0, 1, 2, 3)");
    let e = Node::detect(&t, Some(&[1, 1])).unwrap_err().to_string();
    assert_eq!(e, "GPU 1 is listed twice");
    let cpu = Node::detect(&Telemetry::off(), None).unwrap();
    assert!(cpu.gpus.is_empty() && cpu.links.is_empty());
    let e = Node::detect(&Telemetry::off(), Some(&[0])).unwrap_err();
    assert_eq!(e.to_string(), "GPU 0 is not on this node (NVML lists none)");
}

#[test]
fn large_nodes_are_placed_greedily_with_the_same_guarantees() {
    // 24 GPUs in islands of 8: C(24, 12) sets is beyond the exact search.
    let gpus: Vec<u32> = (0..24).collect();
    let links = gpus
        .iter()
        .map(|&a| {
            gpus.iter()
                .map(|&b| if a / 8 == b / 8 { NvLink } else { System })
                .collect()
        })
        .collect();
    let mut pool = Pool::new(Node::fake(gpus, links, vec![0]), 0, None).unwrap();
    let a = pool.take(12).unwrap();
    assert_eq!(a.gpus.len(), 12);
    let b = pool.take(8).unwrap();
    assert!(b.gpus.iter().all(|g| g / 8 == b.gpus[0] / 8), "{b:?}");
    no_device_shared(&[a, b]);
}

proptest! {
    /// Random takes (1, 2, 4 or 8 GPUs) and gives on either 8-GPU node, with and without a
    /// bound and cores per trial: no device or core is ever in two placements, no more than
    /// `max_parallel` are out, each group is as well linked as the free GPUs allowed, and a
    /// take fails only when the trial could not fit.
    #[test]
    fn random_take_give_sequences_never_share_a_device(
        ops in proptest::collection::vec((0u8..4, any::<bool>(), 0usize..8), 1..60),
        dgx_node in any::<bool>(),
        max in proptest::option::of(1usize..6),
        cores in 0usize..3,
    ) {
        let node = if dgx_node { dgx() } else { two_islands() };
        let mut pool = Pool::new(node, cores, max).unwrap();
        let mut out: Vec<Placement> = Vec::new();
        for (size, give, which) in ops {
            if give && !out.is_empty() {
                let p = out.remove(which % out.len());
                pool.give(&p);
            } else {
                let k = 1u32 << size;
                let free_gpus = 8 - out.iter().map(|p| p.gpus.len()).sum::<usize>();
                match pool.take(k) {
                    Some(p) => {
                        prop_assert_eq!(p.gpus.len(), k as usize);
                        prop_assert_eq!(p.cores.len(), cores);
                        if !dgx_node && k <= 4 {
                            // A group that fits in one island's free GPUs is put there.
                            let fits = (0..2).any(|i| {
                                (i * 4..i * 4 + 4)
                                    .filter(|g| !out.iter().any(|o| o.gpus.contains(g)))
                                    .count()
                                    >= k as usize
                            });
                            let inside = p.gpus.iter().all(|g| g / 4 == p.gpus[0] / 4);
                            prop_assert_eq!(fits, inside, "{:?} out {:?}", p, out);
                        }
                        out.push(p);
                    }
                    None => {
                        let bound = max.is_some_and(|m| out.len() >= m);
                        let cores_short = 16 - out.len() * cores < cores;
                        prop_assert!(bound || cores_short || free_gpus < k as usize);
                    }
                }
            }
            no_device_shared(&out);
            prop_assert_eq!(pool.out(), out.len());
            prop_assert!(max.is_none_or(|m| out.len() <= m));
        }
    }
}
