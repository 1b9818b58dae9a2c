//! `gsharectl tenant create|update|ls|rm` (operator).

use serde_json::{json, Value};

use super::region_client::{cell, key_values, RegionArgs};

/// `gsharectl tenant …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TenantCommand {
    /// Create a tenant (quotas: `gsharectl quota set`).
    Create {
        /// Its name.
        name: String,
        /// Name for humans.
        #[arg(long)]
        display_name: Option<String>,
    },
    /// Change a tenant's display name.
    Update {
        /// The tenant.
        name: String,
        /// New display name (omit to clear it).
        #[arg(long)]
        display_name: Option<String>,
    },
    /// List tenants with quotas, holdings and token ids.
    Ls,
    /// Delete a tenant and its tokens: refused while it has functions,
    /// unless `--force` (which deletes them). Its usage and bills stay
    /// readable (`gsharectl bill --tenant`, `gsharectl usage --tenant`).
    Rm {
        /// The tenant.
        name: String,
        /// Delete its functions (and release their instances) too.
        #[arg(long)]
        force: bool,
    },
}

/// Runs `gsharectl tenant …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    match a.command {
        TenantCommand::Create { name, display_name } => {
            let v = r.call(
                "POST",
                "/v1/tenants",
                Some(&json!({"name": name, "display_name": display_name})),
            )?;
            r.show(&v, key_values);
        }
        TenantCommand::Update { name, display_name } => {
            let v = r.call(
                "PUT",
                &format!("/v1/tenants/{name}"),
                Some(&json!({"display_name": display_name})),
            )?;
            r.show(&v, key_values);
        }
        TenantCommand::Rm { name, force } => {
            let path = format!("/v1/tenants/{name}?force={force}");
            let v = r.call("DELETE", &path, None)?;
            r.show(&v, key_values);
        }
        TenantCommand::Ls => {
            let v = r.call("GET", "/v1/tenants", None)?;
            r.show(&v, table);
        }
    }
    Ok(())
}

fn table(v: &Value) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "TENANT",
        "DISPLAY NAME",
        "KIND",
        "COMPUTE (held/quota)",
        "MEMORY MiB",
        "INSTANCES",
        "TOKENS",
    ]
    .map(String::from)
    .to_vec()];
    for t in v.as_array().into_iter().flatten() {
        for kind in ["center", "edge"] {
            let (h, q) = (&t["held"][kind], &t["quotas"][kind]);
            let pair = |k: &str| {
                format!(
                    "{}/{}",
                    h[k].as_u64().unwrap_or(0),
                    q[k].as_u64().unwrap_or(0)
                )
            };
            rows.push(vec![
                cell(&t["name"]),
                cell(&t["display_name"]),
                kind.into(),
                pair("compute_milli"),
                pair("memory_mib"),
                pair("instances"),
                t["tokens"].as_array().map_or(0, Vec::len).to_string(),
            ]);
        }
    }
    rows
}
