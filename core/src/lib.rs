//! `gshare-core`: the pure heart of gshare.
//!
//! No sockets, no clocks, no threads: time comes in as `now`, randomness
//! through a seeded [`rng::Rng`]. Everything here is data in, decisions out,
//! so the region, the node agent and the simulators run the very same code.
//! The one exception is [`net`] (cargo feature `net`, off by default): the
//! protocol's frames on QUIC streams, shared by both binaries. [`clock`]
//! holds the seam the runtimes read time through (and the one reader of
//! the OS clocks, [`clock::SystemClock`]); nothing else here calls it.
//!
//! ```text
//!   operator TOML ──▶ config (parse strictly, validate, every error at once)
//!                          │
//!                          ▼
//!   model (units, tiers, slices, functions) ◀── placement (feasibility → rank → pick)
//!                                           ◀── sim (trace-driven experiments)
//! ```

pub mod autoscale;
pub mod bounds;
pub mod clock;
pub mod command;
pub mod config;
pub mod executor;
pub mod http_surface;
#[cfg(feature = "logging")]
pub mod logging;
pub mod metering;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod model;
#[cfg(feature = "net")]
pub mod net;
pub mod placement;
pub mod protocol;
pub mod rng;
pub mod serving;
pub mod sim;
pub mod state;

pub use model::*;
