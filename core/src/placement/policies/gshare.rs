//! `gshare` and `gshare-noremap`: gshare's own placement.
//!
//! Ranking (both): first the CPU/GPU balance class (below); then, for a
//! sharing task, *hole quality*: with the
//! common sharing sizes of the typical-pod distribution (each ≥ 1.5 % of
//! it), a hole of `h` milli can at best be filled down to `dead(h)` milli
//! (an unbounded subset sum over those sizes). The task goes where
//! `dead(hole after) − dead(hole before)` is least, i.e. where it spoils the
//! fewest future combinations: a 320 does not land beside a 470 (its hole 530
//! fits another 470, dead 60; after the 320 the 210 left fits no common size)
//! but on a fresh GPU (680 → 650 + …, dead 30). FGD's fragmentation score only
//! asks whether a typical pod fits, not what it leaves. Then FGD's
//! fragmentation-gradient score of that same GPU (the expected
//! fragmentation increase through FGD's integer sigmoid, which buckets
//! nearby choices together), then the seeded random order; a node ranks by
//! its best GPU. (An earlier rule took the node's least loss and its best
//! FGD score from possibly different GPUs; ranking GPU by GPU is what the
//! region's planner can index, and on the four traces it leaves 3.81 /
//! 5.25 / 4.76 / 3.01 % against 3.80 / 5.27 / 4.78 / 3.00 %.) Whole-GPU and
//! CPU-only tasks rank by FGD's node score. The balance class:
//! - CPU-only tasks go first to nodes whose GPUs are all allocated (no GPU
//!   task needs their CPU), and otherwise where FGD's gradient says; an
//!   earlier rule, the node keeping the most CPU per idle GPU, spent the
//!   CPU-rich nodes first and stranded their GPUs once CPU was the scarce
//!   resource (`--variant cpu=200`: 6.40 % against FGD's 5.88 %; now 4.77 %);
//! - GPU tasks are classed by CPU per GPU against the cluster's own ratio
//!   (`CpuLight` below half of it, `CpuHeavy` above it, `Balanced` between);
//!   CPU-heavy tasks prefer CPU-rich nodes and CPU-light tasks CPU-poor ones,
//!   so that CPU runs out with the GPUs rather than before them (FGD strands
//!   ~1.7 % of the cluster's GPUs on nodes whose CPU is gone);
//! - an unconstrained task gets no balance preference on a GPU model that
//!   constrained tasks (`gpu_spec`) ask for, so that it does not eat the only
//!   GPUs those can use; and before any of this it keeps off a model that
//!   the constrained tasks alone oversubscribe (their share of the typical
//!   GPU demand above the model's share of the cluster's GPUs): with the
//!   production constraint mix at `--variant gpuspec=33` (T4 asked for 1.17×
//!   its share) FGD leaves 11.51 %, gshare without this rule 11.71 %, with
//!   it 9.49 %.
//!
//! Any finer deterministic order (exact fragmentation, best fit) packs worse
//! than FGD: the random order inside a bucket spreads tasks, which keeps
//! combinations open (measured; see `docs/placement.md`).
//!
//! Inside the node a sharing task takes its best GPU (lowest index among
//! equals). The region ranks its functions' slices with the same measures
//! (`state::GshareRanking`), where CPU and GPU-model rules have nothing to
//! act on (functions ask for neither).
//!
//! Remap (`gshare` only): when the task fits on no node as the GPUs are now
//! shared, move a few fractional tasks between GPUs of one node to make room
//! ([`super::repack`]); the node needing the fewest moves wins. This is what
//! gShare's runtime slice remapping allows; it never runs when the task fits
//! somewhere as is. Results and why: `docs/placement.md`.

use super::fgd::{frag_after, FragCache, NodeState};
use super::repack;
use crate::placement::feasibility::{first_free_gpus, fit, scan};
use crate::placement::frag::{fgd_bucket, HoleQuality};
use crate::placement::{
    Cluster, FragModel, GpuSet, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest,
    ResourceDimension,
};
use crate::rng::Rng;

/// gshare's placement policy.
#[derive(Debug, Clone)]
pub struct Gshare {
    cache: FragCache,
    remap: bool,
    /// The cluster's CPU milli per milli-GPU (capacity), set on first use.
    cluster_ratio: Option<f64>,
    /// GPU models named by some typical task's constraint (mask).
    contested: Option<u64>,
    /// GPU models whose constrained typical demand exceeds their share of
    /// the cluster's GPUs (mask), set on first use.
    avoid: Option<u64>,
    /// Hole quality over the common sharing sizes (see the module docs);
    /// built on first use.
    holes: Option<HoleQuality>,
}

/// A node's rank for a task, lower first: (keeps off an oversubscribed
/// model, balance class, a sharing task's best GPU rank (hole-quality loss,
/// then FGD's bucket there), FGD's node score for other tasks, tie rank).
type RankKey = (bool, i64, i64, i64, u32);

/// Where a CPU-per-GPU ratio stands against the cluster's ratio `r`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum BalanceClass {
    /// Below `r / 2`.
    CpuLight = 0,
    /// From `r / 2` to `r`.
    Balanced = 1,
    /// Above `r`.
    CpuHeavy = 2,
}

fn balance_class(ratio: f64, cluster: f64) -> BalanceClass {
    if ratio < cluster / 2.0 {
        BalanceClass::CpuLight
    } else if ratio <= cluster {
        BalanceClass::Balanced
    } else {
        BalanceClass::CpuHeavy
    }
}

impl Gshare {
    /// gshare over the typical-pod distribution `model`; `remap` enables
    /// in-node remapping (`gshare`) or not (`gshare-noremap`).
    pub fn new(model: FragModel, remap: bool) -> Self {
        Self {
            cache: FragCache::new(model),
            remap,
            cluster_ratio: None,
            contested: None,
            avoid: None,
            holes: None,
        }
    }
}

/// The GPU models that the constrained tasks of `model` ask more of (their
/// GPU milli, split evenly over the models each accepts) than the model's
/// share of `cluster`'s GPUs: constrained demand alone oversubscribes them.
pub(crate) fn oversubscribed_models(model: &FragModel, cluster: &Cluster) -> u64 {
    let mut gpus = [0f64; 64];
    for n in cluster.nodes() {
        if let Some(m) = n.spec().model {
            gpus[m as usize] += f64::from(n.spec().gpus);
        }
    }
    let total_gpus: f64 = gpus.iter().sum();
    let mut demand = [0f64; 64];
    let mut total = 0.0;
    for t in model.typical().iter().filter(|t| t.num_gpu > 0) {
        let milli = t.freq * f64::from(t.gpu_milli) * f64::from(t.num_gpu);
        total += milli;
        if !t.gpu_spec.is_any() {
            let mask = t.gpu_spec.mask();
            let k = f64::from(mask.count_ones().max(1));
            for (m, d) in demand.iter_mut().enumerate() {
                if mask & (1u64 << m) != 0 {
                    *d += milli / k;
                }
            }
        }
    }
    if total <= 0.0 || total_gpus <= 0.0 {
        return 0;
    }
    (0..64)
        .filter(|&m| gpus[m] > 0.0 && demand[m] / total > gpus[m] / total_gpus)
        .fold(0u64, |acc, m| acc | (1u64 << m))
}

/// Marks the memoised sharing rank apart from FGD's node score in the
/// policy's cache (both are keyed by node state and task shape).
const SHARING_RANK: u32 = 1 << 31;

/// The rank of a sharing task on the GPU holding sorted slot `k` of a node
/// in state `st`, lower first: its hole-quality loss, then FGD's bucket of
/// the node when that GPU takes it (`None`: it does not fit there).
fn slot_rank(
    holes: &HoleQuality,
    model: &FragModel,
    st: &NodeState,
    pod: &PodRequest,
    k: usize,
) -> Option<i64> {
    let loss = holes.loss(st.sorted[k], pod.gpu_milli)?;
    let bucket = fgd_bucket(st.frag, frag_after(model, st, pod, Some(k)));
    // (loss, −bucket) in lexicographic order: the bucket is 0..=100.
    Some(loss * 128 + (100 - bucket))
}

/// The best [`slot_rank`] over a node's GPUs.
fn sharing_rank(
    holes: &HoleQuality,
    model: &FragModel,
    st: &NodeState,
    pod: &PodRequest,
) -> Option<i64> {
    (0..st.gpus as usize)
        .filter_map(|k| slot_rank(holes, model, st, pod, k))
        .min()
}

/// The GPU of `node` (in state `st`) a sharing task takes: the best
/// [`slot_rank`], the lowest index among equals.
fn sharing_gpu(
    holes: &HoleQuality,
    model: &FragModel,
    st: &NodeState,
    node: &Node,
    pod: &PodRequest,
) -> Option<usize> {
    let n = st.gpus as usize;
    let mut best: Option<(i64, usize)> = None;
    for (g, &l) in node.gpu_left().iter().enumerate() {
        let Some(k) = st.sorted[..n].iter().position(|&v| v == l) else {
            continue;
        };
        let Some(r) = slot_rank(holes, model, st, pod, k) else {
            continue;
        };
        if best.is_none_or(|(b, _)| r < b) {
            best = Some((r, g));
        }
    }
    best.map(|(_, g)| g)
}

/// FGD's bucketed score of a whole-GPU or CPU-only `pod` on a node in
/// state `st`, negated (lower is better).
fn delta(model: &FragModel, st: &NodeState, pod: &PodRequest) -> i64 {
    -fgd_bucket(st.frag, frag_after(model, st, pod, None))
}

impl Gshare {
    fn remap_plan(&mut self, cluster: &Cluster, pod: &PodRequest) -> Option<Placement> {
        let mut best: Option<(usize, u32, usize, repack::RepackPlan)> = None;
        for (i, node) in cluster.nodes().iter().enumerate() {
            match fit(node, pod) {
                Err(ResourceDimension::GpuMilli) | Err(ResourceDimension::GpuCount) => {}
                _ => continue,
            }
            if (node.gpu_left_total() as u64) < pod.total_milli() {
                continue;
            }
            if let Some((m, r, _, _)) = &best {
                if *m == 1 && *r < node.tie_rank() {
                    continue;
                }
            }
            if let Some(p) = repack::plan(node, pod) {
                let key = (p.remaps.len(), node.tie_rank());
                if best.as_ref().is_none_or(|(m, r, _, _)| key < (*m, *r)) {
                    best = Some((key.0, key.1, i, p));
                }
            }
        }
        best.map(|(_, _, node, p)| Placement {
            node,
            gpus: p.gpus,
            remaps: p.remaps,
        })
    }
}

impl PlacementPolicy for Gshare {
    fn name(&self) -> &'static str {
        if self.remap {
            "gshare"
        } else {
            "gshare-noremap"
        }
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        _rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let shape = self.cache.shape_of(pod);
        let ratio = *self.cluster_ratio.get_or_insert_with(|| {
            let cpu: f64 = cluster
                .nodes()
                .iter()
                .map(|n| n.spec().cpu_milli as f64)
                .sum();
            cpu / (cluster.total_gpus() as f64 * 1000.0).max(1.0)
        });
        let pod_ratio = pod.cpu_milli as f64 / (pod.total_milli() as f64).max(1.0);
        let contested = *self.contested.get_or_insert_with(|| {
            self.cache
                .model
                .typical()
                .iter()
                .filter(|t| !t.gpu_spec.is_any())
                .fold(0u64, |m, t| m | t.gpu_spec.mask())
        });
        let avoid = *self
            .avoid
            .get_or_insert_with(|| oversubscribed_models(&self.cache.model, cluster));
        let holes = &*self
            .holes
            .get_or_insert_with(|| HoleQuality::new(&self.cache.model));
        let cache = &mut self.cache;
        let mut best: Option<(RankKey, usize)> = None;
        let metric = scan(cluster, pod, |i, n| {
            let st = cache.state_of(i, n);
            let balance = if pod.wants_gpu() {
                let node_ratio = n.cpu_left() as f64 / (n.gpu_left_total() as f64).max(1.0);
                let contested = pod.gpu_spec.is_any()
                    && n.spec().model.is_some_and(|m| contested & (1u64 << m) != 0);
                let nclass = if contested {
                    BalanceClass::Balanced
                } else {
                    balance_class(node_ratio, ratio)
                };
                match (balance_class(pod_ratio, ratio), nclass) {
                    (BalanceClass::CpuHeavy, nc) => -(nc as i64),
                    (BalanceClass::CpuLight, nc) => nc as i64,
                    _ => 0,
                }
            } else {
                // A node whose GPUs are all taken first: no GPU task needs
                // its CPU any more. Among the others FGD's gradient decides.
                -i64::from(n.gpu_left_total() == 0)
            };
            // A sharing task: the node's best GPU by (hole-quality loss,
            // FGD's bucket on that same GPU); whole-GPU and CPU-only tasks:
            // FGD's node score.
            let (loss, d) = if pod.is_fractional() {
                let r = cache.memo(st, shape | SHARING_RANK, pod, |m, st, pod| {
                    sharing_rank(holes, m, st, pod).unwrap_or(i64::MAX)
                });
                (r, 0)
            } else {
                (0, cache.memo(st, shape, pod, delta))
            };
            // An unconstrained task keeps off models that constrained tasks
            // alone oversubscribe, while it fits anywhere else.
            let shun = pod.wants_gpu()
                && pod.gpu_spec.is_any()
                && n.spec().model.is_some_and(|m| avoid & (1u64 << m) != 0);
            let key = (shun, balance, loss, d, n.tie_rank());
            if best.is_none_or(|(b, _)| key < b) {
                best = Some((key, i));
            }
        });
        let Some((_, node_ix)) = best else {
            if self.remap {
                if let Some(p) = self.remap_plan(cluster, pod) {
                    return Ok(p);
                }
            }
            return Err(PlacementFailure { metric });
        };
        let node = &cluster.nodes()[node_ix];
        let gpus = if !pod.wants_gpu() {
            GpuSet::EMPTY
        } else if pod.is_fractional() {
            let st = self.cache.state_of(node_ix, node);
            let st = &self.cache.info[st as usize];
            sharing_gpu(holes, &self.cache.model, st, node, pod).map_or(GpuSet::EMPTY, GpuSet::one)
        } else {
            first_free_gpus(node, pod.num_gpu)
        };
        Ok(Placement {
            node: node_ix,
            gpus,
            remaps: Vec::new(),
        })
    }
}
