//! The embedded default workload: a synthetic cluster and pod list drawn
//! (seeded) from small distribution tables derived from the openb trace
//! (Alibaba GPU cluster, 2023), so that `gsharectl sim placement` runs on a
//! machine without the traces. The tables are aggregate counts (node shapes,
//! the most common task shapes with their median memory), not the trace.

use super::placement::Workload;
use crate::placement::{GpuModels, GpuSpec, NodeSpec, PodRequest};
use crate::rng::Rng;

/// Node shapes of the openb GPU node list: (cpu milli, memory MiB, GPUs,
/// model, count). 1,213 nodes, 6,212 GPUs in all.
const NODE_SHAPES: [(u32, u64, u8, &str, u32); 15] = [
    (96_000, 393_216, 8, "G2", 549),
    (104_000, 524_288, 2, "T4", 387),
    (16_000, 122_880, 2, "P100", 107),
    (128_000, 786_432, 8, "G3", 39),
    (32_000, 131_072, 4, "V100M16", 28),
    (64_000, 262_144, 2, "P100", 22),
    (96_000, 786_432, 8, "V100M32", 21),
    (8_000, 32_768, 1, "V100M16", 19),
    (96_000, 393_216, 4, "T4", 17),
    (48_000, 376_832, 4, "V100M32", 9),
    (64_000, 262_144, 8, "V100M16", 7),
    (8_000, 61_440, 1, "P100", 3),
    (8_000, 61_440, 2, "P100", 2),
    (128_000, 1_048_576, 1, "A10", 2),
    (82_000, 344_064, 8, "V100M16", 1),
];

/// Task shapes of the openb default pod list: (cpu milli, median memory MiB,
/// GPUs, milli per GPU, count). They cover ~98 % of its 8,152 tasks.
const POD_SHAPES: [(u32, u64, u8, u16, u32); 55] = [
    (3152, 5600, 1, 810, 1047),
    (11300, 49152, 1, 1000, 874),
    (11400, 48128, 1, 1000, 599),
    (3152, 5600, 1, 1000, 470),
    (11908, 47104, 1, 470, 388),
    (12500, 57344, 0, 0, 366),
    (8000, 30517, 1, 470, 360),
    (12000, 24576, 1, 1000, 326),
    (32000, 49152, 0, 0, 290),
    (18708, 64512, 1, 1000, 255),
    (11908, 47104, 1, 650, 237),
    (4000, 22888, 1, 320, 232),
    (9810, 41560, 1, 1000, 195),
    (8000, 30517, 0, 0, 185),
    (8000, 16384, 1, 1000, 164),
    (4000, 24576, 1, 1000, 159),
    (15700, 58368, 1, 1000, 158),
    (11908, 47104, 1, 1000, 153),
    (16000, 32768, 1, 1000, 150),
    (4000, 30517, 1, 230, 122),
    (6000, 10240, 1, 460, 120),
    (15400, 51200, 0, 0, 120),
    (16500, 51200, 0, 0, 95),
    (14200, 58368, 1, 1000, 93),
    (24200, 93184, 1, 1000, 84),
    (3152, 5600, 1, 590, 75),
    (8000, 30517, 1, 320, 72),
    (4152, 10600, 1, 550, 72),
    (11900, 77824, 1, 1000, 55),
    (4000, 15258, 1, 160, 54),
    (4152, 10600, 1, 370, 45),
    (4000, 15258, 1, 220, 43),
    (8200, 33792, 1, 1000, 41),
    (15200, 80896, 1, 1000, 36),
    (4152, 10600, 1, 810, 31),
    (16400, 125952, 1, 1000, 29),
    (1000, 2048, 1, 320, 22),
    (6000, 22888, 1, 160, 20),
    (8000, 30517, 1, 220, 19),
    (88000, 327680, 8, 1000, 18),
    (4000, 22888, 1, 110, 18),
    (4000, 22888, 1, 480, 18),
    (8000, 30517, 1, 230, 18),
    (64200, 263168, 8, 1000, 18),
    (1000, 6144, 1, 1000, 15),
    (16000, 31250, 0, 0, 14),
    (8000, 30517, 1, 650, 12),
    (7000, 30000, 1, 1000, 11),
    (32200, 132096, 4, 1000, 9),
    (16200, 66560, 2, 1000, 7),
    (120000, 737280, 8, 1000, 3),
    (6000, 65536, 2, 1000, 3),
    (32000, 131072, 4, 1000, 3),
    (30200, 160768, 2, 1000, 3),
    (60200, 320512, 4, 1000, 3),
];

/// Name of the embedded default workload.
pub const DEFAULT_WORKLOAD: &str = "synthetic_openb_default";

/// The embedded default: the openb node shapes (1,213 nodes) and 8,152 tasks
/// drawn from the task-shape table with `seed`.
pub fn default_workload(seed: u64) -> Workload {
    let mut models = GpuModels::default();
    let mut nodes = Vec::new();
    for &(cpu, mem, gpus, model, count) in &NODE_SHAPES {
        let id = models.intern(model);
        for _ in 0..count {
            nodes.push(NodeSpec {
                name: format!("synth-node-{:04}", nodes.len()),
                cpu_milli: cpu,
                memory_mib: mem,
                gpus,
                model: id,
            });
        }
    }
    let total: u64 = POD_SHAPES.iter().map(|s| s.4 as u64).sum();
    let mut rng = Rng::new(seed);
    let pods = (0..8152)
        .map(|i| {
            let mut x = rng.below(total);
            let shape = POD_SHAPES
                .iter()
                .find(|s| {
                    if x < s.4 as u64 {
                        true
                    } else {
                        x -= s.4 as u64;
                        false
                    }
                })
                .copied()
                .unwrap_or(POD_SHAPES[0]);
            PodRequest {
                name: format!("synth-pod-{i:04}"),
                cpu_milli: shape.0,
                memory_mib: shape.1,
                num_gpu: shape.2,
                gpu_milli: shape.3,
                gpu_spec: GpuSpec::ANY,
            }
        })
        .collect();
    Workload {
        name: DEFAULT_WORKLOAD.to_string(),
        models,
        nodes,
        pods,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_workload_has_the_openb_cluster_and_is_seeded() {
        let w = default_workload(1);
        assert_eq!(w.nodes.len(), 1213);
        assert_eq!(w.total_gpus(), 6212);
        assert_eq!(w.pods.len(), 8152);
        assert_eq!(default_workload(1).pods, w.pods);
        assert_ne!(default_workload(2).pods, w.pods);
    }
}
