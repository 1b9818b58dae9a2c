//! Tenant token digests, sent to agents so they check tokens themselves.

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
