//! `gsharectl certs`: the operator's CA and node certificates.

use std::path::PathBuf;

use crate::tls;

/// `gsharectl certs …`
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CertsCommand {
    /// Create a certificate authority (`ca.pem`, `ca.key`) in a directory.
    Init {
        /// Directory that receives the CA files.
        #[arg(long)]
        dir: PathBuf,
        /// Days the CA is valid (from an hour ago).
        #[arg(long, default_value_t = tls::DEFAULT_CA_DAYS)]
        days: u32,
    },
    /// Issue a node certificate (`<name>.pem`, `<name>.key`) signed by the CA in `--dir`.
    Issue {
        /// Directory holding the CA; receives the node's files.
        #[arg(long)]
        dir: PathBuf,
        /// The node's name (common name, default SAN, file names).
        #[arg(long)]
        name: String,
        /// Extra subject alternative names (host names or IP addresses);
        /// replaces the default of name, localhost and 127.0.0.1.
        #[arg(long = "san")]
        sans: Vec<String>,
        /// Days the certificate is valid (from an hour ago).
        #[arg(long, default_value_t = tls::DEFAULT_CERT_DAYS)]
        days: u32,
        /// Replace an existing certificate and key of this name.
        #[arg(long)]
        force: bool,
    },
}

/// Runs `gsharectl certs …`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Init { dir, days } => {
            let (cert, key) = tls::init_ca_for(&dir, days)?;
            println!("CA certificate: {} (valid {days} days)", cert.display());
            println!("CA key:         {} (keep it secret)", key.display());
        }
        CertsCommand::Issue {
            dir,
            name,
            sans,
            days,
            force,
        } => {
            if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                anyhow::bail!("--name {name:?}: must be a plain file name");
            }
            let sans = if sans.is_empty() {
                tls::default_sans(&name)
            } else {
                sans
            };
            let options = tls::IssueOptions { days, force };
            let (cert, key) = tls::issue_with(&dir, &name, &sans, options)?;
            println!(
                "certificate: {} (SANs: {}; valid {days} days)",
                cert.display(),
                sans.join(", ")
            );
            println!("key:         {}", key.display());
        }
    }
    Ok(())
}
