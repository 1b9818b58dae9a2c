//! Why a read of the state found nothing or could not be answered.

use super::error::ObjectKind;
use crate::config::PricingError;
use crate::model::TenantId;

/// A read that cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// No such object for this tenant (another tenant's looks the same).
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// What was looked for.
        kind: ObjectKind,
        /// Its name.
        name: String,
    },
    /// A bill line cannot be priced.
    #[error("bill of tenant {tenant} cannot be priced: {source}")]
    Pricing {
        /// The tenant.
        tenant: TenantId,
        /// Why.
        source: PricingError,
    },
    /// The period's usage was priced with lists in different currencies
    /// or units, whose amounts do not add up to one total.
    #[error(
        "bill of tenant {tenant}: its usage was priced in {first} (price epoch {first_epoch}) and \
         in {other} (price epoch {other_epoch}), which do not add up; ask for the periods before \
         and after the change of price list separately"
    )]
    MixedUnits {
        /// The tenant.
        tenant: TenantId,
        /// The first list's epoch in the period.
        first_epoch: u32,
        /// Its currency and unit, e.g. `USD (micro-USD, 1000000 per USD)`.
        first: String,
        /// The first epoch in the period with another currency or unit.
        other_epoch: u32,
        /// Its currency and unit.
        other: String,
    },
}

impl QueryError {
    /// The stable code an API puts in `{"error": {"code": ..}}`.
    pub fn code(&self) -> &'static str {
        match self {
            QueryError::NotFound { kind, .. } => match kind {
                ObjectKind::Tenant => "unknown_tenant",
                ObjectKind::Function => "unknown_function",
                ObjectKind::Token => "unknown_token",
                ObjectKind::Agent => "unknown_agent",
            },
            QueryError::Pricing { .. } => "no_price",
            QueryError::MixedUnits { .. } => "mixed_units",
        }
    }
}
