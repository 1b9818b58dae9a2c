//! `gsharectl` subcommands: each module has its clap `Args` and a `run`.

pub mod sim_serving;
