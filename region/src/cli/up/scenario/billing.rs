//! The end-of-scenario check that the region billed what the agents
//! journaled: a tenant's usage in the replicated state
//! (`GET /v1/tenants/{t}/usage`, summed over its lines) against the sum
//! of every agent's durable totals (`GET /v1/agent/usage/{t}` on each
//! agent's ingress), once every journal has delivered everything
//! (`GET /v1/agent/journal`: `pending_records = 0`).
//!
//! Invocations and busy compute must be equal: no invocation completes
//! after the scenario's clients stopped, so both stay put. Resident
//! memory (MiB × ms) keeps growing with every metering tick while an
//! instance is resident, so the two reads of it are taken at different
//! moments; it is printed, not compared.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::super::api_client::ApiClient;
use super::super::Up;

/// How long the journals may take to deliver their last records.
const SETTLE: Duration = Duration::from_secs(20);

/// One side's sums for a tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    /// Completed invocations.
    pub invocations: u64,
    /// Busy compute, milli-GPU × ms.
    pub compute_milli_gpu_ms: u64,
    /// Resident memory, MiB × ms.
    pub memory_mib_ms: u64,
}

impl Sums {
    fn add(&mut self, v: &Value) {
        let get = |k: &str| v[k].as_u64().unwrap_or(0);
        self.invocations = self.invocations.saturating_add(get("invocations"));
        self.compute_milli_gpu_ms = self
            .compute_milli_gpu_ms
            .saturating_add(get("compute_milli_gpu_ms"));
        self.memory_mib_ms = self.memory_mib_ms.saturating_add(get("memory_mib_ms"));
    }

    fn billed_like(&self, o: &Sums) -> bool {
        self.invocations == o.invocations && self.compute_milli_gpu_ms == o.compute_milli_gpu_ms
    }
}

/// What the check compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Billed {
    /// The region's usage of the tenant.
    pub region: Sums,
    /// The agents' journals for the tenant.
    pub journals: Sums,
}

/// Waits until the agents' journals hold nothing undelivered, then
/// compares `tenant`'s usage at the region with the journals' totals,
/// retrying until [`SETTLE`]. `Err` names what differed.
pub fn check(up: &Up, tenant: &str) -> Result<Billed, String> {
    let token = up
        .tokens
        .get(tenant)
        .ok_or_else(|| format!("no token for {tenant}"))?;
    let deadline = Instant::now() + SETTLE;
    loop {
        let delivered = up.layout.agents.iter().all(|a| {
            ApiClient::call_at(a.ingress, "GET", "/v1/agent/journal", "", None)
                .is_ok_and(|v| v["pending_records"].as_u64() == Some(0))
        });
        let journals = journal_sums(up, tenant, token);
        let region = region_sums(up, tenant);
        match (journals, region) {
            (Ok(j), Ok(r)) if delivered && r.billed_like(&j) => {
                return Ok(Billed {
                    region: r,
                    journals: j,
                })
            }
            (j, r) if Instant::now() >= deadline => {
                return Err(format!(
                    "the region's usage of {tenant} is not what the agents journaled after {} s \
                     (journals delivered: {delivered}): region {r:?}, journals {j:?}",
                    SETTLE.as_secs()
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

fn journal_sums(up: &Up, tenant: &str, token: &str) -> Result<Sums, String> {
    let mut s = Sums::default();
    for a in &up.layout.agents {
        let v = ApiClient::call_at(
            a.ingress,
            "GET",
            &format!("/v1/agent/usage/{tenant}"),
            token,
            None,
        )
        .map_err(|e| format!("agent {}: {e}", a.node))?;
        s.add(&v);
    }
    Ok(s)
}

fn region_sums(up: &Up, tenant: &str) -> Result<Sums, String> {
    let v = up
        .api
        .call(
            "GET",
            &format!("/v1/tenants/{tenant}/usage"),
            &up.operator,
            None,
        )
        .map_err(|e| format!("region usage: {e}"))?;
    let mut s = Sums::default();
    for line in v.as_array().into_iter().flatten() {
        s.add(&line["usage"]);
    }
    Ok(s)
}
