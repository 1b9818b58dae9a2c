//! openraft's network over a [`PeerTransport`]: Raft RPCs as request/reply
//! calls ([`PeerLinks`]: QUIC streams in a replica; the simulation's network
//! in `tests/src/sim`).

use std::time::Duration;

use gshare_raft_store::{ReplicaNode, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::peer_link::{LinkError, PeerLinks, PeerTransport};
use crate::wire::{PeerReply, PeerRequest};

/// Hands openraft one [`PeerChannel`] per target replica.
#[derive(Debug, Clone)]
pub struct RaftPeers<T> {
    links: T,
}

/// The replica's Raft network: over QUIC.
pub type QuicNetwork = RaftPeers<PeerLinks>;

impl<T: PeerTransport> RaftPeers<T> {
    /// A network that calls through `links`.
    pub fn new(links: T) -> Self {
        RaftPeers { links }
    }
}

/// The RPC channel to one target replica.
#[derive(Debug)]
pub struct PeerChannel<T> {
    links: T,
    target: u64,
    addr: String,
}

impl<T: PeerTransport> RaftNetworkFactory<TypeConfig> for RaftPeers<T> {
    type Network = PeerChannel<T>;

    async fn new_client(&mut self, target: u64, node: &ReplicaNode) -> PeerChannel<T> {
        PeerChannel {
            links: self.links.clone(),
            target,
            addr: node.raft_addr.clone(),
        }
    }
}

type RpcResult<T, E> = Result<T, RPCError<u64, ReplicaNode, E>>;

impl<T: PeerTransport> PeerChannel<T> {
    async fn call<E: std::error::Error>(
        &self,
        req: PeerRequest,
        ttl: Duration,
    ) -> RpcResult<PeerReply, E> {
        self.links
            .call(&self.addr, &req, ttl)
            .await
            .map_err(|e| match e {
                LinkError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                _ => RPCError::Network(NetworkError::new(&e)),
            })
    }

    fn unexpected<E: std::error::Error>(&self, reply: &PeerReply) -> RPCError<u64, ReplicaNode, E> {
        let e = std::io::Error::other(format!(
            "replica {} answered with the wrong reply kind: {reply:?}",
            self.target
        ));
        RPCError::Network(NetworkError::new(&e))
    }
}

impl<T: PeerTransport> RaftNetwork<TypeConfig> for PeerChannel<T> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, RaftError<u64>> {
        match self
            .call(PeerRequest::Append(rpc), option.hard_ttl())
            .await?
        {
            PeerReply::Append(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(self.unexpected(&other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> {
        match self
            .call(PeerRequest::Snapshot(rpc), option.hard_ttl())
            .await?
        {
            PeerReply::Snapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(self.unexpected(&other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, RaftError<u64>> {
        match self.call(PeerRequest::Vote(rpc), option.hard_ttl()).await? {
            PeerReply::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(self.unexpected(&other)),
        }
    }
}
