//! `gsharectl node ls|describe|drain|undrain` (operator): the nodes'
//! liveness; one node's pool, GPUs, what is reserved on each, the
//! instances placed there and its agent's latest heartbeat (when the agent
//! is linked to the replica asked); draining a node (its instances are
//! placed elsewhere, make-before-break where the function's
//! `max_instances` allows).

use serde_json::Value;

use super::region_client::{cell, key_values, RegionArgs};

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
    /// List the nodes: state (pending, ready, not_ready), drained, agent
    /// version, last heartbeat, GPUs, instances.
    Ls,
    /// Show one node: pool, GPUs, reservations, instances, its agent.
    Describe {
        /// The node's name (as in the topology).
        node: String,
    },
    /// Drain a node: no new placements, its instances placed elsewhere.
    Drain {
        /// The node.
        node: String,
    },
    /// Let placements onto a drained node again.
    Undrain {
        /// The node.
        node: String,
    },
}

/// The `node ls` table.
fn rows(v: &Value) -> Vec<Vec<String>> {
    let mut out = vec![[
        "NODE",
        "POOL",
        "STATE",
        "DRAINING",
        "AGENT",
        "VERSION",
        "LAST HEARTBEAT",
        "GPUS",
        "INSTANCES",
    ]
    .map(String::from)
    .to_vec()];
    for n in v.as_array().into_iter().flatten() {
        let heartbeat = match n["last_heartbeat_ms_ago"].as_u64() {
            Some(ms) => format!("{:.1}s ago", ms as f64 / 1000.0),
            None => "-".into(),
        };
        let gpus = match n["gpus_unavailable"].as_u64() {
            Some(u) if u > 0 => format!("{} ({u} unavailable)", cell(&n["gpus"])),
            _ => cell(&n["gpus"]),
        };
        out.push(vec![
            cell(&n["node"]),
            cell(&n["pool"]),
            cell(&n["state"]),
            if n["draining"] == Value::Bool(true) {
                "yes".into()
            } else {
                "no".into()
            },
            cell(&n["agent"]["id"]),
            cell(&n["agent"]["version"]),
            heartbeat,
            gpus,
            cell(&n["instances"]),
        ]);
    }
    out
}

/// Runs `gsharectl node …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    match &a.command {
        NodeCommand::Ls => {
            let v = r.call("GET", "/v1/nodes", None)?;
            r.show(&v, rows);
        }
        NodeCommand::Describe { node } => describe(r, node)?,
        NodeCommand::Drain { node } => {
            let v = r.call("POST", &format!("/v1/nodes/{node}/drain"), None)?;
            r.show(&v, key_values);
        }
        NodeCommand::Undrain { node } => {
            let v = r.call("POST", &format!("/v1/nodes/{node}/undrain"), None)?;
            r.show(&v, key_values);
        }
    }
    Ok(())
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
