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
    /// Probability in the renormalised distribution.
    pub freq: f64,
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
        // key: (cpu, milli, num, spec) -> count
        let mut counts: BTreeMap<(u32, u16, u8, u64), u64> = BTreeMap::new();
        for p in pods {
            *counts
                .entry((
                    p.cpu_milli.max(100),
                    p.gpu_milli,
                    p.num_gpu,
                    p.gpu_spec.mask(),
                ))
                .or_default() += 1;
        }
        Self::from_weighted(counts.into_iter().collect())
    }

    fn from_weighted(mut list: Vec<((u32, u16, u8, u64), u64)>) -> Self {
        let total = list.iter().map(|x| x.1).sum::<u64>().max(1) as f64;
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
            .map(|&((cpu, milli, num, spec), n)| TypicalPod {
                cpu_milli: cpu,
                gpu_milli: milli,
                num_gpu: num,
                gpu_spec: if spec == GpuSpec::ANY.mask() {
                    GpuSpec::ANY
                } else {
                    GpuSpec::from_mask(spec)
                },
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
                    if g >= t.gpu_milli {
                        fits += 1;
                    } else {
                        small += g as u32;
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
}
