//! `--init`: the operators' topology and tenants files become the first
//! domain commands of a new region.
//!
//! Both files are parsed (every problem of each file reported) before the
//! replica starts; after the cluster exists, the commands are proposed once:
//! a region whose state already holds a topology is left alone, and a
//! repeated `TenantCreate` is refused as a duplicate, so `--init` stays
//! idempotent.

use std::time::Duration;

use gshare_core::command::{CommandOutcome, CommandV1, RegionCommand};
use gshare_core::config::{Tenants, Topology};
use gshare_core::state::DomainCommand;

use crate::config::ReplicaConfig;
use crate::replica::Replica;

/// Reads and validates the topology and tenants files named in `config`;
/// the error lists every problem of both files.
pub fn initial_commands(config: &ReplicaConfig) -> Result<Vec<DomainCommand>, String> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut problems = Vec::new();
    let topology = read(&config.topology).and_then(|text| {
        Topology::from_toml(&config.topology.display().to_string(), &text)
            .map_err(|e| e.to_string())
    });
    let tenants = read(&config.tenants).and_then(|text| {
        Tenants::from_toml(&config.tenants.display().to_string(), &text).map_err(|e| e.to_string())
    });
    if let Err(e) = &topology {
        problems.push(e.clone());
    }
    if let Err(e) = &tenants {
        problems.push(e.clone());
    }
    match (topology, tenants) {
        (Ok(t), Ok(ts)) => Ok(DomainCommand::initial(&t, &ts)),
        _ => Err(problems.join("\n")),
    }
}

/// Proposes `commands` unless the region already has a topology; retries
/// while no leader is known. Returns how many were applied.
pub async fn propose_initial(replica: &Replica, commands: Vec<DomainCommand>) -> usize {
    // Commit something first so this replica's view includes the log so far.
    loop {
        match replica
            .proposer
            .propose(RegionCommand::V1(CommandV1::Noop))
            .await
        {
            Ok(_) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if replica.state.read().region.domain().topology().is_some() {
        return 0;
    }
    let mut applied = 0;
    for cmd in commands {
        loop {
            match replica
                .proposer
                .propose(RegionCommand::domain(cmd.clone()))
                .await
            {
                Ok(CommandOutcome::Domain(Ok(_))) => {
                    applied += 1;
                    break;
                }
                Ok(CommandOutcome::Domain(Err(e))) => {
                    tracing::warn!("--init: {} refused: {e}", cmd.kind());
                    break;
                }
                Ok(other) => {
                    tracing::warn!("--init: unexpected outcome {other:?}");
                    break;
                }
                Err(e) if e.retryable() => tokio::time::sleep(Duration::from_millis(200)).await,
                Err(e) => {
                    tracing::warn!("--init: {} not proposed: {e}", cmd.kind());
                    break;
                }
            }
        }
    }
    applied
}
