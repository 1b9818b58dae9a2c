//! The FGD paper's placement experiment (see `FGD-METHOD.md`):
//!
//! ```text
//!   seed ─▶ Rng ─▶ shuffle the name-sorted pods
//!               ─▶ tune: clone random originals (or drop random pods) until
//!                  the GPU asked for is `tune` × cluster capacity
//!               ─▶ tie-break ranks for nodes (a seeded permutation)
//!   then each pod arrives once, in order, is placed or dropped (no retry,
//!   nothing ever leaves), and (arrived milli, allocated milli) is recorded.
//! ```
//!
//! The curve is [`super::discrete_curve`] of those events. Go's random
//! stream is not reproduced; the target is the mean over seeds.

use super::allocation::{discrete_curve, ARRIVED_COLUMNS};
use crate::placement::{
    canonical_policy_name, policy_by_name, Cluster, FragModel, GpuModels, NodeSpec, PodRequest,
    UnknownPolicy,
};
use crate::rng::Rng;

/// A cluster and the original pod list of one trace.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Name (the pod file's stem, e.g. `openb_pod_list_default`).
    pub name: String,
    /// GPU models.
    pub models: GpuModels,
    /// Nodes.
    pub nodes: Vec<NodeSpec>,
    /// The original pods (before shuffling and tuning).
    pub pods: Vec<PodRequest>,
}

impl Workload {
    /// Total GPUs of the cluster.
    pub fn total_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus as u32).sum()
    }

    /// The typical-pod distribution of the original pods.
    pub fn frag_model(&self) -> FragModel {
        FragModel::from_pods(&self.pods)
    }
}

/// State after one arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementEvent {
    /// Milli-GPU arrived so far (placed or not).
    pub arrived_milli: u64,
    /// Milli-GPU allocated now.
    pub used_milli: u64,
}

/// One experiment's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ExperimentResult {
    /// Canonical policy name.
    pub policy: &'static str,
    /// Seed.
    pub seed: u64,
    /// Tune ratio.
    pub tune: f64,
    /// GPUs in the cluster.
    pub total_gpus: u32,
    /// Allocated GPU % of capacity at arrived 0..=130 % (131 values).
    pub curve: Vec<f64>,
    /// Pods that arrived (after tuning).
    pub pods: usize,
    /// Pods that could not be placed.
    pub failed: usize,
    /// Fractional tasks moved by remaps.
    pub remapped_tasks: usize,
    /// Arrivals that needed a remap.
    pub remap_events: usize,
    /// Allocated milli-GPU after the last arrival.
    pub final_used_milli: u64,
}

impl ExperimentResult {
    /// Unallocated GPU % at 100 % arrived (the paper's headline figure).
    pub fn unallocated_at_100(&self) -> f64 {
        100.0 - self.curve[100]
    }

    /// Tasks moved per 1,000 arriving pods.
    pub fn remaps_per_1000(&self) -> f64 {
        if self.pods == 0 {
            0.0
        } else {
            self.remapped_tasks as f64 * 1000.0 / self.pods as f64
        }
    }
}

/// The arrival order: name-sorted originals, shuffled, then tuned to `tune`
/// × capacity by cloning random originals (or dropping random pods).
/// Returns indices into `workload.pods`.
pub fn arrival_order(workload: &Workload, tune: f64, rng: &mut Rng) -> Vec<usize> {
    let mut sorted: Vec<usize> = (0..workload.pods.len()).collect();
    sorted.sort_by(|&a, &b| workload.pods[a].name.cmp(&workload.pods[b].name));
    let mut order = sorted.clone();
    rng.shuffle(&mut order);
    if tune <= 0.0 || sorted.is_empty() {
        return order;
    }
    let target = tune * workload.total_gpus() as f64 * 1000.0;
    let mut total: u64 = order.iter().map(|&i| workload.pods[i].total_milli()).sum();
    if (total as f64) < target {
        if workload.pods.iter().all(|p| p.gpu_milli == 0) {
            return order;
        }
        loop {
            let i = sorted[rng.below(sorted.len() as u64) as usize];
            let p = &workload.pods[i];
            // The simulator's stop test adds the per-GPU milli only, while
            // the total adds all GPUs: a multi-GPU clone can overshoot.
            if (total + p.gpu_milli as u64) as f64 > target {
                break;
            }
            total += p.total_milli();
            order.push(i);
        }
    } else {
        while total as f64 > target && !order.is_empty() {
            let k = rng.below(order.len() as u64) as usize;
            total -= workload.pods[order[k]].total_milli();
            order.remove(k);
        }
    }
    order
}

/// Runs one experiment: `policy` on `workload` with `seed` and `tune`.
/// `frag` is the workload's typical-pod distribution (pass
/// [`Workload::frag_model`]; computed once and shared between experiments).
pub fn run_experiment(
    workload: &Workload,
    frag: &FragModel,
    policy: &str,
    seed: u64,
    tune: f64,
) -> Result<ExperimentResult, UnknownPolicy> {
    let name = canonical_policy_name(policy)?;
    let mut policy = policy_by_name(name, frag)?;
    let mut rng = Rng::new(seed);
    let order = arrival_order(workload, tune, &mut rng);
    let mut cluster = Cluster::new(workload.nodes.clone(), workload.models.clone());
    let mut ranks: Vec<u32> = (0..workload.nodes.len() as u32).collect();
    rng.shuffle(&mut ranks);
    cluster.set_tie_ranks(&ranks);

    let mut events = Vec::with_capacity(order.len());
    let mut arrived = 0u64;
    let (mut failed, mut moved, mut remap_events) = (0, 0, 0);
    for (task, &i) in order.iter().enumerate() {
        let pod = &workload.pods[i];
        arrived += pod.total_milli();
        match policy.place(&cluster, pod, &mut rng) {
            Ok(p) => {
                if !p.remaps.is_empty() {
                    if cluster.remap(p.node, &p.remaps) {
                        moved += p.remaps.len();
                        remap_events += 1;
                    } else {
                        failed += 1;
                        events.push(PlacementEvent {
                            arrived_milli: arrived,
                            used_milli: cluster.used_milli(),
                        });
                        continue;
                    }
                }
                cluster.bind(task as u32, pod, p.node, p.gpus);
            }
            Err(_) => failed += 1,
        }
        events.push(PlacementEvent {
            arrived_milli: arrived,
            used_milli: cluster.used_milli(),
        });
    }
    let total_gpus = cluster.total_gpus();
    let curve = discrete_curve(&events, total_gpus);
    debug_assert_eq!(curve.len(), ARRIVED_COLUMNS);
    Ok(ExperimentResult {
        policy: name,
        seed,
        tune,
        total_gpus,
        curve,
        pods: order.len(),
        failed,
        remapped_tasks: moved,
        remap_events,
        final_used_milli: cluster.used_milli(),
    })
}
