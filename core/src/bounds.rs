//! The ranges every quantity a tenant or operator sends must lie in: one
//! place, used by the config parsers, the region's API (before it
//! proposes) and the state machine's apply (which re-checks, so a command
//! that bypasses the API is refused the same way).
//!
//! Each bound is far beyond what hardware reaches, and small enough that
//! any sum or product the region and the agents form from in-bound values
//! fits in `u64` with room to spare:
//!
//! ```text
//!   field                          range                      why this much
//!   memory_mib (function)          1 ..= 2^24 MiB (16 TiB)    16 GPUs of the largest GPU (2^20 MiB)
//!   compute_milli (function)       1 ..= 16_000               16 whole GPUs
//!   deadline_ms                    1 ..= 86_400_000 (1 day)
//!   latency.full_gpu_us            0 ..= 86_400_000_000 (1 day)
//!   latency.saturation_milli       1 ..= 1000
//!   idle_timeout_s                 0 ..= 2_592_000 (30 days)
//!   min_instances, max_instances   max 1 ..= 2^20
//!   quota compute_milli/memory_mib 0 ..= 2^48
//!   quota instances                0 ..= 2^32 − 1 (the whole u32)
//!   price gpu_hour/memory_gib_hour 0 ..= 10^12 units
//!   tier discount                  0 ..= 10_000 bp
//!   units_per_currency             1 ..= 10^12
//!   a tenant's stored specs        0 ..= 64 MiB               < 262,144 functions (256 bytes + name each)
//! ```
//!
//! Arithmetic on these values is still checked everywhere it is formed
//! (quota, fit, holdings, metering, bills): the bounds make the refusals
//! meaningful ("past the bound" instead of "overflow"), the checks make a
//! missed bound harmless.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use crate::config::pricing::BP_PER_WHOLE;
use crate::config::PriceList;
use crate::model::{FunctionSpec, Mib, MilliGpu, Quota, WHOLE_GPU};
use std::fmt;

/// Most whole GPUs one exclusive instance may hold.
pub const MAX_GPUS_PER_INSTANCE: u32 = 16;
/// Largest memory of one GPU a topology may declare, MiB (1 TiB).
pub const MAX_GPU_MEMORY_MIB: Mib = 1 << 20;
/// Largest GPU memory footprint of one function instance, MiB
/// ([`MAX_GPUS_PER_INSTANCE`] GPUs of [`MAX_GPU_MEMORY_MIB`]).
pub const MAX_FUNCTION_MEMORY_MIB: Mib = 1 << 24;
/// Largest compute of one function instance, milli-GPU.
pub const MAX_FUNCTION_COMPUTE_MILLI: MilliGpu = 16_000;
/// Longest per-request deadline, ms (one day).
pub const MAX_DEADLINE_MS: u64 = 86_400_000;
/// Longest service time on a whole GPU, µs (one day).
pub const MAX_FULL_GPU_US: u64 = 86_400_000_000;
/// Longest idle timeout, s (30 days).
pub const MAX_IDLE_TIMEOUT_S: u64 = 2_592_000;
/// Most instances of one function (`max_instances`).
pub const MAX_INSTANCES_PER_FUNCTION: u32 = 1 << 20;
/// Largest compute (milli-GPU) or memory (MiB) quota.
pub const MAX_QUOTA: u64 = 1 << 48;
/// The largest price a price list accepts, per GPU-hour or GiB-hour
/// (keeps `usage × price × 10000` inside `u128` for any `u64` usage).
pub const MAX_PRICE: u64 = 1_000_000_000_000;
/// Largest `units_per_currency` of a price list.
pub const MAX_UNITS_PER_CURRENCY: u64 = 1_000_000_000_000;

/// Most bytes of function specs one tenant may keep in the replicated
/// state (64 MiB): its functions' specs and the earlier versions their
/// outgoing instances still run, each counted by [`spec_bytes`]. Quotas
/// bound what a tenant runs; this bounds what it stores, since a function
/// with `min_instances = 0` holds no quota (at least [`SPEC_RECORD_BYTES`]
/// a function and its name: fewer than 262,144 functions per tenant).
pub const MAX_TENANT_SPEC_BYTES: u64 = 64 << 20;
/// What one kept spec counts at least, bytes: its fixed fields and its
/// share of the maps that hold it.
pub const SPEC_RECORD_BYTES: u64 = 256;

/// The bytes `spec` counts against [`MAX_TENANT_SPEC_BYTES`]:
/// [`SPEC_RECORD_BYTES`] plus its strings (name, pool, model, arguments,
/// environment names and values).
pub fn spec_bytes(spec: &FunctionSpec) -> u64 {
    let len = |s: &str| u64::try_from(s.len()).unwrap_or(u64::MAX);
    let pool = spec.pool.edge_pool().map_or(0, len);
    let strings = [len(&spec.name), pool, spec.model.as_deref().map_or(0, len)]
        .into_iter()
        .chain(spec.args.iter().map(|a| len(a)))
        .chain(spec.env.iter().map(|(k, v)| len(k).saturating_add(len(v))));
    strings.fold(SPEC_RECORD_BYTES, u64::saturating_add)
}

/// A value outside its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: must be {min} to {max}, got {value}")]
pub struct OutOfBounds {
    /// The field, as the API and the config files name it (e.g.
    /// `memory_mib`, `quotas.center.compute_milli`).
    pub field: String,
    /// The offending value.
    pub value: u64,
    /// The smallest value accepted.
    pub min: u64,
    /// The largest value accepted.
    pub max: u64,
}

/// Whether `value` lies in `min..=max`; the error names `field`.
pub fn check(field: impl fmt::Display, value: u64, min: u64, max: u64) -> Result<(), OutOfBounds> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(OutOfBounds {
            field: field.to_string(),
            value,
            min,
            max,
        })
    }
}

/// The range checks of a function spec (the tier rules, e.g. whole GPUs
/// for `exclusive`, are the state machine's `validate_spec`).
pub fn check_spec(spec: &FunctionSpec) -> Result<(), OutOfBounds> {
    check("memory_mib", spec.memory_mib, 1, MAX_FUNCTION_MEMORY_MIB)?;
    check(
        "compute_milli",
        u64::from(spec.compute_milli),
        1,
        u64::from(MAX_FUNCTION_COMPUTE_MILLI),
    )?;
    check("deadline_ms", spec.deadline_ms, 1, MAX_DEADLINE_MS)?;
    check("idle_timeout_s", spec.idle_timeout_s, 0, MAX_IDLE_TIMEOUT_S)?;
    check(
        "max_instances",
        u64::from(spec.max_instances),
        1,
        u64::from(MAX_INSTANCES_PER_FUNCTION),
    )?;
    check(
        "latency.full_gpu_us",
        spec.latency.full_gpu_us,
        0,
        MAX_FULL_GPU_US,
    )?;
    check(
        "latency.saturation_milli",
        u64::from(spec.latency.saturation_milli),
        1,
        u64::from(WHOLE_GPU),
    )
}

/// The range checks of a quota; `at` names it (e.g. `quotas.center`).
pub fn check_quota(at: &str, q: &Quota) -> Result<(), OutOfBounds> {
    check(
        format_args!("{at}.compute_milli"),
        q.compute_milli,
        0,
        MAX_QUOTA,
    )?;
    check(format_args!("{at}.memory_mib"), q.memory_mib, 0, MAX_QUOTA)
    // `instances` is a u32 and every count of instances is formed with
    // checked arithmetic: its whole range is accepted.
}

/// The range checks of a price list: prices, discounts, units.
pub fn check_price_list(list: &PriceList) -> Result<(), OutOfBounds> {
    check(
        "pricing.units_per_currency",
        list.units_per_currency,
        1,
        MAX_UNITS_PER_CURRENCY,
    )?;
    for (i, bp) in list.discounts_bp.iter().enumerate() {
        let tier = crate::model::Tier::ALL.get(i).map_or("?", |t| t.as_str());
        check(
            format_args!("pricing.tiers.{tier}.discount_bp"),
            u64::from(*bp),
            0,
            u64::from(BP_PER_WHOLE),
        )?;
    }
    for (i, p) in list.prices.iter().enumerate() {
        check(
            format_args!("pricing.prices[{i}].gpu_hour"),
            p.gpu_hour,
            0,
            MAX_PRICE,
        )?;
        check(
            format_args!("pricing.prices[{i}].memory_gib_hour"),
            p.memory_gib_hour,
            0,
            MAX_PRICE,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LatencyProfile, PoolPreference, Runtime, TenantId, Tier};

    fn spec() -> FunctionSpec {
        FunctionSpec {
            model: None,
            args: Vec::new(),
            env: Default::default(),
            tenant: TenantId("t".into()),
            name: "f".into(),
            runtime: Runtime::Custom,
            memory_mib: 1024,
            compute_milli: 500,
            tier: Tier::Guaranteed,
            deadline_ms: 100,
            pool: PoolPreference::Any,
            min_instances: 1,
            max_instances: 1,
            idle_timeout_s: 300,
            latency: LatencyProfile {
                full_gpu_us: 10_000,
                saturation_milli: 1000,
            },
        }
    }

    #[test]
    fn every_spec_field_is_bounded_and_the_error_names_it() {
        assert_eq!(check_spec(&spec()), Ok(()));
        type Breaks = fn(&mut FunctionSpec);
        let cases: [(&str, Breaks); 7] = [
            ("memory_mib", |s| s.memory_mib = u64::MAX),
            ("compute_milli", |s| s.compute_milli = u32::MAX),
            ("deadline_ms", |s| s.deadline_ms = 1 << 63),
            ("idle_timeout_s", |s| s.idle_timeout_s = u64::MAX),
            ("max_instances", |s| s.max_instances = u32::MAX),
            ("latency.full_gpu_us", |s| s.latency.full_gpu_us = u64::MAX),
            ("latency.saturation_milli", |s| {
                s.latency.saturation_milli = 1001
            }),
        ];
        for (field, bad) in cases {
            let mut s = spec();
            bad(&mut s);
            let e = check_spec(&s).unwrap_err();
            assert_eq!(e.field, field);
            assert!(
                e.to_string().starts_with(&format!("{field}: must be ")),
                "{e}"
            );
        }
        let mut s = spec();
        s.memory_mib = MAX_FUNCTION_MEMORY_MIB;
        assert_eq!(check_spec(&s), Ok(()));
        s.memory_mib += 1;
        assert_eq!(
            check_spec(&s).unwrap_err().to_string(),
            "memory_mib: must be 1 to 16777216, got 16777217"
        );
    }

    #[test]
    fn quotas_are_bounded_per_dimension() {
        let q = Quota {
            compute_milli: MAX_QUOTA,
            memory_mib: MAX_QUOTA,
            instances: u32::MAX,
        };
        assert_eq!(check_quota("quotas.center", &q), Ok(()));
        let e = check_quota(
            "quotas.edge",
            &Quota {
                memory_mib: u64::MAX,
                ..q
            },
        )
        .unwrap_err();
        assert_eq!(e.field, "quotas.edge.memory_mib");
    }

    #[test]
    fn the_largest_in_bound_values_do_not_overflow_the_sums_formed_from_them() {
        // An instance of the largest function, a whole GPU of the largest
        // memory per slice, counted 2^20 times: still far inside u64.
        let per_function = MAX_FUNCTION_MEMORY_MIB.checked_mul(1 << 20);
        assert!(per_function.is_some_and(|m| m < MAX_QUOTA * 2));
        let service = MAX_FULL_GPU_US.checked_mul(u64::from(WHOLE_GPU));
        assert!(service.is_some());
        assert!(u64::from(MAX_GPUS_PER_INSTANCE) * MAX_GPU_MEMORY_MIB <= MAX_FUNCTION_MEMORY_MIB);
    }
}
