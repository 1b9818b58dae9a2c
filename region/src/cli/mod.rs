//! `gsharectl` subcommands, one module each (arguments + `run`).

pub mod certs;
pub mod cluster;
pub mod sim_placement;
pub mod sim_serving;
