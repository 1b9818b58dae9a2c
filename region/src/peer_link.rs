//! Outgoing QUIC connections to other replicas, one per address, reused.
//!
//! Every call opens a fresh bidirectional stream on the cached connection
//! (streams are cheap in QUIC), sends one [`PeerRequest`] frame and reads one
//! [`PeerReply`] frame. A failed connection is dropped from the cache and the
//! next call dials again.

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

/// The replica's outgoing connections.
#[derive(Debug, Clone)]
pub struct PeerLinks {
    endpoint: quinn::Endpoint,
    conns: Arc<Mutex<HashMap<String, quinn::Connection>>>,
}

impl PeerLinks {
    /// Uses `endpoint` (with a default client config set) to dial peers.
    pub fn new(endpoint: quinn::Endpoint) -> Self {
        PeerLinks {
            endpoint,
            conns: Arc::new(Mutex::new(HashMap::new())),
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
        result
    }
}
