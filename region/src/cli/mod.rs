//! `gsharectl` subcommands, one module each (arguments + `run`).

pub mod bill;
pub mod certs;
pub mod cluster;
pub mod function;
pub mod node;
pub mod price;
pub mod quota;
pub mod region_client;
pub mod sim_placement;
pub mod sim_serving;
pub mod tenant;
pub mod token;
pub mod up;
pub mod usage;
