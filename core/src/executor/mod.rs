//! The deadline-aware executor: a pure state machine, one per node, that
//! the node agent runs live and the serving simulator runs on traces.
//!
//! Events go in with the time they happen (`now`); [`Command`]s come out
//! (openraft's `Engine` is the model). Nothing here reads a clock or does I/O.
//!
//! ```text
//!             Event + now                         Command
//!   agent / ───────────────▶ NodeExecutor ─────────────────▶ agent / simulator
//!   simulator                 │  route, load, evict, remap        (Run, SwapIn, SwapOut,
//!                             ▼                                     ColdStart, Move, Unload,
//!                       GpuExecutor × n  (EDF queue, dispatch)      Reject{reason})
//! ```
//!
//! Rules (DESIGN.md §5):
//! - earliest deadline first on every GPU;
//! - a request waits while its predicted finish still meets its deadline,
//!   and is rejected early, with the reason, as soon as it cannot; this
//!   includes waiting for GPU memory that busy or loading evictable
//!   instances will free (`NoCapacity` only when none ever will);
//! - `exclusive` and `guaranteed` instances are never evicted or swapped;
//!   idle `oversubscribed` ones are swapped out to host memory when a GPU
//!   needs room, weakest tier first, then farthest predicted next use, then
//!   longest idle;
//! - a swap-in (host → GPU: weights ÷ H2D bandwidth + fixed setup) is
//!   distinct from a cold start (storage → host → GPU, much slower);
//! - an idle instance is remapped (moved) to another GPU of the node when
//!   that GPU would serve a request sooner.
//!
//! Service time on a compute share follows [`crate::model::LatencyProfile`];
//! the baselines of the simulator are the same executor under other
//! [`ExecutorRules`].

mod command;
mod event;
mod gpu;
mod ids;
mod load_costs;
mod load_meter;
mod node;
mod node_config;
mod profile;
mod reject_reason;
mod rules;
mod slots;
mod start_times;

#[cfg(test)]
mod tests;

pub use command::{Command, WeightsChange};
pub use event::Event;
pub use gpu::GpuExecutor;
pub use ids::{FunctionId, RequestId};
pub use load_costs::LoadCosts;
pub use load_meter::{LoadMeter, Occupancy};
pub use node::{footprint, NodeExecutor, RESERVE_BACKOFF_US, RESERVE_TIMEOUT_US};
pub use node_config::NodeConfig;
pub use profile::FunctionProfile;
pub use reject_reason::RejectReason;
pub use rules::ExecutorRules;
pub use start_times::{StartTimes, START_WINDOW};
