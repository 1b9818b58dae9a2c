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
    /// Simulators (trace-driven experiments).
    #[command(subcommand)]
    Sim(SimCommand),
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Replay the FGD paper's placement experiment (Alibaba openb trace).
    Placement(cli::sim_placement::SimPlacementArgs),
    /// Serving: the deadline-aware executor vs baselines on a trace.
    Serving(cli::sim_serving::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Sim(SimCommand::Placement(args)) => cli::sim_placement::run(args),
        Command::Sim(SimCommand::Serving(args)) => cli::sim_serving::run(args),
    }
}
