//! A tenant's bill for a period: metered usage × price, integers only.
//!
//! ```text
//!   meter lines of the hours starting in [from, to)
//!     ─▶ summed per (price epoch, GPU model, pool kind, tier)      (exact u64 sums)
//!     ─▶ charge = PriceList(epoch).quote(model, kind, tier, sum)   (one rounding per part)
//!     ─▶ total  = Σ charges      (every list of the period in one currency and unit,
//!                                 else refused: `mixed_units`)
//! ```
//!
//! The pricing rule itself is [`crate::config::pricing`]'s.

use super::meter::Meter;
use super::price_history::PriceHistory;
use super::query_error::QueryError;
use crate::config::{Charge, Money, PricingError, Usage};
use crate::model::{PoolKind, TenantId, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One priced line of a bill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BillLine {
    /// The price epoch the usage was priced with.
    pub price_epoch: u32,
    /// GPU model.
    pub gpu_model: String,
    /// Pool kind.
    pub pool_kind: PoolKind,
    /// Tier.
    pub tier: Tier,
    /// Summed usage.
    pub usage: Usage,
    /// What it costs.
    pub charge: Charge,
}

/// Usage of one function in a period (unpriced; for the tenant's view).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionUsage {
    /// Function name.
    pub function: String,
    /// Summed usage.
    pub usage: Usage,
}

/// A tenant's bill for `[from_ms, to_ms)` (hours that start in it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bill {
    /// The tenant.
    pub tenant: TenantId,
    /// Period start (Unix ms, inclusive).
    pub from_ms: u64,
    /// Period end (Unix ms, exclusive).
    pub to_ms: u64,
    /// Currency of the lines' price lists (e.g. `USD`; with no lines, the
    /// newest list's).
    pub currency: String,
    /// The unit all amounts are in (e.g. `micro-USD`).
    pub unit: String,
    /// How many units make one currency unit (e.g. `1000000`).
    pub units_per_currency: u64,
    /// Priced lines, sorted by epoch, GPU model, pool kind, tier.
    pub lines: Vec<BillLine>,
    /// Usage per function.
    pub functions: Vec<FunctionUsage>,
    /// Sum of the lines' totals.
    pub total: Money,
}

impl Bill {
    /// Prices `tenant`'s metered usage in the period.
    pub fn compute(
        meter: &Meter,
        prices: &PriceHistory,
        tenant: &TenantId,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Bill, QueryError> {
        let pricing = |source| QueryError::Pricing {
            tenant: tenant.clone(),
            source,
        };
        let mut sums: BTreeMap<(u32, String, PoolKind, Tier), Usage> = BTreeMap::new();
        let mut by_function: BTreeMap<String, Usage> = BTreeMap::new();
        for line in meter.lines(tenant, from_ms, to_ms) {
            let k = &line.key;
            let sum = sums
                .entry((k.price_epoch, k.gpu_model.clone(), k.pool_kind, k.tier))
                .or_default();
            *sum = sum
                .checked_add(&line.usage)
                .ok_or(pricing(PricingError::Overflow))?;
            let f = by_function.entry(k.function.clone()).or_default();
            *f = f
                .checked_add(&line.usage)
                .ok_or(pricing(PricingError::Overflow))?;
        }
        let mut lines = Vec::with_capacity(sums.len());
        let mut total: Money = 0;
        // The first line's list: every other must count in its currency
        // and unit for the total to mean anything.
        let mut money: Option<(u32, &str, &str, u64)> = None;
        for ((price_epoch, gpu_model, pool_kind, tier), usage) in sums {
            let list = prices.list(price_epoch).ok_or_else(|| {
                pricing(PricingError::NoPrice {
                    gpu_model: gpu_model.clone(),
                    pool_kind,
                })
            })?;
            let this = (
                price_epoch,
                list.currency.as_str(),
                list.unit.as_str(),
                list.units_per_currency,
            );
            let first = *money.get_or_insert(this);
            if (first.1, first.2, first.3) != (this.1, this.2, this.3) {
                let words = |(_, currency, unit, per): (u32, &str, &str, u64)| {
                    format!("{currency} ({unit}, {per} per {currency})")
                };
                return Err(QueryError::MixedUnits {
                    tenant: tenant.clone(),
                    first_epoch: first.0,
                    first: words(first),
                    other_epoch: this.0,
                    other: words(this),
                });
            }
            let charge = list
                .quote(&gpu_model, pool_kind, tier, &usage)
                .map_err(pricing)?;
            total = total
                .checked_add(charge.total)
                .ok_or(pricing(PricingError::Overflow))?;
            lines.push(BillLine {
                price_epoch,
                gpu_model,
                pool_kind,
                tier,
                usage,
                charge,
            });
        }
        let (currency, unit, units_per_currency) = match money {
            Some((_, currency, unit, per)) => (currency.to_string(), unit.to_string(), per),
            None => prices
                .current()
                .map(|l| (l.currency.clone(), l.unit.clone(), l.units_per_currency))
                .unwrap_or_default(),
        };
        Ok(Bill {
            tenant: tenant.clone(),
            from_ms,
            to_ms,
            currency,
            unit,
            units_per_currency,
            lines,
            functions: by_function
                .into_iter()
                .map(|(function, usage)| FunctionUsage { function, usage })
                .collect(),
            total,
        })
    }
}
