//! `gsharectl node describe <node>` (operator): one node's pool, GPUs,
//! what is reserved on each, the instances placed there, and its agent's
//! latest heartbeat when the agent is linked to the replica asked.
//! (Kept to `describe` and its table so that other `node` commands sit
//! beside it.)

use serde_json::Value;

use super::region_client::{cell, RegionArgs};

/// `gsharectl node …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Debug, clap::Subcommand)]
enum NodeCommand {
    /// Show one node: pool, GPUs, reservations, instances, its agent.
    Describe {
        /// The node's name (as in the topology).
        node: String,
    },
}

/// Runs `gsharectl node …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    match a.command {
        NodeCommand::Describe { node } => describe(&a.region, &node),
    }
}

/// `gsharectl node describe <node>`.
pub fn describe(r: &RegionArgs, node: &str) -> anyhow::Result<()> {
    let v = r.call("GET", &format!("/v1/cluster/nodes/{node}"), None)?;
    r.show(&v, describe_table);
    Ok(())
}

fn describe_table(v: &Value) -> Vec<Vec<String>> {
    let agent = &v["agent"];
    let registered = &v["registered"];
    let mut rows = vec![
        vec!["node:".into(), cell(&v["node"])],
        vec![
            "pool:".into(),
            format!("{} ({})", cell(&v["pool"]), cell(&v["kind"])),
        ],
        vec!["swap MiB:".into(), cell(&v["swap_mib"])],
        vec![
            "registered:".into(),
            if registered.is_null() {
                "no agent yet".into()
            } else {
                format!(
                    "agent {} v{}, at {}",
                    cell(&registered["agent"]),
                    cell(&registered["version"]),
                    registered["registered_at"]
                        .as_u64()
                        .map_or_else(|| "-".into(), super::human::utc)
                )
            },
        ],
        vec![
            "link:".into(),
            if agent.is_null() {
                "not linked to this replica".into()
            } else {
                format!(
                    "{} v{} at {}, {} heartbeats",
                    cell(&agent["agent"]),
                    cell(&agent["version"]),
                    cell(&agent["ingress"]),
                    cell(&agent["heartbeats"])
                )
            },
        ],
        Vec::new(),
        [
            "GPU",
            "MODEL",
            "MEMORY MiB",
            "RESERVED milli",
            "BURST milli",
            "RESIDENT MiB",
            "OVERSUB MiB",
            "INSTANCES",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in v["gpus"].as_array().into_iter().flatten() {
        let instances: Vec<String> = g["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| {
                format!(
                    "{}/{} #{} ({}, {} milli, {} MiB)",
                    cell(&i["tenant"]),
                    cell(&i["function"]),
                    cell(&i["instance"]),
                    cell(&i["tier"]),
                    cell(&i["compute_milli"]),
                    cell(&i["memory_mib"])
                )
            })
            .collect();
        rows.push(vec![
            format!(
                "{}{}",
                cell(&g["index"]),
                if g["available"] == Value::Bool(false) {
                    " (missing)"
                } else {
                    ""
                }
            ),
            cell(&g["model"]),
            cell(&g["memory_mib"]),
            cell(&g["reserved_compute"]),
            cell(&g["burst_compute"]),
            cell(&g["resident_mib"]),
            cell(&g["oversub_mib"]),
            if instances.is_empty() {
                "-".into()
            } else {
                instances.join("; ")
            },
        ]);
    }
    rows
}
