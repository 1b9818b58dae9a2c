//! `fgd`: Fragmentation Gradient Descent (`FGDScore`, `-gpusel FGD`): place
//! the task where the cluster's expected fragmentation grows least. The node
//! score is `⌊sigmoid((frag_before − frag_after) / 1000) × 100⌋`; a sharing
//! task goes to the GPU with the best such score (lowest index among equals),
//! a whole-GPU task to the first free GPUs.
//!
//! Speed: a node's score depends only on its state (GPU model, CPU left, the
//! multiset of milli left per GPU) and the task's shape, and both repeat a
//! lot (1,213 nodes, ~35–100 typical shapes). [`FragCache`] interns node
//! states, keeps each state's fragmentation, and memoises scores per
//! (state, shape); a node's state id is recomputed only when its epoch moves.

use crate::placement::feasibility::{best_node, first_free_gpus};
use crate::placement::frag::fgd_bucket;
use crate::placement::hashing::FxHashMap;
use crate::placement::{
    Cluster, FragModel, GpuSet, Node, Placement, PlacementFailure, PlacementPolicy, PodRequest,
    MAX_GPUS_PER_NODE,
};
use crate::rng::Rng;

/// Node state as far as fragmentation is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StateKey {
    head: u64,
    gpus: [u64; MAX_GPUS_PER_NODE / 4],
}

/// An interned node state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeState {
    pub(crate) cpu_left: u32,
    pub(crate) model: Option<u8>,
    pub(crate) gpus: u8,
    /// Milli left per GPU, sorted ascending (first `gpus` entries).
    pub(crate) sorted: [u16; MAX_GPUS_PER_NODE],
    /// Fragmentation of this state.
    pub(crate) frag: f64,
}

/// Interned node states, their fragmentation and memoised scores.
#[derive(Debug, Clone)]
pub(crate) struct FragCache {
    pub(crate) model: FragModel,
    node_state: Vec<(u64, u32)>,
    states: FxHashMap<StateKey, u32>,
    pub(crate) info: Vec<NodeState>,
    shapes: FxHashMap<(u32, u16, u8, u64), u32>,
    scores: FxHashMap<u64, i64>,
}

impl FragCache {
    pub(crate) fn new(model: FragModel) -> Self {
        Self {
            model,
            node_state: Vec::new(),
            states: FxHashMap::default(),
            info: Vec::new(),
            shapes: FxHashMap::default(),
            scores: FxHashMap::default(),
        }
    }

    /// The interned state id of node `i`.
    pub(crate) fn state_of(&mut self, i: usize, node: &Node) -> u32 {
        if self.node_state.len() <= i {
            self.node_state.resize(i + 1, (0, 0));
        }
        let (ep, id) = self.node_state[i];
        if ep == node.epoch() + 1 {
            return id;
        }
        let id = self.intern(node.cpu_left(), node.spec().model, node.gpu_left());
        self.node_state[i] = (node.epoch() + 1, id);
        id
    }

    fn intern(&mut self, cpu_left: u32, model: Option<u8>, gpu_left: &[u16]) -> u32 {
        let mut sorted = [0u16; MAX_GPUS_PER_NODE];
        sorted[..gpu_left.len()].copy_from_slice(gpu_left);
        sorted[..gpu_left.len()].sort_unstable();
        let mut gpus = [0u64; MAX_GPUS_PER_NODE / 4];
        for (k, &v) in sorted.iter().enumerate() {
            gpus[k / 4] |= (v as u64) << (16 * (k % 4));
        }
        let head = cpu_left as u64
            | (gpu_left.len() as u64) << 32
            | (model.map_or(0xff, |m| m as u64)) << 40;
        let key = StateKey { head, gpus };
        if let Some(&id) = self.states.get(&key) {
            return id;
        }
        let frag = self
            .model
            .node_frag(cpu_left, model, &sorted[..gpu_left.len()]);
        let id = self.info.len() as u32;
        self.info.push(NodeState {
            cpu_left,
            model,
            gpus: gpu_left.len() as u8,
            sorted,
            frag,
        });
        self.states.insert(key, id);
        id
    }

    /// Interned id of the task's shape.
    pub(crate) fn shape_of(&mut self, pod: &PodRequest) -> u32 {
        let key = (
            pod.cpu_milli,
            pod.gpu_milli,
            pod.num_gpu,
            pod.gpu_spec.mask(),
        );
        let n = self.shapes.len() as u32;
        // (`gshare` marks its own memo entries with the top bit.)
        debug_assert!(n < 1 << 31, "too many task shapes");
        *self.shapes.entry(key).or_insert(n)
    }

    /// Memoised `score(state, shape)`.
    pub(crate) fn memo(
        &mut self,
        state: u32,
        shape: u32,
        pod: &PodRequest,
        score: impl FnOnce(&FragModel, &NodeState, &PodRequest) -> i64,
    ) -> i64 {
        let key = (state as u64) << 32 | shape as u64;
        if let Some(&s) = self.scores.get(&key) {
            return s;
        }
        let s = score(&self.model, &self.info[state as usize], pod);
        self.scores.insert(key, s);
        s
    }
}

/// Fragmentation after placing `pod` on a node in `state`, the task taking
/// `milli` from the GPU holding `from` (sharing tasks) or whole free GPUs
/// (others; the simulator's `NodeResource.Sub`: smallest left first).
pub(crate) fn frag_after(
    model: &FragModel,
    st: &NodeState,
    pod: &PodRequest,
    from: Option<usize>,
) -> f64 {
    let n = st.gpus as usize;
    let mut after = st.sorted;
    if let Some(k) = from {
        after[k] -= pod.gpu_milli;
    } else if pod.wants_gpu() {
        let mut need = pod.num_gpu as usize;
        for g in after[..n].iter_mut() {
            if need == 0 {
                break;
            }
            if *g >= pod.gpu_milli {
                *g -= pod.gpu_milli;
                need -= 1;
            }
        }
    }
    model.node_frag(
        st.cpu_left.saturating_sub(pod.cpu_milli),
        st.model,
        &after[..n],
    )
}

/// The FGD node score of `pod` on a node in state `st`.
fn fgd_score(model: &FragModel, st: &NodeState, pod: &PodRequest) -> i64 {
    if pod.is_fractional() {
        let n = st.gpus as usize;
        let mut best = 0;
        let mut prev = u16::MAX;
        for k in 0..n {
            let v = st.sorted[k];
            if v < pod.gpu_milli || v == prev {
                continue;
            }
            prev = v;
            best = best.max(fgd_bucket(st.frag, frag_after(model, st, pod, Some(k))));
        }
        best
    } else {
        fgd_bucket(st.frag, frag_after(model, st, pod, None))
    }
}

/// FGD's GPU for a sharing task: the best score, the lowest index among equals.
fn fgd_gpu(model: &FragModel, node: &Node, before: f64, pod: &PodRequest) -> Option<usize> {
    let left = node.gpu_left();
    let mut best: Option<(i64, usize)> = None;
    let mut after = [0u16; MAX_GPUS_PER_NODE];
    for (g, &l) in left.iter().enumerate() {
        if l < pod.gpu_milli {
            continue;
        }
        after[..left.len()].copy_from_slice(left);
        after[g] -= pod.gpu_milli;
        let f = model.node_frag(
            node.cpu_left().saturating_sub(pod.cpu_milli),
            node.spec().model,
            &after[..left.len()],
        );
        let s = fgd_bucket(before, f);
        if best.is_none_or(|(bs, _)| s > bs) {
            best = Some((s, g));
        }
    }
    best.map(|(_, g)| g)
}

/// Fragmentation Gradient Descent.
#[derive(Debug, Clone)]
pub struct Fgd {
    cache: FragCache,
}

impl Fgd {
    /// FGD over the typical-pod distribution `model`.
    pub fn new(model: FragModel) -> Self {
        Self {
            cache: FragCache::new(model),
        }
    }
}

impl PlacementPolicy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn place(
        &mut self,
        cluster: &Cluster,
        pod: &PodRequest,
        _rng: &mut Rng,
    ) -> Result<Placement, PlacementFailure> {
        let shape = self.cache.shape_of(pod);
        let cache = &mut self.cache;
        let node_ix = best_node(cluster, pod, |i, n| {
            let st = cache.state_of(i, n);
            cache.memo(st, shape, pod, fgd_score)
        })?;
        let node = &cluster.nodes()[node_ix];
        let gpus = if !pod.wants_gpu() {
            GpuSet::EMPTY
        } else if pod.is_fractional() {
            let st = self.cache.state_of(node_ix, node);
            let before = self.cache.info[st as usize].frag;
            fgd_gpu(&self.cache.model, node, before, pod).map_or(GpuSet::EMPTY, GpuSet::one)
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
