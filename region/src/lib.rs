//! `gshare-region`: the region control plane and `gsharectl`, its operator
//! CLI. The binary (`src/bin/gsharectl.rs`) only dispatches; each subcommand
//! lives in its own module under [`cli`].

pub mod cli;
