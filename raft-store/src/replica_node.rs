//! The address card of one replica, stored in Raft membership.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a replica listens: Raft over QUIC and its HTTP API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaNode {
    /// `host:port` of the QUIC endpoint (Raft RPC and forwarded writes).
    pub raft_addr: String,
    /// `host:port` of the HTTP API.
    pub http_addr: String,
}

impl fmt::Display for ReplicaNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft={} http={}", self.raft_addr, self.http_addr)
    }
}
