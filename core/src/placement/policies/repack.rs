//! Remap planning for `gshare`: when a task fits on no node as GPUs are now
//! shared, find a node where moving a few fractional tasks between its own
//! GPUs makes room (a small bin-packing over that node's GPUs).
//!
//! Two plans are tried per node, fewest moves first:
//! 1. targeted: empty just enough of one GPU (sharing task) or of the `k`
//!    least used GPUs (whole-GPU task), re-placing the evicted tasks on the
//!    node's other GPUs by best fit, largest first;
//! 2. full repack: first-fit decreasing of all fractional tasks (plus the new
//!    one) into the node's GPUs, each bin then mapped to the GPU that already
//!    holds most of its milli, so that few tasks move.
//!
//! GPUs held by whole-GPU tasks never move.

use crate::placement::cluster::FracTask;
use crate::placement::{GpuSet, Node, PodRequest, Remap, MAX_GPUS_PER_NODE};

/// A remap plan on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepackPlan {
    /// Tasks to move.
    pub(crate) remaps: Vec<Remap>,
    /// The GPUs the new task then gets.
    pub(crate) gpus: GpuSet,
}

/// GPUs whose allocation is only fractional tasks (or nothing).
fn movable(node: &Node) -> ([bool; MAX_GPUS_PER_NODE], [u32; MAX_GPUS_PER_NODE]) {
    let mut frac = [0u32; MAX_GPUS_PER_NODE];
    for t in &node.tasks {
        frac[t.gpu as usize] += t.milli as u32;
    }
    let mut ok = [false; MAX_GPUS_PER_NODE];
    for (g, &l) in node.gpu_left().iter().enumerate() {
        ok[g] = 1000 - l as u32 == frac[g];
    }
    (ok, frac)
}

/// Places `items` (largest first) onto `left` by best fit, skipping GPUs not
/// in `allowed`. Returns the target GPU per item, or `None`.
fn best_fit_all(
    items: &mut [FracTask],
    left: &mut [i32; MAX_GPUS_PER_NODE],
    allowed: &[bool; MAX_GPUS_PER_NODE],
    gpus: usize,
) -> Option<Vec<(FracTask, u8)>> {
    items.sort_by(|a, b| b.milli.cmp(&a.milli).then(a.id.cmp(&b.id)));
    let mut out = Vec::with_capacity(items.len());
    for t in items.iter() {
        let mut best: Option<usize> = None;
        for g in 0..gpus {
            if allowed[g] && left[g] >= t.milli as i32 && best.is_none_or(|b| left[g] < left[b]) {
                best = Some(g);
            }
        }
        let g = best?;
        left[g] -= t.milli as i32;
        out.push((*t, g as u8));
    }
    Some(out)
}

fn targeted(node: &Node, pod: &PodRequest) -> Option<RepackPlan> {
    let gpus = node.gpu_left().len();
    let (ok, frac) = movable(node);
    let base: [i32; MAX_GPUS_PER_NODE] = {
        let mut b = [0i32; MAX_GPUS_PER_NODE];
        for (g, &l) in node.gpu_left().iter().enumerate() {
            b[g] = l as i32;
        }
        b
    };
    let mut best: Option<(usize, RepackPlan)> = None;
    if pod.is_fractional() {
        for g in 0..gpus {
            if !ok[g] || frac[g] == 0 {
                continue;
            }
            // Evict largest tasks from g until the new task fits there.
            let mut on_g: Vec<FracTask> = node
                .tasks
                .iter()
                .filter(|t| t.gpu as usize == g)
                .copied()
                .collect();
            on_g.sort_by(|a, b| b.milli.cmp(&a.milli).then(a.id.cmp(&b.id)));
            let mut free = base[g];
            let mut evict = Vec::new();
            for t in on_g {
                if free >= pod.gpu_milli as i32 {
                    break;
                }
                free += t.milli as i32;
                evict.push(t);
            }
            if free < pod.gpu_milli as i32 {
                continue;
            }
            if best.as_ref().is_some_and(|(m, _)| *m <= evict.len()) {
                continue;
            }
            let mut left = base;
            let mut allowed = ok;
            allowed[g] = false;
            if let Some(moves) = best_fit_all(&mut evict, &mut left, &allowed, gpus) {
                let remaps = moves
                    .iter()
                    .map(|(t, to)| Remap {
                        task: t.id,
                        from: t.gpu,
                        to: *to,
                    })
                    .collect::<Vec<_>>();
                best = Some((
                    remaps.len(),
                    RepackPlan {
                        remaps,
                        gpus: GpuSet::one(g),
                    },
                ));
            }
        }
    } else {
        // Empty the k least used movable GPUs.
        let mut order: Vec<usize> = (0..gpus).filter(|&g| ok[g]).collect();
        order.sort_by_key(|&g| (frac[g], g));
        let k = pod.num_gpu as usize;
        if order.len() < k {
            return None;
        }
        let chosen = &order[..k];
        let mut allowed = ok;
        let mut set = GpuSet::EMPTY;
        for &g in chosen {
            allowed[g] = false;
            set = set.with(g);
        }
        let mut evict: Vec<FracTask> = node
            .tasks
            .iter()
            .filter(|t| set.contains(t.gpu as usize))
            .copied()
            .collect();
        let mut left = base;
        let moves = best_fit_all(&mut evict, &mut left, &allowed, gpus)?;
        let remaps = moves
            .iter()
            .map(|(t, to)| Remap {
                task: t.id,
                from: t.gpu,
                to: *to,
            })
            .collect::<Vec<_>>();
        best = Some((remaps.len(), RepackPlan { remaps, gpus: set }));
    }
    best.map(|(_, p)| p)
}

fn full_repack(node: &Node, pod: &PodRequest) -> Option<RepackPlan> {
    let gpus = node.gpu_left().len();
    let (ok, _) = movable(node);
    let bins: Vec<usize> = (0..gpus).filter(|&g| ok[g]).collect();
    let reserve = if pod.is_fractional() {
        0
    } else {
        pod.num_gpu as usize
    };
    if bins.len() < reserve {
        return None;
    }
    let nbins = bins.len() - reserve;
    // Items: the node's fractional tasks on movable GPUs, plus the new
    // sharing task (id None).
    let mut items: Vec<(Option<FracTask>, u16)> = node
        .tasks
        .iter()
        .filter(|t| ok[t.gpu as usize])
        .map(|t| (Some(*t), t.milli))
        .collect();
    if pod.is_fractional() {
        items.push((None, pod.gpu_milli));
    }
    items.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(a.0.map(|t| t.id).cmp(&b.0.map(|t| t.id)))
    });
    let mut fill = vec![0u32; nbins];
    let mut members: Vec<Vec<(Option<FracTask>, u16)>> = vec![Vec::new(); nbins];
    for it in items {
        let b = (0..nbins).find(|&b| fill[b] + it.1 as u32 <= 1000)?;
        fill[b] += it.1 as u32;
        members[b].push(it);
    }
    // Map bins to GPUs: greedily by milli already on that GPU.
    let mut weights: Vec<(u32, usize, usize)> = Vec::new();
    for (b, ms) in members.iter().enumerate() {
        for &g in &bins {
            let w: u32 = ms
                .iter()
                .filter_map(|(t, m)| t.filter(|t| t.gpu as usize == g).map(|_| *m as u32))
                .sum();
            weights.push((w, b, g));
        }
    }
    weights.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut bin_gpu = vec![usize::MAX; nbins];
    let mut gpu_taken = [false; MAX_GPUS_PER_NODE];
    for (_, b, g) in weights {
        if bin_gpu[b] == usize::MAX && !gpu_taken[g] {
            bin_gpu[b] = g;
            gpu_taken[g] = true;
        }
    }
    let mut remaps = Vec::new();
    let mut target = GpuSet::EMPTY;
    for (b, ms) in members.iter().enumerate() {
        let g = bin_gpu[b];
        for (t, _) in ms {
            match t {
                Some(t) if t.gpu as usize != g => remaps.push(Remap {
                    task: t.id,
                    from: t.gpu,
                    to: g as u8,
                }),
                Some(_) => {}
                None => target = GpuSet::one(g),
            }
        }
    }
    if !pod.is_fractional() {
        for &g in &bins {
            if !gpu_taken[g] && target.len() < reserve {
                target = target.with(g);
            }
        }
    }
    Some(RepackPlan {
        remaps,
        gpus: target,
    })
}

/// The plan with the fewest moves that lets `pod` onto `node`'s GPUs (CPU,
/// memory and model already checked by the caller), or `None`.
pub(crate) fn plan(node: &Node, pod: &PodRequest) -> Option<RepackPlan> {
    let (ok, _) = movable(node);
    let room: u32 = node
        .gpu_left()
        .iter()
        .enumerate()
        .filter(|(g, _)| ok[*g])
        .map(|(_, &l)| l as u32)
        .sum();
    if (room as u64) < pod.total_milli() {
        return None;
    }
    let a = targeted(node, pod);
    let b = if a.as_ref().is_some_and(|p| p.remaps.len() <= 1) {
        None
    } else {
        full_repack(node, pod)
    };
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.remaps.len() < a.remaps.len() {
            b
        } else {
            a
        }),
        (a, b) => a.or(b),
    }
}
