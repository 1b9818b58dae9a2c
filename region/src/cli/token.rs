//! `gsharectl token issue|revoke` (operator). The secret is printed once.

use anyhow::Context as _;
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
        /// Write the secret alone to this file (created with mode 0600,
        /// never overwritten) instead of printing it.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
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
        TokenCommand::Issue { tenant, id, out } => {
            // Refuse an existing file before a token is issued.
            if let Some(path) = &out {
                if path.exists() {
                    anyhow::bail!("{}: exists; not overwritten", path.display());
                }
            }
            let mut v = r.call(
                "POST",
                &format!("/v1/tenants/{tenant}/tokens"),
                Some(&json!({ "token_id": id })),
            )?;
            if let Some(path) = &out {
                let secret = v["token"].as_str().unwrap_or_default().to_string();
                write_secret(path, &secret).with_context(|| {
                    format!(
                        "{}: the token was issued (id {}) but not written; revoke it",
                        path.display(),
                        v["token_id"]
                    )
                })?;
                v["token"] = json!(format!("written to {}", path.display()));
            }
            v
        }
        TokenCommand::Revoke { tenant, id } => {
            r.call("DELETE", &format!("/v1/tenants/{tenant}/tokens/{id}"), None)?
        }
    };
    r.show(&v, key_values);
    Ok(())
}

/// Writes `secret` and a newline to a new file readable by its owner only.
fn write_secret(path: &std::path::Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        o.mode(0o600);
    }
    let mut f = o.open(path)?;
    f.write_all(secret.as_bytes())?;
    f.write_all(b"\n")
}
