//! `gsharectl bill [--tenant t] --from ms --to ms`: a tenant's own bill,
//! or (operator, `--tenant`) any tenant's, also a deleted tenant's.
//! Amounts are shown in currency units (`--json`: integers in the price
//! list's smallest unit).

use serde_json::Value;

use super::region_client::{cell, RegionArgs};

/// `gsharectl bill …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    /// Another tenant's bill (operator token).
    #[arg(long)]
    tenant: Option<String>,
    /// Start of the period (Unix ms, hour-aligned).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// End of the period (Unix ms, exclusive; default: all).
    #[arg(long)]
    to: Option<u64>,
}

/// Runs `gsharectl bill`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let base = match &a.tenant {
        Some(t) => format!("/v1/tenants/{t}/bill"),
        None => "/v1/bill".into(),
    };
    let mut path = format!("{base}?from={}", a.from);
    if let Some(to) = a.to {
        path.push_str(&format!("&to={to}"));
    }
    let v = a.region.call("GET", &path, None)?;
    // Amounts are in the bill's own unit (its price lists'), which may not
    // be the current list's; a region older than `units_per_currency` in
    // bills is asked for its price list.
    let currency = if a.region.json {
        None
    } else {
        match (v["currency"].as_str(), v["units_per_currency"].as_u64()) {
            (Some(c), Some(per)) if !c.is_empty() && per > 0 => Some((c.to_string(), per)),
            _ => a.region.currency(),
        }
    };
    a.region.show(&v, |v| table(v, currency));
    Ok(())
}

/// The bill's lines; amounts in currency units when the price list's
/// currency is known (`currency`), else in the bill's unit.
fn table(v: &Value, currency: Option<(String, u64)>) -> Vec<Vec<String>> {
    let unit = cell(&v["unit"]);
    let amount = |x: &Value| match (&currency, x.as_u64()) {
        (Some((c, per)), Some(n)) => super::human::money(n, *per, c),
        _ => format!("{} {unit}", cell(x)),
    };
    let mut rows = vec![vec![
        "GPU MODEL".to_string(),
        "POOL KIND".into(),
        "TIER".into(),
        "EPOCH".into(),
        "INVOCATIONS".into(),
        "COMPUTE".into(),
        "MEMORY".into(),
    ]];
    for l in v["lines"].as_array().into_iter().flatten() {
        rows.push(vec![
            cell(&l["gpu_model"]),
            cell(&l["pool_kind"]),
            cell(&l["tier"]),
            cell(&l["price_epoch"]),
            cell(&l["usage"]["invocations"]),
            amount(&l["charge"]["compute"]),
            amount(&l["charge"]["memory"]),
        ]);
    }
    rows.push(vec![format!(
        "tenant {}: total {}",
        cell(&v["tenant"]),
        amount(&v["total"])
    )]);
    rows
}
