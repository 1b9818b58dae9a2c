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
//! fragmentation-gradient node score (the expected
//! fragmentation increase through FGD's integer sigmoid, which buckets
//! nearby nodes together), then the seeded random order. The balance class:
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
//! Inside the node a sharing task takes the GPU with the least hole-quality
//! loss (lowest index among equals).
//!
//! Remap (`gshare` only): when the task fits on no node as the GPUs are now
//! shared, move a few fractional tasks between GPUs of one node to make room
//! ([`super::repack`]); the node needing the fewest moves wins. This is what
//! gShare's runtime slice remapping allows; it never runs when the task fits
//! somewhere as is. Results and why: `docs/placement.md`.

use super::fgd::{frag_after, FragCache, NodeState};
use super::repack;
use crate::placement::feasibility::{first_free_gpus, fit, scan};
use crate::placement::{
    Cluster, FragModel, GpuSet, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest,
    ResourceDimension,
};
use crate::rng::Rng;

/// A sharing size counts as common (for hole quality) from this share of
/// the typical-pod distribution. Measured on the default trace: 1–1.5 %
/// gives 3.91 %, 2–3 % 4.12 %, 0.5 % (which admits 50-milli tasks, so every
/// hole looks fillable) 8.6 %.
const COMMON_SIZE_FREQ: f64 = 0.015;

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
    /// `dead[h]`: what a hole of `h` milli leaves at best when filled with
    /// common sharing sizes (see the module docs); built on first use.
    dead: Vec<u16>,
}

/// A node's rank for a task, lower first: (keeps off an oversubscribed
/// model, balance class, hole-quality loss, FGD's bucketed score, tie rank).
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
            dead: Vec::new(),
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

/// `dead[h]` for `h` in 0..=1000: the least milli left when a hole of `h` is
/// filled with any number of the common sharing sizes of `model`.
fn dead_holes(model: &FragModel) -> Vec<u16> {
    let mut freq = [0.0f64; 1001];
    for t in model.typical() {
        if t.num_gpu == 1 && t.gpu_milli > 0 && t.gpu_milli < 1000 {
            freq[t.gpu_milli as usize] += t.freq;
        }
    }
    let sizes: Vec<u16> = (1..1000u16)
        .filter(|&m| freq[m as usize] >= COMMON_SIZE_FREQ)
        .collect();
    let mut dead = vec![0u16; 1001];
    for h in 0..=1000u16 {
        dead[h as usize] = sizes
            .iter()
            .filter(|&&m| m <= h)
            .map(|&m| dead[(h - m) as usize])
            .fold(h, u16::min);
    }
    dead
}

/// The GPU of `node` where a sharing task of `milli` loses the least hole
/// quality, and that loss (`dead(after) − dead(before)`); lowest index among
/// equals.
fn hole_loss(dead: &[u16], node: &Node, milli: u16) -> Option<(i64, usize)> {
    let mut best: Option<(i64, usize)> = None;
    for (g, &l) in node.gpu_left().iter().enumerate() {
        if l < milli {
            continue;
        }
        let loss = dead[(l - milli) as usize] as i64 - dead[l as usize] as i64;
        if best.is_none_or(|(b, _)| loss < b) {
            best = Some((loss, g));
        }
    }
    best
}

/// FGD's bucketed score of `pod` on a node in state `st`, negated (lower is
/// better): `−⌊100 · sigmoid((frag_before − frag_after) / 1000)⌋` at its best GPU.
fn delta(model: &FragModel, st: &NodeState, pod: &PodRequest) -> i64 {
    let after = if pod.is_fractional() {
        let mut best = f64::INFINITY;
        let mut prev = u16::MAX;
        for k in 0..st.gpus as usize {
            let v = st.sorted[k];
            if v < pod.gpu_milli || v == prev {
                continue;
            }
            prev = v;
            best = best.min(frag_after(model, st, pod, Some(k)));
        }
        best
    } else {
        frag_after(model, st, pod, None)
    };
    let x = (st.frag - after) / 1000.0;
    -((100.0 / (1.0 + (-x).exp())) as i64)
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
        if self.dead.is_empty() {
            self.dead = dead_holes(&self.cache.model);
        }
        let dead = &self.dead;
        let cache = &mut self.cache;
        let mut best: Option<(RankKey, usize)> = None;
        let metric = scan(cluster, pod, |i, n| {
            let st = cache.state_of(i, n);
            let d = cache.memo(st, shape, pod, delta);
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
            let loss = if pod.is_fractional() {
                hole_loss(dead, n, pod.gpu_milli).map_or(i64::MAX, |(l, _)| l)
            } else {
                0
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
            hole_loss(&self.dead, node, pod.gpu_milli)
                .map_or(GpuSet::EMPTY, |(_, g)| GpuSet::one(g))
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
