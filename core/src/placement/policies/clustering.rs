//! `clustering`: keep tasks of the same GPU kind together (`GpuClusteringScore`):
//! nodes already holding only this kind first, then nodes holding it among
//! others, then idle nodes, then nodes of other kinds; inside each band the
//! fuller node wins. Best-fit GPU inside it.

use crate::placement::cluster::affinity_kind;
use crate::placement::feasibility::{best_fit_gpus, best_node};
use crate::placement::{Cluster, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest};
use crate::rng::Rng;

/// GPU-kind clustering.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clustering;

fn clustering_score(node: &Node, pod: &PodRequest) -> i64 {
    let Some(kind) = affinity_kind(pod) else {
        return 0;
    };
    // Integer arithmetic as in the simulator: 100/4 * (8000 - left) / 8000.
    let fill = 25 * (8000 - node.gpu_left_total() as i64) / 8000;
    let (kinds, has) = node.affinity_kinds(kind);
    let band = if has {
        if kinds == 1 {
            75
        } else {
            50
        }
    } else if kinds == 0 {
        25
    } else {
        0
    };
    fill + band
}

impl PlacementPolicy for Clustering {
    fn name(&self) -> &'static str {
        "clustering"
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        _rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let node = best_node(cluster, pod, |_, n| clustering_score(n, pod))?;
        Ok(Placement {
            node,
            gpus: best_fit_gpus(&cluster.nodes()[node], pod),
            remaps: Vec::new(),
        })
    }
}
