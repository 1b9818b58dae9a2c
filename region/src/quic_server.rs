//! The QUIC side of a replica: accepts peers (mutual TLS) and answers their
//! requests, one request/reply frame pair per stream.
//!
//! A connection whose peer fails the CA check never gets a request through:
//! with TLS 1.3 the refusal arrives when the first stream is used. The CA
//! signs the agents' certificates too: a connection on the peer protocol
//! is closed at once unless its certificate names a replica (`r<id>`);
//! an agent's speaks the agents' protocol. A stream
//! carrying an oversized or malformed frame closes its connection; other
//! connections are untouched. Garbage datagrams never reach this code:
//! quinn drops packets that do not authenticate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gshare_raft_store::TypeConfig;
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::Raft;

use crate::wire::{
    read_frame, write_frame, PeerReply, PeerRequest, WireError, WriteRefusal, BAD_FRAME,
};

/// Counters of the QUIC server, shown in `/metrics`.
#[derive(Debug, Default)]
pub struct QuicCounters {
    /// Connections accepted (TLS handshake done).
    pub connections: AtomicU64,
    /// Handshakes that failed.
    pub handshake_failures: AtomicU64,
    /// Requests answered.
    pub requests: AtomicU64,
    /// Connections closed because of a bad frame.
    pub bad_frames: AtomicU64,
    /// Connections on the peer protocol refused: their certificate is not
    /// a replica's (`r<id>`).
    pub peers_refused: AtomicU64,
}

/// The close code of a connection whose certificate is not a replica's.
pub const NOT_A_PEER: u32 = 0x11;

/// The replica id a peer certificate's name proves: a replica's is named
/// `r<id>` (`gsharectl certs issue --name r<id>`; the topology names no
/// node so, and an agent's certificate names its node). Any replica's is
/// taken, member or not: a replica whose membership lags (back after a
/// replacement) must still take the current leader's.
fn peer_replica(name: &str) -> Result<u64, String> {
    gshare_core::config::replica_id(name).ok_or_else(|| {
        format!(
            "its certificate names {name:?}, not a replica (r<id>): an agent's or another client's certificate is not a peer"
        )
    })
}

/// Accepts connections on `endpoint` until it is closed: agents (their
/// ALPN) to the agents' hub, replicas (their certificates: `r<id>`)
/// to the peer requests; any other certificate of the CA is refused.
pub async fn serve(
    endpoint: quinn::Endpoint,
    raft: Raft<TypeConfig>,
    counters: Arc<QuicCounters>,
    agents: crate::agents::AgentHub,
    scheduler: crate::scheduler::Scheduler,
) {
    while let Some(incoming) = endpoint.accept().await {
        let raft = raft.clone();
        let scheduler = scheduler.clone();
        let agents = agents.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    counters.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("QUIC handshake failed: {e}");
                    return;
                }
            };
            counters.connections.fetch_add(1, Ordering::Relaxed);
            let alpn = conn
                .handshake_data()
                .and_then(|h| h.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
                .and_then(|h| h.protocol);
            if alpn.as_deref() == Some(gshare_core::protocol::AGENT_ALPN) {
                crate::agents::serve_agent(conn, agents).await;
                return;
            }
            // The peer requests write the replicated state and drive Raft:
            // only a replica's certificate (the agents' come from the same CA).
            let admitted = crate::tls::peer_name(&conn).and_then(|name| peer_replica(&name));
            if let Err(why) = admitted {
                counters.peers_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "refusing a peer connection from {}: {why}",
                    conn.remote_address()
                );
                conn.close(quinn::VarInt::from_u32(NOT_A_PEER), b"not a replica");
                return;
            }
            while let Ok((send, recv)) = conn.accept_bi().await {
                tokio::spawn(answer(
                    agents.clone(),
                    conn.clone(),
                    send,
                    recv,
                    raft.clone(),
                    counters.clone(),
                    scheduler.clone(),
                ));
            }
        });
    }
}

async fn answer(
    agents: crate::agents::AgentHub,
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    raft: Raft<TypeConfig>,
    counters: Arc<QuicCounters>,
    scheduler: crate::scheduler::Scheduler,
) {
    let req = match read_frame::<PeerRequest>(&mut recv).await {
        Ok(r) => r,
        Err(e @ WireError::Frame(_)) => {
            counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("closing connection from {}: {e}", conn.remote_address());
            conn.close(quinn::VarInt::from_u32(BAD_FRAME), b"bad frame");
            return;
        }
        Err(WireError::Stream(_)) => return,
    };
    let reply = match req {
        PeerRequest::Append(_)
        | PeerRequest::Vote(_)
        | PeerRequest::Snapshot(_)
        | PeerRequest::Write(_)
        | PeerRequest::ReadIndex => {
            match answer_raft(&raft, req, || agents.clock.unix_ms()).await {
                Ok(reply) => reply,
                Err(other) => {
                    tracing::error!("answer_raft refused a Raft request: {other:?}");
                    return;
                }
            }
        }
        // Only the leader's worker plans; elsewhere `NoLeader` (the sender retries).
        PeerRequest::Evaluate(eval) => PeerReply::Evaluate(scheduler.submit_here(eval).await),
        PeerRequest::Delivered(node) => PeerReply::Delivered(agents.delivered_to(&node)),
        PeerRequest::AgentReports => PeerReply::AgentReports(agents.local_part()),
        PeerRequest::Heard => PeerReply::Heard(agents.heard_ages()),
        PeerRequest::Decision { tenant, function } => {
            PeerReply::Decision(scheduler.local_decision(&tenant, &function))
        }
    };
    counters.requests.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = write_frame(&mut send, &reply).await {
        tracing::debug!("reply to {} lost: {e}", conn.remote_address());
    }
}

/// Answers the requests that only need this replica's Raft (Raft RPCs, a
/// forwarded write stamped with `now_ms()`, a read index); any other
/// request comes back as `Err`. The QUIC server and the simulation's
/// network (`tests/src/sim`) both answer through it.
pub async fn answer_raft(
    raft: &Raft<TypeConfig>,
    req: PeerRequest,
    now_ms: impl Fn() -> u64,
) -> Result<PeerReply, PeerRequest> {
    Ok(match req {
        PeerRequest::Append(rpc) => PeerReply::Append(raft.append_entries(rpc).await),
        PeerRequest::Vote(rpc) => PeerReply::Vote(raft.vote(rpc).await),
        PeerRequest::Snapshot(rpc) => PeerReply::Snapshot(raft.install_snapshot(rpc).await),
        PeerRequest::Write(mut batch) => PeerReply::Write({
            batch.stamp(now_ms());
            let before = crate::proposer::BeforeWrite::of(raft);
            // `Failed`: the forwarding replica answers the outcome unknown.
            match crate::proposer::client_write_within(raft, batch).await {
                None => Err(WriteRefusal::Failed(
                    crate::proposer::NOT_COMMITTED_IN_TIME.into(),
                )),
                Some(Ok(resp)) => Ok(resp.data),
                Some(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))))
                    if crate::proposer::refusal_may_hide_a_commit(raft, before).await =>
                {
                    Err(WriteRefusal::Failed(
                        crate::proposer::TRUNCATED_MAY_COMMIT.into(),
                    ))
                }
                Some(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                    Err(WriteRefusal::NotLeader {
                        leader: f.leader_id,
                    })
                }
                Some(Err(e)) => Err(WriteRefusal::Failed(e.to_string())),
            }
        }),
        // Leadership confirmed by a quorum; the follower waits for its own apply.
        PeerRequest::ReadIndex => PeerReply::ReadIndex(match raft.get_read_log_id().await {
            Ok((read, _applied)) => Ok(read.map(|l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(WriteRefusal::NotLeader {
                    leader: f.leader_id,
                })
            }
            Err(e) => Err(WriteRefusal::Failed(e.to_string())),
        }),
        other => return Err(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which names are replicas' is `config::replica_id`'s (tested there);
    /// a refusal says why.
    #[test]
    fn only_a_replicas_certificate_is_a_peer() {
        // Member or not (back after a replacement, or being added).
        assert_eq!(peer_replica("r17"), Ok(17));
        // An agent's certificate (its node's name) is no peer's.
        let e = peer_replica("gpu-node-7").unwrap_err();
        assert!(e.contains("\"gpu-node-7\", not a replica"), "{e}");
    }
}
