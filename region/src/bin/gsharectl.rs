//! `gsharectl`: gshare's operator CLI. Thin dispatch only; each subcommand's
//! arguments and logic live in `gshare_region::cli::*`.

use clap::{Parser, Subcommand};
use gshare_region::cli;

/// gshare operator CLI.
#[derive(Debug, Parser)]
#[command(name = "gsharectl", version, about = "gshare operator CLI", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Certificate authority and node certificates.
    Certs(cli::certs::Args),
    /// Cluster status and membership.
    Cluster(cli::cluster::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Certs(args) => cli::certs::run(args),
        Command::Cluster(args) => cli::cluster::run(args),
    }
}
