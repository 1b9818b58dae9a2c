//! `gsharectl`: gshare's command-line tool for operators, tenants and
//! experiments. Thin dispatch only; each subcommand's arguments and logic
//! live in `gshare_region::cli::*`.

use clap::{Parser, Subcommand};
use gshare_region::cli;

/// Operate a gshare region and run gshare's trace-driven experiments.
#[derive(Debug, Parser)]
#[command(
    name = "gsharectl",
    version,
    about = "gshare's command-line tool: start a local region (up), operate a region \
             (certificates, membership, tenants, tokens, quotas, prices, functions, usage, bills) \
             and run the trace-driven simulators",
    after_help = "Region commands take --region <url> and --token <t> (or GSHARE_REGION, GSHARE_TOKEN).\n\
                  Examples:\n  \
                  gsharectl up                            # a whole local region with a demo (Ctrl-C stops it)\n  \
                  gsharectl sim placement                 # FGD-paper experiment on the embedded workload\n  \
                  gsharectl certs init --dir certs        # a CA for a new region\n  \
                  gsharectl function deploy -f fn.toml    # deploy a function (tenant token)"
)]
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
    /// Tenants (operator).
    Tenant(cli::tenant::Args),
    /// Tenant tokens (operator).
    Token(cli::token::Args),
    /// Quotas (operator).
    Quota(cli::quota::Args),
    /// The price list.
    Price(cli::price::Args),
    /// Functions (tenant): deploy, list, remove.
    Function(cli::function::Args),
    /// Metered usage (tenant).
    Usage(cli::usage::Args),
    /// Bills (tenant; operator with --tenant).
    Bill(cli::bill::Args),
    /// Simulators (trace-driven experiments).
    #[command(subcommand)]
    Sim(SimCommand),
    /// Start a local region (3 replicas, 4 agents, simulated GPUs), run a
    /// demo workload, print what happened and where to look.
    #[command(long_about = cli::up::LONG_ABOUT)]
    Up(cli::up::Args),
    /// Internal: how `gsharectl up` starts its children.
    #[command(hide = true)]
    UpChild(cli::up::ChildArgs),
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Replay the FGD paper's placement experiment (Alibaba openb trace).
    Placement(cli::sim_placement::SimPlacementArgs),
    /// Serving: the deadline-aware executor vs baselines on a trace.
    Serving(cli::sim_serving::Args),
}

fn main() {
    let result = match Cli::parse().command {
        Command::Certs(a) => cli::certs::run(a),
        Command::Cluster(a) => cli::cluster::run(a),
        Command::Tenant(a) => cli::tenant::run(a),
        Command::Token(a) => cli::token::run(a),
        Command::Quota(a) => cli::quota::run(a),
        Command::Price(a) => cli::price::run(a),
        Command::Function(a) => cli::function::run(a),
        Command::Usage(a) => cli::usage::run(a),
        Command::Bill(a) => cli::bill::run(a),
        Command::Sim(SimCommand::Placement(a)) => cli::sim_placement::run(a),
        Command::Sim(SimCommand::Serving(a)) => cli::sim_serving::run(a),
        Command::Up(a) => cli::up::run(a),
        Command::UpChild(a) => cli::up::exec_child(a),
    };
    if let Err(e) = result {
        eprintln!("gsharectl: {e:#}");
        std::process::exit(1);
    }
}
