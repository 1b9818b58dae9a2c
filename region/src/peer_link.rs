//! Outgoing QUIC connections to other replicas, one per address, reused.
//!
//! Every call opens a fresh bidirectional stream on the cached connection
//! (streams are cheap in QUIC), sends one [`PeerRequest`] frame and reads one
//! [`PeerReply`] frame. A failed connection is dropped from the cache and the
//! next call dials again.
//!
//! Each peer's reachability is logged once per change, not per call: a
//! replica not up yet is `info` ("waiting for"), one that answered before
//! and stops is `warn`, and its return is `info`. (openraft's own error per
//! failed vote or replication RPC is dropped from the default log for that
//! reason: see `gshare-region`'s `main.rs`.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::wire::{read_frame, write_frame, PeerReply, PeerRequest, WireError};

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The address could not be used or the peer could not be reached.
    #[error("cannot reach {addr}: {detail}")]
    Unreachable {
        /// The peer's address.
        addr: String,
        /// What went wrong.
        detail: String,
    },
    /// The exchange failed after the connection was up.
    #[error("call to {addr} failed: {source}")]
    Call {
        /// The peer's address.
        addr: String,
        /// The frame or stream error.
        source: WireError,
    },
    /// No reply within the deadline.
    #[error("call to {addr} timed out")]
    Timeout {
        /// The peer's address.
        addr: String,
    },
}

/// What is known of one peer's reachability.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerHealth {
    /// A call to it succeeded at least once.
    pub reached: bool,
    /// Failed calls in a row.
    pub failures: u32,
    /// The change last reported, while the peer is down.
    pub reported: Option<PeerChange>,
}

/// A change worth one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerChange {
    /// The first calls fail: the peer has not come up (yet).
    NotUpYet,
    /// A peer that answered before failed [`PeerHealth::LOST_AFTER`] calls in a row.
    Lost,
    /// A peer reported as not up yet answers.
    Up,
    /// A peer reported as lost answers again.
    Back,
}

impl PeerHealth {
    /// Failed calls in a row after which a peer that answered before is
    /// reported lost (one timed-out call while it is busy is not news).
    pub const LOST_AFTER: u32 = 2;

    /// Records one call's outcome; returns the change, if it is one.
    pub fn record(&mut self, ok: bool) -> Option<PeerChange> {
        if ok {
            self.reached = true;
            self.failures = 0;
            return match self.reported.take() {
                Some(PeerChange::NotUpYet) => Some(PeerChange::Up),
                Some(PeerChange::Lost) => Some(PeerChange::Back),
                _ => None,
            };
        }
        self.failures = self.failures.saturating_add(1);
        if self.reported.is_some() {
            return None;
        }
        let change = if !self.reached {
            PeerChange::NotUpYet
        } else if self.failures >= Self::LOST_AFTER {
            PeerChange::Lost
        } else {
            return None;
        };
        self.reported = Some(change);
        Some(change)
    }
}

/// How a replica calls another: one request, one reply, within `ttl`.
/// [`PeerLinks`] over QUIC in a replica; the deterministic simulation's
/// network (`tests/src/sim`) in one process.
pub trait PeerTransport: Clone + Send + Sync + 'static {
    /// Sends `req` to the replica at `addr` and waits up to `ttl` for its reply.
    fn call(
        &self,
        addr: &str,
        req: &PeerRequest,
        ttl: Duration,
    ) -> impl std::future::Future<Output = Result<PeerReply, LinkError>> + Send;
}

impl PeerTransport for PeerLinks {
    async fn call(
        &self,
        addr: &str,
        req: &PeerRequest,
        ttl: Duration,
    ) -> Result<PeerReply, LinkError> {
        PeerLinks::call(self, addr, req, ttl).await
    }
}

/// The replica's outgoing connections.
#[derive(Debug, Clone)]
pub struct PeerLinks {
    endpoint: quinn::Endpoint,
    conns: Arc<Mutex<HashMap<String, quinn::Connection>>>,
    health: Arc<Mutex<HashMap<String, PeerHealth>>>,
}

impl PeerLinks {
    /// Uses `endpoint` (with a default client config set) to dial peers.
    pub fn new(endpoint: quinn::Endpoint) -> Self {
        PeerLinks {
            endpoint,
            conns: Arc::new(Mutex::new(HashMap::new())),
            health: Arc::default(),
        }
    }

    async fn connection(&self, addr: &str) -> Result<quinn::Connection, LinkError> {
        if let Some(c) = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(addr)
        {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let unreachable = |detail: String| LinkError::Unreachable {
            addr: addr.to_string(),
            detail,
        };
        let sock: SocketAddr = addr
            .parse()
            .map_err(|_| unreachable("not an ip:port address".into()))?;
        let server_name = sock.ip().to_string();
        let connecting = self
            .endpoint
            .connect(sock, &server_name)
            .map_err(|e| unreachable(e.to_string()))?;
        let conn = connecting.await.map_err(|e| unreachable(e.to_string()))?;
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr.to_string(), conn.clone());
        Ok(conn)
    }

    fn forget(&self, addr: &str) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(addr);
    }

    /// Sends `req` to the replica at `addr` and waits up to `ttl` for its reply.
    pub async fn call(
        &self,
        addr: &str,
        req: &PeerRequest,
        ttl: Duration,
    ) -> Result<PeerReply, LinkError> {
        let exchange = async {
            let conn = self.connection(addr).await?;
            let call_err = |source| LinkError::Call {
                addr: addr.to_string(),
                source,
            };
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| call_err(WireError::Stream(e.to_string())))?;
            write_frame(&mut send, req).await.map_err(call_err)?;
            read_frame::<PeerReply>(&mut recv).await.map_err(call_err)
        };
        let result = match tokio::time::timeout(ttl, exchange).await {
            Ok(r) => r,
            Err(_) => Err(LinkError::Timeout {
                addr: addr.to_string(),
            }),
        };
        if matches!(
            result,
            Err(LinkError::Call { .. }) | Err(LinkError::Unreachable { .. })
        ) {
            self.forget(addr);
        }
        self.note(addr, result.as_ref().err());
        result
    }

    /// Logs `addr`'s reachability when it changes.
    fn note(&self, addr: &str, error: Option<&LinkError>) {
        let change = self
            .health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr.to_string())
            .or_default()
            .record(error.is_none());
        match (change, error) {
            (Some(PeerChange::NotUpYet), Some(e)) => {
                tracing::info!(peer = addr, "waiting for the replica to come up ({e})")
            }
            (Some(PeerChange::Lost), Some(e)) => {
                tracing::warn!(peer = addr, "replica stopped answering ({e}); retrying")
            }
            (Some(PeerChange::Up), _) => tracing::info!(peer = addr, "replica is up"),
            (Some(PeerChange::Back), _) => tracing::info!(peer = addr, "replica answers again"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reachability_is_reported_once_per_change() {
        let mut h = PeerHealth::default();
        assert_eq!(h.record(false), Some(PeerChange::NotUpYet));
        assert_eq!(h.record(false), None, "no repeat while it stays down");
        assert_eq!(h.record(true), Some(PeerChange::Up));
        assert_eq!(h.record(true), None);
        assert_eq!(h.record(false), None, "one failed call is not news");
        assert_eq!(h.record(true), None);
        assert_eq!(h.record(false), None);
        assert_eq!(h.record(false), Some(PeerChange::Lost));
        assert_eq!(h.record(false), None);
        assert_eq!(h.record(true), Some(PeerChange::Back));
        let mut fresh = PeerHealth::default();
        assert_eq!(fresh.record(true), None, "a first success is no news");
    }
}
