//! `gsharectl`: operator and experiment command-line tool.

use clap::{Parser, Subcommand};
use gshare_region::cli;

/// gshare's command-line tool.
#[derive(Parser)]
#[command(name = "gsharectl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace-driven simulations.
    #[command(subcommand)]
    Sim(SimCommand),
}

#[derive(Subcommand)]
enum SimCommand {
    /// Serving: the deadline-aware executor vs baselines on a trace.
    Serving(cli::sim_serving::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Sim(SimCommand::Serving(args)) => cli::sim_serving::run(args),
    }
}
