//! `gsharectl`: the operator's command line.

use clap::Parser;
use gshare_region::cli;

#[derive(Debug, Parser)]
#[command(name = "gsharectl", about = "Operate a gshare region")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Certificate authority and node certificates.
    Certs(cli::certs::Args),
    /// Cluster status and membership.
    Cluster(cli::cluster::Args),
}

fn main() {
    let result = match Cli::parse().command {
        Command::Certs(a) => cli::certs::run(a),
        Command::Cluster(a) => cli::cluster::run(a),
    };
    if let Err(e) = result {
        eprintln!("gsharectl: {e:#}");
        std::process::exit(1);
    }
}
