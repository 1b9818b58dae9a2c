//! An agent's discovered GPUs against the topology's node: the check a
//! registration passes before the agent is trusted with the node.
//!
//! ```text
//!   topology node: GPU 0 A10 24 GiB, GPU 1 A10 24 GiB
//!   agent reports: GPU 0 A10 24 GiB                      ─▶ refused, or with
//!                                                           allow_fewer_gpus: GPU 1 unavailable
//!   agent reports: 5 × 80 GiB                             ─▶ refused (names the first difference)
//! ```
//!
//! GPUs are matched by index. A model matches when the names agree ignoring
//! case, a leading `NVIDIA ` and spaces versus dashes (NVML reports
//! `NVIDIA A100-SXM4-80GB`, a catalog may say `A100-SXM4-80GB`). Memory
//! matches within [`MEMORY_TOLERANCE_PCT`] percent (NVML reports the total
//! the driver sees, which may sit a little off the catalog's nominal size).

use crate::config::Node;
use crate::protocol::NodeGpu;
use crate::state::UsageRecord;
use std::collections::BTreeSet;

/// How far (percent of the topology's size) a reported GPU memory may be
/// from the topology's and still match.
pub const MEMORY_TOLERANCE_PCT: u64 = 5;

fn model_key(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    let bare = lower.strip_prefix("nvidia ").unwrap_or(&lower);
    bare.replace([' ', '_'], "-")
}

/// Whether a reported GPU model name is the topology's `configured` one.
pub fn same_model(reported: &str, configured: &str) -> bool {
    model_key(reported) == model_key(configured)
}

/// Whether `reported` MiB is within the tolerance of `configured` MiB.
pub fn same_memory(reported: u64, configured: u64) -> bool {
    // configured × pct / 100 without overflow: whole hundreds, then the rest.
    let slack = (configured / 100)
        .saturating_mul(MEMORY_TOLERANCE_PCT)
        .saturating_add((configured % 100).saturating_mul(MEMORY_TOLERANCE_PCT) / 100);
    reported.abs_diff(configured) <= slack
}

/// Checks `reported` against `node`'s GPUs. On success, the indices of the
/// node's GPUs the agent did not report (empty unless `allow_fewer`); on a
/// difference, what differs (the first GPU that does, or the counts).
pub fn check_reported_gpus(
    node: &Node,
    reported: &[NodeGpu],
    allow_fewer: bool,
) -> Result<BTreeSet<u32>, String> {
    let configured = node.gpu_count();
    let mut seen = BTreeSet::new();
    for g in reported {
        if !seen.insert(g.index) {
            return Err(format!("GPU {} is reported twice", g.index));
        }
        let Some(want) = node.gpu(g.index) else {
            return Err(format!(
                "the agent reports {} GPUs (GPU {} among them), the topology gives the node {configured}",
                reported.len(),
                g.index
            ));
        };
        if !same_model(&g.model, &want.model) {
            return Err(format!(
                "GPU {}: the agent reports model {:?}, the topology says {:?}",
                g.index, g.model, want.model
            ));
        }
        if !same_memory(g.memory_mib, want.memory_mib) {
            return Err(format!(
                "GPU {}: the agent reports {} MiB, the topology says {} MiB",
                g.index, g.memory_mib, want.memory_mib
            ));
        }
    }
    let missing: BTreeSet<u32> = (0..configured).filter(|i| !seen.contains(i)).collect();
    if !missing.is_empty() && !allow_fewer {
        return Err(format!(
            "the agent reports {} of the node's {configured} GPUs (missing: {}); \
             set allow_fewer_gpus = true in the agent's config to accept this \
             and leave the missing GPUs unavailable",
            reported.len(),
            missing
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(missing)
}

/// An agent's usage records as the region prices them.
///
/// An agent names the GPU model it ran on as it discovered it (NVML:
/// `NVIDIA A100-SXM4-80GB`) and the pool kind of its own config; the price
/// list is keyed by the topology's model names and the kind of the node's
/// pool, and a record it cannot price refuses its whole batch, which the
/// agent then sends again forever. The topology is the truth: every record
/// takes the kind of `node`'s pool, and the model of `node`'s GPU that it
/// names (the same name, else by [`same_model`]); on a node of one model,
/// that model whatever the agent says (its price is the node's, not one
/// the agent picks). A record naming none of the models of a node with
/// several keeps its name: priced only if that name is priced (the region
/// cannot tell which of the node's GPUs it ran on).
pub fn usage_as_configured(node: &Node, records: &mut [UsageRecord]) {
    let only = node
        .gpus
        .first()
        .filter(|first| node.gpus.iter().all(|g| g.model == first.model));
    for r in records {
        let exact = node.gpus.iter().any(|g| g.model == r.gpu_model);
        if !exact {
            let named = node
                .gpus
                .iter()
                .find(|g| same_model(&r.gpu_model, &g.model));
            if let Some(g) = named.or(only) {
                r.gpu_model.clone_from(&g.model);
            }
        }
        r.pool_kind = node.kind;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ColdStart, GpuGroup, SwapCost};
    use crate::model::{NodeId, PoolKind};

    fn node(groups: &[(&str, u32, u64)]) -> Node {
        Node {
            name: NodeId("n1".into()),
            pool: "p".into(),
            kind: PoolKind::Center,
            cpu_milli: 1000,
            memory_mib: 1024,
            swap_mib: 1024,
            gpus: groups
                .iter()
                .map(|&(m, count, mem)| GpuGroup {
                    model: m.into(),
                    count,
                    memory_mib: mem,
                    h2d_mib_per_s: 1000,
                })
                .collect(),
            cold_start: ColdStart {
                setup_us: 0,
                storage_mib_per_s: 1,
            },
            swap: SwapCost { setup_us: 0 },
        }
    }

    fn gpu(index: u32, model: &str, memory_mib: u64) -> NodeGpu {
        NodeGpu {
            index,
            model: model.into(),
            memory_mib,
        }
    }

    #[test]
    fn exact_gpus_match_and_lies_are_refused() {
        let n = node(&[("sim-gpu-16g", 2, 16_384)]);
        let ok = [gpu(0, "sim-gpu-16g", 16_384), gpu(1, "sim-gpu-16g", 16_384)];
        assert_eq!(check_reported_gpus(&n, &ok, false), Ok(BTreeSet::new()));
        // 5 × 80 GiB on a node of 2 × 16 GiB.
        let lie: Vec<NodeGpu> = (0..5).map(|i| gpu(i, "sim-gpu-16g", 81_920)).collect();
        let e = check_reported_gpus(&n, &lie, true).unwrap_err();
        assert!(e.contains("81920 MiB"), "{e}");
        let more: Vec<NodeGpu> = (0..3).map(|i| gpu(i, "sim-gpu-16g", 16_384)).collect();
        let e = check_reported_gpus(&n, &more, true).unwrap_err();
        assert!(e.contains("reports 3 GPUs"), "{e}");
        let e = check_reported_gpus(&n, &[gpu(0, "A100", 16_384)], true).unwrap_err();
        assert!(e.contains("model \"A100\""), "{e}");
        let twice = [gpu(0, "sim-gpu-16g", 16_384), gpu(0, "sim-gpu-16g", 16_384)];
        assert!(check_reported_gpus(&n, &twice, true).is_err());
    }

    #[test]
    fn fewer_gpus_need_the_agents_consent() {
        let n = node(&[("sim-gpu-16g", 2, 16_384)]);
        let one = [gpu(0, "sim-gpu-16g", 16_384)];
        let e = check_reported_gpus(&n, &one, false).unwrap_err();
        assert!(e.contains("allow_fewer_gpus"), "{e}");
        assert_eq!(check_reported_gpus(&n, &one, true), Ok(BTreeSet::from([1])));
        assert_eq!(
            check_reported_gpus(&n, &[], true),
            Ok(BTreeSet::from([0, 1]))
        );
    }

    #[test]
    fn nvml_names_and_sizes_match_the_catalog() {
        assert!(same_model("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"));
        assert!(same_model("NVIDIA L4", "l4"));
        assert!(!same_model("NVIDIA L4", "A10"));
        assert!(same_memory(81_559, 81_920));
        assert!(same_memory(16_384, 16_384));
        assert!(!same_memory(81_920, 16_384));
        assert!(!same_memory(u64::MAX, 16_384));
        assert!(same_memory(u64::MAX, u64::MAX));
    }

    #[test]
    fn usage_takes_the_topologys_model_name_and_pool_kind() {
        let mut n = node(&[("A100-SXM4-80GB", 1, 81_920), ("L4", 1, 24_576)]);
        n.kind = PoolKind::Edge;
        let record = |seq: u64, model: &str| UsageRecord {
            seq,
            tenant: crate::model::TenantId("t".into()),
            function: "f".into(),
            tier: crate::model::Tier::Guaranteed,
            gpu_model: model.into(),
            pool_kind: PoolKind::Center,
            compute_milli_gpu_ms: 1,
            memory_mib_ms: 2,
            invocations: 3,
            end_ms: 4,
        };
        let mut records = vec![
            record(1, "NVIDIA A100-SXM4-80GB"),
            record(2, "nvidia l4"),
            record(3, "L4"),
            record(4, "H100"),
        ];
        let before = records.clone();
        usage_as_configured(&n, &mut records);
        let models: Vec<&str> = records.iter().map(|r| r.gpu_model.as_str()).collect();
        // (H100 is none of this node's two models: kept, priced only if
        // that name is.)
        assert_eq!(models, ["A100-SXM4-80GB", "L4", "L4", "H100"]);
        assert!(records.iter().all(|r| r.pool_kind == PoolKind::Edge));
        // On a node of one model, that model, whatever the agent says; an
        // exact name of a node's model is kept (two names alike by
        // `same_model` are two models).
        let one = node(&[("L4", 2, 24_576)]);
        let mut lie = vec![record(5, "H100")];
        usage_as_configured(&one, &mut lie);
        assert_eq!(lie[0].gpu_model, "L4");
        let alike = node(&[("a100_80g", 1, 81_920), ("A100-80G", 1, 81_920)]);
        let mut exact = vec![record(6, "A100-80G"), record(7, "a100_80g")];
        usage_as_configured(&alike, &mut exact);
        assert_eq!(exact[0].gpu_model, "A100-80G");
        assert_eq!(exact[1].gpu_model, "a100_80g");
        // Nothing else changes.
        for (a, b) in records.iter().zip(&before) {
            let mut a = a.clone();
            a.gpu_model.clone_from(&b.gpu_model);
            a.pool_kind = b.pool_kind;
            assert_eq!(&a, b);
        }
    }
}
