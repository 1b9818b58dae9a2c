//! `gshare-region`: the region service and the `gsharectl` tool.
//!
//! ```text
//!   gsharectl ─▶ cli::<subcommand>::run(args) ─▶ gshare-core (pure policies, simulators)
//! ```

pub mod cli;
