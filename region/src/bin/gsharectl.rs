//! `gsharectl`: gshare's command-line tool for operators, tenants and
//! experiments. Thin dispatch only; each subcommand's arguments and logic
//! live in `gshare_region::cli::*`.

use clap::{CommandFactory, Parser, Subcommand};
use gshare_region::cli;

/// Operate a gshare region and run gshare's trace-driven experiments.
#[derive(Debug, Parser)]
#[command(
    name = "gsharectl",
    version,
    about = "gshare's command-line tool: start a local region (up), operate a region \
             (certificates, membership, nodes, tenants, tokens, quotas, prices, functions, usage, bills) \
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
    /// Nodes (operator): list with liveness, describe, drain, undrain.
    Node(cli::node::Args),
    /// Tenants (operator).
    Tenant(cli::tenant::Args),
    /// Tenant tokens (operator).
    Token(cli::token::Args),
    /// Quotas (operator).
    Quota(cli::quota::Args),
    /// The price list.
    Price(cli::price::Args),
    /// Functions (tenant): deploy, update, invoke, list, describe, remove.
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
    /// Print a shell completion script to stdout, e.g.
    /// `gsharectl completions bash > /etc/bash_completion.d/gsharectl`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (`gsharectl.1`, `gsharectl-<command>.1`, …) into a
    /// directory, e.g. `gsharectl man --dir /usr/local/share/man/man1`.
    Man {
        /// The directory (created if absent).
        #[arg(long)]
        dir: std::path::PathBuf,
    },
    /// Internal: how `gsharectl up` starts its children.
    #[command(hide = true)]
    UpChild(cli::up::ChildArgs),
    /// Internal: what stops `gsharectl up --runtime microvm`'s VMs after a
    /// `kill -9` of `up`.
    #[command(hide = true)]
    UpVmReaper(cli::up::VmReaperArgs),
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Replay the FGD paper's placement experiment (Alibaba openb trace).
    Placement(cli::sim_placement::SimPlacementArgs),
    /// Serving: the deadline-aware executor vs baselines on a trace.
    Serving(cli::sim_serving::Args),
}

/// Prints the completion script of `shell`.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gsharectl", &mut script);
    match std::io::stdout().write_all(&script) {
        // `gsharectl completions bash | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Writes the man page of `cmd` and of each visible subcommand, named by
/// their path (`gsharectl-function-deploy.1`).
fn man(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    fn write(dir: &std::path::Path, cmd: clap::Command, name: String) -> anyhow::Result<usize> {
        // After `build`, a subcommand's display name is its path
        // (`gsharectl-function-deploy`), which the page's title uses.
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page).with_context(|| path.display().to_string())?;
        let mut n = 1;
        let pages = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help");
        for sub in pages {
            let sub_name = format!("{name}-{}", sub.get_name());
            n += write(dir, sub.clone(), sub_name)?;
        }
        Ok(n)
    }
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let mut cmd = Cli::command();
    cmd.build();
    let n = write(dir, cmd, "gsharectl".into())?;
    println!("wrote {n} man pages to {}", dir.display());
    Ok(())
}

fn main() {
    let result = match Cli::parse().command {
        Command::Certs(a) => cli::certs::run(a),
        Command::Cluster(a) => cli::cluster::run(a),
        Command::Node(a) => cli::node::run(a),
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
        Command::UpVmReaper(a) => cli::up::run_vm_reaper(a),
        Command::Completions { shell } => completions(shell),
        Command::Man { dir } => man(&dir),
    };
    if let Err(e) = result {
        eprintln!("gsharectl: {e:#}");
        std::process::exit(1);
    }
}
