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
    },
}

/// Runs `gsharectl certs …`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Init { dir } => {
            let (cert, key) = tls::init_ca(&dir)?;
            println!("CA certificate: {}", cert.display());
            println!("CA key:         {} (keep it secret)", key.display());
        }
        CertsCommand::Issue { dir, name, sans } => {
            if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                anyhow::bail!("--name {name:?}: must be a plain file name");
            }
            let sans = if sans.is_empty() {
                tls::default_sans(&name)
            } else {
                sans
            };
            let (cert, key) = tls::issue(&dir, &name, &sans)?;
            println!(
                "certificate: {} (SANs: {})",
                cert.display(),
                sans.join(", ")
            );
            println!("key:         {}", key.display());
        }
    }
    Ok(())
}
