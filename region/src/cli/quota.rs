//! `gsharectl quota set` (operator): one pool kind's quota of a tenant.

use serde_json::json;

use super::region_client::{key_values, RegionArgs};

/// `gsharectl quota …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: QuotaCommand,
}

#[derive(Debug, clap::Subcommand)]
enum QuotaCommand {
    /// Set a tenant's quota in one pool kind (refused below what it holds).
    Set {
        /// The tenant.
        tenant: String,
        /// `center` or `edge`.
        #[arg(long)]
        kind: String,
        /// Compute, milli-GPU.
        #[arg(long)]
        compute_milli: u64,
        /// GPU memory, MiB.
        #[arg(long)]
        memory_mib: u64,
        /// Instances.
        #[arg(long)]
        instances: u32,
    },
}

/// Runs `gsharectl quota …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    let QuotaCommand::Set {
        tenant,
        kind,
        compute_milli,
        memory_mib,
        instances,
    } = a.command;
    let v = r.call(
        "PUT",
        &format!("/v1/tenants/{tenant}/quotas/{kind}"),
        Some(&json!({"compute_milli": compute_milli, "memory_mib": memory_mib, "instances": instances})),
    )?;
    r.show(&v, key_values);
    Ok(())
}
