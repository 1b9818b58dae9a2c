//! `gsharectl` subcommands, one module each.

pub mod certs;
pub mod cluster;
