//! `gsharectl token issue|revoke` (operator). The secret is printed once.

use serde_json::json;

use super::region_client::{key_values, RegionArgs};

/// `gsharectl token …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    region: RegionArgs,
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Issue a token for a tenant; prints the secret (shown only now).
    Issue {
        /// The tenant.
        tenant: String,
        /// A public id for the token (default: derived from the secret).
        #[arg(long)]
        id: Option<String>,
    },
    /// Revoke a tenant's token by its id.
    Revoke {
        /// The tenant.
        tenant: String,
        /// The token id.
        id: String,
    },
}

/// Runs `gsharectl token …`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let r = &a.region;
    let v = match a.command {
        TokenCommand::Issue { tenant, id } => r.call(
            "POST",
            &format!("/v1/tenants/{tenant}/tokens"),
            Some(&json!({ "token_id": id })),
        )?,
        TokenCommand::Revoke { tenant, id } => {
            r.call("DELETE", &format!("/v1/tenants/{tenant}/tokens/{id}"), None)?
        }
    };
    r.show(&v, key_values);
    Ok(())
}
