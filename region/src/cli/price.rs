//! `gsharectl price show|set -f pricing.toml`.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::{json, Value};

use super::region_client::{cell, key_values, RegionArgs};

/// `gsharectl price …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: PriceCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PriceCommand {
    /// Show the price list in force.
    Show,
    /// Replace the price list from now on (operator): a file with a
    /// `[pricing]` table in the topology file's schema.
    Set {
        /// The file.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
}

/// Runs `gsharectl price …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    match a.command {
        PriceCommand::Show => {
            let v = r.call("GET", "/v1/prices", None)?;
            r.show(&v, table);
        }
        PriceCommand::Set { file } => {
            let text =
                std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
            check(&file.display().to_string(), &text)?;
            let v = r.call("PUT", "/v1/prices", Some(&json!({ "toml": text })))?;
            r.show(&v, key_values);
        }
    }
    Ok(())
}

/// Checks a price file here, so that every mistake is named by the file
/// and its line (the region checks again; its answer knows no file name).
fn check(file: &str, text: &str) -> anyhow::Result<()> {
    gshare_core::config::PriceList::from_toml(file, text)
        .map(drop)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Prices in currency units; the tier discounts in percent.
fn table(v: &Value) -> Vec<Vec<String>> {
    let currency = cell(&v["currency"]);
    let per = v["units_per_currency"].as_u64().unwrap_or(0);
    let amount = |x: &Value| {
        x.as_u64()
            .map_or_else(|| cell(x), |n| super::human::money(n, per, &currency))
    };
    let mut rows = vec![vec![
        "GPU MODEL".to_string(),
        "POOL KIND".into(),
        "PER GPU-HOUR".into(),
        "PER GiB-HOUR OF MEMORY".into(),
    ]];
    for p in v["prices"].as_array().into_iter().flatten() {
        rows.push(vec![
            cell(&p["gpu_model"]),
            cell(&p["pool_kind"]),
            amount(&p["gpu_hour"]),
            amount(&p["memory_gib_hour"]),
        ]);
    }
    let discounts: Vec<String> = ["exclusive", "guaranteed", "burstable", "oversubscribed"]
        .iter()
        .zip(v["discounts_bp"].as_array().into_iter().flatten())
        .map(|(tier, bp)| {
            let bp = bp.as_u64().unwrap_or(0);
            format!("{tier} {}.{:02} %", bp / 100, bp % 100)
        })
        .collect();
    rows.push(Vec::new());
    rows.push(vec![format!("tier discounts: {}", discounts.join(", "))]);
    rows
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_price_file_is_named_with_its_line() {
        let text = "[pricing]\ncurrency = \"USD\"\n";
        let e = super::check("prices.toml", text).unwrap_err().to_string();
        assert!(e.starts_with("prices.toml:"), "{e}");
        assert!(!e.contains("(request body)"), "{e}");
        assert!(e.contains("pricing.unit: missing required key"), "{e}");
    }
}
