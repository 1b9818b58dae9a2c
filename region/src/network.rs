//! openraft's network over a [`PeerTransport`]: Raft RPCs as request/reply
//! calls ([`PeerLinks`]: QUIC streams in a replica; the simulation's network
//! in `tests/src/sim`).

use std::time::Duration;

use gshare_raft_store::{ReplicaNode, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::peer_link::{LinkError, PeerLinks, PeerTransport};
use crate::wire::{FrameError, PeerReply, PeerRequest, WireError};

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
            .map_err(|e| Self::link_error(&e))
    }

    fn link_error<E: std::error::Error>(e: &LinkError) -> RPCError<u64, ReplicaNode, E> {
        match e {
            LinkError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(e)),
            _ => RPCError::Network(NetworkError::new(e)),
        }
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
        let entries = rpc.entries.len() as u64;
        let reply = self
            .links
            .call(&self.addr, &PeerRequest::Append(rpc), option.hard_ttl())
            .await;
        // Over the frame limit: openraft sends fewer entries at once (it
        // retries the same range forever on any other error, and the
        // follower would never catch up). One entry over it cannot be split.
        if let Err(LinkError::Call {
            source: WireError::Frame(FrameError::Oversized { len, limit }),
            ..
        }) = &reply
        {
            if entries > 1 {
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(fewer_entries(entries, *len, *limit)),
                ));
            }
        }
        match reply.map_err(|e| Self::link_error(&e))? {
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

/// How many of `entries` entries to send at once when all of them encode
/// to `len` bytes, over the frame's `limit`: in proportion, with a margin,
/// at least one and fewer than before.
fn fewer_entries(entries: u64, len: usize, limit: usize) -> u64 {
    let share = (entries as u128 * limit as u128 / (len.max(1) as u128 * 2)) as u64;
    share.clamp(1, entries.saturating_sub(1).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_append_is_split_in_proportion() {
        // 256 entries of 64 MiB against 16 MiB: 32 (half the share).
        assert_eq!(fewer_entries(256, 64 << 20, 16 << 20), 32);
        // Barely over: fewer all the same.
        assert_eq!(fewer_entries(10, (16 << 20) + 1, 16 << 20), 4);
        assert_eq!(fewer_entries(2, 1 << 30, 16 << 20), 1);
        assert_eq!(fewer_entries(3, 20 << 20, 16 << 20), 1);
    }
}
