//! The price list and the pricing rule: integers only, no floats in money.
//!
//! Money is counted in the smallest unit the operator names in the
//! topology file (e.g. micro-USD: 1 USD = 1,000,000 units). A price is set
//! per (GPU model, pool kind) for two metered quantities, and each tier
//! takes a discount in basis points (1 bp = 0.01 %):
//!
//! ```text
//!   compute = round( compute_milli_gpu_ms × gpu_hour        × (10000 − bp)
//!                    ÷ (1000 milli-GPU × 3_600_000 ms × 10000) )
//!   memory  = round( memory_mib_ms        × memory_gib_hour × (10000 − bp)
//!                    ÷ (1024 MiB × 3_600_000 ms × 10000) )
//!   total   = compute + memory
//! ```
//!
//! Each part is computed exactly in `u128` and rounded once to the nearest
//! unit, halves rounding up. Rounding per call means a bill should price
//! the *summed* usage of each (tenant, period, GPU model, pool kind, tier)
//! line, not every usage record on its own.
//!
//! Every step is checked: a charge past [`Money`] is
//! [`PricingError::Overflow`], never a wrapped amount.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use crate::model::{PoolKind, Tier};
use serde::{Deserialize, Serialize};

/// An amount of money in the price list's smallest unit.
pub type Money = u64;

/// Basis points in one whole (100 %).
pub const BP_PER_WHOLE: u32 = 10_000;
/// Milli-GPU milliseconds in one GPU-hour.
pub const MILLI_GPU_MS_PER_GPU_HOUR: u128 = 1_000 * 3_600_000;
/// MiB milliseconds in one GiB-hour.
pub const MIB_MS_PER_GIB_HOUR: u128 = 1_024 * 3_600_000;
pub use crate::bounds::MAX_PRICE;

/// The price of one GPU model in one pool kind, before the tier's discount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    /// GPU model name (from the topology's `gpu_models`).
    pub gpu_model: String,
    /// Pool kind the price applies to.
    pub pool_kind: PoolKind,
    /// Price of one whole GPU's compute busy for one hour.
    pub gpu_hour: Money,
    /// Price of one GiB of GPU memory resident for one hour.
    pub memory_gib_hour: Money,
}

/// Metered quantities of one bill line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Busy compute: milli-GPU of the slice × milliseconds busy.
    pub compute_milli_gpu_ms: u64,
    /// Resident GPU memory: MiB × milliseconds resident (swapped-out time excluded).
    pub memory_mib_ms: u64,
    /// Completed invocations (counted for the tenant's view, not priced).
    pub invocations: u64,
}

impl Usage {
    /// The sum of two usages, `None` on overflow.
    pub fn checked_add(&self, other: &Usage) -> Option<Usage> {
        Some(Usage {
            compute_milli_gpu_ms: self
                .compute_milli_gpu_ms
                .checked_add(other.compute_milli_gpu_ms)?,
            memory_mib_ms: self.memory_mib_ms.checked_add(other.memory_mib_ms)?,
            invocations: self.invocations.checked_add(other.invocations)?,
        })
    }
}

/// What a usage costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Charge {
    /// The compute part.
    pub compute: Money,
    /// The memory part.
    pub memory: Money,
    /// `compute + memory`.
    pub total: Money,
}

/// Why a usage could not be priced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PricingError {
    /// The price list has no price for this GPU model in this pool kind.
    #[error("no price for GPU model {gpu_model:?} in {pool_kind} pools")]
    NoPrice {
        /// The GPU model asked for.
        gpu_model: String,
        /// The pool kind asked for.
        pool_kind: PoolKind,
    },
    /// The charge does not fit in [`Money`].
    #[error("charge overflows the money type")]
    Overflow,
}

/// The price list of a region: currency, tier discounts and prices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriceList {
    /// Currency, e.g. `USD`.
    pub currency: String,
    /// Name of the smallest unit all amounts are counted in, e.g. `micro-USD`.
    pub unit: String,
    /// How many units make one currency unit, e.g. `1000000`.
    pub units_per_currency: u64,
    /// Discount of each tier in basis points, indexed like [`Tier::ALL`].
    pub discounts_bp: [u32; 4],
    /// Prices per (GPU model, pool kind); at most one per pair.
    pub prices: Vec<Price>,
}

impl PriceList {
    /// Parses and validates a file holding only a `[pricing]` table, in
    /// the topology file's schema (e.g. for `gsharectl price set -f`).
    pub fn from_toml(file: &str, src: &str) -> Result<PriceList, super::ConfigError> {
        super::topology_file::parse_price_list(file, src)
    }

    /// The discount of `tier`, in basis points.
    pub fn discount_bp(&self, tier: Tier) -> u32 {
        self.discounts_bp[tier_index(tier)]
    }

    /// The price of `gpu_model` in pools of `pool_kind`, if any.
    pub fn price(&self, gpu_model: &str, pool_kind: PoolKind) -> Option<&Price> {
        self.prices
            .iter()
            .find(|p| p.gpu_model == gpu_model && p.pool_kind == pool_kind)
    }

    /// What `usage` costs on `gpu_model` in a `pool_kind` pool at `tier`.
    pub fn quote(
        &self,
        gpu_model: &str,
        pool_kind: PoolKind,
        tier: Tier,
        usage: &Usage,
    ) -> Result<Charge, PricingError> {
        let price = self
            .price(gpu_model, pool_kind)
            .ok_or_else(|| PricingError::NoPrice {
                gpu_model: gpu_model.to_string(),
                pool_kind,
            })?;
        charge(price, self.discount_bp(tier), usage)
    }

    /// `amount` written in the currency, e.g. `2.500000 USD` for 2,500,000
    /// micro-USD (as many decimals as `units_per_currency` has zeros when it
    /// is a power of ten, else the raw amount and unit).
    pub fn format(&self, amount: Money) -> String {
        let per = self.units_per_currency;
        let decimals = decimal_places(per);
        match (decimals, amount.checked_div(per), amount.checked_rem(per)) {
            (Some(0), _, _) => format!("{amount} {}", self.currency),
            (Some(d), Some(whole), Some(frac)) => format!(
                "{whole}.{frac:0width$} {}",
                self.currency,
                width = d as usize
            ),
            _ => format!("{amount} {}", self.unit),
        }
    }
}

/// The position of `tier` in [`Tier::ALL`].
pub fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Exclusive => 0,
        Tier::Guaranteed => 1,
        Tier::Burstable => 2,
        Tier::Oversubscribed => 3,
    }
}

/// `Some(k)` when `n == 10^k`.
fn decimal_places(n: u64) -> Option<u32> {
    n.checked_ilog10()
        .filter(|&k| 10u64.checked_pow(k) == Some(n))
}

/// The pricing rule (see the module docs): `usage` at `price` with a
/// discount of `discount_bp` basis points (clamped to 0..=10000).
pub fn charge(price: &Price, discount_bp: u32, usage: &Usage) -> Result<Charge, PricingError> {
    let keep = u128::from(BP_PER_WHOLE.saturating_sub(discount_bp));
    let compute = part(
        usage.compute_milli_gpu_ms,
        price.gpu_hour,
        keep,
        MILLI_GPU_MS_PER_GPU_HOUR,
    )?;
    let memory = part(
        usage.memory_mib_ms,
        price.memory_gib_hour,
        keep,
        MIB_MS_PER_GIB_HOUR,
    )?;
    let total = compute.checked_add(memory).ok_or(PricingError::Overflow)?;
    Ok(Charge {
        compute,
        memory,
        total,
    })
}

/// `round(quantity × price × keep_bp ÷ (per_hour × 10000))`, halves up.
fn part(quantity: u64, price: Money, keep_bp: u128, per_hour: u128) -> Result<Money, PricingError> {
    let num = u128::from(quantity)
        .checked_mul(u128::from(price))
        .and_then(|n| n.checked_mul(keep_bp))
        .ok_or(PricingError::Overflow)?;
    let rounded = per_hour
        .checked_mul(u128::from(BP_PER_WHOLE))
        .and_then(|den| num.checked_add(den / 2)?.checked_div(den))
        .ok_or(PricingError::Overflow)?;
    Money::try_from(rounded).map_err(|_| PricingError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100() -> Price {
        Price {
            gpu_model: "A100-80G".into(),
            pool_kind: PoolKind::Center,
            gpu_hour: 2_000_000,
            memory_gib_hour: 10_000,
        }
    }

    fn list() -> PriceList {
        PriceList {
            currency: "USD".into(),
            unit: "micro-USD".into(),
            units_per_currency: 1_000_000,
            discounts_bp: [0, 1500, 3000, 6000],
            prices: vec![a100()],
        }
    }

    #[test]
    fn a_whole_gpu_hour_costs_the_list_price() {
        let u = Usage {
            compute_milli_gpu_ms: 1000 * 3_600_000,
            memory_mib_ms: 80 * 1024 * 3_600_000,
            invocations: 0,
        };
        let c = charge(&a100(), 0, &u).unwrap();
        assert_eq!(c.compute, 2_000_000);
        assert_eq!(c.memory, 800_000);
        assert_eq!(c.total, 2_800_000);
    }

    #[test]
    fn discount_is_applied_before_the_single_rounding() {
        // Half a GPU for 90 minutes at 30 % off: 0.75 GPU-h × 2 USD × 0.7 = 1.05 USD.
        let u = Usage {
            compute_milli_gpu_ms: 500 * 5_400_000,
            memory_mib_ms: 0,
            invocations: 0,
        };
        let c = list()
            .quote("A100-80G", PoolKind::Center, Tier::Burstable, &u)
            .unwrap();
        assert_eq!(c.compute, 1_050_000);
        assert_eq!(c.total, 1_050_000);
    }

    #[test]
    fn rounding_is_to_nearest_with_halves_up() {
        // Price 1 unit per GPU-hour: exactly half a GPU-hour is 0.5 -> 1.
        let p = Price {
            gpu_hour: 1,
            memory_gib_hour: 1,
            ..a100()
        };
        let half = MILLI_GPU_MS_PER_GPU_HOUR as u64 / 2;
        let at = |q: u64| {
            charge(
                &p,
                0,
                &Usage {
                    compute_milli_gpu_ms: q,
                    memory_mib_ms: 0,
                    invocations: 0,
                },
            )
            .unwrap()
            .compute
        };
        assert_eq!(at(half - 1), 0);
        assert_eq!(at(half), 1);
        assert_eq!(at(3 * half - 1), 1);
        assert_eq!(at(3 * half), 2);
    }

    #[test]
    fn full_discount_is_free_and_huge_usage_overflows_cleanly() {
        let u = Usage {
            compute_milli_gpu_ms: u64::MAX,
            memory_mib_ms: u64::MAX,
            invocations: 0,
        };
        assert_eq!(charge(&a100(), 10_000, &u).unwrap().total, 0);
        let dear = Price {
            gpu_hour: MAX_PRICE,
            ..a100()
        };
        assert_eq!(charge(&dear, 0, &u), Err(PricingError::Overflow));
    }

    #[test]
    fn an_unpriced_pair_is_an_error_naming_it() {
        let e = list()
            .quote(
                "A100-80G",
                PoolKind::Edge,
                Tier::Exclusive,
                &Usage::default(),
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no price for GPU model \"A100-80G\" in edge pools"
        );
    }

    #[test]
    fn every_part_is_the_nearest_unit_and_grows_with_usage() {
        // Seeded: a failure names the seed and the case.
        let seed = 42;
        let mut rng = crate::rng::Rng::new(seed);
        for case in 0..10_000 {
            let price = Price {
                gpu_hour: rng.below(MAX_PRICE + 1),
                memory_gib_hour: rng.below(10_000_000),
                ..a100()
            };
            let bp = rng.below(u64::from(BP_PER_WHOLE) + 1) as u32;
            let u = Usage {
                compute_milli_gpu_ms: rng.below(1 << 40),
                memory_mib_ms: rng.below(1 << 50),
                invocations: 0,
            };
            let c = charge(&price, bp, &u).unwrap();
            let keep = u128::from(BP_PER_WHOLE - bp);
            let exact =
                |q: u64, p: u64, per: u128| (u128::from(q) * u128::from(p) * keep, per * 10_000);
            for (got, (num, den)) in [
                (
                    c.compute,
                    exact(
                        u.compute_milli_gpu_ms,
                        price.gpu_hour,
                        MILLI_GPU_MS_PER_GPU_HOUR,
                    ),
                ),
                (
                    c.memory,
                    exact(u.memory_mib_ms, price.memory_gib_hour, MIB_MS_PER_GIB_HOUR),
                ),
            ] {
                // got − num/den lies in (−1/2, +1/2]: nearest, halves up.
                let diff = 2 * (u128::from(got) * den) as i128 - 2 * num as i128;
                let den = den as i128;
                assert!(
                    -den < diff && diff <= den,
                    "seed {seed} case {case}: {got} vs {num}/{den}"
                );
            }
            assert_eq!(c.total, c.compute + c.memory);
            let more = Usage {
                compute_milli_gpu_ms: u.compute_milli_gpu_ms + rng.below(1 << 30),
                ..u
            };
            assert!(
                charge(&price, bp, &more).unwrap().total >= c.total,
                "seed {seed} case {case}"
            );
        }
    }

    #[test]
    fn usages_add_up_and_overflow_is_caught() {
        let a = Usage {
            compute_milli_gpu_ms: 5,
            memory_mib_ms: 7,
            invocations: 3,
        };
        assert_eq!(
            a.checked_add(&a),
            Some(Usage {
                compute_milli_gpu_ms: 10,
                memory_mib_ms: 14,
                invocations: 6,
            })
        );
        let full = Usage {
            compute_milli_gpu_ms: u64::MAX,
            memory_mib_ms: 0,
            invocations: 0,
        };
        assert_eq!(full.checked_add(&a), None);
        let many = Usage {
            invocations: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(many.checked_add(&a), None);
    }

    #[test]
    fn a_price_list_file_parses_on_its_own() {
        let src = r#"
[pricing]
currency = "USD"
unit = "micro-USD"
units_per_currency = 1_000_000
tiers = { exclusive = { discount_bp = 0 }, guaranteed = { discount_bp = 10 }, burstable = { discount_bp = 20 }, oversubscribed = { discount_bp = 30 } }
prices = [{ gpu_model = "X-1", pool_kind = "edge", gpu_hour = 5, memory_gib_hour = 6 }]
"#;
        let l = PriceList::from_toml("p.toml", src).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.discount_bp(Tier::Oversubscribed), 30);
        assert_eq!(l.price("X-1", PoolKind::Edge).unwrap().memory_gib_hour, 6);
        let bad = src.replace("\"X-1\"", "\"X 1\"").replace("= 30", "= 3");
        let e = PriceList::from_toml("p.toml", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pricing.prices[0].gpu_model: a name is"), "{e}");
        assert!(
            e.contains("pricing.tiers.oversubscribed.discount_bp: a coarser tier"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 2, "{e}");
    }

    #[test]
    fn amounts_print_in_the_currency() {
        let l = list();
        assert_eq!(l.format(2_500_000), "2.500000 USD");
        assert_eq!(l.format(7), "0.000007 USD");
        let cents = PriceList {
            units_per_currency: 100,
            ..list()
        };
        assert_eq!(cents.format(1234), "12.34 USD");
        let odd = PriceList {
            units_per_currency: 7,
            ..list()
        };
        assert_eq!(odd.format(1234), "1234 micro-USD");
    }
}
