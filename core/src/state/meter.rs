//! Metered usage per tenant, summed per hour and bill line.
//!
//! ```text
//!   tenant ─▶ hour (end_ms ÷ 3_600_000) ─▶ [ (function, GPU model, pool kind, tier, price epoch) → Usage ]
//! ```
//!
//! Usage is summed exactly (integers); money is computed only when a bill
//! is asked for, once per bill line (see [`super::Bill`]).

use crate::config::Usage;
use crate::model::{PoolKind, TenantId, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Milliseconds in one metering hour.
pub const HOUR_MS: u64 = 3_600_000;

/// What one meter line is about (everything but the usage).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MeterKey {
    /// The hour (Unix ms ÷ [`HOUR_MS`]) the usage ended in.
    pub hour: u64,
    /// Function name.
    pub function: String,
    /// GPU model.
    pub gpu_model: String,
    /// Pool kind.
    pub pool_kind: PoolKind,
    /// Tier.
    pub tier: Tier,
    /// The price epoch in force when the usage ended.
    pub price_epoch: u32,
}

/// One line of the meter: a key and its summed usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterLine {
    /// What the usage is about.
    pub key: MeterKey,
    /// Summed usage.
    pub usage: Usage,
}

/// All metered usage of a region.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Meter {
    tenants: BTreeMap<TenantId, BTreeMap<u64, Vec<MeterLine>>>,
}

impl Meter {
    /// The usage summed so far under `key` for `tenant`.
    pub fn get(&self, tenant: &TenantId, key: &MeterKey) -> Usage {
        self.tenants
            .get(tenant)
            .and_then(|h| h.get(&key.hour))
            .and_then(|lines| lines.iter().find(|l| l.key == *key))
            .map_or_else(Usage::default, |l| l.usage)
    }

    /// Sets the usage under `key` for `tenant` (callers add with overflow checks first).
    pub(crate) fn set(&mut self, tenant: &TenantId, key: MeterKey, usage: Usage) {
        let lines = self
            .tenants
            .entry(tenant.clone())
            .or_default()
            .entry(key.hour)
            .or_default();
        match lines.iter_mut().find(|l| l.key == key) {
            Some(l) => l.usage = usage,
            None => lines.push(MeterLine { key, usage }),
        }
    }

    /// Whether the meter holds an entry for `tenant` (kept, possibly
    /// empty, when the tenant is deleted).
    pub fn has(&self, tenant: &TenantId) -> bool {
        self.tenants.contains_key(tenant)
    }

    /// Keeps an entry for `tenant` (empty if it has no usage yet), so that
    /// a deleted tenant's usage stays known and late records still apply.
    pub(crate) fn keep(&mut self, tenant: &TenantId) {
        self.tenants.entry(tenant.clone()).or_default();
    }

    /// The tenant's lines of the hours that start in `[from_ms, to_ms)`.
    pub fn lines<'a>(
        &'a self,
        tenant: &TenantId,
        from_ms: u64,
        to_ms: u64,
    ) -> impl Iterator<Item = &'a MeterLine> + 'a {
        let first = from_ms.div_ceil(HOUR_MS);
        let end = to_ms.div_ceil(HOUR_MS);
        self.tenants
            .get(tenant)
            .into_iter()
            .flat_map(move |h| h.range(first..end.max(first)))
            .flat_map(|(_, lines)| lines.iter())
    }
}
