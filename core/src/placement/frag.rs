//! GPU fragmentation as the FGD paper defines it (`pkg/utils/frag.go`).
//!
//! "Typical pods" are the most popular task shapes of the original pod list
//! (CPU, per-GPU milli, GPU count, GPU model constraint), taken in decreasing
//! count until they cover 95 % of the tasks, then renormalised. A node's
//! fragmentation is the expected milli-GPU it leaves unusable to a task drawn
//! from that distribution: all of its idle GPU when the task cannot run there
//! (or asks for no GPU), and otherwise the idle milli on GPUs too small for it.

use std::collections::BTreeMap;

use super::request::{GpuSpec, PodRequest};

/// One typical task shape and its probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TypicalPod {
    /// CPU request, milli-CPU.
    pub cpu_milli: u32,
    /// Milli-GPU per GPU (0 for CPU-only shapes).
    pub gpu_milli: u16,
    /// GPU count.
    pub num_gpu: u8,
    /// Acceptable GPU models.
    pub gpu_spec: GpuSpec,
    /// GPU memory per GPU, MiB (0 in the trace simulator, whose GPUs have
    /// no memory dimension; the region's functions have one).
    pub gpu_memory_mib: u64,
    /// Probability in the renormalised distribution.
    pub freq: f64,
}

impl TypicalPod {
    /// What a GPU with `free_milli` compute and `free_mib` memory left
    /// loses to this shape (assuming the node has the other GPUs and the CPU
    /// it needs): all of its free compute when the shape cannot use it (it
    /// asks for no GPU, or more than is left), else nothing.
    pub fn lost_on_gpu(&self, free_milli: u16, free_mib: u64) -> u32 {
        if self.uses_gpu(free_milli, free_mib) {
            0
        } else {
            u32::from(free_milli)
        }
    }

    /// Whether this shape can take a GPU with `free_milli` compute and
    /// `free_mib` memory left (a shape asking for no GPU takes none).
    pub fn uses_gpu(&self, free_milli: u16, free_mib: u64) -> bool {
        self.gpu_milli > 0 && free_milli >= self.gpu_milli && free_mib >= self.gpu_memory_mib
    }
}

/// FGD's score of moving a node (or GPU) from fragmentation `before` to
/// `after`: `⌊100 · sigmoid((before − after) / 1000)⌋`, higher is better.
/// It buckets nearby gains together (a gain of up to ~40 milli scores 50,
/// like none); the trace simulator and the region both score with it.
pub fn fgd_bucket(before: f64, after: f64) -> i64 {
    let x = (before - after) / 1000.0;
    (100.0 / (1.0 + (-x).exp())) as i64
}

/// The typical-pod distribution and the fragmentation measure built on it.
#[derive(Debug, Clone, Default)]
pub struct FragModel {
    typical: Vec<TypicalPod>,
}

/// Popularity threshold (`--pod-popularity-threshold`, default 95).
const POPULARITY_PCT: f64 = 95.0;

impl FragModel {
    /// Builds the typical pods from the original pod list (before any
    /// inflation), as the FGD simulator does.
    pub fn from_pods(pods: &[PodRequest]) -> Self {
        // key: (cpu, milli, num, spec, GPU memory) -> count
        let mut counts: BTreeMap<ShapeKey, u64> = BTreeMap::new();
        for p in pods {
            *counts
                .entry((
                    p.cpu_milli.max(100),
                    p.gpu_milli,
                    p.num_gpu,
                    p.gpu_spec.mask(),
                    0,
                ))
                .or_default() += 1;
        }
        Self::from_weighted(counts.into_iter().collect())
    }

    /// The typical pods of single-GPU sharing shapes `(milli, GPU memory
    /// MiB, weight)` that ask for no CPU and accept any GPU model (the
    /// region's functions), by the same popularity rule as
    /// [`FragModel::from_pods`], keeping at most `max` shapes (the most
    /// popular; the rest of the 95 % is dropped and the kept ones
    /// renormalised).
    pub fn from_shapes(shapes: impl IntoIterator<Item = (u16, u64, u64)>, max: usize) -> Self {
        let mut counts: BTreeMap<ShapeKey, u64> = BTreeMap::new();
        for (milli, mib, w) in shapes {
            let n = counts
                .entry((0, milli, 1, GpuSpec::ANY.mask(), mib))
                .or_default();
            *n = n.saturating_add(w);
        }
        let mut m = Self::from_weighted(counts.into_iter().collect());
        if m.typical.len() > max {
            m.typical.truncate(max);
            let kept: f64 = m.typical.iter().map(|t| t.freq).sum();
            if kept > 0.0 {
                for t in &mut m.typical {
                    t.freq /= kept;
                }
            }
        }
        m
    }

    fn from_weighted(mut list: Vec<(ShapeKey, u64)>) -> Self {
        let total = list.iter().fold(0u64, |t, x| t.saturating_add(x.1)).max(1) as f64;
        // Decreasing count, then decreasing (cpu, milli, num, spec).
        list.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        let expected = POPULARITY_PCT * total / 100.0;
        let mut cum = 0.0;
        let mut take = 0;
        while cum < expected && take < list.len() {
            cum += list[take].1 as f64;
            take += 1;
        }
        let share = cum / total;
        let typical = list[..take]
            .iter()
            .map(|&((cpu, milli, num, spec, mib), n)| TypicalPod {
                cpu_milli: cpu,
                gpu_milli: milli,
                num_gpu: num,
                gpu_spec: if spec == GpuSpec::ANY.mask() {
                    GpuSpec::ANY
                } else {
                    GpuSpec::from_mask(spec)
                },
                gpu_memory_mib: mib,
                freq: (n as f64 / total) / share,
            })
            .collect();
        Self { typical }
    }

    /// The typical pods, most popular first.
    pub fn typical(&self) -> &[TypicalPod] {
        &self.typical
    }

    /// Expected fragmented milli-GPU of a node with `cpu_left`, GPU `model`
    /// and per-GPU milli left `gpu_left` (order does not matter).
    pub fn node_frag(&self, cpu_left: u32, model: Option<u8>, gpu_left: &[u16]) -> f64 {
        let total: u32 = gpu_left.iter().map(|&g| g as u32).sum();
        if total == 0 {
            return 0.0;
        }
        let total = total as f64;
        let mut frag = 0.0;
        for t in &self.typical {
            let lost = if t.gpu_milli == 0 || !t.gpu_spec.admits(model) {
                total
            } else {
                let mut fits = 0u32;
                let mut small = 0u32;
                for &g in gpu_left {
                    if t.uses_gpu(g, u64::MAX) {
                        fits += 1;
                    } else {
                        small += u32::from(g);
                    }
                }
                if fits >= t.num_gpu as u32 && cpu_left >= t.cpu_milli {
                    small as f64
                } else {
                    total
                }
            };
            frag += t.freq * lost;
        }
        frag
    }

    /// Expected fragmented milli-GPU of one GPU with `free_milli` compute
    /// and `free_mib` memory left: [`FragModel::node_frag`] of a node whose
    /// CPU and other GPUs never stop a shape, which is the sum of its GPUs'
    /// (the region's measure, GPU by GPU, where functions ask for no CPU).
    pub fn gpu_frag(&self, free_milli: u16, free_mib: u64) -> f64 {
        if free_milli == 0 {
            return 0.0;
        }
        let mut frag = 0.0;
        for t in &self.typical {
            frag += t.freq * f64::from(t.lost_on_gpu(free_milli, free_mib));
        }
        frag
    }
}

/// (CPU milli, GPU milli, GPU count, GPU model mask, GPU memory MiB).
type ShapeKey = (u32, u16, u8, u64, u64);

/// A sharing size counts as common (for hole quality) from this share of
/// the typical-pod distribution. Measured on the default trace: 1–1.5 %
/// gives 3.91 %, 2–3 % 4.12 %, 0.5 % (which admits 50-milli tasks, so every
/// hole looks fillable) 8.6 %.
const COMMON_SIZE_FREQ: f64 = 0.015;

/// gshare's *hole quality*: with the common sharing sizes of a typical-pod
/// distribution (single-GPU shapes, each ≥ 1.5 % of it), a hole of `h`
/// milli can at best be filled down to `dead(h)` milli (an unbounded subset
/// sum over those sizes). A task of `m` placed in a hole of `h` costs
/// `dead(h − m) − dead(h)`: how many future combinations it spoils. The
/// trace simulator's `gshare` and the region's rank by this one measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoleQuality {
    dead: Vec<u16>,
}

impl HoleQuality {
    /// The measure over `model`'s common sharing sizes.
    pub fn new(model: &FragModel) -> Self {
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
        Self { dead }
    }

    /// What a hole of `h` milli (at most 1000) leaves at best.
    pub fn dead(&self, h: u16) -> u16 {
        self.dead.get(usize::from(h)).copied().unwrap_or(h)
    }

    /// The loss of putting `milli` into a hole of `free` milli
    /// (`dead(free − milli) − dead(free)`; `None` when it does not fit).
    pub fn loss(&self, free: u16, milli: u16) -> Option<i64> {
        let after = free.checked_sub(milli)?;
        Some(i64::from(self.dead(after)) - i64::from(self.dead(free)))
    }
}
