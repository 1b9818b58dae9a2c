//! The validated tenants file: tenants and their quotas per pool kind.

use super::error::ConfigError;
use super::tenants_file::parse_tenants;
use crate::model::{PoolKind, Quota, TenantId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// Name, unique in the region (what URLs and tokens name).
    pub id: TenantId,
    /// Name for humans, if given.
    pub display_name: Option<String>,
    /// Quota per pool kind; a kind absent here has a zero quota.
    pub quotas: BTreeMap<PoolKind, Quota>,
}

impl Tenant {
    /// The tenant's quota in pools of `kind` (zero when the file sets none).
    pub fn quota(&self, kind: PoolKind) -> Quota {
        self.quotas.get(&kind).copied().unwrap_or_default()
    }
}

/// The tenants of a region, checked: names valid and unique, quotas in range.
///
/// Built only by [`Tenants::from_toml`]; read-only afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenants {
    tenants: Vec<Tenant>,
}

impl Tenants {
    /// Parses and validates a tenants file; `file` names it in messages.
    /// On failure the error lists every problem of the file.
    pub fn from_toml(file: &str, src: &str) -> Result<Tenants, ConfigError> {
        parse_tenants(file, src)
    }

    pub(crate) fn new(tenants: Vec<Tenant>) -> Self {
        Self { tenants }
    }

    /// All tenants, in file order.
    pub fn all(&self) -> &[Tenant] {
        &self.tenants
    }

    /// A tenant by name.
    pub fn get(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.id.0 == name)
    }

    /// A tenant's quota in pools of `kind`; `None` for an unknown tenant.
    pub fn quota(&self, tenant: &str, kind: PoolKind) -> Option<Quota> {
        self.get(tenant).map(|t| t.quota(kind))
    }
}
