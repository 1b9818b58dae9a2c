//! `gsharectl cluster`: status and membership of a running region.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::http_client::{request_to, HttpReply, HttpTarget};

/// `gsharectl cluster …`
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HTTP address (ip:port) of any replica.
    #[arg(long, global = true, default_value = "127.0.0.1:8101")]
    at: SocketAddr,
    /// Operator bearer token (membership changes).
    #[arg(long, global = true)]
    token: Option<String>,
    /// Speak HTTPS to the replicas, trusting this CA certificate (PEM)
    /// (default: `$GSHARE_CA`; neither: plain HTTP).
    #[arg(long, global = true)]
    ca: Option<PathBuf>,
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
        match reply.status {
            421 | 503 => {
                let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap_or_default();
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

fn print(reply: &HttpReply) -> anyhow::Result<()> {
    let pretty = serde_json::from_str::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| reply.body.clone());
    if (200..300).contains(&reply.status) {
        println!("{pretty}");
        Ok(())
    } else {
        anyhow::bail!("HTTP {}: {pretty}", reply.status)
    }
}

/// Runs `gsharectl cluster …`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let token = || {
        args.token
            .clone()
            .ok_or_else(|| anyhow::anyhow!("--token <operator token> is required"))
    };
    let ca = args
        .ca
        .clone()
        .or_else(|| std::env::var_os("GSHARE_CA").map(PathBuf::from));
    let at = match ca {
        None => HttpTarget::plain(args.at),
        Some(ca) => HttpTarget::tls(
            args.at,
            std::sync::Arc::new(crate::tls::http_client_config(&ca)?),
        ),
    };
    match &args.command {
        ClusterCommand::Status => {
            print(&request_to(&at, "GET", "/v1/cluster", None, None, TIMEOUT)?)
        }
        ClusterCommand::AddReplica {
            id,
            raft_addr,
            http_addr,
        } => {
            let body = serde_json::json!({ "id": id, "raft_addr": raft_addr.to_string(), "http_addr": http_addr.to_string() });
            print(&to_leader(
                &at,
                "POST",
                "/v1/cluster/replicas",
                &token()?,
                Some(&body.to_string()),
            )?)
        }
        ClusterCommand::RemoveReplica { id } => print(&to_leader(
            &at,
            "DELETE",
            &format!("/v1/cluster/replicas/{id}"),
            &token()?,
            None,
        )?),
    }
}
