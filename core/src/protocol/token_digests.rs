//! Tenant token digests, sent to agents so they check tokens themselves.
//!
//! Neither the region nor an agent keeps a tenant's token: both hold and
//! compare [`token_digest`]s, computed by this one function.

use crate::model::TenantId;
use serde::{Deserialize, Serialize};

/// The token digests of one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantTokens {
    /// The tenant.
    pub tenant: TenantId,
    /// SHA-256 of each valid token, lower-case hex.
    pub digests: Vec<String>,
}

/// Every tenant's token digests (a full replacement of the agent's copy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenDigests {
    /// Raft index of the state this was read from.
    pub applied_index: u64,
    /// One entry per tenant.
    pub tenants: Vec<TenantTokens>,
}

/// SHA-256 of `token`, lower-case hex: the form the region stores, sends to
/// agents, and looks a presented token up by.
pub fn token_digest(token: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in d.as_ref() {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out
}
