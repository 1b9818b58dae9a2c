//! `packing`: prefer partly used GPUs over idle GPUs over idle nodes
//! (`GpuPackingScore`); best-fit GPU inside the node.

use crate::placement::feasibility::{best_fit_gpus, best_node};
use crate::placement::{Cluster, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest};
use crate::rng::Rng;

/// GPU packing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Packing;

fn packing_score(node: &Node, pod: &PodRequest) -> i64 {
    if pod.gpu_milli == 0 {
        return 0;
    }
    let left = node.gpu_left();
    let free = node.free_gpus() as i64;
    if free == left.len() as i64 {
        return (100 / 3 - free).max(free);
    }
    // GPUs in increasing milli left (stable), the first that hold the task.
    let mut order: [(u16, usize); crate::placement::MAX_GPUS_PER_NODE] =
        [(0, 0); crate::placement::MAX_GPUS_PER_NODE];
    for (g, &l) in left.iter().enumerate() {
        order[g] = (l, g);
    }
    let order = &mut order[..left.len()];
    order.sort_by_key(|&(l, g)| (l, g));
    let mut need = pod.num_gpu as usize;
    let mut free_used = 0i64;
    let mut ratio_sum = 0i64;
    for &(l, _) in order.iter() {
        if need == 0 {
            break;
        }
        if l >= pod.gpu_milli {
            need -= 1;
            if l == 1000 {
                free_used += 1;
            }
            ratio_sum += l as i64 * 100 / 1000;
        }
    }
    if need != 0 {
        return 0;
    }
    if free_used > 0 {
        return (100 / 2 - free_used).max(100 / 3);
    }
    (100 - ratio_sum / 10).max(100 / 2)
}

impl PlacementPolicy for Packing {
    fn name(&self) -> &'static str {
        "packing"
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        _rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let node = best_node(cluster, pod, |_, n| packing_score(n, pod))?;
        Ok(Placement {
            node,
            gpus: best_fit_gpus(&cluster.nodes()[node], pod),
            remaps: Vec::new(),
        })
    }
}
