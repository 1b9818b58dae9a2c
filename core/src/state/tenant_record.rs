//! A tenant as the replicated state knows it: quotas and token digests.

use crate::model::{PoolKind, Quota, TenantId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One issued API token. Only the SHA-256 digest is stored (computed by
/// the API layer from the secret, lower-case hex); the secret never enters
/// the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// SHA-256 of the secret, 64 lower-case hex digits.
    pub digest: String,
    /// When it was issued (Unix ms).
    pub issued_at: u64,
}

/// One tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    /// Name, unique in the region.
    pub id: TenantId,
    /// Name for humans.
    pub display_name: Option<String>,
    /// Quota per pool kind; an absent kind has a zero quota.
    pub quotas: BTreeMap<PoolKind, Quota>,
    /// Tokens by their public id.
    pub tokens: BTreeMap<String, TokenRecord>,
    /// When it was created (Unix ms).
    pub created_at: u64,
}

impl TenantRecord {
    /// The tenant's quota in pools of `kind` (zero when none is set).
    pub fn quota(&self, kind: PoolKind) -> Quota {
        self.quotas.get(&kind).copied().unwrap_or_default()
    }
}
