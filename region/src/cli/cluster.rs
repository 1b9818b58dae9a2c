//! `gsharectl cluster`: status and membership of a running region.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::region_client::{cell, print_table, RegionArgs};
use crate::http_client::{request_to, HttpReply, HttpTarget};

/// `gsharectl cluster …`: the same `--region/--token/--ca/--json` (and
/// `GSHARE_*` variables) as every region command; `--at ip:port` still
/// works (an alias of `--region`). A `--ca` without an `https://` region
/// speaks HTTPS to `host:port`, as before.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ClusterCommand {
    /// Print the replica's view: role, leader, term, commit index, members.
    Status,
    /// Add a replica: first as a learner (it catches up), then as a voter.
    AddReplica {
        /// Raft id of the new replica.
        #[arg(long)]
        id: u64,
        /// Its QUIC address (ip:port).
        #[arg(long)]
        raft_addr: SocketAddr,
        /// Its HTTP address (ip:port).
        #[arg(long)]
        http_addr: SocketAddr,
    },
    /// Remove a replica from the membership.
    RemoveReplica {
        /// Raft id of the replica to remove.
        #[arg(long)]
        id: u64,
    },
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends an operator request to the leader, following `421` redirects and
/// retrying while no leader is known.
fn to_leader(
    start: &HttpTarget,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> anyhow::Result<HttpReply> {
    let mut at = start.clone();
    for attempt in 0..10 {
        let reply = request_to(&at, method, path, Some(token), body, TIMEOUT)?;
        let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap_or_default();
        // A refused membership change (503 `membership`, e.g. another one in
        // progress) is the leader's answer: shown, not retried.
        let refused = v["error"]["code"].as_str() == Some("membership");
        match reply.status {
            421 | 503 if !refused => {
                // `error.leader_http`; older replicas put it at the top level.
                if let Some(leader) = v["error"]
                    .get("leader_http")
                    .or_else(|| v.get("leader_http"))
                    .and_then(|l| l.as_str())
                    .and_then(|l| l.parse::<SocketAddr>().ok())
                {
                    at = start.at(leader);
                }
                if attempt > 0 {
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
            _ => return Ok(reply),
        }
    }
    anyhow::bail!("no leader answered (last tried {at:?})")
}

fn print(r: &RegionArgs, reply: &HttpReply) -> anyhow::Result<()> {
    let v = serde_json::from_str::<Value>(&reply.body).ok();
    if !(200..300).contains(&reply.status) {
        let e = v.as_ref().map(|v| &v["error"]);
        anyhow::bail!(
            "{} {}: {}",
            reply.status,
            e.and_then(|e| e["code"].as_str()).unwrap_or("error"),
            e.and_then(|e| e["message"].as_str()).unwrap_or(&reply.body)
        );
    }
    match v {
        Some(v) if !r.json => print_table(&status_rows(&v)),
        Some(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        None => println!("{}", reply.body),
    }
    Ok(())
}

/// `key: value` lines, then the members as a table.
fn status_rows(v: &Value) -> Vec<Vec<String>> {
    let Some(m) = v.as_object() else {
        return vec![vec![cell(v)]];
    };
    let mut rows: Vec<Vec<String>> = m
        .iter()
        .filter(|(k, _)| k.as_str() != "members")
        .map(|(k, v)| vec![format!("{k}:"), cell(v)])
        .collect();
    if let Some(members) = v["members"].as_array() {
        rows.push(vec![]);
        let keys: Vec<String> = members
            .first()
            .and_then(Value::as_object)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        rows.push(
            keys.iter()
                .map(|k| format!("MEMBER {}", k.to_uppercase()))
                .collect(),
        );
        for mem in members {
            rows.push(keys.iter().map(|k| cell(&mem[k])).collect());
        }
    }
    rows
}

/// The replica to start from: `--region`/`$GSHARE_REGION`; a plain
/// `host:port` with `--ca`/`$GSHARE_CA` speaks HTTPS (the old `--at … --ca`).
fn start(r: &RegionArgs) -> anyhow::Result<HttpTarget> {
    let target = r.target()?;
    let raw = r
        .region
        .clone()
        .or_else(|| std::env::var("GSHARE_REGION").ok())
        .unwrap_or_default();
    let ca =
        r.ca.clone()
            .or_else(|| std::env::var_os("GSHARE_CA").map(PathBuf::from));
    match ca {
        Some(ca) if !target.is_tls() && !raw.contains("://") => Ok(HttpTarget::tls(
            target.addr,
            std::sync::Arc::new(crate::tls::http_client_config(&ca)?),
        )),
        _ => Ok(target),
    }
}

/// Runs `gsharectl cluster …`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let r = &args.region;
    let at = start(r)?;
    match &args.command {
        ClusterCommand::Status => print(
            r,
            &request_to(&at, "GET", "/v1/cluster", None, None, TIMEOUT)?,
        ),
        ClusterCommand::AddReplica {
            id,
            raft_addr,
            http_addr,
        } => {
            let body = serde_json::json!({ "id": id, "raft_addr": raft_addr.to_string(), "http_addr": http_addr.to_string() });
            print(
                r,
                &to_leader(
                    &at,
                    "POST",
                    "/v1/cluster/replicas",
                    &r.token()?,
                    Some(&body.to_string()),
                )?,
            )
        }
        ClusterCommand::RemoveReplica { id } => print(
            r,
            &to_leader(
                &at,
                "DELETE",
                &format!("/v1/cluster/replicas/{id}"),
                &r.token()?,
                None,
            )?,
        ),
    }
}
