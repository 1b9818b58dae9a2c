//! `gsharectl node ls|drain|undrain` (operator): the nodes' liveness, and
//! draining a node (its instances are placed elsewhere, make-before-break
//! where the function's `max_instances` allows).

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
